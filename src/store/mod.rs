//! Durable state: sessions, their messages, their event logs and usage.
//!
//! - [`Store`]: the trait every backend implements; held as `Arc<dyn Store>`.
//! - [`sqlite`]: the embedded default, one file in the data directory, with
//!   migrations and group commit of appended events.
//!
//! The trait speaks only domain types so a PostgreSQL backend can follow
//! behind it unchanged.

pub mod sqlite;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::events::{Event, Usage};
use crate::model::Message;

pub use sqlite::SqliteStore;

/// What a session runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionKind {
    Agent,
    Deliberation,
    Pipeline,
}

/// Where a session stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    Idle,
    Running,
    Interrupted,
    Closed,
}

impl SessionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Idle => "idle",
            SessionStatus::Running => "running",
            SessionStatus::Interrupted => "interrupted",
            SessionStatus::Closed => "closed",
        }
    }

    pub fn parse(s: &str) -> Option<SessionStatus> {
        Some(match s {
            "idle" => SessionStatus::Idle,
            "running" => SessionStatus::Running,
            "interrupted" => SessionStatus::Interrupted,
            "closed" => SessionStatus::Closed,
            _ => return None,
        })
    }
}

impl SessionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionKind::Agent => "agent",
            SessionKind::Deliberation => "deliberation",
            SessionKind::Pipeline => "pipeline",
        }
    }

    pub fn parse(s: &str) -> Option<SessionKind> {
        Some(match s {
            "agent" => SessionKind::Agent,
            "deliberation" => SessionKind::Deliberation,
            "pipeline" => SessionKind::Pipeline,
            _ => return None,
        })
    }
}

/// A session as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    pub id: Uuid,
    pub name: Option<String>,
    pub kind: SessionKind,
    /// Hash of the API key that created it; `None` when auth is off.
    pub owner: Option<String>,
    /// The session's options as the client gave them, validated.
    pub options: Value,
    pub status: SessionStatus,
    pub usage: Usage,
    /// Ephemeral sessions come from `/agent/run` and close after one turn.
    pub ephemeral: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Which sessions a listing returns. The default selects all of them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionFilter {
    /// Only this owner's; `None` is every owner's.
    pub owner: Option<String>,
    pub status: Option<SessionStatus>,
    pub kind: Option<SessionKind>,
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

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store I/O: {0}")]
    Io(String),
    #[error("store data is corrupt: {0}")]
    Corrupt(String),
    #[error("the store is closed")]
    Closed,
}

#[async_trait]
pub trait Store: Send + Sync {
    async fn create_session(&self, session: &SessionRecord) -> Result<(), StoreError>;

    /// Saves status, usage and `updated_at`.
    async fn update_session(
        &self,
        id: Uuid,
        status: SessionStatus,
        usage: &Usage,
    ) -> Result<(), StoreError>;

    async fn get_session(&self, id: Uuid) -> Result<Option<SessionRecord>, StoreError>;

    /// The sessions `filter` selects, newest first.
    async fn list_sessions(&self, filter: &SessionFilter)
    -> Result<Vec<SessionRecord>, StoreError>;

    /// Closed ephemeral sessions last updated before `cutoff`, oldest
    /// first, at most `limit`: those the retention removes.
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

    /// Removes the session with its messages and events; false if unknown.
    async fn delete_session(&self, id: Uuid) -> Result<bool, StoreError>;

    /// Appends to the conversation history, in order.
    async fn append_messages(&self, id: Uuid, messages: &[Message]) -> Result<(), StoreError>;

    async fn messages(&self, id: Uuid) -> Result<Vec<Message>, StoreError>;

    /// Appends events, all or none. When this returns they survive a crash
    /// of the process, so they may be sent to clients.
    async fn append_events(&self, events: &[Event]) -> Result<(), StoreError>;

    /// Events with `seq > since`, in order, at most `limit`.
    async fn events_since(
        &self,
        id: Uuid,
        since: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError>;

    /// The highest `seq` of the session, 0 when it has none.
    async fn last_seq(&self, id: Uuid) -> Result<u64, StoreError>;

    /// Writes out everything accepted so far and stops taking writes.
    async fn close(&self) -> Result<(), StoreError>;
}
