//! SQS Extended Client payload pointers, read from source messages and written into DLQ
//! messages, and the policy for following them. Pure: the S3 reads and writes are in
//! `sqs_keeper_aws::store::payload`.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::error::{ErrorClass, ProcessError};

/// The Extended Client's pointer class name (first element of the pointer array).
pub const POINTER_CLASS: &str = "software.amazon.payloadoffloading.PayloadS3Pointer";
/// Message attribute the Extended Client sets to the payload size.
pub const EXTENDED_PAYLOAD_SIZE_ATTRIBUTE: &str = "ExtendedPayloadSize";
/// Object metadata key holding the payload's sha256.
pub const SHA256_METADATA: &str = "sha256";

/// Where an offloaded payload is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct S3Pointer {
    /// Bucket.
    #[serde(rename = "s3BucketName")]
    pub bucket: String,
    /// Key.
    #[serde(rename = "s3Key")]
    pub key: String,
}

impl S3Pointer {
    /// Parses an Extended Client pointer body; `None` for any other body.
    pub fn parse(body: &str) -> Option<S3Pointer> {
        let trimmed = body.trim_start();
        // Cheap test first: nearly every body is not a pointer.
        if !trimmed.starts_with('[') || !trimmed.contains(POINTER_CLASS) {
            return None;
        }
        let (class, pointer): (String, S3Pointer) = serde_json::from_str(body).ok()?;
        (class == POINTER_CLASS).then_some(pointer)
    }

    /// The pointer as an Extended Client body.
    pub fn to_body(&self) -> String {
        serde_json::json!([POINTER_CLASS, {"s3BucketName": self.bucket, "s3Key": self.key}])
            .to_string()
    }
}

/// What an SQS Extended Client pointer in a source message may make the worker read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadPolicy {
    /// Largest payload read; a larger one is a `validation` failure, and no more than this
    /// is ever read (the function's memory is the limit otherwise).
    pub max_bytes: u64,
    /// Buckets a pointer may name. A pointer is data from whoever can send to the queue:
    /// without a list it could make the worker read any object its role can.
    pub allowed_buckets: BTreeSet<String>,
}

/// Default [`PayloadPolicy::max_bytes`]: 32 MiB (`WORKER_PAYLOAD_MAX_BYTES`'s default).
pub const DEFAULT_PAYLOAD_MAX_BYTES: u64 = 32 * 1024 * 1024;

impl PayloadPolicy {
    /// A policy allowing `buckets`, with the default size cap.
    pub fn allowing<I, S>(buckets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        PayloadPolicy {
            max_bytes: DEFAULT_PAYLOAD_MAX_BYTES,
            allowed_buckets: buckets.into_iter().map(Into::into).collect(),
        }
    }

    /// Whether a pointer to `bucket` may be followed.
    pub fn allows(&self, bucket: &str) -> bool {
        self.allowed_buckets.contains(bucket)
    }

    /// The pointer `body` holds, if it is one, and whether it may be followed: `None` for
    /// a body that is no pointer; a `permission` failure for a pointer to a bucket this
    /// policy does not allow (not followed at all: the sender chose the bucket, and the
    /// worker's role may read more than the sender should; a human looks before any
    /// redrive).
    pub fn pointer_in(&self, body: &str) -> Option<Result<S3Pointer, ProcessError>> {
        let pointer = S3Pointer::parse(body)?;
        if self.allows(&pointer.bucket) {
            return Some(Ok(pointer));
        }
        Some(Err(ProcessError::new(
            ErrorClass::Permission,
            format!(
                "the payload pointer names bucket {:?}, which is not one the worker reads payloads from (WORKER_PAYLOAD_BUCKETS or DLQ_BUCKET)",
                pointer.bucket,
            ),
        )
        .with_step("fetch-payload")))
    }
}
