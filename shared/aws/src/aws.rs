//! AWS clients, built once per process from the standard AWS configuration chain.
//!
//! The endpoint comes only from configuration: `AWS_ENDPOINT_URL` (or the per-service
//! `AWS_ENDPOINT_URL_SQS`, `_DYNAMODB`, `_S3`) points the same code at a local emulator;
//! unset, the clients talk to AWS. S3 uses path-style addressing when a custom endpoint
//! is configured (emulators do not serve virtual-hosted buckets) or when
//! `S3_FORCE_PATH_STYLE=true`.
//!
//! Tools and tests that name the emulator explicitly use [`Endpoints`]: the local stack
//! serves DynamoDB from AWS's DynamoDB Local and every other service from another
//! emulator, so DynamoDB has an endpoint of its own, set the way the SDK sets
//! `AWS_ENDPOINT_URL_DYNAMODB` (a per-service value that wins over the shared one).

/// The clients the dead-letter store, redrive and CLI use, and Secrets Manager for the
/// downstream credential read at start-up.
#[derive(Debug, Clone)]
pub struct AwsClients {
    /// SQS (source queue and DLQ).
    pub sqs: aws_sdk_sqs::Client,
    /// DynamoDB (dead-letter records).
    pub dynamodb: aws_sdk_dynamodb::Client,
    /// S3 (large payloads).
    pub s3: aws_sdk_s3::Client,
    /// Secrets Manager (`WORKER_DOWNSTREAM_AUTH_SECRET`; `http` feature).
    #[cfg(feature = "secrets")]
    pub secretsmanager: aws_sdk_secretsmanager::Client,
    /// The configuration the clients were built from, for building more alike.
    pub config: aws_config::SdkConfig,
}

impl AwsClients {
    /// Loads the shared configuration (region, credentials, endpoint) and builds the clients.
    pub async fn from_env() -> Self {
        let shared = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        Self::from_config(&shared, s3_path_style_from_env())
    }

    /// Builds clients from an explicit configuration.
    ///
    /// Every client counts its requests into the running worker invocation's metrics
    /// ([`crate::request_meter`]), and the DynamoDB client the capacity units they consumed
    /// ([`crate::capacity_meter`]).
    pub fn from_config(shared: &aws_config::SdkConfig, s3_path_style: bool) -> Self {
        use crate::request_meter::RequestMeter;
        let s3_config = aws_sdk_s3::config::Builder::from(shared)
            .force_path_style(s3_path_style)
            .interceptor(RequestMeter)
            .build();
        AwsClients {
            sqs: aws_sdk_sqs::Client::from_conf(
                aws_sdk_sqs::config::Builder::from(shared)
                    .interceptor(RequestMeter)
                    .build(),
            ),
            dynamodb: aws_sdk_dynamodb::Client::from_conf(
                aws_sdk_dynamodb::config::Builder::from(shared)
                    .interceptor(RequestMeter)
                    .interceptor(crate::capacity_meter::CapacityMeter)
                    .build(),
            ),
            s3: aws_sdk_s3::Client::from_conf(s3_config),
            #[cfg(feature = "secrets")]
            secretsmanager: aws_sdk_secretsmanager::Client::from_conf(
                aws_sdk_secretsmanager::config::Builder::from(shared)
                    .interceptor(RequestMeter)
                    .build(),
            ),
            config: shared.clone(),
        }
    }

    /// Clients for explicit endpoints with static credentials: local emulators and tests.
    pub async fn for_endpoints(endpoints: &Endpoints, region: &str) -> Self {
        Self::from_config(&Self::endpoint_config(endpoints, region).await, true)
    }

    /// Returns the shared configuration for explicit endpoints with static credentials. Every
    /// client built from it (`Client::new`, `config::Builder::from`) takes its service's
    /// endpoint from `endpoints`.
    pub async fn endpoint_config(endpoints: &Endpoints, region: &str) -> aws_config::SdkConfig {
        Self::endpoint_config_as(endpoints, region, "test").await
    }

    /// Returns [`Self::endpoint_config`] signing with the access key id `access_key`
    /// (alphanumeric, as DynamoDB Local requires): a test that tells callers apart by their
    /// key, as an IAM check tells the functions' roles apart.
    pub async fn endpoint_config_as(
        endpoints: &Endpoints,
        region: &str,
        access_key: &str,
    ) -> aws_config::SdkConfig {
        let credentials =
            aws_sdk_sqs::config::Credentials::new(access_key, "test", None, None, "static");
        aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new(region.to_string()))
            .credentials_provider(credentials)
            .load()
            .await
            .into_builder()
            .service_config(endpoints.clone())
            .build()
    }
}

/// Where clients send their requests instead of AWS: the local emulators, or a proxy in
/// front of them. DynamoDB has its own endpoint because the local stack serves it from
/// AWS's DynamoDB Local and the other services from moto (docs/DEVELOPING.md, "The emulators").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    /// Every service but DynamoDB (`AWS_ENDPOINT_URL`).
    pub shared: String,
    /// DynamoDB (`AWS_ENDPOINT_URL_DYNAMODB`).
    pub dynamodb: String,
}

impl Endpoints {
    /// Returns one endpoint for every service, DynamoDB included (a proxy, or an emulator that
    /// serves them all).
    pub fn single(url: &str) -> Self {
        Endpoints {
            shared: url.to_string(),
            dynamodb: url.to_string(),
        }
    }

    /// Returns the environment that points a process's SDK clients here: `AWS_ENDPOINT_URL` and
    /// `AWS_ENDPOINT_URL_DYNAMODB`, which the SDK's configuration chain reads.
    pub fn env(&self) -> [(&'static str, String); 2] {
        [
            ("AWS_ENDPOINT_URL", self.shared.clone()),
            ("AWS_ENDPOINT_URL_DYNAMODB", self.dynamodb.clone()),
        ]
    }

    /// Returns the endpoint of the service the SDK names `service_id` (`DynamoDB`, `SQS`, `S3`...).
    pub fn for_service(&self, service_id: &str) -> &str {
        if service_id == "DynamoDB" {
            &self.dynamodb
        } else {
            &self.shared
        }
    }
}

/// Each SDK client asks its configuration for `AWS_ENDPOINT_URL` under its own service id
/// when it is built from an [`aws_config::SdkConfig`]; this answers with the service's
/// endpoint, and nothing for any other setting.
impl aws_types::service_config::LoadServiceConfig for Endpoints {
    fn load_config(&self, key: aws_types::service_config::ServiceConfigKey<'_>) -> Option<String> {
        (key.env() == "AWS_ENDPOINT_URL").then(|| self.for_service(key.service_id()).to_string())
    }
}

/// Tells whether to use path-style S3: when asked for (`S3_FORCE_PATH_STYLE=true`), or when
/// a custom endpoint for S3 is configured in the environment (`AWS_ENDPOINT_URL`,
/// `AWS_ENDPOINT_URL_S3`).
pub fn s3_path_style_from_env() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    std::env::var("S3_FORCE_PATH_STYLE").is_ok_and(|v| v == "true")
        || set("AWS_ENDPOINT_URL")
        || set("AWS_ENDPOINT_URL_S3")
}

/// Counts the AWS API calls a set of clients makes, by service and operation (each
/// transmitted attempt counts, retries included). For benchmarks and cost estimates.
#[derive(Debug, Clone, Default)]
pub struct CallCounter {
    calls: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, u64>>>,
    latency:
        std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, std::time::Duration>>>,
}

/// When the current attempt was sent (kept in the request's config bag).
#[derive(Debug, Clone)]
struct SentAt(std::time::Instant);

impl aws_smithy_types::config_bag::Storable for SentAt {
    type Storer = aws_smithy_types::config_bag::StoreReplace<Self>;
}

fn operation_name(cfg: &aws_smithy_types::config_bag::ConfigBag) -> String {
    cfg.load::<aws_smithy_runtime_api::client::orchestrator::Metadata>()
        .map_or_else(
            || "unknown".to_string(),
            |m| format!("{}.{}", m.service(), m.name()),
        )
}

impl CallCounter {
    /// Calls so far, as `Service.Operation` → count.
    pub fn snapshot(&self) -> std::collections::BTreeMap<String, u64> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// Counts all calls so far.
    pub fn total(&self) -> u64 {
        self.snapshot().values().sum()
    }

    /// Returns the time spent waiting for responses, by operation (sum over calls, so
    /// overlapping calls count in full).
    pub fn latency(&self) -> std::collections::BTreeMap<String, std::time::Duration> {
        self.latency.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// Forgets the counts.
    pub fn reset(&self) {
        if let Ok(mut c) = self.calls.lock() {
            c.clear();
        }
        if let Ok(mut l) = self.latency.lock() {
            l.clear();
        }
    }
}

impl aws_smithy_runtime_api::client::interceptors::Intercept for CallCounter {
    fn name(&self) -> &'static str {
        "CallCounter"
    }

    fn read_before_transmit(
        &self,
        _context: &aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        let name = operation_name(cfg);
        if let Ok(mut calls) = self.calls.lock() {
            *calls.entry(name).or_default() += 1;
        }
        cfg.interceptor_state()
            .store_put(SentAt(std::time::Instant::now()));
        Ok(())
    }

    fn read_after_transmit(
        &self,
        _context: &aws_smithy_runtime_api::client::interceptors::context::BeforeDeserializationInterceptorContextRef<'_>,
        _runtime_components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        if let Some(sent) = cfg.load::<SentAt>() {
            let elapsed = sent.0.elapsed();
            if let Ok(mut latency) = self.latency.lock() {
                *latency.entry(operation_name(cfg)).or_default() += elapsed;
            }
        }
        Ok(())
    }
}

impl AwsClients {
    /// Clients whose calls are counted by `counter`.
    pub fn counted(
        shared: &aws_config::SdkConfig,
        s3_path_style: bool,
        counter: &CallCounter,
    ) -> Self {
        AwsClients {
            sqs: aws_sdk_sqs::Client::from_conf(
                aws_sdk_sqs::config::Builder::from(shared)
                    .interceptor(counter.clone())
                    .build(),
            ),
            dynamodb: aws_sdk_dynamodb::Client::from_conf(
                aws_sdk_dynamodb::config::Builder::from(shared)
                    .interceptor(counter.clone())
                    .build(),
            ),
            s3: aws_sdk_s3::Client::from_conf(
                aws_sdk_s3::config::Builder::from(shared)
                    .force_path_style(s3_path_style)
                    .interceptor(counter.clone())
                    .build(),
            ),
            #[cfg(feature = "secrets")]
            secretsmanager: aws_sdk_secretsmanager::Client::from_conf(
                aws_sdk_secretsmanager::config::Builder::from(shared)
                    .interceptor(counter.clone())
                    .build(),
            ),
            config: shared.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_types::service_config::{LoadServiceConfig, ServiceConfigKey};

    fn key<'a>(service_id: &'a str, env: &'a str) -> ServiceConfigKey<'a> {
        ServiceConfigKey::builder()
            .service_id(service_id)
            .env(env)
            .profile("endpoint_url")
            .build()
            .unwrap()
    }

    #[test]
    fn dynamodb_gets_its_own_endpoint_and_every_other_service_the_shared_one() {
        let endpoints = Endpoints {
            shared: "http://127.0.0.1:1".into(),
            dynamodb: "http://127.0.0.1:2".into(),
        };
        let endpoint = |service| endpoints.load_config(key(service, "AWS_ENDPOINT_URL"));
        assert_eq!(endpoint("DynamoDB").as_deref(), Some("http://127.0.0.1:2"));
        for service in ["SQS", "S3", "Secrets Manager", "CloudFormation", "Lambda"] {
            assert_eq!(endpoint(service).as_deref(), Some("http://127.0.0.1:1"));
        }
        // Only the endpoint: any other per-service setting is left to its default.
        assert_eq!(
            endpoints.load_config(key("DynamoDB", "AWS_MAX_ATTEMPTS")),
            None
        );
        assert_eq!(
            endpoints.env(),
            [
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:1".to_string()),
                (
                    "AWS_ENDPOINT_URL_DYNAMODB",
                    "http://127.0.0.1:2".to_string()
                ),
            ]
        );
        assert_eq!(
            Endpoints::single("http://x").for_service("DynamoDB"),
            "http://x"
        );
    }
}
