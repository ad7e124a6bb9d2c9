//! One simulated run, from its seed: the producer, the event source mapping's pollers, the
//! worker, the downstream, the faults and the operators all run as tasks on one thread
//! under tokio's paused clock, so an afternoon of pipeline time takes milliseconds and the
//! same seed makes the same run. At the end the faults heal, the queue drains, the leases
//! of runs that died expire, the schedule runs, and the end-state invariants are checked
//! ([`crate::check`]).

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::sqs::SqsEvent;
use sqs_keeper_core::dead_letter::InvocationInfo;
use sqs_keeper_core::envelope::Envelope;
use sqs_keeper_core::mutants::Mutant;
use sqs_keeper_core::recording::RecordingSettings;
use sqs_keeper_core::redelivery::RedeliveryPolicy;
use sqs_keeper_core::{breaker::Breaker, breaker::BreakerPolicy};
use sqs_keeper_core::{clock::Clock, random::Random, BatchConfig, BatchProcessor};
use sqs_keeper_core::{idempotency::Idempotency, idempotency::Idempotent};
use sqs_keeper_core::{item::BodyFormat, item::ItemIdSource, item::ItemParser};
use sqs_keeper_core::{
    redrive::RedriveEngine, redrive::RedriveMode, redrive::RedriveRequest, redrive::RedriveSettings,
};
use sqs_keeper_core::{retry::Deadline, retry::Jitter, retry::RetryPolicy};
use sqs_keeper_core::{testing::MemoryBreakerStore, testing::MemoryIdempotencyStore};
use tokio::time::{sleep, Instant};

use crate::breaker_store::SimBreakerStore;
use crate::downstream::{Behaviour, Downstream};
use crate::family::Family;
use crate::idempotency_store::SimIdempotencyStore;
use crate::store::{
    sim_store, to_sqs_message, SimResolver, SimStore, SimVisibility, BUCKET, PRODUCER_BUCKET,
};
use crate::world::{Checks, Section, State, Stats, World};
use sqs_keeper_core::{testing::Queue, testing::QueueMessage};

/// The Lambda function's timeout.
const FUNCTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Time the worker keeps free before its deadline (`WORKER_DEADLINE_MARGIN_MS`).
const DEADLINE_MARGIN: Duration = Duration::from_secs(2);
/// The source queue's visibility timeout (6 × the function timeout).
pub(crate) const VISIBILITY: Duration = Duration::from_secs(180);
/// The source queue's redrive policy.
const MAX_RECEIVE_COUNT: u32 = 5;
/// How long a redrive's lease lasts: the default, or (some worlds) one shorter than a
/// slow item's attempts, so that the lease cut is what keeps two runs apart.
const LEASE_TTLS: [Duration; 2] = [Duration::from_secs(900), Duration::from_secs(150)];
/// How long the redrive function may run.
const REDRIVE_FUNCTION_TIMEOUT: Duration = Duration::from_secs(900);
/// The longest the queue may take to drain once the faults are over.
const DRAIN_LIMIT: Duration = Duration::from_secs(24 * 3600);

/// What one seed's run found.
#[derive(Debug)]
pub struct RunReport {
    /// The seed.
    pub seed: u64,
    /// Broken invariants: (item, what).
    pub violations: Vec<(String, String)>,
    /// The events that concern the first broken invariant's item.
    pub trace: String,
    /// Counters.
    pub stats: Stats,
    /// Events traced.
    pub events: usize,
    /// Messages the producer sent.
    pub sent: usize,
}

/// Silences the panics of the simulated handler (`downstream::HANDLER_PANIC`), which the
/// worker catches by design, and keeps every other panic's report.
fn quiet_handler_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = sqs_keeper_core::batch::panic_message(info.payload());
            if !message.starts_with(crate::downstream::HANDLER_PANIC) {
                previous(info);
            }
        }));
    });
}

/// When every world starts, by its wall clock.
const WORLD_START: i64 = 1_767_225_600;

/// Runs the world of `seed` with `mutants` switched on; deterministic for a seed.
pub fn run_seed(seed: u64, mutants: &[Mutant]) -> RunReport {
    quiet_handler_panics();
    sqs_keeper_core::mutants::switch_on(mutants);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build();
    let report = match runtime {
        Ok(runtime) => {
            // Wall time follows the runtime's paused clock from the world's start (made in
            // the runtime, whose clock it follows), and the library's own randomness
            // (backoff jitter, run ids, ...) follows the seed too.
            let clock = {
                let _in_runtime = runtime.enter();
                Clock::following_tokio(
                    chrono::DateTime::from_timestamp(WORLD_START, 0).unwrap_or_default(),
                )
            };
            let world = Arc::new(
                World::new(crate::world::new_state(
                    seed,
                    Queue::new("orders", None),
                    Queue::new("orders-dlq", None),
                ))
                .with_clock(clock)
                .with_random(Random::seeded(seed)),
            );
            // Every log line of the world is read for payloads (§1.9).
            use tracing_subscriber::layer::SubscriberExt as _;
            let logs =
                tracing_subscriber::registry().with(crate::logs::PayloadWatch::new(world.clone()));
            let outcome = tracing::subscriber::with_default(logs, || {
                std::panic::catch_unwind(AssertUnwindSafe(|| {
                    runtime.block_on(simulate(seed, world.clone()))
                }))
            });
            if let Err(panic) = outcome {
                let message = sqs_keeper_core::batch::panic_message(&*panic);
                world
                    .lock()
                    .violate(Section::NoPanic, "-", format!("panic: {message}"));
            }
            report_of(seed, &world)
        }
        Err(e) => RunReport {
            seed,
            violations: vec![("-".into(), format!("no runtime: {e}"))],
            trace: String::new(),
            stats: Stats::default(),
            events: 0,
            sent: 0,
        },
    };
    sqs_keeper_core::mutants::switch_on(&[]);
    report
}

/// Events shown for a failure: `SIM_TRACE_EVENTS`, 60 by default.
fn trace_limit() -> usize {
    std::env::var("SIM_TRACE_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
}

fn report_of(seed: u64, world: &World) -> RunReport {
    let state = world.lock();
    let items: Vec<String> = state
        .ext
        .violations
        .first()
        .map(|(item, _)| vec![item.clone()])
        .unwrap_or_default();
    RunReport {
        seed,
        violations: state.ext.violations.clone(),
        trace: if items.is_empty() {
            String::new()
        } else {
            state.ext.trace.relevant(&items, trace_limit())
        },
        stats: state.ext.stats.clone(),
        events: state.ext.trace.len(),
        sent: state.ext.ledger.sent.len(),
    }
}

/// The world's shape, drawn from the seed.
#[derive(Debug, Clone)]
struct Shape {
    fifo: bool,
    messages: usize,
    batch_size: usize,
    pollers: usize,
    skip_group_on_error: bool,
    crash_rate: f64,
    double_invoke_rate: f64,
    duplicate_rate: f64,
    /// Production store limits (a history of 50, 64 KiB inline), bodies around 64 KiB, ten
    /// 3 KB attributes and verbose error responses: records near DynamoDB's 400 KB.
    big: bool,
    /// Redelivery spacing (`WORKER_REDELIVERY_BASE_SECS`): base, multiplier and cap.
    spacing: Option<RedeliveryPolicy>,
    /// The source queue's retention: four days, or (some spaced worlds) 1–3 hours, short
    /// enough for the spacing to reach it.
    retention: Duration,
    /// The redrive's lease.
    lease_ttl: Duration,
    /// Records per page of a query (DynamoDB ends a page at 1 MB; a small page makes every
    /// listing and selection go past its first page).
    page_size: i32,
    /// The worker's circuit breaker (shared by its sandboxes, one per poller).
    breaker: Option<BreakerPolicy>,
    /// Idempotency by item id, in the worker and the redrive (its table shared). The
    /// producer then never reuses an item id for another payload: a handler that declares
    /// work once per item id skips the second as done, by design.
    idempotency: bool,
    /// The producer offloads some payloads to its bucket and sends Extended-Client
    /// pointers in their place, which the worker and the redrive follow.
    pointers: bool,
    /// The producer wraps every payload in this envelope (an SNS topic or an EventBridge
    /// rule in front of the queue), which the worker and the redrive unwrap.
    envelope: Option<Envelope>,
    /// The worker dead-letters this many deliveries before the last one SQS would make.
    receive_budget_margin: u32,
    /// Invocations one sandbox serves at once: 1 on classic Lambda; 2 or 3 on Lambda
    /// Managed Instances (`AWS_LAMBDA_MAX_CONCURRENCY`), where that many pollers share one
    /// engine, one breaker cache and one idempotency view, as one process's invocations do.
    invocations_per_sandbox: usize,
    /// The share of messages whose item id is one sent before (with a new body).
    reuse_rate: f64,
    /// Whether more than half the payloads fail: the healthy ones become flaky below a
    /// share, so that items gather histories long enough to compact.
    failing: bool,
    /// Seconds between two operators' actions: at least, and at most.
    operator_gap: (u64, u64),
    /// Whether the operators' plain runs become purges and clears, most racing the schedule.
    operator_races: bool,
    /// Seconds between two changes of the faults: at least, and at most.
    fault_gap: (u64, u64),
    /// The SQS calls' failure rate from the world's start, before the first change.
    first_send_faults: f64,
    /// The DynamoDB failure rates a change of the faults draws from: the last one, 1.0 in
    /// the `breaker` worlds, is a table unavailable for minutes (a sandbox out of touch
    /// with the breaker's table keeps a breaker of its own).
    table_fault_rates: [f64; 4],
    /// The failures a record keeps before compaction drops the oldest (4, or the
    /// production store's 50 in the big worlds).
    history_limit: usize,
    /// The share of healthy payloads whose handler panics on every call (`doomed`): only in
    /// the `breaker` worlds, where a probe run must look past such an item.
    doomed_rate: f64,
    /// Whether an outage after the drain opens the workers' breaker, so that the schedule's
    /// runs after it must probe (half the `breaker` worlds).
    late_outage: bool,
}

fn shape_of(rng: &mut fastrand::Rng) -> Shape {
    Shape {
        fifo: rng.f64() < 0.25,
        messages: rng.usize(8..30),
        batch_size: rng.usize(1..11),
        pollers: rng.usize(1..4),
        skip_group_on_error: rng.bool(),
        crash_rate: [0.0, 0.05, 0.15][rng.usize(0..3)],
        double_invoke_rate: [0.0, 0.05, 0.1][rng.usize(0..3)],
        duplicate_rate: [0.0, 0.05][rng.usize(0..2)],
        big: false,
        spacing: None,
        retention: Duration::from_secs(4 * 86_400),
        lease_ttl: LEASE_TTLS[0],
        page_size: 100,
        breaker: None,
        idempotency: false,
        pointers: false,
        envelope: None,
        receive_budget_margin: 0,
        invocations_per_sandbox: 1,
        reuse_rate: 0.12,
        failing: false,
        operator_gap: (120, 1_200),
        operator_races: false,
        fault_gap: (60, 900),
        first_send_faults: 0.0,
        table_fault_rates: [0.0, 0.05, 0.2, 0.5],
        history_limit: 4,
        doomed_rate: 0.0,
        late_outage: false,
    }
}

/// The spacing and retention of a world, drawn apart from its other choices.
fn draw_spacing(shape: &mut Shape, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ 0x5ace);
    if rng.f64() < 0.5 {
        shape.spacing = Some(draw_redelivery(&mut rng));
        if rng.f64() < 0.6 {
            shape.retention = Duration::from_secs(rng.u64(3_600..10_800));
        }
    }
    shape.lease_ttl = LEASE_TTLS[usize::from(rng.f64() < 0.3)];
    shape.page_size = if rng.bool() { 3 } else { 100 };
    shape.breaker = (rng.f64() < 0.4).then_some(BREAKER);
    shape.idempotency = rng.f64() < 0.3;
}

/// Draws a redelivery spacing: a base of 30 s to 5 min, ×2 or ×3, a cap of 15 min to 4 h.
fn draw_redelivery(rng: &mut fastrand::Rng) -> RedeliveryPolicy {
    RedeliveryPolicy {
        base: Duration::from_secs([30, 60, 300][rng.usize(0..3)]),
        multiplier: rng.u32(2..4),
        max: Duration::from_secs([900, 3_600, 14_400][rng.usize(0..3)]),
    }
}

/// The worlds' circuit breaker.
const BREAKER: BreakerPolicy = BreakerPolicy {
    threshold: 3,
    window: Duration::from_secs(60),
    open_for: Duration::from_secs(60),
    max_open: Duration::from_secs(600),
    probe_for: Duration::from_secs(30),
    refresh: Duration::from_secs(5),
};

/// Draws the parts of a world of overlapping deliveries ([`Family::Twins`]).
fn twins(shape: &mut Shape, rng: &mut fastrand::Rng) {
    shape.pollers = 3;
    shape.double_invoke_rate = 0.2;
    shape.duplicate_rate = 0.15;
    shape.crash_rate = [0.05, 0.15][rng.usize(0..2)];
    shape.reuse_rate = 0.4;
    shape.failing = true;
    shape.fault_gap = (30, 300);
    shape.operator_gap = (60, 300);
}

/// Draws more often, in a focused family's worlds, the parts its kind of defect needs
/// ([`Family`]). The mixed worlds are left as drawn.
fn focus(shape: &mut Shape, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x0F0C_0500_5EED_0005);
    match Family::of(seed) {
        Family::Mixed => {}
        Family::Twins => twins(shape, &mut rng),
        Family::Compaction => {
            twins(shape, &mut rng);
            shape.history_limit = 2;
        }
        Family::Operators => {
            shape.operator_gap = (60, 300);
            shape.operator_races = true;
            shape.page_size = 3;
        }
        Family::Breaker => {
            shape.breaker = Some(BREAKER);
            shape.fault_gap = (30, 300);
            shape.pollers = 3;
            shape.invocations_per_sandbox = rng.usize(1..4);
            shape.table_fault_rates = [0.0, 0.2, 0.5, 1.0];
            shape.doomed_rate = 0.15;
            shape.late_outage = rng.bool();
        }
        Family::Retention => {
            shape.spacing = Some(draw_redelivery(&mut rng));
            shape.retention = Duration::from_secs(rng.u64(3_600..10_800));
            shape.breaker = Some(BREAKER);
            shape.pollers = 3;
            shape.invocations_per_sandbox = rng.usize(2..4);
            shape.fifo = rng.bool();
            shape.fault_gap = (30, 300);
            shape.first_send_faults = 0.3;
        }
    }
}

/// The downstream as one sandbox calls it: behind the circuit breaker in the worlds that
/// have one (its state shared by every sandbox).
#[derive(Debug)]
enum Guard {
    Plain(Downstream),
    Breaker(Box<Breaker<Downstream, SimBreakerStore>>),
}

impl sqs_keeper_core::Processor for Guard {
    async fn process(
        &self,
        item: &sqs_keeper_core::WorkItem,
    ) -> Result<sqs_keeper_core::Outcome, sqs_keeper_core::ProcessError> {
        match self {
            Guard::Plain(downstream) => downstream.process(item).await,
            Guard::Breaker(breaker) => breaker.process(item).await,
        }
    }
}

/// A processor, once per item id in the worlds with idempotency (outside the breaker, as
/// the runner composes them). Notes the deliveries whose work ended well (done, or skipped
/// as done before), so the checks can tell a record given back for its bookkeeping from
/// one given back undone.
#[derive(Debug)]
struct SimHandler<P> {
    inner: Handled<P>,
    world: Arc<World>,
}

#[derive(Debug)]
enum Handled<P> {
    Direct(P),
    Once(Box<Idempotent<P, SimIdempotencyStore>>),
}

impl<P: sqs_keeper_core::Processor> SimHandler<P> {
    fn new(inner: P, world: &Arc<World>, actor: &str) -> Self {
        let table = world.lock().ext.idempotency.clone();
        let inner = match table {
            Some(table) => Handled::Once(Box::new(Idempotent::new(
                inner,
                Idempotency::new(
                    SimIdempotencyStore::new(world.clone(), table, actor),
                    Duration::from_secs(86_400),
                )
                .with_clock(world.clock)
                .with_random(world.random.clone()),
            ))),
            None => Handled::Direct(inner),
        };
        SimHandler {
            inner,
            world: world.clone(),
        }
    }
}

impl<P: sqs_keeper_core::Processor> sqs_keeper_core::Processor for SimHandler<P> {
    async fn process(
        &self,
        item: &sqs_keeper_core::WorkItem,
    ) -> Result<sqs_keeper_core::Outcome, sqs_keeper_core::ProcessError> {
        let result = match &self.inner {
            Handled::Direct(p) => p.process(item).await,
            Handled::Once(p) => p.process(item).await,
        };
        if result.is_ok() {
            let receipt = format!("{}#{}", item.message_id, item.receive_count);
            self.world.lock().ext.ledger.handled.insert(receipt);
        }
        result
    }
}

type SimWorker = BatchProcessor<SimHandler<Guard>, SimStore>;

/// The parser of a world: the payload's `id`, inside the world's envelope.
fn parser(world: &World) -> ItemParser {
    ItemParser {
        id_source: ItemIdSource::JsonPointer("/id".into()),
        body_format: BodyFormat::Json,
        envelope: world.lock().ext.envelopes.clone(),
    }
}

fn retry_policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 3,
        base_delay: Duration::from_millis(200),
        max_delay: Duration::from_secs(2),
        retry_unknown: false,
        jitter: Jitter::Full,
        class_attempts: Default::default(),
        ..RetryPolicy::default()
    }
}

async fn simulate(seed: u64, world: Arc<World>) {
    let mut rng = fastrand::Rng::with_seed(seed.rotate_left(17) ^ 0x5eed);
    let mut shape = shape_of(&mut rng);
    // Drawn apart from the world's sequence, so that adding this shape left every other
    // seed's world as it was (the seeds that found defects still make the same worlds).
    shape.big = fastrand::Rng::with_seed(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)).f64() < 0.05;
    shape.pointers = fastrand::Rng::with_seed(seed ^ 0x00F0_1A7E_5EED_0001).f64() < 0.25;
    // A fifth of the other worlds put an envelope around every payload (their producers
    // are an SNS topic or an EventBridge rule; the Extended Client does not go through
    // either).
    let mut envelope_rng = fastrand::Rng::with_seed(seed ^ 0x0E57_E10F_5EED_0002);
    if !shape.pointers && envelope_rng.f64() < 0.2 {
        shape.envelope = Some([Envelope::Sns, Envelope::EventBridge][envelope_rng.usize(0..2)]);
    }
    // A third of the worlds keep a margin of one or two receives (a queue whose batches
    // may be invoked twice, or whose timeouts kill invocations).
    shape.receive_budget_margin =
        [0, 0, 0, 0, 1, 2][fastrand::Rng::with_seed(seed ^ 0x3A26_1B0D_5EED_0003).usize(0..6)];
    draw_spacing(&mut shape, seed);
    // A quarter of the worlds with two pollers or more run on Managed Instances (drawn
    // apart, so that the other draws stay as they were).
    let mut instances_rng = fastrand::Rng::with_seed(seed ^ 0x4D41_4E41_5EED_0004);
    if shape.pollers > 1 && instances_rng.f64() < 0.25 {
        shape.invocations_per_sandbox = instances_rng.usize(2..=shape.pollers);
    }
    focus(&mut shape, seed);
    {
        let mut state = world.lock();
        let name = if shape.fifo { "orders.fifo" } else { "orders" };
        *state.source_mut() = Queue::new(name, Some(MAX_RECEIVE_COUNT));
        state.source_mut().retention = shape.retention;
        state.ext.lease_ttl = shape.lease_ttl;
        state.ext.idempotency = shape.idempotency.then(MemoryIdempotencyStore::default);
        state.ext.ledger.breaker_open_for = shape.breaker.map(|policy| policy.open_for);
        state.page_size = shape.page_size;
        state.ext.envelopes =
            sqs_keeper_core::envelope::Envelopes(shape.envelope.into_iter().collect());
        state.ext.receive_budget_margin = shape.receive_budget_margin;
        state.faults.send = shape.first_send_faults;
        state.dlq = Queue::new(
            if shape.fifo {
                "orders-dlq.fifo"
            } else {
                "orders-dlq"
            },
            None,
        );
        state
            .ext
            .trace
            .note("world", "-", &format!("seed {seed}: {shape:?}"));
    }
    let store = sim_store(
        world.clone(),
        RecordingSettings {
            bucket: BUCKET.into(),
            inline_max_bytes: if shape.big { 65_536 } else { 2048 },
            history_limit: if shape.big {
                sqs_keeper_core::dead_letter::HISTORY_LIMIT
            } else {
                shape.history_limit
            },
            retention: Duration::from_secs(14 * 86_400),
            write_concurrency: 4,
            clock: world.clock,
        },
    );
    // One sandbox per poller: its own engine and breaker, the breaker's state shared.
    let breaker_state = MemoryBreakerStore::default();
    world.lock().ext.breaker = shape.breaker.map(|policy| (breaker_state.clone(), policy));
    let sandbox = |n: usize| {
        let name = format!("worker#{n}");
        let downstream = Downstream::new(world.clone(), &name);
        let guard = match shape.breaker {
            Some(policy) => Guard::Breaker(Box::new(
                Breaker::new(
                    downstream,
                    SimBreakerStore::new(world.clone(), breaker_state.clone(), &name),
                    policy,
                )
                .with_clock(world.clock),
            )),
            None => Guard::Plain(downstream),
        };
        let handler = SimHandler::new(guard, &world, &name);
        let mut worker = BatchProcessor::new(
            handler,
            store.as_actor(&name),
            BatchConfig {
                parser: parser(&world),
                retry: retry_policy(),
                concurrency: 4,
                max_receive_count: Some(MAX_RECEIVE_COUNT),
                receive_budget_margin: shape.receive_budget_margin,
                skip_group_on_error: shape.skip_group_on_error,
            }
            .with_clock(world.clock)
            .with_random(world.random.clone()),
        );
        if let Some(policy) = shape.spacing {
            worker =
                worker.with_redelivery(policy, Arc::new(SimVisibility::new(store.as_actor(&name))));
        }
        // Under a breaker the polling control may pause polling: the worker keeps a
        // quarter of each record's retention in reserve, as the runner configures it.
        if shape.breaker.is_some() {
            worker = worker.with_sweep_reserve(Arc::new(SimVisibility::new(store.as_actor(&name))));
        }
        let worker = worker.with_body_resolver(Arc::new(SimResolver::new(store.as_actor(&name))));
        Arc::new(worker)
    };
    let stop_pollers = Arc::new(AtomicBool::new(false));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let healed = Arc::new(AtomicBool::new(false));

    let producer = tokio::spawn(produce(world.clone(), shape.clone(), rng.u64(..)));
    let mut pollers = Vec::new();
    // On Managed Instances consecutive pollers are the concurrent invocations of one
    // sandbox: they share its engine.
    let per_sandbox = shape.invocations_per_sandbox.max(1);
    let sandboxes: Vec<_> = (0..shape.pollers.div_ceil(per_sandbox))
        .map(sandbox)
        .collect();
    for n in 0..shape.pollers {
        pollers.push(tokio::spawn(poll(
            world.clone(),
            sandboxes[n / per_sandbox].clone(),
            shape.clone(),
            n,
            rng.u64(..),
            stop_pollers.clone(),
            in_flight.clone(),
        )));
    }
    // The polling control, in the worlds with a breaker: its probes invoke the first
    // sandbox, as the event source mapping would.
    let control = shape.breaker.map(|_| {
        let (probe_world, worker, in_flight) =
            (world.clone(), sandboxes[0].clone(), in_flight.clone());
        let invoke: crate::polling::ProbeInvoke = Arc::new(move |messages, arn| {
            let (world, worker, in_flight) =
                (probe_world.clone(), worker.clone(), in_flight.clone());
            Box::pin(async move {
                in_flight.fetch_add(1, Ordering::SeqCst);
                invoke(&world, &worker, &messages, &arn, "polling-probe", true).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
            })
        });
        Arc::new(crate::polling::control(
            &world,
            breaker_state.clone(),
            invoke,
        ))
    });
    let control_task = control.clone().map(|control| {
        let (world, stop) = (world.clone(), stop_pollers.clone());
        tokio::spawn(async move {
            crate::polling::run_each_minute(world, control, stop).await;
        })
    });
    let faults = tokio::spawn(inject_faults(
        world.clone(),
        rng.u64(..),
        (shape.fault_gap, shape.table_fault_rates),
        healed.clone(),
    ));
    let operators = tokio::spawn(operate(
        store.clone(),
        rng.u64(..),
        shape.clone(),
        healed.clone(),
    ));

    join_reporting(&world, "producer", producer).await;
    join_reporting(&world, "faults", faults).await;
    join_reporting(&world, "operators", operators).await;

    // Drain: the pollers go on until the queue is empty and nothing is in flight.
    let drain_started = Instant::now();
    loop {
        let empty = world.lock().source().is_empty() && in_flight.load(Ordering::SeqCst) == 0;
        if empty {
            break;
        }
        if drain_started.elapsed() > DRAIN_LIMIT {
            world.lock().violate(
                Section::NothingLost,
                "-",
                "the source queue did not drain within 24 h of the faults healing".into(),
            );
            break;
        }
        sleep(Duration::from_secs(10)).await;
    }
    stop_pollers.store(true, Ordering::SeqCst);
    for poller in pollers {
        join_reporting(&world, "poller", poller).await;
    }
    if let Some(task) = control_task {
        join_reporting(&world, "polling control", task).await;
    }
    if let Some(control) = &control {
        crate::polling::polling_restored(&world, control).await;
    }

    // The schedule, after every lease a dead run left has expired.
    sleep(shape.lease_ttl + Duration::from_secs(60)).await;
    // A run resolves one DLQ message of an item and its sweep adopts the next: an item
    // with many failed messages takes a run for each.
    // The runs each item may take to be reached after a late outage, counted from it.
    let mut recovery = std::collections::BTreeMap::new();
    for round in 0..6 + shape.messages {
        // A DLQ message still held by a pass (one that died holding it, or a carried hold)
        // is not seen by this one: wait until every hold is over, as the schedule would
        // come round after it.
        let held_until = world
            .lock()
            .dlq
            .messages()
            .iter()
            .map(|m| m.visible_at)
            .max()
            .filter(|at| *at > Instant::now());
        if let Some(at) = held_until {
            tokio::time::sleep_until(at).await;
        }
        if shape.late_outage && round == 0 {
            late_outage(&world).await;
            recovery = crate::check::recovery_budget(&world.lock(), RUNS_TO_RECOVER);
        }
        let report = redrive(&store, "schedule", RedriveRequest::default(), true).await;
        crate::check::after_recovery(&mut world.lock(), round, &recovery);
        // A run the breaker held back found work it could not do yet: the schedule comes
        // round again, as it does every few minutes in production.
        let busy = report.is_some_and(|(selected, adopted)| selected + adopted > 0);
        if !busy && round > 0 {
            break;
        }
        sleep(Duration::from_secs(300)).await;
    }
    let now = store.world().clock.now();
    crate::check::at_quiescence(&mut world.lock(), now);
}

async fn join_reporting(world: &World, what: &str, task: tokio::task::JoinHandle<()>) {
    if let Err(e) = task.await {
        let message = if e.is_panic() {
            sqs_keeper_core::batch::panic_message(&*e.into_panic())
        } else {
            e.to_string()
        };
        world.lock().violate(
            Section::NoPanic,
            "-",
            format!("panic in the {what}: {message}"),
        );
    }
}

/// Sends the messages, at random intervals; some reuse an item id with a new body.
async fn produce(world: Arc<World>, shape: Shape, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut ids: Vec<String> = Vec::new();
    // The ids of the payloads whose handler always panics: never reused, so that every
    // payload of such an item is that one.
    let mut doomed_ids: std::collections::HashSet<String> = std::collections::HashSet::new();
    for n in 0..shape.messages {
        sleep(Duration::from_millis(rng.u64(0..90_000))).await;
        // One new id in twenty-five holds a control character SQS refuses in an attribute
        // (drawn apart, so that every other choice stays as it was): the worker must still
        // dead-letter it (it is stored and sent by its digest).
        let odd = fastrand::Rng::with_seed(seed ^ (n as u64).wrapping_mul(0x517C_C1B7_2722_0A95))
            .u32(0..25)
            == 0;
        let reusable: Vec<&String> = ids.iter().filter(|i| !doomed_ids.contains(*i)).collect();
        let reused = !shape.idempotency && !reusable.is_empty() && rng.f64() < shape.reuse_rate;
        let raw = if reused {
            reusable[rng.usize(0..reusable.len())].clone()
        } else if odd {
            format!("item-{n}\u{1}")
        } else {
            format!("item-{n}")
        };
        ids.push(raw.clone());
        // The id as the body spells it (JSON), and as the worker keys it.
        let json_id = serde_json::to_string(&raw).unwrap_or_default();
        let json_id = json_id.trim_matches('"').to_string();
        let id = sqs_keeper_core::item::bounded_item_id(raw);
        let behaviour = match rng.u32(0..100) {
            0..=29 if shape.failing => Behaviour::Flaky,
            0..=54 => Behaviour::Healthy,
            55..=74 => Behaviour::Flaky,
            75..=84 => Behaviour::Slow,
            85..=92 => Behaviour::Poison,
            93..=97 => Behaviour::Gone,
            _ => Behaviour::Forbidden,
        };
        // One healthy payload in ten has a handler that panics on it, drawn apart so that
        // the other choices of every world stay as they were.
        let panicky =
            fastrand::Rng::with_seed(seed ^ (n as u64).wrapping_mul(0xA24B_AED4_963E_E407))
                .u32(0..10)
                == 0;
        // And in the breaker worlds, some healthy payloads have a handler that always panics
        // (drawn apart too).
        let doomed = shape.doomed_rate > 0.0
            && !reused
            && fastrand::Rng::with_seed(seed ^ (n as u64).wrapping_mul(0xD1B5_4A32_D192_ED03))
                .f64()
                < shape.doomed_rate;
        let behaviour = match behaviour {
            Behaviour::Healthy if panicky => Behaviour::Panicky,
            Behaviour::Healthy if doomed => Behaviour::Doomed,
            other => other,
        };
        let pad = match rng.f64() {
            r if shape.big && r < 0.2 => rng.usize(60_000..70_000),
            r if r < 0.15 => 3000,
            _ => rng.usize(0..80),
        };
        let body = format!(
            "{{\"id\":\"{json_id}\",\"n\":{n},\"behaviour\":\"{}\",\"note\":\"{}{n}\",\"pad\":\"{}\"}}",
            behaviour.name(),
            crate::logs::SECRET,
            "x".repeat(pad)
        );
        let body = match shape.envelope {
            Some(envelope) => wrapped(envelope, &body, n),
            None => body,
        };
        let sha = sqs_keeper_core::hex::sha256_hex(body.as_bytes());
        let group = shape.fifo.then(|| format!("group-{}", rng.u32(0..3)));
        let attributes = if shape.big && rng.bool() {
            (0..10)
                .map(|a| {
                    (
                        format!("attribute-{a}"),
                        sqs_keeper_core::dead_letter::MessageAttribute::string("a".repeat(3000)),
                    )
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut state = world.lock();
        if behaviour == Behaviour::Doomed {
            state.ext.ledger.doomed.insert(sha.clone());
            if let Some(raw) = ids.last() {
                doomed_ids.insert(raw.clone());
            }
        }
        // Some payloads go by pointer (drawn apart, as the panics are).
        let by_pointer = shape.pointers
            && fastrand::Rng::with_seed(seed ^ (n as u64).wrapping_mul(0x9FB2_1C65_1E98_DF25))
                .bool();
        let body = if by_pointer {
            let pointer = sqs_keeper_core::pointer::S3Pointer {
                bucket: PRODUCER_BUCKET.to_string(),
                key: format!("producer/{n}"),
            };
            state
                .bucket
                .insert((pointer.bucket.clone(), pointer.key.clone()), body);
            let text = pointer.to_body();
            state.ext.ledger.pointers.insert(
                sqs_keeper_core::hex::sha256_hex(text.as_bytes()),
                sha.clone(),
            );
            text
        } else {
            body
        };
        let now_ms = world.now_ms();
        let message_id = state.source_mut().send(body, attributes, group, now_ms);
        world.arrivals.notify_waiters();
        state.ext.ledger.sent.push((id.clone(), sha));
        state.after_step(
            "producer",
            &id,
            &format!("sent message {message_id} ({})", behaviour.name()),
        );
    }
}

/// `payload` as the `n`th event of `envelope` delivers it to the queue: an SNS
/// notification (raw delivery off) holds it as its `Message` string, an EventBridge event
/// as its `detail` object.
fn wrapped(envelope: Envelope, payload: &str, n: usize) -> String {
    match envelope {
        Envelope::EventBridge => format!(
            "{{\"version\":\"0\",\"id\":\"event-{n}\",\"detail-type\":\"order\",\"source\":\"sim.orders\",\"time\":\"2026-01-01T00:00:00Z\",\"detail\":{payload}}}"
        ),
        _ => serde_json::json!({
            "Type": "Notification",
            "MessageId": format!("notification-{n}"),
            "TopicArn": "arn:aws:sns:us-east-1:000000000000:orders",
            "Message": payload,
            "Timestamp": "2026-01-01T00:00:00.000Z",
        })
        .to_string(),
    }
}

/// One poller of the event source mapping: receives a batch, invokes the worker with it
/// (sometimes crashing the invocation midway, or invoking it twice at once), and deletes
/// the records the response does not list.
async fn poll(
    world: Arc<World>,
    worker: Arc<SimWorker>,
    shape: Shape,
    n: usize,
    seed: u64,
    stop: Arc<AtomicBool>,
    in_flight: Arc<AtomicUsize>,
) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let actor = format!("poller#{n}");
    let mut invocation_no = 0u64;
    while !stop.load(Ordering::SeqCst) {
        if world.lock().ext.polling.disabled {
            // The event source mapping is disabled: nothing is received.
            sleep(Duration::from_millis(POLL_GAP_MS as u64)).await;
            continue;
        }
        let (messages, arn) = receive(&world, shape.batch_size, shape.duplicate_rate);
        if messages.is_empty() {
            // Idle: the next receive after a few seconds, or at once when a message is sent
            // (a long poll returns as soon as one arrives).
            let idle = sleep(Duration::from_millis(rng.u64(500..POLL_GAP_MS as u64)));
            tokio::select! {
                _ = idle => {}
                _ = world.arrivals.notified() => {}
            }
            continue;
        }
        in_flight.fetch_add(1, Ordering::SeqCst);
        invocation_no += 1;
        let name = format!("{actor}/{invocation_no}");
        let roll = rng.f64();
        if roll < shape.crash_rate {
            let at = Duration::from_millis(rng.u64(0..FUNCTION_TIMEOUT.as_millis() as u64));
            let invocation = invoke(&world, &worker, &messages, &arn, &name, true);
            // Half the crashes come at a random moment. A quarter come right after the
            // first DLQ claim on one of the batch's messages, if that comes first (a hard
            // stop between a dead-letter's record write and its DLQ send). A quarter come
            // right after the first DLQ send for one of them, before the record marks it
            // sent: the next delivery sends again, and a FIFO DLQ's deduplication drops it.
            let at_send = roll < shape.crash_rate / 4.0;
            let at_claim = !at_send && roll < shape.crash_rate / 2.0;
            tokio::select! {
                biased;
                _ = invocation => {}
                _ = sleep(at) => {
                    note_unacked(&world, &messages, &[], &name, "crashed");
                }
                _ = claim_taken(&world, &messages), if at_claim => {
                    world.lock().ext.stats.cuts_after_claim += 1;
                    note_unacked(&world, &messages, &[], &name, "crashed right after a DLQ claim");
                }
                _ = dead_letter_sent(&world, &messages), if at_send => {
                    world.lock().ext.stats.cuts_after_claim += 1;
                    note_unacked(&world, &messages, &[], &name, "crashed right after a DLQ send");
                }
            }
        } else if roll < shape.crash_rate + shape.double_invoke_rate {
            {
                // Lambda may run one batch twice: each of its messages may be delivered twice.
                let mut state = world.lock();
                state
                    .ext
                    .trace
                    .note(&name, "-", "the same batch invoked twice at once");
                for m in &messages {
                    *state.ext.ledger.causes.entry(m.id.clone()).or_default() += 1;
                    if let Some(receipt) = &m.receipt {
                        state.ext.ledger.doubled.insert(receipt.clone());
                    }
                }
            }
            let (first, second) = (format!("{name}a"), format!("{name}b"));
            tokio::join!(
                invoke(&world, &worker, &messages, &arn, &first, false),
                invoke(&world, &worker, &messages, &arn, &second, false),
            );
        } else {
            invoke(&world, &worker, &messages, &arn, &name, true).await;
        }
        in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A documented window reaches a FIFO message's later group-mates (docs/SIMULATION.md,
/// "A FIFO group held by a group-mate's failed hide"): a message `in_window` holds its
/// group while it is in flight, and the messages behind it may expire before any receive
/// can reach them. The group and place (sent at, then id) of each such holder: in flight
/// now, or expiring with `expired` (it held its group until now).
fn group_holders_in_window(
    state: &State,
    expired: &[QueueMessage],
    in_window: impl Fn(&State, &str) -> bool,
) -> Vec<(String, (i64, String))> {
    let now = Instant::now();
    let in_flight = state
        .source()
        .messages()
        .iter()
        .filter(|m| m.visible_at > now);
    expired
        .iter()
        .chain(in_flight)
        .filter(|m| in_window(state, &m.id))
        .filter_map(|m| Some((m.group.clone()?, (m.sent_at_ms, m.id.clone()))))
        .collect()
}

/// Receives up to `max` messages from the source queue as the event source mapping does,
/// noting the messages SQS expired or moved to the DLQ meanwhile, and the duplicates it
/// returned (one in `duplicate_rate` receives).
pub(crate) fn receive(
    world: &World,
    max: usize,
    duplicate_rate: f64,
) -> (Vec<QueueMessage>, String) {
    let mut state = world.lock();
    let duplicate = state.chance(duplicate_rate);
    let received = state
        .source_mut()
        .receive(max, VISIBILITY, duplicate, world.now_ms());
    let arn = state.source_mut().arn.clone();
    let in_window = |state: &State, id: &str| {
        state.ext.ledger.hidden_blind.contains(id)
            || state.ext.ledger.held_past_retention.contains(id)
            || state.ext.ledger.unhidden_failed_dead_letters.contains(id)
    };
    let holders = group_holders_in_window(&state, &received.expired, in_window);
    for expired in received.expired {
        let item = item_of(&expired);
        state.ext.ledger.expired_messages.insert(
            sqs_keeper_core::dead_letter::recorded_message_id(&expired.id),
        );
        let held_behind = expired.group.as_ref().is_some_and(|group| {
            holders
                .iter()
                .any(|(g, place)| g == group && *place < (expired.sent_at_ms, expired.id.clone()))
        });
        let excused = in_window(&state, &expired.id) || held_behind;
        if excused {
            state
                .ext
                .ledger
                .expired_in_window
                .insert(expired.body_sha256.clone());
        } else if !state.payload_is_safe(&expired.body_sha256, Some(&expired.id)) {
            state.violate(
                    Section::NothingLost,
                    &item,
                    format!(
                        "message {} reached the end of its retention after {} receives, neither delivered nor dead-lettered: SQS deleted it",
                        expired.id, expired.receive_count
                    ),
                );
        }
        let retention = state.source_mut().retention.as_secs();
        state.after_step(
                "sqs",
                &item,
                &format!(
                    "message {} expired (retention {retention} s){}",
                    expired.id,
                    if excused {
                        ", in a documented window (hidden while the retention was unknown, a failed dead-letter write and hide, or held past it by a crashed invocation)"
                    } else {
                        ""
                    }
                ),
            );
    }
    for moved in received.moved {
        let item = item_of(&moved);
        let id = moved.id.clone();
        state.dlq.accept_moved(moved, &arn);
        state.after_step(
            "sqs",
            &item,
            &format!(
                "redrive policy moved message {id} to the DLQ after {MAX_RECEIVE_COUNT} receives"
            ),
        );
    }
    for id in &received.duplicated {
        *state.ext.ledger.causes.entry(id.clone()).or_default() += 1;
        let item = received
            .messages
            .iter()
            .find(|m| m.id == *id)
            .map(item_of)
            .unwrap_or_default();
        state.ext.trace.note(
            "sqs",
            &item,
            &format!("message {id} delivered again while in flight"),
        );
    }
    (received.messages, arn)
}

fn item_of(m: &QueueMessage) -> String {
    m.item_id()
}

/// The longest an idle poller waits before it receives again (ms).
const POLL_GAP_MS: i64 = 5_000;

/// Resolves once a DLQ claim is taken on one of `messages` (never, if none is).
async fn claim_taken(world: &Arc<World>, messages: &[QueueMessage]) {
    let notify = world.lock().ext.claim_taken.clone();
    counted(world, messages, &notify, |ledger| &ledger.claims_taken).await;
}

/// Returns once the worker sends a DLQ message for one of `messages`.
async fn dead_letter_sent(world: &Arc<World>, messages: &[QueueMessage]) {
    let notify = world.lock().ext.dead_letter_sending.clone();
    counted(world, messages, &notify, |ledger| {
        &ledger.dead_letters_sending
    })
    .await;
}

/// Returns once the ledger's count `pick` of one of `messages` moves, woken by `notify`.
async fn counted(
    world: &Arc<World>,
    messages: &[QueueMessage],
    notify: &tokio::sync::Notify,
    pick: fn(&crate::world::Ledger) -> &std::collections::HashMap<String, u32>,
) {
    let ids: Vec<String> = messages
        .iter()
        .map(|m| sqs_keeper_core::dead_letter::recorded_message_id(&m.id))
        .collect();
    let count = |world: &Arc<World>| -> u32 {
        let state = world.lock();
        let counts = pick(&state.ext.ledger);
        ids.iter()
            .map(|id| counts.get(id).copied().unwrap_or(0))
            .sum()
    };
    let before = count(world);
    loop {
        notify.notified().await;
        if count(world) != before {
            return;
        }
    }
}

/// One invocation of the worker, with Lambda's deadline: a run past it is killed (and
/// breaks the deadline invariant). Returns whether it answered.
async fn invoke(
    world: &Arc<World>,
    worker: &SimWorker,
    messages: &[QueueMessage],
    arn: &str,
    name: &str,
    alone: bool,
) -> bool {
    let before: Vec<u32> = {
        let mut state = world.lock();
        state.ext.stats.invocations += 1;
        let ids: Vec<String> = messages
            .iter()
            .map(|m| format!("{}#{}", m.id, m.receive_count))
            .collect();
        state
            .ext
            .trace
            .note(name, "-", &format!("invoked with {}", ids.join(" ")));
        messages
            .iter()
            .map(|m| state.ext.ledger.worker_deliveries_of(&m.id))
            .collect()
    };
    let mut event = SqsEvent::default();
    event.records = messages.iter().map(|m| to_sqs_message(m, arn)).collect();
    let started = Instant::now();
    let invocation = InvocationInfo {
        request_id: Some(name.to_string()),
        ..InvocationInfo::default()
    };
    let deadline = Deadline::after(FUNCTION_TIMEOUT, DEADLINE_MARGIN);
    let result = tokio::time::timeout(
        FUNCTION_TIMEOUT,
        worker.process_batch(event, deadline, &invocation),
    )
    .await;
    let elapsed = started.elapsed();
    match result {
        Err(_) => {
            let mut state = world.lock();
            let items: Vec<String> = messages.iter().map(item_of).collect();
            for item in &items {
                state.violate(
                    Section::Deadline,
                    item,
                    format!(
                        "invocation {name} was still running at its {} s deadline: Lambda killed it",
                        FUNCTION_TIMEOUT.as_secs()
                    ),
                );
            }
            drop(state);
            note_unacked(world, messages, &before, name, "killed at the deadline");
            false
        }
        Ok(Err(e)) => {
            world
                .lock()
                .ext
                .trace
                .note(name, "-", &format!("invocation failed: {e}"));
            note_unacked(world, messages, &before, name, "failed");
            true
        }
        Ok(Ok(report)) => {
            let response = report.response();
            let failed: Vec<String> = response
                .batch_item_failures
                .iter()
                .map(|f| f.item_identifier.clone())
                .collect();
            let mut state = world.lock();
            state.ext.trace.note(
                name,
                "-",
                &format!(
                    "answered after {:.3}s, {} of {} listed for retry",
                    elapsed.as_secs_f64(),
                    failed.len(),
                    messages.len()
                ),
            );
            let delivered_now = state.ext.ledger.delivered_since(messages, &before);
            left_to_the_redrive_policy(&mut state, &report, messages, &delivered_now, name);
            for (m, &delivered_now) in messages.iter().zip(&delivered_now) {
                if failed.contains(&m.id) {
                    if delivered_now {
                        *state.ext.ledger.causes.entry(m.id.clone()).or_default() += 1;
                    }
                    continue;
                }
                let Some(receipt) = m.receipt.as_deref() else {
                    continue;
                };
                let item = item_of(m);
                // A batch run twice at once may see one copy fail (and hide it) while the
                // other succeeds: only a lone invocation must list every record it hid.
                if let Some(delay) = state.ext.ledger.hidden.remove(receipt) {
                    if alone {
                        state.violate(
                            Section::Spacing,
                            &item,
                            format!(
                                "{name} hid message {} for {} s but did not report it for retry: a hidden record is always one reported for retry",
                                m.id,
                                delay.as_secs()
                            ),
                        );
                    }
                }
                if let Some(deleted) = state.source_mut().delete(receipt) {
                    let sha = deleted.body_sha256.clone();
                    if !state.payload_is_safe(&sha, Some(&deleted.id)) {
                        state.violate(
                            Section::NothingLost,
                            &item,
                            format!(
                                "message {} acknowledged by {name}, but it was neither delivered nor dead-lettered: lost",
                                deleted.id
                            ),
                        );
                    }
                    state.after_step(name, &item, &format!("acknowledged message {}", deleted.id));
                }
            }
            true
        }
    }
}

/// §1.1 and §1.6: a record on its last receive is run or dead-lettered, never given back
/// for the queue's redrive policy to move without a record; only a dead-letter write that
/// failed (the store down) may return it, and the sweep adopts what the policy moves.
fn left_to_the_redrive_policy(
    state: &mut State,
    report: &sqs_keeper_core::BatchReport,
    messages: &[QueueMessage],
    delivered_now: &[bool],
    name: &str,
) {
    use sqs_keeper_core::batch::Disposition;
    for record in &report.records {
        let Some(i) = messages.iter().position(|m| m.id == record.message_id) else {
            continue;
        };
        let m = &messages[i];
        // A dead-letter write that failed, and a hide that failed with it: the record comes
        // back after the visibility timeout, which may be past its retention (the window of
        // two failed calls docs/ARCHITECTURE.md §1.11 names).
        let hidden = |m: &QueueMessage| {
            m.receipt
                .as_ref()
                .is_some_and(|r| state.ext.ledger.hidden.contains_key(r))
        };
        // In a FIFO queue, a message of its group this batch gave back without a hide stays
        // in flight for the visibility timeout and holds the whole group, this message
        // included, however this one was hidden.
        let given_back = |o: &QueueMessage| {
            report.records.iter().any(|r| {
                r.message_id == o.id
                    && matches!(
                        r.disposition,
                        Disposition::RetryLater { .. }
                            | Disposition::NotStarted { .. }
                            | Disposition::DeadLetterFailed { .. }
                    )
            })
        };
        let group_held = m.group.is_some()
            && messages
                .iter()
                .any(|o| o.id != m.id && o.group == m.group && given_back(o) && !hidden(o));
        // Only the message's latest receive decides. A twin of an older receive that answers
        // later holds a stale receipt: its hide cannot keep the message from the timeout
        // the latest receive left running (`twins` world 34455).
        let latest = state
            .source()
            .messages()
            .iter()
            .find(|q| q.id == m.id)
            .is_none_or(|q| q.receive_count == m.receive_count);
        let unhidden = matches!(record.disposition, Disposition::DeadLetterFailed { .. })
            && (!hidden(m) || group_held);
        let marks = &mut state.ext.ledger.unhidden_failed_dead_letters;
        if latest && unhidden {
            marks.insert(m.id.clone());
        } else if latest {
            marks.remove(&m.id);
        }
        // The worker's last receive: SQS's, less the margin it keeps.
        let last_receive = m.receive_count
            >= MAX_RECEIVE_COUNT
                .saturating_sub(state.ext.receive_budget_margin)
                .max(1);
        // Returned because another delivery held the message's DLQ claim, unsent, when this
        // one wrote (it may have been sending it; a crash between claim and send leaves the
        // message to the redrive policy, whose DLQ message the sweep adopts): the documented
        // exception, judged by what the store saw at the write (`claims_held_elsewhere`).
        let recorded_id = sqs_keeper_core::dead_letter::recorded_message_id(&m.id);
        let delivery = crate::world::delivery_key(&recorded_id, m.receive_count);
        // A delivery whose attempts were all recorded decides from its read of the record,
        // without a write the store could judge. Another receive holding the claim when it
        // answers is the same exception: a later one (twins world 2193), or the one before,
        // which `DlqClaim::is_held_elsewhere` respects as still running (compaction world
        // 4579). A claim at this very receive is not: it may be this delivery's own, kept
        // by a defect. A DLQ message sent meanwhile is: the message is in the DLQ.
        let other_receive = |n: u32| n > 0 && n != m.receive_count && n + 1 >= m.receive_count;
        let held_later = state.table.get(&item_of(m)).is_some_and(|row| {
            row.sent.contains(&recorded_id)
                || row.claims.iter().any(|element| {
                    crate::world::claim_receive(element, &recorded_id).is_some_and(other_receive)
                })
        });
        let claimed_elsewhere = matches!(record.disposition, Disposition::RetryLater { .. })
            && (state.ext.ledger.claims_held_elsewhere.contains(&delivery) || held_later);
        // Or its work ended well in this invocation (delivered, or skipped as done by its
        // idempotency key) and the record's update failed (a requeued message the store
        // could not mark finished): the policy moves a message whose payload arrived.
        let handled = m
            .receipt
            .as_ref()
            .is_some_and(|receipt| state.ext.ledger.handled.contains(receipt));
        let delivered = handled || delivered_now.get(i).copied().unwrap_or(false);
        let given_back = matches!(
            record.disposition,
            Disposition::RetryLater { .. } | Disposition::NotStarted { .. }
        );
        if last_receive && given_back && !claimed_elsewhere && !delivered {
            state.violate(
                Section::NothingLost,
                &item_of(m),
                format!(
                    "{name} returned message {} on its last receive ({:?}): the queue's redrive policy moves it without a record",
                    m.id, record.disposition
                ),
            );
        }
    }
}

/// An invocation that ended without answering: messages it delivered will come again.
fn note_unacked(world: &World, messages: &[QueueMessage], before: &[u32], name: &str, how: &str) {
    let mut state = world.lock();
    state.ext.trace.note(
        name,
        "-",
        &format!("invocation {how}; its messages return after the visibility timeout"),
    );
    let delivered_now = state.ext.ledger.delivered_since(messages, before);
    for (m, delivered_now) in messages.iter().zip(delivered_now) {
        if delivered_now {
            *state.ext.ledger.causes.entry(m.id.clone()).or_default() += 1;
        }
    }
    // A documented window: a message this invocation still holds invisible past the end
    // of its retention, or to within an idle poller's gap (5 s) of it, is deleted by SQS
    // before any delivery can see it again. The invocation is gone, so nothing can record
    // it.
    let now_ms = world.now_ms();
    let retention_ms = i64::try_from(state.source().retention.as_millis()).unwrap_or(i64::MAX);
    let held_past_retention: Vec<String> = state
        .source()
        .messages()
        .iter()
        .filter(|q| {
            messages
                .iter()
                .any(|m| m.receipt.is_some() && m.receipt == q.receipt)
        })
        .filter(|q| {
            let invisible_ms = q
                .visible_at
                .saturating_duration_since(Instant::now())
                .as_millis();
            let visible_at_ms =
                now_ms.saturating_add(i64::try_from(invisible_ms).unwrap_or(i64::MAX));
            q.sent_at_ms.saturating_add(retention_ms) <= visible_at_ms.saturating_add(POLL_GAP_MS)
        })
        .map(|q| q.id.clone())
        .collect();
    state
        .ext
        .ledger
        .held_past_retention
        .extend(held_past_retention);
}

/// Switches faults on and off until the producer's time is over, then heals the world.
async fn inject_faults(
    world: Arc<World>,
    seed: u64,
    (gap, table_rates): ((u64, u64), [f64; 4]),
    healed: Arc<AtomicBool>,
) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let until = Instant::now() + Duration::from_secs(rng.u64(1_800..5_400));
    while Instant::now() < until {
        sleep(Duration::from_secs(rng.u64(gap.0..gap.1))).await;
        let mut state = world.lock();
        let what = match rng.u32(0..5) {
            0 => {
                state.faults.table = table_rates[rng.usize(0..4)];
                format!("DynamoDB failure rate now {}", state.faults.table)
            }
            1 => {
                state.faults.bucket = [0.0, 0.2][rng.usize(0..2)];
                format!("S3 failure rate now {}", state.faults.bucket)
            }
            2 => {
                state.faults.send = [0.0, 0.1, 0.3][rng.usize(0..3)];
                format!("SQS send failure rate now {}", state.faults.send)
            }
            _ => {
                state.ext.outage = !state.ext.outage;
                format!(
                    "downstream outage {}",
                    if state.ext.outage { "begins" } else { "ends" }
                )
            }
        };
        state.ext.trace.note("fault", "-", &what);
    }
    let mut state = world.lock();
    state.faults = crate::world::Faults {
        healed: true,
        ..Default::default()
    };
    state.ext.outage = false;
    state.ext.trace.note("fault", "-", "every fault healed");
    healed.store(true, Ordering::SeqCst);
}

/// Operators: redrives (reprocess and requeue, by hand and on the schedule, now and then
/// two at once, now and then one that dies midway), purges (now and then racing the
/// schedule) and, rarely, a record damaged by hand.
async fn operate(store: SimStore, seed: u64, shape: Shape, healed: Arc<AtomicBool>) {
    let mut rng = fastrand::Rng::with_seed(seed);
    // The options an operator adds, drawn apart so that every other choice stays as it was.
    let mut options = fastrand::Rng::with_seed(seed ^ 0x0b7e_a7e5);
    let mut corrupted = false;
    while !healed.load(Ordering::SeqCst) {
        sleep(Duration::from_secs(
            rng.u64(shape.operator_gap.0..shape.operator_gap.1),
        ))
        .await;
        let mut request = RedriveRequest {
            mode: if rng.f64() < 0.35 {
                RedriveMode::Requeue
            } else {
                RedriveMode::Reprocess
            },
            max_items: (rng.f64() < 0.3).then(|| rng.usize(1..4)),
            parallelism: Some(rng.usize(1..5)),
            ..RedriveRequest::default()
        };
        operator_options(&store, &mut request, &mut options);
        let action = rng.u32(0..20);
        // In the worlds focused on operators, the plain runs become purges and clears,
        // most racing the schedule: half the actions are then purges or clears.
        let action = if shape.operator_races && action >= 13 {
            10 + action % 3
        } else {
            action
        };
        match action {
            0 if !corrupted => {
                corrupted = corrupt_a_record(&store, &mut rng);
            }
            10 => purge(&store).await,
            12 => {
                // A clear racing the scheduled redrive: failures arrive after its snapshot.
                tokio::join!(
                    clear(&store),
                    redrive(&store, "schedule", RedriveRequest::default(), true)
                );
            }
            11 => {
                // A purge racing the scheduled redrive: the two stores must still agree.
                tokio::join!(
                    purge(&store),
                    redrive(&store, "schedule", RedriveRequest::default(), true)
                );
            }
            1..=3 => {
                // A run that dies midway (the CLI's machine, a killed function), holding
                // the leases it took.
                let at = Duration::from_millis(rng.u64(0..20_000));
                tokio::select! {
                biased;
                    _ = redrive(&store, "redrive", request, false) => {}
                    _ = sleep(at) => {
                        store.world().lock().ext.trace.note("redrive", "-", "the run died midway");
                    }
                }
            }
            4..=5 => {
                let other = RedriveRequest {
                    mode: RedriveMode::Reprocess,
                    ..RedriveRequest::default()
                };
                tokio::join!(
                    redrive(&store, "redrive-a", request, false),
                    redrive(&store, "redrive-b", other, false)
                );
            }
            6..=9 => {
                redrive(&store, "schedule", RedriveRequest::default(), true).await;
            }
            _ => {
                redrive(&store, "redrive", request, false).await;
            }
        }
    }
}

/// What an operator adds to a redrive now and then: the items named (`--item-id`), a class
/// or status filter, `--force` (permanent failures too), a rate, a time budget, and a
/// continuation of a run cut by `max_items` (the token it printed).
fn operator_options(store: &SimStore, request: &mut RedriveRequest, rng: &mut fastrand::Rng) {
    match rng.u32(0..10) {
        0 => {
            let state = store.world().lock();
            let ids: Vec<&String> = state.table.keys().collect();
            if !ids.is_empty() {
                request.item_ids = (0..rng.usize(1..4))
                    .map(|_| ids[rng.usize(0..ids.len())].clone())
                    .collect();
            }
        }
        1 => {
            request.error_class = Some(
                [
                    sqs_keeper_core::ErrorClass::ServerError,
                    sqs_keeper_core::ErrorClass::Throttled,
                    sqs_keeper_core::ErrorClass::Timeout,
                ][rng.usize(0..3)],
            );
        }
        2 => request.force = true,
        3 => request.rate = Some([0.5, 2.0][rng.usize(0..2)]),
        4 => request.time_budget_secs = Some(rng.u64(5..60)),
        5 => request.status = Some(sqs_keeper_core::dead_letter::ItemStatus::Dead),
        _ => {}
    }
}

/// An operator purges the records of permanent failures (or, one time in three, of every
/// class) last tried more than ten minutes ago, of every status as `dlq purge --older-than 10m` selects by default (items in flight
/// among them, which the removal must keep), through the library's own removal.
async fn purge(store: &SimStore) {
    use sqs_keeper_core::ports::RecordStore;
    let actor = store.as_actor("purge");
    let until = store.world().clock.now() - chrono::Duration::minutes(10);
    let mut records = Vec::new();
    // One purge in three selects every class, as `dlq purge --older-than 10m` alone does:
    // it then meets the items requeued or redriven meanwhile.
    let classes: Vec<Option<sqs_keeper_core::ErrorClass>> =
        if store.world().lock().chance(1.0 / 3.0) {
            vec![None]
        } else {
            vec![
                Some(sqs_keeper_core::ErrorClass::Validation),
                Some(sqs_keeper_core::ErrorClass::NotFound),
            ]
        };
    for class in classes {
        let filter = sqs_keeper_core::selection::RecordFilter {
            status: None,
            class,
            until: Some(until),
            ..Default::default()
        };
        match actor.query_page(&filter, 100, None).await {
            Ok(page) => records.extend(page.records),
            Err(e) => {
                store.world().lock().ext.trace.note(
                    "purge",
                    "-",
                    &format!("purge could not select: {e}"),
                );
                return;
            }
        }
    }
    if records.is_empty() {
        return;
    }
    {
        // What the operator chose to discard: the selected records' payloads, nothing more
        // (another body of the same item id, in the DLQ or arriving later, was not
        // selected: a purge that deletes it loses it).
        // Not an item in flight: the removal keeps it, and its payload must still arrive.
        let mut state = store.world().lock();
        let removable = records.iter().filter(|r| !r.status.is_in_flight());
        let ids: Vec<String> = removable.clone().map(|r| r.item_id.clone()).collect();
        let shas: Vec<String> = removable.map(|r| r.payload.sha256.clone()).collect();
        state.ext.ledger.discarded.extend(shas);
        state.ext.ledger.purged.extend(ids.iter().cloned());
        state
            .ext
            .trace
            .note("purge", "-", &format!("purging {}", ids.join(" ")));
    }
    fail_one_again_meanwhile(store, &records);
    let result = sqs_keeper_core::removal::remove_records(
        &actor,
        &records,
        &parser(store.world()),
        &store.world().random,
        |_| {},
    )
    .await;
    let what = match result {
        Ok(report) => {
            store.world().lock().ext.stats.purges += 1;
            format!("purge done: {report:?}")
        }
        Err(e) => format!("purge failed midway: {e}"),
    };
    store.world().lock().ext.trace.note("purge", "-", &what);
}

/// An operator empties the store as `dlq clear` does: the time it starts is its snapshot,
/// every record is read page by page while the workers go on, then the library's own
/// `clear_records` removes them with the DLQ messages no record holds.
async fn clear(store: &SimStore) {
    use sqs_keeper_core::ports::RecordStore;
    let actor = store.as_actor("clear");
    let snapshot_ms = store.world().clock.now().timestamp_millis();
    discard_what_the_store_holds(store, snapshot_ms);
    let mut records = Vec::new();
    let mut after = None;
    loop {
        // A page of a production table (thousands of records) takes a while to read:
        // failures arrive after the snapshot and before the records are all read.
        sleep(Duration::from_secs(2)).await;
        match actor
            .query_page(
                &sqs_keeper_core::selection::RecordFilter::default(),
                100,
                after.as_ref(),
            )
            .await
        {
            Ok(page) => {
                records.extend(page.records);
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
            Err(e) => {
                let what = format!("clear could not select: {e}");
                store.world().lock().ext.trace.note("clear", "-", &what);
                return;
            }
        }
    }
    let removable: Vec<_> = records
        .iter()
        .map(sqs_keeper_core::removal::Removable::of)
        .collect();
    let result = sqs_keeper_core::removal::clear_records(
        &actor,
        &removable,
        snapshot_ms,
        &store.world().random,
        |_| {},
    )
    .await;
    let what = match result {
        Ok(report) => format!("clear done: {report:?}"),
        Err(e) => format!("clear failed midway: {e}"),
    };
    store.world().lock().ext.trace.note("clear", "-", &what);
}

/// What the operator chose to discard with a clear: what the store held at its snapshot,
/// read from the world, not from what the clear reads. Every record then and every DLQ
/// message then, whether sent to the DLQ or moved there by the queue's redrive policy. An
/// item in flight then may be dead by the time the clear reads it (its run died), and is
/// cleared. That it is never removed while in flight is checked at each deletion. A
/// failure that arrives after the snapshot was not chosen: a clear that removes it loses
/// it.
fn discard_what_the_store_holds(store: &SimStore, snapshot_ms: i64) {
    let mut state = store.world().lock();
    let records: Vec<(String, String)> = state
        .table
        .iter()
        .map(|(id, row)| (id.clone(), row.record.payload.sha256.clone()))
        .collect();
    let messages: Vec<String> = state
        .dlq
        .messages()
        .iter()
        .map(|m| {
            m.attribute(sqs_keeper_core::message::PAYLOAD_SHA256_ATTRIBUTE)
                .map(str::to_string)
                .unwrap_or_else(|| m.body_sha256.clone())
        })
        .collect();
    let ids: Vec<String> = records.iter().map(|(id, _)| id.clone()).collect();
    state.ext.trace.note(
        "clear",
        "-",
        &format!("clearing {} (snapshot {snapshot_ms})", ids.join(" ")),
    );
    state.ext.ledger.purged.extend(ids);
    state
        .ext
        .ledger
        .discarded
        .extend(records.into_iter().map(|(_, sha)| sha).chain(messages));
}

/// Between a purge's selection and its removal, one selected record whose payload is in
/// S3 fails again (in every other purge that selected an even number of records): its last
/// attempt moves on and the purge must keep it, with its object. Drawn from the selection
/// alone, so the world's other draws stay as they were.
fn fail_one_again_meanwhile(
    store: &SimStore,
    records: &[sqs_keeper_core::dead_letter::DeadLetteredItem],
) {
    if !records.len().is_multiple_of(2) {
        return;
    }
    let Some(selected) = records.iter().find(|r| {
        matches!(
            r.payload.location,
            sqs_keeper_core::dead_letter::PayloadLocation::S3 { .. }
        ) && !r.status.is_in_flight()
    }) else {
        return;
    };
    let now = store.world().clock.now();
    let mut state = store.world().lock();
    let Some(row) = state.table.get_mut(&selected.item_id) else {
        return;
    };
    if row.record.last_attempt != selected.last_attempt {
        return;
    }
    row.record.last_attempt = now;
    // The purge must keep it now: it is no longer among what the operator discards.
    state.ext.ledger.purged.remove(&selected.item_id);
    state.ext.ledger.discarded.remove(&selected.payload.sha256);
    state.after_step(
        "worker",
        &selected.item_id,
        "failed again while a purge held it selected (its last attempt moved on)",
    );
}

/// Damages one dead record that has a DLQ message (an operator's hand edit).
fn corrupt_a_record(store: &SimStore, rng: &mut fastrand::Rng) -> bool {
    let mut state = store.world().lock();
    let candidates: Vec<String> = state
        .table
        .iter()
        .filter(|(id, row)| {
            row.record.status == sqs_keeper_core::dead_letter::ItemStatus::Dead
                && state.dlq.messages().iter().any(|m| {
                    m.attribute(sqs_keeper_core::message::ITEM_ID_ATTRIBUTE) == Some(id.as_str())
                })
        })
        .map(|(id, _)| id.clone())
        .collect();
    if candidates.is_empty() {
        return false;
    }
    let id = candidates[rng.usize(0..candidates.len())].clone();
    let Some(row) = state.table.get_mut(&id) else {
        return false;
    };
    row.corrupt = true;
    let sha = row.record.payload.sha256.clone();
    state.ext.ledger.corrupted.insert(id.clone());
    state.ext.trace.note(
        "operator",
        &id,
        &format!("damaged the record by hand (payload {})", &sha[..12]),
    );
    true
}

/// One run of `request` as the function and `dlq redrive` run it: behind the world's
/// circuit breaker when it has one (`run_gated`), the run knowing nothing of it at first.
/// Checks that a probe the run took was answered.
async fn gated<P: sqs_keeper_core::Processor>(
    engine: &RedriveEngine<P, SimStore>,
    actor: &str,
    request: &RedriveRequest,
    deadline: Option<Instant>,
) -> Result<sqs_keeper_core::redrive::RedriveReport, sqs_keeper_core::redrive::RedriveError> {
    let world = engine.store().world().clone();
    let breaker = {
        let mut state = world.lock();
        crate::breaker_store::forget(&mut state, actor);
        state
            .ext
            .breaker
            .clone()
            .map(|(table, policy)| (SimBreakerStore::new(world.clone(), table, actor), policy))
    };
    let result = sqs_keeper_core::redrive::run_gated(
        engine,
        breaker.as_ref().map(|(store, policy)| (store, policy)),
        request,
        deadline,
        &|_| {},
    )
    .await;
    if let Ok(report) = &result {
        if let Some(why) = &report.held_by_breaker {
            world
                .lock()
                .ext
                .trace
                .note(actor, "-", &format!("held by the breaker: {why}"));
        }
    }
    let mut state = world.lock();
    if let Some(broken) = crate::breaker_store::probe_left_unanswered(&state, actor) {
        state.violate(Section::Breaker, "-", broken);
    }
    result
}

/// The schedule's runs after a late outage by which every eligible item has been reached.
/// The breaker stays open at most `max_open` (10 min), and the runs come 5 min apart, so
/// the second run after the outage's probes; a probe run looks at up to five items.
const RUNS_TO_RECOVER: usize = 2;

/// A downstream outage the workers meet after the drain, on other traffic: their breaker
/// opens, so the schedule's runs after it must probe (some `breaker` worlds). The outage
/// is over before the schedule runs.
async fn late_outage(world: &Arc<World>) {
    let Some((table, policy)) = world.lock().ext.breaker.clone() else {
        return;
    };
    let actor = "late-traffic";
    {
        let mut state = world.lock();
        state.ext.outage = true;
        state
            .ext
            .trace
            .note("fault", "-", "downstream outage after the drain");
    }
    let breaker = Breaker::new(
        Downstream::new(world.clone(), actor),
        SimBreakerStore::new(world.clone(), table, actor),
        policy,
    )
    .with_clock(world.clock);
    for n in 0..policy.threshold {
        let item = sqs_keeper_core::WorkItem::new(
            format!("late-{n}"),
            format!("{{\"id\":\"late-{n}\",\"behaviour\":\"healthy\"}}"),
        );
        let _ = sqs_keeper_core::Processor::process(&breaker, &item).await;
    }
    let mut state = world.lock();
    state.ext.outage = false;
    state.ext.trace.note("fault", "-", "downstream outage ends");
}

/// One redrive run; `function`: as the redrive function runs it (with its deadline).
/// Returns (items selected, counting a run the breaker held back as one; DLQ messages
/// adopted) when it ran.
async fn redrive(
    store: &SimStore,
    actor: &str,
    request: RedriveRequest,
    function: bool,
) -> Option<(usize, usize)> {
    let world = store.world().clone();
    world.lock().ext.stats.redrives += 1;
    let processor = SimHandler::new(Downstream::new(world.clone(), actor), &world, actor);
    let engine = RedriveEngine::new(
        store.as_actor(actor),
        Some(processor),
        RedriveSettings {
            retry: retry_policy(),
            parser: parser(&world),
            lease_ttl: world.lock().ext.lease_ttl,
            report_items: 50,
            ..RedriveSettings::default()
        }
        .with_random(world.random.clone()),
    )
    .with_body_resolver(Arc::new(SimResolver::new(store.as_actor(actor))));
    world.lock().ext.trace.note(
        actor,
        "-",
        &format!(
            "redrive starts: mode {:?}, max_items {:?}",
            request.mode, request.max_items
        ),
    );
    let deadline = function.then(|| Instant::now() + REDRIVE_FUNCTION_TIMEOUT);
    let result = gated(&engine, actor, &request, deadline).await;
    let (ran, next) = {
        let mut state = world.lock();
        match result {
            Ok(report) => {
                state.ext.trace.note(
                    actor,
                    "-",
                    &format!(
                        "redrive done: selected {}, succeeded {}, requeued {}, failed again {}, leased elsewhere {}, errors {}, adopted {}, DLQ deleted {}",
                        report.selected,
                        report.succeeded,
                        report.requeued,
                        report.failed_again,
                        report.leased_elsewhere,
                        report.errors,
                        report.adopted_from_dlq,
                        report.dlq_messages_deleted
                    ),
                );
                for item in report.items.iter().filter(|i| i.detail.is_some()) {
                    state.ext.trace.note(
                        actor,
                        &item.item_id,
                        &format!(
                            "{:?}: {}",
                            item.outcome,
                            item.detail.as_deref().unwrap_or_default()
                        ),
                    );
                }
                (
                    // A run held back counts as busy: it left its work for the next.
                    Some((
                        report.selected + usize::from(report.held_by_breaker.is_some()),
                        report.adopted_from_dlq,
                    )),
                    report.continuation_token.clone(),
                )
            }
            Err(e) => {
                state
                    .ext
                    .trace
                    .note(actor, "-", &format!("redrive failed: {e}"));
                (None, None)
            }
        }
    };
    if let (Some(token), false) = (next, function) {
        // The operator runs the command the report printed, `dlq redrive --continue
        // <token>`: the token alone (and the same pacing), its selection the token's.
        let again = RedriveRequest {
            continuation_token: Some(token),
            max_items: request.max_items,
            parallelism: request.parallelism,
            rate: request.rate,
            time_budget_secs: request.time_budget_secs,
            ..RedriveRequest::default()
        };
        world
            .lock()
            .ext
            .trace
            .note(actor, "-", "redrive continues from its token");
        match gated(&engine, actor, &again, None).await {
            // The printed line is always the request it continues.
            Err(e @ sqs_keeper_core::redrive::RedriveError::InvalidRequest(_)) => {
                world.lock().ext.violations.push((
                    "-".to_string(),
                    format!("the printed continuation was refused as another request: {e}"),
                ));
            }
            Err(e) => world.lock().ext.trace.note(
                actor,
                "-",
                &format!("redrive continuation failed: {e}"),
            ),
            Ok(report) => continued_its_selection(&mut world.lock(), &request, &report),
        }
    }
    ran
}

/// §3: a continuation takes only what the request it continues selects, and puts items
/// back as that request said: its named items, and its mode.
fn continued_its_selection(
    state: &mut crate::world::State,
    request: &RedriveRequest,
    report: &sqs_keeper_core::redrive::RedriveReport,
) {
    use sqs_keeper_core::redrive::ItemOutcomeKind as Kind;
    for item in &report.items {
        // An error may be the sweep's, before the selection (a DLQ message it could not
        // adopt): only what the run took counts.
        let taken = !matches!(
            item.outcome,
            Kind::Error | Kind::NotFound | Kind::HeldByBreaker
        );
        let unnamed =
            taken && !request.item_ids.is_empty() && !request.item_ids.contains(&item.item_id);
        let reprocessed = matches!(item.outcome, Kind::Resolved | Kind::FailedAgain);
        // A mode the check does not know takes no item of either kind.
        let other_mode = match request.mode {
            RedriveMode::Requeue => reprocessed,
            RedriveMode::Reprocess => item.outcome == Kind::Requeued,
            _ => reprocessed || item.outcome == Kind::Requeued,
        };
        if unnamed || other_mode {
            state.violate(
                Section::Record,
                &item.item_id,
                format!(
                    "a continuation took an item its request did not select ({:?} in a {:?} run of {:?})",
                    item.outcome, request.mode, request.item_ids
                ),
            );
        }
    }
}
