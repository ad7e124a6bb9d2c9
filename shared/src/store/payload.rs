//! Large payloads in S3, and the SQS Extended Client pointer format used both to read
//! offloaded source messages and to point DLQ messages at offloaded payloads.

use aws_sdk_s3::primitives::ByteStream;
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

/// The object key for an item's payload: item id (made key-safe) plus the payload's sha256,
/// so the same payload always lands on the same key (re-recording is idempotent).
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
    format!("payloads/{safe}/{sha256}")
}

/// Stores a payload with its sha256 in the object metadata.
pub async fn put_payload(
    s3: &aws_sdk_s3::Client,
    pointer: &S3Pointer,
    body: &str,
    sha256: &str,
) -> Result<(), ProcessError> {
    s3.put_object()
        .bucket(&pointer.bucket)
        .key(&pointer.key)
        .body(ByteStream::from(body.as_bytes().to_vec()))
        .content_type("application/octet-stream")
        .metadata(SHA256_METADATA, sha256)
        .send()
        .await
        .map(|_| ())
        .map_err(|e| ProcessError::from_sdk(&e).with_step("store-payload"))
}

/// Reads a payload as text. A missing object is `not_found` (permanent); a body that is not
/// UTF-8 is `validation`.
pub async fn get_payload(
    s3: &aws_sdk_s3::Client,
    pointer: &S3Pointer,
) -> Result<(String, Option<String>), ProcessError> {
    let object = s3
        .get_object()
        .bucket(&pointer.bucket)
        .key(&pointer.key)
        .send()
        .await
        .map_err(|e| ProcessError::from_sdk(&e).with_step("fetch-payload"))?;
    let sha256 = object
        .metadata()
        .and_then(|m| m.get(SHA256_METADATA))
        .cloned();
    let bytes = object
        .body
        .collect()
        .await
        .map_err(|e| {
            ProcessError::new(
                ErrorClass::Connection,
                format!("reading s3://{}/{}: {e}", pointer.bucket, pointer.key),
            )
            .with_step("fetch-payload")
        })?
        .into_bytes();
    let text = String::from_utf8(bytes.to_vec()).map_err(|_| {
        ProcessError::validation(format!(
            "s3://{}/{} is not UTF-8 text",
            pointer.bucket, pointer.key
        ))
        .with_step("fetch-payload")
    })?;
    Ok((text, sha256))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_round_trip_and_rejects() {
        let p = S3Pointer {
            bucket: "b".into(),
            key: "k/1".into(),
        };
        let body = p.to_body();
        assert_eq!(
            body,
            r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":"b","s3Key":"k/1"}]"#
        );
        assert_eq!(S3Pointer::parse(&body), Some(p));
        assert_eq!(S3Pointer::parse(r#"{"id":1}"#), None);
        assert_eq!(
            S3Pointer::parse(r#"["other.Class",{"s3BucketName":"b","s3Key":"k"}]"#),
            None
        );
        assert_eq!(
            S3Pointer::parse(r#"["software.amazon.payloadoffloading.PayloadS3Pointer",{}]"#),
            None
        );
    }

    #[test]
    fn keys_are_safe_and_deterministic() {
        assert_eq!(payload_key("order/7 ü", "abc"), "payloads/order_7__/abc");
        assert_eq!(payload_key("a", "x"), payload_key("a", "x"));
    }
}
