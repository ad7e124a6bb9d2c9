//! What a handler can ask and tell about the record it is processing, without threading a
//! context argument through its code: the invocation's deadline, and custom metrics and
//! log fields that the worker writes with its own lines.
//!
//! The batch engine runs each record inside a [`RecordContext`] scope (a tokio task-local,
//! set on every poll of that record's future, so records processed concurrently in one
//! task each see their own). Outside the engine (a unit test calling a processor directly)
//! the functions here do nothing and [`deadline`] is `None`.
//!
//! - [`add_metric`]: an EMF metric in the worker's namespace with the `FunctionName`
//!   dimension, in the invocation's EMF lines (values of one name are collected across
//!   the batch, as EMF arrays).
//! - [`add_field`]: a key on the worker's log lines for this record (the `record finished`
//!   line, and the failure lines), flat beside the worker's own keys in the JSON format.
//!
//! ```
//! use sqs_keeper_core::{context, Outcome, ProcessError, WorkItem};
//!
//! async fn handle(item: &WorkItem) -> Result<Outcome, ProcessError> {
//!     let order: serde_json::Value = item.json()?;
//!     context::add_field("customer", order["customer"].clone());
//!     context::add_metric("OrderValue", context::Unit::None, 42.0);
//!     Ok(Outcome::Done)
//! }
//! ```

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, SystemTime};

use serde_json::{Map, Value};

tokio::task_local! {
    static RECORD: RecordContext;
    static INVOCATION: Arc<MetricSink>;
}

/// The key under which a record's custom fields travel on a log event: the JSON log
/// format writes the object's keys flat beside the line's own.
pub const FIELDS_KEY: &str = "handler_fields";

/// Runs one invocation's `work` with `sink` collecting the custom metrics of its records.
pub async fn with_invocation_metrics<F: std::future::Future>(
    sink: Arc<MetricSink>,
    work: F,
) -> F::Output {
    INVOCATION.scope(sink, work).await
}

/// Returns the running invocation's metric sink, or a new one outside an invocation.
pub fn invocation_metrics() -> Arc<MetricSink> {
    INVOCATION.try_with(Arc::clone).unwrap_or_default()
}

/// Returns the current record's custom fields as a JSON object, or `None` when it has none (or
/// outside the worker).
pub fn fields_json() -> Option<String> {
    RECORD
        .try_with(|c| {
            c.fields
                .lock()
                .ok()
                .filter(|f| !f.is_empty())
                .map(|f| Value::Object(f.clone()).to_string())
        })
        .ok()
        .flatten()
}

/// The unit of a custom metric, as CloudWatch names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[non_exhaustive]
pub enum Unit {
    /// A count.
    Count,
    /// Milliseconds.
    Milliseconds,
    /// Seconds.
    Seconds,
    /// Bytes.
    Bytes,
    /// A percentage.
    Percent,
    /// No unit.
    None,
}

impl Unit {
    /// Returns the name CloudWatch uses.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Metric names the worker writes itself; a custom metric may not take one.
pub const RESERVED_METRICS: &[&str] = &[
    "Records",
    "Done",
    "Skipped",
    "RetryLater",
    "DeadLettered",
    "DeadLetterFailed",
    "NotStarted",
    "ReportedFailures",
    "ColdStart",
    "BatchDuration",
    "RecordProcessingTime",
    "FailedRecords",
    "FunctionName",
    "ErrorClass",
    "SqsRequests",
    "DynamoDbRequests",
    "DynamoDbReadUnits",
    "DynamoDbWriteUnits",
    "S3Requests",
    "SecretsManagerRequests",
];

/// The most distinct custom metric names one invocation keeps (EMF allows 100 metrics per
/// document; the worker's own take the rest of the first).
pub const MAX_CUSTOM_METRICS: usize = 50;

/// The most custom log fields one record keeps.
pub const MAX_FIELDS: usize = 32;

/// Custom metrics collected over one invocation: per name, its unit and values.
#[derive(Debug, Default)]
pub struct MetricSink {
    metrics: Mutex<Vec<CustomMetric>>,
}

/// One custom metric's values in one invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct CustomMetric {
    /// Its name.
    pub name: String,
    /// Its unit (the first one given for the name).
    pub unit: Unit,
    /// Its values, in the order they were added.
    pub values: Vec<f64>,
}

impl MetricSink {
    /// Adds one value; ignored (with a warning) for a reserved or invalid name, a value
    /// that is not finite, or a name beyond [`MAX_CUSTOM_METRICS`].
    pub fn add(&self, name: &str, unit: Unit, value: f64) {
        let valid_name = !name.is_empty()
            && name.len() <= 255
            && !name.starts_with('_')
            && !RESERVED_METRICS.contains(&name);
        if !valid_name || !value.is_finite() {
            tracing::warn!(metric = %name, value, "custom metric ignored: reserved or invalid name, or a value that is not a finite number");
            return;
        }
        let Ok(mut metrics) = self.metrics.lock() else {
            return;
        };
        // The library's own tallies take none of the handler's names.
        let handlers = metrics
            .iter()
            .filter(|m| !RESERVED_METRICS.contains(&m.name.as_str()))
            .count();
        if let Some(metric) = metrics.iter_mut().find(|m| m.name == name) {
            metric.values.push(value);
        } else if handlers < MAX_CUSTOM_METRICS {
            metrics.push(CustomMetric {
                name: name.to_string(),
                unit,
                values: vec![value],
            });
        } else {
            tracing::warn!(metric = %name, "custom metric ignored: more than {MAX_CUSTOM_METRICS} names in one invocation");
        }
    }

    /// Adds `value` to the one total `name` keeps, for the library's own counts (such as the
    /// AWS requests an invocation made). Unlike [`MetricSink::add`], it takes the names the
    /// library reserves, and never makes a second value: the document carries one sum.
    pub fn tally(&self, name: &str, unit: Unit, value: f64) {
        let Ok(mut metrics) = self.metrics.lock() else {
            return;
        };
        match metrics.iter_mut().find(|m| m.name == name) {
            Some(metric) => match metric.values.first_mut() {
                Some(total) => *total += value,
                None => metric.values.push(value),
            },
            None => metrics.push(CustomMetric {
                name: name.to_string(),
                unit,
                values: vec![value],
            }),
        }
    }

    /// Takes everything collected, emptying the sink.
    pub fn take(&self) -> Vec<CustomMetric> {
        self.metrics
            .lock()
            .map(|mut m| std::mem::take(&mut *m))
            .unwrap_or_default()
    }
}

/// The context of one record being processed.
#[derive(Debug)]
pub struct RecordContext {
    deadline: SystemTime,
    hard_stop: SystemTime,
    metrics: Arc<MetricSink>,
    fields: Mutex<Map<String, Value>>,
    cut: Arc<CutState>,
    /// The wall clock the deadlines are measured by ([`remaining`]).
    clock: crate::clock::Clock,
}

/// How the invocation's cut-off reaches a record's attempt (docs/ARCHITECTURE.md §1.7).
///
/// The engine cuts an attempt at the cut-off by dropping it, unless sections are open in
/// it: an [`until_cut`] (the user's work, run by a layer that must see it end: the circuit
/// breaker counts it, an idempotency claim is released) or a [`finishing`] section (a
/// layer's bookkeeping after the work, such as an idempotency completion, which must not be
/// lost to the cut-off once the side effect happened). Then the engine marks the cut-off
/// passed and polls on until the hard stop.
///
/// Sections form a tree that follows the code's nesting (a task-local names the section a
/// future runs in, so the children of a `join_all` or `buffer_unordered` are siblings).
/// Past the cut-off, every place that can cut (each `until_cut`, and the engine at the
/// root) cuts its work as soon as no section is open directly inside it: the innermost
/// user work ends at once, a layer's bookkeeping runs to its end, and the user's code that
/// would run after that bookkeeping is cut by the section around it, or by the engine.
#[derive(Debug, Default)]
struct CutState {
    /// The engine reached the cut-off and left the attempt to end itself.
    passed: AtomicBool,
    /// The attempt itself: the engine's place to cut.
    root: Arc<SectionNode>,
    /// The `until_cut` sections opened, woken when the cut-off passes (weak: a closed one
    /// is simply gone).
    cut_points: Mutex<Vec<std::sync::Weak<SectionNode>>>,
}

/// One place the attempt can be cut: the sections open directly inside it, and the waker
/// of the future that cuts there.
#[derive(Debug, Default)]
struct SectionNode {
    open_inside: AtomicU32,
    waker: futures::task::AtomicWaker,
}

tokio::task_local! {
    /// The `until_cut` section the current future runs in (none: the attempt itself).
    static SECTION: Arc<SectionNode>;
}

impl CutState {
    /// Opens a section inside the current one; closed when the guard is dropped (also when
    /// the section's future is dropped at the hard stop).
    fn open(&self) -> OpenSection {
        let parent = SECTION
            .try_with(Arc::clone)
            .unwrap_or_else(|_| self.root.clone());
        parent.open_inside.fetch_add(1, Ordering::SeqCst);
        OpenSection { parent }
    }

    fn add_cut_point(&self, node: &Arc<SectionNode>) {
        if let Ok(mut points) = self.cut_points.lock() {
            if points.len() >= 64 {
                points.retain(|p| p.strong_count() > 0);
            }
            points.push(Arc::downgrade(node));
        }
    }

    /// Tells whether the work of `node` is to be cut now (its waker registered first, so that a
    /// section closing inside it or the cut-off passing polls it again).
    fn cuts(&self, node: &SectionNode, waker: &std::task::Waker) -> bool {
        node.waker.register(waker);
        self.passed.load(Ordering::SeqCst) && node.open_inside.load(Ordering::SeqCst) == 0
    }
}

/// An open section; dropping it closes it and wakes the place that may cut around it.
struct OpenSection {
    parent: Arc<SectionNode>,
}

impl Drop for OpenSection {
    fn drop(&mut self) {
        self.parent.open_inside.fetch_sub(1, Ordering::SeqCst);
        self.parent.waker.wake();
    }
}

impl RecordContext {
    /// Creates a context for a record of an invocation whose cut-off is `deadline` and which ends
    /// at `hard_stop` (see [`crate::retry::Deadline`]), adding its metrics to `metrics`.
    pub fn new(deadline: SystemTime, hard_stop: SystemTime, metrics: Arc<MetricSink>) -> Self {
        RecordContext {
            deadline,
            hard_stop: hard_stop.max(deadline),
            metrics,
            fields: Mutex::new(Map::new()),
            cut: Arc::default(),
            clock: crate::clock::Clock::default(),
        }
    }

    /// Measures the time left before the deadline ([`remaining`]) by `clock`, the one the
    /// deadlines were read by (the system clock unless set).
    pub fn with_clock(mut self, clock: crate::clock::Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Runs `work` with this context as the current record's.
    pub async fn scope<F: std::future::Future>(self, work: F) -> (F::Output, Map<String, Value>) {
        RECORD
            .scope(self, async move {
                let output = work.await;
                let fields = RECORD
                    .try_with(|c| {
                        c.fields
                            .lock()
                            .map(|mut f| std::mem::take(&mut *f))
                            .unwrap_or_default()
                    })
                    .unwrap_or_default();
                (output, fields)
            })
            .await
    }
}

/// Returns the time by which the record's work must be over: the invocation's cut-off (the
/// Lambda deadline less the worker's margin). `None` outside the worker.
pub fn deadline() -> Option<SystemTime> {
    RECORD.try_with(|c| c.deadline).ok()
}

/// Returns the last moment the invocation can still answer (just before the Lambda deadline):
/// what a claim on the record's work lasts until. `None` outside the worker.
pub fn hard_stop() -> Option<SystemTime> {
    RECORD.try_with(|c| c.hard_stop).ok()
}

/// Returns the time left before [`deadline`]; `None` outside the worker.
pub fn remaining() -> Option<Duration> {
    RECORD
        .try_with(|c| {
            c.deadline
                .duration_since(c.clock.system_time())
                .unwrap_or(Duration::ZERO)
        })
        .ok()
}

/// Runs the user's `work` so that the invocation's cut-off ends it: `None` when it was
/// cut there. Unlike the engine's own cut, the caller then goes on (until the hard stop)
/// and can account for the cut attempt. Outside the worker it is `work` itself.
///
/// Past the cut-off the work is cut as soon as no section is open inside it (a nested
/// layer's `until_cut` or `finishing`): the innermost work ends first, and a layer's
/// bookkeeping inside is never cut.
pub(crate) async fn until_cut<F: Future>(work: F) -> Option<F::Output> {
    let Ok(state) = RECORD.try_with(|c| c.cut.clone()) else {
        return Some(work.await);
    };
    if state.passed.load(Ordering::SeqCst) {
        // Opened after the cut-off (the next item of a stream, a second step): the work
        // never starts.
        return None;
    }
    let _open = state.open();
    let node = Arc::new(SectionNode::default());
    state.add_cut_point(&node);
    let mut work = std::pin::pin!(SECTION.scope(node.clone(), work));
    std::future::poll_fn(|cx| {
        if let Poll::Ready(output) = work.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        if state.cuts(&node, cx.waker()) {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    })
    .await
}

/// Tells whether the current record's cut-off has passed and its attempt is ending itself: a
/// layer starts no new work then (an idempotency claim is not taken). `false` outside the
/// worker.
pub(crate) fn cutoff_passed() -> bool {
    RECORD
        .try_with(|c| c.cut.passed.load(Ordering::SeqCst))
        .unwrap_or(false)
}

/// Runs a layer's bookkeeping after the work (a completion, a failure count) so that the
/// cut-off does not drop it: the engine lets it run until the hard stop.
pub(crate) async fn finishing<F: Future>(work: F) -> F::Output {
    let Ok(state) = RECORD.try_with(|c| c.cut.clone()) else {
        return work.await;
    };
    let _open = state.open();
    work.await
}

/// Passes the cut-off for the engine: `true` when the attempt ends itself (a section is open in
/// it), which is then told the cut-off has passed and must be polled on with
/// [`past_cutoff`]; `false` when it is to be dropped.
pub(crate) fn pass_cutoff() -> bool {
    let Ok(state) = RECORD.try_with(|c| c.cut.clone()) else {
        return false;
    };
    if state.root.open_inside.load(Ordering::SeqCst) == 0 {
        return false;
    }
    state.passed.store(true, Ordering::SeqCst);
    let points: Vec<_> = state
        .cut_points
        .lock()
        .map(|p| p.iter().filter_map(std::sync::Weak::upgrade).collect())
        .unwrap_or_default();
    for point in points {
        point.waker.wake();
    }
    true
}

/// Returns the output of the engine's attempt after [`pass_cutoff`]: polled until it ends, or `None` once no
/// section is open in it (the user's code that runs on after the layers' bookkeeping is
/// cut there).
pub(crate) async fn past_cutoff<F: Future>(work: F) -> Option<F::Output> {
    let Ok(state) = RECORD.try_with(|c| c.cut.clone()) else {
        return Some(work.await);
    };
    let mut work = std::pin::pin!(work);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(output) = work.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        if state.cuts(&state.root, cx.waker()) {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    })
    .await
}

/// Adds a value to a custom metric of this invocation (see the module's documentation).
pub fn add_metric(name: &str, unit: Unit, value: f64) {
    if crate::breaker::METRICS.contains(&name) {
        tracing::warn!(metric = %name, "custom metric ignored: the circuit breaker writes this name");
        return;
    }
    add_own_metric(name, unit, value);
}

/// [`add_metric`] for the library's own metrics (the breaker's), which a handler's may
/// not take.
pub(crate) fn add_own_metric(name: &str, unit: Unit, value: f64) {
    let _ = RECORD.try_with(|c| c.metrics.add(name, unit, value));
}

/// Adds a key to this record's log lines. Keys the worker writes itself (`message`,
/// `level`, `timestamp`, `message_id`, `item_id`, ...) are not replaced.
pub fn add_field(key: &str, value: impl Into<Value>) {
    let value = value.into();
    let _ = RECORD.try_with(|c| {
        if let Ok(mut fields) = c.fields.lock() {
            if fields.len() < MAX_FIELDS || fields.contains_key(key) {
                fields.insert(key.to_string(), value);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The library's own counts (the AWS requests of an invocation) keep one sum per name,
    /// under names a handler may not take.
    #[test]
    fn a_tally_keeps_one_sum_under_a_name_handlers_may_not_take() {
        let sink = MetricSink::default();
        sink.tally("SqsRequests", Unit::Count, 1.0);
        sink.tally("SqsRequests", Unit::Count, 3.0);
        sink.add("SqsRequests", Unit::Count, 100.0);
        sink.tally("S3Requests", Unit::Count, 1.0);
        let taken = sink.take();
        assert_eq!(taken.len(), 2);
        assert_eq!(taken[0].name, "SqsRequests");
        assert_eq!(
            taken[0].values,
            [4.0],
            "one sum; the handler's add was refused"
        );
        assert_eq!(taken[1].values, [1.0]);
        // Tallies first, then a handler's full allowance of names: every one is kept.
        sink.tally("SqsRequests", Unit::Count, 1.0);
        for n in 0..MAX_CUSTOM_METRICS {
            sink.add(&format!("m{n}"), Unit::Count, 1.0);
        }
        assert_eq!(sink.take().len(), MAX_CUSTOM_METRICS + 1);
    }

    #[tokio::test]
    async fn each_record_sees_its_own_fields_and_shares_the_metrics() {
        let sink = Arc::new(MetricSink::default());
        let deadline = SystemTime::now() + Duration::from_secs(30);
        let record = |n: u32| {
            let sink = sink.clone();
            async move {
                RecordContext::new(deadline, deadline + Duration::from_secs(1), sink)
                    .scope(async move {
                        add_field("n", n);
                        tokio::task::yield_now().await;
                        add_metric("Widgets", Unit::Count, f64::from(n));
                        assert_eq!(self::deadline(), Some(deadline));
                        assert!(remaining().unwrap() > Duration::from_secs(20));
                    })
                    .await
                    .1
            }
        };
        let (a, b) = tokio::join!(record(1), record(2));
        assert_eq!(a["n"], 1);
        assert_eq!(b["n"], 2);
        let metrics = sink.take();
        assert_eq!(metrics.len(), 1);
        assert_eq!(metrics[0].name, "Widgets");
        let mut values = metrics[0].values.clone();
        values.sort_by(f64::total_cmp);
        assert_eq!(values, [1.0, 2.0]);
    }

    /// A handler's metric named like the breaker's would add to its counts: it is ignored,
    /// and the breaker's own still counts.
    #[tokio::test]
    async fn a_handlers_metric_may_not_take_the_breakers_names() {
        let sink = Arc::new(MetricSink::default());
        let deadline = SystemTime::now() + Duration::from_secs(30);
        RecordContext::new(deadline, deadline + Duration::from_secs(1), sink.clone())
            .scope(async {
                add_metric("BreakerOpened", Unit::Count, 1.0);
                add_own_metric("BreakerRefused", Unit::Count, 1.0);
            })
            .await;
        let names: Vec<String> = sink.take().into_iter().map(|m| m.name).collect();
        assert_eq!(names, ["BreakerRefused"]);
    }

    #[test]
    fn outside_the_worker_nothing_happens() {
        add_field("x", 1);
        add_metric("X", Unit::Count, 1.0);
        assert_eq!(deadline(), None);
        assert_eq!(remaining(), None);
    }

    #[test]
    fn reserved_invalid_and_excess_metrics_are_ignored() {
        let sink = MetricSink::default();
        sink.add("Done", Unit::Count, 1.0);
        sink.add("", Unit::Count, 1.0);
        sink.add("_aws", Unit::Count, 1.0);
        sink.add("Nan", Unit::Count, f64::NAN);
        assert!(sink.take().is_empty());
        for n in 0..=MAX_CUSTOM_METRICS {
            sink.add(&format!("M{n}"), Unit::Count, 1.0);
        }
        assert_eq!(sink.take().len(), MAX_CUSTOM_METRICS);
    }
}
