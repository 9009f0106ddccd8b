//! What clients see of a session: its kind, its status and its record.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;
use uuid::Uuid;

use super::events::Usage;

/// What a session runs: the name of the task kind that serves its turns
/// (`agent`, and the kinds later issues add). Open-ended, so a kind is
/// added by registering its task, with no change here.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(transparent)]
#[schema(value_type = String, example = "agent")]
pub struct SessionKind(Cow<'static, str>);

impl SessionKind {
    pub const AGENT: SessionKind = SessionKind::named("agent");

    pub const fn named(name: &'static str) -> SessionKind {
        SessionKind(Cow::Borrowed(name))
    }

    pub fn new(name: impl Into<String>) -> SessionKind {
        SessionKind(Cow::Owned(name.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for SessionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
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

/// A session as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    pub id: Uuid,
    pub name: Option<String>,
    pub kind: SessionKind,
    /// Hash of the API key that created it; `None` when auth is off.
    pub owner: Option<String>,
    /// The session's options as its kind's task validated them.
    pub options: Value,
    pub status: SessionStatus,
    pub usage: Usage,
    /// Ephemeral sessions come from `/agent/run` and close after one turn.
    pub ephemeral: bool,
    /// The protocol adapter that made it ([`ORIGINS`]); `None` for
    /// Conclave's own API, the dashboard and MCP.
    pub origin: Option<String>,
    /// A client's own labels (a LangGraph thread's metadata), merged by
    /// `PATCH /langgraph/threads/{id}`; Conclave reads none of them.
    pub metadata: Map<String, Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// The protocol adapters that make sessions of their own, by the name a
/// session's `origin` and the sessions list's `origin` filter use.
pub const ORIGINS: [&str; 3] = ["a2a", "agui", "langgraph"];

/// The `origin` filter's name for the sessions no adapter made.
pub const OWN_ORIGIN: &str = "conclave";
