//! The circuit breaker's shared state in DynamoDB ([`sqs_keeper_core::breaker::BreakerStore`]).
//!
//! One item per breaker (`id` = its name) in a table with a string key `id` and TTL on
//! `expires_at` (the idempotency table's schema: one table can hold both). Attributes:
//! `open_until_ms`, `opens`, `failures`, `window_start_ms`, `probe_until_ms`. A healthy
//! function reads it once per sandbox per refresh (an eventually consistent GetItem, half
//! a read unit) and never writes; each transient failure is one UpdateItem until the
//! breaker opens; opening, probing and closing are one conditional UpdateItem each.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use futures::future::BoxFuture;

use super::condition_expression::WithCondition;
use sqs_keeper_core::condition::breaker as conditions;
use sqs_keeper_core::ProcessError;
use sqs_keeper_core::{breaker::BreakerState, breaker::BreakerStore};

/// How long an untouched breaker item is kept (TTL).
const KEEP: Duration = Duration::from_secs(7 * 86_400);

/// The breaker named `name` in `table`.
#[derive(Debug, Clone)]
pub struct DynamoBreakerStore {
    client: aws_sdk_dynamodb::Client,
    table: String,
    name: String,
}

impl DynamoBreakerStore {
    /// Creates the breaker `name` (one per function: every sandbox of it shares it) in `table`.
    pub fn new(
        client: aws_sdk_dynamodb::Client,
        table: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        DynamoBreakerStore {
            client,
            table: table.into(),
            name: name.into(),
        }
    }

    fn update(
        &self,
    ) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
        self.client
            .update_item()
            .table_name(&self.table)
            .key("id", AttributeValue::S(self.name.clone()))
    }
}

/// Epoch milliseconds of `at` (0 before the epoch), as stored.
pub(super) use sqs_keeper_core::condition::epoch_millis as millis;

/// Returns a DynamoDB number.
pub(super) fn number(n: i64) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

/// Returns the time an item's epoch-milliseconds attribute `name` holds (`None` when absent or
/// out of range).
pub(super) fn time_of(
    item: &std::collections::HashMap<String, AttributeValue>,
    name: &str,
) -> Option<SystemTime> {
    let ms: u64 = item.get(name)?.as_n().ok()?.parse().ok()?;
    UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}

fn count_of(item: &std::collections::HashMap<String, AttributeValue>, name: &str) -> u32 {
    item.get(name)
        .and_then(|v| v.as_n().ok())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn state_of(item: Option<&std::collections::HashMap<String, AttributeValue>>) -> BreakerState {
    let Some(item) = item else {
        return BreakerState::default();
    };
    BreakerState {
        open_until: time_of(item, conditions::OPEN_UNTIL.0[0]),
        opens: count_of(item, conditions::OPENS.0[0]),
        failures: count_of(item, conditions::FAILURES.0[0]),
        window_start: time_of(item, conditions::WINDOW_START.0[0]),
        probe_until: time_of(item, conditions::PROBE_UNTIL.0[0]),
    }
}

fn error<E>(
    err: &SdkError<E, aws_smithy_runtime_api::client::orchestrator::HttpResponse>,
) -> ProcessError
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + 'static,
{
    ProcessError::from_sdk(err).with_step("breaker")
}

fn failed_condition(
    err: &SdkError<UpdateItemError, aws_smithy_runtime_api::client::orchestrator::HttpResponse>,
) -> bool {
    matches!(err, SdkError::ServiceError(s) if matches!(s.err(), UpdateItemError::ConditionalCheckFailedException(_)))
}

fn expiry(now: SystemTime) -> AttributeValue {
    number(millis(now + KEEP) / 1000)
}

impl BreakerStore for DynamoBreakerStore {
    fn read(&self) -> BoxFuture<'_, Result<BreakerState, ProcessError>> {
        Box::pin(async move {
            let output = self
                .client
                .get_item()
                .table_name(&self.table)
                .key("id", AttributeValue::S(self.name.clone()))
                .send()
                .await
                .map_err(|e| error(&e))?;
            Ok(state_of(output.item()))
        })
    }

    fn add_failures(
        &self,
        n: u32,
        now: SystemTime,
        window: Duration,
    ) -> BoxFuture<'_, Result<BreakerState, ProcessError>> {
        Box::pin(async move {
            let floor = millis(now.checked_sub(window).unwrap_or(UNIX_EPOCH));
            for _ in 0..3 {
                // Within the current window: add.
                let added = self
                    .update()
                    .update_expression("ADD failures :n SET expires_at = :keep")
                    .with_condition(&conditions::window_current(floor))
                    .expression_attribute_values(":n", number(i64::from(n)))
                    .expression_attribute_values(":keep", expiry(now))
                    .return_values(ReturnValue::AllNew)
                    .send()
                    .await;
                match added {
                    Ok(output) => return Ok(state_of(output.attributes())),
                    Err(e) if failed_condition(&e) => {}
                    Err(e) => return Err(error(&e)),
                }
                // No current window: start one with these failures.
                let started = self
                    .update()
                    .update_expression(
                        "SET failures = :n, window_start_ms = :now, expires_at = :keep",
                    )
                    .with_condition(&conditions::window_lapsed(floor))
                    .expression_attribute_values(":n", number(i64::from(n)))
                    .expression_attribute_values(":now", number(millis(now)))
                    .expression_attribute_values(":keep", expiry(now))
                    .return_values(ReturnValue::AllNew)
                    .send()
                    .await;
                match started {
                    Ok(output) => return Ok(state_of(output.attributes())),
                    // Another sandbox started it meanwhile: add to it.
                    Err(e) if failed_condition(&e) => {}
                    Err(e) => return Err(error(&e)),
                }
            }
            self.read().await
        })
    }

    fn open(
        &self,
        until: SystemTime,
        opens: u32,
        now: SystemTime,
    ) -> BoxFuture<'_, Result<bool, ProcessError>> {
        Box::pin(async move {
            let opened = self
                .update()
                .update_expression("SET open_until_ms = :until, opens = :opens, expires_at = :keep REMOVE probe_until_ms")
                .with_condition(&conditions::may_open(millis(now)))
                .expression_attribute_values(":until", number(millis(until)))
                .expression_attribute_values(":opens", number(i64::from(opens)))
                .expression_attribute_values(":keep", expiry(now))
                .send()
                .await;
            match opened {
                Ok(_) => Ok(true),
                Err(e) if failed_condition(&e) => Ok(false),
                Err(e) => Err(error(&e)),
            }
        })
    }

    fn take_probe(
        &self,
        until: SystemTime,
        now: SystemTime,
    ) -> BoxFuture<'_, Result<bool, ProcessError>> {
        Box::pin(async move {
            let taken = self
                .update()
                .update_expression("SET probe_until_ms = :until")
                .with_condition(&conditions::probe_free(millis(now)))
                .expression_attribute_values(":until", number(millis(until)))
                .send()
                .await;
            match taken {
                Ok(_) => Ok(true),
                Err(e) if failed_condition(&e) => Ok(false),
                Err(e) => Err(error(&e)),
            }
        })
    }

    fn release_probe(&self, until: SystemTime) -> BoxFuture<'_, Result<(), ProcessError>> {
        Box::pin(async move {
            let released = self
                .update()
                .update_expression("REMOVE probe_until_ms")
                .with_condition(&conditions::probe_held_until(millis(until)))
                .send()
                .await;
            match released {
                Ok(_) => Ok(()),
                // Another probe holds it now, or the breaker closed or opened again.
                Err(e) if failed_condition(&e) => Ok(()),
                Err(e) => Err(error(&e)),
            }
        })
    }

    fn close(&self) -> BoxFuture<'_, Result<(), ProcessError>> {
        Box::pin(async move {
            self.update()
                .update_expression("SET failures = :zero, opens = :zero REMOVE open_until_ms, probe_until_ms, window_start_ms")
                .expression_attribute_values(":zero", number(0))
                .send()
                .await
                .map_err(|e| error(&e))?;
            Ok(())
        })
    }
}
