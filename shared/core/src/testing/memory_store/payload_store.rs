//! [`PayloadStore`] over the world's bucket: fetch, put and delete, as the S3 adapter
//! makes them (`shared/aws/src/store/payload.rs`).

use super::*;

impl<X: Send + 'static> PayloadStore for MemoryStore<X> {
    async fn fetch(&self, pointer: &S3Pointer) -> Result<String, ProcessError> {
        self.latency("fetch").await;
        let mut state = self.world.lock();
        state.injected("fetch")?;
        if self.call_fails(
            &mut state,
            |f| f.bucket,
            "-",
            "fetch-payload: S3 unavailable",
        ) {
            return Err(unavailable("S3", "fetch-payload"));
        }
        state
            .bucket
            .get(&(pointer.bucket.clone(), pointer.key.clone()))
            .cloned()
            .ok_or_else(|| {
                ProcessError::new(
                    ErrorClass::NotFound,
                    format!("s3://{}/{} does not exist", pointer.bucket, pointer.key),
                )
                .with_step("fetch-payload")
            })
    }

    async fn put(
        &self,
        pointer: &S3Pointer,
        body: &str,
        _sha256: &str,
    ) -> Result<(), ProcessError> {
        self.latency("put").await;
        let mut state = self.world.lock();
        state.injected("put")?;
        if self.call_fails(&mut state, |f| f.bucket, "-", "put-payload: S3 unavailable") {
            return Err(unavailable("S3", "put-payload"));
        }
        state.bucket.insert(
            (pointer.bucket.clone(), pointer.key.clone()),
            body.to_string(),
        );
        Ok(())
    }

    async fn delete(&self, pointer: &S3Pointer) -> Result<(), ProcessError> {
        self.latency("delete").await;
        let mut state = self.world.lock();
        state.injected("delete")?;
        if self.call_fails(
            &mut state,
            |f| f.bucket,
            "-",
            "delete-payload: S3 unavailable",
        ) {
            return Err(unavailable("S3", "delete-payload"));
        }
        if let Some(body) = state
            .bucket
            .remove(&(pointer.bucket.clone(), pointer.key.clone()))
        {
            state.observe(
                &self.actor,
                &Event::PayloadDeleted {
                    key: &pointer.key,
                    body: &body,
                },
            );
            state.step(
                &self.actor,
                "-",
                &format!("deleted payload object {}", pointer.key),
            );
        }
        Ok(())
    }
}
