use super::record::clip;
use super::*;

/// Stored names: a change of spelling would orphan every existing record.
#[test]
fn message_attributes_are_typed_by_their_value_and_stored_as_sqs_shapes_them() {
    let cases = [
        (
            serde_json::json!({"data_type": "Number.int", "string_value": "42"}),
            MessageAttribute::Number {
                data_type: "Number.int".into(),
                value: "42".into(),
            },
        ),
        (
            serde_json::json!({"data_type": "String", "string_value": "acme"}),
            MessageAttribute::string("acme"),
        ),
        (
            serde_json::json!({"data_type": "Binary.gz", "binary_value": "AAEC"}),
            MessageAttribute::Binary {
                data_type: "Binary.gz".into(),
                base64: "AAEC".into(),
            },
        ),
    ];
    for (stored, typed) in cases {
        let read: MessageAttribute = serde_json::from_value(stored.clone()).unwrap();
        assert_eq!(read, typed);
        assert!(read.is_restorable());
        assert_eq!(
            serde_json::to_value(&read).unwrap(),
            stored,
            "stored shape unchanged"
        );
    }
    // Records written before types were kept: a plain string, or a binary's marker.
    let legacy: MessageAttribute = serde_json::from_value(serde_json::json!("<Binary>")).unwrap();
    assert_eq!(
        legacy,
        MessageAttribute::Unkept {
            data_type: "Binary".into()
        }
    );
    assert!(!legacy.is_restorable());
    assert_eq!(
        serde_json::to_value(&legacy).unwrap(),
        serde_json::json!({"data_type": "Binary"})
    );
    let legacy: MessageAttribute = serde_json::from_value(serde_json::json!("acme")).unwrap();
    assert_eq!(legacy, MessageAttribute::string("acme"));
}

#[test]
fn status_and_reason_names_agree_across_serde_strum_and_clap() {
    let names: Vec<&str> = ItemStatus::ALL.iter().map(|s| s.as_str()).collect();
    assert_eq!(names, ["dead", "redriving", "requeued", "resolved"]);
    for status in ItemStatus::ALL {
        let name = status.as_str();
        assert_eq!(serde_json::to_value(status).unwrap(), name);
        assert_eq!(status.to_string(), name);
        assert_eq!(ItemStatus::parse(name), Some(status));
        #[cfg(feature = "clap")]
        assert_eq!(
            clap::ValueEnum::to_possible_value(&status)
                .unwrap()
                .get_name(),
            name
        );
    }
    assert_eq!(ItemStatus::parse("Dead"), None);
    assert_eq!(ItemStatus::parse("any"), None);
    for reason in [
        DeadLetterReason::Permanent,
        DeadLetterReason::ReceiveBudgetExhausted,
        DeadLetterReason::ExceededMaxReceiveCount,
    ] {
        assert_eq!(serde_json::to_value(reason).unwrap(), reason.as_str());
        assert_eq!(reason.to_string(), reason.as_str());
    }
    assert_eq!(
        DeadLetterReason::ReceiveBudgetExhausted.as_str(),
        "receive_budget_exhausted"
    );
}

#[test]
fn compact_history_keeps_the_first_and_the_latest_attempts() {
    let c = candidate(ErrorClass::Throttled, 60, DeadLetterReason::Permanent);
    let history = DeadLetteredItem::from_candidate(
        &c,
        &InvocationInfo::default(),
        Utc::now(),
        Duration::from_secs(60),
    )
    .failure_history;
    let numbers = |h: &[FailureDetail]| h.iter().map(|f| f.attempt_number).collect::<Vec<_>>();

    let (kept, dropped) = compact_history(history.clone(), 60);
    assert_eq!(
        (kept.len(), dropped),
        (60, 0),
        "within the limit: unchanged"
    );

    let (kept, dropped) = compact_history(history.clone(), HISTORY_LIMIT);
    assert_eq!(dropped, 60 - HISTORY_LIMIT);
    let expected: Vec<u32> = (1..=10).chain(21..=60).collect();
    assert_eq!(numbers(&kept), expected);

    let (kept, dropped) = compact_history(history, 4);
    assert_eq!((numbers(&kept), dropped), (vec![1, 2, 59, 60], 56));
}

#[test]
fn clip_keeps_short_text_and_cuts_long_text_on_a_character_boundary() {
    assert_eq!(clip("short", 10), "short");
    assert_eq!(clip("exactly10!", 10), "exactly10!");
    for max in [40, 41, 42, 43, 100] {
        let long = "é".repeat(200); // two bytes each
        let cut = clip(&long, max);
        assert!(cut.len() <= max, "{max}: {} bytes", cut.len());
        assert!(cut.starts_with('é'));
        let omitted = long.len() - cut.split(" [").next().unwrap().len();
        assert!(
            cut.ends_with(&format!(" [… {omitted} bytes omitted]")),
            "{cut}"
        );
    }
}
use crate::item::ItemParser;

fn candidate(class: ErrorClass, attempts: u32, reason: DeadLetterReason) -> DeadLetterCandidate {
    let msg = serde_json::from_value(serde_json::json!({
        "messageId": "m-1",
        "body": "{\"id\":\"i-1\"}",
        "attributes": {"ApproximateReceiveCount": "3", "SentTimestamp": "1700000000000", "MessageGroupId": "g"},
        "messageAttributes": {"tenant": {"stringValue": "acme", "dataType": "String"}},
        "eventSourceARN": "arn:aws:sqs:us-east-1:1:q"
    }))
    .unwrap();
    let item = ItemParser::default().parse("m-1".into(), msg).unwrap();
    let start = DateTime::<Utc>::from_timestamp(1_700_000_100, 0).unwrap();
    let failures = (1..=attempts)
        .map(|n| AttemptFailure {
            attempt: n,
            started_at: start + chrono::Duration::seconds(i64::from(n)),
            duration: Duration::from_millis(25),
            error: ProcessError::new(class, format!("timeout after {n}s")).with_step("deliver"),
        })
        .collect();
    DeadLetterCandidate {
        item,
        error: ProcessError::new(class, format!("timeout after {attempts}s")),
        failures,
        reason,
    }
}

#[test]
fn record_from_candidate() {
    let invocation = InvocationInfo {
        function_name: Some("worker".into()),
        request_id: Some("req-1".into()),
        log_group: Some("/aws/lambda/worker".into()),
        log_stream: Some("2026/11/21/[$LATEST]abc".into()),
    };
    let now = DateTime::<Utc>::from_timestamp(1_700_000_200, 0).unwrap();
    let c = candidate(
        ErrorClass::Timeout,
        3,
        DeadLetterReason::ReceiveBudgetExhausted,
    );
    let record =
        DeadLetteredItem::from_candidate(&c, &invocation, now, Duration::from_secs(86_400));
    assert_eq!(record.item_id, "m-1");
    assert_eq!(record.failure_count, 3);
    assert_eq!(record.failure_history.len(), 3);
    assert_eq!(record.first_attempt.timestamp(), 1_700_000_101);
    assert_eq!(record.last_attempt.timestamp(), 1_700_000_103);
    assert_eq!(record.failure_history[1].attempt_id, "m-1:3:2");
    assert_eq!(
        record.failure_history[0].request_id.as_deref(),
        Some("req-1")
    );
    assert_eq!(
        record.failure_history[0].log_group.as_deref(),
        Some("/aws/lambda/worker")
    );
    assert_eq!(record.failure_history[0].duration_ms, 25);
    assert_eq!(record.failure_history[0].step.as_deref(), Some("deliver"));
    assert_eq!(record.expires_at, 1_700_000_200 + 86_400);
    assert_eq!(record.status, ItemStatus::Dead);
    assert!(record.reprocess_eligible);
    assert!(!record.manual_review_required);
    assert_eq!(record.source.message_group_id.as_deref(), Some("g"));
    assert_eq!(record.source.receive_count, 3);
    assert_eq!(
        record.source.message_attributes["tenant"].string_value(),
        Some("acme")
    );
    assert_eq!(record.payload.size_bytes, 12);
    assert_eq!(
        record.payload.sha256,
        crate::hex::sha256_hex(b"{\"id\":\"i-1\"}")
    );
    // Signatures group "timeout after 3s" with "timeout after 29s".
    assert_eq!(
        record.error_signature,
        crate::signature::error_signature(ErrorClass::Timeout, "timeout after 29s")
    );
    // The record serialises with the payload flattened and the class by name.
    let json = serde_json::to_value(&record).unwrap();
    assert_eq!(json["payload"]["storage"], "inline");
    assert_eq!(json["error_class"], "timeout");
    let back: DeadLetteredItem = serde_json::from_value(json).unwrap();
    assert_eq!(back, record);
}

#[test]
fn a_response_excerpt_is_kept_clipped_and_apart_from_the_message() {
    let mut plain = candidate(ErrorClass::Validation, 1, DeadLetterReason::Permanent);
    let mut with_excerpt = plain.clone();
    let excerpt = format!("amount must be positive: {}", "x".repeat(2_000));
    with_excerpt.failures[0].error = with_excerpt.failures[0]
        .error
        .clone()
        .with_detail(excerpt.clone());
    with_excerpt.error = with_excerpt.error.clone().with_detail(excerpt.clone());
    plain.failures[0].error.detail = None;
    let at = Utc::now();
    let info = InvocationInfo::default();
    let day = Duration::from_secs(86_400);
    let a = DeadLetteredItem::from_candidate(&plain, &info, at, day);
    let b = DeadLetteredItem::from_candidate(&with_excerpt, &info, at, day);
    let kept = b.failure_history[0].response_excerpt.as_deref().unwrap();
    assert!(kept.starts_with("amount must be positive: xxx"), "{kept}");
    assert!(kept.len() <= RESPONSE_EXCERPT_LIMIT, "{}", kept.len());
    assert!(kept.ends_with("bytes omitted]"), "{kept}");
    assert_eq!(a.failure_history[0].response_excerpt, None);
    // Neither the message, the latest error nor the signature depend on it.
    assert_eq!(a.error_signature, b.error_signature);
    assert_eq!(a.last_error, b.last_error);
    assert_eq!(
        a.failure_history[0].error_message,
        b.failure_history[0].error_message
    );
    assert!(!b.last_error.contains("amount"));
    assert!(!with_excerpt.error.to_string().contains("amount"));
    // Serialised only when present; older records without it still read.
    let json = serde_json::to_value(&a.failure_history[0]).unwrap();
    assert!(json.get("response_excerpt").is_none(), "{json}");
    let json = serde_json::to_value(&b.failure_history[0]).unwrap();
    assert_eq!(json["response_excerpt"], kept);
    let back: FailureDetail = serde_json::from_value(json).unwrap();
    assert_eq!(back, b.failure_history[0]);
}

#[test]
fn eligibility_and_review_rules() {
    let now = Utc::now();
    let day = Duration::from_secs(86_400);
    let info = InvocationInfo::default();
    let permission = DeadLetteredItem::from_candidate(
        &candidate(ErrorClass::Permission, 1, DeadLetterReason::Permanent),
        &info,
        now,
        day,
    );
    assert!(!permission.reprocess_eligible);
    assert!(permission.manual_review_required);
    let validation_once = DeadLetteredItem::from_candidate(
        &candidate(ErrorClass::Validation, 1, DeadLetterReason::Permanent),
        &info,
        now,
        day,
    );
    assert!(!validation_once.reprocess_eligible);
    assert!(!validation_once.manual_review_required);
    assert!(needs_manual_review(
        &[
            validation_once.failure_history.clone(),
            validation_once.failure_history.clone()
        ]
        .concat()
    ));
    for class in [
        ErrorClass::Unknown,
        ErrorClass::Throttled,
        ErrorClass::ServerError,
        ErrorClass::Connection,
    ] {
        let r = DeadLetteredItem::from_candidate(
            &candidate(class, 1, DeadLetterReason::ReceiveBudgetExhausted),
            &info,
            now,
            day,
        );
        assert!(r.reprocess_eligible, "{class}");
    }
    let not_found = DeadLetteredItem::from_candidate(
        &candidate(ErrorClass::NotFound, 1, DeadLetterReason::Permanent),
        &info,
        now,
        day,
    );
    assert!(!not_found.reprocess_eligible);
}

/// A dead-lettered record keeps the producer's trace, from a `traceparent` attribute or the
/// `AWSTraceHeader`, as an X-Ray header; without one it keeps none.
#[test]
fn a_record_keeps_its_producers_trace() {
    let now = DateTime::<Utc>::from_timestamp(1_700_000_200, 0).unwrap();
    let retention = Duration::from_secs(86_400);
    let header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
    let mut c = candidate(ErrorClass::Timeout, 1, DeadLetterReason::Permanent);
    let untraced = DeadLetteredItem::from_candidate(&c, &InvocationInfo::default(), now, retention);
    assert_eq!(untraced.source.trace_header, None);
    c.item
        .attributes
        .insert(crate::trace::AWS_TRACE_HEADER, header);
    let traced = DeadLetteredItem::from_candidate(&c, &InvocationInfo::default(), now, retention);
    assert_eq!(traced.source.trace_header.as_deref(), Some(header));
    let trace = crate::trace::TraceContext::of_dead(&traced).unwrap();
    assert_eq!(trace.trace_id, "5759e988bd862e3fe1be46a994272793");
}
