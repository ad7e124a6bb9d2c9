//! A Lambda Runtime API endpoint (the `2018-06-01` interface a function binary polls), so
//! the compiled worker runs exactly as it would in Lambda: it asks for the next
//! invocation, gets the event with its request id and deadline headers, and posts a
//! response or an error.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hyper::{Method, Response, StatusCode};
use tokio::sync::{mpsc, oneshot, Mutex as AsyncMutex};

use crate::http_server::{text, Handler, Server, SimpleRequest};

const PREFIX: &str = "/2018-06-01/runtime";

/// What the function answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InvocationResult {
    /// `POST .../response`: the handler's return value.
    Response(Bytes),
    /// `POST .../error`: the handler failed the whole invocation.
    Error(Bytes),
}

/// Why an invocation produced no answer.
#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    /// The function reported an initialisation error.
    #[error("the function failed to initialise: {0}")]
    InitError(String),
    /// No answer in time (the function crashed, hung or was never started).
    #[error("no answer from the function within {0:?}")]
    NoAnswer(Duration),
}

struct Pending {
    request_id: String,
    event: Bytes,
    deadline_ms: u64,
    reply: oneshot::Sender<InvocationResult>,
}

struct State {
    queue: AsyncMutex<mpsc::UnboundedReceiver<Pending>>,
    in_flight: Mutex<HashMap<String, oneshot::Sender<InvocationResult>>>,
    init_error: Mutex<Option<String>>,
    function_arn: String,
    /// When the function first asked for an invocation (the end of its cold start).
    first_poll: std::sync::OnceLock<std::time::Instant>,
    first_poll_seen: tokio::sync::Notify,
}

/// A running Runtime API endpoint on loopback.
pub struct RuntimeApi {
    server: Server,
    state: Arc<State>,
    sender: mpsc::UnboundedSender<Pending>,
    next_id: AtomicU64,
}

impl RuntimeApi {
    /// Starts the endpoint on a free loopback port.
    pub async fn start(function_arn: &str) -> std::io::Result<RuntimeApi> {
        let (sender, receiver) = mpsc::unbounded_channel();
        let state = Arc::new(State {
            queue: AsyncMutex::new(receiver),
            in_flight: Mutex::new(HashMap::new()),
            init_error: Mutex::new(None),
            function_arn: function_arn.to_string(),
            first_poll: std::sync::OnceLock::new(),
            first_poll_seen: tokio::sync::Notify::new(),
        });
        let handler_state = state.clone();
        let handler: Handler = Arc::new(move |req| {
            let state = handler_state.clone();
            Box::pin(async move { route(&state, req).await })
        });
        let server = Server::start(0, handler).await?;
        Ok(RuntimeApi {
            server,
            state,
            sender,
            next_id: AtomicU64::new(1),
        })
    }

    /// The value for `AWS_LAMBDA_RUNTIME_API` (`host:port`).
    pub fn address(&self) -> String {
        self.server.addr().to_string()
    }

    /// Invokes the function with `event`, giving it `timeout` (sent as the deadline), and
    /// waits for its answer a little longer than that.
    pub async fn invoke(
        &self,
        event: Bytes,
        timeout: Duration,
    ) -> Result<InvocationResult, InvokeError> {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let deadline_ms =
            now_ms.saturating_add(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        self.invoke_with_deadline_header(event, deadline_ms, timeout)
            .await
    }

    /// Invokes the function with `event` and exactly this `Lambda-Runtime-Deadline-Ms`
    /// value (epoch milliseconds; e.g. the constant 600000 `cargo lambda watch` sends),
    /// waiting `wait` (plus 5 s) for the answer.
    pub async fn invoke_with_deadline_header(
        &self,
        event: Bytes,
        deadline_ms: u64,
        wait: Duration,
    ) -> Result<InvocationResult, InvokeError> {
        let timeout = wait;
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request_id = format!("00000000-0000-4000-8000-{n:012}");
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            request_id,
            event,
            deadline_ms,
            reply,
        };
        let wait = timeout + Duration::from_secs(5);
        if self.sender.send(pending).is_err() {
            return Err(InvokeError::NoAnswer(wait));
        }
        match tokio::time::timeout(wait, answer).await {
            Ok(Ok(result)) => Ok(result),
            _ => match self.init_error() {
                Some(e) => Err(InvokeError::InitError(e)),
                None => Err(InvokeError::NoAnswer(wait)),
            },
        }
    }

    /// Waits until the function first polls for an invocation; the instant it did.
    pub async fn first_poll(&self, timeout: Duration) -> Option<std::time::Instant> {
        let wait = async {
            loop {
                let notified = self.state.first_poll_seen.notified();
                if let Some(at) = self.state.first_poll.get() {
                    return *at;
                }
                notified.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.ok()
    }

    /// The initialisation error the function reported, if any.
    pub fn init_error(&self) -> Option<String> {
        self.state.init_error.lock().ok().and_then(|e| e.clone())
    }
}

async fn route(state: &State, req: SimpleRequest) -> Response<http_body_util::Full<Bytes>> {
    let Some(rest) = req.path.strip_prefix(PREFIX) else {
        return text(StatusCode::NOT_FOUND, "unknown path");
    };
    match (&req.method, rest) {
        (&Method::GET, "/invocation/next") => next_invocation(state).await,
        (&Method::POST, "/init/error") => {
            if let Ok(mut e) = state.init_error.lock() {
                *e = Some(String::from_utf8_lossy(&req.body).to_string());
            }
            text(StatusCode::ACCEPTED, "")
        }
        (&Method::POST, path) => {
            let answer = path
                .strip_prefix("/invocation/")
                .and_then(|p| p.split_once('/'));
            let Some((request_id, kind)) = answer else {
                return text(StatusCode::NOT_FOUND, "unknown path");
            };
            let result = match kind {
                "response" => InvocationResult::Response(req.body),
                "error" => InvocationResult::Error(req.body),
                _ => return text(StatusCode::NOT_FOUND, "unknown path"),
            };
            let reply = state
                .in_flight
                .lock()
                .ok()
                .and_then(|mut m| m.remove(request_id));
            match reply {
                Some(reply) => {
                    let _ = reply.send(result);
                    text(StatusCode::ACCEPTED, "")
                }
                None => text(StatusCode::BAD_REQUEST, "unknown request id"),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "unknown path"),
    }
}

async fn next_invocation(state: &State) -> Response<http_body_util::Full<Bytes>> {
    if state.first_poll.set(std::time::Instant::now()).is_ok() {
        state.first_poll_seen.notify_waiters();
    }
    let pending = state.queue.lock().await.recv().await;
    let Some(pending) = pending else {
        return text(StatusCode::GONE, "runtime api stopped");
    };
    if let Ok(mut m) = state.in_flight.lock() {
        m.insert(pending.request_id.clone(), pending.reply);
    }
    let mut response = text(StatusCode::OK, pending.event);
    let headers = response.headers_mut();
    let pairs = [
        ("lambda-runtime-aws-request-id", pending.request_id),
        (
            "lambda-runtime-deadline-ms",
            pending.deadline_ms.to_string(),
        ),
        (
            "lambda-runtime-invoked-function-arn",
            state.function_arn.clone(),
        ),
        ("content-type", "application/json".to_string()),
    ];
    for (name, value) in pairs {
        if let Ok(value) = hyper::header::HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    response
}
