//! Creates the pipeline's resources (source queue with redrive policy, DLQ, table,
//! bucket) with the settings the infrastructure template uses, so local runs and tests
//! exercise the same shapes as a deployment.

use std::collections::HashMap;

use aws_sdk_sqs::types::QueueAttributeName;
use sqs_keeper_aws::AwsClients;
use sqs_keeper_aws::{schema, StoreConfig};

/// Names and addresses of one pipeline's resources.
#[derive(Debug, Clone)]
pub struct PipelineResources {
    /// Source queue URL.
    pub source_url: String,
    /// Source queue ARN (the `eventSourceARN` of its events).
    pub source_arn: String,
    /// DLQ URL.
    pub dlq_url: String,
    /// DLQ ARN.
    pub dlq_arn: String,
    /// Dead-letter table.
    pub table: String,
    /// Payload bucket.
    pub bucket: String,
    /// The source queue's `maxReceiveCount`.
    pub max_receive_count: u32,
}

/// How to shape the resources.
#[derive(Debug, Clone)]
pub struct ResourceSpec {
    /// Prefix of every name (lower-case letters, digits, dashes).
    pub prefix: String,
    /// FIFO queues (both, as SQS requires).
    pub fifo: bool,
    /// `maxReceiveCount` of the redrive policy.
    pub max_receive_count: u32,
    /// Source queue visibility timeout in seconds.
    pub visibility_timeout_secs: u32,
}

/// A failed set-up call.
pub type SetupError = String;

fn sdk_error<E: std::error::Error + 'static>(what: &str, e: E) -> SetupError {
    format!(
        "{what}: {}",
        sqs_keeper_lambda::ProcessError::from_error(&e)
    )
}

pub(crate) async fn queue_arn(clients: &AwsClients, url: &str) -> Result<String, SetupError> {
    let attrs = clients
        .sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| sdk_error("get queue ARN", e))?;
    attrs
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn))
        .cloned()
        .ok_or_else(|| format!("queue {url} has no ARN"))
}

pub(crate) async fn create_queue(
    clients: &AwsClients,
    name: &str,
    attributes: HashMap<QueueAttributeName, String>,
) -> Result<String, SetupError> {
    let output = clients
        .sqs
        .create_queue()
        .queue_name(name)
        .set_attributes(Some(attributes))
        .send()
        .await
        .map_err(|e| sdk_error(&format!("create queue {name}"), e))?;
    output
        .queue_url()
        .map(str::to_string)
        .ok_or_else(|| format!("create queue {name}: no URL returned"))
}

impl PipelineResources {
    /// Creates every resource. The DLQ keeps messages for 14 days, longer than the source
    /// (4 days), because a standard DLQ keeps each message's *original* enqueue time.
    pub async fn create(
        clients: &AwsClients,
        spec: &ResourceSpec,
    ) -> Result<PipelineResources, SetupError> {
        let suffix = if spec.fifo { ".fifo" } else { "" };
        let fifo_attrs = |mut attrs: HashMap<QueueAttributeName, String>| {
            if spec.fifo {
                attrs.insert(QueueAttributeName::FifoQueue, "true".into());
                attrs.insert(
                    QueueAttributeName::ContentBasedDeduplication,
                    "false".into(),
                );
            }
            attrs
        };
        let dlq_url = create_queue(
            clients,
            &format!("{}-dlq{suffix}", spec.prefix),
            fifo_attrs(HashMap::from([
                (
                    QueueAttributeName::MessageRetentionPeriod,
                    "1209600".to_string(),
                ),
                (
                    QueueAttributeName::MaximumMessageSize,
                    "1048576".to_string(),
                ),
            ])),
        )
        .await?;
        let dlq_arn = queue_arn(clients, &dlq_url).await?;
        let redrive = serde_json::json!({
            "deadLetterTargetArn": dlq_arn,
            "maxReceiveCount": spec.max_receive_count,
        })
        .to_string();
        let source_url = create_queue(
            clients,
            &format!("{}-source{suffix}", spec.prefix),
            fifo_attrs(HashMap::from([
                (
                    QueueAttributeName::MessageRetentionPeriod,
                    "345600".to_string(),
                ),
                (
                    QueueAttributeName::MaximumMessageSize,
                    "1048576".to_string(),
                ),
                (
                    QueueAttributeName::VisibilityTimeout,
                    spec.visibility_timeout_secs.to_string(),
                ),
                (QueueAttributeName::RedrivePolicy, redrive),
            ])),
        )
        .await?;
        let source_arn = queue_arn(clients, &source_url).await?;
        let table = format!("{}-dead-letters", spec.prefix);
        schema::create_table(&clients.dynamodb, &table)
            .await
            .map_err(|e| format!("create table {table}: {e}"))?;
        let bucket = format!("{}-payloads", spec.prefix);
        clients
            .s3
            .create_bucket()
            .bucket(&bucket)
            .send()
            .await
            .map_err(|e| sdk_error(&format!("create bucket {bucket}"), e))?;
        Ok(PipelineResources {
            source_url,
            source_arn,
            dlq_url,
            dlq_arn,
            table,
            bucket,
            max_receive_count: spec.max_receive_count,
        })
    }

    /// Deletes the resources of a previous run with the same prefix, ignoring what is
    /// not there.
    pub async fn delete_existing(clients: &AwsClients, spec: &ResourceSpec) {
        let suffix = if spec.fifo { ".fifo" } else { "" };
        for name in [
            format!("{}-source{suffix}", spec.prefix),
            format!("{}-dlq{suffix}", spec.prefix),
        ] {
            if let Ok(url) = clients.sqs.get_queue_url().queue_name(&name).send().await {
                if let Some(url) = url.queue_url() {
                    let _ = clients.sqs.delete_queue().queue_url(url).send().await;
                }
            }
        }
        let _ = clients
            .dynamodb
            .delete_table()
            .table_name(format!("{}-dead-letters", spec.prefix))
            .send()
            .await;
        let bucket = format!("{}-payloads", spec.prefix);
        if let Ok(list) = clients.s3.list_objects_v2().bucket(&bucket).send().await {
            for object in list.contents() {
                if let Some(key) = object.key() {
                    let _ = clients
                        .s3
                        .delete_object()
                        .bucket(&bucket)
                        .key(key)
                        .send()
                        .await;
                }
            }
            let _ = clients.s3.delete_bucket().bucket(&bucket).send().await;
        }
    }

    /// The store configuration for these resources.
    pub fn store_config(&self) -> StoreConfig {
        StoreConfig::new(&self.table, &self.dlq_url, &self.bucket)
    }

    /// The environment variables the worker needs for these resources.
    pub fn store_env(&self) -> Vec<(String, String)> {
        vec![
            ("DLQ_TABLE".to_string(), self.table.clone()),
            ("DLQ_QUEUE_URL".to_string(), self.dlq_url.clone()),
            ("DLQ_BUCKET".to_string(), self.bucket.clone()),
            (
                "WORKER_MAX_RECEIVE_COUNT".to_string(),
                self.max_receive_count.to_string(),
            ),
        ]
    }
}
