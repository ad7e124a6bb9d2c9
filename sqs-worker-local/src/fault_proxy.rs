//! A fault-injecting HTTP proxy for reliability tests.
//!
//! Reliability tests need the real AWS SDK clients (their retry strategy, their error
//! parsing, their timeouts) to meet the failures AWS produces: throttling, 5xx, dropped
//! connections, slow answers. The emulator never produces those on its own, and in-process
//! mocks bypass the very code under test. So the proxy sits between the clients and the
//! emulator on loopback:
//!
//! ```text
//! SDK client ──HTTP──▶ FaultProxy (127.0.0.1:PORT) ──HTTP──▶ emulator
//! ```
//!
//! Every request is identified as an [`Operation`] (service and action, e.g.
//! `dynamodb:UpdateItem`), counted, checked against the injected [`Rule`]s, and either
//! forwarded unchanged or answered with a [`Fault`]: an error response in the exact wire
//! format of that service (so the SDK parses it into its typed error and its retry
//! classifier sees the right code), an abortive close of the connection, or a delay.
//!
//! Each HTTP *attempt* is one call: the SDK's standard retry mode makes up to three
//! attempts per operation, so a rule that fails the "next 2" calls is absorbed by the
//! SDK's retries, and one that fails the next 100 makes the operation fail after three.
//!
//! SQS and DynamoDB (JSON protocol) are identified by their `X-Amz-Target` header; S3 is
//! identified by the SigV4 credential scope and its action derived from method, path-style
//! path (`/bucket/key`) and query (see [`Operation::identify`]).
//!
//! ```no_run
//! # async fn demo(emulator_url: &str) -> std::io::Result<()> {
//! use sqs_worker_local::fault_proxy::{Fault, FaultProxy, Operation, Rule, Trigger};
//!
//! let proxy = FaultProxy::start(emulator_url).await?;
//! proxy.inject(Rule::new(
//!     Operation::dynamodb("UpdateItem"),
//!     Fault::Throttling,
//!     Trigger::NextN(2),
//! ));
//! let clients = sqs_worker::aws::AwsClients::for_endpoint(&proxy.url(), "us-east-1").await;
//! // ... the first two UpdateItem attempts are throttled, the SDK's third attempt passes.
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

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

/// Which operations a rule applies to: one action of a service, or all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matcher {
    /// The service.
    pub service: Service,
    /// The action; `None` matches every action of the service.
    pub action: Option<String>,
}

impl Matcher {
    /// Every operation of `service`.
    pub fn any(service: Service) -> Self {
        Matcher {
            service,
            action: None,
        }
    }

    /// Exactly `operation`.
    pub fn operation(operation: &Operation) -> Self {
        Matcher {
            service: operation.service,
            action: Some(operation.action.clone()),
        }
    }

    /// Whether `operation` is one this matcher selects.
    pub fn matches(&self, operation: &Operation) -> bool {
        self.service == operation.service
            && self
                .action
                .as_ref()
                .is_none_or(|action| *action == operation.action)
    }
}

impl From<Operation> for Matcher {
    fn from(operation: Operation) -> Self {
        Matcher {
            service: operation.service,
            action: Some(operation.action),
        }
    }
}

impl From<&Operation> for Matcher {
    fn from(operation: &Operation) -> Self {
        Matcher::operation(operation)
    }
}

impl From<Service> for Matcher {
    fn from(service: Service) -> Self {
        Matcher::any(service)
    }
}

/// What happens to a call a rule fires on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// HTTP 503 with the service's error body: `ServiceUnavailable` for SQS and DynamoDB
    /// (JSON), `<Code>ServiceUnavailable</Code>` for S3 (XML). Not forwarded.
    ServiceUnavailable,
    /// The service's throttling error: DynamoDB HTTP 400
    /// `ProvisionedThroughputExceededException`, SQS HTTP 400 `RequestThrottled`, S3 HTTP
    /// 503 `SlowDown`. All three are on the SDK's list of throttling codes. Not forwarded.
    Throttling,
    /// HTTP 500: SQS `InternalFailure`, DynamoDB `InternalServerError`, S3 `InternalError`.
    /// Not forwarded.
    InternalError,
    /// Reads the request, then closes the connection with a TCP reset and no response:
    /// the client sees "connection reset" while waiting for the answer. Not forwarded.
    ConnectionReset,
    /// Holds the request this long, then forwards it. The upstream still executes it even
    /// if the client has given up meanwhile, as a slow server would.
    Delay(Duration),
}

/// When a matching rule fires.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trigger {
    /// On every matching call.
    Always,
    /// On the next `n` matching calls (HTTP attempts), then never again.
    NextN(u64),
    /// On each matching call with probability `fraction`, drawn from a random generator
    /// seeded with `seed`: the same sequence of calls gives the same faults on every run.
    Fraction {
        /// Probability of a fault per call, 0.0 to 1.0.
        fraction: f64,
        /// Seed of the rule's own generator.
        seed: u64,
    },
}

/// A fault to inject into the calls a [`Matcher`] selects, when its [`Trigger`] fires.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Which operations.
    pub matcher: Matcher,
    /// What happens to them.
    pub fault: Fault,
    /// When.
    pub trigger: Trigger,
}

impl Rule {
    /// A rule; `matcher` may be an [`Operation`], a [`Service`] (all its actions) or a
    /// [`Matcher`].
    pub fn new(matcher: impl Into<Matcher>, fault: Fault, trigger: Trigger) -> Self {
        Rule {
            matcher: matcher.into(),
            fault,
            trigger,
        }
    }
}

/// A rule with its progress: calls left for `NextN`, generator state for `Fraction`.
#[derive(Debug)]
struct ActiveRule {
    rule: Rule,
    remaining: u64,
    rng: fastrand::Rng,
}

impl ActiveRule {
    fn new(rule: Rule) -> Self {
        let (remaining, seed) = match rule.trigger {
            Trigger::NextN(n) => (n, 0),
            Trigger::Fraction { seed, .. } => (0, seed),
            Trigger::Always => (0, 0),
        };
        ActiveRule {
            rule,
            remaining,
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// Whether the rule fires on `operation`; advances its state when it matches.
    fn fires(&mut self, operation: &Operation) -> bool {
        if !self.rule.matcher.matches(operation) {
            return false;
        }
        match self.rule.trigger {
            Trigger::Always => true,
            Trigger::NextN(_) => {
                if self.remaining > 0 {
                    self.remaining -= 1;
                    true
                } else {
                    false
                }
            }
            // One draw per matching call, fired or not, so the n-th call's fate depends
            // only on the seed and n. NaN never fires; above 1.0 always does.
            Trigger::Fraction { fraction, .. } => self.rng.f64() < fraction,
        }
    }
}

#[derive(Debug, Default)]
struct FaultState {
    rules: Vec<ActiveRule>,
    calls: BTreeMap<Operation, u64>,
    injected: BTreeMap<Operation, u64>,
}

/// The rules and counters of a proxy: decides, per call, whether and how it fails.
///
/// Cloning gives another handle on the same state. Usable without a proxy, e.g. to check
/// what a seeded [`Trigger::Fraction`] will do.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    state: Arc<Mutex<FaultState>>,
}

impl Faults {
    /// No rules, no calls.
    pub fn new() -> Self {
        Faults::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FaultState> {
        // A panic while holding the lock cannot leave the counters inconsistent in a way
        // that matters to a test; keep going rather than poison every later call.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a rule after the existing ones.
    pub fn inject(&self, rule: Rule) {
        self.lock().rules.push(ActiveRule::new(rule));
    }

    /// Removes every rule (counters are kept).
    pub fn clear(&self) {
        self.lock().rules.clear();
    }

    /// Forgets the counters (rules are kept).
    pub fn reset_counters(&self) {
        let mut state = self.lock();
        state.calls.clear();
        state.injected.clear();
    }

    /// Records a call of `operation` and returns the fault to inject, if any: the first
    /// rule, in injection order, that matches and fires. A rule that matches but does not
    /// fire (an exhausted `NextN`, a `Fraction` draw that passes) lets later rules decide.
    pub fn decide(&self, operation: &Operation) -> Option<Fault> {
        let mut state = self.lock();
        *state.calls.entry(operation.clone()).or_default() += 1;
        let fault = state
            .rules
            .iter_mut()
            .find_map(|rule| rule.fires(operation).then_some(rule.rule.fault));
        if fault.is_some() {
            *state.injected.entry(operation.clone()).or_default() += 1;
        }
        fault
    }

    /// Calls seen (forwarded or failed) of the operations `matcher` selects.
    pub fn calls(&self, matcher: impl Into<Matcher>) -> u64 {
        let matcher = matcher.into();
        sum_matching(&self.lock().calls, &matcher)
    }

    /// Faults injected into the operations `matcher` selects.
    pub fn injected_for(&self, matcher: impl Into<Matcher>) -> u64 {
        let matcher = matcher.into();
        sum_matching(&self.lock().injected, &matcher)
    }

    /// Calls seen per operation, keyed `service:Action`.
    pub fn calls_by_operation(&self) -> BTreeMap<String, u64> {
        by_key(&self.lock().calls)
    }

    /// Faults injected per operation, keyed `service:Action` (e.g. `dynamodb:UpdateItem`).
    pub fn injected(&self) -> BTreeMap<String, u64> {
        by_key(&self.lock().injected)
    }
}

fn sum_matching(counts: &BTreeMap<Operation, u64>, matcher: &Matcher) -> u64 {
    counts
        .iter()
        .filter(|(operation, _)| matcher.matches(operation))
        .map(|(_, n)| n)
        .sum()
}

fn by_key(counts: &BTreeMap<Operation, u64>) -> BTreeMap<String, u64> {
    counts.iter().map(|(op, n)| (op.key(), *n)).collect()
}

/// Where requests are forwarded to: scheme and authority of the upstream URL.
#[derive(Debug)]
struct Upstream {
    scheme: hyper::http::uri::Scheme,
    authority: hyper::http::uri::Authority,
}

impl Upstream {
    fn parse(url: &str) -> std::io::Result<Upstream> {
        let invalid = |why: &str| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("upstream {url:?}: {why}"),
            )
        };
        let uri: Uri = url.parse().map_err(|_| invalid("not a URL"))?;
        let scheme = uri.scheme().cloned().ok_or_else(|| invalid("no scheme"))?;
        if scheme != hyper::http::uri::Scheme::HTTP {
            return Err(invalid("only http:// is supported"));
        }
        let authority = uri.authority().cloned().ok_or_else(|| invalid("no host"))?;
        if !matches!(uri.path(), "" | "/") {
            return Err(invalid("a base path is not supported"));
        }
        Ok(Upstream { scheme, authority })
    }

    /// The upstream URI for a request's path and query.
    fn uri_for(&self, request: &Uri) -> Result<Uri, hyper::http::Error> {
        let path_and_query = request
            .path_and_query()
            .map_or("/", hyper::http::uri::PathAndQuery::as_str);
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(path_and_query)
            .build()
    }
}

/// What the connection tasks share.
#[derive(Debug)]
struct Shared {
    upstream: Upstream,
    client: Client<HttpConnector, Full<Bytes>>,
    faults: Faults,
    request_ids: AtomicU64,
}

/// A running proxy on `127.0.0.1`; stops (with every open connection) when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    faults: Faults,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Binds `127.0.0.1:0` and forwards to `upstream` (an `http://host:port` URL, e.g. the
    /// emulator's) until dropped. Must be called inside a tokio runtime.
    pub async fn start(upstream: &str) -> std::io::Result<FaultProxy> {
        let upstream = Upstream::parse(upstream)?;
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let faults = Faults::new();
        let shared = Arc::new(Shared {
            upstream,
            client: Client::builder(TokioExecutor::new()).build_http(),
            faults: faults.clone(),
            request_ids: AtomicU64::new(0),
        });
        let task = tokio::spawn(accept_loop(listener, shared));
        Ok(FaultProxy { addr, faults, task })
    }

    /// The proxy's URL, `http://127.0.0.1:PORT`: the endpoint to give the SDK clients.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The rules and counters; clone it to hand another task a handle on the same state.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Adds a rule after the existing ones (see [`Faults::decide`] for the order).
    pub fn inject(&self, rule: Rule) {
        self.faults.inject(rule);
    }

    /// Removes every rule; calls pass through again. Counters are kept.
    pub fn clear(&self) {
        self.faults.clear();
    }

    /// Forgets the counters.
    pub fn reset_counters(&self) {
        self.faults.reset_counters();
    }

    /// Calls seen (forwarded or failed, each HTTP attempt counts) of the operations
    /// `matcher` selects: pass an `&Operation`, an `Operation`, a `Service` or a `Matcher`.
    pub fn calls(&self, matcher: impl Into<Matcher>) -> u64 {
        self.faults.calls(matcher)
    }

    /// Calls seen per operation, keyed `service:Action`.
    pub fn calls_by_operation(&self) -> BTreeMap<String, u64> {
        self.faults.calls_by_operation()
    }

    /// Faults injected per operation, keyed `service:Action` (e.g. `dynamodb:UpdateItem`).
    pub fn injected(&self) -> BTreeMap<String, u64> {
        self.faults.injected()
    }

    /// Faults injected into the operations `matcher` selects.
    pub fn injected_for(&self, matcher: impl Into<Matcher>) -> u64 {
        self.faults.injected_for(matcher)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The connection tasks live in the accept task's JoinSet: aborting it drops the
        // set, which aborts them, so no held (delayed) request outlives the proxy.
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(stream, shared.clone()));
                }
                Err(error) => {
                    // Typically out of file descriptors: back off instead of spinning, and
                    // keep serving (a test proxy that silently stops would be worse).
                    tracing::warn!(%error, "fault proxy: accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            // Reap finished connections so the set does not grow with every connection.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// A second handle on a connection's socket, used only to make its close abortive.
type ResetHandle = Arc<Mutex<Option<std::net::TcpStream>>>;

/// Returned by the service to make hyper drop the connection without writing a response.
#[derive(Debug)]
struct ResetConnection;

impl fmt::Display for ResetConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("connection reset by fault injection")
    }
}

impl std::error::Error for ResetConnection {}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    // hyper owns the stream while serving, so a `ConnectionReset` fault cannot reach it.
    // A duplicate of the socket's descriptor can: setting SO_LINGER=0 through it makes the
    // close that follows (when hyper drops the stream) send a TCP RST instead of a FIN.
    // The duplicate lives as long as the connection and is dropped with it.
    let Ok(std_stream) = stream.into_std() else {
        return;
    };
    let reset_handle: ResetHandle = Arc::new(Mutex::new(std_stream.try_clone().ok()));
    let Ok(stream) = TcpStream::from_std(std_stream) else {
        return;
    };
    let service = service_fn(move |request: Request<Incoming>| {
        let shared = shared.clone();
        let reset_handle = reset_handle.clone();
        async move { handle(request, &shared, &reset_handle).await }
    });
    // Client disconnects and injected resets end here; neither is worth reporting.
    let _ = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn handle(
    request: Request<Incoming>,
    shared: &Shared,
    reset_handle: &ResetHandle,
) -> Result<Response<Full<Bytes>>, ResetConnection> {
    let (parts, body) = request.into_parts();
    let operation = Operation::identify(&parts.method, &parts.uri, &parts.headers);
    // The whole request is read before anything is decided, so every fault happens after
    // the client has sent its request, as when a server fails while processing it.
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Err(ResetConnection),
    };
    let fault = shared.faults.decide(&operation);
    tracing::debug!(
        operation = %operation,
        method = %parts.method,
        uri = %parts.uri,
        fault = ?fault,
        "fault proxy"
    );
    let request_id = format!(
        "fault-proxy-{:08x}",
        shared.request_ids.fetch_add(1, Ordering::Relaxed)
    );
    match fault {
        None => Ok(forward(shared, parts, body).await),
        Some(Fault::Delay(delay)) => {
            tokio::time::sleep(delay).await;
            Ok(forward(shared, parts, body).await)
        }
        Some(Fault::ConnectionReset) => {
            let handle = reset_handle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some(handle) = handle {
                // Dropping the TcpSocket closes only the duplicate; the linger option is
                // on the shared socket. If it cannot be set, the close is a plain FIN,
                // which the client still sees as a connection closed mid-call.
                let _ = TcpSocket::from_std_stream(handle).set_zero_linger();
            }
            Err(ResetConnection)
        }
        Some(fault) => Ok(error_response(&operation, fault, &request_id)),
    }
}

/// Connection-level headers that describe one hop, not the message (RFC 9110 §7.6.1),
/// plus `expect`: the proxy has already read the body, so no `100 Continue` is needed.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in HOP_BY_HOP {
        headers.remove(*name);
    }
}

async fn forward(
    shared: &Shared,
    mut parts: hyper::http::request::Parts,
    body: Bytes,
) -> Response<Full<Bytes>> {
    parts.uri = match shared.upstream.uri_for(&parts.uri) {
        Ok(uri) => uri,
        Err(error) => return bad_gateway(&format!("cannot build upstream URI: {error}")),
    };
    // The request goes out as HTTP/1.1 whatever the client spoke; headers are kept as they
    // are, Host included, so the SigV4 signature stays valid and the emulator builds
    // URLs (e.g. SQS queue URLs) that point back at the proxy.
    parts.version = hyper::Version::HTTP_11;
    let had_length = parts.headers.contains_key(CONTENT_LENGTH);
    strip_hop_by_hop(&mut parts.headers);
    if had_length || !body.is_empty() {
        // A chunked request arrives de-chunked: its length is now known.
        parts
            .headers
            .insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    }
    let request = Request::from_parts(parts, Full::new(body));
    let response = match shared.client.request(request).await {
        Ok(response) => response,
        Err(error) => return bad_gateway(&format!("upstream request failed: {error}")),
    };
    let (mut parts, body) = response.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) => return bad_gateway(&format!("upstream body failed: {error}")),
    };
    // Content-Length is kept: for HEAD it is the size of the object, not of this body.
    strip_hop_by_hop(&mut parts.headers);
    Response::from_parts(parts, Full::new(body))
}

fn bad_gateway(message: &str) -> Response<Full<Bytes>> {
    tracing::warn!(message, "fault proxy: forwarding failed");
    let mut response = Response::new(Full::new(Bytes::from(message.to_string())));
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
}

/// Status, error code, and for SQS the query-compatible fault side (`Sender`/`Receiver`).
fn error_shape(service: Service, fault: Fault) -> (StatusCode, &'static str, &'static str) {
    match (service, fault) {
        (Service::Sqs, Fault::Throttling) => {
            (StatusCode::BAD_REQUEST, "RequestThrottled", "Sender")
        }
        (Service::Sqs, Fault::InternalError) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalFailure",
            "Receiver",
        ),
        (Service::DynamoDb, Fault::Throttling) => (
            StatusCode::BAD_REQUEST,
            "ProvisionedThroughputExceededException",
            "Sender",
        ),
        (Service::DynamoDb, Fault::InternalError) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            "Receiver",
        ),
        (Service::S3, Fault::Throttling) => {
            (StatusCode::SERVICE_UNAVAILABLE, "SlowDown", "Receiver")
        }
        (_, Fault::InternalError) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "Receiver",
        ),
        (_, Fault::Throttling) => (StatusCode::TOO_MANY_REQUESTS, "Throttling", "Sender"),
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "Receiver",
        ),
    }
}

fn error_message(code: &str) -> &'static str {
    match code {
        "RequestThrottled" | "Throttling" => "Rate exceeded (injected by the fault proxy)",
        "ProvisionedThroughputExceededException" => {
            "The level of configured provisioned throughput for the table was exceeded (injected by the fault proxy)"
        }
        "SlowDown" => "Please reduce your request rate. (injected by the fault proxy)",
        "ServiceUnavailable" => "Service unavailable (injected by the fault proxy)",
        _ => "We encountered an internal error. (injected by the fault proxy)",
    }
}

/// The error response `service` would send for `fault`, in its wire format, so the SDK
/// turns it into the same typed error (and retry decision) as a real one.
fn error_response(operation: &Operation, fault: Fault, request_id: &str) -> Response<Full<Bytes>> {
    let (status, code, side) = error_shape(operation.service, fault);
    let message = error_message(code);
    let mut headers = HeaderMap::new();
    let body = match operation.service {
        Service::Sqs | Service::DynamoDb => {
            // JSON protocol: the SDK takes the code from `__type` after the `#`.
            let namespace = if operation.service == Service::Sqs {
                "com.amazonaws.sqs"
            } else {
                "com.amazonaws.dynamodb.v20120810"
            };
            headers.insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/x-amz-json-1.0"),
            );
            insert(&mut headers, "x-amzn-requestid", request_id);
            if operation.service == Service::Sqs {
                // SQS is "query compatible": the SDK prefers the code in this header
                // (`<code>;<Sender|Receiver>`), as real SQS sends it.
                insert(
                    &mut headers,
                    "x-amzn-query-error",
                    &format!("{code};{side}"),
                );
            }
            serde_json::json!({
                "__type": format!("{namespace}#{code}"),
                "message": message,
            })
            .to_string()
        }
        Service::S3 => {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/xml"));
            insert(&mut headers, "x-amz-request-id", request_id);
            insert(&mut headers, "x-amz-id-2", request_id);
            format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message><RequestId>{request_id}</RequestId><HostId>{request_id}</HostId></Error>"
            )
        }
        Service::Other => {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            format!("{code}: {message}")
        }
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

fn insert(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        headers.insert(HeaderName::from_static(name), value);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
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

    #[test]
    fn next_n_then_pass_and_first_firing_rule_wins() {
        let faults = Faults::new();
        let put = Operation::dynamodb("PutItem");
        faults.inject(Rule::new(&put, Fault::Throttling, Trigger::NextN(2)));
        faults.inject(Rule::new(
            Service::DynamoDb,
            Fault::InternalError,
            Trigger::NextN(1),
        ));
        let seen: Vec<_> = (0..4).map(|_| faults.decide(&put)).collect();
        assert_eq!(
            seen,
            vec![
                Some(Fault::Throttling),
                Some(Fault::Throttling),
                Some(Fault::InternalError),
                None
            ]
        );
        assert_eq!(faults.calls(&put), 4);
        assert_eq!(faults.injected_for(&put), 3);
        assert_eq!(faults.decide(&Operation::dynamodb("GetItem")), None);
        assert_eq!(faults.calls(Service::DynamoDb), 5);
        faults.clear();
        assert_eq!(faults.decide(&put), None);
        assert_eq!(faults.injected()["dynamodb:PutItem"], 3);
    }

    #[test]
    fn matcher_selects_service_or_action() {
        let any_s3 = Matcher::any(Service::S3);
        assert!(any_s3.matches(&Operation::s3("PutObject")));
        assert!(!any_s3.matches(&Operation::sqs("PutObject")));
        let put = Matcher::from(Operation::s3("PutObject"));
        assert!(put.matches(&Operation::s3("PutObject")));
        assert!(!put.matches(&Operation::s3("GetObject")));
    }

    #[test]
    fn error_bodies_carry_the_service_code() {
        let body = |op: &Operation, fault| {
            let response = error_response(op, fault, "id");
            let status = response.status();
            let headers = response.headers().clone();
            let bytes = futures::executor::block_on(response.into_body().collect())
                .unwrap()
                .to_bytes();
            (status, headers, String::from_utf8(bytes.to_vec()).unwrap())
        };
        let (status, headers, text) = body(&Operation::sqs("SendMessage"), Fault::Throttling);
        assert_eq!(status, 400);
        assert_eq!(headers["x-amzn-query-error"], "RequestThrottled;Sender");
        assert!(
            text.contains("com.amazonaws.sqs#RequestThrottled"),
            "{text}"
        );
        let (status, _, text) = body(&Operation::s3("PutObject"), Fault::Throttling);
        assert_eq!(status, 503);
        assert!(text.contains("<Code>SlowDown</Code>"), "{text}");
        let (status, _, text) = body(&Operation::dynamodb("GetItem"), Fault::ServiceUnavailable);
        assert_eq!(status, 503);
        assert!(
            text.contains("com.amazonaws.dynamodb.v20120810#ServiceUnavailable"),
            "{text}"
        );
    }
}
