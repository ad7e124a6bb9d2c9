//! SQS Extended Client payload pointers, read from source messages and written into DLQ
//! messages, and the policy for following them. Pure: the S3 reads and writes are in
//! `sqs_keeper_aws::payload`.

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

    /// Parses the bare-object pointer (`{"s3BucketName": "...", "s3Key": "..."}`, the
    /// `MessageS3Pointer` of the Java Extended Client 1.x and of the Python extended
    /// clients): exactly those two string fields, nothing else. Such an object may be a
    /// producer's own data, so [`PayloadPolicy::pointer_in`] follows it only into an
    /// allowed bucket and otherwise treats the body as data.
    pub fn parse_bare(body: &str) -> Option<S3Pointer> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Bare {
            #[serde(rename = "s3BucketName")]
            bucket: String,
            #[serde(rename = "s3Key")]
            key: String,
        }
        let trimmed = body.trim_start();
        // Cheap test first: nearly every body is not a pointer.
        if !trimmed.starts_with('{') || !trimmed.contains("s3BucketName") {
            return None;
        }
        let bare: Bare = serde_json::from_str(body).ok()?;
        (!bare.bucket.is_empty() && !bare.key.is_empty()).then_some(S3Pointer {
            bucket: bare.bucket,
            key: bare.key,
        })
    }

    /// Returns the pointer as an Extended Client body.
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
    /// Returns a policy allowing `buckets`, with the default size cap.
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

    /// Tells whether a pointer to `bucket` may be followed.
    pub fn allows(&self, bucket: &str) -> bool {
        self.allowed_buckets.contains(bucket)
    }

    /// Returns the pointer `body` holds, if it is one, and whether it may be followed: `None` for
    /// a body that is no pointer; a `permission` failure for a pointer to a bucket this
    /// policy does not allow (not followed at all: the sender chose the bucket, and the
    /// worker's role may read more than the sender should; a human looks before any
    /// redrive).
    ///
    /// Both Extended-Client forms are read: the `PayloadS3Pointer` array (Java 2.x, the
    /// Python and JavaScript clients) and the bare object ([`S3Pointer::parse_bare`]),
    /// the latter only into an allowed bucket (elsewhere it is the producer's data).
    pub fn pointer_in(&self, body: &str) -> Option<Result<S3Pointer, ProcessError>> {
        let pointer = match S3Pointer::parse(body) {
            Some(pointer) => pointer,
            None => {
                return S3Pointer::parse_bare(body)
                    .filter(|bare| self.allows(&bare.bucket))
                    .map(Ok)
            }
        };
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

/// Returns the object key the dead-letter store puts an item's payload under: item id (made
/// key-safe) plus the payload's sha256, so the same payload always lands on the same key
/// (re-recording is idempotent). An id that had to be changed to be safe (a character
/// outside `[A-Za-z0-9-_.]`, or longer than 200) also carries a digest of the id as it is
/// (`~` and 16 hex digits), so that two items never share an object: `order/1` and
/// `order:1` would otherwise, and a purge of one would delete the other's payload.
pub fn payload_key(item_id: &str, sha256: &str) -> String {
    let safe: String = item_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(200)
        .collect();
    if safe == item_id {
        return format!("{PAYLOAD_PREFIX}{safe}/{sha256}");
    }
    let digest = crate::hex::sha256_hex(item_id.as_bytes());
    format!("{PAYLOAD_PREFIX}{safe}~{}/{sha256}", &digest[..16])
}

/// Where [`payload_key`] puts every payload.
const PAYLOAD_PREFIX: &str = "payloads/";

/// Tells whether `key` has the shape of a [`payload_key`]: an object the store wrote under its
/// payload's digest and never rewrites. A producer sharing the bucket uses keys of its
/// own, whose objects it may rewrite.
pub fn is_payload_key(key: &str) -> bool {
    key.strip_prefix(PAYLOAD_PREFIX)
        .and_then(|rest| rest.rsplit_once('/'))
        .is_some_and(|(_, sha)| sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_extended_client_forms_are_read_the_bare_one_only_into_an_allowed_bucket() {
        let policy = PayloadPolicy::allowing(["payloads"]);
        let expected = S3Pointer {
            bucket: "payloads".into(),
            key: "k/1".into(),
        };
        let array = r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":"payloads","s3Key":"k/1"}]"#;
        let bare = r#"{"s3BucketName":"payloads","s3Key":"k/1"}"#;
        assert_eq!(policy.pointer_in(array), Some(Ok(expected.clone())));
        assert_eq!(policy.pointer_in(bare), Some(Ok(expected)));
        // A bare object naming another bucket may be the producer's own data: it is
        // passed on as the body, not refused as a pointer (the array form is refused).
        assert_eq!(
            policy.pointer_in(r#"{"s3BucketName":"elsewhere","s3Key":"k"}"#),
            None
        );
        assert!(matches!(
            policy.pointer_in(r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":"elsewhere","s3Key":"k"}]"#),
            Some(Err(e)) if e.class == ErrorClass::Permission
        ));
        // Anything more than the two fields is data.
        for body in [
            r#"{"s3BucketName":"payloads","s3Key":"k","size":3}"#,
            r#"{"s3BucketName":"payloads"}"#,
            r#"{"s3BucketName":"payloads","s3Key":""}"#,
            r#"{"s3BucketName":1,"s3Key":"k"}"#,
        ] {
            assert_eq!(policy.pointer_in(body), None, "{body}");
        }
        // The DLQ rule reads only the array form our own messages carry.
        assert_eq!(S3Pointer::parse(bare), None);
    }
}
