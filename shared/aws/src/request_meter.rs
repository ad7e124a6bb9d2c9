//! Counts the AWS requests each worker invocation makes, as metrics of that invocation.
//!
//! [`RequestMeter`] is an SDK interceptor on every client [`crate::AwsClients`] builds. Each
//! request sent, a retry included, adds to the running invocation's metric sink
//! ([`sqs_keeper_core::context::invocation_metrics`]). A retry counts because AWS bills it.
//! The names are [`REQUEST_METRICS`], one per service. An SQS request counts once per 64 KiB
//! of its body or its answer, whichever is larger, as SQS bills it. Outside an invocation (the
//! redrive function, `dlq`) the counts go nowhere.
//!
//! The worker's EMF document then carries them beside the records it counts, so that a
//! change in what a message costs shows the day it happens.

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use sqs_keeper_core::context::{invocation_metrics, Unit};

/// The metrics the meter adds, by the service as the SDK's operation metadata names it.
pub const REQUEST_METRICS: [(&str, &str); 4] = [
    ("SQS", "SqsRequests"),
    ("DynamoDB", "DynamoDbRequests"),
    ("S3", "S3Requests"),
    ("Secrets Manager", "SecretsManagerRequests"),
];

/// The chunk SQS bills a request by.
const SQS_BILLED_CHUNK: u64 = 64 * 1024;

/// The interceptor that counts requests into the running invocation's metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestMeter;

/// Returns the metric of the service `cfg`'s operation belongs to, if it is one counted.
fn metric_of(cfg: &ConfigBag) -> Option<&'static str> {
    let service = cfg.load::<Metadata>()?.service();
    REQUEST_METRICS
        .iter()
        .find(|(name, _)| *name == service)
        .map(|(_, metric)| *metric)
}

/// Returns how many requests SQS bills for a call whose larger payload is `bytes` long.
fn sqs_billed(bytes: u64) -> u64 {
    bytes.div_ceil(SQS_BILLED_CHUNK).max(1)
}

impl Intercept for RequestMeter {
    fn name(&self) -> &'static str {
        "RequestMeter"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(metric) = metric_of(cfg) {
            // Counted when sent, so a request that fails on the wire still counts; an SQS
            // request's chunks beyond the first are added once its answer is known.
            let sent = context.request().body().content_length().unwrap_or(0);
            let chunks = if metric == "SqsRequests" {
                sqs_billed(sent)
            } else {
                1
            };
            invocation_metrics().tally(metric, Unit::Count, chunks as f64);
            cfg.interceptor_state().store_put(SentChunks(chunks));
        }
        Ok(())
    }

    fn read_after_transmit(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if metric_of(cfg) != Some("SqsRequests") {
            return Ok(());
        }
        let answered = context.response().body().content_length().unwrap_or(0);
        let counted = cfg.load::<SentChunks>().map_or(1, |c| c.0);
        let more = sqs_billed(answered).saturating_sub(counted);
        if more > 0 {
            invocation_metrics().tally("SqsRequests", Unit::Count, more as f64);
        }
        Ok(())
    }
}

/// The chunks an SQS request was counted as when sent.
#[derive(Debug, Clone, Copy)]
struct SentChunks(u64);

impl aws_smithy_types::config_bag::Storable for SentChunks {
    type Storer = aws_smithy_types::config_bag::StoreReplace<Self>;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each service is found by the name its SDK's operations carry (aws-sdk-secretsmanager
    /// names its service "Secrets Manager", with a space).
    #[test]
    fn each_service_is_found_by_the_name_its_sdk_gives() {
        for (service, metric) in [
            ("SQS", Some("SqsRequests")),
            ("DynamoDB", Some("DynamoDbRequests")),
            ("S3", Some("S3Requests")),
            ("Secrets Manager", Some("SecretsManagerRequests")),
            ("Lambda", None),
        ] {
            let mut layer = aws_smithy_types::config_bag::Layer::new("test");
            layer.store_put(Metadata::new("AnOperation", service));
            let cfg = ConfigBag::of_layers(vec![layer]);
            assert_eq!(metric_of(&cfg), metric, "{service}");
        }
    }

    #[test]
    fn sqs_bills_each_64_kib_of_a_payload_as_a_request() {
        assert_eq!(sqs_billed(0), 1);
        assert_eq!(sqs_billed(65_536), 1);
        assert_eq!(sqs_billed(65_537), 2);
        assert_eq!(sqs_billed(1_048_576), 16);
    }
}
