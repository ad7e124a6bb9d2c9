//! With tracing off (no subscriber anywhere in the process), a traced record runs in no
//! span: its trace is not even read. A test binary of its own, since a subscriber another
//! test installs, even on another thread, turns tracing on for the whole process.

#![allow(clippy::unwrap_used)] // tests fail loudly

use sqs_keeper_core::trace::{TraceContext, RECORD_SPAN};

const EVENT: &[u8] = br#"{"Records":[{"messageId":"m-1","body":"{}","attributes":{"AWSTraceHeader":"Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"}}]}"#;

#[test]
fn a_traced_record_runs_in_no_span_with_tracing_off_and_in_its_traces_with_a_subscriber() {
    let batch = sqs_keeper_core::event::decode_event(EVENT).unwrap();
    let record = &batch.records[0];
    assert!(TraceContext::record_span(record).is_none(), "tracing off");
    tracing::subscriber::with_default(tracing_subscriber::registry(), || {
        let span = TraceContext::record_span(record);
        assert_eq!(span.metadata().map(|m| m.name()), Some(RECORD_SPAN));
    });
}
