//! The polling control (docs/ARCHITECTURE.md §1.12) in the simulated worlds with a
//! breaker: the library's own [`PollingControl`], run each minute as its schedule runs it,
//! over the world's breaker table, an event source mapping the pollers obey, the pause's
//! marker, and a probe that invokes the worker with one message of the source queue.
//!
//! Every call takes simulated latency and fails at the world's rates: the marker and the
//! breaker as the table does, the mapping and the queue's attributes as SQS does. Half the
//! failed writes land all the same (a timeout whose answer was lost), so a run can be cut
//! between any two of its writes.
//!
//! The check of every step ([`crate::world::Checks::after_step`]): a disabled mapping is
//! recorded as paused, so some later run enables it again. At the end, polling runs.

use std::sync::Arc;
use std::time::SystemTime;

use futures::future::BoxFuture;
use sqs_keeper_core::testing::{MemoryBreakerStore, MemoryPauseMarker};
use sqs_keeper_core::{
    polling::MappingSwitch, polling::PauseMarker, polling::PauseState, polling::PollingControl,
    polling::ProbeOutcome, polling::SourceProbe, polling::SourceQueueState, ErrorClass,
    ProcessError,
};

use crate::breaker_store::SimBreakerStore;
use crate::world::{Checks, Faults, World};

/// Who the trace names for the control's calls.
pub const ACTOR: &str = "polling-control";

/// The event source mapping and the pause's record, as the world keeps them.
#[derive(Debug, Clone, Default)]
pub struct Polling {
    /// The mapping is disabled: the pollers receive nothing.
    pub disabled: bool,
    /// Since when it is disabled.
    pub disabled_since: Option<SystemTime>,
    /// The control's marker item (the pause and the control's lease).
    pub marker: MemoryPauseMarker,
}

/// The control over the world's ports.
pub type SimControl = PollingControl<SimBreakerStore, SimMapping, SimMarker, SimProbe>;

/// Builds the control of a world whose breaker table is `breaker`; its probes invoke
/// `invoke` with the messages they receive.
pub fn control(world: &Arc<World>, breaker: MemoryBreakerStore, invoke: ProbeInvoke) -> SimControl {
    PollingControl {
        breaker: SimBreakerStore::new(world.clone(), breaker, ACTOR),
        mapping: SimMapping(world.clone()),
        marker: SimMarker(world.clone()),
        probe: SimProbe {
            world: world.clone(),
            invoke,
        },
    }
}

/// A call's latency, then whether it fails at the rate `pick` reads; a failed write may
/// land all the same (`lands`, drawn by the caller).
async fn call(world: &World, pick: fn(&Faults) -> f64, what: &str) -> Result<(), ProcessError> {
    crate::store::call_latency(world).await;
    let fails = world
        .lock()
        .call_fails(pick, ACTOR, "-", &format!("{what} failed"));
    if fails {
        return Err(ProcessError::new(
            ErrorClass::ServerError,
            format!("{what}: unavailable (injected)"),
        ));
    }
    Ok(())
}

/// Whether a failed write landed all the same (half of them: a timeout whose answer was
/// lost).
fn landed_anyway(world: &World) -> bool {
    world.lock().chance(0.5)
}

/// A write that may fail before or after it lands: `apply` runs unless it failed before.
async fn write(
    world: &World,
    pick: fn(&Faults) -> f64,
    what: &str,
    apply: impl FnOnce(),
) -> Result<(), ProcessError> {
    match call(world, pick, what).await {
        Ok(()) => {
            apply();
            Ok(())
        }
        Err(error) => {
            if landed_anyway(world) {
                apply();
                world.lock().ext.trace.note(
                    "fault",
                    "-",
                    &format!("{ACTOR} {what} landed, its answer lost"),
                );
            }
            Err(error)
        }
    }
}

/// The worker's event source mapping (the Lambda API fails at the world's SQS rate).
#[derive(Debug, Clone)]
pub struct SimMapping(Arc<World>);

impl MappingSwitch for SimMapping {
    fn enabled(&self) -> BoxFuture<'_, Result<bool, ProcessError>> {
        Box::pin(async move {
            call(&self.0, |f| f.send, "get-event-source-mapping").await?;
            Ok(!self.0.lock().ext.polling.disabled)
        })
    }

    fn set_enabled(&self, enabled: bool) -> BoxFuture<'_, Result<(), ProcessError>> {
        Box::pin(async move {
            let world = &self.0;
            write(
                world,
                |f| f.send,
                "update-event-source-mapping",
                || {
                    let now = world.clock.system_time();
                    let mut state = world.lock();
                    let polling = &mut state.ext.polling;
                    if polling.disabled == enabled {
                        polling.disabled = !enabled;
                        polling.disabled_since = (!enabled).then_some(now);
                    }
                    let what = if enabled {
                        "enabled the mapping"
                    } else {
                        "disabled the mapping"
                    };
                    state.after_step(ACTOR, "-", what);
                },
            )
            .await
        })
    }

    fn disabled_since(&self) -> BoxFuture<'_, Result<Option<SystemTime>, ProcessError>> {
        Box::pin(async move {
            call(&self.0, |f| f.send, "get-event-source-mapping").await?;
            Ok(self.0.lock().ext.polling.disabled_since)
        })
    }
}

/// The pause's marker item, in the breaker's table.
#[derive(Debug, Clone)]
pub struct SimMarker(Arc<World>);

impl SimMarker {
    fn marker(&self) -> MemoryPauseMarker {
        self.0.lock().ext.polling.marker.clone()
    }
}

impl PauseMarker for SimMarker {
    fn lease(
        &self,
        now: SystemTime,
        until: SystemTime,
    ) -> BoxFuture<'_, Result<bool, ProcessError>> {
        Box::pin(async move {
            call(&self.0, |f| f.table, "marker lease").await?;
            self.marker().lease(now, until).await
        })
    }

    fn release(&self, until: SystemTime) -> BoxFuture<'_, Result<(), ProcessError>> {
        Box::pin(async move {
            call(&self.0, |f| f.table, "marker release").await?;
            self.marker().release(until).await
        })
    }

    fn read(&self) -> BoxFuture<'_, Result<PauseState, ProcessError>> {
        Box::pin(async move {
            call(&self.0, |f| f.table, "marker read").await?;
            self.marker().read().await
        })
    }

    fn write(&self, state: PauseState) -> BoxFuture<'_, Result<(), ProcessError>> {
        Box::pin(async move {
            let world = &self.0;
            write(
                world,
                |f| f.table,
                "marker write",
                || {
                    let mut locked = world.lock();
                    locked.ext.polling.marker.set_state(state);
                    if state.paused && !state.sweeping {
                        locked.ext.stats.pauses += 1;
                    }
                    locked.after_step(ACTOR, "-", &format!("recorded {state:?}"));
                },
            )
            .await
        })
    }
}

/// Invokes the worker with the messages a probe received, as the event source mapping
/// would, and resolves once it answered.
pub type ProbeInvoke = Arc<
    dyn Fn(Vec<sqs_keeper_core::testing::QueueMessage>, String) -> BoxFuture<'static, ()>
        + Send
        + Sync,
>;

/// The source queue's attributes, and the probe with one of its messages.
pub struct SimProbe {
    world: Arc<World>,
    invoke: ProbeInvoke,
}

impl SourceProbe for SimProbe {
    fn queue(&self) -> BoxFuture<'_, Result<SourceQueueState, ProcessError>> {
        Box::pin(async move {
            call(&self.world, |f| f.send, "get-queue-attributes").await?;
            let state = self.world.lock();
            let now = tokio::time::Instant::now();
            let visible = state
                .source()
                .messages()
                .iter()
                .filter(|m| m.visible_at <= now)
                .count();
            Ok(SourceQueueState {
                visible: visible as u64,
                retention: state.source().retention,
            })
        })
    }

    fn probe(&self) -> BoxFuture<'_, Result<ProbeOutcome, ProcessError>> {
        Box::pin(async move {
            call(&self.world, |f| f.send, "probe receive").await?;
            let (messages, arn) = crate::run::receive(&self.world, 1, 0.0);
            let Some(id) = messages.first().map(|m| m.id.clone()) else {
                return Ok(ProbeOutcome::Empty);
            };
            (self.invoke)(messages, arn).await;
            let kept = self
                .world
                .lock()
                .source()
                .messages()
                .iter()
                .any(|m| m.id == id);
            Ok(if kept {
                ProbeOutcome::Returned
            } else {
                ProbeOutcome::Processed
            })
        })
    }
}

/// Runs the control each minute, as its schedule does, until `stop`.
pub async fn run_each_minute(
    world: Arc<World>,
    control: Arc<SimControl>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        run_once(&world, &control).await;
    }
}

/// One control run, noted in the trace.
pub async fn run_once(world: &World, control: &SimControl) {
    let action = control.run(world.clock.system_time()).await;
    world
        .lock()
        .ext
        .trace
        .note(ACTOR, "-", &format!("control run: {action:?}"));
}

/// At the end, with every fault healed and the downstream healthy: polling runs again
/// within half an hour of control runs.
pub async fn polling_restored(world: &World, control: &SimControl) {
    for _ in 0..30 {
        if !world.lock().ext.polling.disabled {
            return;
        }
        run_once(world, control).await;
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    }
    if world.lock().ext.polling.disabled {
        world.lock().violate(
            crate::world::Section::Breaker,
            "-",
            "polling is still stopped half an hour after the faults healed and the queue drained"
                .into(),
        );
    }
}
