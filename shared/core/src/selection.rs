//! Which records an operation reads: the filter, a page of records and the opaque token
//! that resumes a listing. Pure: the record store ([`crate::ports::RecordStore`]) runs the
//! query and makes the tokens.

use chrono::{DateTime, Utc};

use crate::dead_letter::{DeadLetteredItem, ItemStatus};
use crate::error::{ErrorClass, ProcessError};

/// Which records to read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordFilter {
    /// Only this status (`None`: any).
    pub status: Option<ItemStatus>,
    /// Only this error signature.
    pub signature: Option<String>,
    /// Only this error class.
    pub class: Option<ErrorClass>,
    /// Last attempt at or after.
    pub since: Option<DateTime<Utc>>,
    /// Last attempt at or before.
    pub until: Option<DateTime<Utc>>,
    /// Only `reprocess_eligible` records not requiring manual review.
    pub eligible_only: bool,
    /// Only records of this message group: a FIFO queue's group, or a fair queue's tenant
    /// (a standard queue's `MessageGroupId`).
    pub message_group: Option<String>,
    /// Only records whose redrive lease expired before this time (epoch seconds): items a
    /// run that died left `redriving`.
    pub lease_expired_before: Option<i64>,
    /// Oldest last attempt first (a redrive's selection: an item that failed again moves
    /// to the back, so failing items do not head every run and starve older ones); else
    /// newest first (a listing).
    pub oldest_first: bool,
}

impl RecordFilter {
    /// Tells whether a record passes the filter (used for records fetched by id).
    pub fn matches(&self, r: &DeadLetteredItem) -> bool {
        self.status.is_none_or(|s| s == r.status)
            && self
                .signature
                .as_ref()
                .is_none_or(|s| *s == r.error_signature)
            && self.class.is_none_or(|c| c == r.error_class)
            && self.since.is_none_or(|t| r.last_attempt >= t)
            && self.until.is_none_or(|t| r.last_attempt <= t)
            && (!self.eligible_only || (r.reprocess_eligible && !r.manual_review_required))
            && self
                .message_group
                .as_ref()
                .is_none_or(|g| r.source.message_group_id.as_ref() == Some(g))
            && self
                .lease_expired_before
                .is_none_or(|t| r.lease_expires_at.is_some_and(|e| e < t))
    }
}

/// Where the next page starts: the key of the last record read, opaque to callers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageToken(pub String);

/// A stored item that does not read as a record: reported, never fatal to a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// Its key (`?` when even that is missing).
    pub item_id: String,
    /// Why it does not read.
    pub error: String,
}

/// One page of records.
#[derive(Debug, Clone)]
pub struct Page {
    /// Records, newest last attempt first when an index was used.
    pub records: Vec<DeadLetteredItem>,
    /// Items on the page that do not read as records (one malformed record must not fail
    /// every page it is on).
    pub unreadable: Vec<Unreadable>,
    /// Where the next page starts; `None` at the end.
    pub next: Option<PageToken>,
}

/// Sort key of a listing: newest last attempt first, then by item id (the order the
/// table's indexes give).
fn listing_key(record: &DeadLetteredItem) -> (std::cmp::Reverse<i64>, &str) {
    (
        std::cmp::Reverse(record.last_attempt.timestamp_micros()),
        record.item_id.as_str(),
    )
}

/// Sorts records as a listing shows them: newest last attempt first, then by item id.
pub fn sort_newest_first(records: &mut [DeadLetteredItem]) {
    records.sort_by(|a, b| listing_key(a).cmp(&listing_key(b)));
}

/// Returns the token that resumes an in-memory listing right after `record`.
pub fn token_after_record(record: &DeadLetteredItem) -> PageToken {
    PageToken(format!(
        "{}|{}",
        record.last_attempt.timestamp_micros(),
        record.item_id
    ))
}

/// Returns one page of `selected` as a table's query gives it, for the stores that hold records
/// in memory (the test store, the simulation's): newest first, at most `limit` records,
/// resuming after `start` the way DynamoDB's start key does (the position after the key,
/// whether or not the record there still matches: a record resolved since no longer does).
pub fn page_in_memory(
    mut selected: Vec<&DeadLetteredItem>,
    limit: i32,
    start: Option<&PageToken>,
    oldest_first: bool,
) -> Result<Page, ProcessError> {
    // Ordered as the index gives it: by last attempt (newest or oldest first), then by item
    // id in the same direction.
    let key = |r: &DeadLetteredItem| {
        let micros = r.last_attempt.timestamp_micros();
        if oldest_first {
            (micros, r.item_id.clone())
        } else {
            (-micros, r.item_id.clone())
        }
    };
    selected.sort_by_key(|a| key(a));
    let from = match start {
        Some(token) => {
            let (micros, item_id) = token
                .0
                .split_once('|')
                .and_then(|(t, id)| Some((t.parse::<i64>().ok()?, id)))
                .ok_or_else(|| {
                    ProcessError::validation(format!(
                        "continuation token {:?} is not valid",
                        token.0
                    ))
                })?;
            let at = if oldest_first { micros } else { -micros };
            let position = (at, item_id.to_string());
            selected.iter().take_while(|r| key(r) <= position).count()
        }
        None => 0,
    };
    let limit = usize::try_from(limit.max(1)).unwrap_or(1);
    let records: Vec<DeadLetteredItem> = selected
        .iter()
        .skip(from)
        .take(limit)
        .map(|r| (*r).clone())
        .collect();
    let next = if from + records.len() < selected.len() {
        records.last().map(token_after_record)
    } else {
        None
    };
    Ok(Page {
        records,
        unreadable: Vec::new(),
        next,
    })
}
