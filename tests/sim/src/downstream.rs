//! The simulated downstream: the service the worker delivers to, as a
//! [`sqs_keeper_core::Processor`]. Each payload carries its behaviour (`healthy`, `flaky`,
//! `slow`, `poison`, `gone`, `forbidden`); latencies and failures are drawn from the world's seed, and an
//! outage makes every call fail with 503. Errors are built from HTTP statuses through the
//! library's own classification, as the HTTP processor's are.

use std::sync::Arc;
use std::time::Duration;

use sqs_keeper_core::{Outcome, ProcessError, Processor, WorkItem};

use crate::world::{Checks, Section, World};

/// The payload's secret (its `note`), which no log line may carry.
fn secret_of(body: &str) -> String {
    body.find(crate::logs::SECRET)
        .map(|at| {
            body[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect()
        })
        .unwrap_or_default()
}

/// How the simulated handler's panics begin (the runs silence these, and only these).
pub const HANDLER_PANIC: &str = "simulated handler bug";

/// How a payload behaves at the downstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Answers quickly; now and then a 5xx or 429.
    Healthy,
    /// Fails most calls with a transient status until the faults are healed.
    Flaky,
    /// Sometimes hangs far longer than any deadline until healed.
    Slow,
    /// Always 400: a validation failure, dead-lettered on first sight.
    Poison,
    /// Always 404 or 410.
    Gone,
    /// Always 403: a permission failure, held for manual review.
    Forbidden,
    /// The handler panics on half its calls until the faults are healed.
    Panicky,
    /// The handler panics on every call, healed or not: an item no redrive can finish, and
    /// whose runs tell nothing of the downstream (the breaker's probe must look past it).
    Doomed,
}

impl Behaviour {
    /// Its name in a body.
    pub fn name(self) -> &'static str {
        match self {
            Behaviour::Healthy => "healthy",
            Behaviour::Flaky => "flaky",
            Behaviour::Slow => "slow",
            Behaviour::Poison => "poison",
            Behaviour::Gone => "gone",
            Behaviour::Forbidden => "forbidden",
            Behaviour::Panicky => "panicky",
            Behaviour::Doomed => "doomed",
        }
    }

    /// The behaviour a body names (healthy when it names none).
    pub fn of_body(body: &str) -> Behaviour {
        let named = |b: Behaviour| body.contains(&format!("\"behaviour\":\"{}\"", b.name()));
        [
            Behaviour::Flaky,
            Behaviour::Slow,
            Behaviour::Poison,
            Behaviour::Gone,
            Behaviour::Forbidden,
            Behaviour::Panicky,
            Behaviour::Doomed,
        ]
        .into_iter()
        .find(|b| named(*b))
        .unwrap_or(Behaviour::Healthy)
    }
}

/// The downstream, as the worker's processor.
#[derive(Debug, Clone)]
pub struct Downstream {
    world: Arc<World>,
    actor: String,
}

impl Downstream {
    /// The downstream of `world`, called by `actor` (for the trace).
    pub fn new(world: Arc<World>, actor: &str) -> Self {
        Downstream {
            world,
            actor: actor.to_string(),
        }
    }
}

/// A call of the downstream for an item, in progress: counted in the world while it lasts
/// (also when its caller is dropped midway, a run that dies): a redrive run's among the
/// runs' (§3), and in the worlds with idempotency every caller's (§6).
struct RunningCall {
    world: Arc<World>,
    item_id: String,
    redrive: bool,
    /// The sandbox whose probe on its own this call is (§1.12: one at a time).
    own_probe: Option<String>,
}

impl Drop for RunningCall {
    fn drop(&mut self) {
        let mut state = self.world.lock();
        if self.redrive {
            if let Some(n) = state.ext.redriving_now.get_mut(&self.item_id) {
                *n = n.saturating_sub(1);
            }
        }
        if let Some(n) = state.ext.running_now.get_mut(&self.item_id) {
            *n = n.saturating_sub(1);
        }
        if let Some(sandbox) = &self.own_probe {
            if let Some(n) = state.ext.own_probes_now.get_mut(sandbox) {
                *n = n.saturating_sub(1);
            }
        }
    }
}

/// §1.6: in a FIFO queue, the message still in the queue before `item` in its group whose
/// payload is neither delivered nor held by the DLQ or a dead record (it has not left the
/// group's stream), if any.
fn unsettled_before(state: &crate::world::State, item: &WorkItem) -> Option<String> {
    let group = item.message_group_id.as_deref()?;
    if !state.source().fifo {
        return None;
    }
    state
        .source()
        .messages()
        .iter()
        .filter(|m| m.group.as_deref() == Some(group) && m.id < item.message_id)
        .find(|m| !state.payload_is_safe(&m.body_sha256, Some(&m.id)))
        .map(|m| m.id.clone())
}

impl Downstream {
    /// Whether the handler fails to decode a panicky payload this time (a quarter of the
    /// calls it does not panic on, until the world heals): a failure that never reaches
    /// the downstream, which must decide no probe.
    fn fails_to_decode(&self) -> bool {
        let mut state = self.world.lock();
        !state.faults.healed && state.rng.u32(0..4) == 0
    }

    /// The checks at the start of an attempt. §1.6: a FIFO group's order is kept. §1.7:
    /// none starts after its invocation's cut-off. §3: a redrive's attempt starts only while its run holds the item's lease.
    /// §1.12: a sandbox probing on its own does so with one record at a time. Returns the
    /// sandbox when this call is such a probe.
    fn check_start(&self, item: &WorkItem) -> Option<String> {
        let now = self.world.clock.now();
        let mut state = self.world.lock();
        if self.actor.starts_with("worker") {
            if let Some(earlier) = unsettled_before(&state, item) {
                state.violate(
                    Section::FifoOrder,
                    &item.item_id,
                    format!(
                        "message {} attempted while {earlier}, earlier in its group, is neither delivered nor dead-lettered",
                        item.message_id
                    ),
                );
            }
            if let Some(broken) =
                crate::breaker_store::call_refused_by_what_it_knew(&state, &self.actor, now.into())
            {
                state.violate(Section::Breaker, &item.item_id, broken);
            }
            let own_probe =
                crate::breaker_store::probes_on_its_own(&state, &self.actor, now.into())
                    .then(|| self.actor.clone());
            if let Some(sandbox) = &own_probe {
                let running = state.ext.own_probes_now.entry(sandbox.clone()).or_default();
                *running += 1;
                let running = *running;
                if running > 1 {
                    state.violate(
                        Section::Breaker,
                        &item.item_id,
                        format!("{sandbox}, out of touch with the breaker's table, probed with {running} records at once: one probe per sandbox"),
                    );
                }
            }
            if let Some(cut_off) = sqs_keeper_core::context::deadline() {
                if std::time::SystemTime::from(now) > cut_off {
                    state.violate(
                        Section::Deadline,
                        &item.item_id,
                        format!(
                            "an attempt on message {} started after its invocation's cut-off",
                            item.message_id
                        ),
                    );
                }
            }
            return own_probe;
        }
        if let Some(broken) =
            crate::breaker_store::redrive_call_refused(&state, &self.actor, now.into())
        {
            state.violate(Section::Breaker, &item.item_id, broken);
        }
        let lease = state
            .table
            .get(&item.item_id)
            .and_then(|row| row.record.lease_expires_at);
        // Attempts are cut 30 s before the lease ends (`redrive::LEASE_MARGIN`) and none
        // starts past that cut; a second of allowance for the expiry's whole seconds.
        let cut =
            |expires: i64| expires - sqs_keeper_core::redrive::LEASE_MARGIN.as_secs() as i64 + 1;
        if lease.is_some_and(|expires| now.timestamp() >= cut(expires)) {
            state.violate(
                Section::Record,
                &item.item_id,
                format!(
                    "{} started an attempt after the item's lease cut (30 s before it expires): another run may take it",
                    self.actor
                ),
            );
        }
        None
    }
}

impl Processor for Downstream {
    async fn process(&self, item: &WorkItem) -> Result<Outcome, ProcessError> {
        // §3: one lease owner at a time. Two redrive runs never process one item at once,
        // even when a worker recorded a new failure (another payload) while one ran (twins
        // worlds 11891 and 25052: `conditions::lease_is_free`). The worker may: another body
        // under the same item id is another message. §6: with idempotency, nobody does.
        let call = {
            let mut state = self.world.lock();
            let redrive = !self.actor.starts_with("worker");
            if redrive {
                let running = state
                    .ext
                    .redriving_now
                    .entry(item.item_id.clone())
                    .or_default();
                *running += 1;
                if *running > 1 {
                    state.violate(
                        Section::Record,
                        &item.item_id,
                        format!(
                            "{} processed it while another redrive run was processing it: one lease owner at a time",
                            self.actor
                        ),
                    );
                }
            }
            if state.ext.idempotency.is_some() {
                let running = state
                    .ext
                    .running_now
                    .entry(item.item_id.clone())
                    .or_default();
                *running += 1;
                if *running > 1 {
                    state.violate(
                        Section::Idempotency,
                        &item.item_id,
                        format!(
                            "{} called the downstream for it while another call for the same idempotency key was running",
                            self.actor
                        ),
                    );
                }
            }
            RunningCall {
                world: self.world.clone(),
                item_id: item.item_id.clone(),
                redrive,
                own_probe: None,
            }
        };
        let mut call = call;
        call.own_probe = self.check_start(item);
        if sqs_keeper_core::pointer::S3Pointer::parse(&item.body).is_some() {
            self.world.lock().violate(
                Section::NoPointer,
                &item.item_id,
                format!(
                    "{} handed the downstream a pointer's text as the payload of message {}",
                    self.actor, item.message_id
                ),
            );
        }
        // §6: a handler receives the payload, its envelope unwrapped (the record keeps the
        // body as it arrived, so a redrive unwraps it again).
        let payload = item.payload();
        if payload.contains("\"Type\":\"Notification\"") || payload.contains("\"detail-type\"") {
            self.world.lock().violate(
                Section::Envelope,
                &item.item_id,
                format!(
                    "{} handed the downstream the envelope of message {}, not its payload",
                    self.actor, item.message_id
                ),
            );
        }
        let behaviour = Behaviour::of_body(payload);
        if matches!(behaviour, Behaviour::Panicky | Behaviour::Doomed) {
            let panics = behaviour == Behaviour::Doomed || {
                let mut state = self.world.lock();
                !state.faults.healed && state.rng.bool()
            };
            if panics {
                self.world.lock().ext.trace.note(
                    &self.actor,
                    &item.item_id,
                    &format!("the handler panics on message {}", item.message_id),
                );
                #[allow(clippy::panic)] // the behaviour under test: a handler that panics
                {
                    panic!(
                        "{HANDLER_PANIC} on item {} ({})",
                        item.item_id,
                        secret_of(item.payload())
                    );
                }
            }
        }
        if behaviour == Behaviour::Panicky && self.fails_to_decode() {
            // The handler's own error, before any call: the downstream never sees it.
            return Err(ProcessError::new(
                sqs_keeper_core::ErrorClass::Unknown,
                format!("the handler could not decode message {}", item.message_id),
            ));
        }
        // The downstream answers this sandbox (§1.12: what decides a probe).
        self.world
            .lock()
            .ext
            .ledger
            .answered_since_probe
            .insert(self.actor.clone(), true);
        let (latency, status, retry_after) = {
            let mut state = self.world.lock();
            let healed = state.faults.healed;
            let latency = Duration::from_millis(5 + state.rng.u64(0..300));
            let roll = state.rng.f64();
            let (latency, status) = match behaviour {
                Behaviour::Poison => (latency, [400, 422][state.rng.usize(0..2)]),
                Behaviour::Gone => (latency, [404, 410][state.rng.usize(0..2)]),
                Behaviour::Forbidden => (latency, 403),
                _ if state.ext.outage => (latency, 503),
                Behaviour::Flaky if !healed && roll < 0.7 => (
                    latency,
                    [500, 502, 503, 504, 429, 408, 501][state.rng.usize(0..7)],
                ),
                Behaviour::Slow if !healed && roll < 0.5 => (Duration::from_secs(120), 200),
                Behaviour::Healthy if !healed && roll < 0.05 => (latency, 503),
                _ => (latency, 200),
            };
            // Half the 429s say when to come back: from half a minute to a quarter hour, or
            // (one in three) up to five hours, past every spacing cap the worlds draw
            // (15 min, 1 h, 4 h) and some retentions.
            let retry_after = (status == 429 && state.rng.bool()).then(|| {
                let most = if state.rng.u32(0..3) == 0 {
                    18_000
                } else {
                    900
                };
                Duration::from_secs(state.rng.u64(30..most))
            });
            (latency, status, retry_after)
        };
        tokio::time::sleep(latency).await;
        if status == 200 {
            let sha = sqs_keeper_core::hex::sha256_hex(item.body.as_bytes());
            let mut state = self.world.lock();
            let n = state.ext.ledger.delivered.entry(sha).or_default();
            *n += 1;
            if *n > 1 {
                state.ext.stats.duplicate_deliveries += 1;
            }
            if self.actor.starts_with("worker") {
                *state
                    .ext
                    .ledger
                    .worker_deliveries
                    .entry(item.message_id.clone())
                    .or_default() += 1;
            }
            state.after_step(
                &self.actor,
                &item.item_id,
                &format!(
                    "delivered message {} ({}; {} bytes, {})",
                    item.message_id,
                    behaviour.name(),
                    item.body.len(),
                    &item.body.chars().take(60).collect::<String>()
                ),
            );
            Ok(Outcome::Done)
        } else {
            {
                let mut state = self.world.lock();
                if self.actor.starts_with("worker") {
                    let receipt = format!("{}#{}", item.message_id, item.receive_count);
                    match retry_after {
                        Some(after) => state.ext.ledger.retry_after.insert(receipt, after),
                        None => state.ext.ledger.retry_after.remove(&receipt),
                    };
                }
                state.ext.trace.note(
                    &self.actor,
                    &item.item_id,
                    &format!(
                        "downstream answered {status}{} to message {}",
                        retry_after.map_or(String::new(), |d| format!(
                            " (Retry-After {} s)",
                            d.as_secs()
                        )),
                        item.message_id
                    ),
                );
            }
            // Some downstreams answer errors at length: the record must stay bounded.
            let verbose = item.body.len() > 50_000;
            // The answer quotes what it refused, as real services do: the payload's note.
            let quoted = secret_of(item.payload());
            let mut error = ProcessError::from_http_status(
                status,
                if verbose {
                    format!(
                        "downstream answered {status}: refused \"{quoted}\" {}",
                        "e".repeat(20_000)
                    )
                } else {
                    format!("downstream answered {status}: refused \"{quoted}\"")
                },
            );
            if let Some(after) = retry_after {
                error = error.with_retry_after(after);
            }
            if verbose {
                error = error
                    .with_detail("<html>".repeat(5_000))
                    .with_cause("c".repeat(5_000));
            }
            Err(error)
        }
    }
}
