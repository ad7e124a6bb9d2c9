//! # sqs-keeper-local
//!
//! Everything needed to run the worker pipeline on one machine, with no AWS account:
//!
//! | module | what it is for |
//! | --- | --- |
//! | [`http_server`] | a minimal HTTP/1.1 server on loopback shared by the pieces below |
//! | [`runtime_api`] | a Lambda Runtime API endpoint that feeds events to the compiled worker binary |
//! | [`function`] | spawns a function binary against that endpoint, as Lambda would |
//! | [`downstream`] | a downstream HTTP service that answers deterministically per item |
//! | [`resources`] | creates queues, table and bucket as the infrastructure template does |
//! | [`emulator`] | finds or starts the local AWS emulators (`EMULATOR_URL`, `EMULATOR_DYNAMODB_URL`, `scripts/emulator.sh`) |
//! | [`esm`] | a local event source mapping: receive, build the Lambda event, invoke, delete |
//! | [`invokers`] | reach the worker as a binary over the Runtime API, or in process |
//! | [`lambda_api`] | a local Lambda Invoke API that forwards to a function binary |
//! | [`demo`] | the `make demo` workload, run and summary |
//! | [`handler_loop`] | a handler author's loop: `keeper store` (a dead-letter store on the emulator) and `keeper run` (your binary fed from a queue) |
//! | [`bench`](mod@bench) | `keeper bench` (`make bench`): every benchmark in one run, JSON and docs/BENCHMARKS.md |
//! | [`bench_cpu`] | per-record CPU against Powertools (Python) and the serde_json floor |
//! | [`bench_deadletter`] | latency and AWS calls each dead-lettered item adds |
//! | [`bench_store`] | `keeper bench-store`: operator reads and redrive throughput at scale |
//! | [`bench_runtime`] | `keeper bench-runtime`: cold start, size, peak RSS, batch concurrency |
//! | [`fault_proxy`] | an HTTP proxy in front of the emulator that injects AWS faults, for reliability tests |
//!
//! The `keeper` binary wires these together for `make demo`; the integration tests use
//! the same pieces.

pub mod bench;
pub mod bench_allin;
pub mod bench_cost;
pub mod bench_cpu;
pub mod bench_deadletter;
pub mod bench_runtime;
pub mod bench_store;
pub mod demo;
pub mod downstream;
pub mod emulator;
pub mod esm;
pub mod fault_proxy;
pub mod function;
pub mod handler_loop;
pub mod handler_new;
pub mod http_server;
pub mod invokers;
pub mod lambda_api;
pub mod outage;
pub mod resources;
pub mod runtime_api;
