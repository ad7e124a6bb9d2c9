//! The error responses the proxy answers with, in each service's wire format: the JSON
//! protocol (`__type`, and for SQS the query-compatible `x-amzn-query-error` header), S3's
//! XML `<Error>` document, plain text for anything else. The SDK parses them into the same
//! typed errors and retry decisions as real AWS failures.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};

use super::operation::{Operation, Service};
use super::rules::Fault;

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
pub(super) fn error_response(
    operation: &Operation,
    fault: Fault,
    request_id: &str,
) -> Response<Full<Bytes>> {
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
    use http_body_util::BodyExt;

    use super::*;

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
