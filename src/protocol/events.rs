//! The events of a session's log, as `docs/api.md` defines them.
//!
//! Every event is one JSON object `{"type", "session_id", "seq", "ts", …}`;
//! `seq` is dense per session and starts at 1.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::deliberation::{Aggregate, Decision, DeliberationStatus, Proposal};
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
    /// The agent of a deliberation the event is about: its `agent_started`,
    /// `agent_completed`, `agent_failed`, and a tool-using agent's own
    /// `tool_use`, `tool_result` ….
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
}

impl Event {
    /// True for the event that closes a turn.
    pub fn ends_turn(&self) -> bool {
        matches!(self.kind, EventKind::Result { .. })
    }

    /// Event `seq` of the nil session, now, of no agent (unit tests).
    #[cfg(test)]
    pub(crate) fn at(seq: u64, kind: EventKind) -> Event {
        Event {
            kind,
            session_id: Uuid::nil(),
            seq,
            ts: Utc::now(),
            agent_id: None,
        }
    }
}

/// Files of the workspace a turn added, modified (contents, size, kind or
/// modification time) and deleted, `.git/` left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FilesChanged {
    pub added: u64,
    pub modified: u64,
    pub deleted: u64,
}

/// A model's context window and how much of it a request took.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ContextUse {
    /// The window, in tokens.
    pub window: u64,
    /// Where the window comes from: `config` (`models.NAME.context_window`),
    /// `provider` (what the model's server reports), `builtin` (the
    /// table of known models) or `default` (`agent.context_window`).
    pub window_source: String,
    /// The input tokens of the last request (as the provider reported
    /// them, else as estimated).
    pub input_tokens: u64,
    /// `input_tokens / window`.
    pub fill: f64,
}

/// What happened; serialized with its `type` tag.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Serialize,
    Deserialize,
    ToSchema,
    strum::IntoStaticStr,
    strum::VariantNames,
)]
#[serde(tag = "type", rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum EventKind {
    /// Progress of the server itself ("Starting agent...").
    Status { message: String },
    /// A complete piece of assistant text; with `reasoning`, the model's
    /// reasoning before it (`reasoning_content`, Anthropic's thinking).
    Thinking {
        content: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        reasoning: bool,
    },
    /// One streamed token chunk, of the text or (`reasoning`) of the
    /// reasoning; only sent when the session opted in.
    TextDelta {
        content: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        reasoning: bool,
    },
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
    /// What the model's harness did on its own (`models.NAME.harness =
    /// "small"`): a call read from the reply's text, a name resolved, a
    /// reply cut, an answer asked for or settled on … The strict harness
    /// sends none.
    Intervention {
        kind: InterventionKind,
        detail: String,
    },
    /// A tool call waits for a decision (`options.permissions`): a person
    /// answers it before `expires_at` or it is denied.
    ApprovalRequested {
        call_id: String,
        tool: String,
        input: Value,
        reason: String,
        expires_at: DateTime<Utc>,
    },
    /// How a call that needed a decision was decided, and by whom
    /// (`user`, `admin`, `hook`, `timeout`, `interrupt`).
    ApprovalDecided {
        call_id: String,
        decision: Approval,
        by: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
        /// The input the call runs with, when the decision edited it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input: Option<Value>,
        /// The allow rule the decision added for the rest of the session.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        remembered: Option<String>,
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
        /// How many messages the session's history held when the turn
        /// ended (agent sessions): a fork at this turn keeps that many.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        history_len: Option<u64>,
        /// What the turn's tool calls did to the workspace's files (agent
        /// sessions with a sandbox; absent where it could not be told).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        files_changed: Option<FilesChanged>,
        /// How full the model's context window was at the turn's last
        /// model call (agent sessions that called a model).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        context: Option<ContextUse>,
    },
    /// The older part of the history sent to the model was replaced by a
    /// summary (`reason`: `auto` before a call past `agent.compact_at` of
    /// the window, `context_error` after a provider refused a call as too
    /// long, `request` for `POST …/compact`). Tokens are the request's
    /// size before and after, as estimated; the stored history keeps
    /// every message.
    Compacted {
        reason: String,
        before_tokens: u64,
        after_tokens: u64,
        messages_summarised: u64,
    },
    /// Something went wrong; a `result` with status `error` follows.
    Error { message: String, code: String },
    /// A deliberation began (its agents start next).
    DeliberationStarted {
        task_id: Uuid,
        role: String,
        num_agents: u32,
        rounds: u32,
        aggregate: Aggregate,
    },
    /// A critique round began (round 0 is the first proposals).
    RoundStarted { task_id: Uuid, round: u32 },
    /// An agent of the deliberation started working on the round.
    AgentStarted {
        role: String,
        round: u32,
        model: String,
    },
    /// An agent's proposal, as the collector received it.
    AgentCompleted {
        role: String,
        round: u32,
        proposal: Proposal,
        duration_ms: u64,
    },
    /// An agent failed the round (`timeout`, `budget_exceeded`, an error).
    AgentFailed {
        role: String,
        round: u32,
        error: String,
        duration_ms: u64,
    },
    /// What the judge or the vote decided.
    Decision {
        #[serde(flatten)]
        decision: Decision,
    },
    /// A pipeline's node began (`step` counts the run's nodes from 1).
    NodeStarted {
        node: String,
        step: u64,
        /// The node is answered by a mock agent (test mode, or the run's
        /// `mock` option), not a model.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        mock: bool,
    },
    /// A node answered; its checkpoint follows.
    NodeCompleted {
        node: String,
        decision: String,
        step: u64,
        duration_ms: u64,
    },
    /// A node's answer could not be used (malformed, a decision it may not
    /// give); it runs again within its limit.
    NodeFailed {
        node: String,
        error: String,
        attempt: u32,
    },
    /// The pipeline goes from one node to the next.
    Route {
        from: String,
        to: String,
        reason: String,
    },
    /// The run's state after `step` is stored: a resume starts after it.
    Checkpoint { step: u64, node: String },
    /// Files a client put into the session's workspace between turns
    /// (`PUT /agent/session/{id}/workspace` or `…/files/{path}`), or a
    /// clone of `options.workspace.git` (`source`: its URL and ref): where,
    /// how many files and links, and the bytes of their contents.
    WorkspaceUploaded {
        path: String,
        files: u64,
        bytes: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source: Option<String>,
    },
    /// The first event of a session forked from another: the source and
    /// the seq of the turn end it was forked at; for an agent session,
    /// how many messages of the source's history it carries.
    Forked {
        from_session: Uuid,
        at_seq: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        history_len: Option<u64>,
    },
    /// The session was rewound to the turn end `to_seq` (or an upload
    /// between turns after it, a point of its own): its history is
    /// cut back to the `history_len` messages it had there, and the turns
    /// after it are left out of what the next turn sees (the log keeps
    /// them). `workspace` says whether the sandbox's files went back too
    /// (`restored`) or stay as the last turn left them (`kept`).
    Rewound {
        to_seq: u64,
        history_len: u64,
        workspace: String,
    },
    /// The run is over: `completed` or `failed` (with the reason).
    PipelineCompleted {
        thread_id: String,
        status: String,
        reason: Option<String>,
        steps: u64,
    },
    /// Every agent answered, or the deadline, budget or an interrupt ended it.
    DeliberationCompleted {
        task_id: Uuid,
        status: DeliberationStatus,
        total_agents: u32,
        successful_responses: u32,
        reason: Option<String>,
        duration_ms: u64,
    },
}

/// A decision on a call that waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    Allow,
    Deny,
}

impl EventKind {
    /// The `type` of the event on the wire (the same names serde writes).
    pub fn type_name(&self) -> &'static str {
        self.into()
    }
}

/// The kinds of [`EventKind::Intervention`].
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum InterventionKind {
    /// Calls were read out of the reply's text.
    CallRecovered,
    /// Arguments that were not a JSON object were read as one.
    ArgumentsRepaired,
    /// Arguments were brought to the tool's schema.
    ArgumentsCoerced,
    /// A tool name that is not offered was taken as one that is.
    NameResolved,
    /// The reply was cut while streaming: it looped.
    ReplyCut,
    /// The reply was empty, or repeated a call that failed twice: it was
    /// not kept, and the model was asked again.
    ReplyDiscarded,
    /// A reply that looked like an unreadable call: the model was told the
    /// format and asked again.
    FormatExplained,
    /// The model was asked for its answer, offered no tools.
    AnswerAsked,
    /// The model was asked for a fix after a call failed the same way twice.
    FixAsked,
    /// Calls of a reply were not run.
    CallsSkipped,
    /// A repeated read was answered from its earlier output, not run.
    RepeatAnswered,
    /// The harness took an output as the turn's answer.
    AnswerSettled,
    /// A Python cell was run with repairs.
    CellRepaired,
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
    /// Every input token, those read from or written to a prompt cache
    /// included.
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Of `input_tokens`, those the provider read from its prompt cache
    /// (absent when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_read_tokens: u64,
    /// Of `input_tokens`, those the provider wrote to its prompt cache
    /// (absent when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
    pub cost_usd: f64,
    pub turns: u64,
    pub tool_calls: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_read_tokens += other.cache_read_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
        self.cost_usd += other.cost_usd;
        self.turns += other.turns;
        self.tool_calls += other.tool_calls;
    }

    /// Counts one model call's tokens.
    pub fn count(&mut self, tokens: &Tokens) {
        self.input_tokens += tokens.input;
        self.output_tokens += tokens.output;
        self.cache_read_tokens += tokens.cache_read;
        self.cache_write_tokens += tokens.cache_write;
    }
}

/// What one model call took and gave, as its provider counted it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    /// Every input token, cached or not.
    pub input: u64,
    pub output: u64,
    /// Of `input`, read from the provider's prompt cache.
    pub cache_read: u64,
    /// Of `input`, written to the provider's prompt cache.
    pub cache_write: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every event is stored as its JSON and read back: the envelope's
    /// fields and a kind's must not collide.
    #[test]
    fn deliberation_events_read_back_as_written() {
        let proposal = Proposal {
            content: "def f(): pass".into(),
            author_id: "agent-dev-001".into(),
            author_role: "dev".into(),
        };
        let kinds = [
            EventKind::AgentStarted {
                role: "dev".into(),
                round: 0,
                model: "demo".into(),
            },
            EventKind::AgentCompleted {
                role: "dev".into(),
                round: 1,
                proposal: proposal.clone(),
                duration_ms: 5,
            },
            EventKind::Decision {
                decision: Decision {
                    method: Aggregate::Vote,
                    choice: "agent-dev-001".into(),
                    content: proposal.content.clone(),
                    reasoning: "2 of 3".into(),
                    votes: Some(serde_json::json!({"agent-dev-001": 2})),
                },
            },
            EventKind::ToolUse {
                id: "t1".into(),
                tool: "Bash".into(),
                input: serde_json::json!({"command": "ls"}),
            },
        ];
        for kind in kinds {
            let event = Event {
                kind,
                session_id: Uuid::new_v4(),
                seq: 3,
                ts: Utc::now(),
                agent_id: Some("agent-dev-001".into()),
            };
            let json = serde_json::to_string(&event).unwrap();
            let back: Event = serde_json::from_str(&json).unwrap();
            assert_eq!(back, event, "{json}");
            let written: serde_json::Value = serde_json::from_str(&json).unwrap();
            assert_eq!(written["type"], event.kind.type_name(), "{json}");
        }
    }

    /// The store keeps an event's `type` as [`EventKind::type_name`] says
    /// it, beside the body serde writes: both name every kind alike.
    #[test]
    fn every_kind_is_named_as_serde_tags_it() {
        use strum::VariantNames;
        let refused = serde_json::from_str::<EventKind>(r#"{"type": "no_such_kind"}"#)
            .unwrap_err()
            .to_string();
        let (_, expected) = refused.split_once("expected one of ").expect(&refused);
        let tags: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        assert_eq!(tags, EventKind::VARIANTS, "{refused}");
    }
}
