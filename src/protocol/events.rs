//! The events of a session's log, as `docs/api.md` defines them.
//!
//! Every event is one JSON object `{"type", "session_id", "seq", "ts", …}`;
//! `seq` is dense per session and starts at 1.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

/// One entry of a session's append-only event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Event {
    #[serde(flatten)]
    pub kind: EventKind,
    pub session_id: Uuid,
    pub seq: u64,
    pub ts: DateTime<Utc>,
}

impl Event {
    /// True for the event that closes a turn.
    pub fn ends_turn(&self) -> bool {
        matches!(self.kind, EventKind::Result { .. })
    }
}

/// What happened; serialized with its `type` tag.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, strum::IntoStaticStr)]
#[serde(tag = "type", rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum EventKind {
    /// Progress of the server itself ("Starting agent...").
    Status { message: String },
    /// A complete piece of assistant text.
    Thinking { content: String },
    /// One streamed token chunk; only sent when the session opted in.
    TextDelta { content: String },
    /// The model asked for a tool.
    ToolUse {
        id: String,
        tool: String,
        input: Value,
    },
    /// Output of a running tool, as it comes (rate-limited and capped; the
    /// `tool_result` has all of it).
    ToolOutput {
        id: String,
        stream: String,
        content: String,
    },
    /// What the tool returned.
    ToolResult {
        id: String,
        tool: String,
        output: Value,
        is_error: bool,
    },
    /// The end of a turn; exactly one per turn.
    Result {
        status: ResultStatus,
        result: Option<String>,
        cost_usd: f64,
        /// False when a model of the turn has no price: `cost_usd` then
        /// counts only the priced calls.
        cost_known: bool,
        turns: u32,
        usage: Usage,
        duration_ms: u64,
    },
    /// Something went wrong; a `result` with status `error` follows.
    Error { message: String, code: String },
}

impl EventKind {
    /// The `type` of the event on the wire (the same names serde writes).
    pub fn type_name(&self) -> &'static str {
        self.into()
    }
}

/// How a turn ended.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ResultStatus {
    Success,
    Error,
    Interrupted,
    MaxTurns,
    BudgetExceeded,
    /// The turn ran past `agent.turn_timeout_s`.
    TimedOut,
}

impl ResultStatus {
    /// The status as the wire writes it.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Token and cost accounting, per turn and per session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
    pub turns: u64,
    pub tool_calls: u64,
}

impl Usage {
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cost_usd += other.cost_usd;
        self.turns += other.turns;
        self.tool_calls += other.tool_calls;
    }
}
