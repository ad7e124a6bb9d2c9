//! Which records an operation reads: the filter, a page of records and the opaque token
//! that resumes a listing. Pure: the record store ([`crate::ports::RecordStore`]) runs the
//! query and makes the tokens.

use chrono::{DateTime, Utc};

use crate::dead_letter::{DeadLetteredItem, ItemStatus};
use crate::error::ErrorClass;

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
    /// Only records whose redrive lease expired before this time (epoch seconds): items a
    /// run that died left `redriving`.
    pub lease_expired_before: Option<i64>,
}

impl RecordFilter {
    /// Whether a record passes the filter (used for records fetched by id).
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
