//! # sqs-keeper-http
//!
//! [`HttpDelivery`], the processor the shipped worker runs: POST each item's payload to a
//! downstream URL, classify the answer. `sqs-keeper` re-exports it as `http_delivery` with
//! its `http` feature; the worker and redrive functions and the `dlq` CLI deliver through it.
//!
//! ```
//! use std::time::Duration;
//! use sqs_keeper_http::{HttpDelivery, HttpDeliveryConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let url = "https://orders.example.com/ingest".parse()?;
//! let delivery = HttpDelivery::new(HttpDeliveryConfig::new(url, Duration::from_secs(10)))?;
//! // `delivery` is a `Processor`: run it with `sqs_keeper::run(delivery)`.
//! # let _ = delivery;
//! # Ok(())
//! # }
//! ```

// Every type a public signature mentions can be named from the root (re-exported there,
// or from the crate that defines it).
#![deny(unnameable_types)]

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};

mod credential;
pub use credential::{CredentialSource, REREAD_INTERVAL};

use sqs_keeper_core::ProcessError;
use sqs_keeper_core::WorkItem;
use sqs_keeper_core::{Outcome, Processor};

/// Renders `url` as it may be shown in errors, logs and records: without a user name or
/// password, and with its query (and fragment) replaced by `?<redacted>`, since a query
/// string is where an API key ends up when it is not in a header.
pub fn redact_url(url: &reqwest::Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    let mut text = shown.to_string();
    if url.query().is_some() || url.fragment().is_some() {
        text.push_str("?<redacted>");
    }
    text
}

/// Applies [`redact_url`] to text that may not even parse as a URL (a bad variable's
/// value): a `user:password@` before the host is dropped, anything from the first `?` or
/// `#` on is replaced by `?<redacted>`.
pub fn redact_url_text(text: &str) -> String {
    let (base, cut) = match text.find(['?', '#']) {
        Some(at) => (&text[..at], true),
        None => (text, false),
    };
    let mut shown = match base.find("://") {
        Some(scheme_end) => {
            let (scheme, rest) = base.split_at(scheme_end + 3);
            let authority_end = rest.find('/').unwrap_or(rest.len());
            let (authority, path) = rest.split_at(authority_end);
            let host = authority
                .rsplit_once('@')
                .map_or(authority, |(_, host)| host);
            format!("{scheme}{host}{path}")
        }
        None => base.to_string(),
    };
    if cut {
        shown.push_str("?<redacted>");
    }
    shown
}

/// How [`HttpDelivery`] reaches the downstream.
///
/// ```
/// use std::time::Duration;
/// use sqs_keeper_http::{HttpDelivery, HttpDeliveryConfig};
///
/// let url = "https://orders.example.com/v1/orders".parse().unwrap();
/// let config = HttpDeliveryConfig::new(url, Duration::from_secs(5));
/// assert_eq!(config.content_type, "application/json");
/// // Builds the client only: nothing is sent until a record is delivered.
/// let delivery = HttpDelivery::new(config).unwrap();
/// # let _ = delivery;
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct HttpDeliveryConfig {
    /// The URL each item body is POSTed to.
    pub url: reqwest::Url,
    /// Per-request timeout (connect + response).
    pub timeout: Duration,
    /// The `Content-Type` sent with the body.
    pub content_type: String,
    /// A credential sent on every request (header name, value marked sensitive); see
    /// `sqs_keeper_aws::auth_header`. Never shown by `Debug`.
    pub auth_header: Option<(HeaderName, HeaderValue)>,
}

impl HttpDeliveryConfig {
    /// Creates a configuration that posts JSON to `url` within `timeout`, with no
    /// credential header. Set the other fields on the value it returns.
    pub fn new(url: reqwest::Url, timeout: Duration) -> Self {
        HttpDeliveryConfig {
            url,
            timeout,
            content_type: "application/json".to_string(),
            auth_header: None,
        }
    }
}

impl std::fmt::Debug for HttpDeliveryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpDeliveryConfig")
            .field("url", &redact_url(&self.url))
            .field("timeout", &self.timeout)
            .field("content_type", &self.content_type)
            .field(
                "auth_header",
                &self
                    .auth_header
                    .as_ref()
                    .map(|(name, _)| format!("{name}: <redacted>")),
            )
            .finish()
    }
}

/// Most of a downstream error body kept as the error's detail: enough to explain, not a dump.
const ERROR_BODY_LIMIT: usize = 256;

/// Most of a successful answer read to keep its connection for the next item; a longer
/// answer is dropped and its connection closed.
const DRAIN_LIMIT: usize = 64 * 1024;

/// Reads a response to its end (up to [`DRAIN_LIMIT`]), so its connection goes back to the
/// pool. Its content is not needed: a success is a success whatever it says.
/// The first `limit` bytes of an answer (fewer when it is shorter or breaks off); the
/// rest is never read.
async fn read_prefix(mut response: reqwest::Response, limit: usize) -> Vec<u8> {
    let mut head = Vec::new();
    while head.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = limit - head.len();
                head.extend_from_slice(chunk.get(..room.min(chunk.len())).unwrap_or(&chunk));
            }
            _ => break,
        }
    }
    head
}

async fn drain(mut response: reqwest::Response) {
    let mut read = 0;
    while let Ok(Some(chunk)) = response.chunk().await {
        read += chunk.len();
        if read > DRAIN_LIMIT {
            return;
        }
    }
}

/// POSTs each item's body to a URL, with the record's trace (`traceparent`,
/// `X-Amzn-Trace-Id`) when it carries one. 2xx is done, except 208 Already Reported, which is
/// [`Outcome::AlreadyDone`] (the downstream had already processed this item: acked and
/// counted as skipped, and a breaker's probe closes on it);
/// other statuses and transport failures are classified per docs/ARCHITECTURE.md §2. Sends `Idempotency-Key` (the item id) so the downstream can
/// drop the duplicates that at-least-once delivery produces.
///
/// ```
/// use std::time::Duration;
/// use sqs_keeper_http::{HttpDelivery, HttpDeliveryConfig};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let url = "https://orders.example.com/ingest".parse()?;
/// let delivery = HttpDelivery::new(HttpDeliveryConfig::new(url, Duration::from_secs(10)))?;
/// // A processor like any other: `sqs_keeper::run(delivery)` serves it under Lambda.
/// # let _ = delivery;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct HttpDelivery {
    client: reqwest::Client,
    config: HttpDeliveryConfig,
    /// The credential header, read again on a 401 or 403 ([`HttpDelivery::with_credential_source`]).
    credential: Option<Arc<credential::Credential>>,
}

impl HttpDelivery {
    /// Builds the client once (connection pool and TLS set-up are reused across invocations).
    pub fn new(config: HttpDeliveryConfig) -> Result<Self, ProcessError> {
        let mut builder = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            // A redirected POST is re-sent as a GET without the body: a 2xx after that
            // would mark an undelivered item done. A 3xx is reported as it is instead.
            .redirect(reqwest::redirect::Policy::none());
        if config.url.scheme() == "http" {
            // No TLS can happen (no redirects), so skip loading the system trust store:
            // it is most of the function's start-up time (docs/BENCHMARKS.md).
            builder = builder.tls_certs_only(Vec::new());
        }
        let client = builder
            .build()
            .map_err(|e| ProcessError::from_error(&e).with_step("http-client"))?;
        Ok(HttpDelivery {
            client,
            config,
            credential: None,
        })
    }

    /// Reads the configured credential header again from `source` when the downstream
    /// answers 401 or 403, and sends the request once more if it changed (a rotated
    /// secret); at most one re-read per [`REREAD_INTERVAL`]. Without an `auth_header` in
    /// the configuration there is nothing to renew, and `source` is not used.
    pub fn with_credential_source(mut self, source: Arc<dyn CredentialSource>) -> Self {
        if let Some((name, value)) = self.config.auth_header.clone() {
            self.credential = Some(Arc::new(credential::Credential::new(name, value, source)));
        }
        self
    }

    /// Returns a failed request as a classified error that does not show the URL's query or
    /// credentials: reqwest writes the full request URL into its message.
    fn transport_error(&self, error: reqwest::Error) -> ProcessError {
        let had_url = error.url().is_some();
        let mut error = ProcessError::from_error(&error.without_url()).with_step("deliver");
        if had_url {
            error.message = format!(
                "{} for url ({})",
                error.message,
                redact_url(&self.config.url)
            );
        }
        // The causes come from lower layers (hyper, the TLS stack, DNS), which may quote
        // the request target themselves.
        error.message = self.redact(&error.message);
        for cause in &mut error.causes {
            *cause = self.redact(cause);
        }
        error
    }

    /// `text` with the downstream URL's query and credentials replaced wherever they appear.
    fn redact(&self, text: &str) -> String {
        let url = &self.config.url;
        let mut text = text.replace(url.as_str(), &redact_url(url));
        if let Some(query) = url.query().filter(|q| !q.is_empty()) {
            text = text.replace(&format!("?{query}"), "?<redacted>");
        }
        if let Some(password) = url.password().filter(|p| !p.is_empty()) {
            text = text.replace(&format!("{}:{password}@", url.username()), "");
        }
        text
    }

    fn headers(&self, item: &WorkItem) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let mut set = |name: HeaderName, value: &str| {
            // Ids are made header-safe (`header_safe_id`); a configured content type
            // a header cannot carry is not sent.
            if let Ok(value) = HeaderValue::from_str(value) {
                headers.insert(name, value);
            }
        };
        set(CONTENT_TYPE, &self.config.content_type);
        let id = header_safe_id(&item.item_id);
        set(HeaderName::from_static("idempotency-key"), &id);
        set(HeaderName::from_static("x-item-id"), &id);
        set(
            HeaderName::from_static("x-sqs-message-id"),
            &item.message_id,
        );
        // The record's trace, in both forms: the downstream continues the producer's trace
        // whichever it reads (docs/HANDLERS.md, "Traces").
        if let Some(trace) = item.trace() {
            set(HeaderName::from_static("traceparent"), &trace.traceparent());
            set(
                HeaderName::from_static("x-amzn-trace-id"),
                &trace.xray_header(),
            );
        }
        let auth = match &self.credential {
            Some(credential) => credential.header(),
            None => self.config.auth_header.clone(),
        };
        if let Some((name, value)) = auth {
            // Marked sensitive when read: kept out of `Debug` output and HTTP/2 header
            // compression tables.
            headers.insert(name, value);
        }
        headers
    }

    /// Sends `item` once; the answer and the credential the request carried.
    async fn send(
        &self,
        item: &WorkItem,
    ) -> Result<(reqwest::Response, Option<HeaderValue>), ProcessError> {
        let headers = self.headers(item);
        let sent = self
            .credential
            .as_ref()
            .and_then(|c| headers.get(c.name()).cloned());
        let response = self
            .client
            .post(self.config.url.clone())
            .headers(headers)
            .body(item.payload().to_string())
            .send()
            .await
            .map_err(|e| self.transport_error(e))?;
        Ok((response, sent))
    }
}

impl Processor for HttpDelivery {
    fn attempt_timeout(&self) -> Option<Duration> {
        Some(self.config.timeout)
    }

    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        let (mut response, sent) = self.send(item).await?;
        let refused = matches!(response.status().as_u16(), 401 | 403);
        if let (true, Some(credential)) = (refused, &self.credential) {
            if credential.renewed(sent.as_ref()).await {
                response = self.send(item).await?.0;
            }
        }
        let status = response.status();
        if status.is_success() {
            // Read the answer to its end: a connection whose response was dropped unread is
            // closed rather than returned to the pool, and the next item would pay for a
            // new connection (a TLS handshake, on an https downstream).
            drain(response).await;
            if status == reqwest::StatusCode::ALREADY_REPORTED {
                return Ok(Outcome::AlreadyDone {
                    reason: "downstream had already processed the item (208)".to_string(),
                });
            }
            return Ok(Outcome::Done);
        }
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        // Only what the record keeps is read (an error page can be any size; reading it
        // whole would put it in memory), then the connection is dropped.
        let head = read_prefix(response, ERROR_BODY_LIMIT * 4).await;
        let text = String::from_utf8_lossy(&head);
        let excerpt: String = text.trim().chars().take(ERROR_BODY_LIMIT).collect();
        // The response goes to the record's history, not into the message: messages are
        // logged, and a downstream's error body may echo the item's data.
        let mut error = ProcessError::from_http_status(
            status.as_u16(),
            format!("downstream answered {status}"),
        )
        .with_step("deliver");
        if !excerpt.is_empty() {
            error = error.with_detail(self.redact(&excerpt));
        }
        if let Some(delay) = retry_after {
            error = error.with_retry_after(delay);
        }
        Err(error)
    }
}

/// Returns what `Idempotency-Key` and `X-Item-Id` carry for `id`: the id itself when it is
/// printable ASCII without surrounding spaces, else `UTF-8''` and its percent-encoded
/// bytes (RFC 8187's form), every byte but the unreserved ones escaped.
/// A header cannot carry a control character, and many servers mangle other bytes.
/// The prefix keeps an encoded id apart from a plain id that spells the same escapes.
pub fn header_safe_id(id: &str) -> String {
    let plain = !id.is_empty()
        && id.bytes().all(|b| (0x20..0x7f).contains(&b))
        && id.trim() == id
        && !id.starts_with("UTF-8''");
    if plain {
        return id.to_string();
    }
    const ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    format!(
        "UTF-8''{}",
        percent_encoding::utf8_percent_encode(id, ESCAPED)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_query_or_credentials() {
        let rows = [
            (
                "https://api.example.com/ingest",
                "https://api.example.com/ingest",
            ),
            (
                "https://api.example.com/ingest?api_key=s3cret&x=1",
                "https://api.example.com/ingest?<redacted>",
            ),
            (
                "https://user:s3cret@api.example.com:8443/in#frag",
                "https://api.example.com:8443/in?<redacted>",
            ),
            ("http://127.0.0.1:9/?", "http://127.0.0.1:9/?<redacted>"),
        ];
        for (url, shown) in rows {
            assert_eq!(redact_url(&url.parse().unwrap()), shown, "{url}");
        }
        let text_rows = [
            (
                "http://x:99999/in?token=s3cret",
                "http://x:99999/in?<redacted>",
            ),
            ("https://u:s3cret@host/p", "https://host/p"),
            ("https://u:p@ss@host", "https://host"),
            ("not a url ? token=s3cret", "not a url ?<redacted>"),
            ("host#s3cret", "host?<redacted>"),
            ("plain", "plain"),
        ];
        for (text, shown) in text_rows {
            assert_eq!(redact_url_text(text), shown, "{text}");
        }
    }

    #[test]
    fn the_config_debug_does_not_show_the_query() {
        let config = HttpDeliveryConfig {
            url: "https://h/p?api_key=s3cret".parse().unwrap(),
            timeout: Duration::from_secs(1),
            content_type: "application/json".into(),
            auth_header: Some((
                HeaderName::from_static("x-api-key"),
                HeaderValue::from_static("k3y-value"),
            )),
        };
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        assert!(!debug.contains("k3y-value"), "{debug}");
        assert!(debug.contains("https://h/p?<redacted>"), "{debug}");
        assert!(debug.contains("x-api-key: <redacted>"), "{debug}");
    }

    /// Every id reaches the downstream as `Idempotency-Key`, one a header can carry: a
    /// redelivery must be recognisable whatever characters its id holds.
    #[test]
    fn every_item_id_is_sent_as_an_idempotency_key() {
        let delivery = HttpDelivery::new(HttpDeliveryConfig {
            url: "http://127.0.0.1:9/in".parse().unwrap(),
            timeout: Duration::from_secs(1),
            content_type: "application/json".into(),
            auth_header: None,
        })
        .unwrap();
        let rows = [
            ("order-7", "order-7"),
            ("a b", "a b"),
            ("a\nb", "UTF-8''a%0Ab"),
            ("caf\u{e9}", "UTF-8''caf%C3%A9"),
            (" padded", "UTF-8''%20padded"),
            ("UTF-8''x", "UTF-8''UTF-8%27%27x"),
        ];
        for (id, sent) in rows {
            let mut item = WorkItem::new("m-1", "{}");
            item.item_id = id.to_string();
            let headers = delivery.headers(&item);
            for name in ["idempotency-key", "x-item-id"] {
                assert_eq!(
                    headers.get(name).and_then(|v| v.to_str().ok()),
                    Some(sent),
                    "{name} for {id:?}"
                );
            }
        }
    }

    /// A downstream on loopback that takes only `Authorization: <accepted>`; counts the
    /// requests it saw. Its URL.
    async fn strict_downstream(
        accepted: &'static str,
        requests: Arc<std::sync::atomic::AtomicU32>,
    ) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/in", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                requests.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && socket.read(&mut byte).await.unwrap_or(0) == 1
                {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                let mut body = vec![0u8; length];
                let _ = socket.read_exact(&mut body).await;
                let ok = head.contains(&format!("authorization: {accepted}\r\n"));
                let status = if ok { "200 OK" } else { "401 Unauthorized" };
                let answer =
                    format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = socket.write_all(answer.as_bytes()).await;
            }
        });
        url
    }

    /// The secret as Secrets Manager holds it, counting its reads.
    struct Secret {
        value: &'static str,
        reads: std::sync::atomic::AtomicU32,
    }

    impl CredentialSource for Secret {
        fn read(
            &self,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<HeaderValue, ProcessError>> + Send + '_>,
        > {
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move { Ok(HeaderValue::from_static(self.value)) })
        }
    }

    fn delivery(url: &str, sent: &'static str, secret: Arc<Secret>) -> HttpDelivery {
        HttpDelivery::new(HttpDeliveryConfig {
            url: url.parse().unwrap(),
            timeout: Duration::from_secs(5),
            content_type: "application/json".into(),
            auth_header: Some((
                HeaderName::from_static("authorization"),
                HeaderValue::from_static(sent),
            )),
        })
        .unwrap()
        .with_credential_source(secret)
    }

    /// A secret rotated while the sandbox runs: the first 401 reads it again and the
    /// request goes once more with the new value; later items send the new value at once.
    #[tokio::test]
    async fn a_rotated_secret_is_read_again_on_a_401() {
        let requests = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let url = strict_downstream("new", requests.clone()).await;
        let secret = Arc::new(Secret {
            value: "new",
            reads: Default::default(),
        });
        let delivery = delivery(&url, "old", secret.clone());
        for n in 0..2 {
            let outcome = delivery
                .process(&WorkItem::new(format!("m{n}"), "{}"))
                .await;
            assert_eq!(outcome, Ok(Outcome::Done), "item {n}");
        }
        assert_eq!(secret.reads.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    /// A credential that is simply wrong: read again once, then refused as `permission`
    /// without another read until the interval has passed.
    #[tokio::test]
    async fn a_wrong_secret_is_read_again_at_most_once_a_minute() {
        let requests = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let url = strict_downstream("right", requests.clone()).await;
        let secret = Arc::new(Secret {
            value: "wrong",
            reads: Default::default(),
        });
        let delivery = delivery(&url, "wrong", secret.clone());
        for n in 0..3 {
            let error = delivery
                .process(&WorkItem::new(format!("m{n}"), "{}"))
                .await
                .unwrap_err();
            assert_eq!(error.class, sqs_keeper_core::ErrorClass::Permission);
        }
        assert_eq!(secret.reads.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 3);
    }
}
