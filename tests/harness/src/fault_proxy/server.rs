//! The proxy's server: accepts connections on loopback, identifies and counts each
//! request, and either forwards it unchanged to its service's upstream (DynamoDB Local for
//! DynamoDB, the other emulator for the rest) or answers it with the fault its rules
//! decide: a wire-format error, a delay before forwarding, or an abortive close of the
//! connection.

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, CONTENT_LENGTH};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use sqs_keeper_aws::Endpoints;

use super::audit::{accesses, AuditLog};
use super::meter::Meter;
use super::operation::{Operation, Service};
use super::rules::{Fault, Faults};
use super::wire::error_response;

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

/// The upstreams, one per endpoint of [`Endpoints`].
#[derive(Debug)]
struct Upstreams {
    shared: Upstream,
    dynamodb: Upstream,
}

impl Upstreams {
    fn for_service(&self, service: Service) -> &Upstream {
        match service {
            Service::DynamoDb => &self.dynamodb,
            Service::Sqs | Service::S3 | Service::Other => &self.shared,
        }
    }
}

/// What the connection tasks share.
#[derive(Debug)]
struct Shared {
    upstreams: Upstreams,
    client: Client<HttpConnector, Full<Bytes>>,
    faults: Faults,
    audit: AuditLog,
    meter: Meter,
    request_ids: AtomicU64,
}

/// Binds `127.0.0.1:0` and serves connections, forwarding to `upstreams` (`http://host:port`
/// URLs) under the rules of `faults`, until the returned task is aborted. Must be called
/// inside a tokio runtime.
pub(super) async fn spawn(
    upstreams: &Endpoints,
    faults: Faults,
    audit: AuditLog,
    meter: Meter,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let upstreams = Upstreams {
        shared: Upstream::parse(&upstreams.shared)?,
        dynamodb: Upstream::parse(&upstreams.dynamodb)?,
    };
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let shared = Arc::new(Shared {
        upstreams,
        client: Client::builder(TokioExecutor::new()).build_http(),
        faults,
        audit,
        meter,
        request_ids: AtomicU64::new(0),
    });
    let task = tokio::spawn(accept_loop(listener, shared));
    Ok((addr, task))
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
    shared.audit.record(accesses(
        &operation,
        &parts.method,
        &parts.uri,
        &parts.headers,
        &body,
    ));
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
        None => Ok(forward(shared, &operation, parts, body).await),
        Some(Fault::Delay(delay)) => {
            tokio::time::sleep(delay).await;
            Ok(forward(shared, &operation, parts, body).await)
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

/// Sends the request on to its service's upstream (asking for what the meter counts, when
/// metered), and returns the answer as it came, counted.
async fn forward(
    shared: &Shared,
    operation: &Operation,
    mut parts: hyper::http::request::Parts,
    body: Bytes,
) -> Response<Full<Bytes>> {
    let body = shared.meter.request_body(operation, body);
    let sent = body.clone();
    parts.uri = match shared
        .upstreams
        .for_service(operation.service)
        .uri_for(&parts.uri)
    {
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
    shared
        .meter
        .record(operation, &sent, parts.status.as_u16(), &body);
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
