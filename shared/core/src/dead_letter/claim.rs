//! A delivery's claim on its source message's one DLQ message (docs/ARCHITECTURE.md §1.5).
//!
//! A record keeps its claims in one string set (`dlq_claims`), one element per claiming
//! receive: `<message id>:<receive count>`. The receive count says which delivery took the
//! claim.
//!
//! A claim held at the same receive belongs to a twin: the same delivery, invoked twice,
//! which may be sending now. A claim held at the receive just before may belong to a
//! delivery still running: SQS delivers a message again when its visibility lapses while
//! an invocation runs. A delivery finding either is returned for retry.
//!
//! A claim held two or more receives before belongs to a delivery that did not finish: it
//! was cut between the claim and the send, or its claim's release failed. Its message was
//! hidden for a whole visibility timeout twice since, and no invocation runs that long
//! (the visibility timeout outlasts the function's timeout). A later delivery takes such a
//! claim over.
//!
//! Elements written before the receive count was kept hold the message id alone. They read
//! as held at receive 0, so any delivery takes them over.

use super::SourceContext;

/// One delivery's claim: the source message and the receive that took it.
///
/// ```
/// use sqs_keeper_core::dead_letter::DlqClaim;
///
/// let claim = DlqClaim::new("m-1", 3);
/// assert_eq!(claim.element(), "m-1:3");
/// assert_eq!(DlqClaim::parse("m-1:3"), claim);
/// // An element without a receive count reads as held at receive 0.
/// assert_eq!(DlqClaim::parse("m-1"), DlqClaim::new("m-1", 0));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DlqClaim {
    /// The source message id, as records keep it ([`super::recorded_message_id`]).
    pub message_id: String,
    /// The `ApproximateReceiveCount` of the delivery that took the claim.
    pub receive_count: u32,
}

impl DlqClaim {
    /// Creates the claim of `message_id` at `receive_count`.
    pub fn new(message_id: &str, receive_count: u32) -> DlqClaim {
        DlqClaim {
            message_id: message_id.to_string(),
            receive_count,
        }
    }

    /// Returns the claim a record's latest delivery asks for.
    pub fn of(source: &SourceContext) -> DlqClaim {
        DlqClaim::new(&source.message_id, source.receive_count)
    }

    /// Returns the claim of the receive just before this one, if any.
    pub fn previous(&self) -> Option<DlqClaim> {
        (self.receive_count > 1).then(|| DlqClaim::new(&self.message_id, self.receive_count - 1))
    }

    /// Returns the element the claim set holds for this claim.
    pub fn element(&self) -> String {
        if crate::mutants::is_on(crate::mutants::Mutant::CutClaimKept) {
            return self.message_id.clone();
        }
        format!("{}:{}", self.message_id, self.receive_count)
    }

    /// Reads an element of the claim set.
    ///
    /// The count is split from the right, so a message id holding ':' stays whole. An
    /// element without a numeric count is a message id alone, held at receive 0.
    pub fn parse(element: &str) -> DlqClaim {
        element
            .rsplit_once(':')
            .and_then(|(id, count)| Some(DlqClaim::new(id, count.parse().ok()?)))
            .unwrap_or_else(|| DlqClaim::new(element, 0))
    }

    /// Tells whether `claims` hold this message's claim at a later receive.
    ///
    /// A delivery that finds this after taking its own claim overlapped the next delivery
    /// (its visibility lapsed while it ran). The later claim wins.
    pub fn is_held_later<'a>(&self, claims: impl IntoIterator<Item = &'a String>) -> bool {
        self.held_from(claims, self.receive_count.saturating_add(1))
    }

    /// Tells whether `claims` hold this message's claim at the receive just before this one, at
    /// this one, or later.
    ///
    /// Such a claim may be a delivery's still running, so this delivery must not send. A
    /// claim held only by receives two or more before is taken over.
    pub fn is_held_elsewhere<'a>(&self, claims: impl IntoIterator<Item = &'a String>) -> bool {
        if crate::mutants::is_on(crate::mutants::Mutant::CutClaimKept) {
            return self.held_from(claims, 0);
        }
        self.held_from(claims, self.receive_count.saturating_sub(1).max(1))
    }

    /// Tells whether `claims` hold this message's claim at receive `from` or later.
    fn held_from<'a>(&self, claims: impl IntoIterator<Item = &'a String>, from: u32) -> bool {
        claims
            .into_iter()
            .map(|element| DlqClaim::parse(element))
            .any(|held| held.message_id == self.message_id && held.receive_count >= from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn set(elements: &[&str]) -> HashSet<String> {
        elements.iter().map(|e| (*e).to_string()).collect()
    }

    #[test]
    fn a_claim_round_trips_through_its_element_whatever_its_message_id() {
        for id in ["m-1", "a:b", "a:7:x", "sha256:00ff"] {
            let claim = DlqClaim::new(id, 12);
            assert_eq!(DlqClaim::parse(&claim.element()), claim, "{id}");
        }
    }

    #[test]
    fn only_a_claim_two_receives_before_is_taken_over() {
        let claim = DlqClaim::new("m", 3);
        assert!(!claim.is_held_elsewhere(&set(&[])));
        assert!(
            !claim.is_held_elsewhere(&set(&["m:1"])),
            "two before: taken over"
        );
        assert!(
            claim.is_held_elsewhere(&set(&["m:2"])),
            "just before: may be running"
        );
        assert!(
            !claim.is_held_elsewhere(&set(&["m"])),
            "no count: taken over"
        );
        assert!(
            !claim.is_held_elsewhere(&set(&["other:9"])),
            "another message"
        );
        assert!(claim.is_held_elsewhere(&set(&["m:3"])), "a twin");
        assert!(
            claim.is_held_elsewhere(&set(&["m:1", "m:4"])),
            "a later receive"
        );
        assert!(!claim.is_held_later(&set(&["m:3"])), "its own");
        assert!(claim.is_held_later(&set(&["m:3", "m:4"])));
    }
}
