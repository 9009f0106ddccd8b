//! Durable state: sessions, their messages, their event logs and usage.
//!
//! - The seams, one per concern, so a second backend implements them one by
//!   one: [`SessionStore`] (sessions and their messages), [`EventStore`]
//!   (the durable event log), [`KvStore`] (namespaced keys with revisions),
//!   [`CheckpointStore`] (a run's state after each step), [`BusStore`]
//!   (the retained messages of durable bus subjects), [`LeaseStore`] (one
//!   replica at a time for a name), [`QuotaStore`] (per-key quota slots
//!   and counters), [`UsageStore`] (what each key spent, per day and
//!   model). [`Store`] is all of them; the server
//!   holds it as `Arc<dyn Store>`.
//! - [`files`]: large files every replica reads ([`SharedFiles`]), kept
//!   beside the store rather than in it.
//! - [`sqlite`]: the embedded default, one file in the data directory, with
//!   migrations and group commit of appended events.
//! - [`postgres`]: one PostgreSQL database shared by several replicas
//!   (`store = "postgres://…"`), with a pool and migrations.
//!
//! The trait speaks only domain types so a PostgreSQL backend can follow
//! behind it unchanged.

mod codec;
pub mod files;
pub mod postgres;
mod quota;
pub mod sqlite;
pub mod usage;

#[cfg(test)]
pub(crate) mod conformance;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::model::Message;
use serde_json::{Map, Value};

use crate::protocol::{Event, SessionKind, SessionRecord, SessionStatus, Usage};

pub use files::{FileReader, SharedFiles};
pub use postgres::PostgresStore;
pub use quota::{KeptBytes, QuotaStore};
pub use sqlite::SqliteStore;
pub use usage::{UsageCounts, UsageRow, UsageStore};

/// Which sessions a listing returns. The default selects all of them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionFilter {
    /// Only this owner's; `None` is every owner's.
    pub owner: Option<String>,
    pub status: Option<SessionStatus>,
    pub kind: Option<SessionKind>,
    /// Only the one-shot runs of `/agent/run` (`true`) or none of them
    /// (`false`).
    pub ephemeral: Option<bool>,
    /// Only the sessions made by this protocol adapter (`Some(Some(name))`,
    /// a [`crate::protocol::ORIGINS`] name) or by none (`Some(None)`).
    pub origin: Option<Option<String>>,
    /// Only the sessions whose metadata has each of these keys with an
    /// equal value; empty: no condition.
    pub metadata: Map<String, Value>,
    /// Only sessions older than this one (the cursor of the next page).
    pub before: Option<Uuid>,
    pub limit: Option<usize>,
}

impl SessionFilter {
    pub fn owner(owner: Option<&str>) -> SessionFilter {
        SessionFilter {
            owner: owner.map(str::to_owned),
            ..SessionFilter::default()
        }
    }
}

/// Cloned for each caller of a write that several share (a grouped or
/// queued transaction).
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("store I/O: {0}")]
    Io(String),
    /// The store cannot be reached now (a database that restarts, a
    /// connection refused or cut): worth a retry.
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
    #[error("store data is corrupt: {0}")]
    Corrupt(String),
    #[error("the store is closed")]
    Closed,
    /// A write that would replace what must not be replaced.
    #[error("conflict: {0}")]
    Conflict(String),
}

/// What a session's row holds that its turns change: status, usage and
/// the time of the last change.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionState {
    pub status: SessionStatus,
    pub usage: Usage,
    pub updated_at: DateTime<Utc>,
}

/// A lease its holder gives up: `name`, if `holder` has it (as
/// [`LeaseStore::lease_release`] does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub name: String,
    pub holder: String,
}

/// What one write of a session's log saves, all or none: its events, the
/// messages its conversation grew by (appended after those stored, as
/// [`SessionStore::append_messages`] does), its new state, and with its
/// turn's last write the lease the turn gives up and what it spent
/// (added to each row's key, day and model, as [`UsageStore::usage_add`]
/// does, one row per key, day and model). Any part may be empty. The
/// first write of a session made with its log's first write
/// ([`Creation`]) makes it too.
#[derive(Debug, Clone, Copy, Default)]
pub struct Batch<'a> {
    pub create: Option<Creation<'a>>,
    pub events: &'a [Event],
    pub messages: &'a [Message],
    pub state: Option<&'a SessionState>,
    pub release: Option<&'a Release>,
    pub usage: &'a [UsageRow],
}

/// A session stored by its log's first write rather than before it: the
/// record (the batch's state, when it has one, overrides its status,
/// usage and `updated_at`) and the turn lease its first turn holds, taken
/// in the same write (none when that write also ends the turn). The write
/// fails, storing nothing, when a session has the record's id.
#[derive(Debug, Clone, Copy)]
pub struct Creation<'a> {
    pub record: &'a SessionRecord,
    pub lease: Option<(&'a Release, std::time::Duration)>,
}

impl Batch<'_> {
    pub fn is_empty(&self) -> bool {
        self.create.is_none()
            && self.events.is_empty()
            && self.messages.is_empty()
            && self.state.is_none()
            && self.release.is_none()
            && self.usage.is_empty()
    }
}

/// A session as a replica that takes its turn must learn it.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionEnd {
    pub record: SessionRecord,
    /// The last `seq` of its log.
    pub last_seq: u64,
    /// How many messages its conversation holds, where the backend knows
    /// it without reading them (`None`: not known).
    pub messages: Option<u64>,
    /// How many times its conversation was cut back (rewinds), where the
    /// backend counts them: a copy of the conversation kept from before
    /// the last cut may differ from the stored one at any index.
    pub cuts: Option<u64>,
}

/// What taking a session's turn lease found.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnLease {
    /// Taken, and the session as the store has it now.
    Held(Box<SessionEnd>),
    /// Another holder has it.
    Busy,
    /// No such session: no lease was taken.
    NoSession,
}

/// Sessions and their conversation history.
#[async_trait]
pub trait SessionStore: Send + Sync {
    async fn create_session(&self, session: &SessionRecord) -> Result<(), StoreError>;

    async fn get_session(&self, id: Uuid) -> Result<Option<SessionRecord>, StoreError>;

    /// The sessions `filter` selects, newest first.
    async fn list_sessions(&self, filter: &SessionFilter)
    -> Result<Vec<SessionRecord>, StoreError>;

    /// Closed ephemeral sessions made and last updated before `cutoff`,
    /// oldest update first, at most `limit`: those the retention removes.
    /// (A session is updated after it is made; the two times differ the
    /// other way only by a clock skew between replicas, which delays its
    /// removal by as much.)
    async fn expired_ephemeral(
        &self,
        cutoff: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Uuid>, StoreError>;

    /// Sessions in a given status, e.g. `running` ones cut off by a crash.
    async fn sessions_with_status(
        &self,
        status: SessionStatus,
    ) -> Result<Vec<SessionRecord>, StoreError>;

    /// Sets each key of `patch` in the session's metadata (keys not in it
    /// are kept) in one write, and answers the metadata now; `None` for an
    /// unknown session.
    async fn merge_metadata(
        &self,
        id: Uuid,
        patch: &Map<String, Value>,
    ) -> Result<Option<Map<String, Value>>, StoreError>;

    /// Removes the session with everything it owns (messages, events,
    /// checkpoints); false if unknown.
    async fn delete_session(&self, id: Uuid) -> Result<bool, StoreError>;

    async fn messages(&self, id: Uuid) -> Result<Vec<Message>, StoreError> {
        self.messages_from(id, 0).await
    }

    /// The history from its `from`th message on: what a turn adds to the
    /// history it holds already.
    async fn messages_from(&self, id: Uuid, from: usize) -> Result<Vec<Message>, StoreError>;

    /// Cuts the history back to its first `len` messages (a rewind to an
    /// earlier turn end); the next append continues after them. A history
    /// no longer than `len` is left as it is.
    async fn truncate_messages(&self, id: Uuid, len: usize) -> Result<(), StoreError>;
}

/// The durable side of a session's event log.
#[async_trait]
pub trait EventStore: Send + Sync {
    /// Appends events, all or none. When this returns they survive a crash
    /// of the process, so they may be sent to clients.
    async fn append_events(&self, events: &[Event]) -> Result<(), StoreError> {
        match events.first() {
            Some(first) => {
                let batch = Batch {
                    events,
                    ..Batch::default()
                };
                self.append_batch(first.session_id, batch).await
            }
            None => Ok(()),
        }
    }

    /// Saves a session's status, usage and `updated_at` (now): a batch of
    /// that alone. An unknown session is left alone: it may have been
    /// deleted while it ran, and its last update has nothing left to
    /// update.
    async fn update_session(
        &self,
        id: Uuid,
        status: SessionStatus,
        usage: &Usage,
    ) -> Result<(), StoreError> {
        let state = SessionState {
            status,
            usage: usage.clone(),
            updated_at: Utc::now(),
        };
        let batch = Batch {
            state: Some(&state),
            ..Batch::default()
        };
        self.append_batch(id, batch).await
    }

    /// Appends to the conversation history, in order: a batch of messages
    /// alone. On PostgreSQL, raising the session's `next_message` locks
    /// its row, so two writers appending to one session (two replicas)
    /// take their indices one after the other.
    async fn append_messages(&self, id: Uuid, messages: &[Message]) -> Result<(), StoreError> {
        let batch = Batch {
            messages,
            ..Batch::default()
        };
        self.append_batch(id, batch).await
    }

    /// Saves a batch of `session`'s log, all or none in one write: a
    /// turn's messages and status ride with its events instead of costing
    /// writes of their own. An unknown session's state is left alone;
    /// messages for one are refused.
    async fn append_batch(&self, session: Uuid, batch: Batch<'_>) -> Result<(), StoreError>;

    /// Events with `seq > since`, in order, at most `limit`.
    async fn events_since(
        &self,
        id: Uuid,
        since: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError>;

    /// The highest `seq` of the session, 0 when it has none.
    async fn last_seq(&self, id: Uuid) -> Result<u64, StoreError>;
}

/// One key of a KV namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct KvEntry {
    pub key: String,
    pub value: Vec<u8>,
    /// Grows with every write to the namespace; a write's revision is
    /// higher than every earlier one's, deletes included.
    pub revision: u64,
    pub updated_at: DateTime<Utc>,
}

/// What a conditional KV write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvWrite {
    /// Written (or deleted) at this revision.
    Done(u64),
    /// Refused: the key's revision was not the expected one (`None`: the
    /// key does not exist).
    Conflict { current: Option<u64> },
}

/// Which revision a conditional KV write expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Any: the write is unconditional.
    Any,
    /// The key must not exist.
    Absent,
    /// The key must be at this revision.
    Revision(u64),
}

impl Expect {
    /// The APIs' `if_revision`: none is unconditional, `0` is absent.
    pub fn if_revision(if_revision: Option<u64>) -> Expect {
        match if_revision {
            None => Expect::Any,
            Some(0) => Expect::Absent,
            Some(revision) => Expect::Revision(revision),
        }
    }
}

/// A JSON record kept under `key`: `None` when absent, a `Corrupt` error
/// naming `what` when it does not parse.
pub async fn kv_json<T: serde::de::DeserializeOwned>(
    store: &dyn KvStore,
    namespace: &str,
    key: &str,
    what: &str,
) -> Result<Option<T>, StoreError> {
    let Some(entry) = store.kv_get(namespace, key).await? else {
        return Ok(None);
    };
    serde_json::from_slice(&entry.value)
        .map(Some)
        .map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

/// Keys and values in namespaces (one per tenant), with revisions for
/// compare-and-set. Waiting for a change is the caller's (the bus's).
#[async_trait]
pub trait KvStore: Send + Sync {
    async fn kv_get(&self, namespace: &str, key: &str) -> Result<Option<KvEntry>, StoreError>;

    async fn kv_put(
        &self,
        namespace: &str,
        key: &str,
        value: &[u8],
        expect: Expect,
    ) -> Result<KvWrite, StoreError>;

    /// A missing key is a conflict unless `expect` is [`Expect::Any`],
    /// which deletes nothing and answers the namespace's revision.
    async fn kv_delete(
        &self,
        namespace: &str,
        key: &str,
        expect: Expect,
    ) -> Result<KvWrite, StoreError>;

    /// The keys starting with `prefix`, in key order, at most `limit`.
    async fn kv_list(
        &self,
        namespace: &str,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<KvEntry>, StoreError>;
}

/// A session's state after one step of a run (a pipeline's node).
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub session_id: Uuid,
    /// Dense from 1 per session.
    pub step: u64,
    /// What ran in this step (a node's name).
    pub name: String,
    pub state: Value,
    pub created_at: DateTime<Utc>,
}

/// Checkpoints of a session's runs, deleted with the session.
#[async_trait]
pub trait CheckpointStore: Send + Sync {
    /// Stores a checkpoint. A step that exists already is refused
    /// ([`StoreError::Conflict`]): a completed step is never written twice.
    async fn put_checkpoint(&self, checkpoint: &Checkpoint) -> Result<(), StoreError>;

    /// Every checkpoint of the session, by step.
    async fn checkpoints(&self, session_id: Uuid) -> Result<Vec<Checkpoint>, StoreError>;

    /// The session's checkpoint with the highest step.
    async fn last_checkpoint(&self, session_id: Uuid) -> Result<Option<Checkpoint>, StoreError>;
}

/// A message of a durable bus subject as the store keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct BusRecord {
    /// The tenant's namespace.
    pub namespace: String,
    /// The subject with `.` separators, under which `seq` counts.
    pub stream: String,
    /// The subject as its publisher wrote it.
    pub subject: String,
    pub seq: u64,
    pub time: DateTime<Utc>,
    pub payload: Vec<u8>,
}

/// A durable bus subject as the store knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusStream {
    pub namespace: String,
    pub stream: String,
    pub last_seq: u64,
    /// Messages kept now.
    pub retained: u64,
}

/// Where a read of retained bus messages starts.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BusCursor {
    /// Only messages stored after this position (0: from the first).
    pub after: u64,
    /// Only messages published at or after this time.
    pub from_time: Option<DateTime<Utc>>,
}

/// The retained messages of durable bus subjects, per namespace, in the
/// order they were published.
#[async_trait]
pub trait BusStore: Send + Sync {
    /// Appends messages, all or none, and raises each stream's last `seq`.
    async fn bus_append(&self, messages: &[BusRecord]) -> Result<(), StoreError>;

    /// The namespace's messages from `cursor` in publish order, at most
    /// `limit`, each with its position (the next read's `after`).
    async fn bus_read(
        &self,
        namespace: &str,
        cursor: BusCursor,
        limit: usize,
    ) -> Result<Vec<(u64, BusRecord)>, StoreError>;

    /// Every stream that ever held a message; numbering goes on from its
    /// last `seq` after a restart, even past pruned messages.
    async fn bus_streams(&self) -> Result<Vec<BusStream>, StoreError>;

    /// Deletes the stream's messages with `seq <= through_seq` and those
    /// published before `older_than`; answers how many went.
    async fn bus_prune(
        &self,
        namespace: &str,
        stream: &str,
        through_seq: u64,
        older_than: Option<DateTime<Utc>>,
    ) -> Result<u64, StoreError>;
}

/// One holder at a time for a name (a session's running turn: `turn:{id}`)
/// until the lease expires unless renewed. Replicas sharing a store use it
/// so that a session runs one turn at a time across all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub name: String,
    pub holder: String,
    /// By the store's clock (PostgreSQL's `now()`), so replicas whose
    /// clocks differ agree on it.
    pub expires_at: DateTime<Utc>,
    /// Grows each time an expired lease passes to another holder (a
    /// fencing token); the same while one holder renews it; 1 for a new
    /// or released lease.
    pub fence: u64,
}

#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// Takes `name` for `holder` until `ttl` from now when it is free,
    /// expired or already `holder`'s (renewing it), and answers the lease
    /// as it stands after: granted when its `holder` is `holder`.
    async fn lease_acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<Lease, StoreError>;

    /// Extends `holder`'s lease on `name` to `ttl` from now, expired or
    /// not, as long as nobody else took it; `None` when `holder` does not
    /// have it (another holder took it, or it was released): a renewal
    /// never takes a lease back.
    async fn lease_renew(
        &self,
        name: &str,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<Option<Lease>, StoreError>;

    /// Gives `name` up (the lease is removed) if `holder` has it; false
    /// when it did not.
    async fn lease_release(&self, name: &str, holder: &str) -> Result<bool, StoreError>;

    /// The leases named with `prefix` that have expired: their holders
    /// stopped renewing (a replica died), oldest first.
    async fn leases_expired(&self, prefix: &str) -> Result<Vec<Lease>, StoreError>;
}

/// Everything the server keeps, one backend for all (SQLite embedded; a
/// second backend implements the seams one by one).
#[async_trait]
pub trait Store:
    SessionStore
    + EventStore
    + KvStore
    + CheckpointStore
    + BusStore
    + LeaseStore
    + QuotaStore
    + UsageStore
{
    /// Answers once the backend has answered a trivial query: what the
    /// readiness probe asks.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Writes out everything accepted so far and stops taking writes.
    async fn close(&self) -> Result<(), StoreError>;

    /// Takes the turn lease `name` of `session` for `holder`, as
    /// [`LeaseStore::lease_acquire`] does, only while the session exists,
    /// and reads the session as [`Store::session_at_end`] does: in one
    /// statement where the backend can. The read sees every write that
    /// committed before the lease was free.
    async fn take_turn(
        &self,
        session: Uuid,
        (name, holder): (&str, &str),
        ttl: std::time::Duration,
    ) -> Result<TurnLease, StoreError> {
        let lease = self.lease_acquire(name, holder, ttl).await?;
        if lease.holder != holder {
            return Ok(TurnLease::Busy);
        }
        match self.session_at_end(session).await? {
            Some(end) => Ok(TurnLease::Held(Box::new(end))),
            None => {
                self.lease_release(name, holder).await?;
                Ok(TurnLease::NoSession)
            }
        }
    }

    /// The session's record, the last `seq` of its log and, where known,
    /// the length of its conversation, as one read where the backend can
    /// (what a replica that takes a session's turn must learn first).
    async fn session_at_end(&self, id: Uuid) -> Result<Option<SessionEnd>, StoreError> {
        let Some(record) = self.get_session(id).await? else {
            return Ok(None);
        };
        Ok(Some(SessionEnd {
            record,
            last_seq: self.last_seq(id).await?,
            messages: None,
            cuts: None,
        }))
    }
}
