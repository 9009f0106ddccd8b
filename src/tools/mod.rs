//! The sandbox's tools, called directly.
//!
//! One registry, one file per tool family, each tool a function taking its
//! typed arguments and an [`Invocation`] (the sandbox it acts in, its cancel
//! token, where its output goes as it prints):
//!
//! - [`exec`]: `execute_code`, `execute_shell` and the background runs
//!   ([`background`]) they start;
//! - [`files`]: `read_file`, `write_file`, `edit_file`, `list_files`,
//!   `glob`, `grep`;
//! - [`schema`]: their arguments and results;
//! - [`place`]: which sandbox a call acts in, and with what limits;
//! - [`output`]: what a running command prints, paced, to whoever follows
//!   the call.
//!
//! Two callers use it. The agent's [`agent::AgentTools`] maps Claude Code's
//! built-in tools onto it and adds a session's own MCP servers
//! ([`external`]) and A2A agents; among replicas [`remote`] carries a call
//! to the replica that holds the session's sandbox. The MCP server for IDEs
//! ([`crate::mcp::server`]) is an adapter: it resolves the `session_id` an
//! IDE names into a [`place::Place`] and calls the same functions.

pub mod agent;
pub mod background;
pub mod changed;
pub mod exec;
pub mod external;
pub mod files;
pub mod git;
pub mod output;
pub mod place;
pub mod remote;
pub mod schema;
mod traced_http;
pub mod transfer;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::sandbox::{Lease, SandboxError, SandboxManager};

pub use agent::AgentTools;
pub use place::Place;

/// Bytes of each output stream an execution returns.
pub const MAX_OUTPUT_BYTES: usize = 1024 * 1024;
/// Entries a listing, glob or grep returns.
pub const MAX_ENTRIES: usize = 2000;

/// What the tools act on, shared by every caller.
pub struct Toolbox {
    pub sandboxes: Arc<SandboxManager>,
    /// Bytes of each output stream an execution returns.
    pub max_output_bytes: usize,
    /// Entries a listing, glob or grep returns.
    pub max_entries: usize,
    /// Commands started with `background: true`.
    pub background: background::BackgroundRuns,
    /// What each session's turn found in the workspace, for its result's
    /// `files_changed`.
    pub baselines: changed::Baselines,
}

/// One call: where it acts, how it is stopped, who follows its output.
pub struct Invocation {
    pub place: Place,
    /// Stops the call; a command it runs is killed, its whole process tree.
    pub cancel: CancellationToken,
    /// Where a command's output goes while it runs, paced
    /// ([`output::Reporter`]); `None` when nobody follows it.
    pub output: Option<Arc<dyn output::Progress>>,
    /// A trace context the call continues (an MCP request's `_meta`); a
    /// direct call runs in its caller's span and needs none.
    pub trace: Option<serde_json::Map<String, serde_json::Value>>,
}

impl Invocation {
    /// A tool's result as its caller may see it: the session's secrets
    /// taken out of every string in it.
    pub fn clean<T>(&self, result: Result<T, ToolError>) -> Result<T, ToolError>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        let scrubber = self.place.scrubber();
        if scrubber.is_empty() {
            return result;
        }
        match result {
            Ok(value) => {
                let mut json = serde_json::to_value(&value)
                    .map_err(|e| ToolError(format!("reading a result: {e}")))?;
                scrubber.scrub_value(&mut json);
                serde_json::from_value(json)
                    .map_err(|e| ToolError(format!("reading a result: {e}")))
            }
            Err(e) => Err(ToolError(scrubber.scrub(&e.0))),
        }
    }
}

/// A tool's own failure (a path that escapes, an edit that does not match,
/// a sandbox that cannot start): the caller reads the message and can act
/// on it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolError(pub String);

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<SandboxError> for ToolError {
    fn from(e: SandboxError) -> Self {
        match e {
            SandboxError::InvalidPath(m) | SandboxError::File(m) => ToolError(m),
            SandboxError::Capacity(_) | SandboxError::ImageNotFound(_) | SandboxError::Quota(_) => {
                ToolError(e.to_string())
            }
            other => {
                tracing::warn!(error = %other, "sandbox tool failed");
                ToolError(other.to_string())
            }
        }
    }
}

impl Toolbox {
    pub fn new(sandboxes: Arc<SandboxManager>) -> Toolbox {
        Toolbox {
            sandboxes,
            max_output_bytes: MAX_OUTPUT_BYTES,
            max_entries: MAX_ENTRIES,
            background: Default::default(),
            baselines: Default::default(),
        }
    }

    /// The longest exec timeout a call may ask for.
    pub fn max_timeout_s(&self) -> u64 {
        self.sandboxes.config().max_exec_timeout_s
    }

    /// The exec timeout a call asked for, within the configured bounds.
    pub fn timeout(&self, asked: Option<u64>) -> Result<Duration, ToolError> {
        let config = self.sandboxes.config();
        match asked {
            None => Ok(Duration::from_secs(config.exec_timeout_s)),
            Some(0) => Err(ToolError("timeout must be at least 1 second".into())),
            Some(s) if s > config.max_exec_timeout_s => Err(ToolError(format!(
                "timeout must be at most {} seconds",
                config.max_exec_timeout_s
            ))),
            Some(s) => Ok(Duration::from_secs(s)),
        }
    }

    /// Takes the sandbox a call acts in, making it when it is not there.
    pub async fn lease(&self, place: &Place) -> Result<Lease, ToolError> {
        place
            .lease(&self.sandboxes)
            .await
            .map_err(|e| ToolError(e.to_string()))
    }
}

/// Text from a command's bytes; bytes that are not UTF-8 are replaced.
fn lossy(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}
