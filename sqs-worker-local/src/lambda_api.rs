//! A local stand-in for the Lambda **Invoke** API (`POST /2015-03-31/functions/{name}/invocations`),
//! forwarding each synchronous invocation to a function binary through a
//! [`crate::runtime_api::RuntimeApi`]. Lets `dlq redrive --via-function` run against the
//! real redrive binary with no AWS account.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::{Method, StatusCode};

use crate::http_server::{text, Handler, Server};
use crate::runtime_api::{InvocationResult, RuntimeApi};

/// A running Invoke API endpoint for one function.
pub struct LambdaApi {
    server: Server,
}

impl LambdaApi {
    /// Serves invocations of `function_name`, each given `timeout`.
    pub async fn start(
        function_name: &str,
        runtime: Arc<RuntimeApi>,
        timeout: Duration,
    ) -> std::io::Result<LambdaApi> {
        let path = format!("/2015-03-31/functions/{function_name}/invocations");
        let handler: Handler = Arc::new(move |req| {
            let runtime = runtime.clone();
            let path = path.clone();
            Box::pin(async move {
                if req.method != Method::POST || req.path != path {
                    let mut response = text(
                        StatusCode::NOT_FOUND,
                        r#"{"Type":"User","message":"Function not found"}"#,
                    );
                    response.headers_mut().insert(
                        "x-amzn-errortype",
                        hyper::header::HeaderValue::from_static("ResourceNotFoundException"),
                    );
                    return response;
                }
                match runtime.invoke(req.body, timeout).await {
                    Ok(InvocationResult::Response(body)) => text(StatusCode::OK, body),
                    Ok(InvocationResult::Error(body)) => {
                        let mut response = text(StatusCode::OK, body);
                        response.headers_mut().insert(
                            "x-amz-function-error",
                            hyper::header::HeaderValue::from_static("Unhandled"),
                        );
                        response
                    }
                    Err(e) => text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        Bytes::from(e.to_string()),
                    ),
                }
            })
        });
        Ok(LambdaApi {
            server: Server::start(0, handler).await?,
        })
    }

    /// The endpoint URL for a Lambda client.
    pub fn url(&self) -> String {
        format!("http://{}", self.server.addr())
    }
}
