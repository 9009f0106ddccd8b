//! The agent's tools: Claude Code's built-ins and the sandbox MCP tools,
//! every one a call through an in-process rmcp client to the sandbox MCP
//! server, so the agent and an IDE run the same code path.

use std::sync::Arc;

use async_trait::async_trait;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotificationParam, ClientRequest, JsonObject,
    ServerResult,
};
use rmcp::service::PeerRequestOptions;
use rmcp::service::{RunningService, ServiceExt};
use rmcp::{RoleClient, ServiceError};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::external::ExternalServers;
use super::host::{Caller, McpHost};
use super::progress::ProgressRouter;
use super::server::SandboxServer;
use crate::a2a_client::{RemoteAgents, TOOL_PREFIX};
use crate::agent::{
    AgentOptions, RESERVED_SERVER_NAMES, ToolChunk, ToolContext, ToolOutput, ToolRouter,
};
use crate::config::McpConfig;
use crate::model::ToolSpec;
use crate::sandbox::{WORKSPACE, files};
use crate::session::{OptionError, SessionError};

/// How long an interrupted call may take to kill its processes.
const KILL_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

pub struct SandboxTools {
    client: RunningService<RoleClient, ProgressRouter>,
    progress: ProgressRouter,
    host: Arc<McpHost>,
    /// The built-in tools, made once: the sandbox's bounds do not change
    /// while it runs, and every turn offers them.
    builtin: Vec<ToolSpec>,
    external: ExternalServers,
    agents: RemoteAgents,
}

#[derive(Debug, thiserror::Error)]
#[error("starting the in-process MCP client: {0}")]
pub struct ConnectError(String);

impl SandboxTools {
    /// Connects a client to a fresh server instance over an in-memory pipe.
    pub async fn connect(host: Arc<McpHost>, mcp: McpConfig) -> Result<SandboxTools, ConnectError> {
        let (client_io, server_io) = tokio::io::duplex(256 * 1024);
        let server = SandboxServer::new(host.clone(), Caller::Trusted);
        tokio::spawn(async move {
            match server.serve(server_io).await {
                Ok(running) => {
                    let _ = running.waiting().await;
                }
                Err(e) => tracing::error!(error = %e, "in-process MCP server failed to start"),
            }
        });
        let progress = ProgressRouter::default();
        let client = progress
            .clone()
            .serve(client_io)
            .await
            .map_err(|e| ConnectError(e.to_string()))?;
        Ok(SandboxTools {
            client,
            progress,
            builtin: builtin_specs(host.max_timeout_s()),
            host,
            agents: RemoteAgents::new(&mcp),
            external: ExternalServers::new(mcp),
        })
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

/// Maps an agent tool call to the MCP tool and its arguments.
fn translate(name: &str, input: &Value, workdir: &str) -> Result<(&'static str, Value), String> {
    let path = |key: &str| -> Result<String, String> {
        files::confine(str_arg(input, key)?, workdir).map_err(|e| e.to_string())
    };
    let opt_path = |key: &str| -> Result<String, String> {
        match input.get(key).and_then(Value::as_str) {
            Some(p) => files::confine(p, workdir).map_err(|e| e.to_string()),
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
    // The file the permission check resolved the path to: the tool acts
    // only if that is what opens (see `crate::agent::EXPECT_PATH`).
    let expect = input.get(crate::agent::EXPECT_PATH).and_then(Value::as_str);
    Ok(match name {
        "Read" => (
            "read_file",
            json!({"path": path("file_path")?, "expect": expect}),
        ),
        "Write" => (
            "write_file",
            json!({"path": path("file_path")?, "content": str_arg(input, "content")?, "expect": expect}),
        ),
        "Edit" => (
            "edit_file",
            json!({
                "path": path("file_path")?,
                "old_string": str_arg(input, "old_string")?,
                "new_string": str_arg(input, "new_string")?,
                "replace_all": input.get("replace_all").and_then(Value::as_bool).unwrap_or(false),
                "expect": expect,
            }),
        ),
        "Glob" => (
            "glob",
            json!({"pattern": str_arg(input, "pattern")?, "path": opt_path("path")?}),
        ),
        "Grep" => (
            "grep",
            json!({
                "pattern": str_arg(input, "pattern")?,
                "path": opt_path("path")?,
                "include": input.get("glob").or_else(|| input.get("include")).and_then(Value::as_str),
                "ignore_case": input.get("-i").and_then(Value::as_bool).unwrap_or(false),
            }),
        ),
        "Bash" => {
            // Claude Code gives Bash timeouts in milliseconds.
            let timeout = input
                .get("timeout")
                .and_then(Value::as_u64)
                .map(|ms| ms.div_ceil(1000).max(1));
            (
                "execute_shell",
                json!({"command": in_workdir(str_arg(input, "command")?), "timeout": timeout}),
            )
        }
        "mcp__sandbox__execute_code" => {
            let mut args = input.clone();
            if let Some(map) = args.as_object_mut() {
                map.remove("session_id");
            }
            str_arg(input, "code")?;
            ("execute_code", args)
        }
        "mcp__sandbox__execute_shell" => (
            "execute_shell",
            json!({"command": in_workdir(str_arg(input, "command")?), "timeout": input.get("timeout")}),
        ),
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
impl ToolRouter for SandboxTools {
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

    async fn check_options(&self, options: &AgentOptions) -> Result<(), SessionError> {
        let sandboxes = &self.host.sandboxes;
        let spec = super::host::spec_for(sandboxes, options)?;
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
        match self.host.sandboxes.adopt(session_id).await {
            Ok(adopted) => adopted.is_some(),
            Err(e) => {
                tracing::warn!(session = %session_id, error = %e, "looking for a sandbox to take over");
                false
            }
        }
    }

    fn turn_ended(&self, session_id: Uuid, owner: Option<&str>, seq: u64) {
        self.host.sandboxes.snapshot_turn(session_id, owner, seq);
    }

    async fn release(&self, session_id: Uuid) {
        self.agents.release(session_id);
        self.external.release(session_id).await;
        self.host.sandboxes.release(session_id).await;
    }

    async fn delete(&self, session_id: Uuid) {
        self.agents.release(session_id);
        self.external.release(session_id).await;
        self.host.sandboxes.release_shared(session_id).await;
        self.host.sandboxes.forget_snapshots(session_id).await;
    }
}

impl SandboxTools {
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
            Some(dir) => match files::confine(dir, WORKSPACE) {
                Ok(dir) => dir,
                Err(e) => return ToolOutput::error(format!("working_dir: {e}")),
            },
            None => WORKSPACE.to_string(),
        };
        let (tool, mut args) = match translate(name, &input, &workdir) {
            Ok(translated) => translated,
            Err(message) => return ToolOutput::error(message),
        };
        let mut arguments = match args.as_object_mut() {
            Some(map) => std::mem::take(map),
            None => JsonObject::new(),
        };
        arguments.retain(|_, v| !v.is_null());
        arguments.insert("session_id".into(), json!(ctx.session_id.to_string()));
        let mut params = CallToolRequestParams::new(tool).with_arguments(arguments);
        // The server runs the call in its own task: the trace context goes
        // in `_meta`, where MCP carries it (`traceparent`).
        if let Some(carrier) = crate::telemetry::otel::current_json() {
            params.meta = Some(rmcp::model::RequestMetaObject(carrier.into()));
        }
        let result = self.send(ctx, params, cancel, output).await;
        let result = match result {
            Some(result) => result,
            None => return ToolOutput::error("interrupted"),
        };
        match result {
            Ok(ServerResult::CallToolResult(result)) => {
                let text = || {
                    result
                        .content
                        .iter()
                        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                        .collect::<Vec<_>>()
                        .join("\n")
                };
                if result.is_error == Some(true) {
                    return ToolOutput::error(text());
                }
                match result.structured_content.clone() {
                    Some(structured) => shape(name, &input, structured),
                    None => ToolOutput {
                        output: Value::String(text()),
                        is_error: false,
                    },
                }
            }
            Ok(other) => {
                ToolOutput::error(format!("sandbox tool call: unexpected answer {other:?}"))
            }
            Err(ServiceError::McpError(e)) => ToolOutput::error(e.message.to_string()),
            Err(e) => ToolOutput::error(format!("sandbox tool call failed: {e}")),
        }
    }

    /// Sends a `tools/call` and waits for its answer, handing the progress
    /// notifications of the call (rmcp gives each request a token) to
    /// `output`. `None` when `cancel` fired first: the server is then told
    /// (`notifications/cancelled` kills the call's processes) and the
    /// sandbox waited on until it is quiet, so the next turn finds it so.
    async fn send(
        &self,
        ctx: &ToolContext,
        params: CallToolRequestParams,
        cancel: CancellationToken,
        output: Option<tokio::sync::mpsc::Sender<ToolChunk>>,
    ) -> Option<Result<ServerResult, ServiceError>> {
        let peer = self.client.peer();
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let handle = match peer
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await
        {
            Ok(handle) => handle,
            Err(e) => return Some(Err(e)),
        };
        let id = handle.id.clone();
        // The server's first report comes a second after the call starts,
        // long after this registration.
        let _registration = output.map(|sink| self.progress.register(&handle.progress_token, sink));
        tokio::select! {
            result = handle.await_response() => Some(result),
            _ = cancel.cancelled() => {
                let _ = peer
                    .notify_cancelled(CancelledNotificationParam::new(
                        Some(id),
                        Some("the turn was interrupted".into()),
                    ))
                    .await;
                let quiet = self
                    .host
                    .sandboxes
                    .wait_unused(ctx.session_id, KILL_WAIT)
                    .await;
                if !quiet {
                    tracing::warn!(session = %ctx.session_id, "an interrupted tool call is still running");
                }
                None
            }
        }
    }
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
