//! `keeper`: runs the worker pipeline on this machine (see `keeper --help`).

use std::path::PathBuf;
use std::process::ExitCode;

// The allocator the worker binary ships with, so `bench-cpu` measures what it runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use sqs_keeper_aws::Endpoints;
use sqs_keeper_local::demo::{self, DemoOptions};
use sqs_keeper_local::downstream::{Downstream, DownstreamConfig};
use sqs_keeper_local::function::{workspace_bin_dir, FunctionProcess};
use sqs_keeper_local::runtime_api::{InvocationResult, RuntimeApi};

/// Runs the worker pipeline locally, with no AWS account.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where the emulators are (`scripts/emulator.sh env` prints both).
#[derive(Args)]
struct EmulatorArgs {
    /// The URL of the emulator that serves SQS, S3 and the other services but DynamoDB
    /// (`scripts/emulator.sh url`); default: `AWS_ENDPOINT_URL`, as `keeper store` prints it.
    #[arg(long, env = "EMULATOR_URL")]
    endpoint_url: Option<String>,
    /// DynamoDB Local's URL (`scripts/emulator.sh dynamodb-url`); default:
    /// `AWS_ENDPOINT_URL_DYNAMODB`, then `--endpoint-url`, for an emulator that serves every
    /// service.
    #[arg(long, env = "EMULATOR_DYNAMODB_URL")]
    dynamodb_endpoint_url: Option<String>,
}

impl EmulatorArgs {
    /// The endpoints, refused unless both are on loopback: these commands create, fill and
    /// delete resources, which must never reach a real account.
    fn endpoints(self) -> Result<Endpoints, String> {
        let aws = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let shared = self.endpoint_url.or_else(|| aws("AWS_ENDPOINT_URL")).ok_or(
            "no emulator named: pass --endpoint-url, or set EMULATOR_URL or AWS_ENDPOINT_URL (`keeper store` prints it; `scripts/emulator.sh env` prints both)",
        )?;
        let endpoints = Endpoints {
            dynamodb: self
                .dynamodb_endpoint_url
                .or_else(|| aws("AWS_ENDPOINT_URL_DYNAMODB"))
                .unwrap_or_else(|| shared.clone()),
            shared,
        };
        for url in [&endpoints.shared, &endpoints.dynamodb] {
            if !url.starts_with("http://127.") && !url.starts_with("http://localhost") {
                return Err(format!(
                    "only a local emulator (http://127.x.x.x or localhost) is allowed, not {url}"
                ));
            }
        }
        Ok(endpoints)
    }
}

#[derive(Subcommand)]
enum Command {
    /// Runs the whole pipeline against the emulator: creates the queues, table and bucket,
    /// sends a mixed workload, drives the compiled worker through a local event source
    /// mapping until the source queue is empty, and prints a summary that must add up.
    /// Then plays the operator: `dlq stats`, `dlq analyze`, fixes the downstream, and
    /// `dlq redrive`s what is eligible, printing the before and after.
    ///
    /// The data is left in place; the environment to reach it is written to
    /// `<state-dir>/demo.env` and the worker's log to `<state-dir>/worker.log`.
    ///
    /// Example: keeper demo --endpoint-url http://127.0.0.1:5000 --dynamodb-endpoint-url http://127.0.0.1:8000
    Demo {
        #[command(flatten)]
        emulator: EmulatorArgs,
        /// Region name used with the emulator.
        #[arg(long, default_value = "us-east-1")]
        region: String,
        /// Resource name prefix.
        #[arg(long, default_value = "demo")]
        prefix: String,
        /// Messages to send.
        #[arg(long, default_value_t = 300)]
        items: usize,
        /// Directory for the worker log and `demo.env`.
        #[arg(long, default_value = ".emulator")]
        state_dir: PathBuf,
        /// The worker binary (default: `worker` next to this binary).
        #[arg(long)]
        worker: Option<PathBuf>,
    },
    /// The outage scenario: the downstream is down for longer than maxReceiveCount x the
    /// visibility timeout while the compiled worker runs with spaced redelivery and the
    /// shared circuit breaker, and the compiled redrive function runs as its schedule
    /// would (during the outage, then after). Prints a summary that must add up.
    ///
    /// Example: keeper demo-outage --endpoint-url http://127.0.0.1:5000 --dynamodb-endpoint-url http://127.0.0.1:8000 --outage-secs 20
    DemoOutage {
        #[command(flatten)]
        emulator: EmulatorArgs,
        /// Region name used with the emulator.
        #[arg(long, default_value = "us-east-1")]
        region: String,
        /// Resource name prefix.
        #[arg(long, default_value = "demo")]
        prefix: String,
        /// Messages to send (at most 200).
        #[arg(long, default_value_t = 50)]
        items: usize,
        /// How long the downstream is down, in seconds.
        #[arg(long, default_value_t = 20)]
        outage_secs: u64,
        /// Run without the breaker's polling control (the worker receives and hides every
        /// waiting message throughout the outage), to compare the receives.
        #[arg(long)]
        no_polling_control: bool,
        /// Directory for the functions' logs.
        #[arg(long, default_value = ".emulator")]
        state_dir: PathBuf,
        /// The worker binary (default: `worker` next to this binary; `redrive` is taken
        /// from the same directory).
        #[arg(long)]
        worker: Option<PathBuf>,
    },
    /// Measures the operator's reads (`list`, `analyze`, `stats`) over a seeded table
    /// and redrive throughput and AWS calls per item, against the emulator. Prints a
    /// table and writes the figures as JSON.
    ///
    /// Example: keeper bench-store --endpoint-url http://127.0.0.1:5000 --dynamodb-endpoint-url http://127.0.0.1:8000 --records 10000
    BenchStore {
        #[command(flatten)]
        emulator: EmulatorArgs,
        /// Records to seed.
        #[arg(long, default_value_t = 10_000)]
        records: usize,
        /// Items per redrive measurement (0 skips them).
        #[arg(long, default_value_t = 1_000)]
        redrive_items: usize,
        /// DLQ messages a full sweep is measured over.
        #[arg(long, default_value_t = 10_000)]
        sweep_messages: usize,
        /// Where the JSON figures go.
        #[arg(long, default_value = "target/bench/store.json")]
        output: PathBuf,
    },
    /// Measures the worker binary: cold start against a hello-world `lambda_runtime`
    /// binary of the same profile, stripped size, peak RSS on a 10,000-record event, and
    /// a 100-record batch at concurrency 1, 10 and 50 against the ideal. Run it from a
    /// release build (`make bench-runtime`).
    ///
    /// Example: keeper bench-runtime --spawns 20
    BenchRuntime {
        /// Spawns per binary for the cold-start medians.
        #[arg(long, default_value_t = 20)]
        spawns: usize,
        /// Where the JSON figures go.
        #[arg(long, default_value = "target/bench/runtime.json")]
        output: PathBuf,
    },
    /// Every benchmark in one run (what `make bench` runs): per-record CPU against
    /// Powertools and the serde_json floor, cold start, size, peak RSS, batch concurrency,
    /// dead-letter overhead against the emulator, the GB-seconds per million messages end to
    /// end, and what a million messages cost all in (as `bench-all-in`). Prints tables,
    /// writes the figures as JSON and renders docs/BENCHMARKS.md. Run it from a release
    /// build.
    ///
    /// Example: keeper bench --endpoint-url http://127.0.0.1:5000 --dynamodb-endpoint-url http://127.0.0.1:8000
    Bench {
        #[command(flatten)]
        emulator: EmulatorArgs,
        /// Iterations per CPU measurement (the median is reported).
        #[arg(long, default_value_t = 20)]
        iterations: usize,
        /// Spawns per binary for the cold-start medians (the two binaries take turns).
        #[arg(long, default_value_t = 50)]
        spawns: usize,
        /// Where the JSON figures go.
        #[arg(long, default_value = "target/bench/bench.json")]
        output: PathBuf,
        /// Where the markdown report goes.
        #[arg(long, default_value = "docs/BENCHMARKS.md")]
        markdown: PathBuf,
        /// Where the `worker` and `hello_lambda` binaries measured for start-up, size and
        /// memory are (default: next to this binary). `make bench` passes `target/lambda`,
        /// the profile the functions ship with.
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// Messages each contender of the end-to-end cost benchmark processes.
        #[arg(long, default_value_t = 1000)]
        cost_messages: usize,
    },
    /// Lambda GB-seconds per million messages and messages per second per sandbox, end to
    /// end (event source mapping, Runtime API, a 20 ms downstream), for the worker binary
    /// against Powertools for AWS Lambda (Python) with BatchProcessor and AsyncBatchProcessor.
    ///
    /// Example: keeper bench-cost --bin-dir target/lambda --messages 1000
    BenchCost {
        #[command(flatten)]
        emulator: EmulatorArgs,
        /// Where the `worker` binary is (default: next to this binary).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// Messages each contender processes.
        #[arg(long, default_value_t = 1000)]
        messages: usize,
    },
    /// What a million messages cost all in (SQS, DynamoDB, S3 and Lambda requests counted
    /// as AWS bills them, and Lambda's GB-seconds), for the worker and for Powertools'
    /// BatchProcessor doing the same work, in four configurations: plain, per-record
    /// idempotency, 5 % transient failures with spaced retries and the breaker, 1 %
    /// dead-lettered.
    ///
    /// Example: keeper bench-all-in --bin-dir target/lambda --messages 1000
    BenchAllIn {
        #[command(flatten)]
        emulator: EmulatorArgs,
        /// Where the `worker` binary is (default: next to this binary).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// Messages each contender processes in each configuration.
        #[arg(long, default_value_t = 1000)]
        messages: usize,
    },
    /// Per-record CPU of the worker's invocation path against the serde_json floor and
    /// Powertools for AWS Lambda (Python) on the same event bytes.
    ///
    /// Example: keeper bench-cpu --iterations 20
    BenchCpu {
        /// Iterations per event shape (the median is reported).
        #[arg(long, default_value_t = 20)]
        iterations: usize,
        /// Where the JSON figures go.
        #[arg(long, default_value = "target/bench/cpu.json")]
        output: PathBuf,
    },
    /// Creates a handler's dead-letter store on the emulator: the record table (with its two
    /// indexes and TTL), the DLQ, the payload bucket, and a source queue whose redrive
    /// policy names that DLQ, shaped as the templates shape them. Prints the variables
    /// that point a handler and `dlq` at them (`NAME=value` lines; `export $(keeper store
    /// ...)` sets them in a shell).
    ///
    /// Example: keeper store --prefix orders
    Store {
        #[command(flatten)]
        emulator: EmulatorArgs,
        /// Region name used with the emulator.
        #[arg(long, default_value = "us-east-1")]
        region: String,
        /// What every name starts with: <prefix>-source, <prefix>-dlq,
        /// <prefix>-dead-letters (the table) and <prefix>-payloads (lower-case letters,
        /// digits and dashes).
        #[arg(long)]
        prefix: String,
        /// FIFO queues (source and DLQ, as SQS requires).
        #[arg(long)]
        fifo: bool,
        /// The source queue's maxReceiveCount (printed as WORKER_MAX_RECEIVE_COUNT).
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
        max_receive_count: u32,
        /// The source queue's visibility timeout, in seconds: how soon a record returned
        /// for retry comes back.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(0..=43200))]
        visibility_timeout: u32,
        /// Delete the resources of that prefix first, with their data.
        #[arg(long)]
        replace: bool,
    },
    /// Creates a handler crate of your own in a new directory, outside this checkout:
    /// `src/main.rs` (a handler to edit), a `Cargo.toml` that depends on this checkout's
    /// `sqs-keeper` and unwinds on panic in release builds, this checkout's `Cargo.lock`
    /// (the dependency versions its tests pass with), a README, a `.gitignore`, and the SAM
    /// templates that deploy it (`template.yaml` for the function, `store.yaml` for its
    /// store). Prints the commands that build it and run it locally.
    ///
    /// Example: keeper new ../orders-handler
    New {
        /// The crate's directory (created; refused when it holds anything).
        dir: PathBuf,
        /// The package and binary name (default: the directory's name).
        #[arg(long)]
        name: Option<String>,
        /// The `sqs-keeper` crate to depend on (default: the checkout this `keeper` was
        /// built from).
        #[arg(long)]
        sqs_keeper: Option<PathBuf>,
    },
    /// Sends messages to a queue on the emulator: one body, from the command line or a
    /// file, as many times as --count says. A body SQS would refuse (empty, over
    /// 1,048,576 bytes, a character outside its set) is refused before anything is sent.
    ///
    /// Example: keeper send --body '{"order_id":"o-1","qty":2}' --count 10
    Send {
        #[command(flatten)]
        emulator: EmulatorArgs,
        /// Region name used with the emulator.
        #[arg(long, default_value = "us-east-1")]
        region: String,
        /// The queue (`SOURCE_QUEUE_URL` from `keeper store`).
        #[arg(long, env = "SOURCE_QUEUE_URL")]
        queue_url: String,
        /// The message body.
        #[arg(long, conflicts_with = "file", required_unless_present = "file")]
        body: Option<String>,
        /// A file whose whole contents are the message body (UTF-8).
        #[arg(long)]
        file: Option<PathBuf>,
        /// How many copies to send.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100_000))]
        count: u64,
        /// The message group on a FIFO queue.
        #[arg(long, default_value = "local")]
        group_id: String,
    },
    /// Runs your own handler binary as Lambda would, fed from a queue on the emulator by a
    /// local event source mapping, with its log lines on this terminal (stderr), until the
    /// queue is empty (nothing visible, nothing in flight) or --max-secs pass; a queue
    /// empty at the start is waited on for --wait-secs first. The
    /// handler gets this shell's environment (its own variables, and the DLQ_* ones that
    /// `keeper store` prints for a dead-letter store), with the emulators' endpoints and
    /// test credentials set over it. Prints the totals; exits 1 when the queue was not
    /// emptied in time.
    ///
    /// Example: keeper run --worker target/debug/my-handler --queue-url "$SOURCE_QUEUE_URL"
    Run {
        #[command(flatten)]
        emulator: EmulatorArgs,
        /// Region name used with the emulator.
        #[arg(long, default_value = "us-east-1")]
        region: String,
        /// Your handler's compiled binary.
        #[arg(long)]
        worker: PathBuf,
        /// The queue to feed it from (`SOURCE_QUEUE_URL` from `keeper store`).
        #[arg(long, env = "SOURCE_QUEUE_URL")]
        queue_url: String,
        /// Records per invocation (above 10, gathered from several receives).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(i32).range(1..=10000))]
        batch_size: i32,
        /// Each invocation's time, in seconds (sent as its deadline).
        #[arg(long, default_value_t = 30)]
        timeout_secs: u64,
        /// The longest the run polls, in seconds.
        #[arg(long, default_value_t = 300)]
        max_secs: u64,
        /// The function's name (AWS_LAMBDA_FUNCTION_NAME: it prefixes idempotency keys and
        /// names the breaker).
        #[arg(long, default_value = "local-handler")]
        function_name: String,
        /// How long to wait for a first message when the queue is empty at the start.
        #[arg(long, default_value_t = 30)]
        wait_secs: u64,
    },
    /// Invokes a compiled worker binary once with an SQS event file and prints the batch
    /// response on stdout, the function's log lines on stderr. The shipped worker is given
    /// a local deterministic downstream (the body's `scenario` decides its answer); a
    /// dead-letter store is used only when this shell sets DLQ_TABLE, DLQ_QUEUE_URL and
    /// DLQ_BUCKET (then also AWS_ENDPOINT_URL for the emulator), else permanent failures
    /// are returned. For a handler of your own fed from a queue, see `keeper run`.
    ///
    /// Example: keeper invoke --event samples/demo-event.json
    Invoke {
        /// The SQS event (JSON, as Lambda delivers it).
        #[arg(long)]
        event: PathBuf,
        /// Time the invocation may take (sent as its deadline).
        #[arg(long, default_value_t = 30)]
        timeout_secs: u64,
        /// The worker binary (default: `worker` next to this binary).
        #[arg(long)]
        worker: Option<PathBuf>,
    },
}

/// The body of `keeper send`: given, or read from a file.
fn read_body(body: Option<String>, file: Option<PathBuf>) -> Result<String, String> {
    match (body, file) {
        (Some(body), _) => Ok(body),
        (None, Some(file)) => read_at_most(&file, sqs_keeper_core::message::MAX_MESSAGE_BYTES + 1)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))
            .and_then(|bytes| {
                if bytes.len() > sqs_keeper_core::message::MAX_MESSAGE_BYTES {
                    return Err(format!(
                        "{} is larger than SQS takes ({} bytes at most)",
                        file.display(),
                        sqs_keeper_core::message::MAX_MESSAGE_BYTES
                    ));
                }
                String::from_utf8(bytes).map_err(|e| {
                    format!(
                        "{} is not UTF-8 (byte {}): SQS bodies are text; send binary data base64-encoded",
                        file.display(),
                        e.utf8_error().valid_up_to()
                    )
                })
            }),
        (None, None) => Err("give the body with --body or --file".to_string()),
    }
}

/// The first `limit` bytes of a file: enough to refuse one too large for SQS without
/// reading it all (`/dev/zero` never ends).
fn read_at_most(path: &std::path::Path, limit: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(u64::try_from(limit).unwrap_or(u64::MAX))
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// `keeper new`: writes the crate and prints what to run next.
fn new_handler(
    dir: PathBuf,
    name: Option<String>,
    sqs_keeper: Option<PathBuf>,
) -> Result<ExitCode, String> {
    let options = sqs_keeper_local::handler_new::NewOptions {
        dir,
        name,
        sqs_keeper,
    };
    let name = sqs_keeper_local::handler_new::create(&options)?;
    // Quoted for a shell: the lines below are meant to be pasted.
    let dir = format!(
        "'{}'",
        options.dir.display().to_string().replace('\'', "'\\''")
    );
    println!("created {dir} (package {name})");
    println!("next, with the variables of `keeper store` exported:");
    println!("  cd {dir} && cargo build");
    println!("  keeper send --body '{{\"order_id\":\"o-1\",\"qty\":2}}'");
    println!("  keeper run --worker target/debug/{name}");
    Ok(ExitCode::SUCCESS)
}

fn worker_path(worker: Option<PathBuf>) -> Result<PathBuf, String> {
    worker
        .or_else(|| workspace_bin_dir().map(|d| d.join("worker")))
        .filter(|p| p.exists())
        .ok_or_else(|| {
            "cannot find the worker binary; build it (cargo build) or pass --worker".to_string()
        })
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo {
            emulator,
            region,
            prefix,
            items,
            state_dir,
            worker,
        } => match (emulator.endpoints(), worker_path(worker)) {
            (Ok(endpoints), Ok(worker_binary)) => {
                run_demo(DemoOptions {
                    endpoints,
                    region,
                    prefix,
                    worker_binary,
                    state_dir,
                    items,
                })
                .await
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        },
        Command::DemoOutage {
            emulator,
            region,
            prefix,
            items,
            outage_secs,
            no_polling_control,
            state_dir,
            worker,
        } => match (emulator.endpoints(), worker_path(worker)) {
            (Ok(endpoints), Ok(worker_binary)) => {
                let options = DemoOptions {
                    endpoints,
                    region,
                    prefix,
                    worker_binary,
                    state_dir,
                    items,
                };
                match std::fs::create_dir_all(&options.state_dir) {
                    Err(e) => Err(format!(
                        "cannot create {}: {e}",
                        options.state_dir.display()
                    )),
                    Ok(()) => sqs_keeper_local::outage::run_outage(
                        &options,
                        Duration::from_secs(outage_secs),
                        !no_polling_control,
                    )
                    .await
                    .map(|summary| {
                        if summary.adds_up() {
                            ExitCode::SUCCESS
                        } else {
                            ExitCode::from(1)
                        }
                    }),
                }
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        },
        Command::Invoke {
            event,
            timeout_secs,
            worker,
        } => invoke(event, Duration::from_secs(timeout_secs), worker).await,
        Command::Store {
            emulator,
            region,
            prefix,
            fifo,
            max_receive_count,
            visibility_timeout,
            replace,
        } => match emulator.endpoints() {
            Ok(endpoints) => {
                let options = sqs_keeper_local::handler_loop::StoreOptions {
                    endpoints,
                    region,
                    prefix,
                    fifo,
                    max_receive_count,
                    visibility_timeout_secs: visibility_timeout,
                    replace,
                };
                sqs_keeper_local::handler_loop::create_store(&options)
                    .await
                    .map(|env| {
                        for (name, value) in env {
                            println!("{name}={value}");
                        }
                        ExitCode::SUCCESS
                    })
            }
            Err(e) => Err(e),
        },
        Command::New {
            dir,
            name,
            sqs_keeper,
        } => new_handler(dir, name, sqs_keeper),
        Command::Send {
            emulator,
            region,
            queue_url,
            body,
            file,
            count,
            group_id,
        } => match (emulator.endpoints(), read_body(body, file)) {
            (Ok(endpoints), Ok(body)) => {
                let options = sqs_keeper_local::handler_loop::SendOptions {
                    endpoints,
                    region,
                    queue_url,
                    body,
                    count: usize::try_from(count).unwrap_or(usize::MAX),
                    group_id,
                };
                sqs_keeper_local::handler_loop::send(&options)
                    .await
                    .map(|sent| {
                        println!("sent {sent} message(s) to {}", options.queue_url);
                        ExitCode::SUCCESS
                    })
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        },
        Command::Run {
            emulator,
            region,
            worker,
            queue_url,
            batch_size,
            timeout_secs,
            max_secs,
            function_name,
            wait_secs,
        } => match emulator.endpoints() {
            Ok(endpoints) => {
                let options = sqs_keeper_local::handler_loop::RunOptions {
                    endpoints,
                    region,
                    worker,
                    queue_url,
                    batch_size,
                    timeout: Duration::from_secs(timeout_secs),
                    max: Duration::from_secs(max_secs),
                    function_name,
                    wait: Duration::from_secs(wait_secs),
                };
                sqs_keeper_local::handler_loop::run(&options)
                    .await
                    .map(|(stats, drained)| {
                        println!(
                            "invocations {}, messages received {} (redeliveries included), deleted after success {}, reported failed {}, invocations failed whole {}; queue {}",
                            stats.invocations,
                            stats.received,
                            stats.deleted,
                            stats.reported,
                            stats.failed_invocations,
                            if drained { "empty" } else { "not empty when --max-secs ran out" }
                        );
                        if drained {
                            ExitCode::SUCCESS
                        } else {
                            ExitCode::from(1)
                        }
                    })
            }
            Err(e) => Err(e),
        },
        Command::Bench {
            emulator,
            iterations,
            spawns,
            output,
            markdown,
            bin_dir,
            cost_messages,
        } => match emulator.endpoints() {
            Ok(endpoints) => {
                bench_all(
                    endpoints,
                    iterations,
                    spawns,
                    &output,
                    &markdown,
                    bin_dir,
                    cost_messages,
                )
                .await
            }
            Err(e) => Err(e),
        },
        Command::BenchCost {
            emulator,
            bin_dir,
            messages,
        } => match emulator_and_bins(emulator, bin_dir) {
            Ok((endpoints, bin_dir)) => {
                sqs_keeper_local::bench_cost::run(&endpoints, &bin_dir, messages)
                    .await
                    .map(|cost| {
                        println!("{}", sqs_keeper_local::bench_cost::render(&cost));
                        ExitCode::SUCCESS
                    })
            }
            Err(e) => Err(e),
        },
        Command::BenchAllIn {
            emulator,
            bin_dir,
            messages,
        } => match emulator_and_bins(emulator, bin_dir) {
            Ok((endpoints, bin_dir)) => {
                sqs_keeper_local::bench_allin::run(&endpoints, &bin_dir, messages)
                    .await
                    .map(|bench| {
                        println!("{}", sqs_keeper_local::bench_allin::render(&bench));
                        ExitCode::SUCCESS
                    })
            }
            Err(e) => Err(e),
        },
        Command::BenchCpu { iterations, output } => bench_cpu(iterations, &output).await,
        Command::BenchRuntime { spawns, output } => bench_runtime(spawns, &output).await,
        Command::BenchStore {
            emulator,
            records,
            redrive_items,
            sweep_messages,
            output,
        } => match emulator.endpoints() {
            Ok(endpoints) => {
                bench_store(&endpoints, records, redrive_items, sweep_messages, &output).await
            }
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

/// The emulator's endpoints and where the function binaries are (`bin_dir`, else next to
/// this binary), for the benchmarks that run both.
fn emulator_and_bins(
    emulator: EmulatorArgs,
    bin_dir: Option<PathBuf>,
) -> Result<(Endpoints, PathBuf), String> {
    let endpoints = emulator.endpoints()?;
    let bin_dir = bin_dir
        .or_else(workspace_bin_dir)
        .ok_or("cannot locate the binaries; pass --bin-dir")?;
    Ok((endpoints, bin_dir))
}

async fn run_demo(options: DemoOptions) -> Result<ExitCode, String> {
    std::fs::create_dir_all(&options.state_dir)
        .map_err(|e| format!("cannot create {}: {e}", options.state_dir.display()))?;
    let (summary, redrive) = demo::run(&options).await?;
    println!(
        "\nbefore the redrive: {} dead; after: {} dead, {} resolved, DLQ depth {} (the rest need a fix to the data or a human: validation and permission failures)",
        redrive.dead_before, redrive.dead_after, redrive.resolved_after, redrive.dlq_after
    );
    println!(
        "The data is left in place; its environment is in {}.",
        options.state_dir.join("demo.env").display()
    );
    Ok(if summary.adds_up() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

async fn bench_all(
    endpoints: Endpoints,
    iterations: usize,
    spawns: usize,
    output: &std::path::Path,
    markdown: &std::path::Path,
    bin_dir: Option<PathBuf>,
    cost_messages: usize,
) -> Result<ExitCode, String> {
    let bin_dir = match bin_dir {
        Some(dir) => dir,
        None => workspace_bin_dir().ok_or("cannot locate the binaries")?,
    };
    let options = sqs_keeper_local::bench::BenchOptions {
        endpoints,
        iterations,
        spawns,
        bin_dir,
        work_dir: PathBuf::from("target/bench"),
        cost_messages,
    };
    let run = sqs_keeper_local::bench::run(&options).await?;
    println!("{}", sqs_keeper_local::bench::render(&run));
    sqs_keeper_local::bench::write(&run, output, markdown)?;
    println!(
        "figures written to {} and {}",
        output.display(),
        markdown.display()
    );
    Ok(ExitCode::SUCCESS)
}

async fn bench_cpu(iterations: usize, output: &std::path::Path) -> Result<ExitCode, String> {
    let figures =
        sqs_keeper_local::bench_cpu::run(iterations, std::path::Path::new("target/bench/cpu"))
            .await?;
    println!("{}", sqs_keeper_local::bench_cpu::render(&figures));
    write_json(output, &figures)
}

async fn bench_runtime(spawns: usize, output: &std::path::Path) -> Result<ExitCode, String> {
    let dir = workspace_bin_dir().ok_or("cannot locate the binaries")?;
    let figures = sqs_keeper_local::bench_runtime::run(&dir, spawns).await?;
    println!("{}", sqs_keeper_local::bench_runtime::render(&figures));
    write_json(output, &figures)
}

fn write_json(
    output: &std::path::Path,
    figures: &impl serde::Serialize,
) -> Result<ExitCode, String> {
    if let Some(dir) = output.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let json = serde_json::to_string_pretty(figures).map_err(|e| e.to_string())?;
    std::fs::write(output, json).map_err(|e| format!("cannot write {}: {e}", output.display()))?;
    println!("figures written to {}", output.display());
    Ok(ExitCode::SUCCESS)
}

async fn bench_store(
    endpoints: &Endpoints,
    records: usize,
    redrive_items: usize,
    sweep_messages: usize,
    output: &std::path::Path,
) -> Result<ExitCode, String> {
    let figures = sqs_keeper_local::bench_store::run(
        endpoints,
        "us-east-1",
        records,
        redrive_items,
        sweep_messages,
    )
    .await?;
    println!("{}", sqs_keeper_local::bench_store::render(&figures));
    if let Some(dir) = output.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let json = serde_json::to_string_pretty(&figures).map_err(|e| e.to_string())?;
    std::fs::write(output, json).map_err(|e| format!("cannot write {}: {e}", output.display()))?;
    println!("figures written to {}", output.display());
    Ok(ExitCode::SUCCESS)
}

async fn invoke(
    event: PathBuf,
    timeout: Duration,
    worker: Option<PathBuf>,
) -> Result<ExitCode, String> {
    let bytes = tokio::fs::read(&event)
        .await
        .map_err(|e| format!("cannot read {}: {e}", event.display()))?;
    serde_json::from_slice::<aws_lambda_events::sqs::SqsEvent>(&bytes)
        .map_err(|e| format!("{} is not an SQS event: {e}", event.display()))?;
    let worker = worker_path(worker)?;
    let downstream = Downstream::start(0, DownstreamConfig::default())
        .await
        .map_err(|e| format!("cannot start the downstream: {e}"))?;
    let api = RuntimeApi::start("arn:aws:lambda:us-east-1:000000000000:function:worker")
        .await
        .map_err(|e| format!("cannot start the runtime API: {e}"))?;
    let env = vec![
        ("WORKER_DOWNSTREAM_URL".to_string(), downstream.url()),
        (
            "WORKER_DOWNSTREAM_TIMEOUT_MS".to_string(),
            "1000".to_string(),
        ),
        (
            "WORKER_ITEM_ID_SOURCE".to_string(),
            "pointer:/id".to_string(),
        ),
        ("WORKER_MAX_RECEIVE_COUNT".to_string(), "3".to_string()),
        ("WORKER_RETRY_BASE_DELAY_MS".to_string(), "50".to_string()),
    ]
    .into_iter()
    .chain(sqs_keeper_local::handler_loop::every_record_logged())
    .collect::<Vec<_>>();
    let mut process = FunctionProcess::spawn_to_terminal(&worker, "worker", &api.address(), &env)
        .map_err(|e| format!("cannot start {}: {e}", worker.display()))?;
    let result = api.invoke(bytes.into(), timeout).await;
    let _ = process.kill().await;
    match result.map_err(|e| e.to_string())? {
        InvocationResult::Response(body) => {
            println!("{}", String::from_utf8_lossy(&body));
            Ok(ExitCode::SUCCESS)
        }
        InvocationResult::Error(body) => {
            println!("{}", String::from_utf8_lossy(&body));
            eprintln!("the worker failed the whole invocation");
            Ok(ExitCode::from(1))
        }
    }
}
