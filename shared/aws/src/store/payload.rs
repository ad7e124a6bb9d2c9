//! Large payloads in S3, and the SQS Extended Client pointer format used both to read
//! offloaded source messages and to point DLQ messages at offloaded payloads; the bucket as
//! the core's [`PayloadStore`] port (docs/ARCHITECTURE.md §5).

use aws_sdk_s3::primitives::ByteStream;

use super::DeadLetterStore;
use sqs_keeper_core::ports::PayloadStore;
use sqs_keeper_core::{pointer::S3Pointer, pointer::SHA256_METADATA};
use sqs_keeper_core::{ErrorClass, ProcessError};

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
    get_payload_limited(s3, pointer, u64::MAX).await
}

/// Runs [`get_payload`], reading at most `max_bytes`. An object whose `Content-Length` says
/// it is larger is refused before its body is read, and one whose body turns out larger is
/// refused as soon as it passes the limit. Too large is `validation` (permanent).
pub async fn get_payload_limited(
    s3: &aws_sdk_s3::Client,
    pointer: &S3Pointer,
    max_bytes: u64,
) -> Result<(String, Option<String>), ProcessError> {
    let too_large = |size: String| {
        ProcessError::validation(format!(
            "s3://{}/{} holds {size} bytes, more than the {max_bytes} a payload may have",
            pointer.bucket, pointer.key
        ))
        .with_step("fetch-payload")
    };
    let object = s3
        .get_object()
        .bucket(&pointer.bucket)
        .key(&pointer.key)
        .send()
        .await
        .map_err(|e| ProcessError::from_sdk(&e).with_step("fetch-payload"))?;
    let declared = object.content_length().and_then(|l| u64::try_from(l).ok());
    if let Some(length) = declared.filter(|l| *l > max_bytes) {
        return Err(too_large(length.to_string()));
    }
    let sha256 = object
        .metadata()
        .and_then(|m| m.get(SHA256_METADATA))
        .cloned();
    let capacity = declared.unwrap_or(0).min(max_bytes).min(1 << 20);
    let mut bytes = Vec::with_capacity(usize::try_from(capacity).unwrap_or(0));
    let mut body = object.body;
    while let Some(chunk) = body.try_next().await.map_err(|e| {
        ProcessError::new(
            ErrorClass::Connection,
            format!("reading s3://{}/{}: {e}", pointer.bucket, pointer.key),
        )
        .with_step("fetch-payload")
    })? {
        if (bytes.len() + chunk.len()) as u64 > max_bytes {
            return Err(too_large(format!("more than {max_bytes}")));
        }
        bytes.extend_from_slice(&chunk);
    }
    let text = String::from_utf8(bytes).map_err(|_| {
        ProcessError::validation(format!(
            "s3://{}/{} is not UTF-8 text",
            pointer.bucket, pointer.key
        ))
        .with_step("fetch-payload")
    })?;
    Ok((text, sha256))
}

impl PayloadStore for DeadLetterStore {
    async fn fetch(&self, pointer: &S3Pointer) -> Result<String, ProcessError> {
        get_payload(&self.clients().s3, pointer)
            .await
            .map(|(body, _)| body)
    }

    async fn put(&self, pointer: &S3Pointer, body: &str, sha256: &str) -> Result<(), ProcessError> {
        put_payload(&self.clients().s3, pointer, body, sha256).await
    }

    async fn delete(&self, pointer: &S3Pointer) -> Result<(), ProcessError> {
        self.clients()
            .s3
            .delete_object()
            .bucket(&pointer.bucket)
            .key(&pointer.key)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| ProcessError::from_sdk(&e).with_step("delete-payload"))
    }
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

    #[tokio::test]
    async fn no_more_than_the_cap_is_read() {
        use aws_sdk_s3::operation::get_object::GetObjectOutput;
        use aws_smithy_mocks::{mock, mock_client};
        let pointer = S3Pointer {
            bucket: "b".into(),
            key: "k".into(),
        };
        // One object says it is too large; the other says nothing and is.
        let declared = mock!(aws_sdk_s3::Client::get_object).then_output(|| {
            GetObjectOutput::builder()
                .content_length(4096)
                .body(ByteStream::from(vec![b'x'; 4096]))
                .build()
        });
        let undeclared = mock!(aws_sdk_s3::Client::get_object).then_output(|| {
            GetObjectOutput::builder()
                .body(ByteStream::from(vec![b'x'; 4096]))
                .build()
        });
        let fits = mock!(aws_sdk_s3::Client::get_object).then_output(|| {
            GetObjectOutput::builder()
                .content_length(1024)
                .body(ByteStream::from(vec![b'x'; 1024]))
                .build()
        });
        let client = mock_client!(
            aws_sdk_s3,
            aws_smithy_mocks::RuleMode::Sequential,
            &[&declared, &undeclared, &fits]
        );
        for expected in ["holds 4096 bytes", "holds more than 1024 bytes"] {
            let err = get_payload_limited(&client, &pointer, 1024)
                .await
                .unwrap_err();
            assert_eq!(err.class, ErrorClass::Validation, "{err}");
            assert!(err.message.contains(expected), "{err}");
            assert_eq!(err.step.as_deref(), Some("fetch-payload"));
        }
        let (text, _) = get_payload_limited(&client, &pointer, 1024).await.unwrap();
        assert_eq!(text.len(), 1024, "exactly the cap fits");
    }
}
