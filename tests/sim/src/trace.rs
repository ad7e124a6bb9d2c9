//! The event trace of one run: every step, with its virtual time, actor and item, so that a
//! broken invariant can be shown with the events that led to it (those of its item, and the
//! faults around them) rather than thousands of lines.

use std::fmt::Write as _;

/// One event.
#[derive(Debug, Clone)]
pub struct Event {
    /// Virtual milliseconds since the start of the run.
    pub at_ms: u64,
    /// Who acted (`worker#3`, `redrive`, `fault`, ...).
    pub actor: String,
    /// The item it concerns (`-` for none).
    pub item: String,
    /// What happened.
    pub what: String,
}

/// The events of a run, in order.
#[derive(Debug, Default)]
pub struct Trace {
    events: Vec<Event>,
    origin: Option<tokio::time::Instant>,
}

impl Trace {
    /// Adds an event.
    pub fn note(&mut self, actor: &str, item: &str, what: &str) {
        let origin = *self.origin.get_or_insert_with(tokio::time::Instant::now);
        let at_ms = u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.events.push(Event {
            at_ms,
            actor: actor.to_string(),
            item: item.to_string(),
            what: what.to_string(),
        });
    }

    /// Events so far.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether nothing happened.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The events that concern `items` or the world as a whole (its shape, faults), at
    /// most `limit` of them, the last ones kept; every event with `SIM_TRACE_ALL` set.
    pub fn relevant(&self, items: &[String], limit: usize) -> String {
        let all = std::env::var_os("SIM_TRACE_ALL").is_some();
        let picked: Vec<&Event> = self
            .events
            .iter()
            .filter(|e| {
                items
                    .iter()
                    .any(|i| e.item == *i || e.what.contains(i.as_str()))
                    || all
                    || e.actor == "world"
                    || e.actor == "fault"
                    || e.actor == "INVARIANT"
            })
            .collect();
        let skip = picked.len().saturating_sub(limit);
        let mut out = String::new();
        if skip > 0 {
            let _ = writeln!(out, "  ... {skip} earlier events");
        }
        for e in picked.into_iter().skip(skip) {
            let _ = writeln!(
                out,
                "  {:>9.3}s  {:<12} {:<14} {}",
                e.at_ms as f64 / 1000.0,
                e.actor,
                e.item,
                e.what
            );
        }
        out
    }
}
