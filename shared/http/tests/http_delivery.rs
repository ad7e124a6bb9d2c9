//! `HttpDelivery` against a real HTTP server on loopback.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqs_keeper_core::ErrorClass;
use sqs_keeper_core::{item::ItemParser, WorkItem};
use sqs_keeper_core::{Outcome, Processor};
use sqs_keeper_http::{HttpDelivery, HttpDeliveryConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What the server saw of the last request.
#[derive(Default, Debug)]
struct Seen {
    head: String,
    body: String,
}

/// When `buf` starts with a whole request: its head, where its body starts, and where the
/// request ends (by its `content-length`).
fn whole_request(buf: &[u8]) -> Option<(String, usize, usize)> {
    let text = String::from_utf8_lossy(buf);
    let head_end = text.find("\r\n\r\n")?;
    let head = text[..head_end].to_string();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let end = head_end + 4 + len;
    (buf.len() >= end).then_some((head, head_end + 4, end))
}

/// A one-route HTTP/1.1 server answering every request with `status` and `extra` headers,
/// after `delay`.
async fn server(status: u16, extra: &'static str, delay: Duration) -> (String, Arc<Mutex<Seen>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/ingest", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Seen::default()));
    let seen2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let seen = seen2.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let n = socket.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some((head, body_start, end)) = whole_request(&buf) {
                        let text = String::from_utf8_lossy(&buf).to_string();
                        *seen.lock().unwrap() = Seen {
                            head,
                            body: text[body_start..end].to_string(),
                        };
                        break;
                    }
                }
                tokio::time::sleep(delay).await;
                let body = "upstream says no";
                let response = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: {}\r\n{extra}connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });
    (url, seen)
}

fn delivery(url: &str, timeout: Duration) -> HttpDelivery {
    HttpDelivery::new(HttpDeliveryConfig::new(url.parse().unwrap(), timeout)).unwrap()
}

fn item() -> WorkItem {
    let msg = serde_json::from_value(serde_json::json!({
        "messageId": "m-1",
        "body": "{\"id\":\"order-7\"}",
        "attributes": {"ApproximateReceiveCount": "1"}
    }))
    .unwrap();
    ItemParser {
        id_source: "pointer:/id".parse().unwrap(),
        ..ItemParser::default()
    }
    .parse("m-1".into(), msg)
    .unwrap()
}

#[tokio::test]
async fn success_posts_body_and_ids() {
    let (url, seen) = server(200, "", Duration::ZERO).await;
    let outcome = delivery(&url, Duration::from_secs(5))
        .process(&item())
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Done);
    let seen = seen.lock().unwrap();
    assert!(
        seen.head.starts_with("POST /ingest HTTP/1.1"),
        "{}",
        seen.head
    );
    let head = seen.head.to_ascii_lowercase();
    assert!(head.contains("idempotency-key: order-7"), "{head}");
    assert!(head.contains("x-sqs-message-id: m-1"), "{head}");
    assert!(head.contains("content-type: application/json"), "{head}");
    assert_eq!(seen.body, "{\"id\":\"order-7\"}");
}

/// A 208 is the downstream's answer that it had the item before: acknowledged, and, unlike
/// a skip, it tells a breaker's probe that the downstream answered.
#[tokio::test]
async fn already_reported_is_already_done() {
    let (url, _) = server(208, "", Duration::ZERO).await;
    let outcome = delivery(&url, Duration::from_secs(5))
        .process(&item())
        .await
        .unwrap();
    assert!(
        matches!(&outcome, Outcome::AlreadyDone { reason } if reason.contains("208")),
        "{outcome:?}"
    );
}

/// A record traced by its producer (X-Ray's `AWSTraceHeader`) is delivered with the trace
/// in both forms, so the downstream continues it; an untraced record sends neither header.
#[tokio::test]
async fn the_records_trace_reaches_the_downstream_in_both_forms() {
    let (url, seen) = server(200, "", Duration::ZERO).await;
    let mut traced = item();
    traced.attributes.insert(
        "AWSTraceHeader",
        "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
    );
    let to = delivery(&url, Duration::from_secs(5));
    to.process(&traced).await.unwrap();
    let head = seen.lock().unwrap().head.to_ascii_lowercase();
    assert!(
        head.contains("traceparent: 00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"),
        "{head}"
    );
    assert!(
        head.contains(
            "x-amzn-trace-id: root=1-5759e988-bd862e3fe1be46a994272793;parent=53995c3f42cd8ad8;sampled=1"
        ),
        "{head}"
    );
    let (url, seen) = server(200, "", Duration::ZERO).await;
    delivery(&url, Duration::from_secs(5))
        .process(&item())
        .await
        .unwrap();
    let head = seen.lock().unwrap().head.to_ascii_lowercase();
    assert!(
        !head.contains("traceparent") && !head.contains("x-amzn-trace-id"),
        "{head}"
    );
}

#[tokio::test]
async fn statuses_are_classified() {
    let rows = [
        (429, ErrorClass::Throttled),
        (503, ErrorClass::ServerError),
        (500, ErrorClass::ServerError),
        (400, ErrorClass::Validation),
        (403, ErrorClass::Permission),
        (404, ErrorClass::NotFound),
        (409, ErrorClass::Unknown),
    ];
    for (status, class) in rows {
        let (url, _) = server(status, "", Duration::ZERO).await;
        let err = delivery(&url, Duration::from_secs(5))
            .process(&item())
            .await
            .unwrap_err();
        assert_eq!(err.class, class, "{status}");
        assert_eq!(err.status, Some(status));
        assert_eq!(err.step.as_deref(), Some("deliver"));
        // The response text is the error's detail (kept in the record), not its message
        // (logged): a downstream may echo the item's data.
        assert_eq!(err.detail(), Some("upstream says no"));
        assert!(!err.message.contains("upstream says no"), "{}", err.message);
        assert!(!err.to_string().contains("upstream says no"), "{err}");
        assert!(
            err.message
                .starts_with(&format!("downstream answered {status}")),
            "{}",
            err.message
        );
    }
}

#[tokio::test]
async fn the_credential_header_is_sent_and_the_query_never_shown() {
    let (url, seen) = server(200, "", Duration::ZERO).await;
    let mut value = reqwest::header::HeaderValue::from_static("Bearer t0ken");
    value.set_sensitive(true);
    let url = format!("{url}?api_key=s3cret").parse().unwrap();
    let mut config = HttpDeliveryConfig::new(url, Duration::from_secs(5));
    config.auth_header = Some((reqwest::header::AUTHORIZATION, value));
    let delivery = HttpDelivery::new(config).unwrap();
    for _ in 0..2 {
        assert_eq!(delivery.process(&item()).await.unwrap(), Outcome::Done);
        let seen = seen.lock().unwrap();
        let head = seen.head.to_ascii_lowercase();
        // Sent on every request, and the query still reaches the downstream.
        assert!(head.contains("authorization: bearer t0ken"), "{head}");
        assert!(
            seen.head
                .starts_with("POST /ingest?api_key=s3cret HTTP/1.1"),
            "{}",
            seen.head
        );
    }
    assert!(!format!("{delivery:?}").contains("t0ken"));

    // A transport failure: reqwest would print the whole URL.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let closed = delivery_to(&format!("http://127.0.0.1:{port}/in?api_key=s3cret&x=1"));
    let err = closed.process(&item()).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Connection, "{err}");
    let shown = format!("{err} {:?}", err.causes);
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(
        err.message
            .contains(&format!("for url (http://127.0.0.1:{port}/in?<redacted>)")),
        "{err}"
    );
    // And a timeout.
    let (slow, _) = server(200, "", Duration::from_secs(5)).await;
    let err = HttpDelivery::new(HttpDeliveryConfig::new(
        format!("{slow}?api_key=s3cret").parse().unwrap(),
        Duration::from_millis(200),
    ))
    .unwrap()
    .process(&item())
    .await
    .unwrap_err();
    assert_eq!(err.class, ErrorClass::Timeout, "{err}");
    let shown = format!("{err} {:?}", err.causes);
    assert!(!shown.contains("s3cret"), "{shown}");
}

fn delivery_to(url: &str) -> HttpDelivery {
    HttpDelivery::new(HttpDeliveryConfig::new(
        url.parse().unwrap(),
        Duration::from_secs(2),
    ))
    .unwrap()
}

#[tokio::test]
async fn retry_after_is_read() {
    let (url, _) = server(429, "retry-after: 7\r\n", Duration::ZERO).await;
    let err = delivery(&url, Duration::from_secs(5))
        .process(&item())
        .await
        .unwrap_err();
    assert_eq!(err.retry_after, Some(Duration::from_secs(7)));
}

#[tokio::test]
async fn slow_downstream_is_a_timeout_and_closed_port_a_connection_error() {
    let (url, _) = server(200, "", Duration::from_secs(5)).await;
    let err = delivery(&url, Duration::from_millis(200))
        .process(&item())
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Timeout, "{err}");

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = delivery(&format!("http://127.0.0.1:{port}/"), Duration::from_secs(2))
        .process(&item())
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Connection, "{err}");
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_not_a_success() {
    // Following it would re-send the POST as a GET without the body, and a 200 from the
    // target would mark an undelivered item done.
    let (target, target_seen) = server(200, "", Duration::ZERO).await;
    let location: &'static str = Box::leak(format!("location: {target}\r\n").into_boxed_str());
    let (url, _) = server(302, location, Duration::ZERO).await;
    let err = delivery(&url, Duration::from_secs(5))
        .process(&item())
        .await
        .unwrap_err();
    assert_eq!(err.status, Some(302), "{err:?}");
    assert!(!err.class.is_retryable(false), "{err:?}");
    assert!(
        target_seen.lock().unwrap().head.is_empty(),
        "the redirect was followed"
    );
}

/// A keep-alive HTTP/1.1 server answering every request on a connection with 200 and a
/// body; counts the connections it accepted.
async fn keep_alive_server() -> (String, Arc<Mutex<usize>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/ingest", listener.local_addr().unwrap());
    let connections = Arc::new(Mutex::new(0usize));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            *counted.lock().unwrap() += 1;
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    // One whole request (head and body) at a time.
                    let request_end = loop {
                        if let Some((_, _, end)) = whole_request(&buf) {
                            break end;
                        }
                        let n = socket.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                    };
                    buf.drain(..request_end);
                    // An answer the worker does not need, its second half a moment after
                    // the head: still arriving when the worker has the status.
                    let body = format!("{{\"accepted\":true,\"note\":\"{}\"}}", "x".repeat(20_000));
                    let (first, second) = body.split_at(body.len() / 2);
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncontent-type: application/json\r\n\r\n",
                        body.len()
                    );
                    if socket
                        .write_all(format!("{head}{first}").as_bytes())
                        .await
                        .is_err()
                    {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    if socket.write_all(second.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, connections)
}

#[tokio::test]
async fn successive_items_reuse_one_connection() {
    let (url, connections) = keep_alive_server().await;
    let delivery = delivery(&url, Duration::from_secs(5));
    for n in 0..5 {
        let item = WorkItem::new(format!("m-{n}"), format!("{{\"n\":{n}}}"));
        assert_eq!(delivery.process(&item).await.unwrap(), Outcome::Done);
    }
    // An answer left unread would close its connection, and every item would open one
    // (a TLS handshake each, on an https downstream).
    assert_eq!(*connections.lock().unwrap(), 1);
}

#[tokio::test]
async fn an_error_answer_is_read_only_as_far_as_the_record_keeps_it() {
    // A 500 whose body is 200 MiB: the server counts what it managed to send before the
    // client stopped reading.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/ingest", listener.local_addr().unwrap());
    const BODY: usize = 200 << 20;
    let sent = Arc::new(Mutex::new(None::<usize>));
    let sent2 = sent.clone();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while whole_request(&buf).is_none() {
            let n = socket.read(&mut chunk).await.unwrap();
            buf.extend_from_slice(&chunk[..n]);
        }
        let head = format!("HTTP/1.1 500 X\r\ncontent-length: {BODY}\r\n\r\n");
        socket.write_all(head.as_bytes()).await.unwrap();
        let block = vec![b'x'; 1 << 20];
        let mut written = 0;
        while written < BODY {
            if socket.write_all(&block).await.is_err() {
                break;
            }
            written += block.len();
        }
        *sent2.lock().unwrap() = Some(written);
    });
    let error = delivery(&url, Duration::from_secs(30))
        .process(&item())
        .await
        .unwrap_err();
    assert_eq!(error.class, ErrorClass::ServerError);
    assert!(
        error
            .detail
            .as_deref()
            .is_some_and(|d| d.starts_with("xxx")),
        "{error:?}"
    );
    // The client hung up after its first bytes: the server could not send it all (socket
    // buffers hold a few MiB at most).
    let sent = loop {
        if let Some(n) = *sent.lock().unwrap() {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        sent < BODY / 4,
        "the server sent {sent} of {BODY} bytes: the answer was read whole"
    );
}
