//! The ports of the core's `polling` over AWS: the worker's event source mapping through the
//! Lambda API (`GetEventSourceMapping`, `UpdateEventSourceMapping`), the pause marker as an
//! item of the breaker's table, and the probe that receives one source message and invokes
//! the worker with it (`ReceiveMessage`, `Invoke`, `DeleteMessage`) as the mapping would.

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
use futures::future::BoxFuture;
use serde_json::{json, Map, Value};

use sqs_keeper_core::{ErrorClass, ProcessError};
use std::time::{Duration, SystemTime};

use sqs_keeper_core::{
    polling::MappingSwitch, polling::PauseMarker, polling::PauseState, polling::ProbeOutcome,
    polling::SourceProbe, polling::SourceQueueState,
};

/// The worker's event source mapping, by its UUID.
#[derive(Debug, Clone)]
pub struct LambdaMapping {
    client: aws_sdk_lambda::Client,
    uuid: String,
}

impl LambdaMapping {
    /// Returns a handle on the mapping `uuid`, reached through `client`.
    pub fn new(client: aws_sdk_lambda::Client, uuid: impl Into<String>) -> Self {
        LambdaMapping {
            client,
            uuid: uuid.into(),
        }
    }
}

impl MappingSwitch for LambdaMapping {
    fn enabled(&self) -> BoxFuture<'_, Result<bool, ProcessError>> {
        Box::pin(async move {
            let mapping = self
                .client
                .get_event_source_mapping()
                .uuid(&self.uuid)
                .send()
                .await
                .map_err(|e| ProcessError::from_sdk(&e).with_step("polling"))?;
            // Disabled or on its way there; every other state (Enabled, Enabling, Creating,
            // Updating) polls or will.
            Ok(!matches!(mapping.state(), Some("Disabled" | "Disabling")))
        })
    }

    fn disabled_since(&self) -> BoxFuture<'_, Result<Option<SystemTime>, ProcessError>> {
        Box::pin(async move {
            let mapping = self
                .client
                .get_event_source_mapping()
                .uuid(&self.uuid)
                .send()
                .await
                .map_err(|e| ProcessError::from_sdk(&e).with_step("polling"))?;
            if !matches!(mapping.state(), Some("Disabled")) {
                return Ok(None);
            }
            // `LastModified`: the mapping's last change, its disabling when it is disabled.
            Ok(mapping
                .last_modified()
                .and_then(|at| SystemTime::try_from(*at).ok()))
        })
    }

    fn set_enabled(&self, enabled: bool) -> BoxFuture<'_, Result<(), ProcessError>> {
        Box::pin(async move {
            self.client
                .update_event_source_mapping()
                .uuid(&self.uuid)
                .enabled(enabled)
                .send()
                .await
                .map_err(|e| ProcessError::from_sdk(&e).with_step("polling"))?;
            Ok(())
        })
    }
}

/// The pause marker: an item `<breaker key>#polling` of the breaker's table, with no TTL
/// (an expired marker would leave the mapping disabled for good). Attributes: `paused`,
/// `sweeping`, `sweep_enabled` (booleans), `since_ms`, and the control's lease
/// `lease_until_ms`.
#[derive(Debug, Clone)]
pub struct DynamoPauseMarker {
    client: aws_sdk_dynamodb::Client,
    table: String,
    key: String,
}

impl DynamoPauseMarker {
    /// Returns a handle on the marker of the breaker `breaker_key` in `table`.
    pub fn new(
        client: aws_sdk_dynamodb::Client,
        table: impl Into<String>,
        breaker_key: &str,
    ) -> Self {
        DynamoPauseMarker {
            client,
            table: table.into(),
            key: format!("{breaker_key}#polling"),
        }
    }

    fn update(
        &self,
    ) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
        self.client
            .update_item()
            .table_name(&self.table)
            .key("id", AttributeValue::S(self.key.clone()))
    }
}

/// Returns an epoch-milliseconds attribute, as the breaker's item stores its times.
fn millis(at: SystemTime) -> AttributeValue {
    super::breaker_table::number(super::breaker_table::millis(at))
}

fn step(e: ProcessError) -> ProcessError {
    e.with_step("polling")
}

impl PauseMarker for DynamoPauseMarker {
    fn lease(
        &self,
        now: SystemTime,
        until: SystemTime,
    ) -> BoxFuture<'_, Result<bool, ProcessError>> {
        Box::pin(async move {
            let taken = self
                .update()
                .update_expression("SET lease_until_ms = :until")
                .condition_expression(
                    "attribute_not_exists(lease_until_ms) OR lease_until_ms <= :now",
                )
                .expression_attribute_values(":until", millis(until))
                .expression_attribute_values(":now", millis(now))
                .send()
                .await;
            match taken {
                Ok(_) => Ok(true),
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
                {
                    Ok(false)
                }
                Err(e) => Err(step(ProcessError::from_sdk(&e))),
            }
        })
    }

    fn release(&self, until: SystemTime) -> BoxFuture<'_, Result<(), ProcessError>> {
        Box::pin(async move {
            let released = self
                .update()
                .update_expression("REMOVE lease_until_ms")
                .condition_expression("lease_until_ms = :mine")
                .expression_attribute_values(":mine", millis(until))
                .send()
                .await;
            match released {
                // Taken over by another run since ours lapsed: it is theirs to give back.
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
                {
                    Ok(())
                }
                Err(e) => Err(step(ProcessError::from_sdk(&e))),
                Ok(_) => Ok(()),
            }
        })
    }

    fn read(&self) -> BoxFuture<'_, Result<PauseState, ProcessError>> {
        Box::pin(async move {
            let item = self
                .client
                .get_item()
                .table_name(&self.table)
                .key("id", AttributeValue::S(self.key.clone()))
                .consistent_read(true)
                .send()
                .await
                .map_err(|e| step(ProcessError::from_sdk(&e)))?;
            let item = item.item();
            let flag = |name: &str| {
                matches!(
                    item.and_then(|i| i.get(name)),
                    Some(AttributeValue::Bool(true))
                )
            };
            let since = item.and_then(|i| super::breaker_table::time_of(i, "since_ms"));
            Ok(PauseState {
                paused: flag("paused"),
                sweeping: flag("sweeping"),
                sweep_enabled: flag("sweep_enabled"),
                since,
            })
        })
    }

    fn write(&self, state: PauseState) -> BoxFuture<'_, Result<(), ProcessError>> {
        Box::pin(async move {
            let update = self
                .update()
                .expression_attribute_values(":p", AttributeValue::Bool(state.paused))
                .expression_attribute_values(":s", AttributeValue::Bool(state.sweeping))
                .expression_attribute_values(":e", AttributeValue::Bool(state.sweep_enabled));
            let update = match state.since {
                Some(since) => update
                    .update_expression(
                        "SET paused = :p, sweeping = :s, sweep_enabled = :e, since_ms = :since",
                    )
                    .expression_attribute_values(":since", millis(since)),
                None => update.update_expression(
                    "SET paused = :p, sweeping = :s, sweep_enabled = :e REMOVE since_ms",
                ),
            };
            update
                .send()
                .await
                .map_err(|e| step(ProcessError::from_sdk(&e)))?;
            Ok(())
        })
    }
}

/// The probe with one message of the source queue, run by invoking the worker.
#[derive(Debug, Clone)]
pub struct InvokeWorkerProbe {
    /// The source queue.
    pub sqs: aws_sdk_sqs::Client,
    /// Invokes the worker.
    pub lambda: aws_sdk_lambda::Client,
    /// The source queue's URL.
    pub queue_url: String,
    /// The worker's function name or ARN.
    pub function: String,
    /// The region the event names.
    pub region: String,
}

impl SourceProbe for InvokeWorkerProbe {
    fn queue(&self) -> BoxFuture<'_, Result<SourceQueueState, ProcessError>> {
        Box::pin(async move {
            use aws_sdk_sqs::types::QueueAttributeName;
            let output = self
                .sqs
                .get_queue_attributes()
                .queue_url(&self.queue_url)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
                .attribute_names(QueueAttributeName::MessageRetentionPeriod)
                .send()
                .await
                .map_err(|e| step(ProcessError::from_sdk(&e)))?;
            let number = |name: QueueAttributeName| {
                output
                    .attributes()
                    .and_then(|a| a.get(&name))
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or_else(|| {
                        step(ProcessError::new(
                            ErrorClass::Unknown,
                            format!("the source queue did not answer its {}", name.as_str()),
                        ))
                    })
            };
            Ok(SourceQueueState {
                visible: number(QueueAttributeName::ApproximateNumberOfMessages)?,
                retention: Duration::from_secs(number(QueueAttributeName::MessageRetentionPeriod)?),
            })
        })
    }

    fn probe(&self) -> BoxFuture<'_, Result<ProbeOutcome, ProcessError>> {
        Box::pin(async move {
            let step = |e: ProcessError| e.with_step("polling-probe");
            let received = self
                .sqs
                .receive_message()
                .queue_url(&self.queue_url)
                .max_number_of_messages(1)
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .message_attribute_names("All")
                .send()
                .await
                .map_err(|e| step(ProcessError::from_sdk(&e)))?;
            let Some(message) = received.messages().first() else {
                return Ok(ProbeOutcome::Empty);
            };
            let queue_arn = queue_arn_of_url(&self.queue_url, &self.region).ok_or_else(|| {
                step(ProcessError::validation(format!(
                    "{:?} is not an SQS queue URL",
                    self.queue_url
                )))
            })?;
            let event = lambda_event(std::slice::from_ref(message), &queue_arn, &self.region);
            let answer = self
                .lambda
                .invoke()
                .function_name(&self.function)
                .payload(aws_smithy_types::Blob::new(event.to_string()))
                .send()
                .await
                .map_err(|e| step(ProcessError::from_sdk(&e)))?;
            if answer.function_error().is_some() {
                // The worker failed as a whole: the message comes back after its visibility
                // timeout, as with the event source mapping.
                return Ok(ProbeOutcome::Returned);
            }
            let Some(response) = answer.payload().and_then(|p| {
                serde_json::from_slice::<aws_lambda_events::sqs::SqsBatchResponse>(p.as_ref()).ok()
            }) else {
                // An answer that is not a batch response says nothing was processed: the
                // message stays, as with the event source mapping.
                return Ok(ProbeOutcome::Returned);
            };
            let id = message.message_id().unwrap_or_default();
            if response
                .batch_item_failures
                .iter()
                .any(|f| f.item_identifier == id)
            {
                return Ok(ProbeOutcome::Returned);
            }
            self.sqs
                .delete_message()
                .queue_url(&self.queue_url)
                .receipt_handle(message.receipt_handle().unwrap_or_default())
                .send()
                .await
                .map_err(|e| {
                    step(ProcessError::new(
                        ErrorClass::Unknown,
                        format!(
                            "processed, but not deleted (it comes back and is skipped or redone): {}",
                            ProcessError::from_sdk(&e)
                        ),
                    ))
                })?;
            Ok(ProbeOutcome::Processed)
        })
    }
}

/// Returns the `arn:aws:sqs:<region>:<account>:<name>` of a queue URL
/// (`https://sqs.<region>.amazonaws.com/<account>/<name>`, or an emulator's
/// `http://host:port/<account>/<name>`).
pub fn queue_arn_of_url(url: &str, region: &str) -> Option<String> {
    let mut parts = url.trim_end_matches('/').rsplit('/');
    let name = parts.next().filter(|n| !n.is_empty())?;
    let account = parts
        .next()
        .filter(|a| a.chars().all(|c| c.is_ascii_digit()))?;
    let partition = if region.starts_with("cn-") {
        "aws-cn"
    } else if region.starts_with("us-gov-") {
        "aws-us-gov"
    } else {
        "aws"
    };
    Some(format!("arn:{partition}:sqs:{region}:{account}:{name}"))
}

/// Returns the Lambda event the SQS event source mapping builds for received `messages` of
/// `queue_arn` (the records' camel-case fields, attributes and message attributes).
pub fn lambda_event(messages: &[Message], queue_arn: &str, region: &str) -> Value {
    let records: Vec<Value> = messages
        .iter()
        .map(|m| lambda_record(m, queue_arn, region))
        .collect();
    json!({ "Records": records })
}

fn lambda_record(m: &Message, queue_arn: &str, region: &str) -> Value {
    let attributes: Map<String, Value> = m
        .attributes()
        .map(|a| {
            a.iter()
                .map(|(k, v)| (k.as_str().to_string(), Value::String(v.clone())))
                .collect()
        })
        .unwrap_or_default();
    let message_attributes: Map<String, Value> = m
        .message_attributes()
        .map(|a| {
            a.iter()
                .map(|(name, v)| {
                    let mut attr = json!({
                        "stringListValues": v.string_list_values(),
                        "binaryListValues": v
                            .binary_list_values()
                            .iter()
                            .map(|b| aws_smithy_types::base64::encode(b.as_ref()))
                            .collect::<Vec<_>>(),
                        "dataType": v.data_type(),
                    });
                    if let Some(s) = v.string_value() {
                        attr["stringValue"] = json!(s);
                    }
                    if let Some(b) = v.binary_value() {
                        attr["binaryValue"] = json!(aws_smithy_types::base64::encode(b.as_ref()));
                    }
                    (name.clone(), attr)
                })
                .collect()
        })
        .unwrap_or_default();
    let mut record = json!({
        "messageId": m.message_id(),
        "receiptHandle": m.receipt_handle(),
        "body": m.body().unwrap_or_default(),
        "attributes": attributes,
        "messageAttributes": message_attributes,
        "md5OfBody": m.md5_of_body(),
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": region,
    });
    if let Some(md5) = m.md5_of_message_attributes() {
        record["md5OfMessageAttributes"] = json!(md5);
    }
    record
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_arns_come_from_urls_of_every_partition_and_emulators() {
        assert_eq!(
            queue_arn_of_url(
                "https://sqs.eu-west-1.amazonaws.com/123456789012/orders",
                "eu-west-1"
            )
            .as_deref(),
            Some("arn:aws:sqs:eu-west-1:123456789012:orders")
        );
        assert_eq!(
            queue_arn_of_url("http://127.0.0.1:5000/000000000000/a.fifo/", "cn-north-1").as_deref(),
            Some("arn:aws-cn:sqs:cn-north-1:000000000000:a.fifo")
        );
        assert_eq!(queue_arn_of_url("orders", "us-east-1"), None);
        assert_eq!(
            queue_arn_of_url("http://h/notanaccount/q", "us-east-1"),
            None
        );
    }
}
