//! Fault rules and call counters: which operations a rule selects ([`Matcher`]), what it
//! does to them ([`Fault`]), when it fires ([`Trigger`]), and [`Faults`], which records
//! every call and decides, per call, the fault to inject.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::operation::{Operation, Service};

/// Which operations a rule applies to: one action of a service, or all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matcher {
    /// The service.
    pub service: Service,
    /// The action; `None` matches every action of the service.
    pub action: Option<String>,
}

impl Matcher {
    /// Every operation of `service`.
    pub fn any(service: Service) -> Self {
        Matcher {
            service,
            action: None,
        }
    }

    /// Exactly `operation`.
    pub fn operation(operation: &Operation) -> Self {
        Matcher {
            service: operation.service,
            action: Some(operation.action.clone()),
        }
    }

    /// Whether `operation` is one this matcher selects.
    pub fn matches(&self, operation: &Operation) -> bool {
        self.service == operation.service
            && self
                .action
                .as_ref()
                .is_none_or(|action| *action == operation.action)
    }
}

impl From<Operation> for Matcher {
    fn from(operation: Operation) -> Self {
        Matcher {
            service: operation.service,
            action: Some(operation.action),
        }
    }
}

impl From<&Operation> for Matcher {
    fn from(operation: &Operation) -> Self {
        Matcher::operation(operation)
    }
}

impl From<Service> for Matcher {
    fn from(service: Service) -> Self {
        Matcher::any(service)
    }
}

/// What happens to a call a rule fires on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// HTTP 503 with the service's error body: `ServiceUnavailable` for SQS and DynamoDB
    /// (JSON), `<Code>ServiceUnavailable</Code>` for S3 (XML). Not forwarded.
    ServiceUnavailable,
    /// The service's throttling error: DynamoDB HTTP 400
    /// `ProvisionedThroughputExceededException`, SQS HTTP 400 `RequestThrottled`, S3 HTTP
    /// 503 `SlowDown`. All three are on the SDK's list of throttling codes. Not forwarded.
    Throttling,
    /// HTTP 500: SQS `InternalFailure`, DynamoDB `InternalServerError`, S3 `InternalError`.
    /// Not forwarded.
    InternalError,
    /// Reads the request, then closes the connection with a TCP reset and no response:
    /// the client sees "connection reset" while waiting for the answer. Not forwarded.
    ConnectionReset,
    /// Holds the request this long, then forwards it. The upstream still executes it even
    /// if the client has given up meanwhile, as a slow server would.
    Delay(Duration),
}

/// When a matching rule fires.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trigger {
    /// On every matching call.
    Always,
    /// On the next `n` matching calls (HTTP attempts), then never again.
    NextN(u64),
    /// On each matching call with probability `fraction`, drawn from a random generator
    /// seeded with `seed`: the same sequence of calls gives the same faults on every run.
    Fraction {
        /// Probability of a fault per call, 0.0 to 1.0.
        fraction: f64,
        /// Seed of the rule's own generator.
        seed: u64,
    },
}

/// A fault to inject into the calls a [`Matcher`] selects, when its [`Trigger`] fires.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Which operations.
    pub matcher: Matcher,
    /// What happens to them.
    pub fault: Fault,
    /// When.
    pub trigger: Trigger,
}

impl Rule {
    /// A rule; `matcher` may be an [`Operation`], a [`Service`] (all its actions) or a
    /// [`Matcher`].
    pub fn new(matcher: impl Into<Matcher>, fault: Fault, trigger: Trigger) -> Self {
        Rule {
            matcher: matcher.into(),
            fault,
            trigger,
        }
    }
}

/// A rule with its progress: calls left for `NextN`, generator state for `Fraction`.
#[derive(Debug)]
struct ActiveRule {
    rule: Rule,
    remaining: u64,
    rng: fastrand::Rng,
}

impl ActiveRule {
    fn new(rule: Rule) -> Self {
        let (remaining, seed) = match rule.trigger {
            Trigger::NextN(n) => (n, 0),
            Trigger::Fraction { seed, .. } => (0, seed),
            Trigger::Always => (0, 0),
        };
        ActiveRule {
            rule,
            remaining,
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// Whether the rule fires on `operation`; advances its state when it matches.
    fn fires(&mut self, operation: &Operation) -> bool {
        if !self.rule.matcher.matches(operation) {
            return false;
        }
        match self.rule.trigger {
            Trigger::Always => true,
            Trigger::NextN(_) => {
                if self.remaining > 0 {
                    self.remaining -= 1;
                    true
                } else {
                    false
                }
            }
            // One draw per matching call, fired or not, so the n-th call's fate depends
            // only on the seed and n. NaN never fires; above 1.0 always does.
            Trigger::Fraction { fraction, .. } => self.rng.f64() < fraction,
        }
    }
}

#[derive(Debug, Default)]
struct FaultState {
    rules: Vec<ActiveRule>,
    calls: BTreeMap<Operation, u64>,
    injected: BTreeMap<Operation, u64>,
}

/// The rules and counters of a proxy: decides, per call, whether and how it fails.
///
/// Cloning gives another handle on the same state. Usable without a proxy, e.g. to check
/// what a seeded [`Trigger::Fraction`] will do.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    state: Arc<Mutex<FaultState>>,
}

impl Faults {
    /// No rules, no calls.
    pub fn new() -> Self {
        Faults::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FaultState> {
        // A panic while holding the lock cannot leave the counters inconsistent in a way
        // that matters to a test; keep going rather than poison every later call.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a rule after the existing ones.
    pub fn inject(&self, rule: Rule) {
        self.lock().rules.push(ActiveRule::new(rule));
    }

    /// Removes every rule (counters are kept).
    pub fn clear(&self) {
        self.lock().rules.clear();
    }

    /// Forgets the counters (rules are kept).
    pub fn reset_counters(&self) {
        let mut state = self.lock();
        state.calls.clear();
        state.injected.clear();
    }

    /// Records a call of `operation` and returns the fault to inject, if any: the first
    /// rule, in injection order, that matches and fires. A rule that matches but does not
    /// fire (an exhausted `NextN`, a `Fraction` draw that passes) lets later rules decide.
    pub fn decide(&self, operation: &Operation) -> Option<Fault> {
        let mut state = self.lock();
        *state.calls.entry(operation.clone()).or_default() += 1;
        let fault = state
            .rules
            .iter_mut()
            .find_map(|rule| rule.fires(operation).then_some(rule.rule.fault));
        if fault.is_some() {
            *state.injected.entry(operation.clone()).or_default() += 1;
        }
        fault
    }

    /// Calls seen (forwarded or failed) of the operations `matcher` selects.
    pub fn calls(&self, matcher: impl Into<Matcher>) -> u64 {
        let matcher = matcher.into();
        sum_matching(&self.lock().calls, &matcher)
    }

    /// Faults injected into the operations `matcher` selects.
    pub fn injected_for(&self, matcher: impl Into<Matcher>) -> u64 {
        let matcher = matcher.into();
        sum_matching(&self.lock().injected, &matcher)
    }

    /// Calls seen per operation, keyed `service:Action`.
    pub fn calls_by_operation(&self) -> BTreeMap<String, u64> {
        by_key(&self.lock().calls)
    }

    /// Faults injected per operation, keyed `service:Action` (e.g. `dynamodb:UpdateItem`).
    pub fn injected(&self) -> BTreeMap<String, u64> {
        by_key(&self.lock().injected)
    }
}

fn sum_matching(counts: &BTreeMap<Operation, u64>, matcher: &Matcher) -> u64 {
    counts
        .iter()
        .filter(|(operation, _)| matcher.matches(operation))
        .map(|(_, n)| n)
        .sum()
}

fn by_key(counts: &BTreeMap<Operation, u64>) -> BTreeMap<String, u64> {
    counts.iter().map(|(op, n)| (op.key(), *n)).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn next_n_then_pass_and_first_firing_rule_wins() {
        let faults = Faults::new();
        let put = Operation::dynamodb("PutItem");
        faults.inject(Rule::new(&put, Fault::Throttling, Trigger::NextN(2)));
        faults.inject(Rule::new(
            Service::DynamoDb,
            Fault::InternalError,
            Trigger::NextN(1),
        ));
        let seen: Vec<_> = (0..4).map(|_| faults.decide(&put)).collect();
        assert_eq!(
            seen,
            vec![
                Some(Fault::Throttling),
                Some(Fault::Throttling),
                Some(Fault::InternalError),
                None
            ]
        );
        assert_eq!(faults.calls(&put), 4);
        assert_eq!(faults.injected_for(&put), 3);
        assert_eq!(faults.decide(&Operation::dynamodb("GetItem")), None);
        assert_eq!(faults.calls(Service::DynamoDb), 5);
        faults.clear();
        assert_eq!(faults.decide(&put), None);
        assert_eq!(faults.injected()["dynamodb:PutItem"], 3);
    }

    #[test]
    fn matcher_selects_service_or_action() {
        let any_s3 = Matcher::any(Service::S3);
        assert!(any_s3.matches(&Operation::s3("PutObject")));
        assert!(!any_s3.matches(&Operation::sqs("PutObject")));
        let put = Matcher::from(Operation::s3("PutObject"));
        assert!(put.matches(&Operation::s3("PutObject")));
        assert!(!put.matches(&Operation::s3("GetObject")));
    }
}
