//! The sandbox MCP server: code, shell and file tools acting in a session's
//! sandbox. IDEs reach it at `/mcp` or through `conclave mcp`; the agent
//! reaches it through an in-process client ([`super::client`]).

use std::sync::Arc;

use bytes::Bytes;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    ErrorData, Implementation, ListResourceTemplatesResult, ListResourcesResult,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities,
    ServerConfig, SubscribeRequestParams, UnsubscribeRequestParams,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler, tool, tool_handler, tool_router};
use tracing::Instrument;
use uuid::Uuid;

use super::background::{RunList, RunView};
use super::host::{Caller, McpHost};
use super::progress::OutputReporter;
use super::schema::*;
use crate::sandbox::{ExecRequest, SandboxError, WORKSPACE, exec_collect, files};
use crate::telemetry::{otel, spans};

/// Runs Python from stdin as a notebook cell (the last expression's value
/// is printed); with `--repair`, after the repairs it names.
const PYTHON_CELL: &str = include_str!("cell.py");

/// One MCP connection's view of the sandbox tools.
#[derive(Clone)]
pub struct SandboxServer {
    host: Arc<McpHost>,
    caller: Caller,
    /// This connection's scratch sandbox, for calls that name no session.
    scratch: Arc<Scratch>,
    /// This connection's subscriptions to session resources.
    subscriptions: Arc<super::resources::Subscriptions>,
    tool_router: ToolRouter<SandboxServer>,
}

/// Releases the connection's scratch sandbox when the connection ends.
struct Scratch {
    id: Uuid,
    host: Arc<McpHost>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (host, id) = (self.host.clone(), self.id);
            runtime.spawn(async move { host.sandboxes.release(id).await });
        }
    }
}

fn tool_error(e: SandboxError) -> ErrorData {
    match e {
        SandboxError::InvalidPath(m) | SandboxError::File(m) => ErrorData::invalid_params(m, None),
        SandboxError::Capacity(_) | SandboxError::ImageNotFound(_) | SandboxError::Quota(_) => {
            ErrorData::internal_error(e.to_string(), None)
        }
        other => {
            tracing::warn!(error = %other, "sandbox tool failed");
            ErrorData::internal_error(other.to_string(), None)
        }
    }
}

fn lossy(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[tool_router]
impl SandboxServer {
    pub fn new(host: Arc<McpHost>, caller: Caller) -> SandboxServer {
        SandboxServer {
            scratch: Arc::new(Scratch {
                id: Uuid::new_v4(),
                host: host.clone(),
            }),
            subscriptions: Default::default(),
            tool_router: {
                let mut router = Self::tool_router();
                // Only a server with sessions runs deliberations.
                if host.deliberations.get().is_none() {
                    router.remove_route("deliberate");
                }
                if host.pipelines.get().is_none() {
                    router.remove_route("start_pipeline");
                }
                if host.sessions.get().is_none() {
                    router.remove_route("run_agent");
                    router.remove_route("fork_session");
                }
                router
            },
            host,
            caller,
        }
    }

    /// The sandbox a call acts in: the named session's, or this
    /// connection's scratch one.
    async fn lease(
        &self,
        session_id: Option<&str>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<crate::sandbox::Lease, ErrorData> {
        self.host
            .lease(&self.caller, session_id, self.scratch.id, ctx)
            .await
    }

    async fn exec(
        &self,
        session_id: Option<&str>,
        command: Vec<String>,
        stdin: Option<Bytes>,
        timeout: Option<u64>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ExecResult>, ToolFailure> {
        // One read of the session: its sandbox and its default timeout.
        let target = self
            .host
            .target(&self.caller, session_id, self.scratch.id, &ctx)
            .await?;
        let timeout = self.host.timeout(timeout.or(target.timeout_s))?;
        let lease = self.host.lease_target(target).await?;
        let request = ExecRequest {
            command,
            stdin,
            timeout,
            workdir: WORKSPACE.into(),
            env: Default::default(),
        };
        // A client that asked for progress gets the output as it comes.
        let reporter = ctx
            .meta
            .get_progress_token()
            .map(|token| OutputReporter::start(ctx.peer.clone(), token));
        let limit = self.host.max_output_bytes;
        let span = spans::exec(
            self.host.sandboxes.backend_name(),
            lease.sandbox.id(),
            session_id,
        );
        otel::continue_from_json(&span, &ctx.meta);
        let collected = exec_collect(
            lease.sandbox.as_ref(),
            request,
            limit,
            ctx.ct.clone(),
            |chunk| {
                if let Some(reporter) = &reporter {
                    reporter.take(chunk);
                }
            },
        )
        .instrument(span.clone())
        .await;
        let ended = collected.as_ref().ok();
        spans::exec_ended(&span, ended.map(|(s, _)| (s.exit_code, s.timed_out)));
        if let Some(reporter) = reporter {
            reporter.finish().await;
        }
        let (status, out) = collected.map_err(tool_error)?;
        let state = if status.timed_out {
            "timeout"
        } else if status.exit_code == Some(0) {
            "success"
        } else {
            "error"
        };
        Ok(Json(ExecResult {
            status: state.into(),
            stdout: lossy(out.stdout),
            stderr: lossy(out.stderr),
            exit_code: status.exit_code,
            duration_ms: status.duration.as_millis() as u64,
            truncated: out.truncated,
            background_id: None,
        }))
    }

    /// Which sandbox a call's background runs belong to.
    fn run_owner(&self, session_id: Option<&str>) -> String {
        match session_id {
            // The lease checked it is a UUID; one spelling for all calls.
            Some(id) => format!(
                "session:{}",
                Uuid::parse_str(id).map_or_else(|_| id.to_string(), |u| u.to_string())
            ),
            None => format!("scratch:{}", self.scratch.id),
        }
    }

    #[tool(
        description = "Run a program (python by default, or bash/sh) in the session's sandbox and return its output and exit code. Python runs as a notebook cell: the value of a last line that is an expression is printed; otherwise it runs as Python runs it. Each call is a fresh process, but values of plain types (numbers, strings, lists, dicts...), imports and the functions and classes a cell defines carry over to the session's next Python cells; other objects (open files, generators) do not. Files in /workspace stay. With repair: true (off by default), Python code that does not parse, or that would fail in a way whose intent is plain (print(x).upper(), a standard module used without its import), is fixed first, and each fix is said on stderr on a line starting 'repair: '."
    )]
    async fn execute_code(
        &self,
        Parameters(args): Parameters<ExecuteCode>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ExecResult>, ToolFailure> {
        let interpreter = match args.language.as_deref().unwrap_or("python") {
            "python" | "python3" | "py" => "python3",
            "bash" => "bash",
            "sh" | "shell" => "sh",
            other => {
                return Err(ToolFailure(format!(
                    "language '{other}' is not supported; use python, bash or sh"
                )));
            }
        };
        let mut command = match interpreter {
            "python3" => vec!["python3".into(), "-c".into(), PYTHON_CELL.into()],
            shell => vec![shell.to_string(), "-".to_string()],
        };
        if args.repair && interpreter == "python3" {
            command.push("--repair".into());
        }
        let stdin = Some(Bytes::from(args.code));
        self.exec(
            args.session_id.as_deref(),
            command,
            stdin,
            args.timeout,
            ctx,
        )
        .await
    }

    #[tool(
        description = "Run a shell command line in the session's sandbox, in /workspace. What it leaves running is killed when it returns, unless background is true: then it starts, returns a background_id at once, and runs on (see list_background, kill_background)."
    )]
    async fn execute_shell(
        &self,
        Parameters(args): Parameters<ExecuteShell>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ExecResult>, ToolFailure> {
        let command = vec!["/bin/sh".into(), "-c".into(), args.command.clone()];
        if !args.background {
            return self
                .exec(args.session_id.as_deref(), command, None, args.timeout, ctx)
                .await;
        }
        let timeout = self
            .host
            .timeout(Some(args.timeout.unwrap_or(self.host.max_timeout_s())))?;
        let lease = self.lease(args.session_id.as_deref(), &ctx).await?;
        let request = ExecRequest {
            command,
            stdin: None,
            timeout,
            workdir: WORKSPACE.into(),
            env: Default::default(),
        };
        let run = self
            .host
            .background
            .start(
                self.run_owner(args.session_id.as_deref()),
                args.command,
                lease,
                request,
            )
            .map_err(|e| ErrorData::invalid_params(e, None))?;
        Ok(Json(ExecResult {
            status: run.status,
            stdout: String::new(),
            stderr: String::new(),
            exit_code: None,
            duration_ms: 0,
            truncated: false,
            background_id: Some(run.id),
        }))
    }

    #[tool(
        description = "List the commands started with background: true in the session's sandbox, with their status and the tail of their output."
    )]
    async fn list_background(
        &self,
        Parameters(args): Parameters<ListBackground>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RunList>, ToolFailure> {
        // Checks that the caller may use the sandbox.
        self.lease(args.session_id.as_deref(), &ctx).await?;
        Ok(Json(
            self.host
                .background
                .list(&self.run_owner(args.session_id.as_deref())),
        ))
    }

    #[tool(
        description = "Kill a command started with background: true, its whole process tree with it."
    )]
    async fn kill_background(
        &self,
        Parameters(args): Parameters<KillBackground>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RunView>, ToolFailure> {
        self.lease(args.session_id.as_deref(), &ctx).await?;
        self.host
            .background
            .kill(&self.run_owner(args.session_id.as_deref()), &args.id)
            .await
            .map(Json)
            .ok_or_else(|| ToolFailure(format!("no background run '{}'", args.id)))
    }

    #[tool(description = "Read a text file of the session's workspace.")]
    async fn read_file(
        &self,
        Parameters(args): Parameters<ReadFile>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<FileContent>, ToolFailure> {
        let path = files::confine(&args.path, WORKSPACE).map_err(tool_error)?;
        let lease = self.lease(args.session_id.as_deref(), &ctx).await?;
        let expect = args.expect.as_deref();
        let (bytes, truncated) = files::read_expecting(lease.sandbox.as_ref(), &path, expect)
            .await
            .map_err(tool_error)?;
        Ok(Json(FileContent {
            path,
            content: lossy(bytes),
            truncated,
        }))
    }

    #[tool(description = "Write a file in the session's workspace, creating its directories.")]
    async fn write_file(
        &self,
        Parameters(args): Parameters<WriteFile>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Done>, ToolFailure> {
        let path = files::confine(&args.path, WORKSPACE).map_err(tool_error)?;
        let lease = self.lease(args.session_id.as_deref(), &ctx).await?;
        let (count, expect) = (args.content.len(), args.expect.as_deref());
        let data = Bytes::from(args.content);
        files::write_expecting(lease.sandbox.as_ref(), &path, data, expect)
            .await
            .map_err(tool_error)?;
        Ok(Json(Done { path, count }))
    }

    #[tool(
        description = "Replace old_string with new_string in a file of the workspace (exactly one occurrence unless replace_all)."
    )]
    async fn edit_file(
        &self,
        Parameters(args): Parameters<EditFile>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Done>, ToolFailure> {
        let path = files::confine(&args.path, WORKSPACE).map_err(tool_error)?;
        let lease = self.lease(args.session_id.as_deref(), &ctx).await?;
        let count = files::edit(
            lease.sandbox.as_ref(),
            &path,
            &args.old_string,
            &args.new_string,
            args.replace_all,
            args.expect.as_deref(),
        )
        .await
        .map_err(tool_error)?;
        Ok(Json(Done { path, count }))
    }

    #[tool(
        description = "Hand a task to N agents that work on it in parallel (optionally with critique rounds and a judge or a vote) and return their proposals and the decision. Progress notifications come as each agent finishes; cancelling the call stops every agent."
    )]
    async fn deliberate(
        &self,
        Parameters(args): Parameters<Deliberate>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResult, ErrorData> {
        let span = super::follow::call_span("deliberate", &ctx);
        super::deliberate::run(&self.host, &self.caller, args, ctx)
            .instrument(span)
            .await
    }

    #[tool(
        description = "Start a pipeline run (the connector pipeline by default: Research, Generator, Tester, TestReviewer, Reviewer, Publisher) and follow it to its end, with a progress notification per node; returns the run's status, state and counters. Cancelling the call cancels the run."
    )]
    async fn start_pipeline(
        &self,
        Parameters(args): Parameters<StartPipeline>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResult, ErrorData> {
        let span = super::follow::call_span("start_pipeline", &ctx);
        super::pipeline::run(&self.host, &self.caller, args, ctx)
            .instrument(span)
            .await
    }

    #[tool(
        description = "Hand a task to a sandboxed agent: runs one turn in the agent session session_id of the caller (or a new one made with options, as POST /agent/session takes them) and returns its final answer, with the session id, status and usage as structured content. Progress notifications carry the turn's tool calls, the start of their output and its text; cancelling the call interrupts the turn."
    )]
    async fn run_agent(
        &self,
        Parameters(args): Parameters<RunAgent>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResult, ErrorData> {
        let span = super::follow::call_span("run_agent", &ctx);
        super::run_agent::run(&self.host, &self.caller, args, ctx)
            .instrument(span)
            .await
    }

    #[tool(
        description = "Fork an agent session of the caller at a turn end: makes count new sessions (default 1) whose history is the session's up to that turn and whose sandbox starts from its workspace as it was then; options are the session's with the given ones on top. Returns the new session ids as structured content; continue one with run_agent."
    )]
    async fn fork_session(
        &self,
        Parameters(args): Parameters<super::schema::ForkSession>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResult, ErrorData> {
        super::fork::run(&self.host, &self.caller, args, &ctx).await
    }

    #[tool(description = "List a directory of the workspace.")]
    async fn list_files(
        &self,
        Parameters(args): Parameters<ListFiles>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Listing>, ToolFailure> {
        let path = files::confine(args.path.as_deref().unwrap_or(WORKSPACE), WORKSPACE)
            .map_err(tool_error)?;
        let lease = self.lease(args.session_id.as_deref(), &ctx).await?;
        let (entries, truncated) = files::list(
            lease.sandbox.as_ref(),
            &path,
            args.depth.unwrap_or(1),
            self.host.max_entries,
        )
        .await
        .map_err(tool_error)?;
        Ok(Json(Listing {
            path,
            entries: entries
                .into_iter()
                .map(|e| ListingEntry {
                    path: e.path,
                    kind: e.kind.into(),
                    size: e.size,
                })
                .collect(),
            truncated,
        }))
    }

    #[tool(description = "Find files of the workspace whose path matches a glob such as **/*.py.")]
    async fn glob(
        &self,
        Parameters(args): Parameters<GlobFiles>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Matches>, ToolFailure> {
        let path = files::confine(args.path.as_deref().unwrap_or(WORKSPACE), WORKSPACE)
            .map_err(tool_error)?;
        let lease = self.lease(args.session_id.as_deref(), &ctx).await?;
        let (matches, truncated) = files::glob(
            lease.sandbox.as_ref(),
            &path,
            &args.pattern,
            self.host.max_entries,
        )
        .await
        .map_err(tool_error)?;
        Ok(Json(Matches {
            path,
            matches,
            truncated,
        }))
    }

    #[tool(
        description = "Search file contents of the workspace with an extended regular expression."
    )]
    async fn grep(
        &self,
        Parameters(args): Parameters<GrepFiles>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Matches>, ToolFailure> {
        let path = files::confine(args.path.as_deref().unwrap_or(WORKSPACE), WORKSPACE)
            .map_err(tool_error)?;
        let lease = self.lease(args.session_id.as_deref(), &ctx).await?;
        let (text, truncated) = files::grep(
            lease.sandbox.as_ref(),
            &path,
            &args.pattern,
            args.include.as_deref(),
            args.ignore_case,
            self.host.max_output_bytes,
        )
        .await
        .map_err(tool_error)?;
        Ok(Json(Matches {
            path,
            matches: text.lines().map(str::to_string).collect(),
            truncated,
        }))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandboxServer {
    fn get_info(&self) -> ServerConfig {
        let mut capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_resources_list_changed()
            .build();
        // Only a server with sessions has them as resources.
        if self.host.sessions.get().is_none() {
            capabilities.resources = None;
        }
        let mut instructions = String::from(
            "Tools that run code, shell commands and file operations in a sandbox. \
             Give session_id to act in an agent session's sandbox; without it each \
             connection gets a scratch sandbox of its own.",
        );
        if self.host.sessions.get().is_none() {
            instructions.push_str(
                " run_agent, deliberate, start_pipeline and the sessions as resources \
                 need a running `conclave serve`: start one and `conclave mcp` relays \
                 to it (or give --server URL).",
            );
        }
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new(
                "conclave-sandbox",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(instructions)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        super::resources::list(&self.host, &self.caller, &ctx).await
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(match self.host.sessions.get() {
            Some(_) => super::resources::templates(),
            None => ListResourceTemplatesResult::default(),
        })
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        super::resources::read(&self.host, &self.caller, &request.uri, &ctx)
            .await
            .map(Into::into)
    }

    // IDEs speak the 2025 protocol, whose subscriptions these are.
    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        super::resources::subscribe(
            &self.host,
            &self.caller,
            &self.subscriptions,
            &request.uri,
            &ctx,
        )
        .await
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        super::resources::unsubscribe(&self.subscriptions, &request.uri);
        Ok(())
    }
}
