//! The seam between the turn loop and whatever executes tools.
//!
//! The turn loop only knows [`ToolRouter`]; the sandbox's tools
//! ([`crate::tools::AgentTools`]) plug in behind it. [`NoTools`] is the router of a server that has none.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::options::AgentOptions;
use crate::model::ToolSpec;
use crate::session::SessionError;

/// The names of the sandbox's tools as the agent is offered them; a
/// session's external MCP servers add `mcp__{server}__{tool}`.
pub const SANDBOX_TOOLS: [&str; 8] = [
    "Read",
    "Write",
    "Edit",
    "Glob",
    "Grep",
    "Bash",
    "mcp__sandbox__execute_code",
    "mcp__sandbox__execute_shell",
];

/// Who is calling a tool.
#[derive(Debug, Clone)]
pub struct ToolContext {
    pub session_id: Uuid,
    pub options: Arc<AgentOptions>,
    /// The key that owns the session (`None` when auth is off): the
    /// session's sandbox counts in its `max_sandboxes`.
    pub owner: Option<String>,
}

/// What [`ToolRouter::seed_workspace`] put into the workspace.
#[derive(Debug, Clone, PartialEq)]
pub struct Seeded {
    pub path: String,
    /// Files and links, and the bytes of their contents.
    pub files: u64,
    pub bytes: u64,
    /// Where they came from (a git URL and ref).
    pub source: String,
}

/// What a tool returned, as it goes into the `tool_result` event.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub output: Value,
    pub is_error: bool,
}

impl ToolOutput {
    pub fn error(message: impl Into<String>) -> ToolOutput {
        ToolOutput {
            output: Value::String(message.into()),
            is_error: true,
        }
    }
}

/// The stream of a [`ToolChunk`] that is a note about where the call runs
/// (its session's workspace was lost), shown as a `status` event.
pub const STATUS_STREAM: &str = "status";

/// Output a tool printed while it runs; becomes a `tool_output` event
/// (a `status` event on [`STATUS_STREAM`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolChunk {
    /// `stdout`, `stderr`, or `info` for a note such as a count of output
    /// not shown.
    pub stream: String,
    pub content: String,
}

#[async_trait]
pub trait ToolRouter: Send + Sync {
    /// The tools this session may be offered, before `allowed_tools` filters.
    async fn specs(&self, ctx: &ToolContext) -> Vec<ToolSpec>;

    /// Runs one tool call. Cancelling `cancel` must stop it promptly.
    async fn call(
        &self,
        ctx: &ToolContext,
        name: &str,
        input: Value,
        cancel: CancellationToken,
    ) -> ToolOutput;

    /// Runs one tool call, sending what it prints meanwhile to `output`
    /// (dropped when the receiver is slow). Routers whose tools print
    /// nothing as they go need not implement it.
    async fn call_with_output(
        &self,
        ctx: &ToolContext,
        name: &str,
        input: Value,
        cancel: CancellationToken,
        _output: tokio::sync::mpsc::Sender<ToolChunk>,
    ) -> ToolOutput {
        self.call(ctx, name, input, cancel).await
    }

    /// Where `path` (absolute) leads once links are followed, as the
    /// session's sandbox resolves it: what path rules are checked on.
    /// `None` for routers without a file system of their own.
    async fn resolve_path(
        &self,
        _ctx: &ToolContext,
        _path: &str,
        _cancel: CancellationToken,
    ) -> Option<Result<String, String>> {
        None
    }

    /// Puts what `options.workspace` names (a git clone) into the session's
    /// workspace, before its first turn's model call: what went in, or
    /// `None` when the options name nothing. The error says why, naming
    /// the source.
    async fn seed_workspace(
        &self,
        _ctx: &ToolContext,
        _cancel: CancellationToken,
    ) -> Result<Option<Seeded>, String> {
        Ok(None)
    }

    /// What the turn that is ending did to the session's workspace files,
    /// told before its `result`; `None` where these tools cannot tell.
    async fn turn_changes(&self, _ctx: &ToolContext) -> Option<crate::protocol::FilesChanged> {
        None
    }

    /// Refuses options these tools cannot honour before the session exists
    /// (e.g. sandbox limits outside the configured bounds), naming the option.
    async fn check_options(&self, _options: &AgentOptions) -> Result<(), SessionError> {
        Ok(())
    }

    /// Takes over the session's sandbox that another replica made and
    /// can no longer serve; true when there was one to take (its
    /// workspace is kept), false when the session starts afresh here.
    async fn adopt(&self, _session_id: Uuid) -> bool {
        false
    }

    /// A turn of the session ended at `seq` (its `result`): snapshot the
    /// workspace for forks. Returns once the snapshot is under way where
    /// the sandbox is (readers wait for it); the work runs on its own.
    async fn turn_ended(&self, _session_id: Uuid, _owner: Option<&str>, _seq: u64) {}

    /// The session is being rewound to the turn end `seq`: its next
    /// sandbox starts from the workspace it had there, and the one it has
    /// now goes. True when the files go back (`restored`), false when they
    /// stay as the last turn left them (`kept`: that turn end's workspace
    /// is no longer kept, or these tools keep none).
    async fn rewind_workspace(&self, _session_id: Uuid, _seq: u64) -> bool {
        false
    }

    /// Waits until the snapshots of the session's turn ends under way are
    /// recorded, wherever its sandbox is, so a fork or a download right
    /// after a turn finds its turn end.
    async fn snapshots_settled(&self, _session_id: Uuid) {}

    /// Makes the session's live workspace this replica's to read and
    /// write outside a turn (an upload, a download), as a tool call would.
    async fn hold_workspace(&self, _session_id: Uuid) -> Result<(), NotHeldHere> {
        Ok(())
    }

    /// Frees what the session holds (its sandbox) when its last turn is over.
    async fn release(&self, _session_id: Uuid) {}

    /// As [`ToolRouter::release`], for a session made on this replica by
    /// its one turn, which ran here: what it holds is here or nowhere.
    async fn release_made_here(&self, session_id: Uuid) {
        self.release(session_id).await;
    }

    /// Frees what the session holds when it is deleted, including what
    /// another process made for it (a sandbox `conclave mcp` created).
    async fn delete(&self, session_id: Uuid) {
        self.release(session_id).await;
    }
}

/// Why a replica cannot reach a session's live workspace.
#[derive(Debug, Clone, PartialEq)]
pub enum NotHeldHere {
    /// This replica, still serving, holds the session's sandbox.
    Replica(String),
    /// Who holds it could not be found out: the store failed.
    Unknown(String),
}

impl std::fmt::Display for NotHeldHere {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotHeldHere::Replica(replica) => {
                write!(f, "the session's sandbox is on replica {replica}")
            }
            NotHeldHere::Unknown(why) => {
                write!(
                    f,
                    "where the session's sandbox is cannot be told now: {why}"
                )
            }
        }
    }
}

/// A router without tools.
pub struct NoTools;

#[async_trait]
impl ToolRouter for NoTools {
    async fn specs(&self, _ctx: &ToolContext) -> Vec<ToolSpec> {
        Vec::new()
    }

    async fn call(
        &self,
        _ctx: &ToolContext,
        name: &str,
        _input: Value,
        _cancel: CancellationToken,
    ) -> ToolOutput {
        ToolOutput::error(format!("unknown tool '{name}'"))
    }
}
