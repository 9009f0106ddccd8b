//! The agent's tools: Claude Code's built-ins and the sandbox's own
//! (`mcp__sandbox__execute_code`, `mcp__sandbox__execute_shell`) mapped
//! onto the tool functions and called directly, plus a session's own MCP
//! servers and A2A agents. An IDE reaches the same functions through the
//! MCP server, so both run the same code.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::external::ExternalServers;
use super::output::Progress;
use super::schema::{
    EditFile, ExecuteCode, ExecuteShell, GlobFiles, GrepFiles, ReadFile, WriteFile, structured,
};
use super::{Invocation, Place, ToolError, Toolbox, exec, files};
use crate::a2a_client::{RemoteAgents, TOOL_PREFIX};
use crate::agent::{
    AgentOptions, RESERVED_SERVER_NAMES, ToolChunk, ToolContext, ToolOutput, ToolRouter,
};
use crate::config::McpConfig;
use crate::model::ToolSpec;
use crate::sandbox::WORKSPACE;
use crate::session::{OptionError, SessionError};

/// How long an interrupted call may take to kill its processes.
const KILL_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

pub struct AgentTools {
    tools: Arc<Toolbox>,
    /// Where `options.workspace.git` may be fetched from
    /// (`mcp.allowed_http_servers`).
    rules: Arc<crate::egress::Rules>,
    /// Where clones are made before they go into a sandbox.
    scratch: std::path::PathBuf,
    /// The built-in tools, made once: the sandbox's bounds do not change
    /// while it runs, and every turn offers them.
    builtin: Vec<ToolSpec>,
    external: ExternalServers,
    agents: RemoteAgents,
}

impl AgentTools {
    pub fn new(tools: Arc<Toolbox>, mcp: McpConfig) -> AgentTools {
        AgentTools {
            builtin: builtin_specs(tools.max_timeout_s()),
            tools,
            rules: mcp.http_rules(),
            scratch: std::env::temp_dir().join("conclave-clones"),
            agents: RemoteAgents::new(&mcp),
            external: ExternalServers::new(mcp),
        }
    }
}

impl AgentTools {
    /// Makes clones under `dir` (the data directory's `clones/`) rather
    /// than the system's temporary directory.
    pub fn with_scratch(mut self, dir: std::path::PathBuf) -> AgentTools {
        self.scratch = dir;
        self
    }
}

fn schema(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required})
}

fn spec(name: &str, description: &str, input_schema: Value) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema: Arc::new(input_schema),
        read_only: crate::agent::READ_ONLY_TOOLS.contains(&name),
    }
}

/// The built-in tools' names and descriptions, for an agent's card.
pub fn builtin_tools() -> Vec<(String, String)> {
    builtin_specs(60)
        .into_iter()
        .map(|s| (s.name, s.description))
        .collect()
}

/// The agent's tools; timeouts bounded by the sandbox's longest exec.
fn builtin_specs(max_timeout_s: u64) -> Vec<ToolSpec> {
    let seconds = json!({"type": "integer", "description": "Seconds", "minimum": 1, "maximum": max_timeout_s});
    let path =
        json!({"type": "string", "description": "Absolute, or relative to the working directory"});
    vec![
        spec(
            "Read",
            "Read a file of the workspace.",
            schema(
                json!({"file_path": path, "offset": {"type": "integer", "description": "First line, 1-based"}, "limit": {"type": "integer", "description": "Lines to return"}}),
                &["file_path"],
            ),
        ),
        spec(
            "Write",
            "Write a file of the workspace, replacing it.",
            schema(
                json!({"file_path": path, "content": {"type": "string"}}),
                &["file_path", "content"],
            ),
        ),
        spec(
            "Edit",
            "Replace old_string with new_string in a file (exactly once unless replace_all).",
            schema(
                json!({"file_path": path, "old_string": {"type": "string"}, "new_string": {"type": "string"}, "replace_all": {"type": "boolean"}}),
                &["file_path", "old_string", "new_string"],
            ),
        ),
        spec(
            "Glob",
            "Find files by a glob pattern such as **/*.py.",
            schema(
                json!({"pattern": {"type": "string"}, "path": path}),
                &["pattern"],
            ),
        ),
        spec(
            "Grep",
            "Search file contents with an extended regular expression.",
            schema(
                json!({"pattern": {"type": "string"}, "path": path, "glob": {"type": "string", "description": "Only files matching this glob"}, "-i": {"type": "boolean"}}),
                &["pattern"],
            ),
        ),
        spec(
            "Bash",
            "Run a shell command in the sandbox, in the working directory.",
            schema(
                json!({"command": {"type": "string"}, "timeout": {"type": "integer", "description": "Milliseconds", "minimum": 1000, "maximum": max_timeout_s * 1000}}),
                &["command"],
            ),
        ),
        spec(
            "mcp__sandbox__execute_code",
            "Run code (python by default, or bash/sh) in the sandbox. Python runs as a notebook cell: the value of a last line that is an expression is printed.",
            schema(
                json!({"code": {"type": "string"}, "language": {"type": "string", "enum": ["python", "bash", "sh"]}, "timeout": seconds}),
                &["code"],
            ),
        ),
        spec(
            "mcp__sandbox__execute_shell",
            "Run a shell command in the sandbox.",
            schema(
                json!({"command": {"type": "string"}, "timeout": seconds}),
                &["command"],
            ),
        ),
    ]
}

/// Quotes a string for `/bin/sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn str_arg<'a>(input: &'a Value, key: &str) -> Result<&'a str, String> {
    input
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("'{key}' is required and must be a string"))
}

/// Seconds given as a positive integer, when given.
fn seconds_arg(input: &Value, key: &str) -> Result<Option<u64>, String> {
    match input.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("'{key}' must be a whole number of seconds")),
    }
}

/// A call of one of the sandbox's tools, its arguments typed.
#[derive(Debug)]
enum Request {
    Read(ReadFile),
    Write(WriteFile),
    Edit(EditFile),
    Glob(GlobFiles),
    Grep(GrepFiles),
    Shell(ExecuteShell),
    Code(ExecuteCode),
}

/// Maps an agent tool call to the sandbox tool and its arguments, paths
/// confined to the workspace and relative ones taken from `workdir`.
fn translate(name: &str, input: &Value, workdir: &str) -> Result<Request, String> {
    let path = |key: &str| -> Result<String, String> {
        crate::sandbox::files::confine(str_arg(input, key)?, workdir).map_err(|e| e.to_string())
    };
    let opt_path = |key: &str| -> Result<String, String> {
        match input.get(key).and_then(Value::as_str) {
            Some(p) => crate::sandbox::files::confine(p, workdir).map_err(|e| e.to_string()),
            None => Ok(workdir.to_string()),
        }
    };
    let in_workdir = |command: &str| {
        if workdir == WORKSPACE {
            command.to_string()
        } else {
            let dir = quote(workdir);
            format!("mkdir -p {dir} && cd {dir} && {command}")
        }
    };
    let text = |key: &str| str_arg(input, key).map(str::to_string);
    let flag = |key: &str| input.get(key).and_then(Value::as_bool).unwrap_or(false);
    // The file the permission check resolved the path to: the tool acts
    // only if that is what opens (see `crate::agent::EXPECT_PATH`).
    let expect = input
        .get(crate::agent::EXPECT_PATH)
        .and_then(Value::as_str)
        .map(str::to_string);
    Ok(match name {
        "Read" => Request::Read(ReadFile {
            path: path("file_path")?,
            expect,
            session_id: None,
        }),
        "Write" => Request::Write(WriteFile {
            path: path("file_path")?,
            content: text("content")?,
            expect,
            session_id: None,
        }),
        "Edit" => Request::Edit(EditFile {
            path: path("file_path")?,
            old_string: text("old_string")?,
            new_string: text("new_string")?,
            replace_all: flag("replace_all"),
            expect,
            session_id: None,
        }),
        "Glob" => Request::Glob(GlobFiles {
            pattern: text("pattern")?,
            path: Some(opt_path("path")?),
            session_id: None,
        }),
        "Grep" => Request::Grep(GrepFiles {
            pattern: text("pattern")?,
            path: Some(opt_path("path")?),
            include: input
                .get("glob")
                .or_else(|| input.get("include"))
                .and_then(Value::as_str)
                .map(str::to_string),
            ignore_case: flag("-i"),
            session_id: None,
        }),
        "Bash" => Request::Shell(ExecuteShell {
            command: in_workdir(str_arg(input, "command")?),
            // Claude Code gives Bash timeouts in milliseconds.
            timeout: input
                .get("timeout")
                .and_then(Value::as_u64)
                .map(|ms| ms.div_ceil(1000).max(1)),
            background: false,
            session_id: None,
        }),
        "mcp__sandbox__execute_code" => {
            str_arg(input, "code")?;
            let mut args = input.clone();
            if let Some(map) = args.as_object_mut() {
                map.remove("session_id");
                map.retain(|_, v| !v.is_null());
            }
            Request::Code(
                serde_path_to_error::deserialize(args)
                    .map_err(|e| format!("'{}': {}", e.path(), e.inner()))?,
            )
        }
        "mcp__sandbox__execute_shell" => Request::Shell(ExecuteShell {
            command: in_workdir(str_arg(input, "command")?),
            timeout: seconds_arg(input, "timeout")?,
            background: false,
            session_id: None,
        }),
        other => return Err(format!("unknown tool '{other}'")),
    })
}

/// `mcp__{server}__{tool}` of an external server (never a built-in
/// server's, as `mcp__sandbox__…`).
fn external_tool(name: &str) -> Option<(&str, &str)> {
    let rest = name.strip_prefix("mcp__")?;
    let (server, tool) = rest.split_once("__")?;
    let reserved = RESERVED_SERVER_NAMES.contains(&server.to_ascii_lowercase().as_str());
    (!reserved && !server.is_empty() && !tool.is_empty()).then_some((server, tool))
}

/// Shapes the MCP result the way the agent reads it: file text as text,
/// everything else as the structured result.
fn shape(agent_tool: &str, input: &Value, structured: Value) -> ToolOutput {
    match agent_tool {
        "Read" => {
            let content = structured
                .get("content")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let first = input
                .get("offset")
                .and_then(Value::as_u64)
                .unwrap_or(1)
                .max(1) as usize;
            let count = input
                .get("limit")
                .and_then(Value::as_u64)
                .map_or(usize::MAX, |n| n as usize);
            let mut text: String = content
                .lines()
                .enumerate()
                .skip(first - 1)
                .take(count)
                .map(|(i, line)| format!("{:>6}\t{line}\n", i + 1))
                .collect();
            if structured.get("truncated") == Some(&Value::Bool(true)) {
                text.push_str("[file truncated]\n");
            }
            ToolOutput {
                output: Value::String(text),
                is_error: false,
            }
        }
        _ => {
            let failed = structured
                .get("status")
                .and_then(Value::as_str)
                .is_some_and(|s| s != "success");
            ToolOutput {
                output: structured,
                is_error: failed,
            }
        }
    }
}

#[async_trait]
impl ToolRouter for AgentTools {
    async fn specs(&self, ctx: &ToolContext) -> Vec<ToolSpec> {
        let mut specs = if ctx.options.sandbox_enabled == Some(false) {
            Vec::new()
        } else {
            self.builtin.clone()
        };
        if let Some(servers) = &ctx.options.mcp_servers {
            specs.extend(self.external.specs(ctx.session_id, servers).await);
        }
        if let Some(agents) = &ctx.options.a2a_agents {
            specs.extend(self.agents.specs(ctx.session_id, agents).await);
        }
        specs
    }

    async fn call(
        &self,
        ctx: &ToolContext,
        name: &str,
        input: Value,
        cancel: CancellationToken,
    ) -> ToolOutput {
        self.run(ctx, name, input, cancel, None).await
    }

    async fn call_with_output(
        &self,
        ctx: &ToolContext,
        name: &str,
        input: Value,
        cancel: CancellationToken,
        output: tokio::sync::mpsc::Sender<ToolChunk>,
    ) -> ToolOutput {
        self.run(ctx, name, input, cancel, Some(output)).await
    }
    async fn resolve_path(
        &self,
        ctx: &ToolContext,
        path: &str,
        cancel: CancellationToken,
    ) -> Option<Result<String, String>> {
        if ctx.options.sandbox_enabled == Some(false) {
            return None;
        }
        let command = json!({"command": format!("realpath -m -- {}", quote(path))});
        let output = self
            .run(ctx, "mcp__sandbox__execute_shell", command, cancel, None)
            .await;
        let stdout = output.output.get("stdout").and_then(Value::as_str);
        Some(match stdout.map(str::trim) {
            Some(resolved) if !output.is_error && resolved.starts_with('/') => {
                Ok(resolved.to_string())
            }
            _ => Err(format!(
                "'{path}' could not be resolved in the sandbox: {}",
                output.output
            )),
        })
    }

    async fn seed_workspace(
        &self,
        ctx: &ToolContext,
        cancel: CancellationToken,
    ) -> Result<Option<crate::agent::Seeded>, String> {
        super::git::seed(&self.tools, &self.rules, &self.scratch, ctx, &cancel).await
    }

    async fn turn_changes(&self, ctx: &ToolContext) -> Option<crate::protocol::FilesChanged> {
        super::changed::turn_changes(&self.tools, ctx).await
    }

    async fn check_options(&self, options: &AgentOptions) -> Result<(), SessionError> {
        let sandboxes = &self.tools.sandboxes;
        let spec = super::place::spec_for(sandboxes, options)?;
        if options.sandbox.as_ref().is_some_and(|s| s.image.is_some())
            && !sandboxes
                .has_image(&spec.image)
                .await
                .map_err(|e| SessionError::Internal(format!("looking up an image: {e}")))?
        {
            return Err(OptionError::new(
                "options.sandbox.image",
                format!(
                    "no image {} on this server's {} backend (sandbox-images/build.sh builds Conclave's)",
                    spec.image,
                    sandboxes.backend_name()
                ),
            )
            .into());
        }
        Ok(())
    }

    async fn adopt(&self, session_id: Uuid) -> bool {
        match self.tools.sandboxes.adopt(session_id).await {
            Ok(adopted) => adopted.is_some(),
            Err(e) => {
                tracing::warn!(session = %session_id, error = %e, "looking for a sandbox to take over");
                false
            }
        }
    }

    async fn turn_ended(&self, session_id: Uuid, owner: Option<&str>, seq: u64) {
        self.tools.sandboxes.snapshot_turn(session_id, owner, seq);
    }

    async fn snapshots_settled(&self, session_id: Uuid) {
        self.tools.sandboxes.snapshot_settled(session_id).await;
    }

    async fn rewind_workspace(&self, session_id: Uuid, seq: u64) -> bool {
        self.tools.baselines.forget(session_id);
        self.tools.sandboxes.rewind_workspace(session_id, seq).await
    }

    async fn release(&self, session_id: Uuid) {
        self.tools.baselines.forget(session_id);
        self.agents.release(session_id);
        self.external.release(session_id).await;
        self.tools.sandboxes.release(session_id).await;
    }

    async fn delete(&self, session_id: Uuid) {
        // A turn end's snapshot still under way is recorded first, so that
        // forgetting the session's snapshots forgets it too (else its file
        // would be shared, and its record written, after the session is
        // gone).
        self.tools.sandboxes.snapshot_settled(session_id).await;
        self.tools.baselines.forget(session_id);
        self.agents.release(session_id);
        self.external.release(session_id).await;
        self.tools.sandboxes.release_shared(session_id).await;
        self.tools.sandboxes.forget_snapshots(session_id).await;
    }
}

impl AgentTools {
    /// One call, its output sent to `output` as it comes when given.
    async fn run(
        &self,
        ctx: &ToolContext,
        name: &str,
        input: Value,
        cancel: CancellationToken,
        output: Option<tokio::sync::mpsc::Sender<ToolChunk>>,
    ) -> ToolOutput {
        if let Some((server, tool)) = external_tool(name)
            && let Some(servers) = &ctx.options.mcp_servers
        {
            return self
                .external
                .call(ctx.session_id, servers, server, tool, input, cancel)
                .await;
        }
        if let Some(agent) = name.strip_prefix(TOOL_PREFIX)
            && let Some(agents) = &ctx.options.a2a_agents
        {
            return self
                .agents
                .call(ctx.session_id, agents, agent, &input, cancel, output)
                .await;
        }
        if ctx.options.sandbox_enabled == Some(false) {
            return ToolOutput::error("this session has no sandbox (sandbox_enabled: false)");
        }
        let workdir = match ctx.options.working_dir.as_deref() {
            Some(dir) => match crate::sandbox::files::confine(dir, WORKSPACE) {
                Ok(dir) => dir,
                Err(e) => return ToolOutput::error(format!("working_dir: {e}")),
            },
            None => WORKSPACE.to_string(),
        };
        let request = match translate(name, &input, &workdir) {
            Ok(request) => request,
            Err(message) => return ToolOutput::error(message),
        };
        let sandboxes = &self.tools.sandboxes;
        let place = match Place::session(sandboxes, ctx.session_id, &ctx.options, ctx.owner.clone())
        {
            Ok(place) => place,
            Err(e) => return ToolOutput::error(e.0),
        };
        // The workspace before the turn's first call that may write, for
        // its result's `files_changed` (a turn that only reads lists
        // nothing).
        if !crate::agent::READ_ONLY_TOOLS.contains(&name)
            && !self.tools.baselines.touch(ctx.session_id)
            && let Ok(lease) = self.tools.lease(&place).await
        {
            super::changed::before_call(
                &self.tools.baselines,
                ctx.session_id,
                lease.sandbox.as_ref(),
            )
            .await;
        }
        let call = Invocation {
            place,
            cancel: cancel.clone(),
            output: output.map(|sink| Arc::new(sink) as Arc<dyn Progress>),
            trace: None,
        };
        let running = self.dispatch(&call, request);
        tokio::pin!(running);
        let result = tokio::select! {
            result = &mut running => result,
            _ = cancel.cancelled() => {
                // The call holds the same token: what it runs is killed.
                // The sandbox is waited on until it is quiet, so the next
                // turn finds it so.
                let ended = tokio::time::timeout(KILL_WAIT, &mut running).await.is_ok();
                let quiet = ended && sandboxes.wait_unused(ctx.session_id, KILL_WAIT).await;
                if !quiet {
                    tracing::warn!(session = %ctx.session_id, "an interrupted tool call is still running");
                }
                return ToolOutput::error("interrupted");
            }
        };
        // Whatever the call read or printed, the session's secrets taken out.
        let scrubber = call.place.scrubber();
        match result {
            Ok(mut value) => {
                scrubber.scrub_value(&mut value);
                shape(name, &input, value)
            }
            Err(e) => ToolOutput::error(scrubber.scrub(&e.0)),
        }
    }

    /// Runs a sandbox tool; its result as JSON.
    async fn dispatch(&self, call: &Invocation, request: Request) -> Result<Value, ToolError> {
        let tools = &self.tools;
        let value = match request {
            Request::Read(args) => structured(&files::read_file(tools, call, args).await?),
            Request::Write(args) => structured(&files::write_file(tools, call, args).await?),
            Request::Edit(args) => structured(&files::edit_file(tools, call, args).await?),
            Request::Glob(args) => structured(&files::glob(tools, call, args).await?),
            Request::Grep(args) => structured(&files::grep(tools, call, args).await?),
            Request::Shell(args) => structured(&exec::execute_shell(tools, call, args).await?),
            Request::Code(args) => structured(&exec::execute_code(tools, call, args).await?),
        };
        value.map_err(ToolError)
    }
}

#[cfg(test)]
#[path = "agent_tests.rs"]
mod tests;
