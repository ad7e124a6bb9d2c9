//! A downstream HTTP service that answers deterministically per item, so a keeper run has
//! every kind of failure on cue. The item body's `scenario` field decides:
//!
//! | scenario | answer |
//! | --- | --- |
//! | `ok` (or none) | 200 |
//! | `duplicate` | 208 (already processed: the worker counts it as skipped) |
//! | `flaky` | 503 for the first `flaky_failures` requests of that item id, then 200 |
//! | `throttled` | 429 on every request |
//! | `invalid` | 400 |
//! | `forbidden` | 403 |
//! | `slow` | 200 after `slow_delay` (longer than the worker's timeout) |
//! | `huge_retry_after` | 429 with `Retry-After: 10000000000000000000` (a peer's absurd header) |
//!
//! `POST /control/fix` makes every later request succeed (the operator "fixed" the
//! downstream); `GET /stats` returns request counts. [`Downstream::peak_in_flight`] says how
//! many requests it answered at once at most (a worker serving invocations concurrently).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hyper::{Method, StatusCode};

use crate::http_server::{text, Handler, Server, SimpleRequest};

/// How the downstream misbehaves.
#[derive(Debug, Clone)]
pub struct DownstreamConfig {
    /// 503s before a `flaky` item succeeds.
    pub flaky_failures: u32,
    /// How long a `slow` item takes.
    pub slow_delay: Duration,
}

impl Default for DownstreamConfig {
    fn default() -> Self {
        DownstreamConfig {
            flaky_failures: 2,
            slow_delay: Duration::from_secs(3),
        }
    }
}

#[derive(Default)]
struct State {
    fixed: AtomicBool,
    calls: Mutex<HashMap<String, u32>>,
    answers: Mutex<HashMap<u16, u64>>,
    delivered: Mutex<Vec<String>>,
    in_flight: AtomicU32,
    peak_in_flight: AtomicU32,
}

/// Counts a request in flight while it lives.
struct InFlight<'a>(&'a State);

impl<'a> InFlight<'a> {
    fn enter(state: &'a State) -> Self {
        let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        state.peak_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(state)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A running downstream.
pub struct Downstream {
    server: Server,
    state: Arc<State>,
}

impl Downstream {
    /// Starts on `127.0.0.1:port` (0 = any free port).
    pub async fn start(port: u16, config: DownstreamConfig) -> std::io::Result<Downstream> {
        let state = Arc::new(State::default());
        let handler_state = state.clone();
        let handler: Handler = Arc::new(move |req| {
            let state = handler_state.clone();
            let config = config.clone();
            Box::pin(async move { answer(&state, &config, req).await })
        });
        Ok(Downstream {
            server: Server::start(port, handler).await?,
            state,
        })
    }

    /// The URL items are POSTed to.
    pub fn url(&self) -> String {
        format!("http://{}/ingest", self.server.addr())
    }

    /// Makes every later request succeed.
    pub fn fix(&self) {
        self.state.fixed.store(true, Ordering::SeqCst);
    }

    /// Item ids answered with 200, in the order they were answered.
    pub fn delivered(&self) -> Vec<String> {
        self.state
            .delivered
            .lock()
            .map(|d| d.clone())
            .unwrap_or_default()
    }

    /// Request bodies seen for one item id, counting every attempt.
    pub fn calls(&self, item_id: &str) -> u32 {
        self.state
            .calls
            .lock()
            .ok()
            .and_then(|c| c.get(item_id).copied())
            .unwrap_or(0)
    }

    /// The most `/ingest` requests it was answering at one time.
    pub fn peak_in_flight(&self) -> u32 {
        self.state.peak_in_flight.load(Ordering::SeqCst)
    }

    /// Requests answered so far, by status.
    pub fn answers(&self) -> HashMap<u16, u64> {
        self.state
            .answers
            .lock()
            .map(|a| a.clone())
            .unwrap_or_default()
    }
}

async fn answer(
    state: &State,
    config: &DownstreamConfig,
    req: SimpleRequest,
) -> hyper::Response<http_body_util::Full<Bytes>> {
    match (&req.method, req.path.as_str()) {
        (&Method::POST, "/control/fix") => {
            state.fixed.store(true, Ordering::SeqCst);
            return text(StatusCode::OK, "fixed");
        }
        (&Method::GET, "/stats") => {
            let answers = state.answers.lock().map(|a| a.clone()).unwrap_or_default();
            let body = serde_json::to_string(&answers).unwrap_or_default();
            return text(StatusCode::OK, body);
        }
        (&Method::POST, "/ingest") => {}
        _ => return text(StatusCode::NOT_FOUND, "unknown path"),
    }
    let _in_flight = InFlight::enter(state);
    let doc: serde_json::Value = serde_json::from_slice(&req.body).unwrap_or_default();
    let scenario = doc.get("scenario").and_then(|s| s.as_str()).unwrap_or("ok");
    let id = match doc.get("id") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::from_utf8_lossy(&req.body).to_string(),
    };
    let call = match state.calls.lock() {
        Ok(mut calls) => {
            let n = calls.entry(id.clone()).or_default();
            *n += 1;
            *n
        }
        Err(_) => 1,
    };
    let status = if state.fixed.load(Ordering::SeqCst) {
        StatusCode::OK
    } else {
        match scenario {
            "duplicate" => StatusCode::ALREADY_REPORTED,
            "flaky" if call <= config.flaky_failures => StatusCode::SERVICE_UNAVAILABLE,
            "throttled" | "huge_retry_after" => StatusCode::TOO_MANY_REQUESTS,
            "invalid" => StatusCode::BAD_REQUEST,
            "forbidden" => StatusCode::FORBIDDEN,
            "slow" => {
                tokio::time::sleep(config.slow_delay).await;
                StatusCode::OK
            }
            _ => StatusCode::OK,
        }
    };
    if let Ok(mut answers) = state.answers.lock() {
        *answers.entry(status.as_u16()).or_default() += 1;
    }
    if status == StatusCode::OK {
        if let Ok(mut delivered) = state.delivered.lock() {
            delivered.push(id);
        }
    }
    let body = match status {
        StatusCode::BAD_REQUEST => "field 'amount' must be a positive number",
        StatusCode::FORBIDDEN => "tenant is not allowed to write here",
        StatusCode::TOO_MANY_REQUESTS => "rate limit exceeded, slow down",
        StatusCode::SERVICE_UNAVAILABLE => "service temporarily unavailable",
        _ => "",
    };
    let mut response = text(status, body);
    if scenario == "huge_retry_after" && status == StatusCode::TOO_MANY_REQUESTS {
        response.headers_mut().insert(
            hyper::header::RETRY_AFTER,
            hyper::header::HeaderValue::from_static("10000000000000000000"),
        );
    }
    response
}
