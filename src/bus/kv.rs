//! The bus's KV: keys with revisions in the store, and the changes fanned
//! out in process so that watchers and waiters need no polling. With
//! several replicas on one store, [`KvPeers`] tells the others of each
//! write, and a write told by another replica is read back from the store
//! before this one's watchers see it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;
use tokio::sync::broadcast;

use crate::store::{Expect, KvEntry, KvWrite, Store, StoreError};

/// Longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 512;
/// Changes held for watchers that fall behind before they re-read.
const CHANGES: usize = 4096;
/// How often a waiter re-reads its key when other replicas write too: a
/// change told over the network may be lost (a reconnect).
const RECHECK: Duration = Duration::from_secs(2);

/// The other replicas sharing the store: told of this one's writes.
#[async_trait]
pub trait KvPeers: Send + Sync {
    async fn tell(&self, namespace: &str, key: &str, revision: u64, deleted: bool);
}

/// One write to a key.
#[derive(Debug, Clone, PartialEq)]
pub struct KvChange {
    pub namespace: String,
    pub key: String,
    pub revision: u64,
    /// The new value; `None` when the key was deleted.
    pub value: Option<Bytes>,
}

#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("invalid key {key:?}: {reason}")]
    BadKey { key: String, reason: &'static str },
    #[error("the value has {size} bytes; the KV takes at most {max}")]
    TooLarge { size: usize, max: usize },
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The namespace's key is past its `storage_mb`.
    #[error(transparent)]
    Quota(crate::quota::QuotaExceeded),
}

pub struct Kv {
    store: Arc<dyn Store>,
    changes: broadcast::Sender<Arc<KvChange>>,
    max_value: usize,
    /// None when this replica is the only one.
    peers: Option<Arc<dyn KvPeers>>,
    /// Bounds each key's kept bytes (with keys).
    meter: Option<Arc<super::StorageMeter>>,
}

/// Checks a key: not empty, at most 512 bytes, no control characters.
pub fn check_key(key: &str) -> Result<(), KvError> {
    let reason = if key.is_empty() {
        "it is empty"
    } else if key.len() > MAX_KEY_BYTES {
        "it is longer than 512 bytes"
    } else if key.chars().any(char::is_control) {
        "it contains a control character"
    } else {
        return Ok(());
    };
    Err(KvError::BadKey {
        key: key.chars().take(64).collect(),
        reason,
    })
}

impl Kv {
    pub fn new(store: Arc<dyn Store>, max_value: usize) -> Kv {
        Kv {
            store,
            changes: broadcast::Sender::new(CHANGES),
            max_value,
            peers: None,
            meter: None,
        }
    }

    /// A KV whose writes are told to `peers`.
    pub fn with_peers(store: Arc<dyn Store>, max_value: usize, peers: Arc<dyn KvPeers>) -> Kv {
        Kv {
            peers: Some(peers),
            ..Kv::new(store, max_value)
        }
    }

    /// A write another replica made: its watchers here see the value it
    /// wrote, read back from the store, unless the key has changed again
    /// since (then the later write's news follows).
    pub async fn changed_elsewhere(
        &self,
        namespace: &str,
        key: &str,
        revision: u64,
        deleted: bool,
    ) -> Result<(), KvError> {
        if self.changes.receiver_count() == 0 {
            return Ok(());
        }
        let value = match self.store.kv_get(namespace, key).await? {
            Some(entry) if !deleted && entry.revision == revision => Some(Bytes::from(entry.value)),
            None if deleted => None,
            _ => return Ok(()),
        };
        self.broadcast(namespace, key, revision, value);
        Ok(())
    }

    /// This KV with each put measured against its key's `storage_mb` by
    /// `meter` (none: not measured).
    pub fn metered(self, meter: Option<Arc<super::StorageMeter>>) -> Kv {
        Kv { meter, ..self }
    }

    pub async fn get(&self, namespace: &str, key: &str) -> Result<Option<KvEntry>, KvError> {
        check_key(key)?;
        Ok(self.store.kv_get(namespace, key).await?)
    }

    pub async fn put(
        &self,
        namespace: &str,
        key: &str,
        value: Bytes,
        expect: Expect,
    ) -> Result<KvWrite, KvError> {
        check_key(key)?;
        if value.len() > self.max_value {
            return Err(KvError::TooLarge {
                size: value.len(),
                max: self.max_value,
            });
        }
        if let Some(meter) = &self.meter {
            meter
                .admit(namespace, value.len())
                .await
                .map_err(|e| match e {
                    super::StorageError::Exceeded(e) => KvError::Quota(e),
                    super::StorageError::Store(e) => KvError::Store(e),
                    super::StorageError::Bus(e) => {
                        KvError::Store(StoreError::Io(format!("measuring the bus: {e}")))
                    }
                })?;
        }
        let write = self.store.kv_put(namespace, key, &value, expect).await?;
        if let KvWrite::Done(revision) = write {
            self.announce(namespace, key, revision, Some(value)).await;
        }
        Ok(write)
    }

    /// Deletes the key; `Ok(None)` when it does not exist.
    pub async fn delete(
        &self,
        namespace: &str,
        key: &str,
        expect: Expect,
    ) -> Result<Option<KvWrite>, KvError> {
        check_key(key)?;
        let expect = match expect {
            // "Any" of a key that exists: delete at its revision, so a
            // missing key is told apart from a deleted one.
            Expect::Any => match self.store.kv_get(namespace, key).await? {
                Some(entry) => Expect::Revision(entry.revision),
                None => return Ok(None),
            },
            other => other,
        };
        let write = self.store.kv_delete(namespace, key, expect).await?;
        match write {
            KvWrite::Done(revision) => self.announce(namespace, key, revision, None).await,
            KvWrite::Conflict { current: None } if expect != Expect::Absent => return Ok(None),
            KvWrite::Conflict { .. } => {}
        }
        Ok(Some(write))
    }

    pub async fn list(
        &self,
        namespace: &str,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<KvEntry>, KvError> {
        Ok(self.store.kv_list(namespace, prefix, limit).await?)
    }

    async fn announce(&self, namespace: &str, key: &str, revision: u64, value: Option<Bytes>) {
        let deleted = value.is_none();
        self.broadcast(namespace, key, revision, value);
        if let Some(peers) = &self.peers {
            peers.tell(namespace, key, revision, deleted).await;
        }
    }

    fn broadcast(&self, namespace: &str, key: &str, revision: u64, value: Option<Bytes>) {
        // No receiver is no error: nobody watches.
        let _ = self.changes.send(Arc::new(KvChange {
            namespace: namespace.to_owned(),
            key: key.to_owned(),
            revision,
            value,
        }));
    }

    /// The key once it exists with a revision above `after` (any revision
    /// when `None`), or what it is when `timeout` passes.
    pub async fn wait(
        &self,
        namespace: &str,
        key: &str,
        after: Option<u64>,
        timeout: Duration,
    ) -> Result<Option<KvEntry>, KvError> {
        check_key(key)?;
        let deadline = tokio::time::Instant::now() + timeout;
        let wanted = |entry: &Option<KvEntry>| {
            entry
                .as_ref()
                .is_some_and(|e| after.is_none_or(|after| e.revision > after))
        };
        // Subscribed before reading, so no write falls between the two.
        let mut changes = self.changes.subscribe();
        let mut current = self.store.kv_get(namespace, key).await?;
        while !wanted(&current) {
            let wake = match self.peers {
                Some(_) => deadline.min(tokio::time::Instant::now() + RECHECK),
                None => deadline,
            };
            let news = tokio::time::timeout_at(wake, changes.recv()).await;
            match news {
                Err(_) if wake >= deadline => break,
                Err(_) => current = self.store.kv_get(namespace, key).await?,
                Ok(Ok(change)) if change.namespace != namespace || change.key != key => continue,
                Ok(Err(broadcast::error::RecvError::Closed)) => break,
                // A write to the key, or missed writes: read it again.
                Ok(_) => current = self.store.kv_get(namespace, key).await?,
            }
        }
        Ok(current)
    }

    /// The changes of keys starting with `prefix`, from now on. A watcher
    /// that falls more than 4,096 changes behind gets the keys' current
    /// values instead of the writes it missed.
    pub fn watch(
        self: &Arc<Self>,
        namespace: &str,
        prefix: &str,
    ) -> impl Stream<Item = Arc<KvChange>> + Send + 'static {
        struct Watch {
            kv: Arc<Kv>,
            namespace: String,
            prefix: String,
            changes: broadcast::Receiver<Arc<KvChange>>,
            resync: std::collections::VecDeque<Arc<KvChange>>,
            /// Each key's last revision seen: news of an older write
            /// (another replica's, arriving late) is skipped.
            seen: std::collections::HashMap<String, u64>,
        }
        let state = Watch {
            kv: self.clone(),
            namespace: namespace.to_owned(),
            prefix: prefix.to_owned(),
            changes: self.changes.subscribe(),
            resync: Default::default(),
            seen: Default::default(),
        };
        futures::stream::unfold(state, |mut w| async move {
            loop {
                let change = match w.resync.pop_front() {
                    Some(change) => change,
                    None => match w.changes.recv().await {
                        Ok(change) => change,
                        Err(broadcast::error::RecvError::Closed) => return None,
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            let entries =
                                w.kv.list(&w.namespace, &w.prefix, usize::MAX).await.ok()?;
                            w.resync = entries
                                .into_iter()
                                .map(|e| {
                                    Arc::new(KvChange {
                                        namespace: w.namespace.clone(),
                                        key: e.key,
                                        revision: e.revision,
                                        value: Some(Bytes::from(e.value)),
                                    })
                                })
                                .collect();
                            continue;
                        }
                    },
                };
                if change.namespace != w.namespace || !change.key.starts_with(&w.prefix) {
                    continue;
                }
                let seen = w.seen.entry(change.key.clone()).or_default();
                if change.revision > *seen {
                    *seen = change.revision;
                    return Some((change, w));
                }
            }
        })
    }
}
