//! A redrive request and its validation into a `Plan`: typed times, limits, the
//! selection's queries and the continuation token that resumes a run. Pure: the
//! engine ([`super::engine`]) runs the plan.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::dead_letter::{DeadLetteredItem, ItemStatus};
use crate::error::{ErrorClass, ProcessError};
use crate::selection::RecordFilter;

/// How items are put back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[non_exhaustive]
pub enum RedriveMode {
    /// Run the processor on the item here and now.
    #[default]
    Reprocess,
    /// Send the original payload back to the source queue.
    Requeue,
}

impl RedriveMode {
    /// Returns its name in a request (`reprocess`, `requeue`).
    pub fn as_str(self) -> &'static str {
        match self {
            RedriveMode::Reprocess => "reprocess",
            RedriveMode::Requeue => "requeue",
        }
    }
}

/// A redrive request: what the redrive function receives and `dlq redrive` builds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedriveRequest {
    /// Exactly these items (other selectors then only filter).
    pub item_ids: Vec<String>,
    /// Only items with this error signature.
    pub error_signature: Option<String>,
    /// Only items of this error class.
    pub error_class: Option<ErrorClass>,
    /// Only items of this message group (a FIFO group, or a fair queue's tenant).
    pub message_group_id: Option<String>,
    /// Last attempt at or after: RFC 3339 or a duration ago (`24h`).
    pub since: Option<String>,
    /// Last attempt at or before: RFC 3339 or a duration ago.
    pub until: Option<String>,
    /// Status to select (default `dead`).
    pub status: Option<ItemStatus>,
    /// Include items that are not reprocess-eligible or need manual review.
    pub force: bool,
    /// How items are put back.
    pub mode: RedriveMode,
    /// Report what would happen; change nothing.
    pub dry_run: bool,
    /// Stop after this many items (a continuation token resumes).
    pub max_items: Option<usize>,
    /// Items in flight at once (default 4, at most 64).
    pub parallelism: Option<usize>,
    /// Items started per second at most.
    pub rate: Option<f64>,
    /// Stop starting items after this many seconds (default 600), with a continuation token.
    pub time_budget_secs: Option<u64>,
    /// Resume a previous run.
    pub continuation_token: Option<String>,
}

/// Why a run could not start or continue.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedriveError {
    /// The request is invalid; nothing was changed.
    #[error("invalid redrive request: {0}")]
    InvalidRequest(String),
    /// The store failed outside any one item.
    #[error("redrive failed: {0}")]
    Store(ProcessError),
}

impl RedriveError {
    /// Returns its kind as a Lambda error type names it (`InvalidRequest`, `StoreError`).
    pub fn error_type(&self) -> &'static str {
        match self {
            RedriveError::InvalidRequest(_) => "InvalidRequest",
            RedriveError::Store(_) => "StoreError",
        }
    }
}

/// What a request selects and how it puts items back: everything but its pacing and its
/// token. A continuation token carries it, so that the run it resumes is the same request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(super) struct Selection {
    item_ids: Vec<String>,
    error_signature: Option<String>,
    error_class: Option<ErrorClass>,
    message_group_id: Option<String>,
    since: Option<String>,
    until: Option<String>,
    status: Option<ItemStatus>,
    force: bool,
    mode: RedriveMode,
    dry_run: bool,
}

impl Selection {
    /// Returns the names of the options where `self` and `other` differ.
    fn differences(&self, other: &Selection) -> Vec<&'static str> {
        let differ = [
            ("item_ids", self.item_ids != other.item_ids),
            (
                "error_signature",
                self.error_signature != other.error_signature,
            ),
            ("error_class", self.error_class != other.error_class),
            (
                "message_group_id",
                self.message_group_id != other.message_group_id,
            ),
            ("since", self.since != other.since),
            ("until", self.until != other.until),
            ("status", self.status != other.status),
            ("force", self.force != other.force),
            ("mode", self.mode != other.mode),
            ("dry_run", self.dry_run != other.dry_run),
        ];
        differ.iter().filter(|(_, d)| *d).map(|(n, _)| *n).collect()
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Continuation {
    /// The request the chain runs ([`RedriveRequest::resumed`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) request: Option<Selection>,
    /// With item ids: the index of the next id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) next_index: Option<usize>,
    /// With a query: the page token after the last record handled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) after: Option<String>,
    /// Which of the selection's queries the run was in (see [`Plan::filters`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) phase: usize,
    /// When the chain of runs began (epoch milliseconds): the selection never takes a
    /// record whose last attempt is later, so an item that failed again in the chain
    /// (which moves it to the end of the oldest-first order) is not taken twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) started_ms: Option<i64>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Continuation {
    pub(super) fn encode(&self) -> String {
        aws_smithy_types::base64::encode(serde_json::to_string(self).unwrap_or_default().as_bytes())
    }

    pub(super) fn decode(token: &str) -> Result<Continuation, RedriveError> {
        let bad =
            || RedriveError::InvalidRequest(format!("continuation token {token:?} is not valid"));
        let bytes = aws_smithy_types::base64::decode(token).map_err(|_| bad())?;
        serde_json::from_slice(&bytes).map_err(|_| bad())
    }
}

/// Most seconds a run may be given (a day): a larger budget is a mistake, and would overflow
/// the clock somewhere.
pub const MAX_TIME_BUDGET_SECS: u64 = 86_400;
/// Slowest and fastest pacing accepted, in items per second.
pub const RATE_RANGE: std::ops::RangeInclusive<f64> = 0.001..=10_000.0;

/// A validated request.
pub(super) struct Plan {
    /// The queries that select records, in order. By default (status `dead`) a second one
    /// takes back items whose redrive died holding its lease (`redriving`, lease expired).
    pub(super) filters: Vec<RecordFilter>,
    /// Exactly these items, each once (then the filters only filter).
    pub(super) ids: Vec<String>,
    /// Items in flight at once.
    pub(super) parallelism: usize,
    /// Least time between item starts (`rate`).
    pub(super) interval: Option<Duration>,
    /// Time to start items in.
    pub(super) budget: Duration,
    /// Where the previous run stopped.
    pub(super) continuation: Continuation,
}

impl Plan {
    /// Tells whether a record fetched by id is one this selection takes (eligibility aside:
    /// [`RedriveEngine`] reports an ineligible item as skipped, with the reason).
    pub(super) fn selects(&self, record: &DeadLetteredItem) -> bool {
        self.filters.iter().any(|f| {
            RecordFilter {
                eligible_only: false,
                ..f.clone()
            }
            .matches(record)
        })
    }
}

impl RedriveRequest {
    /// Returns what this request selects and how it puts items back.
    pub(super) fn selection(&self) -> Selection {
        Selection {
            item_ids: self.item_ids.clone(),
            error_signature: self.error_signature.clone(),
            error_class: self.error_class,
            message_group_id: self.message_group_id.clone(),
            since: self.since.clone(),
            until: self.until.clone(),
            status: self.status,
            force: self.force,
            mode: self.mode,
            dry_run: self.dry_run,
        }
    }

    /// Returns the request a continuation runs: the one its token carries. A request with a token
    /// and no selection of its own (`dlq redrive --continue <token>`, as a run prints it)
    /// takes the token's. One that names a selection must name the token's. Otherwise the
    /// token would resume a position in another selection, or run a dry run for real.
    pub fn resumed(&self) -> Result<RedriveRequest, RedriveError> {
        let Some(token) = self.continuation_token.as_deref() else {
            return Ok(self.clone());
        };
        if crate::mutants::is_on(crate::mutants::Mutant::ContinuationDropsSelection) {
            return Ok(self.clone());
        }
        let carried = Continuation::decode(token)?.request.ok_or_else(|| {
            RedriveError::InvalidRequest(
                "the continuation token does not say which request it continues; run the redrive again without it"
                    .into(),
            )
        })?;
        let own = self.selection();
        if own != Selection::default() && own != carried {
            return Err(RedriveError::InvalidRequest(format!(
                "the continuation token belongs to another request (it differs in {}); continue with the token alone, or start a new run without it",
                carried.differences(&own).join(", ")
            )));
        }
        let Selection {
            item_ids,
            error_signature,
            error_class,
            message_group_id,
            since,
            until,
            status,
            force,
            mode,
            dry_run,
        } = carried;
        Ok(RedriveRequest {
            item_ids,
            error_signature,
            error_class,
            message_group_id,
            since,
            until,
            status,
            force,
            mode,
            dry_run,
            ..self.clone()
        })
    }

    /// Returns the queries that select this request's records (its item ids aside), relative times
    /// read from `now`: what an operator's tool counts before a large run.
    pub fn record_filters(
        &self,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<RecordFilter>, RedriveError> {
        Ok(self.plan(now)?.filters)
    }

    /// Parses a request from JSON, with a clear error for unknown fields or bad values.
    pub fn from_json(text: &str) -> Result<RedriveRequest, RedriveError> {
        let invalid = |e: serde_json::Error| RedriveError::InvalidRequest(e.to_string());
        let value: serde_json::Value = serde_json::from_str(text).map_err(invalid)?;
        // serde would also fill the fields from an array, by position.
        if !value.is_object() {
            return Err(RedriveError::InvalidRequest(
                "expected a JSON object, e.g. {\"mode\":\"reprocess\",\"dry_run\":true}"
                    .to_string(),
            ));
        }
        serde_json::from_value(value).map_err(invalid)
    }

    /// Validates the request into a plan, its relative times (`since`, `until`) counted
    /// back from `now`; nothing is read or changed.
    pub(super) fn plan(&self, now: chrono::DateTime<chrono::Utc>) -> Result<Plan, RedriveError> {
        if let Some(status @ (ItemStatus::Requeued | ItemStatus::Resolved)) = self.status {
            return Err(RedriveError::InvalidRequest(format!(
                "status {status} cannot be redriven: a redrive takes dead items (and redriving ones whose run died). \
                 A requeued item is set back to dead when its message returns to the DLQ; list them with `dlq list --status {status}`"
            )));
        }
        let continuation = self
            .continuation_token
            .as_deref()
            .map(Continuation::decode)
            .transpose()?
            .unwrap_or_default();
        // A chain of runs (a continuation) selects what was there when it began, and
        // reads its relative times (`24h`) from then.
        let started = continuation
            .started_ms
            .and_then(chrono::DateTime::<chrono::Utc>::from_timestamp_millis)
            .unwrap_or(now);
        let (since, until) = self.time_range(started)?;
        let (parallelism, interval, budget) = self.pace()?;
        Ok(Plan {
            filters: self.filters(since, until, started, now),
            // Each id once: a repeat would be leased twice in one transaction, which
            // DynamoDB refuses for the whole chunk.
            ids: {
                let mut seen = std::collections::HashSet::new();
                self.item_ids
                    .iter()
                    .filter(|id| seen.insert(id.as_str()))
                    .cloned()
                    .collect()
            },
            parallelism,
            interval,
            budget,
            continuation: Continuation {
                started_ms: Some(started.timestamp_millis()),
                request: Some(self.selection()),
                ..continuation
            },
        })
    }

    /// `since` and `until`, read from `started` when relative.
    fn time_range(
        &self,
        started: chrono::DateTime<chrono::Utc>,
    ) -> Result<TimeRange, RedriveError> {
        let read = |text: &Option<String>, name: &str| {
            text.as_deref()
                .map(|t| crate::duration::parse_time(t, started))
                .transpose()
                .map_err(|e| RedriveError::InvalidRequest(format!("{name}: {e}")))
        };
        let since = read(&self.since, "since")?;
        let until = read(&self.until, "until")?;
        if let (Some(s), Some(u)) = (since, until) {
            if s > u {
                return Err(RedriveError::InvalidRequest(
                    "since is after until".to_string(),
                ));
            }
        }
        Ok((since, until))
    }

    /// Returns the run's parallelism, its interval between items (from `rate`) and its time
    /// budget, each checked against its range, and the other bounds of the request.
    fn pace(&self) -> Result<(usize, Option<Duration>, Duration), RedriveError> {
        let invalid = |m: String| Err(RedriveError::InvalidRequest(m));
        let parallelism = self.parallelism.unwrap_or(4);
        if !(1..=64).contains(&parallelism) {
            return invalid(format!("parallelism {parallelism} is out of range 1-64"));
        }
        let interval = match self.rate {
            Some(rate) if RATE_RANGE.contains(&rate) => Some(Duration::from_secs_f64(1.0 / rate)),
            Some(rate) => {
                let (low, high) = (RATE_RANGE.start(), RATE_RANGE.end());
                return invalid(format!(
                    "rate {rate} is out of range: expected {low} to {high} items per second"
                ));
            }
            None => None,
        };
        if self.max_items == Some(0) {
            return invalid("max_items must be at least 1".to_string());
        }
        let budget_secs = self.time_budget_secs.unwrap_or(600);
        if !(1..=MAX_TIME_BUDGET_SECS).contains(&budget_secs) {
            return invalid(format!(
                "time_budget_secs {budget_secs} is out of range: expected 1 to {MAX_TIME_BUDGET_SECS} (a day)"
            ));
        }
        if self.item_ids.iter().any(|id| id.is_empty()) {
            return invalid("item_ids must not contain empty ids".to_string());
        }
        Ok((parallelism, interval, Duration::from_secs(budget_secs)))
    }

    /// Returns the queries of the selection, in the order a run reads them.
    fn filters(
        &self,
        since: Option<chrono::DateTime<chrono::Utc>>,
        until: Option<chrono::DateTime<chrono::Utc>>,
        started: chrono::DateTime<chrono::Utc>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Vec<RecordFilter> {
        // (Never before `since`: a range DynamoDB would refuse; one in the future selects
        // nothing either way.)
        let until = Some(
            until
                .map_or(started, |u| u.min(started))
                .max(since.unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC)),
        );
        let base = RecordFilter {
            status: Some(self.status.unwrap_or(ItemStatus::Dead)),
            signature: self.error_signature.clone(),
            class: self.error_class,
            since,
            until,
            // Ineligible records are not even read unless forced: counted against
            // `max_items`, newer validation failures would starve older eligible items.
            eligible_only: !self.force,
            message_group: self.message_group_id.clone(),
            lease_expired_before: None,
            // Oldest first: an item that fails again goes to the back, and the items that
            // keep failing cannot head every scheduled run.
            oldest_first: true,
        };
        // Items a dead run left leased first: they are few, and behind a dead selection
        // that never runs out (items that keep failing) they would never be taken back.
        let mut filters = Vec::new();
        if self.status.is_none()
            && !crate::mutants::is_on(crate::mutants::Mutant::LeasesNeverTakenBack)
        {
            filters.push(RecordFilter {
                status: Some(ItemStatus::Redriving),
                lease_expired_before: Some(now.timestamp()),
                // Ineligible ones too (a forced run left them): they are taken back and
                // set dead, never reprocessed unless forced.
                eligible_only: crate::mutants::is_on(
                    crate::mutants::Mutant::IneligibleLeasesNeverTakenBack,
                ) && !self.force,
                ..base.clone()
            });
        }
        filters.push(base);
        filters
    }
}

/// A request's `since` and `until`, read.
type TimeRange = (
    Option<chrono::DateTime<chrono::Utc>>,
    Option<chrono::DateTime<chrono::Utc>>,
);
