//! Reading records back: filtered, paginated listing through the indexes (or a scan when no
//! index fits), with an opaque continuation token.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use serde_dynamo::aws_sdk_dynamodb_1 as dynamo;

use super::{schema, DeadLetterStore};
use sqs_keeper_core::dead_letter::DeadLetteredItem;
use sqs_keeper_core::{
    selection::Page, selection::PageToken, selection::RecordFilter, selection::Unreadable,
};
use sqs_keeper_core::{ErrorClass, ProcessError};

/// Returns the token of a key DynamoDB returned: the key as a JSON object, in base64.
fn token_of_key(key: HashMap<String, AttributeValue>) -> Result<PageToken, ProcessError> {
    let json: serde_json::Map<String, serde_json::Value> = dynamo::from_item(key).map_err(|e| {
        ProcessError::new(
            ErrorClass::Unknown,
            format!("the last key read does not make a continuation token: {e}"),
        )
        .with_step("query")
    })?;
    Ok(token_of_json(json))
}

fn token_of_json(json: serde_json::Map<String, serde_json::Value>) -> PageToken {
    let text = serde_json::Value::Object(json).to_string();
    PageToken(aws_smithy_types::base64::encode(text.as_bytes()))
}

/// Returns the key a token this store made names; a validation failure for any other text.
fn key_of_token(token: &PageToken) -> Result<HashMap<String, AttributeValue>, ProcessError> {
    let bad = || ProcessError::validation(format!("continuation token {:?} is not valid", token.0));
    let bytes = aws_smithy_types::base64::decode(&token.0).map_err(|_| bad())?;
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(map)) if map.contains_key(schema::ITEM_ID) => {
            dynamo::to_item(map).map_err(|_| bad())
        }
        _ => Err(bad()),
    }
}

/// Returns the token for resuming right after `record` in a query with `filter`.
pub fn token_after(record: &DeadLetteredItem, filter: &RecordFilter) -> PageToken {
    let text = |s: &str| serde_json::Value::String(s.to_string());
    let mut key = serde_json::Map::new();
    key.insert(schema::ITEM_ID.to_string(), text(&record.item_id));
    let last = text(&sqs_keeper_core::time_format::format(&record.last_attempt));
    if filter.signature.is_some() {
        key.insert(
            schema::ERROR_SIGNATURE.into(),
            text(&record.error_signature),
        );
        key.insert(schema::LAST_ATTEMPT.into(), last);
    } else if let Some(status) = filter.status {
        key.insert(schema::STATUS.into(), text(status.as_str()));
        key.insert(schema::LAST_ATTEMPT.into(), last);
    }
    token_of_json(key)
}

impl DeadLetterStore {
    /// Returns the whole records of the index entries `entries`, in their order (strongly
    /// consistent; a record deleted since is left out).
    async fn whole_records(
        &self,
        entries: &[HashMap<String, AttributeValue>],
    ) -> Result<Vec<HashMap<String, AttributeValue>>, ProcessError> {
        let ids: Vec<String> = entries
            .iter()
            .filter_map(|e| e.get(schema::ITEM_ID).and_then(|v| v.as_s().ok()).cloned())
            .collect();
        let mut found = self.batch_get(&ids, "query", |request| request).await?;
        Ok(ids.iter().filter_map(|id| found.remove(id)).collect())
    }

    /// Reads one page. `limit` bounds the items DynamoDB evaluates, so a page may hold fewer
    /// records than `limit` and still have a next page.
    pub async fn query_page(
        &self,
        filter: &RecordFilter,
        limit: i32,
        start: Option<&PageToken>,
    ) -> Result<Page, ProcessError> {
        let start_key = start.map(key_of_token).transpose()?;
        let plan = QueryPlan::of(filter);
        let from_index = plan.index.is_some();
        let (items, last_key) = self.fetch(plan, filter, limit, start_key).await?;
        // An index holds only what its queries filter on: the records themselves are read
        // after it, in the index's order (a record deleted since is left out, one changed
        // since is judged again by the filter).
        let items = if from_index {
            self.whole_records(&items).await?
        } else {
            items
        };
        let (records, unreadable) = decode_page(&items, filter, from_index);
        Ok(Page {
            records,
            unreadable,
            next: last_key
                .filter(|k| !k.is_empty())
                .map(token_of_key)
                .transpose()?,
        })
    }

    /// Runs `plan`: a query of its index, or a scan of the table when it has none.
    async fn fetch(
        &self,
        plan: QueryPlan,
        filter: &RecordFilter,
        limit: i32,
        start_key: Option<HashMap<String, AttributeValue>>,
    ) -> Result<(Vec<Item>, Option<Item>), ProcessError> {
        let filter_expression = plan.filter_expression();
        let names = (!plan.names.is_empty()).then_some(plan.names);
        let values = (!plan.values.is_empty()).then_some(plan.values);
        let dynamodb = &self.clients.dynamodb;
        match (plan.index, plan.key_condition) {
            (Some(index), Some(condition)) => {
                let output = dynamodb
                    .query()
                    .table_name(&self.config.table)
                    .index_name(index)
                    .key_condition_expression(condition)
                    .set_filter_expression(filter_expression)
                    .set_expression_attribute_names(names)
                    .set_expression_attribute_values(values)
                    .scan_index_forward(filter.oldest_first)
                    .limit(limit.max(1))
                    .set_exclusive_start_key(start_key)
                    .send()
                    .await
                    .map_err(|e| ProcessError::from_sdk(&e).with_step("query"))?;
                Ok((output.items.unwrap_or_default(), output.last_evaluated_key))
            }
            _ => {
                let output = dynamodb
                    .scan()
                    .table_name(&self.config.table)
                    .set_filter_expression(filter_expression)
                    .set_expression_attribute_names(names)
                    .set_expression_attribute_values(values)
                    .limit(limit.max(1))
                    .set_exclusive_start_key(start_key)
                    .send()
                    .await
                    .map_err(|e| ProcessError::from_sdk(&e).with_step("scan"))?;
                Ok((output.items.unwrap_or_default(), output.last_evaluated_key))
            }
        }
    }

    /// Returns the `limit` records of the selection whose last attempt is newest, newest first, read
    /// through the indexes: one index query when the filter names a status or a signature
    /// (both indexes sort by last attempt), else one per status, merged. Stored items that
    /// do not read as records are added to `unreadable`.
    pub async fn newest_noting(
        &self,
        filter: &RecordFilter,
        limit: usize,
        unreadable: &mut Vec<Unreadable>,
    ) -> Result<Vec<DeadLetteredItem>, ProcessError> {
        if filter.status.is_some() || filter.signature.is_some() {
            return self
                .query_all_noting(filter, Some(limit), |_| {}, unreadable)
                .await;
        }
        let mut records = Vec::new();
        for status in sqs_keeper_core::dead_letter::ItemStatus::ALL {
            let one_status = RecordFilter {
                status: Some(status),
                ..filter.clone()
            };
            records.extend(
                self.query_all_noting(&one_status, Some(limit), |_| {}, unreadable)
                    .await?,
            );
        }
        sqs_keeper_core::selection::sort_newest_first(&mut records);
        records.truncate(limit);
        Ok(records)
    }

    /// Reads every record `filter` selects a page at a time, handing each page to `page`
    /// before the next is read: memory holds one page, whatever the table's size. The
    /// stored items that do not read as records go to `unreadable`. Returns the records
    /// read.
    pub async fn for_each_page<E: From<ProcessError>>(
        &self,
        filter: &RecordFilter,
        unreadable: &mut Vec<Unreadable>,
        mut page: impl FnMut(Vec<DeadLetteredItem>) -> Result<(), E>,
    ) -> Result<usize, E> {
        let mut read = 0;
        let mut token = None;
        loop {
            let next = self.query_page(filter, 500, token.as_ref()).await?;
            unreadable.extend(next.unreadable);
            read += next.records.len();
            page(next.records)?;
            match next.next {
                Some(next) => token = Some(next),
                None => return Ok(read),
            }
        }
    }

    /// Reads up to `max` records (all, if `None`), following pages.
    pub async fn query_all(
        &self,
        filter: &RecordFilter,
        max: Option<usize>,
        on_page: impl FnMut(usize),
    ) -> Result<Vec<DeadLetteredItem>, ProcessError> {
        self.query_all_noting(filter, max, on_page, &mut Vec::new())
            .await
    }

    /// Runs [`DeadLetterStore::query_all`], adding the stored items that do not read as records to
    /// `unreadable` instead of failing (one malformed record must not hide the rest).
    pub async fn query_all_noting(
        &self,
        filter: &RecordFilter,
        max: Option<usize>,
        mut on_page: impl FnMut(usize),
        unreadable: &mut Vec<Unreadable>,
    ) -> Result<Vec<DeadLetteredItem>, ProcessError> {
        let mut records = Vec::new();
        let mut token = None;
        loop {
            let page = self.query_page(filter, 500, token.as_ref()).await?;
            unreadable.extend(page.unreadable);
            records.extend(page.records);
            on_page(records.len());
            if let Some(max) = max {
                if records.len() >= max {
                    records.truncate(max);
                    return Ok(records);
                }
            }
            match page.next {
                Some(next) => token = Some(next),
                None => return Ok(records),
            }
        }
    }
}

/// A stored item, as DynamoDB returns it.
type Item = HashMap<String, AttributeValue>;

/// Returns the records of a page's `items`, and those that do not read as records. Items read
/// from an index are judged by `filter` again, since the index does not hold every field
/// the filter reads.
fn decode_page(
    items: &[Item],
    filter: &RecordFilter,
    from_index: bool,
) -> (Vec<DeadLetteredItem>, Vec<Unreadable>) {
    let mut records = Vec::with_capacity(items.len());
    let mut unreadable = Vec::new();
    for item in items {
        match schema::record_from_item(item) {
            Ok(record) if from_index && !filter.matches(&record) => {}
            Ok(record) => records.push(record),
            Err(error) => unreadable.push(Unreadable {
                item_id: item
                    .get(schema::ITEM_ID)
                    .and_then(|v| v.as_s().ok())
                    .cloned()
                    .unwrap_or_else(|| "?".to_string()),
                error: error.to_string(),
            }),
        }
    }
    for bad in &unreadable {
        tracing::warn!(item_id = %bad.item_id, error = %bad.error, "skipping a stored item that is not a valid record");
    }
    (records, unreadable)
}

/// How a [`RecordFilter`] is read from the table: the index whose key the filter names
/// (with its key condition), or none (a scan), and the filter expression on the rest.
#[derive(Debug, Default, PartialEq)]
struct QueryPlan {
    index: Option<&'static str>,
    key_condition: Option<String>,
    filters: Vec<String>,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl QueryPlan {
    /// Returns the plan of `filter`. A signature picks its index, else a status picks its own;
    /// both sort by last attempt, so a time range is part of their key condition.
    fn of(filter: &RecordFilter) -> QueryPlan {
        let mut plan = QueryPlan::default();
        let range = plan.time_range(filter);
        if let Some(status) = filter.status {
            plan.bind(
                "#status",
                schema::STATUS,
                ":status",
                AttributeValue::S(status.as_str().into()),
            );
        }
        if let Some(signature) = &filter.signature {
            plan.bind(
                "#sig",
                schema::ERROR_SIGNATURE,
                ":sig",
                AttributeValue::S(signature.clone()),
            );
            plan.use_index(schema::BY_SIGNATURE_INDEX, "#sig = :sig", range);
            if filter.status.is_some() {
                plan.filters.push("#status = :status".to_string());
            }
        } else if filter.status.is_some() {
            plan.use_index(schema::BY_STATUS_INDEX, "#status = :status", range);
        } else if let Some(range) = range {
            plan.filters.push(range.to_string());
        }
        plan.filter_the_rest(filter);
        plan
    }

    /// Names `#name` and binds `:value`.
    fn bind(&mut self, name: &str, attribute: &str, placeholder: &str, value: AttributeValue) {
        self.names.insert(name.to_string(), attribute.to_string());
        self.values.insert(placeholder.to_string(), value);
    }

    /// Queries `index` by `key`, and `range` when there is one.
    fn use_index(&mut self, index: &'static str, key: &str, range: Option<&str>) {
        self.index = Some(index);
        self.key_condition = Some(match range {
            Some(range) => format!("{key} AND {range}"),
            None => key.to_string(),
        });
    }

    /// Binds the filter's time range on the last attempt, and returns its condition.
    fn time_range(&mut self, filter: &RecordFilter) -> Option<&'static str> {
        let mut bind = |placeholder: &str, at: &chrono::DateTime<chrono::Utc>| {
            self.names
                .insert("#last".to_string(), schema::LAST_ATTEMPT.to_string());
            self.values.insert(
                placeholder.to_string(),
                AttributeValue::S(sqs_keeper_core::time_format::format(at)),
            );
        };
        match (&filter.since, &filter.until) {
            (Some(since), Some(until)) => {
                bind(":since", since);
                bind(":until", until);
                Some("#last BETWEEN :since AND :until")
            }
            (Some(since), None) => {
                bind(":since", since);
                Some("#last >= :since")
            }
            (None, Some(until)) => {
                bind(":until", until);
                Some("#last <= :until")
            }
            (None, None) => None,
        }
    }

    /// Adds the conditions no index holds: class, lease expiry, eligibility, and (on a scan)
    /// the message group.
    fn filter_the_rest(&mut self, filter: &RecordFilter) {
        if let Some(class) = filter.class {
            self.bind(
                "#class",
                "error_class",
                ":class",
                AttributeValue::S(class.as_str().into()),
            );
            self.filters.push("#class = :class".to_string());
        }
        if let Some(before) = filter.lease_expired_before {
            let before = AttributeValue::N(before.to_string());
            self.bind(
                "#lease_expires",
                schema::LEASE_EXPIRES_AT,
                ":lease_before",
                before,
            );
            self.filters
                .push("#lease_expires < :lease_before".to_string());
        }
        if filter.eligible_only {
            self.bind(
                "#elig",
                "reprocess_eligible",
                ":true",
                AttributeValue::Bool(true),
            );
            self.bind(
                "#review",
                "manual_review_required",
                ":false",
                AttributeValue::Bool(false),
            );
            self.filters
                .push("#elig = :true AND #review = :false".to_string());
        }
        // The group is inside the record's `source` map, which the indexes do not project:
        // a scan filters on it; an index query's records are judged by the filter once read
        // whole ([`decode_page`]).
        if let (Some(group), None) = (&filter.message_group, self.index) {
            self.names
                .insert("#source".to_string(), "source".to_string());
            self.bind(
                "#group",
                "message_group_id",
                ":group",
                AttributeValue::S(group.clone()),
            );
            self.filters.push("#source.#group = :group".to_string());
        }
    }

    /// Returns the filter expression, if the plan filters on anything.
    fn filter_expression(&self) -> Option<String> {
        (!self.filters.is_empty()).then(|| self.filters.join(" AND "))
    }
}

#[cfg(test)]
mod plan_tests {
    use super::*;
    use sqs_keeper_core::{dead_letter::ItemStatus, ErrorClass};

    #[test]
    fn a_status_and_a_time_range_query_the_status_index_by_key() {
        let filter = RecordFilter {
            status: Some(ItemStatus::Dead),
            since: Some(chrono::DateTime::UNIX_EPOCH),
            class: Some(ErrorClass::Timeout),
            ..RecordFilter::default()
        };
        let plan = QueryPlan::of(&filter);
        assert_eq!(plan.index, Some(schema::BY_STATUS_INDEX));
        assert_eq!(
            plan.key_condition.as_deref(),
            Some("#status = :status AND #last >= :since")
        );
        assert_eq!(plan.filter_expression().as_deref(), Some("#class = :class"));
    }

    #[test]
    fn a_signature_picks_its_index_and_filters_the_status() {
        let filter = RecordFilter {
            status: Some(ItemStatus::Dead),
            signature: Some("abc".into()),
            message_group: Some("g".into()),
            ..RecordFilter::default()
        };
        let plan = QueryPlan::of(&filter);
        assert_eq!(plan.index, Some(schema::BY_SIGNATURE_INDEX));
        assert_eq!(plan.key_condition.as_deref(), Some("#sig = :sig"));
        // The group is judged once the records are read whole, not by the index query.
        assert_eq!(
            plan.filter_expression().as_deref(),
            Some("#status = :status")
        );
    }

    #[test]
    fn no_key_scans_with_every_condition_as_a_filter() {
        let filter = RecordFilter {
            until: Some(chrono::DateTime::UNIX_EPOCH),
            eligible_only: true,
            message_group: Some("g".into()),
            ..RecordFilter::default()
        };
        let plan = QueryPlan::of(&filter);
        assert_eq!(plan.index, None);
        assert_eq!(
            plan.filter_expression().as_deref(),
            Some("#last <= :until AND #elig = :true AND #review = :false AND #source.#group = :group")
        );
        assert_eq!(plan.values.len(), 4);
    }
}
