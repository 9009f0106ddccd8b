//! Enforcing the quotas of keys, shared by every replica on one store.
//!
//! - Concurrency (`max_sandboxes`, `max_concurrent_turns`): each sandbox or
//!   turn of a key holds a slot, a row of the store's `quota_slots` with an
//!   expiry. A slot is taken only when fewer than the limit are held
//!   (counting and inserting are one step in the store), given back when
//!   the sandbox or turn ends, and renewed meanwhile by its replica, all of
//!   the replica's slots in one statement every third of the TTL. A replica
//!   that dies stops renewing: its slots expire after one TTL and free
//!   themselves.
//! - Open sessions (`max_concurrent_sessions`): the sessions of the key
//!   that are neither closed nor deleted. One more is admitted with a
//!   slot, counted together with the key's stored open sessions in one
//!   step, and held until the session is stored (then its row counts);
//!   an ephemeral run (`/agent/run`) holds its slot for the whole run,
//!   and its row does not count. A session stays open while idle (it
//!   keeps its history and takes turns); deleting it, or the end of an
//!   ephemeral run, closes it.
//! - Gateway requests (`requests_per_minute`): a counter per key and UTC
//!   minute in the store, one upsert per request.
//!
//! A quota left unset (or `0`) costs nothing: no store round trip is made
//! for it, and none at all while auth is off.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Timelike, Utc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{KeyTable, QuotaExceeded};
use crate::store::{Store, StoreError};

/// How long a client is told to wait when a concurrency quota is full:
/// nothing says when a turn or sandbox ends, so soon.
const CONCURRENCY_RETRY: Duration = Duration::from_secs(5);

/// A quota hit, or the store that could not tell.
#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    #[error(transparent)]
    Exceeded(#[from] QuotaExceeded),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The quotas of every key, enforced through the store.
pub struct Quotas {
    table: Arc<KeyTable>,
    store: Arc<dyn Store>,
    /// This process among the replicas; its slots carry it.
    replica: String,
    ttl: Duration,
}

/// A slot held: a sandbox or a turn of a key. Dropping it gives it back.
pub struct HeldSlot {
    store: Arc<dyn Store>,
    pool: String,
    holder: String,
}

impl HeldSlot {
    /// Gives the slot back now, rather than in the background as a drop
    /// does: the next taker finds it free.
    pub async fn release(mut self) {
        let (pool, holder) = (
            std::mem::take(&mut self.pool),
            std::mem::take(&mut self.holder),
        );
        if let Err(e) = self.store.slot_release(&pool, &holder).await {
            tracing::warn!(%pool, error = %e, "giving a quota slot back failed; it expires");
        }
    }
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        if self.holder.is_empty() {
            return;
        }
        let (store, pool, holder) = (
            self.store.clone(),
            std::mem::take(&mut self.pool),
            std::mem::take(&mut self.holder),
        );
        // Without a runtime (the process is ending) the slot expires.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = store.slot_release(&pool, &holder).await {
                    tracing::warn!(%pool, error = %e, "giving a quota slot back failed; it expires");
                }
            });
        }
    }
}

impl Quotas {
    /// `ttl`: how long a dead replica's slots stay held.
    pub fn new(table: Arc<KeyTable>, store: Arc<dyn Store>, ttl: Duration) -> Quotas {
        Quotas {
            table,
            store,
            replica: format!("quota-{}", Uuid::new_v4().simple()),
            ttl,
        }
    }

    pub fn table(&self) -> &KeyTable {
        &self.table
    }

    /// Renews this replica's slots every third of the TTL until `stop`.
    pub async fn renew(self: Arc<Self>, stop: CancellationToken) {
        let every = self.ttl / 3;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            if let Err(e) = self.store.slots_renew(&self.replica, self.ttl).await {
                tracing::warn!(error = %e, "renewing this replica's quota slots failed");
            }
        }
    }

    /// A slot of `quota` for one more of the key's `what`, or the quota's
    /// error; `None` when the key has no such limit.
    async fn take(
        &self,
        owner: Option<&str>,
        quota: &'static str,
        limit: Option<u64>,
        why: &str,
    ) -> Result<Option<HeldSlot>, QuotaError> {
        let (Some(owner), Some(limit)) = (owner, limit) else {
            return Ok(None);
        };
        let pool = format!("{quota}:{owner}");
        let holder = format!("{}/{}", self.replica, Uuid::new_v4().simple());
        if !self
            .store
            .slot_take(&pool, &holder, &self.replica, limit, self.ttl, None)
            .await?
        {
            return Err(self.exceeded(owner, quota, limit, why, None).into());
        }
        Ok(Some(HeldSlot {
            store: self.store.clone(),
            pool,
            holder,
        }))
    }

    fn exceeded(
        &self,
        owner: &str,
        quota: &'static str,
        limit: u64,
        why: &str,
        reset: Option<DateTime<Utc>>,
    ) -> QuotaExceeded {
        let retry_after = reset
            .map(|at| (at - Utc::now()).to_std().unwrap_or_default())
            .map(|wait| wait.max(Duration::from_secs(1)))
            .unwrap_or(CONCURRENCY_RETRY);
        QuotaExceeded {
            key: self.table.name(Some(owner)),
            quota,
            limit: limit.to_string(),
            why: why.into(),
            reset,
            retry_after: Duration::from_secs(retry_after.as_secs_f64().ceil() as u64),
        }
    }

    /// One more live sandbox for a session of `owner`'s.
    pub async fn take_sandbox(&self, owner: Option<&str>) -> Result<Option<HeldSlot>, QuotaError> {
        let limit = self.table.quota(owner).max_sandboxes;
        self.take(
            owner,
            "max_sandboxes",
            limit,
            "every sandbox the key may hold is live; one frees when a session of the key is deleted or its sandbox idles out",
        )
        .await
    }

    /// One more running turn of `owner`'s sessions.
    pub async fn take_turn(&self, owner: Option<&str>) -> Result<Option<HeldSlot>, QuotaError> {
        let limit = self.table.quota(owner).max_concurrent_turns;
        self.take(
            owner,
            "max_concurrent_turns",
            limit,
            "the key runs as many turns as it may at once; one frees when a turn ends",
        )
        .await
    }

    /// A slot for one more session of `owner`'s, `id`: held until the
    /// session is stored (an ephemeral run's, until the run ends), while
    /// the key's open sessions that are not ephemeral count as held too.
    /// `None` when the key has no such limit.
    pub async fn admit_session(
        &self,
        owner: Option<&str>,
        id: Uuid,
    ) -> Result<Option<HeldSlot>, QuotaError> {
        let (Some(owner), Some(limit)) = (owner, self.table.quota(owner).max_concurrent_sessions)
        else {
            return Ok(None);
        };
        let pool = format!("max_concurrent_sessions:{owner}");
        let holder = format!("{}/{id}", self.replica);
        if !self
            .store
            .slot_take(&pool, &holder, &self.replica, limit, self.ttl, Some(owner))
            .await?
        {
            return Err(self
                .exceeded(
                    owner,
                    "max_concurrent_sessions",
                    limit,
                    "the key has as many open sessions as it may; delete one (an ephemeral run closes its own)",
                    None,
                )
                .into());
        }
        Ok(Some(HeldSlot {
            store: self.store.clone(),
            pool,
            holder,
        }))
    }

    /// Counts a gateway request of `owner`'s against its minute.
    pub async fn admit_request(&self, owner: Option<&str>) -> Result<(), QuotaError> {
        let (Some(owner), Some(limit)) = (owner, self.table.quota(owner).requests_per_minute)
        else {
            return Ok(());
        };
        let now = Utc::now();
        let minute = now.timestamp() - i64::from(now.second());
        let count = self
            .store
            .window_count(&format!("requests_per_minute:{owner}"), minute)
            .await?;
        if count > limit {
            let reset = DateTime::from_timestamp(minute + 60, 0);
            return Err(self
                .exceeded(
                    owner,
                    "requests_per_minute",
                    limit,
                    "the key made as many gateway requests this minute as it may",
                    reset,
                )
                .into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, key_owner};
    use crate::store::SqliteStore;

    fn quotas(config: &Config, dir: &tempfile::TempDir) -> Quotas {
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open(&dir.path().join("conclave.db")).unwrap());
        let table = Arc::new(KeyTable::new(config));
        Quotas::new(table, store, Duration::from_secs(60))
    }

    /// A key of `api_keys` with no quota configured gets the built-in
    /// default: 16 sandboxes, never all 64 of `max_live`; another key has
    /// its own 16; a sandbox given back makes room.
    #[tokio::test]
    async fn the_builtin_default_bounds_each_keys_sandboxes() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config {
            api_keys: vec![
                "first-key-0123456789".into(),
                "second-key-0123456789".into(),
            ],
            ..Config::default()
        };
        let quotas = quotas(&config, &dir);
        let (first, second) = (
            key_owner("first-key-0123456789"),
            key_owner("second-key-0123456789"),
        );
        let mut held = Vec::new();
        for _ in 0..16 {
            held.push(quotas.take_sandbox(Some(&first)).await.unwrap().unwrap());
        }
        let refused = quotas.take_sandbox(Some(&first)).await;
        let Err(QuotaError::Exceeded(refused)) = refused else {
            panic!("the 17th sandbox was not refused");
        };
        assert_eq!(
            (refused.quota, refused.limit.as_str()),
            ("max_sandboxes", "16")
        );
        assert!(refused.key.starts_with("key-"), "{}", refused.key);
        assert!(quotas.take_sandbox(Some(&second)).await.unwrap().is_some());
        held.pop().unwrap().release().await;
        assert!(quotas.take_sandbox(Some(&first)).await.unwrap().is_some());
    }

    /// Without keys nothing is counted: no slot, no limit.
    #[tokio::test]
    async fn auth_off_counts_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let quotas = quotas(&Config::default(), &dir);
        assert!(quotas.take_sandbox(None).await.unwrap().is_none());
        assert!(quotas.take_turn(None).await.unwrap().is_none());
        quotas.admit_session(None, Uuid::new_v4()).await.unwrap();
        quotas.admit_request(None).await.unwrap();
    }
}
