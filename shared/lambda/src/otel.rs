//! OpenTelemetry for traced records (`opentelemetry` feature).
//!
//! A record a traced producer sent runs in a `record` span
//! ([`sqs_keeper_core::trace::TraceContext::span`]). Through [`layer`], that span is
//! exported as a child of the producer's span, so the producer, the record, the handler's
//! own spans and the downstream (`HttpDelivery` sends `traceparent`) share one trace. The
//! invocation's span is a child of Lambda's own segment (the invocation's X-Ray trace), and
//! each traced record's span links to it. The
//! team brings its tracer: an OTLP exporter to the ADOT collector or to CloudWatch's OTLP
//! endpoint, built on the maintained `opentelemetry` crates. The feature is off by default,
//! and a build without it carries none of them.
//!
//! ```no_run
//! use opentelemetry::trace::TracerProvider as _;
//! use tracing_subscriber::prelude::*;
//!
//! # fn provider() -> opentelemetry::trace::noop::NoopTracerProvider {
//! #     opentelemetry::trace::noop::NoopTracerProvider::new()
//! # }
//! // The team's provider and exporter (OTLP, say).
//! let tracer = provider().tracer("orders-worker");
//! tracing_subscriber::registry()
//!     .with(sqs_keeper_lambda::telemetry::log_layer())
//!     .with(sqs_keeper_lambda::otel::layer(tracer))
//!     .init();
//! ```

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use sqs_keeper_core::trace::TraceContext;
use tracing::Subscriber;
use tracing_opentelemetry::{OpenTelemetryLayer, OpenTelemetrySpanExt};
use tracing_subscriber::registry::LookupSpan;

/// Returns the `tracing` layer exporting spans to `tracer`, with every traced record's span a child
/// of its producer's ([`link_records`]).
pub fn layer<S, T>(tracer: T) -> OpenTelemetryLayer<S, T>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
    T: opentelemetry::trace::Tracer + 'static,
    T::Span: Send + Sync,
{
    link_records();
    tracing_opentelemetry::layer().with_tracer(tracer)
}

/// Makes every traced record's span, from now on, a child of its producer's span. For a
/// team that builds its `tracing-opentelemetry` layer itself; [`layer`] calls it.
pub fn link_records() {
    // Set once per process: a second call finds this very hook in place.
    let _ = sqs_keeper_core::trace::on_record_span(set_producer_parent);
}

/// Returns the OpenTelemetry context of the producer's span that `trace` names, as a remote
/// parent. `None` for ids OpenTelemetry would not take (the core has checked them).
pub fn producer_context(trace: &TraceContext) -> Option<opentelemetry::Context> {
    let trace_id = TraceId::from_hex(&trace.trace_id).ok()?;
    let span_id = SpanId::from_hex(&trace.parent_id).ok()?;
    let flags = if trace.sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    let span = SpanContext::new(trace_id, span_id, flags, true, TraceState::default());
    span.is_valid()
        .then(|| opentelemetry::Context::new().with_remote_span_context(span))
}

fn set_producer_parent(trace: &TraceContext, span: &tracing::Span) {
    // The span the record starts in (the invocation's, or a team layer's span inside it),
    // read before the producer's span replaces it as the parent. It is linked, so that the
    // invocation's trace still leads to the record.
    let invocation = tracing::Span::current()
        .context()
        .span()
        .span_context()
        .clone();
    if let Some(parent) = producer_context(trace) {
        // Refused only when no OpenTelemetry layer sees the span: nothing to link then.
        let _ = span.set_parent(parent);
        if invocation.is_valid() {
            span.add_link(invocation);
        }
    }
}

/// Makes an invocation's span a child of Lambda's own segment, which `xray_trace_id` (the
/// invocation's `X-Amzn-Trace-Id`) names, when X-Ray sampled it. The invocation then sits
/// in the trace X-Ray shows for the function, and each traced record links to it
/// ([`link_records`]). An unsampled segment is not taken as the parent: under a
/// parent-based sampler it would drop the invocation's spans, which the team's own sampler
/// decides on instead.
pub(crate) fn parent_on_lambda_segment(span: &tracing::Span, xray_trace_id: &str) {
    let segment = TraceContext::from_xray(xray_trace_id)
        .filter(|segment| segment.sampled)
        .as_ref()
        .and_then(producer_context);
    if let Some(segment) = segment {
        let _ = span.set_parent(segment);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use lambda_runtime::{Context, LambdaEvent};
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    use serde_json::value::RawValue;
    use sqs_keeper_core::testing::MemorySink;
    use sqs_keeper_core::{
        BatchConfig, BatchProcessor, Outcome, ProcessError, Processor, WorkItem,
    };
    use tracing::Instrument;
    use tracing_subscriber::prelude::*;

    const PRODUCER_TRACE: &str = "5759e988bd862e3fe1be46a994272793";
    const PRODUCER_SPAN: &str = "53995c3f42cd8ad8";
    /// The trace Lambda's own segment is in, and the segment's id.
    const LAMBDA_TRACE: &str = "6759e988aaaaaaaaaaaaaaaaaaaaaaaa";
    const LAMBDA_SEGMENT: &str = "1111111111111111";

    /// The trace a handler's span was in, and the `traceparent` `HttpDelivery` would send.
    type Seen = (String, Option<String>);

    /// A handler that calls its downstream inside a span of its own, and keeps what it saw.
    #[derive(Default, Clone)]
    struct Downstream {
        seen: Arc<Mutex<Vec<Seen>>>,
    }

    impl Processor for Downstream {
        async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
            let call = tracing::info_span!("downstream-call");
            let trace_id = call.context().span().span_context().trace_id().to_string();
            let traceparent = item.trace().map(|t| t.traceparent());
            if let Ok(mut seen) = self.seen.lock() {
                seen.push((trace_id, traceparent));
            }
            Ok(Outcome::Done)
        }
    }

    /// Spans exported to memory through [`layer`], for as long as it lives.
    struct Exported {
        exporter: InMemorySpanExporter,
        provider: SdkTracerProvider,
        _subscriber: tracing::subscriber::DefaultGuard,
    }

    impl Exported {
        fn start() -> Exported {
            let exporter = InMemorySpanExporter::default();
            let provider = SdkTracerProvider::builder()
                .with_simple_exporter(exporter.clone())
                .build();
            let subscriber = tracing_subscriber::registry().with(layer(provider.tracer("test")));
            Exported {
                exporter,
                provider,
                _subscriber: tracing::subscriber::set_default(subscriber),
            }
        }

        /// The spans finished so far.
        fn spans(&self) -> Vec<opentelemetry_sdk::trace::SpanData> {
            self.provider.force_flush().unwrap();
            self.exporter.get_finished_spans().unwrap()
        }
    }

    /// The exported span named `name`.
    fn named<'a>(
        spans: &'a [opentelemetry_sdk::trace::SpanData],
        name: &str,
    ) -> &'a opentelemetry_sdk::trace::SpanData {
        spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name} span was exported"))
    }

    /// The X-Ray header Lambda gives an invocation in [`LAMBDA_TRACE`] under
    /// [`LAMBDA_SEGMENT`].
    fn lambda_trace_header(sampled: bool) -> String {
        format!(
            "Root=1-{}-{};Parent={LAMBDA_SEGMENT};Sampled={}",
            &LAMBDA_TRACE[..8],
            &LAMBDA_TRACE[8..],
            u8::from(sampled)
        )
    }

    fn event() -> String {
        let record = |id: &str, traced: bool| {
            let mut attributes = serde_json::json!({"ApproximateReceiveCount": "1"});
            let mut message_attributes = serde_json::json!({});
            if traced {
                message_attributes["traceparent"] = serde_json::json!({
                    "dataType": "String",
                    "stringValue": format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01"),
                });
            } else {
                attributes["SentTimestamp"] = serde_json::json!("1700000000000");
            }
            serde_json::json!({
                "messageId": id, "body": "{}", "attributes": attributes,
                "messageAttributes": message_attributes,
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:orders",
            })
        };
        serde_json::json!({"Records": [record("traced", true), record("plain", false)]}).to_string()
    }

    /// Producer, record and downstream share one trace: the worker's `record` span is
    /// exported as a child of the producer's span, the handler's own span is in that
    /// trace, and the downstream is sent the same trace. A record without a trace gets a
    /// trace of its own, not the producer's.
    #[tokio::test(flavor = "current_thread")]
    async fn the_producer_the_record_and_the_downstream_share_one_trace() {
        let exported = Exported::start();

        let downstream = Downstream::default();
        let engine = BatchProcessor::new(
            downstream.clone(),
            MemorySink::new(),
            BatchConfig::default(),
        );
        let worker =
            crate::worker::Worker::new(engine, Duration::from_millis(100)).without_metrics();
        let raw: Box<RawValue> = serde_json::from_str(&event()).unwrap();
        let mut context = Context::default();
        context.request_id = "req-1".into();
        context.xray_trace_id = Some(lambda_trace_header(true));
        context.deadline = u64::try_from(
            (std::time::SystemTime::now() + Duration::from_secs(300))
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap();
        let invocation = crate::telemetry::invocation_span(&context, false);
        let response = worker
            .handle(LambdaEvent::new(raw, context))
            .instrument(invocation)
            .await
            .unwrap();
        assert!(response.batch_item_failures.is_empty());

        let spans = exported.spans();
        let record = named(&spans, sqs_keeper_core::trace::RECORD_SPAN);
        assert_eq!(record.span_context.trace_id().to_string(), PRODUCER_TRACE);
        assert_eq!(record.parent_span_id.to_string(), PRODUCER_SPAN);
        let seen = downstream.seen.lock().unwrap().clone();
        let traced = seen.iter().find(|(_, tp)| tp.is_some()).unwrap();
        assert_eq!(traced.0, PRODUCER_TRACE, "the handler's span");
        assert_eq!(
            traced.1.as_deref(),
            Some(format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01").as_str()),
            "what the downstream is sent"
        );
        let calls: Vec<_> = spans
            .iter()
            .filter(|s| s.name == "downstream-call")
            .collect();
        assert_eq!(calls.len(), 2);
        assert!(calls
            .iter()
            .any(|s| s.span_context.trace_id().to_string() == PRODUCER_TRACE
                && s.parent_span_id == record.span_context.span_id()));
        let plain = seen.iter().find(|(_, tp)| tp.is_none()).unwrap();
        assert_ne!(plain.0, PRODUCER_TRACE);
        // The invocation is a child of Lambda's own segment, and the traced record links
        // to it; the untraced record's spans stay in the invocation's trace.
        let invocation = named(&spans, crate::telemetry::INVOCATION_SPAN);
        assert_eq!(invocation.span_context.trace_id().to_string(), LAMBDA_TRACE);
        assert_eq!(invocation.parent_span_id.to_string(), LAMBDA_SEGMENT);
        let linked: Vec<_> = record
            .links
            .iter()
            .map(|l| l.span_context.clone())
            .collect();
        assert_eq!(linked, std::slice::from_ref(&invocation.span_context));
        assert_eq!(plain.0, LAMBDA_TRACE);
    }

    /// An invocation X-Ray did not sample is not put under Lambda's segment: a
    /// parent-based sampler would drop its spans. It is a root, for the team's sampler.
    #[test]
    fn an_unsampled_invocation_is_a_root_of_its_own() {
        let exported = Exported::start();
        let mut context = Context::default();
        context.xray_trace_id = Some(lambda_trace_header(false));
        drop(crate::telemetry::invocation_span(&context, false));
        let spans = exported.spans();
        let invocation = named(&spans, crate::telemetry::INVOCATION_SPAN);
        assert_ne!(invocation.span_context.trace_id().to_string(), LAMBDA_TRACE);
        assert_eq!(invocation.parent_span_id, SpanId::INVALID);
    }

    #[test]
    fn a_producer_context_is_remote_and_keeps_the_sampling() {
        let trace =
            TraceContext::from_traceparent(&format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-00"))
                .unwrap();
        let context = producer_context(&trace).unwrap();
        let span = context.span().span_context().clone();
        assert!(span.is_remote());
        assert!(!span.is_sampled());
        assert_eq!(span.span_id().to_string(), PRODUCER_SPAN);
    }
}
