//! Families of worlds, and the seeds that name them.
//!
//! The mixed family draws every part of a world at its usual rate. A defect that needs
//! several rare parts at once (a twin delivery, a compaction and a failed DLQ send) then
//! shows in one world in tens of thousands. Each focused family draws the parts one kind of
//! defect needs far more often, so that such a defect shows within a thousand seeds.
//!
//! A seed carries its family in its top byte. A seed alone therefore still replays its
//! world, and every seed below 2^56 draws the mixed world it always drew.

/// A family of worlds (`sim --family NAME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Family {
    /// Every part of a world at its usual rate: the worlds of `make sim`.
    #[default]
    Mixed,
    /// Three pollers, batches invoked twice, duplicate receives, crashes, item ids reused
    /// and frequent redrives: deliveries that overlap, and histories compacted under them.
    Twins,
    /// An operator every one to five minutes, half the runs purges or clears (most of
    /// those racing the schedule), on small query pages.
    Operators,
    /// A breaker in every world and faults that change every half minute to five minutes:
    /// outages that open and close it, and the polling control's pauses.
    Breaker,
    /// Spaced redelivery under a short retention, on Managed Instances with a breaker:
    /// messages that reach the end of their retention while spaced or paused.
    Retention,
    /// The twins' worlds with records that keep two failures, not four: compaction at
    /// nearly every write.
    Compaction,
}

impl Family {
    /// Every family, mixed first.
    pub const ALL: [Family; 6] = [
        Family::Mixed,
        Family::Twins,
        Family::Operators,
        Family::Breaker,
        Family::Retention,
        Family::Compaction,
    ];

    /// The family's name, as `sim --family` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Family::Mixed => "mixed",
            Family::Twins => "twins",
            Family::Operators => "operators",
            Family::Breaker => "breaker",
            Family::Retention => "retention",
            Family::Compaction => "compaction",
        }
    }

    /// Finds the family of a name.
    pub fn parse(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Reads the family a seed names. A top byte no family has names the mixed one.
    pub fn of(seed: u64) -> Family {
        Family::ALL
            .get((seed >> 56) as usize)
            .copied()
            .unwrap_or_default()
    }

    /// Returns the seed of the family's `n`th world.
    pub fn seed(self, n: u64) -> u64 {
        ((self as u64) << 56) | (n & ((1 << 56) - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_names_its_family_and_the_small_seeds_stay_mixed() {
        for family in Family::ALL {
            assert_eq!(Family::of(family.seed(0)), family);
            assert_eq!(Family::of(family.seed(999)), family);
            assert_eq!(Family::parse(family.name()), Some(family));
        }
        assert_eq!(Family::of(999_999), Family::Mixed);
        assert_eq!(Family::Mixed.seed(42), 42);
        assert_eq!(Family::Twins.seed(42), (1 << 56) + 42);
        assert_eq!(Family::parse("none"), None);
    }
}
