//! `storage_mb`: the bytes a key keeps on the bus (durable subjects), in
//! its KV, in its sessions' event logs, in named workspace snapshots and
//! in deliberation records, bounded before a write (or a turn) is taken.
//!
//! What a key keeps is measured where it lives: the store sums the key's
//! KV values and the embedded bus's kept messages; NATS JetStream tells
//! each durable stream's message count for each of the key's subjects,
//! taken at the size of that subject's last message (only the key's own
//! messages are read). Retention, deletes and overwrites free
//! room by themselves, with no counter to drift.
//!
//! Measuring costs a query, so a replica reuses its last measure for up to
//! [`FRESH`], adding the bytes it accepted since; once a write would take
//! the key past [`NEAR`] of its quota every write measures again. Between
//! two replicas, a key can pass its quota by at most what the others
//! accepted in the last [`FRESH`] while it was far from it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;

use super::retention::Retentions;
use super::{Bus, BusConfig, BusError, Delivery, Pattern, Since, Subject};
use crate::quota::{KeyTable, QuotaExceeded};
use crate::store::{KeptBytes, Store, StoreError};
use crate::sync::lock;

/// How long a measure is reused.
const FRESH: Duration = Duration::from_secs(1);
/// The share of the quota past which every write measures.
const NEAR: f64 = 0.8;
/// What a client is told to wait: room frees only as retention drops old
/// messages or the key deletes something.
const RETRY: Duration = Duration::from_secs(60);

/// A key's last measure on this replica.
struct Measure {
    bytes: u64,
    at: Instant,
}

/// Bounds each key's kept bytes.
pub struct StorageMeter {
    table: Arc<KeyTable>,
    store: Arc<dyn Store>,
    bus: Arc<dyn Bus>,
    /// What keys keep elsewhere (named snapshots, deliberation records),
    /// registered by the parts that keep it once they exist.
    elsewhere: Mutex<Vec<Arc<dyn KeptBytes>>>,
    measures: Mutex<HashMap<String, Measure>>,
    /// The measures turn starts made, apart: see
    /// [`admit_turn`](StorageMeter::admit_turn).
    turn_measures: Mutex<HashMap<String, Measure>>,
}

/// Why a write was not taken.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error(transparent)]
    Exceeded(#[from] QuotaExceeded),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Bus(#[from] BusError),
}

impl StorageMeter {
    /// `bus`: the bus as connected, whose kept bytes outside the store
    /// count too.
    pub fn new(table: Arc<KeyTable>, store: Arc<dyn Store>, bus: Arc<dyn Bus>) -> StorageMeter {
        StorageMeter {
            table,
            store,
            bus,
            elsewhere: Mutex::new(Vec::new()),
            measures: Mutex::new(HashMap::new()),
            turn_measures: Mutex::new(HashMap::new()),
        }
    }

    /// Counts what `source` keeps in each key's `storage_mb` too.
    pub fn count_also(&self, source: Arc<dyn KeptBytes>) {
        lock(&self.elsewhere).push(source);
    }

    /// Everything `namespace` keeps: its KV values, its kept bus messages
    /// and what the other parts keep for it.
    async fn measure(&self, namespace: &str) -> Result<u64, StorageError> {
        // Accepted messages the embedded bus has yet to write count.
        self.bus.flush().await?;
        let mut kept =
            self.store.stored_bytes(namespace).await? + self.bus.kept_bytes(namespace).await?;
        let elsewhere = lock(&self.elsewhere).clone();
        for source in elsewhere {
            kept += source.kept_bytes(namespace).await?;
        }
        Ok(kept)
    }

    /// Whether `namespace` (a key's owner id) may keep `bytes` more; no
    /// query at all for a namespace without the quota.
    pub async fn admit(&self, namespace: &str, bytes: usize) -> Result<(), StorageError> {
        self.admit_as(namespace, bytes, true).await
    }

    /// [`admit`](Self::admit) for a turn's start. What the turn keeps is
    /// counted once its events are stored, so it takes no room here, and
    /// its measure is cached apart: a measure cached for writes stands for
    /// what this replica took since, and one made at a turn's start would
    /// let this replica's next writes pass on it while others filled the
    /// key.
    pub async fn admit_turn(&self, namespace: &str, bytes: usize) -> Result<(), StorageError> {
        self.admit_as(namespace, bytes, false).await
    }

    /// A turn of `namespace` has written its events: the key's next turn
    /// measures what it keeps again.
    pub fn turn_ended(&self, namespace: &str) {
        lock(&self.turn_measures).remove(namespace);
    }

    async fn admit_as(
        &self,
        namespace: &str,
        bytes: usize,
        write: bool,
    ) -> Result<(), StorageError> {
        let Some(mb) = self.table.quota(Some(namespace)).storage_mb else {
            return Ok(());
        };
        let limit = mb.saturating_mul(1024 * 1024);
        let bytes = bytes as u64;
        let cache = if write {
            &self.measures
        } else {
            &self.turn_measures
        };
        let cached = {
            let measures = lock(cache);
            measures
                .get(namespace)
                .filter(|m| m.at.elapsed() < FRESH)
                .map(|m| m.bytes)
        };
        let near = (limit as f64 * NEAR) as u64;
        let kept = match cached {
            Some(kept) if kept.saturating_add(bytes) <= near => kept,
            _ => {
                let kept = self.measure(namespace).await?;
                lock(cache).insert(
                    namespace.to_owned(),
                    Measure {
                        bytes: kept,
                        at: Instant::now(),
                    },
                );
                kept
            }
        };
        if kept.saturating_add(bytes) > limit {
            return Err(QuotaExceeded {
                key: self.table.name(Some(namespace)),
                quota: "storage_mb",
                limit: mb.to_string(),
                why: format!(
                    "the key keeps {kept} bytes on the bus, in its KV, in its sessions' events, in \
                     named snapshots and in deliberation records; this write of {bytes} would pass \
                     {limit}: delete KV keys, sessions or named snapshots, or wait for retention to \
                     drop old messages"
                ),
                reset: None,
                retry_after: RETRY,
            }
            .into());
        }
        if !write {
            return Ok(());
        }
        if let Some(measure) = lock(&self.measures).get_mut(namespace) {
            measure.bytes = measure.bytes.saturating_add(bytes);
        }
        Ok(())
    }
}

/// The bus with each durable publish measured against its key's
/// `storage_mb` first; the subjects that are not kept take no disk and are
/// not measured.
pub struct MeteredBus {
    inner: Arc<dyn Bus>,
    meter: Arc<StorageMeter>,
    retentions: Retentions,
}

impl MeteredBus {
    pub fn new(inner: Arc<dyn Bus>, meter: Arc<StorageMeter>, config: &BusConfig) -> MeteredBus {
        MeteredBus {
            inner,
            meter,
            retentions: Retentions::new(config),
        }
    }
}

#[async_trait]
impl Bus for MeteredBus {
    async fn publish(
        &self,
        namespace: &str,
        subject: &Subject,
        payload: Bytes,
    ) -> Result<u64, BusError> {
        if self.retentions.keeps(subject.stream()) {
            self.meter
                .admit(namespace, payload.len())
                .await
                .map_err(|e| match e {
                    StorageError::Exceeded(e) => BusError::Quota(e),
                    StorageError::Store(e) => BusError::Store(e),
                    StorageError::Bus(e) => e,
                })?;
        }
        self.inner.publish(namespace, subject, payload).await
    }

    async fn subscribe(
        &self,
        namespace: &str,
        patterns: Vec<Pattern>,
        since: Since,
    ) -> Result<BoxStream<'static, Delivery>, BusError> {
        self.inner.subscribe(namespace, patterns, since).await
    }

    async fn flush(&self) -> Result<(), BusError> {
        self.inner.flush().await
    }

    fn max_payload(&self) -> usize {
        self.inner.max_payload()
    }

    async fn ping(&self) -> Result<(), BusError> {
        self.inner.ping().await
    }

    async fn kept_bytes(&self, namespace: &str) -> Result<u64, BusError> {
        self.inner.kept_bytes(namespace).await
    }
}
