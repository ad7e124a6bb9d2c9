//! The shipped worker's configuration (`WorkerConfig`, `http` feature): the handler's and its
//! downstream's (URL, timeout, content type, the credential's header and secret).

use super::*;

/// Where the downstream credential comes from: a header name and the Secrets Manager
/// secret holding its value (read at start-up by the `http` feature's secrets adapter).
#[cfg(feature = "http")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownstreamAuth {
    /// The header, e.g. `authorization` or `x-api-key`.
    pub header: reqwest::header::HeaderName,
    /// The secret's id or ARN.
    pub secret_id: String,
}

/// Headers `HttpDelivery` sets itself; a credential may not replace them.
#[cfg(feature = "http")]
const RESERVED_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "host",
    "transfer-encoding",
    "idempotency-key",
    "x-item-id",
    "x-sqs-message-id",
];

/// `WORKER_DOWNSTREAM_AUTH_HEADER` and `WORKER_DOWNSTREAM_AUTH_SECRET`: both or neither.
#[cfg(feature = "http")]
fn read_downstream_auth(env: &mut EnvReader<'_>) -> Option<DownstreamAuth> {
    let header: Option<String> = env.optional(&DOWNSTREAM_AUTH_HEADER);
    let secret_id: Option<String> = env.optional(&DOWNSTREAM_AUTH_SECRET);
    let header = header.and_then(|name| {
        match reqwest::header::HeaderName::from_bytes(name.as_bytes()) {
            Ok(h) if RESERVED_HEADERS.contains(&h.as_str()) => {
                env.problem(
DOWNSTREAM_AUTH_HEADER.name,
                    format!("{name:?} is a header the worker sets itself; expected another name, e.g. Authorization or x-api-key"),
                );
                None
            }
            Ok(h) => Some(h),
            Err(_) => {
                env.problem(
DOWNSTREAM_AUTH_HEADER.name,
                    format!("{name:?} is not an HTTP header name; expected e.g. Authorization or x-api-key"),
                );
                None
            }
        }
    });
    let together = format!("{DOWNSTREAM_AUTH_HEADER} and {DOWNSTREAM_AUTH_SECRET} go together");
    match (
        header,
        secret_id,
        env.raw(&DOWNSTREAM_AUTH_HEADER).is_some(),
    ) {
        (Some(header), Some(secret_id), _) => Some(DownstreamAuth { header, secret_id }),
        (None, Some(_), false) => {
            env.problem(
                DOWNSTREAM_AUTH_HEADER.name,
                format!("is not set; {together}"),
            );
            None
        }
        (Some(_), None, _) => {
            env.problem(
                DOWNSTREAM_AUTH_SECRET.name,
                format!("is not set; {together}"),
            );
            None
        }
        _ => None,
    }
}

/// Everything the worker function needs: the handler's configuration and the downstream
/// it delivers to.
#[cfg(feature = "http")]
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The HTTP delivery processor. Its credential header, if any, is filled in by
    /// [`WorkerConfig::resolve_downstream_auth`] at start-up.
    pub delivery: HttpDeliveryConfig,
    /// Where the downstream credential comes from, when one is configured.
    pub downstream_auth: Option<DownstreamAuth>,
    /// Everything else.
    pub handler: HandlerConfig,
}

/// `WORKER_DOWNSTREAM_URL`: an http(s) URL without credentials in it. The value is only
/// ever quoted redacted (a query string may hold an API key), and a `user:password@` is
/// refused: credentials belong in a header, from Secrets Manager.
#[cfg(feature = "http")]
fn read_downstream_url(env: &mut EnvReader<'_>) -> Option<reqwest::Url> {
    let raw: String = env.required(&DOWNSTREAM_URL)?;
    let url = match raw.parse::<reqwest::Url>() {
        Ok(url) => url,
        Err(e) => {
            env.problem(
                DOWNSTREAM_URL.name,
                format!(
                    "{:?} is not valid ({e}); expected an http:// or https:// URL",
                    redact_url_text(&raw)
                ),
            );
            return None;
        }
    };
    if !matches!(url.scheme(), "http" | "https") {
        env.problem(
            DOWNSTREAM_URL.name,
            format!(
                "scheme {:?} is not supported; expected http or https",
                url.scheme()
            ),
        );
        return None;
    }
    if !url.username().is_empty() || url.password().is_some() {
        env.problem(
            DOWNSTREAM_URL.name,
            format!(
                "{:?} carries credentials (user:password@), which end up in logs and \
                 records; send them in a header instead: {DOWNSTREAM_AUTH_HEADER} and \
                 {DOWNSTREAM_AUTH_SECRET}",
                redact_url(&url)
            ),
        );
        return None;
    }
    Some(url)
}

#[cfg(feature = "http")]
impl WorkerConfig {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(&|name| std::env::var(name).ok())
    }

    /// Reads any variable lookup (for tests).
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        EnvReader::read_all(lookup, Self::read)?.ok_or_else(|| ConfigError {
            problems: Vec::new(),
        })
    }

    /// Reads the worker's variables into `env`, noting problems there.
    pub fn read(env: &mut EnvReader<'_>) -> Option<Self> {
        let delivery = Self::read_delivery(env);
        let handler = HandlerConfig::read(env);
        let (delivery, downstream_auth) = delivery?;
        Some(WorkerConfig {
            delivery,
            downstream_auth,
            handler,
        })
    }

    /// Reads the downstream's variables only (URL, timeout, content type, credential).
    pub fn read_delivery(
        env: &mut EnvReader<'_>,
    ) -> Option<(HttpDeliveryConfig, Option<DownstreamAuth>)> {
        let url = read_downstream_url(env);
        let timeout = env.integer(&DOWNSTREAM_TIMEOUT_MS);
        let content_type = env
            .text_or_default::<String>(&DOWNSTREAM_CONTENT_TYPE)
            .unwrap_or_default();
        let downstream_auth = read_downstream_auth(env);
        let mut delivery = HttpDeliveryConfig::new(url?, Duration::from_millis(timeout));
        delivery.content_type = content_type;
        Some((delivery, downstream_auth))
    }

    /// Returns the variables and their descriptions (worker and store), for documentation and
    /// drift checks against the infrastructure template.
    pub fn documented_variables() -> BTreeMap<&'static str, String> {
        WORKER_VARS
            .iter()
            .chain(STORE_VARS)
            .map(|v| (v.name, v.describe()))
            .collect()
    }

    /// Completes the delivery configuration with the downstream credential, when one is
    /// configured: reads the secret once through `clients`.
    pub async fn resolve_downstream_auth(
        &mut self,
        clients: &sqs_keeper_aws::AwsClients,
    ) -> Result<(), sqs_keeper_aws::SecretError> {
        if let Some(auth) = &self.downstream_auth {
            self.delivery.auth_header = Some(
                sqs_keeper_aws::auth_header(
                    &auth.header,
                    &auth.secret_id,
                    DOWNSTREAM_AUTH_SECRET.name,
                    &clients.secretsmanager,
                )
                .await?,
            );
        }
        Ok(())
    }

    /// Makes `delivery` read the downstream credential again from Secrets Manager when the
    /// downstream refuses it (401, 403): a rotated secret (docs/ARCHITECTURE.md §2). Leaves
    /// `delivery` as it is when no credential is configured.
    pub fn renewing_credential(
        &self,
        delivery: sqs_keeper_http::HttpDelivery,
        clients: &sqs_keeper_aws::AwsClients,
    ) -> sqs_keeper_http::HttpDelivery {
        match &self.downstream_auth {
            Some(auth) => delivery.with_credential_source(std::sync::Arc::new(SecretCredential {
                auth: auth.clone(),
                client: clients.secretsmanager.clone(),
            })),
            None => delivery,
        }
    }
}

/// The downstream credential as Secrets Manager holds it now.
#[cfg(feature = "http")]
struct SecretCredential {
    auth: DownstreamAuth,
    client: aws_sdk_secretsmanager::Client,
}

#[cfg(feature = "http")]
impl sqs_keeper_http::CredentialSource for SecretCredential {
    fn read(
        &self,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<reqwest::header::HeaderValue, sqs_keeper_core::ProcessError>,
                > + Send
                + '_,
        >,
    > {
        Box::pin(async move {
            sqs_keeper_aws::auth_header(
                &self.auth.header,
                &self.auth.secret_id,
                DOWNSTREAM_AUTH_SECRET.name,
                &self.client,
            )
            .await
            .map(|(_, value)| value)
            .map_err(|e| {
                sqs_keeper_core::ProcessError::new(
                    sqs_keeper_core::ErrorClass::Permission,
                    e.to_string(),
                )
            })
        })
    }
}
