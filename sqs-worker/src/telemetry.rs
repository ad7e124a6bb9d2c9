//! Logging set-up: JSON lines for CloudWatch Logs, level from `RUST_LOG` (default `info`).

use tracing_subscriber::EnvFilter;

/// Installs a JSON `tracing` subscriber writing to stdout. Safe to call more than once
/// (later calls do nothing).
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_current_span(false)
        .with_target(false)
        .without_time()
        .try_init();
}
