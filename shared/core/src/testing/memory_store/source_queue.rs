//! [`SourceQueue`] over the world's source queues: the lookups and the batched send a
//! requeue makes (`shared/aws/src/store/source_queue.rs`).

use super::*;

impl<X: Send + 'static> SourceQueue for MemoryStore<X> {
    async fn queue_url(&self, name: &str, account: &str) -> Result<String, ProcessError> {
        self.latency("queue_url").await;
        let mut state = self.world.lock();
        state.injected("queue_url")?;
        if let Some(queue) = state.sources.iter().find(|q| q.is_named(name, account)) {
            return Ok(queue.url.clone());
        }
        if state.opens_queues {
            let queue = Queue::source(name, account);
            let url = queue.url.clone();
            state.sources.push(queue);
            return Ok(url);
        }
        Err(ProcessError::new(
            ErrorClass::NotFound,
            format!("AWS.SimpleQueueService.NonExistentQueue: {name}"),
        ))
    }

    async fn message_retention(&self, queue_url: &str) -> Result<Duration, ProcessError> {
        self.latency("message_retention").await;
        let mut state = self.world.lock();
        state.injected("message_retention")?;
        state
            .source_at(queue_url)
            .map(|queue| queue.retention)
            .ok_or_else(|| ProcessError::new(ErrorClass::NotFound, "no such queue"))
    }

    async fn send_batch(
        &self,
        queue_url: &str,
        messages: &[OutgoingMessage],
    ) -> Result<Vec<SendResult>, ProcessError> {
        self.latency("send_batch").await;
        let mut state = self.world.lock();
        if state.source_at(queue_url).is_none() {
            return Err(ProcessError::new(ErrorClass::NotFound, "no such queue"));
        }
        state.injected("send_batch")?;
        if self.call_fails(&mut state, |f| f.send, "-", "requeue send failed") {
            return Err(unavailable("SQS", "requeue"));
        }
        let now_ms = self.world.now_ms();
        let mut results = Vec::new();
        for m in messages {
            let item = m
                .attributes
                .iter()
                .find(|(n, _)| n == ITEM_ID_ATTRIBUTE)
                .and_then(|(_, v)| v.string_value())
                .unwrap_or("-")
                .to_string();
            if state.refuses(&item) {
                results.push(Err("InvalidParameterValue refused (injected)".to_string()));
                continue;
            }
            if let Some(error) = super::super::queue::refused_contents(&m.body, &m.attributes) {
                let event = Event::ContentsRefused {
                    item: &item,
                    call: "requeue",
                };
                state.observe(&self.actor, &event);
                results.push(Err(error.message));
                continue;
            }
            let Some(queue) = state.source_at(queue_url) else {
                results.push(Err("no such queue".to_string()));
                continue;
            };
            let id = queue.send(
                m.body.clone(),
                m.attributes.clone(),
                m.group_id.clone(),
                now_ms,
            );
            state.sent.push((queue_url.to_string(), m.clone()));
            state.step(
                &self.actor,
                &item,
                &format!("requeued as source message {id}"),
            );
            self.world.arrivals.notify_waiters();
            results.push(Ok(id));
        }
        Ok(results)
    }
}
