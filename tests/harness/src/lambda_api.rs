//! A local stand-in for the parts of the Lambda API the functions and the CLI call:
//! **Invoke** (`POST /2015-03-31/functions/{name}/invocations`), forwarding each synchronous
//! invocation to a function binary through a [`crate::runtime_api::RuntimeApi`], and
//! **GetEventSourceMapping** / **UpdateEventSourceMapping**
//! (`GET`/`PUT /2015-03-31/event-source-mappings/{uuid}`) over local pollers'
//! [`crate::esm::MappingState`]. Lets `dlq redrive --via-function` run against the real
//! redrive binary, and the redrive function pause and restore the worker's polling, with no
//! AWS account.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::{Method, StatusCode};

use crate::esm::MappingState;
use crate::http_server::{text, Handler, Server};
use crate::runtime_api::{InvocationResult, RuntimeApi};

/// A running Lambda API endpoint.
pub struct LambdaApi {
    server: Server,
}

/// One function the endpoint invokes.
pub struct LocalFunction {
    /// Its name (the path's `{name}`).
    pub name: String,
    /// Its runtime API.
    pub runtime: Arc<RuntimeApi>,
    /// The time each invocation is given.
    pub timeout: Duration,
}

const FUNCTIONS: &str = "/2015-03-31/functions/";
const MAPPINGS: &str = "/2015-03-31/event-source-mappings/";

impl LambdaApi {
    /// Serves invocations of `function_name`, each given `timeout`.
    pub async fn start(
        function_name: &str,
        runtime: Arc<RuntimeApi>,
        timeout: Duration,
    ) -> std::io::Result<LambdaApi> {
        LambdaApi::serve(
            vec![LocalFunction {
                name: function_name.to_string(),
                runtime,
                timeout,
            }],
            Vec::new(),
        )
        .await
    }

    /// Serves invocations of `functions` and the event source mappings `mappings` (by
    /// UUID).
    pub async fn serve(
        functions: Vec<LocalFunction>,
        mappings: Vec<(String, MappingState)>,
    ) -> std::io::Result<LambdaApi> {
        let functions: Arc<HashMap<String, LocalFunction>> =
            Arc::new(functions.into_iter().map(|f| (f.name.clone(), f)).collect());
        let mappings: Arc<HashMap<String, MappingState>> = Arc::new(mappings.into_iter().collect());
        let handler: Handler = Arc::new(move |req| {
            let functions = functions.clone();
            let mappings = mappings.clone();
            Box::pin(async move {
                if let Some(uuid) = req.path.strip_prefix(MAPPINGS) {
                    let Some(state) = mappings.get(uuid) else {
                        return not_found("The resource you requested does not exist.");
                    };
                    if req.method == Method::PUT {
                        let update: serde_json::Value =
                            serde_json::from_slice(&req.body).unwrap_or_default();
                        if let Some(enabled) = update["Enabled"].as_bool() {
                            state.set_enabled(enabled);
                        }
                    } else if req.method != Method::GET {
                        return not_found("Unsupported method");
                    }
                    let mapping = serde_json::json!({
                        "UUID": uuid,
                        "State": if state.enabled() { "Enabled" } else { "Disabled" },
                        // Epoch seconds, as Lambda's REST API writes a timestamp.
                        "LastModified": state.last_modified_secs(),
                        "BatchSize": 10,
                    });
                    return text(StatusCode::OK, mapping.to_string());
                }
                let function = req
                    .path
                    .strip_prefix(FUNCTIONS)
                    .and_then(|rest| rest.strip_suffix("/invocations"))
                    .filter(|_| req.method == Method::POST)
                    .and_then(|name| functions.get(name));
                let Some(function) = function else {
                    return not_found("Function not found");
                };
                match function.runtime.invoke(req.body, function.timeout).await {
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

fn not_found(message: &str) -> hyper::Response<http_body_util::Full<Bytes>> {
    let mut response = text(
        StatusCode::NOT_FOUND,
        serde_json::json!({"Type": "User", "message": message}).to_string(),
    );
    response.headers_mut().insert(
        "x-amzn-errortype",
        hyper::header::HeaderValue::from_static("ResourceNotFoundException"),
    );
    response
}
