//! §1.9, payloads are data, not logs: every log event and span the library emits in a
//! world goes through [`PayloadWatch`], which reports a break when one carries a payload's
//! secret. Every body the producer sends holds one (`sim-secret-…`), and the downstream
//! quotes it in its error answers and the handler in its panic messages, as real ones quote
//! the values they refuse: the library must keep them to the record.

use std::fmt::Write as _;
use std::sync::Arc;

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer};

use crate::world::{Checks, Section, World};

/// What every payload's secret begins with.
pub const SECRET: &str = "sim-secret-";

/// The layer that reads every event and span of a world for a payload's secret.
pub struct PayloadWatch {
    world: Arc<World>,
}

impl PayloadWatch {
    /// The watch over `world`'s logs.
    pub fn new(world: Arc<World>) -> Self {
        PayloadWatch { world }
    }

    fn check(&self, what: &str, text: &str) {
        if let Some(at) = text.find(SECRET) {
            let shown: String = text[at..].chars().take(40).collect();
            self.world.lock().violate(
                Section::Logs,
                "-",
                format!("a log {what} carries a payload's content ({shown}…)"),
            );
        }
    }
}

/// Every field of an event or span, as text.
#[derive(Default)]
struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        let _ = write!(self.0, " {}={value}", field.name());
    }
}

impl<S: tracing::Subscriber> Layer<S> for PayloadWatch {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        self.check("line", &fields.0);
    }

    fn on_record(
        &self,
        _span: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _ctx: Context<'_, S>,
    ) {
        let mut fields = Fields::default();
        values.record(&mut fields);
        self.check("span field", &fields.0);
    }

    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _ctx: Context<'_, S>,
    ) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        self.check("span", &fields.0);
    }
}
