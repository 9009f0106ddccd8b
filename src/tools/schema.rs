//! The sandbox tools' parameters and results, as the MCP server offers
//! them (their JSON Schemas are derived from these types) and as the
//! agent's calls build them.
//!
//! `session_id` is the MCP caller's way to name a sandbox; a call made
//! directly names it in its [`super::Invocation`] and leaves the field empty.

use schemars::JsonSchema;
use schemars::transform::RestrictFormats;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The most bytes of JSON one tool result takes, so that it fits, with the
/// JSON-RPC envelope, in the 1 MiB the official SDKs allow an SSE event.
pub const MAX_RESULT_BYTES: usize = 896 * 1024;

/// A result as JSON, cut to [`MAX_RESULT_BYTES`] (its `truncated` set
/// when anything was cut): what both the MCP server and the agent get.
pub fn structured(result: &impl Serialize) -> Result<Value, String> {
    let mut value =
        serde_json::to_value(result).map_err(|e| format!("serializing a result: {e}"))?;
    if crate::agent::calls::cut_to_fit(&mut value, MAX_RESULT_BYTES)
        && let Some(truncated) = value.get_mut("truncated")
    {
        *truncated = Value::Bool(true);
    }
    Ok(value)
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = RestrictFormats::default())]
pub struct ExecuteCode {
    /// The program's source.
    pub code: String,
    /// `python` (default), `bash` or `sh`.
    #[serde(default)]
    pub language: Option<String>,
    /// The agent session whose sandbox runs it; omitted, this connection's
    /// own scratch sandbox.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Seconds before the whole process tree is killed.
    #[serde(default)]
    pub timeout: Option<u64>,
    /// Python only: fix code whose intent is plain but that would fail (a
    /// cell that does not parse, `print(x).upper()`, a standard module
    /// used without its import), saying each fix on stderr on a line
    /// starting `repair: `. Off by default: the cell runs as Python runs it.
    #[serde(default)]
    pub repair: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = RestrictFormats::default())]
pub struct ExecuteShell {
    /// A command line for `/bin/sh -c`, run in the workspace.
    pub command: String,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub timeout: Option<u64>,
    /// Start it and return at once; it runs on (until killed, or the
    /// longest timeout allowed) and shows in `list_background`. Otherwise
    /// whatever the command leaves running is killed when it returns.
    #[serde(default)]
    pub background: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = RestrictFormats::default())]
pub struct ListBackground {
    #[serde(default)]
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = RestrictFormats::default())]
pub struct KillBackground {
    /// The `background_id` `execute_shell` returned.
    pub id: String,
    #[serde(default)]
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = RestrictFormats::default())]
pub struct ReadFile {
    /// Absolute, or relative to /workspace.
    pub path: String,
    /// Act only if the path opens this file (absolute, links resolved):
    /// a caller that checked where the path leads refuses a link swapped
    /// in since.
    #[serde(default)]
    pub expect: Option<String>,
    #[serde(default)]
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = RestrictFormats::default())]
pub struct WriteFile {
    pub path: String,
    pub content: String,
    /// Act only if the path opens this file (absolute, links resolved):
    /// a caller that checked where the path leads refuses a link swapped
    /// in since.
    #[serde(default)]
    pub expect: Option<String>,
    #[serde(default)]
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = RestrictFormats::default())]
pub struct EditFile {
    pub path: String,
    pub old_string: String,
    pub new_string: String,
    /// Replace every occurrence instead of exactly one.
    #[serde(default)]
    pub replace_all: bool,
    /// Act only if the path opens this file (absolute, links resolved):
    /// a caller that checked where the path leads refuses a link swapped
    /// in since.
    #[serde(default)]
    pub expect: Option<String>,
    #[serde(default)]
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = RestrictFormats::default())]
pub struct ListFiles {
    /// Directory to list (default /workspace).
    #[serde(default)]
    pub path: Option<String>,
    /// Levels to descend (default 1).
    #[serde(default)]
    pub depth: Option<u32>,
    #[serde(default)]
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = RestrictFormats::default())]
pub struct GlobFiles {
    /// A glob such as `**/*.py`, relative to `path`.
    pub pattern: String,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = RestrictFormats::default())]
pub struct GrepFiles {
    /// An extended regular expression.
    pub pattern: String,
    /// File or directory to search (default /workspace).
    #[serde(default)]
    pub path: Option<String>,
    /// Only files whose name matches this glob, e.g. `*.rs`.
    #[serde(default)]
    pub include: Option<String>,
    #[serde(default)]
    pub ignore_case: bool,
    #[serde(default)]
    pub session_id: Option<String>,
}

/// What an execution returned.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(transform = RestrictFormats::default())]
pub struct ExecResult {
    /// `success`, `error` (non-zero exit) or `timeout`.
    pub status: String,
    pub stdout: String,
    pub stderr: String,
    /// `null` when the process was killed.
    pub exit_code: Option<i64>,
    pub duration_ms: u64,
    /// Output past the limit was dropped.
    pub truncated: bool,
    /// Set for a command started with `background: true` (its status is
    /// then `running`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub background_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(transform = RestrictFormats::default())]
pub struct FileContent {
    pub path: String,
    pub content: String,
    pub truncated: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(transform = RestrictFormats::default())]
pub struct Done {
    pub path: String,
    /// Bytes written, or replacements made for an edit.
    pub count: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(transform = RestrictFormats::default())]
pub struct Listing {
    pub path: String,
    pub entries: Vec<ListingEntry>,
    pub truncated: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(transform = RestrictFormats::default())]
pub struct ListingEntry {
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    pub size: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(transform = RestrictFormats::default())]
pub struct Matches {
    pub path: String,
    /// Matching paths (glob) or `file:line:text` lines (grep).
    pub matches: Vec<String>,
    pub truncated: bool,
}

/// `upload`: a tar (plain, gzip or zstd), base64, unpacked into `path`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = RestrictFormats::default())]
pub struct UploadArchive {
    pub archive_base64: String,
    /// The directory to unpack into, inside /workspace (default
    /// /workspace).
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub session_id: Option<String>,
}

/// What an upload put into the workspace.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(transform = RestrictFormats::default())]
pub struct Uploaded {
    pub path: String,
    /// Files and links (directories are not counted).
    pub files: u64,
    /// The bytes of the files' contents.
    pub bytes: u64,
}

/// `download`: a directory of the workspace as a gzip tar.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = RestrictFormats::default())]
pub struct DownloadArchive {
    /// The directory, inside /workspace (default /workspace).
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub session_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(transform = RestrictFormats::default())]
pub struct Downloaded {
    pub path: String,
    /// The size of the tar before compression.
    pub tar_bytes: u64,
    /// The tar, gzip-compressed, base64.
    pub archive_base64: String,
}
