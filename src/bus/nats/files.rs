//! Files every replica reads, in a JetStream object store bucket
//! ([`crate::store::SharedFiles`]).
//!
//! The files have a NATS connection of their own: a 100 MB snapshot moving
//! in 128 KiB chunks would otherwise queue ahead of the bus's messages on
//! the bus's connection.

use async_nats::jetstream::{self, object_store};
use async_trait::async_trait;

use crate::store::{FileReader, SharedFiles, StoreError};

/// A JetStream object store bucket.
pub struct NatsFiles {
    bucket: object_store::ObjectStore,
    name: String,
}

impl NatsFiles {
    /// Connects to `url` and opens the bucket `name`, made when absent.
    pub async fn connect(url: &str, name: &str) -> Result<NatsFiles, StoreError> {
        let client = async_nats::ConnectOptions::new()
            .name("conclave files")
            .connect(url)
            .await
            .map_err(|e| StoreError::Unavailable(format!("NATS at {url}: {e}")))?;
        let jetstream = jetstream::new(client);
        let bucket = match jetstream.get_object_store(name).await {
            Ok(bucket) => bucket,
            Err(_) => jetstream
                .create_object_store(object_store::Config {
                    bucket: name.to_owned(),
                    description: Some("Conclave's workspace snapshots".to_owned()),
                    ..Default::default()
                })
                .await
                .map_err(|e| {
                    StoreError::Unavailable(format!("the NATS object store {name}: {e}"))
                })?,
        };
        Ok(NatsFiles {
            bucket,
            name: name.to_owned(),
        })
    }

    fn failed(&self, what: &str, file: &str, e: impl std::fmt::Display) -> StoreError {
        StoreError::Unavailable(format!(
            "{what} {file} in the NATS object store {}: {e}",
            self.name
        ))
    }
}

#[async_trait]
impl SharedFiles for NatsFiles {
    async fn put(&self, name: &str, mut data: FileReader) -> Result<u64, StoreError> {
        let info = self
            .bucket
            .put(name, &mut data)
            .await
            .map_err(|e| self.failed("storing", name, e))?;
        Ok(info.size as u64)
    }

    async fn get(&self, name: &str) -> Result<Option<FileReader>, StoreError> {
        match self.bucket.info(name).await {
            Ok(info) if info.deleted => return Ok(None),
            Ok(_) => {}
            Err(e) if e.kind() == object_store::InfoErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.failed("looking up", name, e)),
        }
        match self.bucket.get(name).await {
            Ok(object) => Ok(Some(Box::new(object))),
            Err(e) if e.kind() == object_store::GetErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.failed("reading", name, e)),
        }
    }

    async fn delete(&self, name: &str) -> Result<(), StoreError> {
        match self.bucket.delete(name).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == object_store::DeleteErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.failed("deleting", name, e)),
        }
    }

    fn place(&self) -> String {
        format!("the NATS object store {}", self.name)
    }
}
