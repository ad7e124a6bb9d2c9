//! Counts the DynamoDB capacity units each worker invocation consumes, as metrics of that
//! invocation.
//!
//! [`CapacityMeter`] is an SDK interceptor on the DynamoDB client [`crate::AwsClients`]
//! builds. It asks every request that asks for nothing else for the capacity it consumed
//! (`ReturnConsumedCapacity` `TOTAL`). A request that already asks (`INDEXES`) keeps its
//! setting. The meter adds what each answer reports to the running invocation's metric
//! sink ([`sqs_keeper_core::context::invocation_metrics`]). Reads add to
//! `DynamoDbReadUnits`, writes to `DynamoDbWriteUnits` ([`CAPACITY_METRICS`]). A write
//! transaction's units count as writes, and a read transaction's as reads.
//!
//! A request DynamoDB refuses (a condition not met, a throttle) reports no capacity. It
//! adds none, though DynamoDB bills a refused conditional write. The counts are therefore
//! a floor of what on-demand tables bill. `DynamoDbRequests` counts every request
//! ([`crate::request_meter`]).

use aws_sdk_dynamodb::operation::{
    batch_get_item::{BatchGetItemInput, BatchGetItemOutput},
    batch_write_item::{BatchWriteItemInput, BatchWriteItemOutput},
    delete_item::{DeleteItemInput, DeleteItemOutput},
    get_item::{GetItemInput, GetItemOutput},
    put_item::{PutItemInput, PutItemOutput},
    query::{QueryInput, QueryOutput},
    scan::{ScanInput, ScanOutput},
    transact_get_items::{TransactGetItemsInput, TransactGetItemsOutput},
    transact_write_items::{TransactWriteItemsInput, TransactWriteItemsOutput},
    update_item::{UpdateItemInput, UpdateItemOutput},
};
use aws_sdk_dynamodb::types::{ConsumedCapacity, ReturnConsumedCapacity};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::{
    AfterDeserializationInterceptorContextRef, BeforeSerializationInterceptorContextMut, Input,
    Output,
};
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use sqs_keeper_core::context::{invocation_metrics, Unit};

/// The metrics the meter adds: read units, then write units.
pub const CAPACITY_METRICS: [&str; 2] = ["DynamoDbReadUnits", "DynamoDbWriteUnits"];

/// The interceptor that asks DynamoDB for the capacity each request consumed, and counts it
/// into the running invocation's metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct CapacityMeter;

/// Sets `ReturnConsumedCapacity` `TOTAL` on `input`, if it is a request that takes it and
/// asks for none yet.
fn ask_for_capacity(input: &mut Input) {
    macro_rules! total {
        ($($kind:ty),*) => {
            $(if let Some(request) = input.downcast_mut::<$kind>() {
                let asked = &mut request.return_consumed_capacity;
                if matches!(asked, None | Some(ReturnConsumedCapacity::None)) {
                    *asked = Some(ReturnConsumedCapacity::Total);
                }
                return;
            })*
        };
    }
    total!(
        PutItemInput,
        UpdateItemInput,
        DeleteItemInput,
        GetItemInput,
        QueryInput,
        ScanInput,
        BatchGetItemInput,
        BatchWriteItemInput,
        TransactGetItemsInput,
        TransactWriteItemsInput
    );
}

/// Returns the metric and the units an answer reports, if it is one of a request that
/// took `ReturnConsumedCapacity`.
fn consumed(output: &Output) -> Option<(&'static str, f64)> {
    let [read, write] = CAPACITY_METRICS;
    let one = |capacity: Option<&ConsumedCapacity>| {
        capacity
            .and_then(ConsumedCapacity::capacity_units)
            .unwrap_or(0.0)
    };
    let all =
        |capacities: &[ConsumedCapacity]| -> f64 { capacities.iter().map(|c| one(Some(c))).sum() };
    macro_rules! single {
        ($metric:expr, $($kind:ty),*) => {
            $(if let Some(answer) = output.downcast_ref::<$kind>() {
                return Some(($metric, one(answer.consumed_capacity())));
            })*
        };
    }
    macro_rules! batch {
        ($metric:expr, $($kind:ty),*) => {
            $(if let Some(answer) = output.downcast_ref::<$kind>() {
                return Some(($metric, all(answer.consumed_capacity())));
            })*
        };
    }
    single!(write, PutItemOutput, UpdateItemOutput, DeleteItemOutput);
    single!(read, GetItemOutput, QueryOutput, ScanOutput);
    batch!(write, BatchWriteItemOutput, TransactWriteItemsOutput);
    batch!(read, BatchGetItemOutput, TransactGetItemsOutput);
    None
}

impl Intercept for CapacityMeter {
    fn name(&self) -> &'static str {
        "CapacityMeter"
    }

    fn modify_before_serialization(
        &self,
        context: &mut BeforeSerializationInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        ask_for_capacity(context.input_mut());
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Ok(output) = context.output_or_error() {
            if let Some((metric, units)) = consumed(output).filter(|(_, units)| *units > 0.0) {
                invocation_metrics().tally(metric, Unit::Count, units);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every request the meter knows is asked for its total capacity. A request that asks
    /// for the indexes' capacity keeps its setting, and another input is left as it was.
    #[test]
    fn each_request_is_asked_for_its_total_capacity() {
        let mut put = Input::erase(PutItemInput::builder().table_name("t").build().unwrap());
        ask_for_capacity(&mut put);
        let put = put.downcast_ref::<PutItemInput>().unwrap();
        assert_eq!(
            put.return_consumed_capacity,
            Some(ReturnConsumedCapacity::Total)
        );
        let mut query = Input::erase(QueryInput::builder().table_name("t").build().unwrap());
        ask_for_capacity(&mut query);
        let query = query.downcast_ref::<QueryInput>().unwrap();
        assert_eq!(
            query.return_consumed_capacity,
            Some(ReturnConsumedCapacity::Total)
        );
        let mut indexes = Input::erase(
            UpdateItemInput::builder()
                .table_name("t")
                .return_consumed_capacity(ReturnConsumedCapacity::Indexes)
                .build()
                .unwrap(),
        );
        ask_for_capacity(&mut indexes);
        let indexes = indexes.downcast_ref::<UpdateItemInput>().unwrap();
        assert_eq!(
            indexes.return_consumed_capacity,
            Some(ReturnConsumedCapacity::Indexes)
        );
        let mut other = Input::erase(String::from("not a DynamoDB request"));
        ask_for_capacity(&mut other);
        assert_eq!(
            other.downcast_ref::<String>().map(String::as_str),
            Some("not a DynamoDB request")
        );
    }

    /// Reads count as read units, and writes and write transactions as write units. A
    /// batch's units are summed over its tables.
    #[test]
    fn answers_count_as_reads_or_writes() {
        let units = |n: f64| ConsumedCapacity::builder().capacity_units(n).build();
        let put = Output::erase(
            PutItemOutput::builder()
                .consumed_capacity(units(2.0))
                .build(),
        );
        assert_eq!(consumed(&put), Some(("DynamoDbWriteUnits", 2.0)));
        let get = Output::erase(
            GetItemOutput::builder()
                .consumed_capacity(units(0.5))
                .build(),
        );
        assert_eq!(consumed(&get), Some(("DynamoDbReadUnits", 0.5)));
        let transaction = Output::erase(
            TransactWriteItemsOutput::builder()
                .consumed_capacity(units(4.0))
                .consumed_capacity(units(2.0))
                .build(),
        );
        assert_eq!(consumed(&transaction), Some(("DynamoDbWriteUnits", 6.0)));
        let none = Output::erase(UpdateItemOutput::builder().build());
        assert_eq!(consumed(&none), Some(("DynamoDbWriteUnits", 0.0)));
        assert_eq!(consumed(&Output::erase(String::from("other"))), None);
    }

    /// The meters' names are reserved, so a handler's own metric cannot take one.
    #[test]
    fn the_meters_names_are_reserved() {
        let names = crate::request_meter::REQUEST_METRICS
            .iter()
            .map(|(_, name)| *name)
            .chain(CAPACITY_METRICS);
        for name in names {
            assert!(
                sqs_keeper_core::context::RESERVED_METRICS.contains(&name),
                "{name}"
            );
        }
    }
}
