//! Log capture for the library's own tests: the lines written on this thread while a
//! capture lives, as text.

use std::sync::{Arc, Mutex};

/// What is logged, as text.
#[derive(Clone, Default)]
pub(crate) struct Logged(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logged {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logged {
    /// Every line written so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Captures this thread's log lines, as plain text without colours, until the guard drops.
pub(crate) fn capture() -> (Logged, tracing::subscriber::DefaultGuard) {
    let logged = Logged::default();
    let writer = logged.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (logged, tracing::subscriber::set_default(subscriber))
}
