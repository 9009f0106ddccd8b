//! The sandbox MCP server: an adapter over the tools ([`crate::tools`])
//! for IDEs, at `/mcp` and through `conclave mcp`. It resolves the
//! `session_id` a call names into the sandbox it acts in (checked against
//! the caller), follows the client's progress token and cancellation, and
//! adds the tools that start sessions of the server.

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::{InputResponses, RequestState, ToolCallContext};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ErrorData, Implementation,
    ListResourceTemplatesResult, ListResourcesResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities, ServerConfig,
    SubscribeRequestParams, SubscriptionFilter, UnsubscribeRequestParams,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{RoleServer, ServerHandler, tool, tool_handler, tool_router};
use uuid::Uuid;

use super::host::{Caller, McpHost};
use super::progress::Notifications;
use super::schema::{Deliberate, ForkSession, Json, RunAgent, StartPipeline, ToolFailure};
use crate::tools::background::{RunList, RunView};
use crate::tools::output::Progress;
use crate::tools::schema::*;
use crate::tools::{Invocation, exec, files};

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
        // Most never made one: a stateless (2026-07-28) request's server
        // lives for that request, and its calls are handed scratch ids.
        if !self.host.tools.sandboxes.holds(self.id) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (host, id) = (self.host.clone(), self.id);
            runtime.spawn(async move { host.tools.sandboxes.release(id).await });
        }
    }
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
                // Only a server with sessions starts them.
                if host.live.is_none() {
                    for name in ["deliberate", "start_pipeline", "run_agent", "fork_session"] {
                        router.remove_route(name);
                    }
                }
                router
            },
            host,
            caller,
        }
    }

    /// A call of this connection: in the sandbox of the session it names
    /// (or the connection's scratch one), stopped when the client cancels
    /// it, its output reported when the client gave a progress token.
    async fn call(
        &self,
        session_id: Option<&str>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Invocation, ErrorData> {
        let place = self
            .host
            .place(&self.caller, session_id, self.scratch.id, ctx)
            .await?;
        // A call between (or during) the agent's turns: its next turn's
        // `files_changed` is told from that turn's own start.
        if let Some(session) = place.session_id() {
            self.host.tools.baselines.forget(session);
        }
        let output = ctx.meta.get_progress_token().map(|token| {
            let peer = ctx.peer.clone();
            Arc::new(Notifications { peer, token }) as Arc<dyn Progress>
        });
        let trace = ctx
            .meta
            .contains_key("traceparent")
            .then(|| ctx.meta.0.0.clone());
        Ok(Invocation {
            place,
            cancel: ctx.ct.clone(),
            output,
            trace,
        })
    }

    #[tool(
        description = "Run a program (python by default, or bash/sh) in the session's sandbox and return its output and exit code. Python runs as a notebook cell: the value of a last line that is an expression is printed; otherwise it runs as Python runs it. Each call is a fresh process, but values of plain types (numbers, strings, lists, dicts...), imports and the functions and classes a cell defines carry over to the session's next Python cells; other objects (open files, generators) do not. Files in /workspace stay. With repair: true (off by default), Python code that does not parse, or that would fail in a way whose intent is plain (print(x).upper(), a standard module used without its import), is fixed first, and each fix is said on stderr on a line starting 'repair: '."
    )]
    async fn execute_code(
        &self,
        Parameters(args): Parameters<ExecuteCode>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ExecResult>, ToolFailure> {
        let call = self.call(args.session_id.as_deref(), &ctx).await?;
        Ok(Json(call.clean(
            exec::execute_code(&self.host.tools, &call, args).await,
        )?))
    }

    #[tool(
        description = "Run a shell command line in the session's sandbox, in /workspace. What it leaves running is killed when it returns, unless background is true: then it starts, returns a background_id at once, and runs on (see list_background, kill_background)."
    )]
    async fn execute_shell(
        &self,
        Parameters(args): Parameters<ExecuteShell>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ExecResult>, ToolFailure> {
        let call = self.call(args.session_id.as_deref(), &ctx).await?;
        Ok(Json(call.clean(
            exec::execute_shell(&self.host.tools, &call, args).await,
        )?))
    }

    #[tool(
        description = "List the commands started with background: true in the session's sandbox, with their status and the tail of their output."
    )]
    async fn list_background(
        &self,
        Parameters(args): Parameters<ListBackground>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RunList>, ToolFailure> {
        let call = self.call(args.session_id.as_deref(), &ctx).await?;
        Ok(Json(exec::list_background(&self.host.tools, &call).await?))
    }

    #[tool(
        description = "Kill a command started with background: true, its whole process tree with it."
    )]
    async fn kill_background(
        &self,
        Parameters(args): Parameters<KillBackground>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RunView>, ToolFailure> {
        let call = self.call(args.session_id.as_deref(), &ctx).await?;
        Ok(Json(
            exec::kill_background(&self.host.tools, &call, &args.id).await?,
        ))
    }

    #[tool(description = "Read a text file of the session's workspace.")]
    async fn read_file(
        &self,
        Parameters(args): Parameters<ReadFile>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<FileContent>, ToolFailure> {
        let call = self.call(args.session_id.as_deref(), &ctx).await?;
        Ok(Json(call.clean(
            files::read_file(&self.host.tools, &call, args).await,
        )?))
    }

    #[tool(description = "Write a file in the session's workspace, creating its directories.")]
    async fn write_file(
        &self,
        Parameters(args): Parameters<WriteFile>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Done>, ToolFailure> {
        let call = self.call(args.session_id.as_deref(), &ctx).await?;
        Ok(Json(call.clean(
            files::write_file(&self.host.tools, &call, args).await,
        )?))
    }

    #[tool(
        description = "Replace old_string with new_string in a file of the workspace (exactly one occurrence unless replace_all)."
    )]
    async fn edit_file(
        &self,
        Parameters(args): Parameters<EditFile>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Done>, ToolFailure> {
        let call = self.call(args.session_id.as_deref(), &ctx).await?;
        Ok(Json(call.clean(
            files::edit_file(&self.host.tools, &call, args).await,
        )?))
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
        span.within(super::deliberate::run(&self.host, &self.caller, args, ctx))
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
        span.within(super::pipeline::run(&self.host, &self.caller, args, ctx))
            .await
    }

    #[tool(
        description = "Hand a task to a sandboxed agent: runs one turn in the agent session session_id of the caller (or a new one made with options, as POST /agent/session takes them) and returns its final answer, with the session id, status and usage as structured content. Progress notifications carry the turn's tool calls, the start of their output and its text; cancelling the call interrupts the turn."
    )]
    async fn run_agent(
        &self,
        Parameters(args): Parameters<RunAgent>,
        RequestState(state): RequestState,
        InputResponses(responses): InputResponses,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let span = super::follow::call_span("run_agent", &ctx);
        let retry = super::run_agent::Retry { state, responses };
        span.within(super::run_agent::run(
            &self.host,
            &self.caller,
            args,
            retry,
            ctx,
        ))
        .await
    }

    #[tool(
        description = "Fork an agent session of the caller at a turn end: makes count new sessions (default 1) whose history is the session's up to that turn and whose sandbox starts from its workspace as it was then; options are the session's with the given ones on top. Returns the new session ids as structured content; continue one with run_agent."
    )]
    async fn fork_session(
        &self,
        Parameters(args): Parameters<ForkSession>,
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
        let call = self.call(args.session_id.as_deref(), &ctx).await?;
        Ok(Json(call.clean(
            files::list_files(&self.host.tools, &call, args).await,
        )?))
    }

    #[tool(description = "Find files of the workspace whose path matches a glob such as **/*.py.")]
    async fn glob(
        &self,
        Parameters(args): Parameters<GlobFiles>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Matches>, ToolFailure> {
        let call = self.call(args.session_id.as_deref(), &ctx).await?;
        Ok(Json(
            call.clean(files::glob(&self.host.tools, &call, args).await)?,
        ))
    }

    #[tool(
        description = "Unpack a tar archive (plain, gzip or zstd), given base64 and at most 16 MiB, into a directory of the workspace (default /workspace). Every entry is checked first: absolute paths, .., entries under links, devices and archives past the sandbox's disk are refused. Larger archives: PUT /agent/session/{id}/workspace."
    )]
    async fn upload(
        &self,
        Parameters(args): Parameters<UploadArchive>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Uploaded>, ToolFailure> {
        let call = self.call(args.session_id.as_deref(), &ctx).await?;
        Ok(Json(
            super::transfer::upload(&self.host, &call, args).await?,
        ))
    }

    #[tool(
        description = "A directory of the workspace (default /workspace) as a gzip tar, base64, when its tar is at most 16 MiB. Larger ones: GET /agent/session/{id}/workspace."
    )]
    async fn download(
        &self,
        Parameters(args): Parameters<DownloadArchive>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Downloaded>, ToolFailure> {
        let call = self.call(args.session_id.as_deref(), &ctx).await?;
        Ok(Json(
            crate::tools::transfer::download(&self.host.tools, &call, args).await?,
        ))
    }

    #[tool(
        description = "Search file contents of the workspace with an extended regular expression."
    )]
    async fn grep(
        &self,
        Parameters(args): Parameters<GrepFiles>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Matches>, ToolFailure> {
        let call = self.call(args.session_id.as_deref(), &ctx).await?;
        Ok(Json(
            call.clean(files::grep(&self.host.tools, &call, args).await)?,
        ))
    }
}

impl SandboxServer {
    /// A stateless call of a sandbox tool that names no session: a new
    /// scratch handle, written into its arguments as its `session_id`.
    fn hand_out_scratch(
        &self,
        request: &mut CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Option<Uuid> {
        let named = request
            .arguments
            .as_ref()
            .is_some_and(|args| args.get("session_id").is_some_and(|v| !v.is_null()));
        if named
            || !super::scratch::SANDBOX_TOOLS.contains(&request.name.as_ref())
            || !super::scratch::stateless(ctx)
        {
            return None;
        }
        let owner = super::follow::http_owner(&self.caller, ctx).flatten();
        let id = self.host.scratch.hand_out(owner);
        request
            .arguments
            .get_or_insert_with(Default::default)
            .insert("session_id".into(), id.to_string().into());
        Some(id)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandboxServer {
    /// Each tool of the router; a stateless call given a scratch sandbox
    /// has its result name it, and one that failed or was cancelled (whose
    /// client never reads the handle) leaves none.
    async fn call_tool(
        &self,
        mut request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let handed = self.hand_out_scratch(&mut request, &ctx);
        let cancelled = ctx.ct.clone();
        let call = ToolCallContext::new(self, request, ctx);
        let response = self.tool_router.call(call).await;
        let Some(id) = handed else { return response };
        let sandboxes = &self.host.tools.sandboxes;
        match response {
            // Its sandbox was made, whatever the command did in it, and
            // the client is there to read its handle.
            Ok(CallToolResponse::Complete(mut result))
                if sandboxes.holds(id) && !cancelled.is_cancelled() =>
            {
                if let Some(old) = self.host.scratch.used(id) {
                    sandboxes.release(old).await;
                }
                let ttl = sandboxes.config().idle_ttl_s;
                super::scratch::annotate(&mut result, id, ttl);
                Ok(CallToolResponse::Complete(result))
            }
            other => {
                self.host.scratch.forget(id);
                sandboxes.release(id).await;
                other
            }
        }
    }

    fn get_info(&self) -> ServerConfig {
        let mut capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_resources_list_changed()
            .build();
        // Only a server with sessions has them as resources.
        if self.host.live.is_none() {
            capabilities.resources = None;
        }
        let mut instructions = String::from(
            "Tools that run code, shell commands and file operations in a sandbox. \
             Give session_id to act in an agent session's sandbox; without it each \
             connection gets a scratch sandbox of its own. Under 2026-07-28, which has \
             no connections, a call without session_id gets a new scratch sandbox and \
             its result names it: pass that id as session_id to act in it again.",
        );
        if self.host.live.is_none() {
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

    /// No prompts are declared, so `prompts/list` is an unknown method
    /// (rmcp's default answers an empty list to a capability never offered).
    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListPromptsResult, ErrorData> {
        Err(super::no_prompts())
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(match self.host.live {
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

    /// 2026-07-28's subscriptions: updates of the caller's session
    /// resources on the `subscriptions/listen` request's stream.
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        self.host
            .live
            .as_ref()
            .map(|_| super::resources::listenable(requested))
    }

    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), ErrorData> {
        super::resources::listen(&self.host, &self.caller, subscription).await
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
