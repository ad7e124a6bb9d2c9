//! The simulated AWS side as the library's ports: the library's own in-memory world
//! ([`sqs_keeper_core::testing::MemoryStore`] over [`crate::world::World`]), each store call
//! one AWS call applied atomically with the conditions the DynamoDB adapter sends, taking
//! the simulation's latency ([`crate::world::latency`]) and failing at the world's fault
//! rates, every change told to the simulation's checks ([`crate::world::observe`]). What
//! is the simulation's own here: the source queue's visibility as the worker's redelivery
//! spacing uses it ([`SimVisibility`], with its §1.11 check), and the Extended-Client
//! resolver the worker and the redrive follow pointers with ([`SimResolver`]).

use futures::future::BoxFuture;
use std::time::Duration;

use sqs_keeper_core::ports::PayloadStore;
use sqs_keeper_core::recording::RecordingSettings;
use sqs_keeper_core::{redelivery::Hide, redelivery::QueueTiming, redelivery::VisibilityPort};
use sqs_keeper_core::{testing::MemoryStore, testing::QueueMessage};
use sqs_keeper_core::{ErrorClass, ProcessError};

use crate::world::{draw_latency, Checks, Section, Sim, State, World};

/// The store every worker invocation, run and operator shares: the library's ports over
/// the simulated world, one handle per actor ([`MemoryStore::as_actor`]).
pub type SimStore = MemoryStore<Sim>;

/// The store of `world`, with the recording settings the worker and runs use, following
/// pointers as the worker does ([`worker_payload_policy`]).
pub fn sim_store(world: std::sync::Arc<World>, settings: RecordingSettings) -> SimStore {
    MemoryStore::over(world, settings).with_payload_policy(worker_payload_policy())
}

/// A call's latency ([`draw_latency`]) for the simulation's own calls (the breaker's and
/// the idempotency table's, the source queue's visibility).
pub async fn call_latency(world: &World) {
    let delay = draw_latency(&mut world.lock());
    if delay.is_zero() {
        tokio::task::yield_now().await;
    } else {
        tokio::time::sleep(delay).await;
    }
}

/// The bucket payloads go to.
pub const BUCKET: &str = "sim-payloads";

fn unavailable(service: &str, step: &str) -> ProcessError {
    ProcessError::new(
        ErrorClass::ServerError,
        format!("{step}: {service} unavailable (injected)"),
    )
    .with_step(step)
}

/// A queue message as Lambda would hand it to the worker.
pub fn to_sqs_message(m: &QueueMessage, queue_arn: &str) -> aws_lambda_events::sqs::SqsMessage {
    m.to_sqs_message(Some(queue_arn))
}

/// The bucket the producer offloads payloads to (an Extended-Client sender's), which the
/// worker's payload policy allows.
pub const PRODUCER_BUCKET: &str = "producer-payloads";

/// The worker's and the redrive's Extended-Client resolver: the library's policy check
/// (`PayloadPolicy::pointer_in`, as the adapter's resolver makes it), then the object from
/// the simulated bucket, with its latency and S3 faults.
pub struct SimResolver {
    store: SimStore,
    policy: sqs_keeper_core::pointer::PayloadPolicy,
}

/// The worker's payload policy in every world: the producer's bucket and the store's.
fn worker_payload_policy() -> sqs_keeper_core::pointer::PayloadPolicy {
    sqs_keeper_core::pointer::PayloadPolicy::allowing([PRODUCER_BUCKET, BUCKET])
}

impl SimResolver {
    /// A resolver for `store`'s actor, under the worker's payload policy.
    pub fn new(store: SimStore) -> Self {
        Self {
            store,
            policy: worker_payload_policy(),
        }
    }
}

impl sqs_keeper_core::batch::BodyResolver for SimResolver {
    fn resolve<'a>(&'a self, body: &'a str) -> BoxFuture<'a, Option<Result<String, ProcessError>>> {
        Box::pin(async move {
            let pointer = match self.policy.pointer_in(body)? {
                Ok(pointer) => pointer,
                Err(refused) => return Some(Err(refused)),
            };
            Some(PayloadStore::fetch(&self.store, &pointer).await)
        })
    }
}

/// `ChangeMessageVisibility` on the source queue and its attributes, as the worker's
/// redelivery spacing uses them (`sqs_keeper_core::redelivery`), for one sandbox.
pub struct SimVisibility {
    store: SimStore,
}

/// §1.11 at the step: a sandbox that read the queue's timing hides a message only so long
/// that its next delivery still has a visibility timeout before the message expires. The
/// worker decides the delay a little before the hide lands, so a minute's slack is allowed.
fn hidden_within_retention(
    state: &mut State,
    item: &str,
    message_id: &str,
    (left, delay): (Duration, Duration),
) {
    if delay.is_zero() || message_id.is_empty() {
        return;
    }
    if delay + crate::run::VISIBILITY > left + Duration::from_secs(60) {
        state.violate(
            Section::Spacing,
            item,
            format!(
                "message {message_id} hidden for {} s with {} s of retention left, by a sandbox that had read the queue's retention: its next delivery has less than a visibility timeout",
                delay.as_secs(),
                left.as_secs()
            ),
        );
    }
}

impl SimVisibility {
    /// The visibility port of `store`'s actor.
    pub fn new(store: SimStore) -> Self {
        Self { store }
    }

    fn actor(&self) -> &str {
        self.store.actor()
    }
}

impl VisibilityPort for SimVisibility {
    fn hide<'a>(&'a self, records: &'a [Hide]) -> BoxFuture<'a, Vec<Result<(), ProcessError>>> {
        Box::pin(async move {
            // Whether the sandbox knew the queue's timing when it made these delays (the
            // call starts right after): another invocation's read may land during the
            // call's latency, too late for them.
            let knew_timing = self
                .store
                .world()
                .lock()
                .ext
                .ledger
                .timing_known
                .contains(self.actor());
            call_latency(self.store.world()).await;
            let mut state = self.store.world().lock();
            records
                .iter()
                .map(|hide| self.hide_one(&mut state, hide, knew_timing))
                .collect()
        })
    }

    fn queue_timing<'a>(&'a self, queue_arn: &'a str) -> BoxFuture<'a, Option<QueueTiming>> {
        Box::pin(async move {
            call_latency(self.store.world()).await;
            let mut state = self.store.world().lock();
            if queue_arn != state.source().arn {
                return None;
            }
            if state.sqs_call_fails(
                self.actor(),
                "-",
                "could not read the source queue's attributes",
            ) {
                return None;
            }
            state
                .ext
                .ledger
                .timing_known
                .insert(self.actor().to_string());
            Some(QueueTiming {
                retention: state.source().retention,
                visibility_timeout: crate::run::VISIBILITY,
            })
        })
    }
}

impl SimVisibility {
    /// One entry of a `ChangeMessageVisibilityBatch`, with the §1.11 check that a hide
    /// honours the downstream's `Retry-After` wherever the message's retention leaves
    /// room for it.
    fn hide_one(
        &self,
        state: &mut State,
        hide: &Hide,
        knew_timing: bool,
    ) -> Result<(), ProcessError> {
        if state.sqs_call_fails(self.actor(), "-", "hide failed") {
            return Err(unavailable("SQS", "hide"));
        }
        let receipt = hide.receipt_handle.as_str();
        let (item, message_id, sent_at_ms) = match state.source().by_receipt(receipt) {
            Some(m) => (m.item_id(), m.id.clone(), m.sent_at_ms),
            None => ("-".to_string(), String::new(), 0),
        };
        // What is left of the message's retention now.
        let retention_ms = i64::try_from(state.source().retention.as_millis()).unwrap_or(i64::MAX);
        let left_ms = sent_at_ms.saturating_add(retention_ms) - self.store.world().now_ms();
        let left = Duration::from_millis(u64::try_from(left_ms).unwrap_or(0));
        if let Some(asked) = state.ext.ledger.retry_after.get(receipt).copied() {
            // Under a breaker the worker keeps a quarter of the retention in reserve for
            // the polling control's sweeps (docs/ARCHITECTURE.md §1.12).
            let retention = state.source().retention;
            let reserve =
                if state.ext.breaker.is_some() && sqs_keeper_core::polling::pausable(retention) {
                    sqs_keeper_core::polling::sweep_reserve(state.source().retention)
                } else {
                    Duration::ZERO
                };
            let room = asked + crate::run::VISIBILITY + reserve + Duration::from_secs(60);
            let doubled = state.ext.ledger.doubled.contains(receipt);
            if hide.delay < asked && left > room && !doubled {
                state.violate(
                    Section::Spacing,
                    &item,
                    format!(
                        "message {message_id} hidden for {} s though the downstream asked for {} s (Retry-After), with {} s of retention left",
                        hide.delay.as_secs(),
                        asked.as_secs(),
                        left.as_secs()
                    ),
                );
            }
        }
        match state.source_mut().change_visibility(receipt, hide.delay) {
            Ok(()) => {
                if knew_timing {
                    hidden_within_retention(state, &item, &message_id, (left, hide.delay));
                }
                state
                    .ext
                    .ledger
                    .hidden
                    .insert(receipt.to_string(), hide.delay);
                if knew_timing {
                    state.ext.ledger.hidden_blind.remove(&message_id);
                } else {
                    state.ext.ledger.hidden_blind.insert(message_id.clone());
                }
                state.after_step(
                    self.actor(),
                    &item,
                    &format!("hid message {message_id} for {} s", hide.delay.as_secs()),
                );
                Ok(())
            }
            Err(refused) => {
                state
                    .ext
                    .trace
                    .note(self.actor(), &item, &format!("hide refused: {refused}"));
                Err(ProcessError::new(ErrorClass::Validation, refused).with_step("hide"))
            }
        }
    }
}
