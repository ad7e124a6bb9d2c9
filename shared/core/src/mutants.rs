//! Defects fixed earlier, kept so that they can be switched back on in the deterministic
//! simulation (`sqs-keeper-sim`), which must find each one: a simulator that cannot find
//! known bugs proves nothing about the unknown ones.
//!
//! Only the test-only `sim` feature can switch a mutant on, and only on the calling thread
//! (each simulated world runs on one). Without the feature [`is_on`] is `false`, a
//! constant the compiler removes with the code behind it: no shipped binary enables the
//! feature. See `docs/SIMULATION.md`.

/// Whether this build has the simulation's hooks (the test-only `sim` feature: mutants that
/// can be switched on). The functions' binaries assert at compile
/// time that it is `false`, so no build that has them can be a function binary: a
/// workspace-wide build that unified the feature in fails to compile them instead of
/// producing a binary that tests would take for the shipped one (the Makefile builds and
/// tests the simulation apart).
pub const SIMULATION_HOOKS: bool = cfg!(feature = "sim");

/// A fixed defect that can be switched back on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mutant {
    /// Attempts are not cut at the deadline's cut-off and the batch is not guarded at the
    /// hard stop: a hanging downstream runs the invocation past its deadline.
    DeadlineOverrun,
    /// A requeue marks the record resolved when the message is sent, not when the worker
    /// has finished it.
    RequeueResolvesOnSend,
    /// The sweep deletes a DLQ message because its item is resolved, whatever payload the
    /// message holds.
    SweepDeletesByItemId,
    /// A lease left by a run that died is never taken back: the item stays `redriving`.
    LeasesNeverTakenBack,
    /// One DLQ message that cannot be recorded aborts the whole sweep (and the run).
    PoisonMessageAbortsSweep,
    /// Compaction keeps the ids of dropped attempts: `attempt_ids` grows for ever.
    UnboundedAttemptIds,
    /// The worker resolves a requeued record only once the run has marked it `requeued`:
    /// a message it finishes first leaves the record `requeued` for ever.
    RequeueFinishNeedsMark,
    /// A purge deletes every DLQ message of a selected item id, whatever it holds and
    /// however the record changed since the selection.
    PurgeByItemId,
    /// Every record of a FIFO group going back is hidden for its own delay: a later one
    /// hidden longer than the group's first holds it, and it may expire behind it.
    FifoHidesWholeGroup,
    /// The downstream's `Retry-After` does not reach the redelivery delay.
    RetryAfterIgnored,
    /// Hides are not capped by the message's retention, and a record without room for
    /// its next delivery is returned rather than dead-lettered.
    RetentionIgnored,
    /// An attempt of a delivery recorded twice (invoked twice, or again after its DLQ send
    /// failed) is appended again when compaction had dropped its id: compaction may drop
    /// the latest delivery's attempts, and a known sibling does not cover them. The ids of
    /// unsent deliveries compaction keeps since go too: they would cover the same twins.
    DroppedAttemptRecordedAgain,
    /// A redrive's attempts are cut at the run's deadline only, not before the item's
    /// lease ends: a slow item runs on after another run may have taken it.
    AttemptsPastLease,
    /// A FIFO batch goes on after a failure: a group's later records run while an earlier
    /// one goes back to the queue.
    FifoGoesOnAfterFailure,
    /// A record the batch does not run on its last receive (held back, or not started
    /// before the cut-off) is returned unstarted: the queue's redrive policy moves it
    /// without a record.
    UnstartedLeftToRedrivePolicy,
    /// A half-open breaker lets every record through, not the one probe.
    HalfOpenWithoutProbe,
    /// Work runs although another attempt holds the item's idempotency claim.
    InProgressClaimIgnored,
    /// An ineligible item a forced run left leased is never taken back by a run that is not
    /// forced: it stays `redriving`.
    IneligibleLeasesNeverTakenBack,
    /// A failed record's error is logged whole, with the values its message quotes.
    ErrorsLoggedWhole,
    /// A redrive's probe run that reprocessed nothing keeps the breaker's probe until it
    /// lapses: every sandbox refuses its records meanwhile.
    RedriveProbeKept,
    /// An item id with a character SQS refuses in an attribute is kept as it is: every DLQ
    /// send of its item fails with `InvalidMessageContents`.
    IdsUnsafeForSqs,
    /// A sandbox has no probe slot of its own: out of touch with the breaker's table, every
    /// record that finds it half-open probes on its own.
    ProbeSlotShared,
    /// A `Retry-After` longer than the spacing's cap (`WORKER_REDELIVERY_MAX_SECS`) is
    /// hidden only to the cap.
    RetryAfterCappedBySpacing,
    /// A DLQ claim does not say which receive took it: a claim left by a delivery cut
    /// between its record write and its DLQ send (or whose release failed) holds every
    /// later delivery back, and the message reaches the DLQ by the redrive policy alone.
    CutClaimKept,
    /// A sandbox's failed read of the queue's timing overwrites what a concurrent
    /// invocation of the same sandbox read: hides go uncapped by the retention.
    TimingForgotten,
    /// A redrive's probe run takes one item only: an eligible item that tells nothing of
    /// the downstream (its handler panics) is every probe's item, and the breaker stays
    /// half-open with every other item waiting.
    ProbeStuckOnOneItem,
    /// A dead letter whose record write failed is sent to the DLQ all the same, as if the
    /// write had landed (a throttled `UpdateItem` taken for written).
    SentBeforePersisted,
    /// A purge deletes the payload objects of the records it kept (found changed since
    /// its selection) as well as of those it deleted.
    PurgeDeletesKeptObjects,
    /// The polling control disables the mapping before it records the pause: a failed
    /// marker write then leaves a mapping nothing will enable again.
    MappingDisabledBeforeMarker,
    /// A purge lets a selected record's DLQ messages go though the record's conditional
    /// delete was refused (a redrive failed the item again since the selection).
    PurgeTakesMessagesOfKeptRecords,
    /// A purge removes the records it selected that are in flight (`requeued`,
    /// `redriving`) with their payload objects.
    PurgeRemovesInFlight,
    /// The worker's probe closes the breaker on a failure that never reached the
    /// downstream (a handler's own decode error).
    ProbeDecidedWithoutDownstream,
    /// A continuation token resumes a position only: the selection (filters, item ids,
    /// mode, `force`, `dry_run`) comes from the command that continues, so the printed
    /// `dlq redrive --continue <token>` redrives items never selected.
    ContinuationDropsSelection,
    /// `dlq clear` ignores its snapshot: it removes records and DLQ messages of failures
    /// that arrived while it ran.
    ClearIgnoresItsSnapshot,
    /// A FIFO DLQ message's deduplication id includes the receive count: a later delivery
    /// re-sending a source message's DLQ message is not deduplicated.
    DeduplicationByReceive,
    /// A redrive deletes a resolved item's payload object at once: a worker failing a
    /// source message of the same payload meanwhile records it under that object, and its
    /// record and DLQ message point to nothing.
    ResolveDeletesLivePayload,
    /// The polling control pauses a queue whose sweep interval a lapsing lease can
    /// outlast (a retention of 40 minutes and up): a run cut before it gave its lease back
    /// delays the next sweep past the worker's reserve.
    SweepsOutlastedByLease,
    /// A clear keeps a failure recorded after its snapshot only by its last attempt: one
    /// whose attempt began before the snapshot, recorded and dead-lettered after it, is
    /// cleared with its DLQ message.
    ClearDatesByLastAttemptOnly,
    /// An adopted record is dated by its message's `SentTimestamp` (its source queue's):
    /// a clear whose snapshot the adoption postdates takes it as older, and clears it.
    AdoptionDatedBySentTime,
    /// A probe's bookkeeping replaces what the sandbox knows with the state its record read
    /// before probing: an opening another record of the sandbox wrote meanwhile is
    /// forgotten, and the sandbox calls the downstream while it knew the breaker open.
    ProbeRemembersStaleState,
    /// Compaction drops the claim of a message whose every entry goes though its DLQ send
    /// is under way: a twin of that delivery claims again, appends its attempts a second
    /// time and sends a second DLQ message. The ids of unsent deliveries compaction keeps
    /// since ([`Mutant::CompactionForgetsUnsentAttempts`]) go too: they would cover the twin.
    CompactionDropsUnsentClaims,
    /// A probe closes the breaker on an item resolved with nothing done (its idempotency
    /// key completed before), which never reached the downstream: a redrive's probe run,
    /// or a breaker's probe (a message group's, behind which a redrive's idempotency sits).
    ProbeClosedBySkippedItem,
    /// A delivery refused by its twin's claim at the same receive appends the attempts
    /// whose ids compaction dropped: they are counted twice. The ids of unsent deliveries
    /// compaction keeps since go too: they would cover the twin.
    TwinAppendsAgain,
    /// Compaction drops the unsent claim of the receive just before a message's latest, as
    /// an earlier receive's: that delivery's twin appends its attempts a second time and
    /// sends a second DLQ message. The ids of unsent deliveries compaction keeps since
    /// ([`Mutant::CompactionForgetsUnsentAttempts`]) go too: they would cover the twin.
    CompactionDropsRunningClaim,
    /// Compaction deletes the "DLQ message sent" mark of a message whose every entry goes:
    /// a twin of its delivery, or its next receive, appends its attempts again and sends a
    /// second DLQ message.
    CompactionForgetsSentMarks,
    /// Compaction drops every id of a delivery whose entries all go though its message is
    /// not marked sent: after a failed DLQ send, its twin appends its attempts again.
    CompactionForgetsUnsentAttempts,
    /// Compaction lists the one id of a single-attempt unsent delivery twice: DynamoDB
    /// refuses the set, the history grows past its limit, and the places spent on the
    /// duplicates leave out an older delivery's ids, whose twin appends them again.
    CompactionListsAnIdTwice,
    /// Compaction keeps at most twice as many attempt ids as history entries, with no
    /// spare: under a history of two, an unsent delivery's ids do not fit, and its twin
    /// appends its attempts a second time.
    CompactionRoomByHistoryKept,
    /// Compaction keeps the ids of an unsent delivery only at its message's latest receive
    /// or the one before: a twin of the first receive, still running after two more, appends
    /// its attempts a second time.
    CompactionKeepsOnlyRecentReceives,
    /// A run takes the lease of a dead item whose lease is still live (a worker recorded a
    /// new failure while another run held it), and a run's failure write lands on a record
    /// a worker's new failure set dead: two runs process the item at once, and the stale
    /// run's error overwrites the new failure's.
    LeaseTakenUnderNewFailure,
}

impl Mutant {
    /// Every mutant.
    pub const ALL: [Mutant; 50] = [
        Mutant::DeadlineOverrun,
        Mutant::RequeueResolvesOnSend,
        Mutant::SweepDeletesByItemId,
        Mutant::LeasesNeverTakenBack,
        Mutant::PoisonMessageAbortsSweep,
        Mutant::UnboundedAttemptIds,
        Mutant::RequeueFinishNeedsMark,
        Mutant::PurgeByItemId,
        Mutant::FifoHidesWholeGroup,
        Mutant::RetryAfterIgnored,
        Mutant::RetentionIgnored,
        Mutant::DroppedAttemptRecordedAgain,
        Mutant::AttemptsPastLease,
        Mutant::FifoGoesOnAfterFailure,
        Mutant::UnstartedLeftToRedrivePolicy,
        Mutant::HalfOpenWithoutProbe,
        Mutant::InProgressClaimIgnored,
        Mutant::IneligibleLeasesNeverTakenBack,
        Mutant::ErrorsLoggedWhole,
        Mutant::RedriveProbeKept,
        Mutant::IdsUnsafeForSqs,
        Mutant::ProbeSlotShared,
        Mutant::RetryAfterCappedBySpacing,
        Mutant::CutClaimKept,
        Mutant::TimingForgotten,
        Mutant::ProbeStuckOnOneItem,
        Mutant::SentBeforePersisted,
        Mutant::PurgeDeletesKeptObjects,
        Mutant::MappingDisabledBeforeMarker,
        Mutant::PurgeTakesMessagesOfKeptRecords,
        Mutant::PurgeRemovesInFlight,
        Mutant::ProbeDecidedWithoutDownstream,
        Mutant::ContinuationDropsSelection,
        Mutant::ClearIgnoresItsSnapshot,
        Mutant::DeduplicationByReceive,
        Mutant::ResolveDeletesLivePayload,
        Mutant::SweepsOutlastedByLease,
        Mutant::ClearDatesByLastAttemptOnly,
        Mutant::AdoptionDatedBySentTime,
        Mutant::ProbeRemembersStaleState,
        Mutant::CompactionDropsUnsentClaims,
        Mutant::ProbeClosedBySkippedItem,
        Mutant::TwinAppendsAgain,
        Mutant::CompactionDropsRunningClaim,
        Mutant::CompactionForgetsSentMarks,
        Mutant::CompactionForgetsUnsentAttempts,
        Mutant::CompactionListsAnIdTwice,
        Mutant::CompactionRoomByHistoryKept,
        Mutant::CompactionKeepsOnlyRecentReceives,
        Mutant::LeaseTakenUnderNewFailure,
    ];

    /// Returns its name on a command line (`deadline-overrun`).
    pub fn name(self) -> &'static str {
        match self {
            Mutant::DeadlineOverrun => "deadline-overrun",
            Mutant::RequeueResolvesOnSend => "requeue-resolves-on-send",
            Mutant::SweepDeletesByItemId => "sweep-deletes-by-item-id",
            Mutant::LeasesNeverTakenBack => "leases-never-taken-back",
            Mutant::PoisonMessageAbortsSweep => "poison-message-aborts-sweep",
            Mutant::UnboundedAttemptIds => "unbounded-attempt-ids",
            Mutant::RequeueFinishNeedsMark => "requeue-finish-needs-mark",
            Mutant::PurgeByItemId => "purge-by-item-id",
            Mutant::FifoHidesWholeGroup => "fifo-hides-whole-group",
            Mutant::RetryAfterIgnored => "retry-after-ignored",
            Mutant::RetentionIgnored => "retention-ignored",
            Mutant::DroppedAttemptRecordedAgain => "dropped-attempt-recorded-again",
            Mutant::AttemptsPastLease => "attempts-past-lease",
            Mutant::FifoGoesOnAfterFailure => "fifo-goes-on-after-failure",
            Mutant::UnstartedLeftToRedrivePolicy => "unstarted-left-to-redrive-policy",
            Mutant::HalfOpenWithoutProbe => "half-open-without-probe",
            Mutant::InProgressClaimIgnored => "in-progress-claim-ignored",
            Mutant::IneligibleLeasesNeverTakenBack => "ineligible-leases-never-taken-back",
            Mutant::ErrorsLoggedWhole => "errors-logged-whole",
            Mutant::RedriveProbeKept => "redrive-probe-kept",
            Mutant::IdsUnsafeForSqs => "ids-unsafe-for-sqs",
            Mutant::ProbeSlotShared => "probe-slot-shared",
            Mutant::RetryAfterCappedBySpacing => "retry-after-capped-by-spacing",
            Mutant::CutClaimKept => "cut-claim-kept",
            Mutant::TimingForgotten => "timing-forgotten",
            Mutant::ProbeStuckOnOneItem => "probe-stuck-on-one-item",
            Mutant::SentBeforePersisted => "sent-before-persisted",
            Mutant::PurgeDeletesKeptObjects => "purge-deletes-kept-objects",
            Mutant::MappingDisabledBeforeMarker => "mapping-disabled-before-marker",
            Mutant::PurgeTakesMessagesOfKeptRecords => "purge-takes-messages-of-kept-records",
            Mutant::PurgeRemovesInFlight => "purge-removes-in-flight",
            Mutant::ProbeDecidedWithoutDownstream => "probe-decided-without-downstream",
            Mutant::ContinuationDropsSelection => "continuation-drops-selection",
            Mutant::ClearIgnoresItsSnapshot => "clear-ignores-its-snapshot",
            Mutant::DeduplicationByReceive => "deduplication-by-receive",
            Mutant::ResolveDeletesLivePayload => "resolve-deletes-live-payload",
            Mutant::SweepsOutlastedByLease => "sweeps-outlasted-by-lease",
            Mutant::ClearDatesByLastAttemptOnly => "clear-dates-by-last-attempt-only",
            Mutant::AdoptionDatedBySentTime => "adoption-dated-by-sent-time",
            Mutant::ProbeRemembersStaleState => "probe-remembers-stale-state",
            Mutant::CompactionDropsUnsentClaims => "compaction-drops-unsent-claims",
            Mutant::ProbeClosedBySkippedItem => "probe-closed-by-skipped-item",
            Mutant::TwinAppendsAgain => "twin-appends-again",
            Mutant::CompactionDropsRunningClaim => "compaction-drops-running-claim",
            Mutant::CompactionForgetsSentMarks => "compaction-forgets-sent-marks",
            Mutant::CompactionForgetsUnsentAttempts => "compaction-forgets-unsent-attempts",
            Mutant::CompactionListsAnIdTwice => "compaction-lists-an-id-twice",
            Mutant::CompactionRoomByHistoryKept => "compaction-room-by-history-kept",
            Mutant::CompactionKeepsOnlyRecentReceives => "compaction-keeps-only-recent-receives",
            Mutant::LeaseTakenUnderNewFailure => "lease-taken-under-new-failure",
        }
    }

    /// Returns the mutant of that name.
    pub fn parse(name: &str) -> Option<Mutant> {
        Mutant::ALL.into_iter().find(|m| m.name() == name)
    }

    fn bit(self) -> u64 {
        1 << (self as u64)
    }
}

/// `at`, or (with [`Mutant::DeadlineOverrun`]) an instant a year on: the guard that
/// should stop work at `at` no longer does.
pub(crate) fn deadline_guard(at: tokio::time::Instant) -> tokio::time::Instant {
    if is_on(Mutant::DeadlineOverrun) {
        at + std::time::Duration::from_secs(365 * 86_400)
    } else {
        at
    }
}

#[cfg(feature = "sim")]
thread_local! {
    static ACTIVE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Tells whether `mutant` is switched on (on this thread); always `false` without `sim`.
#[inline]
pub fn is_on(mutant: Mutant) -> bool {
    #[cfg(feature = "sim")]
    {
        ACTIVE.with(|a| a.get() & mutant.bit() != 0)
    }
    #[cfg(not(feature = "sim"))]
    {
        let _ = mutant.bit();
        false
    }
}

/// Switches exactly `mutants` on, on this thread (an empty slice: the fixed code).
#[cfg(feature = "sim")]
pub fn switch_on(mutants: &[Mutant]) {
    ACTIVE.with(|a| a.set(mutants.iter().fold(0, |bits, m| bits | m.bit())));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mutant_has_a_bit_of_its_own() {
        let bits = Mutant::ALL.iter().fold(0u64, |all, m| {
            assert_eq!(all & m.bit(), 0, "{} shares a bit", m.name());
            all | m.bit()
        });
        assert_eq!(bits.count_ones() as usize, Mutant::ALL.len());
    }

    #[test]
    fn names_round_trip() {
        for m in Mutant::ALL {
            assert_eq!(Mutant::parse(m.name()), Some(m));
        }
        assert_eq!(Mutant::parse("nope"), None);
    }
}
