//! A record's trace context: the X-Ray header SQS keeps as the `AWSTraceHeader` system
//! attribute, or a W3C `traceparent` message attribute a producer sent. Either becomes one
//! [`TraceContext`], which the record's log lines name and the HTTP delivery passes on in
//! both forms, so one trace runs from the producer through the queue to the downstream.
//!
//! Written by hand: both formats are one line each, and the crates that parse them
//! (`opentelemetry-aws`, `opentelemetry`'s propagators) bring an SDK a handler that traces
//! nothing would not need.

use std::collections::HashMap;

use aws_lambda_events::sqs::SqsMessageAttribute;

use crate::event::{Attributes, SqsRecord};
use crate::item::WorkItem;

/// The SQS system attribute holding the producer's X-Ray trace header.
pub const AWS_TRACE_HEADER: &str = "AWSTraceHeader";

/// The message attribute a W3C-tracing producer sends its context in.
pub const TRACEPARENT: &str = "traceparent";

/// The name of the span a traced record runs in: its fields (`trace_id`, `traceparent`)
/// are on every line logged while it runs.
pub const RECORD_SPAN: &str = "record";

/// What is called with each traced record's span as it is made ([`on_record_span`]).
pub type RecordSpanHook = fn(&TraceContext, &tracing::Span);

static RECORD_SPAN_HOOK: std::sync::OnceLock<RecordSpanHook> = std::sync::OnceLock::new();

/// Sets the hook called with each traced record's span as it is made, once per process.
/// `false` when one was set before (it stays).
///
/// A tracing integration that keeps a span's parent apart from its fields (OpenTelemetry)
/// links the span to the producer's there. The core depends on no such crate: the lambda
/// crate's `opentelemetry` feature sets this hook.
pub fn on_record_span(hook: RecordSpanHook) -> bool {
    RECORD_SPAN_HOOK.set(hook).is_ok()
}

/// One trace context: the trace, the span that sent the record, and whether it is sampled.
///
/// ```
/// use sqs_keeper_core::trace::TraceContext;
///
/// let xray = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
/// let trace = TraceContext::from_xray(xray).unwrap();
/// assert_eq!(
///     trace.traceparent(),
///     "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"
/// );
/// assert_eq!(trace.xray_header(), xray);
/// assert_eq!(TraceContext::from_traceparent(&trace.traceparent()), Some(trace));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// The trace id: 32 lowercase hex digits, not all zero.
    pub trace_id: String,
    /// The id of the span that sent the record: 16 lowercase hex digits, not all zero.
    pub parent_id: String,
    /// Whether the producer sampled the trace.
    pub sampled: bool,
}

impl TraceContext {
    /// Reads an X-Ray trace header (`Root=1-{8 hex}-{24 hex};Parent={16 hex};Sampled=1`).
    /// `None` without a valid root and parent: a header X-Ray has not sampled yet may lack
    /// the parent, and then there is no span to continue.
    pub fn from_xray(header: &str) -> Option<TraceContext> {
        let (mut root, mut parent, mut sampled) = (None, None, false);
        for part in header.split(';') {
            match part.trim().split_once('=') {
                Some(("Root", value)) => root = Some(value),
                Some(("Parent", value)) => parent = Some(value),
                Some(("Sampled", value)) => sampled = value == "1",
                _ => {}
            }
        }
        let mut pieces = root?.split('-');
        let (version, time, rest) = (pieces.next()?, pieces.next()?, pieces.next()?);
        if version != "1" || pieces.next().is_some() || time.len() != 8 || rest.len() != 24 {
            return None;
        }
        TraceContext::checked(format!("{time}{rest}"), parent?.to_string(), sampled)
    }

    /// Reads a W3C `traceparent` (`00-{32 hex}-{16 hex}-{2 hex flags}`). A later version
    /// is read as version 00 reads it, as the recommendation asks.
    pub fn from_traceparent(value: &str) -> Option<TraceContext> {
        let mut pieces = value.trim().split('-');
        let (version, trace_id, parent_id, flags) = (
            pieces.next()?,
            pieces.next()?,
            pieces.next()?,
            pieces.next()?,
        );
        // Lowercase hex only, as the recommendation writes every field; version ff is
        // invalid.
        let lower_hex = |field: &str| {
            field
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        if version.len() != 2 || version == "ff" || !lower_hex(version) {
            return None;
        }
        if version == "00" && pieces.next().is_some() {
            return None;
        }
        let fields_hex = lower_hex(flags) && lower_hex(trace_id) && lower_hex(parent_id);
        if flags.len() != 2 || !fields_hex {
            return None;
        }
        let flags = u8::from_str_radix(flags, 16).ok()?;
        TraceContext::checked(trace_id.to_string(), parent_id.to_string(), flags & 1 == 1)
    }

    /// Returns the context `item` carries: its `traceparent` message attribute, else its
    /// `AWSTraceHeader` system attribute. `None` when neither is there or valid.
    pub fn of(item: &WorkItem) -> Option<TraceContext> {
        TraceContext::carried(&item.message_attributes, &item.attributes)
    }

    /// Returns the context a dead-lettered item's record kept ([`crate::dead_letter::SourceContext::trace_header`]).
    pub fn of_dead(record: &crate::dead_letter::DeadLetteredItem) -> Option<TraceContext> {
        record
            .source
            .trace_header
            .as_deref()
            .and_then(TraceContext::from_xray)
    }

    /// Returns the context a record carries, as [`TraceContext::of`] reads it from an item.
    pub fn of_record(record: &SqsRecord<'_>) -> Option<TraceContext> {
        TraceContext::carried(&record.message_attributes, &record.attributes)
    }

    fn carried(
        message_attributes: &HashMap<String, SqsMessageAttribute>,
        attributes: &Attributes,
    ) -> Option<TraceContext> {
        let traceparent = message_attributes
            .get(TRACEPARENT)
            .and_then(|a| a.string_value.as_deref())
            .and_then(TraceContext::from_traceparent);
        traceparent.or_else(|| {
            attributes
                .get(AWS_TRACE_HEADER)
                .and_then(TraceContext::from_xray)
        })
    }

    /// Returns the span the record `msg` runs in: its trace's ([`TraceContext::span`]) when it
    /// carries one, else none. With tracing off (no subscriber in the process), the trace
    /// is not even read: a traced record then costs what an untraced one does (`make
    /// bench`, "traced ÷ untraced"). The trace still reaches the downstream and the
    /// record, which read it from the item. With any subscriber, the span's own callsite
    /// decides: the library's log filter lets it through at every level, so that a
    /// warning of a traced record names its trace.
    pub fn record_span(msg: &SqsRecord<'_>) -> tracing::Span {
        if tracing::level_filters::LevelFilter::current()
            == tracing::level_filters::LevelFilter::OFF
        {
            return tracing::Span::none();
        }
        TraceContext::of_record(msg).map_or_else(tracing::Span::none, |trace| trace.span())
    }

    /// Returns the span a record carrying this context runs in ([`RECORD_SPAN`]). The hook set by
    /// [`on_record_span`], if any, is called with it: an OpenTelemetry integration makes it
    /// a child of the producer's span there.
    pub fn span(&self) -> tracing::Span {
        let span = tracing::info_span!(
            "record",
            trace_id = %self.xray_trace_id(),
            traceparent = %self.traceparent()
        );
        if let Some(hook) = RECORD_SPAN_HOOK.get() {
            hook(self, &span);
        }
        span
    }

    /// Returns the W3C `traceparent` header value.
    pub fn traceparent(&self) -> String {
        let flags = if self.sampled { "01" } else { "00" };
        format!("00-{}-{}-{flags}", self.trace_id, self.parent_id)
    }

    /// Returns the X-Ray trace header (`X-Amzn-Trace-Id`).
    pub fn xray_header(&self) -> String {
        let sampled = if self.sampled { 1 } else { 0 };
        format!(
            "Root={};Parent={};Sampled={sampled}",
            self.xray_trace_id(),
            self.parent_id
        )
    }

    /// Returns the trace id as X-Ray writes it (`1-{8 hex}-{24 hex}`), as the console searches it.
    pub fn xray_trace_id(&self) -> String {
        let (time, rest) = self.trace_id.split_at(8);
        format!("1-{time}-{rest}")
    }

    fn checked(trace_id: String, parent_id: String, sampled: bool) -> Option<TraceContext> {
        let valid =
            |id: &str, len: usize| id.len() == len && is_hex(id) && id.bytes().any(|b| b != b'0');
        (valid(&trace_id, 32) && valid(&parent_id, 16)).then(|| TraceContext {
            trace_id: trace_id.to_ascii_lowercase(),
            parent_id: parent_id.to_ascii_lowercase(),
            sampled,
        })
    }
}

fn is_hex(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_xray_header_reads_in_any_order_and_converts_both_ways() {
        let trace = TraceContext::from_xray(
            "Sampled=0;Parent=53995C3F42CD8AD8;Root=1-5759e988-bd862e3fe1be46a994272793;Lineage=a:1",
        )
        .unwrap();
        assert_eq!(trace.trace_id, "5759e988bd862e3fe1be46a994272793");
        assert_eq!(trace.parent_id, "53995c3f42cd8ad8");
        assert!(!trace.sampled);
        assert_eq!(trace.xray_trace_id(), "1-5759e988-bd862e3fe1be46a994272793");
        assert_eq!(
            trace.traceparent(),
            "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-00"
        );
    }

    #[test]
    fn a_context_without_a_parent_or_with_a_bad_id_is_none() {
        for header in [
            "Root=1-5759e988-bd862e3fe1be46a994272793",
            "Root=1-5759e988-bd862e3fe1be46a99427279;Parent=53995c3f42cd8ad8",
            "Root=2-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",
            "Root=1-5759e988-bd862e3fe1be46a99427279x;Parent=53995c3f42cd8ad8",
            "Root=1-00000000-000000000000000000000000;Parent=53995c3f42cd8ad8",
            "",
        ] {
            assert_eq!(TraceContext::from_xray(header), None, "{header}");
        }
        for value in [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-+1",
            "FF-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::from_traceparent(value), None, "{value}");
        }
    }

    #[test]
    fn a_later_traceparent_version_is_read_as_version_00() {
        let trace = TraceContext::from_traceparent(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-more",
        )
        .unwrap();
        assert!(trace.sampled);
        assert_eq!(trace.parent_id, "00f067aa0ba902b7");
    }

    #[test]
    fn the_record_span_is_named_as_the_log_filter_lets_it_pass() {
        let trace = TraceContext::from_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .unwrap();
        let span = trace.span();
        assert!(span.metadata().is_none_or(|m| m.name() == RECORD_SPAN));
    }

    #[test]
    fn a_records_traceparent_comes_before_its_xray_header() {
        let mut item = WorkItem::new("m", "{}");
        assert_eq!(TraceContext::of(&item), None);
        item.attributes.insert(
            AWS_TRACE_HEADER,
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
        );
        let from_xray = TraceContext::of(&item).unwrap();
        assert_eq!(from_xray.trace_id, "5759e988bd862e3fe1be46a994272793");
        let mut attribute = SqsMessageAttribute::default();
        attribute.string_value =
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_string());
        item.message_attributes
            .insert(TRACEPARENT.to_string(), attribute);
        let from_w3c = TraceContext::of(&item).unwrap();
        assert_eq!(from_w3c.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    }
}
