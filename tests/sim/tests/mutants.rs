//! The simulation has teeth: each defect fixed earlier, switched back on, is found within
//! 10,000 seeds, or within 1,000 of the family of worlds focused on its kind. A simulation
//! that cannot find known bugs proves nothing about others.

#![allow(clippy::panic)] // a test fails loudly

use sqs_keeper_core::mutants::Mutant;
use sqs_keeper_sim::{describe_failure, run_seeds, Family, RunReport};

/// The machine's cores: the worlds are independent.
fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// Runs seeds with `mutant` on until one fails, and checks that the invariant it broke is
/// one of `expected` (the one that guards what the fix fixed), not an incidental one.
fn finds(mutant: Mutant, expected: &[&str]) {
    let summary = run_seeds(0..10_000, &[mutant], threads(), 1);
    let Some(failure) = summary.failures.first() else {
        panic!("{} was not found in 10,000 seeds", mutant.name());
    };
    found_by(failure, mutant, expected, summary.seeds);
}

/// Runs the first 1,000 worlds of `family` with `mutant` on until one fails, and checks the
/// invariant it broke as [`finds`] does. Returns the world's seed.
fn finds_in(family: Family, mutant: Mutant, expected: &[&str]) -> u64 {
    let summary = run_seeds((0..1_000).map(|n| family.seed(n)), &[mutant], threads(), 1);
    let Some(failure) = summary.failures.first() else {
        panic!(
            "{} was not found in 1,000 {} worlds",
            mutant.name(),
            family.name()
        );
    };
    found_by(failure, mutant, expected, summary.seeds);
    let clean = sqs_keeper_sim::run_seed(failure.seed, &[]);
    assert!(
        clean.violations.is_empty(),
        "{} world {} fails without the mutant",
        family.name(),
        failure.seed
    );
    failure.seed
}

/// Finds `mutant` in `family` as [`finds_in`] does, in a world that
/// `compaction-forgets-unsent-attempts` alone leaves clean. The mutant also switches off the
/// attempt ids compaction keeps for unsent deliveries, which cover the same twins; the find
/// is then its own.
fn finds_beyond_unsent_attempts(family: Family, mutant: Mutant) {
    let seed = finds_in(family, mutant, &["appended a second time"]);
    let alone = sqs_keeper_sim::run_seed(seed, &[Mutant::CompactionForgetsUnsentAttempts]);
    assert!(
        alone.violations.is_empty(),
        "{} world {seed} fails with the unsent attempts forgotten alone",
        family.name()
    );
}

/// Checks that `failure` broke one of the `expected` invariants, and prints it.
fn found_by(failure: &RunReport, mutant: Mutant, expected: &[&str], seeds: u64) {
    assert!(
        failure
            .violations
            .iter()
            .any(|(_, what)| expected.iter().any(|e| what.contains(e))),
        "{} broke other invariants than expected:\n{}",
        mutant.name(),
        describe_failure(failure, &[mutant])
    );
    println!(
        "{} found after {} seeds:\n{}",
        mutant.name(),
        seeds,
        describe_failure(failure, &[mutant])
    );
}

#[test]
fn finds_a_deadline_overrun() {
    finds(Mutant::DeadlineOverrun, &["deadline"]);
}

#[test]
fn finds_a_requeue_that_resolves_on_send() {
    finds(Mutant::RequeueResolvesOnSend, &["never delivered"]);
}

#[test]
fn finds_a_sweep_that_deletes_by_item_id_alone() {
    finds(Mutant::SweepDeletesByItemId, &["lost"]);
}

#[test]
fn finds_leases_never_taken_back() {
    finds(Mutant::LeasesNeverTakenBack, &["left Redriving"]);
}

#[test]
fn finds_a_poison_message_that_aborts_the_sweep() {
    finds(
        Mutant::PoisonMessageAbortsSweep,
        &["a DLQ message is left", "eligible"],
    );
}

#[test]
fn finds_unbounded_attempt_ids() {
    finds(Mutant::UnboundedAttemptIds, &["attempt_ids"]);
}

#[test]
fn finds_a_requeue_the_worker_finished_before_its_mark() {
    finds(Mutant::RequeueFinishNeedsMark, &["left Requeued"]);
}

#[test]
fn finds_a_purge_that_deletes_by_item_id() {
    finds(Mutant::PurgeByItemId, &["lost"]);
}

#[test]
fn finds_fifo_hides_that_hold_a_group_past_its_first_records_retention() {
    finds_in(
        Family::Retention,
        Mutant::FifoHidesWholeGroup,
        &["end of its retention"],
    );
}

#[test]
fn finds_a_retry_after_that_does_not_reach_the_hide() {
    finds(Mutant::RetryAfterIgnored, &["Retry-After"]);
}

#[test]
fn finds_hides_that_outlast_the_retention() {
    finds(
        Mutant::RetentionIgnored,
        &[
            "end of its retention",
            "by a sandbox that had read the queue's retention",
        ],
    );
}

#[test]
fn finds_an_attempt_appended_again_after_compaction_dropped_its_id() {
    finds(
        Mutant::DroppedAttemptRecordedAgain,
        &["appended a second time"],
    );
}

#[test]
fn finds_redrive_attempts_that_run_past_the_lease() {
    finds(Mutant::AttemptsPastLease, &["after the item's lease cut"]);
}

#[test]
fn finds_a_fifo_batch_that_goes_on_after_a_failure() {
    finds(Mutant::FifoGoesOnAfterFailure, &["earlier in its group"]);
}

#[test]
fn finds_an_unstarted_record_left_to_the_redrive_policy() {
    finds(
        Mutant::UnstartedLeftToRedrivePolicy,
        &["on its last receive"],
    );
}

#[test]
fn finds_a_half_open_breaker_that_lets_every_record_through() {
    finds(Mutant::HalfOpenWithoutProbe, &["without holding the probe"]);
}

#[test]
fn finds_work_that_runs_past_another_attempts_idempotency_claim() {
    finds(Mutant::InProgressClaimIgnored, &["same idempotency key"]);
}

#[test]
fn finds_an_ineligible_lease_a_forced_run_left_that_nothing_takes_back() {
    finds(Mutant::IneligibleLeasesNeverTakenBack, &["left Redriving"]);
}

#[test]
fn finds_an_error_logged_with_the_payload_it_quotes() {
    finds(Mutant::ErrorsLoggedWhole, &["carries a payload"]);
}

#[test]
fn finds_a_redrive_probe_run_that_keeps_the_probe() {
    finds(
        Mutant::RedriveProbeKept,
        &["ended without closing the breaker"],
    );
}

#[test]
fn finds_an_item_id_sqs_refuses_in_the_dlq_message() {
    finds(Mutant::IdsUnsafeForSqs, &["InvalidMessageContents"]);
}

#[test]
fn finds_a_sandbox_that_probes_with_every_record_out_of_touch() {
    // Two probes at once in one sandbox: the second's take of the probe can also hide the
    // first's answer from the check at the close.
    finds(
        Mutant::ProbeSlotShared,
        &["records at once", "a probe the downstream never answered"],
    );
}

#[test]
fn finds_a_retry_after_past_the_spacing_cap_hidden_only_to_the_cap() {
    finds(Mutant::RetryAfterCappedBySpacing, &["Retry-After"]);
}

#[test]
fn finds_a_claim_left_by_a_cut_delivery_that_holds_every_later_one_back() {
    finds(Mutant::CutClaimKept, &["on its last receive"]);
}

/// A mutant the first 10,000 seeds do not reach, found by the seed that found its defect.
fn found_by_its_seed(mutant: Mutant, seed: u64, expected: &str) {
    let report = sqs_keeper_sim::run_seed(seed, &[mutant]);
    assert!(
        report
            .violations
            .iter()
            .any(|(_, what)| what.contains(expected)),
        "{} not found at seed {seed}:\n{}",
        mutant.name(),
        describe_failure(&report, &[mutant])
    );
    let clean = sqs_keeper_sim::run_seed(seed, &[]);
    assert!(
        clean.violations.is_empty(),
        "seed {seed} fails without the mutant"
    );
}

#[test]
fn finds_a_failed_timing_read_that_forgets_a_concurrent_ones() {
    finds_in(
        Family::Retention,
        Mutant::TimingForgotten,
        &["by a sandbox that had read the queue's retention"],
    );
    found_by_its_seed(Mutant::TimingForgotten, 85996, "end of its retention");
}

#[test]
fn finds_a_dead_letter_sent_though_its_record_write_failed() {
    finds(Mutant::SentBeforePersisted, &["persisted first"]);
}

#[test]
fn finds_a_purge_that_deletes_the_object_of_a_record_it_kept() {
    finds(Mutant::PurgeDeletesKeptObjects, &["still names"]);
}

#[test]
fn finds_a_pause_whose_mapping_is_disabled_before_it_is_recorded() {
    finds(Mutant::MappingDisabledBeforeMarker, &["no pause recorded"]);
}

#[test]
fn finds_a_purge_that_takes_the_dlq_messages_of_records_it_kept() {
    finds(
        Mutant::PurgeTakesMessagesOfKeptRecords,
        &["dead, but no DLQ message holds it"],
    );
}

#[test]
fn finds_a_purge_that_removes_an_item_in_flight() {
    finds(Mutant::PurgeRemovesInFlight, &["(in flight)"]);
}

#[test]
fn finds_a_probe_decided_by_a_failure_that_never_reached_the_downstream() {
    finds(
        Mutant::ProbeDecidedWithoutDownstream,
        &["a probe the downstream never answered"],
    );
}

#[test]
fn finds_a_continuation_that_drops_its_selection() {
    finds(
        Mutant::ContinuationDropsSelection,
        &["a continuation took an item its request did not select"],
    );
}

#[test]
fn finds_a_clear_that_ignores_its_snapshot() {
    finds_in(
        Family::Operators,
        Mutant::ClearIgnoresItsSnapshot,
        &["lost"],
    );
}

#[test]
fn finds_a_deduplication_id_that_holds_the_receive_count() {
    finds_in(
        Family::Retention,
        Mutant::DeduplicationByReceive,
        &["within the FIFO deduplication window"],
    );
}

#[test]
fn finds_a_clear_that_dates_a_failure_by_its_last_attempt_only() {
    finds_in(
        Family::Operators,
        Mutant::ClearDatesByLastAttemptOnly,
        &["lost"],
    );
}

#[test]
fn finds_a_redrive_probe_closed_by_an_item_resolved_with_nothing_done() {
    finds(
        Mutant::ProbeClosedBySkippedItem,
        &["closed the breaker after a probe the downstream never answered"],
    );
}

#[test]
fn finds_a_compaction_that_drops_the_claim_of_a_delivery_still_running() {
    found_by_its_seed(
        Mutant::CompactionDropsRunningClaim,
        391046,
        "appended a second time",
    );
    finds_in(
        Family::Twins,
        Mutant::CompactionDropsRunningClaim,
        &["appended a second time"],
    );
}

#[test]
fn finds_a_compaction_that_forgets_the_sent_marks_of_the_messages_it_drops() {
    found_by_its_seed(
        Mutant::CompactionForgetsSentMarks,
        460865,
        "appended a second time",
    );
    finds_in(
        Family::Twins,
        Mutant::CompactionForgetsSentMarks,
        &["appended a second time"],
    );
}

#[test]
fn finds_a_compaction_that_forgets_the_attempts_of_a_delivery_whose_send_failed() {
    found_by_its_seed(
        Mutant::CompactionForgetsUnsentAttempts,
        511320,
        "appended a second time",
    );
    finds_in(
        Family::Compaction,
        Mutant::CompactionForgetsUnsentAttempts,
        &["appended a second time"],
    );
}

#[test]
fn finds_a_compaction_that_drops_the_claim_of_a_dlq_send_under_way() {
    finds_beyond_unsent_attempts(Family::Twins, Mutant::CompactionDropsUnsentClaims);
}

#[test]
fn finds_a_twin_that_appends_what_compaction_dropped_though_refused_by_its_claim() {
    finds_beyond_unsent_attempts(Family::Compaction, Mutant::TwinAppendsAgain);
}

#[test]
fn finds_a_lease_taken_while_a_run_holds_it_under_a_new_failure() {
    found_by_its_seed(
        Mutant::LeaseTakenUnderNewFailure,
        Family::Twins.seed(11891),
        "one lease owner at a time",
    );
}

#[test]
fn finds_a_compaction_that_lists_an_attempt_id_twice() {
    found_by_its_seed(Mutant::CompactionListsAnIdTwice, 104, "ValidationException");
}

#[test]
fn finds_a_compaction_whose_room_for_ids_follows_a_short_history() {
    finds_in(
        Family::Compaction,
        Mutant::CompactionRoomByHistoryKept,
        &["appended a second time"],
    );
}

#[test]
fn finds_a_compaction_that_forgets_a_twin_two_receives_back() {
    finds_in(
        Family::Compaction,
        Mutant::CompactionKeepsOnlyRecentReceives,
        &["appended a second time"],
    );
}

#[test]
fn finds_a_resolve_that_deletes_a_payload_a_record_still_names() {
    found_by_its_seed(
        Mutant::ResolveDeletesLivePayload,
        176717,
        "which the record of",
    );
}

#[test]
fn finds_a_pause_whose_sweep_a_cut_runs_lease_delays_past_the_reserve() {
    found_by_its_seed(
        Mutant::SweepsOutlastedByLease,
        210256,
        "reached the end of its retention",
    );
}

/// §3, §1.12: after a late outage the schedule's probe runs must look past the items whose
/// handler always panics (they tell nothing of the downstream), or the items behind them
/// wait a run each.
#[test]
fn finds_a_probe_run_that_gives_up_after_one_item_that_told_nothing() {
    finds_in(
        Family::Breaker,
        Mutant::ProbeStuckOnOneItem,
        &["schedule runs after the downstream recovered"],
    );
}
