//! What per-key quotas keep in the store, so that every replica sharing it
//! counts the same: slots (one row per sandbox or turn held, with an
//! expiry its replica renews) and counters per time window (requests per
//! minute).

use std::time::Duration;

use async_trait::async_trait;

use super::StoreError;

/// Concurrency slots and window counters, shared by the replicas.
#[async_trait]
pub trait QuotaStore: Send + Sync {
    /// Takes a slot of `pool` (e.g. `turns:{owner}`) for `holder` until
    /// `ttl` from now, unless `limit` slots of the pool are held and
    /// unexpired already; true when granted (or `holder` had it). Taking
    /// and counting are one step, so two replicas never both take the
    /// last slot. Expired slots of the pool (a dead replica's) are removed
    /// on the way. With `sessions_of`, that owner's open sessions that are
    /// not ephemeral count as held slots too, in the same step: an
    /// admission holds its slot until its session is stored (an ephemeral
    /// run's for the whole run), so admissions on many replicas at once
    /// never pass `limit`.
    async fn slot_take(
        &self,
        pool: &str,
        holder: &str,
        replica: &str,
        limit: u64,
        ttl: Duration,
        sessions_of: Option<&str>,
    ) -> Result<bool, StoreError>;

    /// Gives a slot back; nothing when it is not held.
    async fn slot_release(&self, pool: &str, holder: &str) -> Result<(), StoreError>;

    /// Renews every slot `replica` holds until `ttl` from now; answers how
    /// many it holds.
    async fn slots_renew(&self, replica: &str, ttl: Duration) -> Result<u64, StoreError>;

    /// The unexpired slots of `pool`.
    async fn slots_held(&self, pool: &str) -> Result<u64, StoreError>;

    /// Counts one more for `name` in the window starting at `window`
    /// (Unix seconds; a new window starts again at 1) and answers the
    /// count with it.
    async fn window_count(&self, name: &str, window: i64) -> Result<u64, StoreError>;

    /// The bytes `namespace` keeps here: its KV values, the bus messages
    /// this store keeps for it (the embedded bus's) and its sessions'
    /// events.
    async fn stored_bytes(&self, namespace: &str) -> Result<u64, StoreError>;
}

/// Bytes a key keeps outside its KV and the bus, measured by the part
/// that keeps them (named workspace snapshots, deliberation records) and
/// counted in its `storage_mb` with the rest.
#[async_trait]
pub trait KeptBytes: Send + Sync {
    /// What `owner` (a key's owner id) keeps here.
    async fn kept_bytes(&self, owner: &str) -> Result<u64, StoreError>;
}
