//! Logging for the two Lambda functions, as Lambda's advanced logging controls expect it.
//!
//! - **Level**: `AWS_LAMBDA_LOG_LEVEL` (`TRACE`, `DEBUG`, `INFO`, `WARN`, `ERROR`, `FATAL`,
//!   in any case; `INFO` when unset), the variable Lambda sets from the function's
//!   `ApplicationLogLevel`. `RUST_LOG`, when set and not empty, overrides it with
//!   target directives (`info,sqs_keeper=debug`: a default level and levels per module
//!   path, tracing-subscriber's `Targets`), for a developer who wants one crate louder than
//!   the rest. (`Targets` rather than `EnvFilter`: the same directives without span-field
//!   matching, and without the regular-expression engine `EnvFilter` adds to the binary.)
//! - **Format**: `AWS_LAMBDA_LOG_FORMAT`: `JSON` (the default) or `Text`
//!   (`2026-01-01T00:00:00.123Z  INFO invocation{requestId=… cold_start=true}: batch finished records=10`).
//!
//! A JSON line is one flat object: `timestamp` (RFC 3339 UTC with milliseconds), `level`,
//! `message`, `function_name`, the event's own fields, and the fields of every span it was
//! logged in. Every invocation runs inside the `invocation` span [`InvocationLayer`] opens,
//! so every line logged while it runs carries `requestId` (the name Lambda's own JSON logs
//! use), `cold_start` (true for the first invocation of the process, as Powertools' Logger
//! has it) and, when Lambda sends them, `xrayTraceId` and `tenantId`:
//!
//! ```text
//! {"timestamp":"2026-01-01T00:00:00.123Z","level":"INFO","message":"batch finished","function_name":"orders-worker","cold_start":true,"records":10,"requestId":"8f5…",…}
//! ```
//!
//! Why a [`FormatEvent`] of our own ([`LambdaJson`]): tracing-subscriber's JSON formatter
//! flattens an event's fields (`flatten_event`) but always nests span fields, under `span`
//! and `spans`; Lambda's level filter reads a top-level `level`, and CloudWatch Logs
//! Insights and metric filters are simplest over top-level keys (`filter requestId = …`
//! rather than a path into the last entry of a list). The formatter
//! takes the span fields tracing-subscriber has already recorded as JSON
//! ([`JsonFields`]) and writes them beside the event's.
//!
//! The `invocation` span is enabled whatever the level (it is a span, never a line of its
//! own): with `AWS_LAMBDA_LOG_LEVEL=ERROR` an error still says which request it belongs to.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use lambda_runtime::tower::{Layer as TowerLayer, Service};
use lambda_runtime::LambdaInvocation;
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::instrument::Instrumented;
use tracing::{Event, Instrument, Subscriber};
use tracing_subscriber::filter::{filter_fn, FilterExt, LevelFilter, Targets};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The name of the span each invocation runs in.
pub const INVOCATION_SPAN: &str = "invocation";

/// The variable Lambda sets from the function's `ApplicationLogLevel`.
pub const LOG_LEVEL_VAR: &str = "AWS_LAMBDA_LOG_LEVEL";
/// The variable Lambda sets from the function's `LogFormat`.
pub const LOG_FORMAT_VAR: &str = "AWS_LAMBDA_LOG_FORMAT";
/// The developer's override of the level: target directives (`info,sqs_keeper=debug`).
pub const RUST_LOG_VAR: &str = "RUST_LOG";
/// Which records leave a line of their own ([`RecordLines`]).
pub const LOG_RECORDS_VAR: &str = crate::config::vars::LOG_RECORDS.name;

/// Which records leave a log line of their own (`WORKER_LOG_RECORDS`).
///
/// A record done or skipped is always counted, in the batch's `batch finished` line and
/// its metrics. Its own line (`record done`, `record skipped`) costs about 300 bytes of
/// CloudWatch Logs a record: more than the SQS requests that carried it, at ten records an
/// invocation. It is therefore written only when asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RecordLines {
    /// Each failed record, with its class and signature (the default).
    #[default]
    Failures,
    /// Every record: done and skipped ones too.
    All,
}

impl std::str::FromStr for RecordLines {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "failures" => Ok(RecordLines::Failures),
            "all" => Ok(RecordLines::All),
            _ => Err("neither all nor failures".to_string()),
        }
    }
}

/// How log lines are written.
// Exhaustive on purpose: these are the two formats Lambda's `LogFormat` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One flat JSON object per line ([`LambdaJson`]).
    Json,
    /// tracing-subscriber's human-readable lines, with UTC timestamps and no colours.
    Text,
}

/// The logging configuration read from the environment.
#[derive(Debug, Clone)]
pub struct LogSettings {
    /// The line format.
    pub format: LogFormat,
    /// The level from `AWS_LAMBDA_LOG_LEVEL` (INFO when unset or not a level).
    pub level: LevelFilter,
    /// `RUST_LOG`'s directives, when set, not empty and valid: they override `level`.
    pub directives: Option<String>,
    /// The function's name (`AWS_LAMBDA_FUNCTION_NAME`), written on every JSON line.
    pub function_name: Option<String>,
    /// Which records leave a line of their own.
    pub record_lines: RecordLines,
    /// What was wrong with the variables: logged as warnings once logging is set up.
    pub problems: Vec<String>,
}

impl LogSettings {
    /// Reads the settings from the process environment.
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the settings through `lookup` (a variable's value, `None` when unset).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let mut problems = Vec::new();
        let set = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let level = match set(LOG_LEVEL_VAR) {
            None => LevelFilter::INFO,
            Some(value) => parse_level(&value).unwrap_or_else(|| {
                problems.push(format!(
                    "{LOG_LEVEL_VAR}={value:?} is not one of TRACE, DEBUG, INFO, WARN, ERROR, FATAL; logging at INFO"
                ));
                LevelFilter::INFO
            }),
        };
        let format = match set(LOG_FORMAT_VAR) {
            None => LogFormat::Json,
            Some(value) if value.trim().eq_ignore_ascii_case("json") => LogFormat::Json,
            Some(value) if value.trim().eq_ignore_ascii_case("text") => LogFormat::Text,
            Some(value) => {
                problems.push(format!(
                    "{LOG_FORMAT_VAR}={value:?} is neither JSON nor Text; logging JSON"
                ));
                LogFormat::Json
            }
        };
        let directives = set(RUST_LOG_VAR).and_then(|value| {
            match value.parse::<Targets>() {
                Ok(_) => Some(value),
                Err(error) => {
                    problems.push(format!(
                        "{RUST_LOG_VAR}={value:?} is not a valid filter ({error}); using {LOG_LEVEL_VAR}"
                    ));
                    None
                }
            }
        });
        // Set on its own or in the store's object (`SQS_KEEPER_STORE`), as the configuration
        // reads it.
        let store_too =
            crate::config::EnvReader::new(&lookup).raw(&crate::config::vars::LOG_RECORDS);
        let record_lines = match store_too {
            None => RecordLines::default(),
            Some(value) => value.parse().unwrap_or_else(|_| {
                problems.push(format!(
                    "{LOG_RECORDS_VAR}={value:?} is neither all nor failures; logging failed records only"
                ));
                RecordLines::default()
            }),
        };
        LogSettings {
            format,
            level,
            directives,
            record_lines,
            function_name: lookup("AWS_LAMBDA_FUNCTION_NAME").filter(|v| !v.is_empty()),
            problems,
        }
    }

    /// Returns the filter for events: `RUST_LOG`'s directives when given, else the Lambda
    /// level; either way without the lines of records done or skipped, unless asked for.
    fn env_filter(&self) -> Targets {
        let targets = self
            .directives
            .as_deref()
            .and_then(|directives| directives.parse::<Targets>().ok())
            .unwrap_or_else(|| Targets::new().with_default(self.level));
        match self.record_lines {
            RecordLines::All => targets,
            RecordLines::Failures => targets.with_target(
                sqs_keeper_core::batch::RECORD_LINES_TARGET,
                LevelFilter::OFF,
            ),
        }
    }
}

/// `AWS_LAMBDA_LOG_LEVEL`'s values, in any case. tracing has no FATAL: it is ERROR.
fn parse_level(value: &str) -> Option<LevelFilter> {
    match value.trim().to_ascii_uppercase().as_str() {
        "TRACE" => Some(LevelFilter::TRACE),
        "DEBUG" => Some(LevelFilter::DEBUG),
        "INFO" => Some(LevelFilter::INFO),
        "WARN" | "WARNING" => Some(LevelFilter::WARN),
        "ERROR" | "FATAL" => Some(LevelFilter::ERROR),
        _ => None,
    }
}

/// Returns the layer the functions log through, writing lines to `writer` as `settings` say:
/// Lambda's format and level, and the invocation span's fields on every line.
///
/// A team with a subscriber of its own adds it there (see [`log_layer`]).
pub fn layer_with<S, W>(settings: &LogSettings, writer: W) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    // The invocation span passes whatever the level: its fields belong on every line that
    // is written, errors included. So does a traced record's span: its trace belongs on its lines.
    let invocation_span = filter_fn(|meta| {
        meta.is_span()
            && ((meta.name() == INVOCATION_SPAN && meta.target() == module_path!())
                || (meta.name() == sqs_keeper_core::trace::RECORD_SPAN
                    && meta.target() == "sqs_keeper_core::trace"))
    })
    .with_max_level_hint(LevelFilter::INFO);
    let filter = settings.env_filter().or(invocation_span);
    match settings.format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .fmt_fields(JsonFields::new())
            .event_format(LambdaJson {
                function_name: settings.function_name.clone(),
            })
            .with_writer(writer)
            .with_filter(filter)
            .boxed(),
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_target(false)
            .with_timer(UtcMillis)
            .with_writer(writer)
            .with_filter(filter)
            .boxed(),
    }
}

/// Returns the functions' log layer, as Lambda's logging controls set it, writing to stdout: for
/// a team that installs its own subscriber, beside its own layers (Sentry,
/// OpenTelemetry, a filter of its own).
///
/// Installed before [`crate::Setup::from_env`], that subscriber is the one used: the
/// library installs none, and its lines still carry the invocation's fields.
///
/// ```no_run
/// use tracing_subscriber::layer::SubscriberExt;
/// use tracing_subscriber::util::SubscriberInitExt;
///
/// tracing_subscriber::registry()
///     .with(sqs_keeper_lambda::telemetry::log_layer())
///     .with(tracing_subscriber::filter::LevelFilter::INFO) // or the team's own layers
///     .init();
/// ```
pub fn log_layer<S>() -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let settings = LogSettings::from_env();
    for problem in &settings.problems {
        // Said on stderr: no subscriber is installed yet to say it.
        eprintln!("{problem}");
    }
    layer_with(&settings, std::io::stdout)
}

/// Returns the subscriber the functions log through, writing lines to `writer`: for tests, which
/// capture them, and for [`init`].
pub fn subscriber<W>(settings: &LogSettings, writer: W) -> impl Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::registry().with(layer_with(settings, writer))
}

/// Installs the functions' subscriber, writing to stdout (Lambda sends stdout to
/// CloudWatch Logs), and logs what was wrong with the logging variables. A subscriber
/// installed before (a team's own, see [`log_layer`]) stays: none is installed over it.
/// Safe to call more than once (later calls do nothing).
pub fn init() {
    let settings = LogSettings::from_env();
    if tracing::subscriber::set_global_default(subscriber(&settings, std::io::stdout)).is_ok() {
        for problem in &settings.problems {
            tracing::warn!("{problem}");
        }
    }
    // Installed whether or not the subscriber is ours: a team's own subscriber must not
    // get a panic's message either.
    install_panic_hook();
}

/// Replaces Rust's own panic hook, which writes the panic's message to stderr, which
/// Lambda sends to the logs: a handler's `panic!("declined for {holder}")` would put the
/// payload's values there. The worker catches a processor's panic and keeps its message
/// in the record; the log gets where it happened, never the message
/// (docs/ARCHITECTURE.md §1.9). Installed once.
fn install_panic_hook() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let location = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()))
                .unwrap_or_default();
            tracing::error!(
                location = %location,
                "panicked (the message is kept in the record, not logged)"
            );
        }));
    });
}

/// RFC 3339 UTC with milliseconds, as Lambda's own lines and the dead-letter records have it.
fn timestamp() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The Text format's timer: [`timestamp`].
#[derive(Debug, Clone, Copy)]
struct UtcMillis;

impl FormatTime for UtcMillis {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        w.write_str(&timestamp())
    }
}

/// The JSON line format: one flat object per event (see the module's documentation).
#[derive(Debug, Clone, Default)]
pub struct LambdaJson {
    /// Written as `function_name` on every line.
    pub function_name: Option<String>,
}

/// Keys the formatter writes itself; a field of the same name is not repeated.
const RESERVED: [&str; 4] = ["timestamp", "level", "message", "function_name"];

impl<S> FormatEvent<S, JsonFields> for LambdaJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        // Span fields root first, so an inner span's field wins over an outer one's, and
        // the event's own fields over both.
        let mut fields = Map::new();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                let Some(recorded) = extensions.get::<FormattedFields<JsonFields>>() else {
                    continue;
                };
                if let Ok(Value::Object(span_fields)) =
                    serde_json::from_str::<Value>(&recorded.fields)
                {
                    fields.extend(span_fields);
                }
            }
        }
        event.record(&mut JsonVisitor(&mut fields));
        // A handler's own fields (`context::add_field`) travel as one JSON object: written
        // flat, without replacing a key the worker wrote.
        if let Some(Value::String(extra)) = fields.remove(sqs_keeper_core::context::FIELDS_KEY) {
            if let Ok(Value::Object(extra)) = serde_json::from_str::<Value>(&extra) {
                for (key, value) in extra {
                    fields.entry(key).or_insert(value);
                }
            }
        }

        let mut line = String::with_capacity(256);
        line.push('{');
        push_entry(&mut line, "timestamp", &Value::String(timestamp()))?;
        let level = event.metadata().level().as_str();
        push_entry(&mut line, "level", &Value::String(level.to_string()))?;
        if let Some(message) = fields.get("message") {
            push_entry(&mut line, "message", message)?;
        }
        if let Some(name) = &self.function_name {
            push_entry(&mut line, "function_name", &Value::String(name.clone()))?;
        }
        for (key, value) in fields
            .iter()
            .filter(|(k, _)| !RESERVED.contains(&k.as_str()))
        {
            push_entry(&mut line, key, value)?;
        }
        line.push('}');
        writeln!(writer, "{line}")
    }
}

/// Appends `"key":value` (with a comma after the first entry).
fn push_entry(line: &mut String, key: &str, value: &Value) -> fmt::Result {
    if line.len() > 1 {
        line.push(',');
    }
    line.push_str(&serde_json::to_string(key).map_err(|_| fmt::Error)?);
    line.push(':');
    line.push_str(&serde_json::to_string(value).map_err(|_| fmt::Error)?);
    Ok(())
}

/// An event's fields as JSON values: numbers and booleans as such, everything else as its
/// `Display` (`%value`) or `Debug` text.
struct JsonVisitor<'a>(&'a mut Map<String, Value>);

impl Visit for JsonVisitor<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_string(), Value::from(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_string(), Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_string(), Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_string(), Value::from(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), Value::from(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0
            .insert(field.name().to_string(), Value::from(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_string(), Value::from(format!("{value:?}")));
    }
}

/// Whether the process has served an invocation yet.
static COLD: AtomicBool = AtomicBool::new(true);

tokio::task_local! {
    /// The cold start [`InvocationLayer`] decided for the invocation running in this task.
    static INVOCATION_COLD_START: bool;
}

/// True for the first invocation since the process started.
fn take_cold_start() -> bool {
    COLD.swap(false, Ordering::Relaxed)
}

/// Tells whether the running invocation is the process's first: what [`InvocationLayer`] decided
/// for it (and wrote on its log lines), so that the logs and the `ColdStart` metric agree.
/// Outside that layer (a worker driven directly, as tests and embedders do) each call
/// counts as a new invocation: true for the process's first call only.
pub fn cold_start() -> bool {
    INVOCATION_COLD_START
        .try_with(|cold| *cold)
        .unwrap_or_else(|_| take_cold_start())
}

/// Runs every invocation inside the `invocation` span (request id, cold start, X-Ray trace
/// id, tenant id) and records its cold start for [`cold_start`]. It replaces
/// `lambda_runtime`'s `TracingLayer`, whose span carries no cold start and is an INFO span
/// that `AWS_LAMBDA_LOG_LEVEL=ERROR` would turn off, taking the request id off the errors.
///
/// ```no_run
/// # async fn example() -> Result<(), lambda_runtime::Error> {
/// use lambda_runtime::{service_fn, LambdaEvent, Runtime};
/// use sqs_keeper_lambda::telemetry::InvocationLayer;
///
/// async fn echo(event: LambdaEvent<serde_json::Value>) -> Result<serde_json::Value, lambda_runtime::Error> {
///     Ok(event.payload)
/// }
/// Runtime::new(service_fn(echo)).layer(InvocationLayer).run().await
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct InvocationLayer;

impl<S> TowerLayer<S> for InvocationLayer {
    type Service = InvocationService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        InvocationService { inner }
    }
}

/// The service [`InvocationLayer`] builds.
#[derive(Debug, Clone)]
pub struct InvocationService<S> {
    inner: S,
}

impl<S> Service<LambdaInvocation> for InvocationService<S>
where
    S: Service<LambdaInvocation, Response = (), Error = lambda_runtime::Error>,
{
    type Response = ();
    type Error = lambda_runtime::Error;
    type Future = Instrumented<tokio::task::futures::TaskLocalFuture<bool, S::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, invocation: LambdaInvocation) -> Self::Future {
        let cold = take_cold_start();
        let span = invocation_span(&invocation.context, cold);
        // Entered while the inner service is called, so that what it does before returning
        // its future is inside the span too.
        let future = {
            let _entered = span.enter();
            self.inner.call(invocation)
        };
        INVOCATION_COLD_START.scope(cold, future).instrument(span)
    }
}

/// Returns the span of one invocation.
pub(crate) fn invocation_span(
    context: &lambda_runtime::Context,
    cold_start: bool,
) -> tracing::Span {
    let span = tracing::info_span!(
        INVOCATION_SPAN,
        requestId = %context.request_id,
        cold_start,
        xrayTraceId = tracing::field::Empty,
        tenantId = tracing::field::Empty,
    );
    if let Some(trace) = &context.xray_trace_id {
        span.record("xrayTraceId", trace.as_str());
        #[cfg(feature = "opentelemetry")]
        crate::otel::parent_on_lambda_segment(&span, trace);
    }
    if let Some(tenant) = &context.tenant_id {
        span.record("tenantId", tenant.as_str());
    }
    span
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Captures what the subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;

        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }

        /// Every line, parsed as JSON (a line that is not JSON fails the test).
        fn json_lines(&self) -> Vec<Map<String, Value>> {
            self.text()
                .lines()
                .map(|line| match serde_json::from_str(line) {
                    Ok(Value::Object(map)) => map,
                    other => panic!("not a JSON object: {line} ({other:?})"),
                })
                .collect()
        }
    }

    fn settings(vars: &[(&str, &str)]) -> LogSettings {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LogSettings::from_lookup(|name| {
            vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    }

    fn context(request_id: &str) -> lambda_runtime::Context {
        let mut context = lambda_runtime::Context::default();
        context.request_id = request_id.to_string();
        context
    }

    #[test]
    fn the_level_comes_from_lambda_and_rust_log_overrides_it() {
        assert_eq!(settings(&[]).level, LevelFilter::INFO);
        for (value, level) in [
            ("TRACE", LevelFilter::TRACE),
            ("debug", LevelFilter::DEBUG),
            ("Info", LevelFilter::INFO),
            ("WARN", LevelFilter::WARN),
            ("error", LevelFilter::ERROR),
            ("FATAL", LevelFilter::ERROR),
        ] {
            let s = settings(&[(LOG_LEVEL_VAR, value)]);
            assert_eq!(s.level, level, "{value}");
            assert!(s.problems.is_empty());
        }
        let bad = settings(&[(LOG_LEVEL_VAR, "LOUD")]);
        assert_eq!(bad.level, LevelFilter::INFO);
        assert_eq!(bad.problems.len(), 1);
        assert!(bad.problems[0].contains("LOUD"), "{:?}", bad.problems);

        let developer = settings(&[(LOG_LEVEL_VAR, "ERROR"), (RUST_LOG_VAR, "debug")]);
        assert_eq!(developer.directives.as_deref(), Some("debug"));
        assert_eq!(
            developer.env_filter().default_level(),
            Some(LevelFilter::DEBUG)
        );
        // An empty RUST_LOG is no override.
        let empty = settings(&[(LOG_LEVEL_VAR, "ERROR"), (RUST_LOG_VAR, "")]);
        assert_eq!(empty.directives, None);
        assert_eq!(empty.env_filter().default_level(), Some(LevelFilter::ERROR));
        let invalid = settings(&[(RUST_LOG_VAR, "sqs_keeper=loud")]);
        assert_eq!(invalid.directives, None);
        assert_eq!(invalid.problems.len(), 1);
    }

    /// Writes a record done, a record skipped and a record failed as the engine does, under
    /// `settings`; the messages written.
    fn record_lines_under(vars: &[(&str, &str)]) -> Vec<String> {
        let out = Captured::default();
        let s = settings(vars);
        let _guard = tracing::subscriber::set_default(subscriber(&s, out.clone()));
        let target = sqs_keeper_core::batch::RECORD_LINES_TARGET;
        tracing::info!(target: "sqs_keeper::records", message_id = "m-1", "record done");
        tracing::info!(target: "sqs_keeper::records", message_id = "m-2", "record skipped");
        tracing::warn!(message_id = "m-3", "record failed: returned for retry");
        tracing::info!(records = 3, "batch finished");
        assert_eq!(
            target, "sqs_keeper::records",
            "the engine's target, as written here"
        );
        out.json_lines()
            .iter()
            .map(|line| line["message"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    #[test]
    fn records_done_or_skipped_leave_a_line_only_when_every_record_is_asked_for() {
        let failures = ["record failed: returned for retry", "batch finished"];
        assert_eq!(record_lines_under(&[]), failures);
        assert_eq!(
            record_lines_under(&[(LOG_RECORDS_VAR, "failures")]),
            failures
        );
        let every = [
            "record done",
            "record skipped",
            "record failed: returned for retry",
            "batch finished",
        ];
        assert_eq!(record_lines_under(&[(LOG_RECORDS_VAR, "ALL")]), every);
        // A developer's RUST_LOG sets the levels, not which records are written.
        assert_eq!(record_lines_under(&[(RUST_LOG_VAR, "debug")]), failures);
        assert_eq!(
            record_lines_under(&[(RUST_LOG_VAR, "debug"), (LOG_RECORDS_VAR, "all")]),
            every
        );
        // Set in the store's object, as the configuration reads it; its own variable first.
        let store = r#"{"WORKER_LOG_RECORDS": "all"}"#;
        assert_eq!(record_lines_under(&[("SQS_KEEPER_STORE", store)]), every);
        assert_eq!(
            record_lines_under(&[("SQS_KEEPER_STORE", store), (LOG_RECORDS_VAR, "failures")]),
            failures
        );
        let bad = settings(&[(LOG_RECORDS_VAR, "some")]);
        assert_eq!(bad.record_lines, RecordLines::Failures);
        assert!(
            bad.problems[0].contains("WORKER_LOG_RECORDS"),
            "{:?}",
            bad.problems
        );
    }

    #[test]
    fn the_format_is_json_unless_text_is_asked_for() {
        assert_eq!(settings(&[]).format, LogFormat::Json);
        assert_eq!(
            settings(&[(LOG_FORMAT_VAR, "JSON")]).format,
            LogFormat::Json
        );
        assert_eq!(
            settings(&[(LOG_FORMAT_VAR, "Text")]).format,
            LogFormat::Text
        );
        assert_eq!(
            settings(&[(LOG_FORMAT_VAR, "TEXT")]).format,
            LogFormat::Text
        );
        let other = settings(&[(LOG_FORMAT_VAR, "xml")]);
        assert_eq!(other.format, LogFormat::Json);
        assert_eq!(other.problems.len(), 1);
    }

    /// At `AWS_LAMBDA_LOG_LEVEL=WARN`, a traced record's warning still names its trace: the
    /// `record` span's own callsite is let through at every level (found by an outside
    /// review, when the span was skipped unless INFO spans were enabled).
    #[test]
    fn a_traced_records_warning_names_its_trace_at_warn_level() {
        let out = Captured::default();
        let s = settings(&[(LOG_LEVEL_VAR, "WARN")]);
        let _guard = tracing::subscriber::set_default(subscriber(&s, out.clone()));
        let json = br#"{"Records":[{"messageId":"m-1","body":"{}","attributes":{"AWSTraceHeader":"Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"}}]}"#;
        let batch = sqs_keeper_core::event::decode_event(json).unwrap();
        let span = sqs_keeper_core::trace::TraceContext::record_span(&batch.records[0]);
        span.in_scope(|| tracing::warn!("record failed"));
        let lines = out.json_lines();
        assert_eq!(lines.len(), 1, "{}", out.text());
        assert_eq!(lines[0]["trace_id"], "1-5759e988-bd862e3fe1be46a994272793");
    }

    #[test]
    fn json_lines_are_flat_with_timestamp_level_message_and_span_fields() {
        let out = Captured::default();
        let s = settings(&[("AWS_LAMBDA_FUNCTION_NAME", "orders-worker")]);
        let _guard = tracing::subscriber::set_default(subscriber(&s, out.clone()));
        tracing::info!(outside = 1, "before any invocation");
        let mut ctx = context("req-1");
        ctx.xray_trace_id = Some("Root=1-abc".to_string());
        let span = invocation_span(&ctx, true);
        span.in_scope(|| {
            let inner = tracing::info_span!("record", message_id = "m-1");
            inner.in_scope(|| {
                tracing::warn!(records = 3, ratio = 0.5, ok = false, error = %"boom \"quoted\"", "batch {} finished", "one");
            });
        });

        let lines = out.json_lines();
        assert_eq!(lines.len(), 2, "{}", out.text());
        let before = &lines[0];
        assert_eq!(before["message"], "before any invocation");
        assert_eq!(before["outside"], 1);
        assert_eq!(before["function_name"], "orders-worker");
        assert!(before.get("requestId").is_none());

        let line = &lines[1];
        let timestamp = line["timestamp"].as_str().unwrap();
        let parsed = chrono::DateTime::parse_from_rfc3339(timestamp).unwrap();
        assert_eq!(parsed.offset().local_minus_utc(), 0);
        assert!(
            timestamp.len() == 24 && timestamp.ends_with('Z') && timestamp.as_bytes()[19] == b'.',
            "RFC 3339 UTC with milliseconds: {timestamp}"
        );
        assert!((chrono::Utc::now() - parsed.with_timezone(&chrono::Utc)).num_seconds() < 60);
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["message"], "batch one finished");
        assert_eq!(line["function_name"], "orders-worker");
        assert_eq!(line["requestId"], "req-1");
        assert_eq!(line["cold_start"], true);
        assert_eq!(line["xrayTraceId"], "Root=1-abc");
        assert_eq!(line["message_id"], "m-1", "inner span fields too");
        assert_eq!(line["records"], 3);
        assert_eq!(line["ratio"], 0.5);
        assert_eq!(line["ok"], false);
        assert_eq!(line["error"], "boom \"quoted\"");
        for nested in ["fields", "span", "spans", "target", "tenantId"] {
            assert!(line.get(nested).is_none(), "{nested} in {line:?}");
        }
        assert!(line.values().all(|v| !v.is_object()), "flat: {line:?}");
    }

    #[test]
    fn error_level_silences_info_but_keeps_the_request_id_on_errors() {
        let out = Captured::default();
        let s = settings(&[(LOG_LEVEL_VAR, "ERROR")]);
        let _guard = tracing::subscriber::set_default(subscriber(&s, out.clone()));
        invocation_span(&context("req-2"), false).in_scope(|| {
            tracing::info!("quiet");
            tracing::warn!("quiet too");
            tracing::error!(code = 7, "loud");
        });
        let lines = out.json_lines();
        assert_eq!(lines.len(), 1, "{}", out.text());
        assert_eq!(lines[0]["message"], "loud");
        assert_eq!(lines[0]["level"], "ERROR");
        assert_eq!(lines[0]["requestId"], "req-2");
        assert_eq!(lines[0]["cold_start"], false);
    }

    #[test]
    fn text_lines_are_for_people() {
        let out = Captured::default();
        let s = settings(&[(LOG_FORMAT_VAR, "Text")]);
        let _guard = tracing::subscriber::set_default(subscriber(&s, out.clone()));
        invocation_span(&context("req-3"), true).in_scope(|| {
            tracing::info!(records = 2, "batch finished");
        });
        let text = out.text();
        let line = text.lines().next().unwrap();
        assert!(serde_json::from_str::<Value>(line).is_err(), "{line}");
        let (timestamp, rest) = line.split_once(' ').unwrap();
        assert!(
            chrono::DateTime::parse_from_rfc3339(timestamp).is_ok(),
            "{line}"
        );
        assert!(rest.contains("INFO"), "{line}");
        assert!(rest.contains("requestId=req-3"), "{line}");
        assert!(rest.contains("cold_start=true"), "{line}");
        assert!(rest.contains("batch finished records=2"), "{line}");
        assert!(!line.contains('\u{1b}'), "no colours: {line:?}");
    }

    /// The layer opens the span around the whole invocation and hands the handler the same
    /// cold start it wrote on the lines; the second invocation of a process is warm.
    #[tokio::test]
    async fn the_layer_runs_each_invocation_in_its_span() {
        use lambda_runtime::tower::ServiceExt;

        let out = Captured::default();
        let _guard = tracing::subscriber::set_default(subscriber(&settings(&[]), out.clone()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handler = {
            let seen = seen.clone();
            lambda_runtime::tower::service_fn(move |invocation: LambdaInvocation| {
                let seen = seen.clone();
                async move {
                    tracing::info!("handling");
                    seen.lock()
                        .unwrap()
                        .push((invocation.context.request_id, cold_start()));
                    Ok::<(), lambda_runtime::Error>(())
                }
            })
        };
        let mut service = InvocationLayer.layer(handler);
        for id in ["req-a", "req-b"] {
            let invocation = LambdaInvocation {
                parts: http::Response::new(()).into_parts().0,
                body: Default::default(),
                context: context(id),
            };
            service
                .ready()
                .await
                .unwrap()
                .call(invocation)
                .await
                .unwrap();
        }
        let seen = seen.lock().unwrap().clone();
        let lines = out.json_lines();
        assert_eq!(lines.len(), 2, "{}", out.text());
        for ((id, cold), line) in seen.iter().zip(&lines) {
            assert_eq!(line["requestId"], id.as_str());
            assert_eq!(line["cold_start"], *cold, "the line and the handler agree");
        }
        assert!(!seen[1].1, "the second invocation is warm");
    }
}
