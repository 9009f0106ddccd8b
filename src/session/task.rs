//! The seam between the session machinery and what a session runs (after
//! codex-rs's session tasks): a [`SessionTask`] runs one turn of its kind;
//! the machinery around it is the same for every kind.
//!
//! The machinery owns the turn lock and `queue`, interrupts, the turn's
//! wall-clock limit, the closing `result` event, the session's status and
//! usage, and the turns a crash cut off. A task owns its options (their
//! type, validation and stored JSON) and the events of the turn between its
//! first `status` and its `result`.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::SessionError;
use super::live::Session;
use crate::protocol::{ResultStatus, SessionKind, SessionStatus, Usage};
use crate::store::StoreError;

/// One kind of session: validates its options and runs its turns.
#[async_trait]
pub trait SessionTask: Send + Sync + 'static {
    /// The `kind` clients name when they create such a session.
    fn kind(&self) -> SessionKind;

    /// Validates the options of a create request (the whole JSON body:
    /// options may be nested under `options` or flat; `fields` are the
    /// other top-level fields the route takes) and returns them as they
    /// are stored with the session. An invalid one is a
    /// [`SessionError::Option`] naming it.
    async fn options(
        &self,
        body: &Map<String, Value>,
        fields: &[&str],
    ) -> Result<Value, SessionError>;

    /// What the session's status shows besides the common fields (e.g. the
    /// agent's resolved model).
    fn describe(&self, _options: &Value) -> Map<String, Value> {
        Map::new()
    }

    /// Ready-made agents of this kind besides its plain self, each named
    /// `KIND:NAME` where clients address agents by name (a pipeline: one
    /// per definition the server loaded).
    fn presets(&self) -> Vec<Preset> {
        Vec::new()
    }

    /// Runs one turn on `input` until it ends: emits its events to
    /// `turn.session` and adds what it spends to `turn.usage`. The
    /// machinery has already emitted nothing and will emit the `result`;
    /// a store failure ends the turn early.
    async fn run(&self, turn: &mut Turn, input: String) -> Result<Outcome, StoreError>;

    /// Leaves the state of a turn a crash cut off (no `result` stored)
    /// consistent for the next one, before the machinery closes it as
    /// `interrupted`.
    async fn close_cut_off(&self, _session: &Arc<Session>) -> Result<(), StoreError> {
        Ok(())
    }

    /// Whether a turn cut off by the death of the replica running it
    /// starts again on the replica that closed it (a pipeline goes on
    /// after its last checkpoint); otherwise it stays closed as
    /// `interrupted` until the next message.
    fn resumes_when_cut_off(&self) -> bool {
        false
    }

    /// Called once a turn's `result` (at `seq`) is written, before a
    /// client can read it or the next turn can start: the agent starts the
    /// snapshot of the session's workspace here. Whatever it does at
    /// length must not hold the caller.
    async fn turn_ended(&self, _session: &Arc<Session>, _seq: u64) {}

    /// The session is being rewound to the turn end `seq` (the caller
    /// holds its turn): true when its workspace goes back to what it was
    /// there (`restored`), false when it stays as it is (`kept`).
    async fn rewind_workspace(&self, _session: &Arc<Session>, _seq: u64) -> bool {
        false
    }

    /// Frees what an ephemeral session held once its one turn is over.
    async fn release(&self, _session: Uuid) {}

    /// As [`SessionTask::release`], from the replica that made the session
    /// and ran its one turn: what it holds is here or nowhere.
    async fn release_made_here(&self, session: Uuid) {
        self.release(session).await;
    }

    /// Frees everything the session holds; it is being deleted.
    async fn delete(&self, _session: Uuid) {}
}

/// A ready-made agent a session kind offers: a name within the kind, what
/// it does, and the options its sessions start with.
#[derive(Debug, Clone, PartialEq)]
pub struct Preset {
    pub name: String,
    pub description: String,
    pub options: Map<String, Value>,
}

/// How a turn ended, before it becomes the `result` event.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub status: ResultStatus,
    pub text: Option<String>,
}

impl Outcome {
    pub fn new(status: ResultStatus, text: Option<String>) -> Outcome {
        Outcome { status, text }
    }
}

/// A running turn, as its task sees it.
pub struct Turn {
    pub session: Arc<Session>,
    /// Cancelled by an interrupt, a shutdown or the turn's time limit.
    pub cancel: CancellationToken,
    /// What the turn has spent so far; the task adds to it.
    pub usage: Usage,
    /// False once a model call of the turn had no price: `cost_usd` then
    /// counts only the priced ones.
    pub cost_known: bool,
    /// What this turn changes from the session's options.
    pub options: TurnOptions,
    /// The messages in the session's history once the turn is over, set
    /// by a task that keeps one; its `result` carries it for forks.
    pub history_len: Option<u64>,
    /// What the turn's tool calls did to the workspace, set by a task
    /// that can tell; its `result` carries it.
    pub files_changed: Option<crate::protocol::FilesChanged>,
    /// How full the model's context window was at the turn's last model
    /// call, set by a task that calls models; its `result` carries it.
    pub context: Option<crate::protocol::ContextUse>,
    /// The session's usage before the turn.
    pub(super) before: Usage,
}

/// What one turn may change from its session's options, set by a caller
/// inside the server (a pipeline node's turn of the run's agent session):
/// another model, and fewer tools. Kinds without models or tools ignore it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TurnOptions {
    /// The model of this turn instead of the session's.
    pub model: Option<String>,
    /// Only these of the session's tools, for this turn.
    pub allowed_tools: Option<Vec<String>>,
    /// The session this turn runs for and the agent (or node) it is
    /// there: its calls that wait for a decision say so, and the parent
    /// session's owner can decide them through the parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_behalf_of: Option<OnBehalfOf>,
    /// Tools a client runs itself (AG-UI's front-end tools), offered for
    /// this turn besides the session's (one of the same name takes its
    /// place). A call of one ends the turn with the call unanswered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_tools: Vec<crate::model::ToolSpec>,
    /// The client's answers to the calls the previous turn left
    /// unanswered; the turn starts from them (with no prompt, when it has
    /// none). A call left without an answer is answered as an error.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_answers: Vec<ToolAnswer>,
    /// Before the turn starts, rewind the session to its last turn end at
    /// or before this seq (the turns after it are undone: LangGraph's
    /// `rollback`). Read where the turn is started, never by the task.
    #[serde(skip)]
    pub rewind_to: Option<u64>,
    /// The turn only compacts the history (`POST …/compact`): no prompt,
    /// no tool call; kinds without a history end it at once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compact: bool,
}

/// A client's answer to a call of one of its tools.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ToolAnswer {
    pub call_id: String,
    pub content: String,
    pub is_error: bool,
}

/// The parent session and agent id of a child session's turn.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OnBehalfOf {
    pub parent: Uuid,
    pub agent_id: String,
}

impl Turn {
    pub(super) fn starting(
        session: &Arc<Session>,
        cancel: CancellationToken,
        options: TurnOptions,
    ) -> Turn {
        Turn {
            session: session.clone(),
            cancel,
            options,
            usage: Usage::default(),
            cost_known: true,
            history_len: None,
            files_changed: None,
            context: None,
            before: session.usage(),
        }
    }

    /// The session's usage with this turn's so far added.
    pub fn session_total(&self) -> Usage {
        let mut total = self.before.clone();
        total.add(&self.usage);
        total
    }

    /// Saves the usage so far with the session (status stays `running`),
    /// so a status read during the turn shows it: in memory now, in the
    /// store with the turn's next events. Fails once the log has stopped.
    pub fn save_usage(&self) -> Result<(), StoreError> {
        self.session
            .stage_state(SessionStatus::Running, Some(&self.session_total()))
    }
}

/// The kinds a server runs, by name.
#[derive(Clone, Default)]
pub struct Tasks {
    by_kind: BTreeMap<String, Arc<dyn SessionTask>>,
}

impl Tasks {
    pub fn new() -> Tasks {
        Tasks::default()
    }

    /// Adds a kind; a second task of the same kind replaces the first.
    pub fn with(mut self, task: Arc<dyn SessionTask>) -> Tasks {
        self.by_kind.insert(task.kind().as_str().to_owned(), task);
        self
    }

    pub fn get(&self, kind: &str) -> Option<&Arc<dyn SessionTask>> {
        self.by_kind.get(kind)
    }

    /// The kinds, sorted: for error messages that list what exists.
    pub fn kinds(&self) -> Vec<&str> {
        self.by_kind.keys().map(String::as_str).collect()
    }

    /// The task of `kind`, or an error naming `field` and the kinds that exist.
    pub fn require(&self, kind: &str, field: &str) -> Result<&Arc<dyn SessionTask>, SessionError> {
        self.get(kind).ok_or_else(|| {
            SessionError::Option(super::OptionError::new(
                field,
                format!(
                    "unknown session kind {kind:?}; this server runs {}",
                    self.kinds().join(", ")
                ),
            ))
        })
    }
}
