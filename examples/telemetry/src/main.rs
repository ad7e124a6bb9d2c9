//! A handler that keeps its team's telemetry: a tracing subscriber of its own (the
//! library's Lambda log layer beside a layer of the team's), and a tower layer of its own
//! around each invocation.
//!
//! The team's layers here only count and mark what they see. They stand for Sentry's
//! tracing layer, and for lambda_runtime's OpenTelemetry layer or a timing layer: each
//! plugs in at the same place. Its OpenTelemetry tracer is real (`opentelemetry` feature):
//! a traced record's span is exported as a child of its producer's span. Its exporter
//! marks each span on stderr; a team's would be OTLP to the ADOT collector.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use sqs_keeper::telemetry::tower::{Layer, Service};
use sqs_keeper::{handler_fn, Outcome, ProcessError, Setup, WorkItem};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

async fn handle(item: &WorkItem) -> Result<Outcome, ProcessError> {
    tracing::info!(item_id = %item.item_id, "handled");
    Ok(Outcome::Done)
}

/// The team's tower layer: counts the invocations the process served, and logs the count
/// inside the invocation's span.
#[derive(Clone, Default)]
struct CountInvocations {
    served: Arc<AtomicU64>,
}

impl<S> Layer<S> for CountInvocations {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            served: self.served.clone(),
        }
    }
}

/// The service [`CountInvocations`] wraps around the worker.
#[derive(Clone)]
struct Counted<S> {
    inner: S,
    served: Arc<AtomicU64>,
}

impl<S, R> Service<R> for Counted<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, invocation: R) -> S::Future {
        let served = self.served.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::info!(served, "the team's tower layer saw an invocation");
        self.inner.call(invocation)
    }
}

/// The team's span exporter: marks on stderr each span exported, with its trace and
/// parent. A team's would send them on (`opentelemetry-otlp`).
#[derive(Debug)]
struct MarkSpans;

impl opentelemetry_sdk::trace::SpanExporter for MarkSpans {
    async fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        for span in batch {
            eprintln!(
                "the team's exporter saw span {} in trace {} under {}",
                span.name,
                span.span_context.trace_id(),
                span.parent_span_id
            );
        }
        Ok(())
    }
}

/// The team's tracing layer: marks on stderr each event it is given, with its level.
struct MarkEvents;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for MarkEvents {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        eprintln!(
            "the team's tracing layer saw a {} event",
            event.metadata().level()
        );
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), sqs_keeper::Error> {
    use opentelemetry::trace::TracerProvider as _;
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(MarkSpans)
        .build();
    // Installed first, this subscriber is the one used: the library installs none.
    tracing_subscriber::registry()
        .with(sqs_keeper::telemetry::log_layer())
        .with(MarkEvents)
        .with(sqs_keeper::telemetry::otel::layer(
            provider.tracer("telemetry-worker"),
        ))
        .init();
    let setup = Setup::from_env().await?;
    setup
        .run_with_layer(handler_fn(handle), CountInvocations::default())
        .await
}
