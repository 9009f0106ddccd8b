//! Files every replica reads: large values kept whole under a name
//! (workspace snapshots), beside the records in the store that name them.
//!
//! A server on its own keeps such files in its data directory and needs
//! none of this; among replicas they go where all of them read: NATS
//! JetStream's object store when the bus is NATS (the bus's `NatsFiles`).

use async_trait::async_trait;
use tokio::io::AsyncRead;

use super::StoreError;

/// A file's contents, read as they arrive.
pub type FileReader = Box<dyn AsyncRead + Send + Unpin>;

#[async_trait]
pub trait SharedFiles: Send + Sync {
    /// Stores what `data` reads under `name`, replacing any file of that
    /// name; the bytes stored.
    async fn put(&self, name: &str, data: FileReader) -> Result<u64, StoreError>;

    /// The file `name`, to be read; `None` when there is none.
    async fn get(&self, name: &str) -> Result<Option<FileReader>, StoreError>;

    /// Deletes the file `name`; one that is not there is no error.
    async fn delete(&self, name: &str) -> Result<(), StoreError>;

    /// Where the files are, for messages ("NATS object store …").
    fn place(&self) -> String;
}
