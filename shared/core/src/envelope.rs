//! Envelopes of cloud event pipelines: SNS notifications, EventBridge events and S3 event
//! notifications that reach the queue wrapped around the payload a handler wants.
//!
//! `WORKER_ENVELOPE` names the layers around a body, outermost first (`sns`,
//! `eventbridge`, `s3`, joined by `+` when one wraps another, as in `sns+s3` for S3 → SNS →
//! SQS). Each layer is checked and unwrapped in turn; a body that does not have the shape
//! of its envelope is a validation failure of that record alone (dead-lettered on first
//! sight, docs/ARCHITECTURE.md §1.3), never of the batch. The record keeps the body as it
//! arrived, so a redrive or a requeue sends the envelope again, and the worker unwraps it
//! again.
//!
//! What a layer gives besides the payload: an id that belongs to the event (SNS
//! `MessageId`, EventBridge `id`, an S3 object and its `sequencer`), used as the item id
//! unless `WORKER_ITEM_ID_SOURCE` says otherwise, and its metadata ([`Layer`]) for routing.
//! Service notices that carry no payload (an SNS subscription confirmation, S3's test
//! event) are skipped, with a warning for the one that needs a human.
//!
//! SNS with raw message delivery on puts the message itself in the body (and the SNS
//! message attributes in the SQS message attributes): there is no envelope, so it is
//! spelt `sns-raw` and unwraps nothing.
//!
//! The shapes are read with small serde structs of the fields used here rather than the
//! `aws_lambda_events` types: those model Lambda's own SNS/S3 triggers, whose field names
//! differ from the notifications delivered to SQS (`SigningCertURL`, raw `detail`), and a
//! handler crate should not pull their features in.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::error::ProcessError;

/// One envelope layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Envelope {
    /// An SNS notification delivered to SQS with raw message delivery off: the payload is
    /// its `Message`.
    Sns,
    /// SNS with raw message delivery on: the body is the message; nothing to unwrap.
    SnsRaw,
    /// An EventBridge event (a rule targeting the queue): the payload is its `detail`.
    EventBridge,
    /// An S3 event notification: the payload is its one record.
    S3,
}

impl Envelope {
    /// Returns the name `WORKER_ENVELOPE` uses.
    pub fn name(self) -> &'static str {
        match self {
            Envelope::Sns => "sns",
            Envelope::SnsRaw => "sns-raw",
            Envelope::EventBridge => "eventbridge",
            Envelope::S3 => "s3",
        }
    }
}

impl fmt::Display for Envelope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The layers around a body, outermost first; empty for none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Envelopes(pub Vec<Envelope>);

impl Envelopes {
    /// Tells whether there is anything to unwrap.
    pub fn is_none(&self) -> bool {
        self.0.iter().all(|e| *e == Envelope::SnsRaw)
    }

    /// Unwraps `body` layer by layer. The innermost layer that has an id gives the event
    /// id; a service notice stops the unwrapping (there is no payload behind it).
    pub fn unwrap(&self, body: &str) -> Result<Unwrapped, ProcessError> {
        let mut payload: Cow<'_, str> = Cow::Borrowed(body);
        let mut layers = Vec::with_capacity(self.0.len());
        for envelope in &self.0 {
            let opened = open(*envelope, &payload).map_err(|e| {
                ProcessError::validation(format!("the body is not {} ({e})", describe(*envelope)))
                    .with_step("envelope")
            })?;
            match opened {
                Opened::Payload {
                    payload: inner,
                    layer,
                } => {
                    layers.extend(layer);
                    payload = Cow::Owned(inner);
                }
                Opened::Notice { layer, notice } => {
                    layers.push(layer);
                    return Ok(Unwrapped {
                        payload: payload.into_owned(),
                        layers,
                        notice: Some(notice),
                    });
                }
            }
        }
        Ok(Unwrapped {
            payload: payload.into_owned(),
            layers,
            notice: None,
        })
    }
}

impl fmt::Display for Envelopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let names: Vec<&str> = self.0.iter().map(|e| e.name()).collect();
        f.write_str(&names.join("+"))
    }
}

impl FromStr for Envelopes {
    type Err = String;

    /// Parses `none`, or layer names joined by `+`, outermost first.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "none" {
            return Ok(Envelopes::default());
        }
        let layers = s
            .split('+')
            .map(|name| match name.trim() {
                "sns" => Ok(Envelope::Sns),
                "sns-raw" => Ok(Envelope::SnsRaw),
                "eventbridge" => Ok(Envelope::EventBridge),
                "s3" => Ok(Envelope::S3),
                other => Err(format!(
                    "unknown envelope {other:?}; expected none, or sns, sns-raw, eventbridge, s3 \
                     joined by + outermost first (e.g. sns+s3)"
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Envelopes(layers))
    }
}

/// What unwrapping found: the payload, the layers' metadata, and whether the body was a
/// service notice with no payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unwrapped {
    /// The innermost payload (the body itself when a notice stopped the unwrapping).
    pub payload: String,
    /// Each unwrapped layer's metadata, outermost first.
    pub layers: Vec<Layer>,
    /// Set when the body is a service notice (an SNS subscription confirmation, S3's test
    /// event): the item is skipped with this reason instead of processed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
}

impl Unwrapped {
    /// Returns the event id of the innermost layer that has one.
    pub fn event_id(&self) -> Option<String> {
        self.layers.iter().rev().find_map(Layer::event_id)
    }
}

/// The metadata of one unwrapped layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "envelope", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Layer {
    /// An SNS notification.
    Sns {
        /// `MessageId`: the same on SNS's own redeliveries.
        message_id: String,
        /// `TopicArn`.
        topic_arn: String,
        /// `Subject`, when the publisher set one.
        #[serde(skip_serializing_if = "Option::is_none")]
        subject: Option<String>,
        /// `Type`: `Notification`, or a notice type.
        kind: String,
    },
    /// An EventBridge event.
    EventBridge {
        /// `id`: unique per event.
        id: String,
        /// `source`, e.g. `aws.s3` or `com.example.orders`.
        source: String,
        /// `detail-type`, e.g. `Object Created`.
        detail_type: String,
        /// `time`, as sent.
        #[serde(skip_serializing_if = "Option::is_none")]
        time: Option<String>,
    },
    /// An S3 event notification record.
    S3 {
        /// `eventName`, e.g. `ObjectCreated:Put`.
        event_name: String,
        /// The bucket.
        bucket: String,
        /// The object key, URL-decoded (S3 sends it form-encoded).
        key: String,
        /// The object size, when the event has one.
        #[serde(skip_serializing_if = "Option::is_none")]
        size: Option<u64>,
        /// `sequencer`: orders events of one key.
        #[serde(skip_serializing_if = "Option::is_none")]
        sequencer: Option<String>,
        /// `versionId` on versioned buckets.
        #[serde(skip_serializing_if = "Option::is_none")]
        version_id: Option<String>,
    },
    /// S3's test event (sent when notifications are configured).
    S3Test {
        /// The bucket.
        bucket: String,
    },
}

impl Layer {
    /// Returns the id that belongs to the event of this layer, if it has one.
    pub fn event_id(&self) -> Option<String> {
        match self {
            Layer::Sns { message_id, .. } if !message_id.is_empty() => Some(message_id.clone()),
            Layer::EventBridge { id, .. } if !id.is_empty() => Some(id.clone()),
            Layer::S3 {
                bucket,
                key,
                sequencer,
                version_id,
                ..
            } => {
                let mut id = format!("s3://{bucket}/{key}");
                if let Some(version) = version_id {
                    id.push_str("?versionId=");
                    id.push_str(version);
                }
                if let Some(sequencer) = sequencer {
                    id.push('#');
                    id.push_str(sequencer);
                }
                Some(id)
            }
            _ => None,
        }
    }
}

fn describe(envelope: Envelope) -> &'static str {
    match envelope {
        Envelope::Sns => "an SNS notification (WORKER_ENVELOPE sns: raw message delivery off)",
        Envelope::SnsRaw => "an SNS raw message",
        Envelope::EventBridge => "an EventBridge event (WORKER_ENVELOPE eventbridge)",
        Envelope::S3 => "an S3 event notification (WORKER_ENVELOPE s3)",
    }
}

enum Opened {
    Payload {
        payload: String,
        layer: Option<Layer>,
    },
    Notice {
        layer: Layer,
        notice: String,
    },
}

fn open(envelope: Envelope, body: &str) -> Result<Opened, String> {
    match envelope {
        Envelope::SnsRaw => Ok(Opened::Payload {
            payload: body.to_string(),
            layer: None,
        }),
        Envelope::Sns => open_sns(body),
        Envelope::EventBridge => open_eventbridge(body),
        Envelope::S3 => open_s3(body),
    }
}

/// The fields of an SNS notification (or notice) as SNS delivers it to SQS.
#[derive(Deserialize)]
struct SnsNotification<'a> {
    #[serde(rename = "Type")]
    kind: Cow<'a, str>,
    #[serde(rename = "MessageId")]
    message_id: Cow<'a, str>,
    #[serde(rename = "TopicArn")]
    topic_arn: Cow<'a, str>,
    #[serde(rename = "Subject", default)]
    subject: Option<Cow<'a, str>>,
    #[serde(rename = "Message")]
    message: Cow<'a, str>,
}

fn open_sns(body: &str) -> Result<Opened, String> {
    let n: SnsNotification<'_> = serde_json::from_str(body).map_err(|e| e.to_string())?;
    let layer = Layer::Sns {
        message_id: n.message_id.into_owned(),
        topic_arn: n.topic_arn.into_owned(),
        subject: n.subject.map(Cow::into_owned),
        kind: n.kind.to_string(),
    };
    match n.kind.as_ref() {
        "Notification" => Ok(Opened::Payload {
            payload: n.message.into_owned(),
            layer: Some(layer),
        }),
        "SubscriptionConfirmation" | "UnsubscribeConfirmation" => {
            let notice = format!(
                "SNS {} for {}: no payload (a subscription is confirmed by its SubscribeURL, \
                 or by subscribing the queue from the topic's account)",
                n.kind,
                match &layer {
                    Layer::Sns { topic_arn, .. } => topic_arn.as_str(),
                    _ => "",
                }
            );
            Ok(Opened::Notice { layer, notice })
        }
        other => Err(format!(
            "Type is {other:?}; expected Notification, SubscriptionConfirmation or UnsubscribeConfirmation"
        )),
    }
}

/// The fields of an EventBridge event used here.
#[derive(Deserialize)]
struct EventBridgeEvent<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(borrow)]
    source: Cow<'a, str>,
    #[serde(rename = "detail-type", borrow)]
    detail_type: Cow<'a, str>,
    #[serde(default, borrow)]
    time: Option<Cow<'a, str>>,
    #[serde(borrow)]
    detail: &'a RawValue,
}

fn open_eventbridge(body: &str) -> Result<Opened, String> {
    let event: EventBridgeEvent<'_> = serde_json::from_str(body).map_err(|e| e.to_string())?;
    if event.id.is_empty() {
        return Err("its id is empty".to_string());
    }
    Ok(Opened::Payload {
        payload: event.detail.get().to_string(),
        layer: Some(Layer::EventBridge {
            id: event.id.into_owned(),
            source: event.source.into_owned(),
            detail_type: event.detail_type.into_owned(),
            time: event.time.map(Cow::into_owned),
        }),
    })
}

/// An S3 event notification: records, or the test event S3 sends when notifications are
/// configured. One struct with optional fields rather than an untagged enum: an untagged
/// enum buffers its input, and a `RawValue` cannot be read from a buffer.
#[derive(Deserialize)]
struct S3Notification<'a> {
    #[serde(rename = "Records", default, borrow)]
    records: Option<Vec<&'a RawValue>>,
    #[serde(rename = "Event", default, borrow)]
    event: Option<Cow<'a, str>>,
    #[serde(rename = "Bucket", default, borrow)]
    bucket: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct S3Record<'a> {
    #[serde(rename = "eventSource", borrow)]
    event_source: Cow<'a, str>,
    #[serde(rename = "eventName", borrow)]
    event_name: Cow<'a, str>,
    #[serde(borrow)]
    s3: S3Entity<'a>,
}

#[derive(Deserialize)]
struct S3Entity<'a> {
    #[serde(borrow)]
    bucket: S3Bucket<'a>,
    #[serde(borrow)]
    object: S3Object<'a>,
}

#[derive(Deserialize)]
struct S3Bucket<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
}

#[derive(Deserialize)]
struct S3Object<'a> {
    #[serde(borrow)]
    key: Cow<'a, str>,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default, borrow)]
    sequencer: Option<Cow<'a, str>>,
    #[serde(rename = "versionId", default, borrow)]
    version_id: Option<Cow<'a, str>>,
}

fn open_s3(body: &str) -> Result<Opened, String> {
    let notification: S3Notification<'_> = serde_json::from_str(body).map_err(|e| e.to_string())?;
    let records = match notification {
        S3Notification {
            records: Some(records),
            ..
        } => records,
        S3Notification {
            event: Some(event),
            bucket,
            ..
        } => {
            if event != "s3:TestEvent" {
                return Err(format!(
                    "Event is {event:?}; expected Records or s3:TestEvent"
                ));
            }
            let bucket = bucket.map(Cow::into_owned).unwrap_or_default();
            return Ok(Opened::Notice {
                notice: format!("S3 test event for bucket {bucket:?}: no payload"),
                layer: Layer::S3Test { bucket },
            });
        }
        _ => return Err("it has neither Records nor Event".to_string()),
    };
    // S3 puts one record in each notification; a body with several is not one of its.
    let [record] = records.as_slice() else {
        return Err(format!(
            "it holds {} records; S3 sends one per notification",
            records.len()
        ));
    };
    let parsed: S3Record<'_> = serde_json::from_str(record.get()).map_err(|e| e.to_string())?;
    if parsed.event_source != "aws:s3" {
        return Err(format!(
            "eventSource is {:?}; expected aws:s3",
            parsed.event_source
        ));
    }
    Ok(Opened::Payload {
        payload: record.get().to_string(),
        layer: Some(Layer::S3 {
            event_name: parsed.event_name.into_owned(),
            bucket: parsed.s3.bucket.name.into_owned(),
            key: decode_s3_key(&parsed.s3.object.key),
            size: parsed.s3.object.size,
            sequencer: parsed.s3.object.sequencer.map(Cow::into_owned),
            version_id: parsed.s3.object.version_id.map(Cow::into_owned),
        }),
    })
}

/// Returns an S3 notification's object key as the object is named: S3 form-encodes it (`+` for a
/// space, `%XX` for other bytes). A malformed escape is kept as it is.
pub fn decode_s3_key(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(byte) => {
                        out.push(byte);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            byte => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn envelopes(s: &str) -> Envelopes {
        s.parse().unwrap()
    }

    fn sns(message: &str) -> String {
        json!({
            "Type": "Notification",
            "MessageId": "sns-1",
            "TopicArn": "arn:aws:sns:us-east-1:1:orders",
            "Subject": "hello",
            "Message": message,
            "Timestamp": "2026-11-24T10:00:00.000Z",
            "SignatureVersion": "1",
            "Signature": "x",
            "SigningCertURL": "https://sns/cert.pem",
            "UnsubscribeURL": "https://sns/unsub",
            "MessageAttributes": {"kind": {"Type": "String", "Value": "order"}}
        })
        .to_string()
    }

    fn eventbridge(detail: serde_json::Value) -> String {
        json!({
            "version": "0", "id": "eb-1", "detail-type": "Order Placed",
            "source": "com.example.orders", "account": "1", "time": "2026-11-24T10:00:00Z",
            "region": "us-east-1", "resources": [], "detail": detail
        })
        .to_string()
    }

    fn s3(key: &str) -> String {
        json!({"Records": [{
            "eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-east-1",
            "eventTime": "2026-11-24T10:00:00.000Z", "eventName": "ObjectCreated:Put",
            "s3": {"s3SchemaVersion": "1.0", "configurationId": "c",
                   "bucket": {"name": "inbox", "arn": "arn:aws:s3:::inbox"},
                   "object": {"key": key, "size": 42, "eTag": "e", "sequencer": "0055AED6DCD90281E5"}}
        }]})
        .to_string()
    }

    #[test]
    fn names_parse_and_print_back() {
        assert_eq!(envelopes("none"), Envelopes::default());
        assert_eq!(envelopes("sns+s3").0, vec![Envelope::Sns, Envelope::S3]);
        assert_eq!(envelopes("sns+eventbridge").to_string(), "sns+eventbridge");
        assert!("sqs".parse::<Envelopes>().is_err());
        assert!("sns+".parse::<Envelopes>().is_err());
        assert!(envelopes("sns-raw").is_none());
        assert!(!envelopes("sns").is_none());
    }

    #[test]
    fn sns_gives_the_message_and_its_id() {
        let out = envelopes("sns").unwrap(&sns(r#"{"order":7}"#)).unwrap();
        assert_eq!(out.payload, r#"{"order":7}"#);
        assert_eq!(out.event_id().as_deref(), Some("sns-1"));
        assert!(out.notice.is_none());
        assert!(
            matches!(&out.layers[0], Layer::Sns { topic_arn, subject: Some(s), .. }
            if topic_arn == "arn:aws:sns:us-east-1:1:orders" && s == "hello")
        );
    }

    #[test]
    fn a_body_that_is_not_its_envelope_is_a_validation_failure() {
        for (names, body) in [
            ("sns", r#"{"order":7}"#),
            ("sns", "plain text"),
            (
                "sns",
                r#"{"Type":"Weird","MessageId":"m","TopicArn":"t","Message":"x"}"#,
            ),
            ("eventbridge", r#"{"id":"1","source":"s"}"#),
            (
                "eventbridge",
                &eventbridge(json!({})).replace("\"eb-1\"", "\"\""),
            ),
            ("s3", r#"{"Records":[]}"#),
            (
                "s3",
                r#"{"Records":[{"eventSource":"aws:sqs","eventName":"x","s3":{}}]}"#,
            ),
            ("s3", r#"{"Event":"s3:Other"}"#),
            ("s3", "[1,2"),
            ("sns+s3", &sns("not json")),
        ] {
            let error = envelopes(names).unwrap(body).unwrap_err();
            assert_eq!(error.class, crate::ErrorClass::Validation, "{names} {body}");
            assert_eq!(error.step.as_deref(), Some("envelope"));
        }
        let two = s3("a").replace("}]}", "},{\"eventSource\":\"aws:s3\"}]}");
        let error = envelopes("s3").unwrap(&two).unwrap_err();
        assert!(
            error.message.contains("holds 2 records"),
            "{}",
            error.message
        );
    }

    #[test]
    fn eventbridge_gives_the_detail_as_sent() {
        let out = envelopes("eventbridge")
            .unwrap(&eventbridge(json!({"orderId": "o-1", "lines": [1, 2]})))
            .unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&out.payload).unwrap(),
            json!({"orderId": "o-1", "lines": [1, 2]})
        );
        assert_eq!(out.event_id().as_deref(), Some("eb-1"));
        assert!(
            matches!(&out.layers[0], Layer::EventBridge { source, detail_type, .. }
            if source == "com.example.orders" && detail_type == "Order Placed")
        );
    }

    #[test]
    fn s3_gives_the_record_with_a_decoded_key_and_an_object_id() {
        let out = envelopes("s3")
            .unwrap(&s3("reports/2026+Q4%2Fa%C3%A9.csv"))
            .unwrap();
        let Layer::S3 {
            key, bucket, size, ..
        } = &out.layers[0]
        else {
            panic!("{out:?}");
        };
        assert_eq!(key, "reports/2026 Q4/aé.csv");
        assert_eq!(bucket, "inbox");
        assert_eq!(*size, Some(42));
        assert_eq!(
            out.event_id().as_deref(),
            Some("s3://inbox/reports/2026 Q4/aé.csv#0055AED6DCD90281E5")
        );
        let record: serde_json::Value = serde_json::from_str(&out.payload).unwrap();
        assert_eq!(record["eventName"], "ObjectCreated:Put");
    }

    #[test]
    fn notices_are_not_payloads() {
        let test_event = json!({"Service": "Amazon S3", "Event": "s3:TestEvent",
            "Time": "2026-11-24T10:00:00.000Z", "Bucket": "inbox", "RequestId": "r", "HostId": "h"});
        let out = envelopes("s3").unwrap(&test_event.to_string()).unwrap();
        assert!(out.notice.as_deref().unwrap().contains("test event"));
        assert_eq!(out.event_id(), None);
        let confirmation = sns("").replace("\"Notification\"", "\"SubscriptionConfirmation\"");
        let out = envelopes("sns+s3").unwrap(&confirmation).unwrap();
        assert!(out
            .notice
            .as_deref()
            .unwrap()
            .contains("SubscriptionConfirmation"));
    }

    #[test]
    fn layers_compose_and_the_innermost_id_wins() {
        let out = envelopes("sns+s3").unwrap(&sns(&s3("k"))).unwrap();
        assert_eq!(out.layers.len(), 2);
        assert_eq!(
            out.event_id().as_deref(),
            Some("s3://inbox/k#0055AED6DCD90281E5")
        );
        let out = envelopes("sns+eventbridge")
            .unwrap(&sns(&eventbridge(json!("text detail"))))
            .unwrap();
        assert_eq!(out.payload, "\"text detail\"");
        assert_eq!(out.event_id().as_deref(), Some("eb-1"));
        let raw = envelopes("sns-raw").unwrap("anything at all").unwrap();
        assert_eq!(raw.payload, "anything at all");
        assert!(raw.layers.is_empty());
    }

    #[test]
    fn malformed_escapes_in_keys_are_kept() {
        assert_eq!(decode_s3_key("a%2"), "a%2");
        assert_eq!(decode_s3_key("a%zz+b"), "a%zz b");
        assert_eq!(decode_s3_key("%41%42"), "AB");
    }
}
