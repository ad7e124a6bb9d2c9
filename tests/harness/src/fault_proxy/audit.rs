//! What each request asks of IAM: the caller, the IAM action and the resource, so a test can
//! hold every AWS call a function makes to the role the template gives that function.
//!
//! The emulators enforce no IAM, so a missing permission passes every functional test and
//! fails only once deployed. The proxy sees every request the code under test sends; this
//! turns each into the [`Access`]es IAM would evaluate: the principal is the access key id
//! of the SigV4 credential (a test gives each function's process its role's name as its
//! key), the action is the IAM action the API operation needs (which is not always its
//! name: `SendMessageBatch` needs `sqs:SendMessage`, a `TransactWriteItems` needs the action
//! of each of its items), and the resource is read from the request (a queue URL, a table
//! and index, a bucket and key, a secret id).
//!
//! Written by hand: no crate maps AWS API requests to IAM actions and resources for the
//! handful of operations the project uses, and the mapping must follow the AWS Service
//! Authorization Reference for exactly those.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use hyper::header::HeaderMap;
use hyper::{Method, Uri};
use serde_json::Value;

use super::operation::{Operation, Service};

/// The resource a request acts on, as the request names it; [`Access::arn`] makes it an ARN.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// An SQS queue: its owner's account (from the URL) and its name.
    Queue {
        /// The account in the queue URL's path.
        account: String,
        /// The queue's name.
        name: String,
    },
    /// A DynamoDB table, or one of its indexes.
    Table {
        /// The table's name.
        name: String,
        /// The index queried, if any.
        index: Option<String>,
    },
    /// An S3 bucket (list, head).
    Bucket(String),
    /// An S3 object.
    Object {
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
    },
    /// A Secrets Manager secret, by the id the request gives (a name or an ARN).
    Secret(String),
    /// A Lambda function, by name.
    Function(String),
    /// A Lambda event source mapping, by UUID.
    EventSourceMapping(String),
    /// An operation IAM authorises on `*` (e.g. `sqs:ListQueues`), or one not understood.
    Any,
}

/// One authorisation IAM would evaluate for a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Access {
    /// The access key id of the request's SigV4 credential (`-` when unsigned).
    pub principal: String,
    /// The region of the credential scope.
    pub region: String,
    /// The IAM action, e.g. `sqs:SendMessage`.
    pub action: String,
    /// What it acts on.
    pub target: Target,
}

impl Access {
    /// The resource's ARN in partition `aws`; DynamoDB tables are named within `account`
    /// (a DynamoDB request names only the table).
    pub fn arn(&self, account: &str) -> String {
        let region = &self.region;
        match &self.target {
            Target::Queue { account, name } => format!("arn:aws:sqs:{region}:{account}:{name}"),
            Target::Table { name, index: None } => {
                format!("arn:aws:dynamodb:{region}:{account}:table/{name}")
            }
            Target::Table {
                name,
                index: Some(index),
            } => format!("arn:aws:dynamodb:{region}:{account}:table/{name}/index/{index}"),
            Target::Bucket(bucket) => format!("arn:aws:s3:::{bucket}"),
            Target::Object { bucket, key } => format!("arn:aws:s3:::{bucket}/{key}"),
            Target::Secret(id) if id.starts_with("arn:") => id.clone(),
            Target::Secret(name) => {
                format!("arn:aws:secretsmanager:{region}:{account}:secret:{name}")
            }
            Target::Function(name) if name.starts_with("arn:") => name.clone(),
            Target::Function(name) => format!("arn:aws:lambda:{region}:{account}:function:{name}"),
            Target::EventSourceMapping(uuid) => {
                format!("arn:aws:lambda:{region}:{account}:event-source-mapping:{uuid}")
            }
            Target::Any => "*".to_string(),
        }
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} on {:?}", self.principal, self.action, self.target)
    }
}

/// Every access the proxy has seen, in order; shared by the proxy's connections.
#[derive(Debug, Clone, Default)]
pub struct AuditLog {
    accesses: Arc<Mutex<Vec<Access>>>,
}

impl AuditLog {
    pub(super) fn record(&self, accesses: Vec<Access>) {
        self.accesses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(accesses);
    }

    /// What has been seen so far.
    pub fn accesses(&self) -> Vec<Access> {
        self.accesses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The accesses one request asks for.
pub fn accesses(
    operation: &Operation,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Vec<Access> {
    let (principal, region) = credential(headers);
    let access = |action: String, target: Target| Access {
        principal: principal.clone(),
        region: region.clone(),
        action,
        target,
    };
    let json = || serde_json::from_slice::<Value>(body).unwrap_or(Value::Null);
    match operation.service {
        Service::Sqs => {
            let body = json();
            let target = match body["QueueUrl"].as_str() {
                Some(url) => queue_of_url(url),
                None => match body["QueueName"].as_str() {
                    // GetQueueUrl: the queue named, in the owner's account if given.
                    Some(name) => Target::Queue {
                        account: body["QueueOwnerAWSAccountId"]
                            .as_str()
                            .unwrap_or("")
                            .to_string(),
                        name: name.to_string(),
                    },
                    None => Target::Any,
                },
            };
            vec![access(sqs_action(&operation.action), target)]
        }
        Service::DynamoDb => dynamodb_accesses(&operation.action, &json())
            .into_iter()
            .map(|(action, target)| access(action, target))
            .collect(),
        Service::S3 => s3_accesses(&operation.action, method, uri, body)
            .into_iter()
            .map(|(action, target)| access(action, target))
            .collect(),
        Service::Other => match other_target(headers) {
            Some((prefix, action)) => {
                let body = json();
                let target = body["SecretId"]
                    .as_str()
                    .map_or(Target::Any, |id| Target::Secret(id.to_string()));
                vec![access(format!("{prefix}:{action}"), target)]
            }
            None => lambda_access(method, uri.path())
                .map(|(action, target)| vec![access(action, target)])
                .unwrap_or_default(),
        },
    }
}

/// The access key id and region of the SigV4 credential scope
/// (`Credential=AKID/20250101/us-east-1/sqs/aws4_request`).
fn credential(headers: &HeaderMap) -> (String, String) {
    let scope = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|auth| {
            let start = auth.find("Credential=")? + "Credential=".len();
            auth[start..].split([',', ' ']).next().map(str::to_string)
        })
        .unwrap_or_default();
    let mut parts = scope.split('/');
    let principal = parts.next().filter(|p| !p.is_empty()).unwrap_or("-");
    let region = parts.nth(1).unwrap_or("");
    (principal.to_string(), region.to_string())
}

/// `http://host/000000000000/name` → the queue of that account and name.
fn queue_of_url(url: &str) -> Target {
    let path = url.split_once("://").map_or(url, |(_, rest)| rest);
    let mut segments = path.split('/').skip(1).filter(|s| !s.is_empty());
    match (segments.next(), segments.next()) {
        (Some(account), Some(name)) => Target::Queue {
            account: account.to_string(),
            name: name.to_string(),
        },
        _ => Target::Any,
    }
}

/// The IAM action of an SQS API operation: the batch operations are authorised as their
/// single forms.
fn sqs_action(operation: &str) -> String {
    let action = match operation {
        "SendMessageBatch" => "SendMessage",
        "DeleteMessageBatch" => "DeleteMessage",
        "ChangeMessageVisibilityBatch" => "ChangeMessageVisibility",
        other => other,
    };
    format!("sqs:{action}")
}

/// DynamoDB: the table (and index) of the request; the batch and transaction operations
/// name several, and a transaction is authorised item by item with each item's action.
fn dynamodb_accesses(operation: &str, body: &Value) -> Vec<(String, Target)> {
    let table = |name: &str, index: Option<&str>| Target::Table {
        name: name.to_string(),
        index: index.map(str::to_string),
    };
    match operation {
        "BatchGetItem" | "BatchWriteItem" => body["RequestItems"]
            .as_object()
            .map(|items| {
                items
                    .keys()
                    .map(|name| (format!("dynamodb:{operation}"), table(name, None)))
                    .collect()
            })
            .unwrap_or_default(),
        "TransactWriteItems" | "TransactGetItems" => body["TransactItems"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|item| {
                        let (kind, inner) = item.as_object()?.iter().next()?;
                        let action = match kind.as_str() {
                            "Put" => "PutItem",
                            "Update" => "UpdateItem",
                            "Delete" => "DeleteItem",
                            "ConditionCheck" => "ConditionCheckItem",
                            "Get" => "GetItem",
                            _ => return None,
                        };
                        Some((
                            format!("dynamodb:{action}"),
                            table(inner["TableName"].as_str()?, None),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default(),
        _ => match body["TableName"].as_str() {
            Some(name) => vec![(
                format!("dynamodb:{operation}"),
                table(name, body["IndexName"].as_str()),
            )],
            None => vec![(format!("dynamodb:{operation}"), Target::Any)],
        },
    }
}

/// S3 (path-style): object operations on `bucket/key`, bucket operations on the bucket,
/// with the actions of the Service Authorization Reference (`HeadObject` needs
/// `s3:GetObject`, `ListObjectsV2` and `HeadBucket` need `s3:ListBucket`, `DeleteObjects`
/// needs `s3:DeleteObject` on each key).
fn s3_accesses(operation: &str, method: &Method, uri: &Uri, body: &[u8]) -> Vec<(String, Target)> {
    let path = uri.path().trim_start_matches('/');
    let (bucket, key) = match path.split_once('/') {
        Some((bucket, key)) => (bucket.to_string(), percent_decoded(key)),
        None => (path.to_string(), String::new()),
    };
    let object = |key: String| Target::Object {
        bucket: bucket.clone(),
        key,
    };
    let action = match operation {
        "HeadObject" | "GetObject" => "GetObject",
        "ListObjectsV2" | "ListObjects" | "HeadBucket" => "ListBucket",
        "DeleteObjects" => {
            return xml_keys(body)
                .into_iter()
                .map(|key| ("s3:DeleteObject".to_string(), object(key)))
                .collect();
        }
        other => other,
    };
    let target = if key.is_empty() || *method == Method::GET && action == "ListBucket" {
        Target::Bucket(bucket.clone())
    } else {
        object(key)
    };
    vec![(format!("s3:{action}"), target)]
}

/// The `<Key>` values of a `DeleteObjects` request body.
fn xml_keys(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(body);
    text.split("<Key>")
        .skip(1)
        .filter_map(|rest| rest.split_once("</Key>").map(|(key, _)| key.to_string()))
        .collect()
}

/// `text` with its `%XX` escapes decoded (an S3 key in a path, a policy document IAM
/// returns URL-encoded); anything else is kept as it is.
pub fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The IAM action and target of a Lambda REST request the functions make: Invoke, and
/// reading or updating an event source mapping.
fn lambda_access(method: &Method, path: &str) -> Option<(String, Target)> {
    let path = percent_decoded(path);
    if let Some(uuid) = path.strip_prefix("/2015-03-31/event-source-mappings/") {
        let action = if *method == Method::PUT {
            "lambda:UpdateEventSourceMapping"
        } else {
            "lambda:GetEventSourceMapping"
        };
        return Some((
            action.to_string(),
            Target::EventSourceMapping(uuid.to_string()),
        ));
    }
    let name = path
        .strip_prefix("/2015-03-31/functions/")?
        .strip_suffix("/invocations")?;
    Some((
        "lambda:InvokeFunction".to_string(),
        Target::Function(name.to_string()),
    ))
}

/// The IAM prefix and action of a JSON-protocol request of another service
/// (`X-Amz-Target: secretsmanager.GetSecretValue`).
fn other_target(headers: &HeaderMap) -> Option<(String, String)> {
    let target = headers.get("x-amz-target")?.to_str().ok()?;
    let (prefix, action) = target.split_once('.')?;
    Some((prefix.to_ascii_lowercase(), action.to_string()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn headers(target: Option<&str>, service: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            format!(
                "AWS4-HMAC-SHA256 Credential=WorkerRole/20260101/us-east-1/{service}/aws4_request, SignedHeaders=host, Signature=x"
            )
            .parse()
            .unwrap(),
        );
        if let Some(t) = target {
            h.insert("x-amz-target", t.parse().unwrap());
        }
        h
    }

    fn of(method: Method, uri: &str, h: &HeaderMap, body: &str) -> Vec<Access> {
        let uri: Uri = uri.parse().unwrap();
        let operation = Operation::identify(&method, &uri, h);
        accesses(&operation, &method, &uri, h, body.as_bytes())
    }

    #[test]
    fn batch_operations_are_authorised_as_their_single_forms() {
        let h = headers(Some("AmazonSQS.ChangeMessageVisibilityBatch"), "sqs");
        let a = of(
            Method::POST,
            "http://127.0.0.1/",
            &h,
            r#"{"QueueUrl":"http://localhost:5000/123456789012/src","Entries":[]}"#,
        );
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].principal, "WorkerRole");
        assert_eq!(a[0].action, "sqs:ChangeMessageVisibility");
        assert_eq!(a[0].arn("1"), "arn:aws:sqs:us-east-1:123456789012:src");
    }

    #[test]
    fn get_queue_url_names_its_queue() {
        let h = headers(Some("AmazonSQS.GetQueueUrl"), "sqs");
        let a = of(
            Method::POST,
            "http://127.0.0.1/",
            &h,
            r#"{"QueueName":"src","QueueOwnerAWSAccountId":"123456789012"}"#,
        );
        assert_eq!(a[0].action, "sqs:GetQueueUrl");
        assert_eq!(a[0].arn("1"), "arn:aws:sqs:us-east-1:123456789012:src");
    }

    #[test]
    fn a_transaction_is_authorised_item_by_item() {
        let h = headers(Some("DynamoDB_20120810.TransactWriteItems"), "dynamodb");
        let a = of(
            Method::POST,
            "http://127.0.0.1/",
            &h,
            r#"{"TransactItems":[{"Update":{"TableName":"t"}},{"ConditionCheck":{"TableName":"u"}}]}"#,
        );
        let got: Vec<(String, String)> = a.iter().map(|a| (a.action.clone(), a.arn("9"))).collect();
        assert_eq!(
            got,
            [
                (
                    "dynamodb:UpdateItem".to_string(),
                    "arn:aws:dynamodb:us-east-1:9:table/t".to_string()
                ),
                (
                    "dynamodb:ConditionCheckItem".to_string(),
                    "arn:aws:dynamodb:us-east-1:9:table/u".to_string()
                ),
            ]
        );
    }

    #[test]
    fn a_query_names_its_index() {
        let h = headers(Some("DynamoDB_20120810.Query"), "dynamodb");
        let a = of(
            Method::POST,
            "http://127.0.0.1/",
            &h,
            r#"{"TableName":"t","IndexName":"by-status"}"#,
        );
        assert_eq!(
            a[0].arn("9"),
            "arn:aws:dynamodb:us-east-1:9:table/t/index/by-status"
        );
    }

    #[test]
    fn s3_objects_buckets_and_bulk_deletes() {
        let h = headers(None, "s3");
        let get = of(Method::HEAD, "http://127.0.0.1/b/payloads/a%2Fb", &h, "");
        assert_eq!(get[0].action, "s3:GetObject");
        assert_eq!(get[0].arn(""), "arn:aws:s3:::b/payloads/a/b");
        let list = of(
            Method::GET,
            "http://127.0.0.1/b?list-type=2&prefix=x",
            &h,
            "",
        );
        assert_eq!(list[0].action, "s3:ListBucket");
        assert_eq!(list[0].arn(""), "arn:aws:s3:::b");
        let delete = of(
            Method::POST,
            "http://127.0.0.1/b?delete",
            &h,
            "<Delete><Object><Key>k1</Key></Object><Object><Key>k2</Key></Object></Delete>",
        );
        let arns: Vec<String> = delete.iter().map(|a| a.arn("")).collect();
        assert_eq!(arns, ["arn:aws:s3:::b/k1", "arn:aws:s3:::b/k2"]);
        assert!(delete.iter().all(|a| a.action == "s3:DeleteObject"));
    }

    #[test]
    fn lambda_invocations_and_event_source_mappings() {
        let h = headers(None, "lambda");
        let invoke = of(
            Method::POST,
            "/2015-03-31/functions/stack-worker/invocations",
            &h,
            "{}",
        );
        assert_eq!(invoke[0].action, "lambda:InvokeFunction");
        assert_eq!(
            invoke[0].arn("000000000000"),
            "arn:aws:lambda:us-east-1:000000000000:function:stack-worker"
        );
        let update = of(
            Method::PUT,
            "/2015-03-31/event-source-mappings/6a1b-77",
            &h,
            r#"{"Enabled":false}"#,
        );
        assert_eq!(update[0].action, "lambda:UpdateEventSourceMapping");
        assert_eq!(
            update[0].arn("000000000000"),
            "arn:aws:lambda:us-east-1:000000000000:event-source-mapping:6a1b-77"
        );
        let get = of(
            Method::GET,
            "/2015-03-31/event-source-mappings/6a1b-77",
            &h,
            "",
        );
        assert_eq!(get[0].action, "lambda:GetEventSourceMapping");
    }

    #[test]
    fn secrets_by_arn_or_name() {
        let h = headers(Some("secretsmanager.GetSecretValue"), "secretsmanager");
        let a = of(
            Method::POST,
            "http://127.0.0.1/",
            &h,
            r#"{"SecretId":"arn:aws:secretsmanager:us-east-1:1:secret:s-AbCd"}"#,
        );
        assert_eq!(a[0].action, "secretsmanager:GetSecretValue");
        assert_eq!(
            a[0].arn("1"),
            "arn:aws:secretsmanager:us-east-1:1:secret:s-AbCd"
        );
    }
}
