//! [`VisibilityPort`] over SQS: `ChangeMessageVisibilityBatch`, ten entries a call, on the
//! queue each record came from (its URL found once per queue with `GetQueueUrl` and kept
//! for the sandbox's life), and the queue's retention and visibility timeout
//! (`GetQueueAttributes`, which the engine asks once per queue).

use std::collections::HashMap;
use std::sync::Mutex;

use aws_sdk_sqs::types::ChangeMessageVisibilityBatchRequestEntry;
use futures::future::BoxFuture;

use sqs_keeper_core::{redelivery::Hide, redelivery::QueueTiming, redelivery::VisibilityPort};
use sqs_keeper_core::{ErrorClass, ProcessError};

/// Entries per `ChangeMessageVisibilityBatch` call (the API's limit).
const BATCH: usize = 10;

/// Changes visibility through the SQS client.
#[derive(Debug)]
pub struct SqsVisibility {
    sqs: aws_sdk_sqs::Client,
    urls: Mutex<HashMap<String, String>>,
}

impl SqsVisibility {
    /// Creates one over `sqs`.
    pub fn new(sqs: aws_sdk_sqs::Client) -> Self {
        SqsVisibility {
            sqs,
            urls: Mutex::new(HashMap::new()),
        }
    }

    async fn url(&self, arn: &str) -> Result<String, ProcessError> {
        if let Some(url) = self.urls.lock().ok().and_then(|u| u.get(arn).cloned()) {
            return Ok(url);
        }
        let (account, name) = sqs_keeper_core::message::queue_of_arn(arn).ok_or_else(|| {
            ProcessError::validation(format!("{arn:?} is not an SQS queue ARN"))
                .with_step("redelivery")
        })?;
        let url = self
            .sqs
            .get_queue_url()
            .queue_name(name)
            .queue_owner_aws_account_id(account)
            .send()
            .await
            .map_err(|e| ProcessError::from_sdk(&e).with_step("redelivery"))?
            .queue_url()
            .unwrap_or_default()
            .to_string();
        if let Ok(mut urls) = self.urls.lock() {
            urls.insert(arn.to_string(), url.clone());
        }
        Ok(url)
    }

    async fn hide_on(
        &self,
        arn: &str,
        records: &[(usize, &Hide)],
    ) -> Vec<(usize, Result<(), ProcessError>)> {
        let url = match self.url(arn).await {
            Ok(url) => url,
            Err(e) => return records.iter().map(|(i, _)| (*i, Err(e.clone()))).collect(),
        };
        let mut results = Vec::with_capacity(records.len());
        for chunk in records.chunks(BATCH) {
            let entries: Vec<_> = chunk
                .iter()
                .filter_map(|(i, hide)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(&hide.receipt_handle)
                        .visibility_timeout(whole_seconds(hide.delay))
                        .build()
                        .ok()
                })
                .collect();
            let sent = self
                .sqs
                .change_message_visibility_batch()
                .queue_url(&url)
                .set_entries(Some(entries))
                .send()
                .await;
            match sent {
                Ok(output) => {
                    let failed: HashMap<&str, String> = output
                        .failed()
                        .iter()
                        .map(|f| {
                            (
                                f.id(),
                                format!("{}: {}", f.code(), f.message().unwrap_or_default()),
                            )
                        })
                        .collect();
                    for (i, _) in chunk {
                        let id = i.to_string();
                        results.push((
                            *i,
                            match failed.get(id.as_str()) {
                                None => Ok(()),
                                Some(why) => {
                                    Err(ProcessError::new(ErrorClass::Unknown, why.clone())
                                        .with_step("redelivery"))
                                }
                            },
                        ));
                    }
                }
                Err(e) => {
                    let error = ProcessError::from_sdk(&e).with_step("redelivery");
                    results.extend(chunk.iter().map(|(i, _)| (*i, Err(error.clone()))));
                }
            }
        }
        results
    }
}

/// SQS takes whole seconds: a delay is rounded up (a 0.6 s delay hides for 1 s, not 0).
fn whole_seconds(delay: std::time::Duration) -> i32 {
    let seconds = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
    i32::try_from(seconds).unwrap_or(i32::MAX)
}

impl VisibilityPort for SqsVisibility {
    fn hide<'a>(&'a self, records: &'a [Hide]) -> BoxFuture<'a, Vec<Result<(), ProcessError>>> {
        Box::pin(async move {
            let mut by_queue: Vec<(&str, Vec<(usize, &Hide)>)> = Vec::new();
            for (i, hide) in records.iter().enumerate() {
                match by_queue.iter_mut().find(|(arn, _)| *arn == hide.queue_arn) {
                    Some((_, list)) => list.push((i, hide)),
                    None => by_queue.push((&hide.queue_arn, vec![(i, hide)])),
                }
            }
            let mut results: Vec<Result<(), ProcessError>> =
                records.iter().map(|_| Ok(())).collect();
            for (arn, list) in by_queue {
                for (i, result) in self.hide_on(arn, &list).await {
                    if let Some(slot) = results.get_mut(i) {
                        *slot = result;
                    }
                }
            }
            results
        })
    }

    fn queue_timing<'a>(&'a self, queue_arn: &'a str) -> BoxFuture<'a, Option<QueueTiming>> {
        Box::pin(async move {
            use aws_sdk_sqs::types::QueueAttributeName;
            let url = self.url(queue_arn).await.ok()?;
            let read = self
                .sqs
                .get_queue_attributes()
                .queue_url(url)
                .attribute_names(QueueAttributeName::MessageRetentionPeriod)
                .attribute_names(QueueAttributeName::VisibilityTimeout)
                .send()
                .await;
            let attributes = match read {
                Ok(output) => output.attributes,
                Err(e) => {
                    let error = ProcessError::from_sdk(&e);
                    tracing::warn!(%error, "could not read the source queue's attributes");
                    return None;
                }
            }?;
            let seconds = |name: QueueAttributeName| {
                attributes
                    .get(&name)
                    .and_then(|v| v.parse::<u64>().ok())
                    .map(std::time::Duration::from_secs)
            };
            Some(QueueTiming {
                retention: seconds(QueueAttributeName::MessageRetentionPeriod)?,
                visibility_timeout: seconds(QueueAttributeName::VisibilityTimeout)?,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn delays_round_up_to_whole_seconds() {
        assert_eq!(whole_seconds(Duration::from_millis(600)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(2)), 2);
        assert_eq!(whole_seconds(Duration::from_millis(2001)), 3);
        assert_eq!(whole_seconds(Duration::ZERO), 0);
        assert_eq!(whole_seconds(Duration::from_secs(u64::MAX)), i32::MAX);
    }
}
