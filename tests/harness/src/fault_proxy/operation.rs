//! Which AWS operation a request is: the service (from `X-Amz-Target` or the SigV4
//! credential scope) and the action (from the target, or for S3 from method, path-style
//! path and query), so rules can select calls and counters can name them.

use std::fmt;

use hyper::header::HeaderMap;
use hyper::{Method, Uri};

/// The AWS service a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Service {
    /// Amazon SQS (JSON protocol, `X-Amz-Target: AmazonSQS.<Action>`).
    Sqs,
    /// Amazon DynamoDB (JSON protocol, `X-Amz-Target: DynamoDB_20120810.<Action>`).
    DynamoDb,
    /// Amazon S3 (REST, path-style addressing).
    S3,
    /// Anything else: unsigned requests, other services, the emulator's own API.
    Other,
}

impl Service {
    /// The lower-case name used in counter keys: `sqs`, `dynamodb`, `s3`, `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            Service::Sqs => "sqs",
            Service::DynamoDb => "dynamodb",
            Service::S3 => "s3",
            Service::Other => "other",
        }
    }

    /// The service named in a SigV4 credential scope (`.../us-east-1/s3/aws4_request`).
    fn from_signing_name(name: &str) -> Service {
        match name {
            "sqs" => Service::Sqs,
            "dynamodb" => Service::DynamoDb,
            "s3" => Service::S3,
            _ => Service::Other,
        }
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One API operation: a service and an action such as `SendMessageBatch`, `UpdateItem` or
/// `PutObject` (the SDK's operation names). Unidentified requests have action `Unknown`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Operation {
    /// The service.
    pub service: Service,
    /// The action, spelled as in the AWS API reference.
    pub action: String,
}

/// The action of a request that could not be identified.
pub const UNKNOWN_ACTION: &str = "Unknown";

impl Operation {
    /// An operation of `service`.
    pub fn new(service: Service, action: impl Into<String>) -> Self {
        Operation {
            service,
            action: action.into(),
        }
    }

    /// An SQS operation, e.g. `Operation::sqs("SendMessageBatch")`.
    pub fn sqs(action: impl Into<String>) -> Self {
        Operation::new(Service::Sqs, action)
    }

    /// A DynamoDB operation, e.g. `Operation::dynamodb("UpdateItem")`.
    pub fn dynamodb(action: impl Into<String>) -> Self {
        Operation::new(Service::DynamoDb, action)
    }

    /// An S3 operation, e.g. `Operation::s3("PutObject")`.
    pub fn s3(action: impl Into<String>) -> Self {
        Operation::new(Service::S3, action)
    }

    /// The counter key, `service:Action`, e.g. `dynamodb:UpdateItem`.
    pub fn key(&self) -> String {
        format!("{}:{}", self.service, self.action)
    }

    /// Identifies the operation of a request from its method, URI and headers.
    ///
    /// - `X-Amz-Target: AmazonSQS.X` / `DynamoDB_20120810.X` → SQS / DynamoDB action `X`
    ///   (the JSON protocol names the operation in that header, the body is only input).
    /// - Otherwise the service comes from the SigV4 credential scope (`Authorization`
    ///   header, or `X-Amz-Credential` of a presigned URL), and S3 requests get their
    ///   action from [`s3_action`]: the `x-id` query parameter when the SDK sends one,
    ///   else method, path-style path and query.
    /// - Unsigned requests without a target are [`Service::Other`] with action `Unknown`.
    pub fn identify(method: &Method, uri: &Uri, headers: &HeaderMap) -> Operation {
        if let Some(target) = header_str(headers, "x-amz-target") {
            if let Some((prefix, action)) = target.split_once('.') {
                let service = if prefix == "AmazonSQS" {
                    Service::Sqs
                } else if prefix.starts_with("DynamoDB_") {
                    Service::DynamoDb
                } else {
                    Service::Other
                };
                return Operation::new(service, action);
            }
        }
        let query = uri.query().unwrap_or("");
        let service = signing_service(headers, query);
        match service {
            Service::S3 => Operation::s3(s3_action(method, uri.path(), query, headers)),
            // SQS and DynamoDB without a target would be the legacy query protocol, which
            // the SDK versions of this workspace do not use.
            other => Operation::new(other, UNKNOWN_ACTION),
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.service, self.action)
    }
}

/// The service of the SigV4 credential scope, from the `Authorization` header or a
/// presigned URL's `X-Amz-Credential`; [`Service::Other`] when unsigned.
fn signing_service(headers: &HeaderMap, query: &str) -> Service {
    // `AWS4-HMAC-SHA256 Credential=AKID/20250101/us-east-1/s3/aws4_request, SignedHeaders=...`
    let from_header = header_str(headers, "authorization").and_then(|auth| {
        let start = auth.find("Credential=")? + "Credential=".len();
        let scope = auth[start..].split([',', ' ']).next()?;
        scope.split('/').nth(3).map(str::to_string)
    });
    // Presigned: `X-Amz-Credential=AKID%2F20250101%2Fus-east-1%2Fs3%2Faws4_request`.
    let from_query = || {
        query_params(query)
            .find(|(k, _)| k.eq_ignore_ascii_case("X-Amz-Credential"))
            .and_then(|(_, v)| {
                v.replace("%2F", "/")
                    .replace("%2f", "/")
                    .split('/')
                    .nth(3)
                    .map(str::to_string)
            })
    };
    from_header
        .or_else(from_query)
        .map_or(Service::Other, |name| Service::from_signing_name(&name))
}

/// The S3 action of a path-style request (`/bucket/key?query`).
///
/// The Rust SDK adds `x-id=<Operation>` to the query of operations whose URI alone is
/// ambiguous (`GetObject`, `PutObject`, `DeleteObjects`, ...); it is used when present.
/// Otherwise the action is derived from the method, whether there is a key, sub-resource
/// query parameters (`uploadId`, `partNumber`, `delete`, `tagging`, ...) and the
/// `x-amz-copy-source` header. Virtual-hosted requests are not supported (the bucket
/// would be read as the first path segment), which is why the clients use path style.
pub fn s3_action(method: &Method, path: &str, query: &str, headers: &HeaderMap) -> String {
    let params: Vec<(&str, &str)> = query_params(query).collect();
    let has = |name: &str| params.iter().any(|(k, _)| *k == name);
    let value = |name: &str| params.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    if let Some(id) = value("x-id").filter(|id| !id.is_empty()) {
        return id.to_string();
    }
    let trimmed = path.trim_start_matches('/');
    let (bucket, key) = match trimmed.split_once('/') {
        Some((bucket, key)) => (bucket, key),
        None => (trimmed, ""),
    };
    let copy = headers.contains_key("x-amz-copy-source");
    let action = if bucket.is_empty() {
        match *method {
            Method::GET => "ListBuckets",
            _ => UNKNOWN_ACTION,
        }
    } else if key.is_empty() {
        match *method {
            Method::PUT if params.is_empty() => "CreateBucket",
            Method::PUT if has("versioning") => "PutBucketVersioning",
            Method::PUT if has("policy") => "PutBucketPolicy",
            Method::PUT if has("lifecycle") => "PutBucketLifecycleConfiguration",
            Method::PUT if has("tagging") => "PutBucketTagging",
            Method::PUT if has("notification") => "PutBucketNotificationConfiguration",
            Method::HEAD => "HeadBucket",
            Method::DELETE if params.is_empty() => "DeleteBucket",
            Method::POST if has("delete") => "DeleteObjects",
            Method::GET if value("list-type") == Some("2") => "ListObjectsV2",
            Method::GET if has("versions") => "ListObjectVersions",
            Method::GET if has("uploads") => "ListMultipartUploads",
            Method::GET if has("location") => "GetBucketLocation",
            Method::GET if has("versioning") => "GetBucketVersioning",
            Method::GET if has("policy") => "GetBucketPolicy",
            Method::GET if has("tagging") => "GetBucketTagging",
            // Only listing parameters (prefix, delimiter, marker, max-keys...) or none.
            Method::GET
                if params.iter().all(|(k, _)| {
                    matches!(
                        *k,
                        "prefix" | "delimiter" | "marker" | "max-keys" | "encoding-type"
                    )
                }) =>
            {
                "ListObjects"
            }
            _ => UNKNOWN_ACTION,
        }
    } else {
        match *method {
            Method::PUT if has("uploadId") && has("partNumber") => {
                if copy {
                    "UploadPartCopy"
                } else {
                    "UploadPart"
                }
            }
            Method::PUT if has("tagging") => "PutObjectTagging",
            Method::PUT if has("acl") => "PutObjectAcl",
            Method::PUT if has("retention") => "PutObjectRetention",
            Method::PUT if has("legal-hold") => "PutObjectLegalHold",
            Method::PUT if copy => "CopyObject",
            Method::PUT => "PutObject",
            Method::GET if has("uploadId") => "ListParts",
            Method::GET if has("tagging") => "GetObjectTagging",
            Method::GET if has("acl") => "GetObjectAcl",
            Method::GET if has("attributes") => "GetObjectAttributes",
            Method::GET => "GetObject",
            Method::HEAD => "HeadObject",
            Method::DELETE if has("uploadId") => "AbortMultipartUpload",
            Method::DELETE if has("tagging") => "DeleteObjectTagging",
            Method::DELETE => "DeleteObject",
            Method::POST if has("uploads") => "CreateMultipartUpload",
            Method::POST if has("uploadId") => "CompleteMultipartUpload",
            Method::POST if has("restore") => "RestoreObject",
            Method::POST if has("select") => "SelectObjectContent",
            _ => UNKNOWN_ACTION,
        }
    };
    action.to_string()
}

/// `a=1&b&c=` → `(a, 1), (b, ""), (c, "")`. Names are not percent-decoded: the ones that
/// matter here are plain ASCII.
fn query_params(query: &str) -> impl Iterator<Item = (&str, &str)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use hyper::header::HeaderValue;

    use super::*;

    fn s3(method: Method, path_and_query: &str, headers: &[(&'static str, &str)]) -> Operation {
        let uri: Uri = path_and_query.parse().unwrap();
        let mut map = HeaderMap::new();
        map.insert(
            "authorization",
            HeaderValue::from_static(
                "AWS4-HMAC-SHA256 Credential=test/20250101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00",
            ),
        );
        for (name, value) in headers {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        Operation::identify(&method, &uri, &map)
    }

    #[test]
    fn json_targets() {
        let uri: Uri = "/".parse().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-amz-target",
            HeaderValue::from_static("AmazonSQS.SendMessageBatch"),
        );
        assert_eq!(
            Operation::identify(&Method::POST, &uri, &headers),
            Operation::sqs("SendMessageBatch")
        );
        headers.insert(
            "x-amz-target",
            HeaderValue::from_static("DynamoDB_20120810.UpdateItem"),
        );
        assert_eq!(
            Operation::identify(&Method::POST, &uri, &headers),
            Operation::dynamodb("UpdateItem")
        );
        assert_eq!(
            Operation::identify(&Method::GET, &uri, &HeaderMap::new()),
            Operation::new(Service::Other, UNKNOWN_ACTION)
        );
    }

    #[test]
    fn s3_actions_without_x_id() {
        let rows = [
            (Method::PUT, "/b/k", vec![], "PutObject"),
            (
                Method::PUT,
                "/b/k",
                vec![("x-amz-copy-source", "/b/src")],
                "CopyObject",
            ),
            (
                Method::PUT,
                "/b/k?partNumber=1&uploadId=abc",
                vec![],
                "UploadPart",
            ),
            (Method::GET, "/b/dir/k.json", vec![], "GetObject"),
            (Method::HEAD, "/b/k", vec![], "HeadObject"),
            (Method::DELETE, "/b/k", vec![], "DeleteObject"),
            (Method::POST, "/b?delete", vec![], "DeleteObjects"),
            (
                Method::POST,
                "/b/k?uploads",
                vec![],
                "CreateMultipartUpload",
            ),
            (
                Method::GET,
                "/b?list-type=2&prefix=p",
                vec![],
                "ListObjectsV2",
            ),
            (Method::GET, "/b?prefix=p", vec![], "ListObjects"),
            (Method::PUT, "/b", vec![], "CreateBucket"),
            (Method::HEAD, "/b", vec![], "HeadBucket"),
            (Method::DELETE, "/b", vec![], "DeleteBucket"),
            (Method::GET, "/", vec![], "ListBuckets"),
            (Method::PATCH, "/b/k", vec![], "Unknown"),
        ];
        for (method, uri, headers, action) in rows {
            assert_eq!(
                s3(method.clone(), uri, &headers),
                Operation::s3(action),
                "{method} {uri}"
            );
        }
    }

    #[test]
    fn s3_x_id_wins() {
        assert_eq!(
            s3(Method::GET, "/b/k?x-id=GetObject", &[]),
            Operation::s3("GetObject")
        );
        assert_eq!(
            s3(Method::PUT, "/b/k?x-id=CopyObject", &[]),
            Operation::s3("CopyObject")
        );
    }

    #[test]
    fn presigned_s3_is_identified() {
        let uri: Uri = "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=test%2F20250101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Signature=00"
            .parse()
            .unwrap();
        assert_eq!(
            Operation::identify(&Method::GET, &uri, &HeaderMap::new()),
            Operation::s3("GetObject")
        );
    }
}
