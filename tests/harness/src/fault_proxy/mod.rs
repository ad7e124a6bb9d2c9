//! A fault-injecting HTTP proxy for reliability tests.
//!
//! Reliability tests need the real AWS SDK clients (their retry strategy, their error
//! parsing, their timeouts) to meet the failures AWS produces: throttling, 5xx, dropped
//! connections, slow answers. The emulator never produces those on its own, and in-process
//! mocks bypass the very code under test. So the proxy sits between the clients and the
//! emulator on loopback:
//!
//! ```text
//! SDK client ──HTTP──▶ FaultProxy (127.0.0.1:PORT) ──HTTP──▶ DynamoDB Local (DynamoDB)
//!                                                  └─HTTP──▶ moto (SQS, S3, the rest)
//! ```
//!
//! One proxy URL serves every service (give clients [`FaultProxy::endpoints`]); each
//! request goes on to its service's upstream.
//!
//! Every request is identified as an [`Operation`] (service and action, e.g.
//! `dynamodb:UpdateItem`), counted, checked against the injected [`Rule`]s, and either
//! forwarded unchanged or answered with a [`Fault`]: an error response in the exact wire
//! format of that service (so the SDK parses it into its typed error and its retry
//! classifier sees the right code), an abortive close of the connection, or a delay.
//!
//! Each HTTP *attempt* is one call: the SDK's standard retry mode makes up to three
//! attempts per operation, so a rule that fails the "next 2" calls is absorbed by the
//! SDK's retries, and one that fails the next 100 makes the operation fail after three.
//!
//! SQS and DynamoDB (JSON protocol) are identified by their `X-Amz-Target` header; S3 is
//! identified by the SigV4 credential scope and its action derived from method, path-style
//! path (`/bucket/key`) and query (see [`Operation::identify`]).
//!
//! The parts, one file each:
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | [`FaultProxy`], the running proxy and its API: start, rules, counters |
//! | `operation.rs` | [`Operation`] and [`Service`]: recognising the AWS operation of a request |
//! | `audit.rs` | [`Access`]: the caller, IAM action and resource of each request, for holding calls to a role |
//! | `meter.rs` | [`Meter`] and [`Bill`]: what the forwarded requests cost in AWS's billing units, when metered |
//! | `rules.rs` | [`Rule`], [`Matcher`], [`Fault`], [`Trigger`] and [`Faults`]: which calls fail, how, and the counters |
//! | `server.rs` | the hyper server: accepting connections, applying the decided fault, forwarding upstream |
//! | `wire.rs` | the error responses, in each service's wire format (JSON protocol, S3 XML) |
//!
//! ```no_run
//! # async fn demo(emulator: &sqs_keeper_aws::Endpoints) -> std::io::Result<()> {
//! use sqs_keeper_local::fault_proxy::{Fault, FaultProxy, Operation, Rule, Trigger};
//!
//! let proxy = FaultProxy::start(emulator).await?;
//! proxy.inject(Rule::new(
//!     Operation::dynamodb("UpdateItem"),
//!     Fault::Throttling,
//!     Trigger::NextN(2),
//! ));
//! let clients = sqs_keeper_aws::AwsClients::for_endpoints(&proxy.endpoints(), "us-east-1").await;
//! // ... the first two UpdateItem attempts are throttled, the SDK's third attempt passes.
//! # Ok(()) }
//! ```

mod audit;
mod meter;
mod operation;
mod rules;
mod server;
mod wire;

use std::collections::BTreeMap;
use std::net::SocketAddr;

use sqs_keeper_aws::Endpoints;
use tokio::task::JoinHandle;

pub use audit::{percent_decoded, Access, AuditLog, Target};
pub use meter::{sqs_chunks, Bill, Meter, SQS_CHUNK_BYTES};
pub use operation::{s3_action, Operation, Service, UNKNOWN_ACTION};
pub use rules::{Fault, Faults, Matcher, Rule, Trigger};

/// A running proxy on `127.0.0.1`; stops (with every open connection) when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    faults: Faults,
    audit: AuditLog,
    meter: Meter,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Binds `127.0.0.1:0` and forwards each request to its service's endpoint in
    /// `upstreams` (`http://host:port` URLs, e.g. the emulators') until dropped. Must be
    /// called inside a tokio runtime.
    pub async fn start(upstreams: &Endpoints) -> std::io::Result<FaultProxy> {
        Self::start_with(upstreams, Meter::default()).await
    }

    /// [`FaultProxy::start`], with a meter that bills every request it forwards
    /// ([`FaultProxy::bill`]). DynamoDB requests go on asking for their consumed capacity.
    pub async fn start_metered(upstreams: &Endpoints) -> std::io::Result<FaultProxy> {
        Self::start_with(upstreams, Meter::on()).await
    }

    async fn start_with(upstreams: &Endpoints, meter: Meter) -> std::io::Result<FaultProxy> {
        let faults = Faults::new();
        let audit = AuditLog::default();
        let (addr, task) =
            server::spawn(upstreams, faults.clone(), audit.clone(), meter.clone()).await?;
        Ok(FaultProxy {
            addr,
            faults,
            audit,
            meter,
            task,
        })
    }

    /// The proxy's URL, `http://127.0.0.1:PORT`: the endpoint to give the SDK clients.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The proxy as every service's endpoint, DynamoDB's included.
    pub fn endpoints(&self) -> Endpoints {
        Endpoints::single(&self.url())
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The rules and counters; clone it to hand another task a handle on the same state.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Adds a rule after the existing ones (see [`Faults::decide`] for the order).
    pub fn inject(&self, rule: Rule) {
        self.faults.inject(rule);
    }

    /// Removes every rule; calls pass through again. Counters are kept.
    pub fn clear(&self) {
        self.faults.clear();
    }

    /// Every IAM authorisation the requests so far would need (caller, action, resource),
    /// in order: what a test holds to the roles of the template.
    pub fn accesses(&self) -> Vec<Access> {
        self.audit.accesses()
    }

    /// What the requests forwarded so far cost in AWS's billing units (empty unless
    /// started metered).
    pub fn bill(&self) -> Bill {
        self.meter.bill()
    }

    /// Starts a new bill.
    pub fn reset_bill(&self) {
        self.meter.reset();
    }

    /// Forgets the counters.
    pub fn reset_counters(&self) {
        self.faults.reset_counters();
    }

    /// Calls seen (forwarded or failed, each HTTP attempt counts) of the operations
    /// `matcher` selects: pass an `&Operation`, an `Operation`, a `Service` or a `Matcher`.
    pub fn calls(&self, matcher: impl Into<Matcher>) -> u64 {
        self.faults.calls(matcher)
    }

    /// Calls seen per operation, keyed `service:Action`.
    pub fn calls_by_operation(&self) -> BTreeMap<String, u64> {
        self.faults.calls_by_operation()
    }

    /// Faults injected per operation, keyed `service:Action` (e.g. `dynamodb:UpdateItem`).
    pub fn injected(&self) -> BTreeMap<String, u64> {
        self.faults.injected()
    }

    /// Faults injected into the operations `matcher` selects.
    pub fn injected_for(&self, matcher: impl Into<Matcher>) -> u64 {
        self.faults.injected_for(matcher)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The connection tasks live in the accept task's JoinSet: aborting it drops the
        // set, which aborts them, so no held (delayed) request outlives the proxy.
        self.task.abort();
    }
}
