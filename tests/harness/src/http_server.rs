//! A minimal HTTP/1.1 server (hyper) on a loopback port, for local stand-ins of AWS and
//! downstream endpoints.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A request with its body read.
#[derive(Debug)]
pub struct SimpleRequest {
    /// Method, e.g. `POST`.
    pub method: hyper::Method,
    /// Path without the query.
    pub path: String,
    /// Request headers.
    pub headers: hyper::HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

/// Handles one request.
pub type Handler = Arc<
    dyn Fn(SimpleRequest) -> Pin<Box<dyn Future<Output = Response<Full<Bytes>>> + Send>>
        + Send
        + Sync,
>;

/// A running server; stops when dropped.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Server {
    /// Binds `127.0.0.1:port` (0 = any free port) and serves `handler` until dropped.
    pub async fn start(port: u16, handler: Handler) -> std::io::Result<Server> {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let handler = handler.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let handler = handler.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = match body.collect().await {
                                Ok(collected) => collected.to_bytes(),
                                Err(_) => {
                                    return Ok::<_, Infallible>(text(
                                        StatusCode::BAD_REQUEST,
                                        "unreadable body",
                                    ))
                                }
                            };
                            let request = SimpleRequest {
                                method: parts.method,
                                path: parts.uri.path().to_string(),
                                headers: parts.headers,
                                body,
                            };
                            Ok(handler(request).await)
                        }
                    });
                    // A client that disconnects mid-request is not an error worth reporting.
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Server { addr, task })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A plain-text response.
pub fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
}
