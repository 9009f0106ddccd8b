//! Conclave's MCP server and the agent's client of it.
//!
//! Layout:
//!
//! - [`server`]: the rmcp server of sandbox tools (`execute_code`,
//!   `execute_shell`, `read_file`, `write_file`, `edit_file`, `list_files`,
//!   `glob`, `grep`), served over streamable HTTP at `/mcp` and over stdio by
//!   `conclave mcp` (which the server module builds as it builds its own).
//! - [`background`]: commands started with `background: true`, listed and
//!   killable.
//! - [`schema`]: the tools' parameters and results.
//! - [`progress`]: a running command's output as progress notifications,
//!   sent by the server and routed to the calling turn by the agent's client.
//! - [`host`]: what the tools need from the server (sandboxes, the store
//!   for session and owner checks, limits) and who is calling.
//! - [`run_agent`], [`deliberate`], [`pipeline`]: the tools that hand a
//!   task to agents of the server's sessions (only on `/mcp`), following
//!   the session's turn with [`follow`] into progress notifications.
//! - [`approval`]: a `run_agent` call that waits for approval, put to
//!   the client as an elicitation, or explained as the HTTP decision.
//! - [`resources`]: the caller's sessions as resources, with update
//!   notifications to subscribers.
//! - [`proxy`]: `conclave mcp` relaying stdio to a running server's `/mcp`
//!   with the caller's key, so IDEs started by command reach live sessions.
//! - [`external`]: a session's own MCP servers (`options.mcp_servers`).
//! - [`client`]: the agent's [`crate::agent::ToolRouter`]: Claude Code's
//!   built-in tools mapped onto the server's, through an in-process client.

pub mod approval;
pub mod background;
pub mod client;
pub mod deliberate;
pub mod external;
pub mod follow;
pub mod fork;
pub mod host;
pub mod pipeline;
pub mod progress;
pub mod proxy;
pub mod remote;
pub mod resources;
pub mod run_agent;
pub mod schema;
pub mod server;
mod traced_http;

use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

pub use client::SandboxTools;
pub use host::{Caller, McpHost, McpOwner};
pub use server::SandboxServer;

/// The streamable HTTP service for `/mcp`: one server instance per MCP
/// session, every one answering HTTP callers only about their own sessions.
/// The API layer checks `Host` and `Origin` for every route, `/mcp`
/// included, so rmcp's own checks are off.
pub fn http_service(
    host: Arc<McpHost>,
    stop: CancellationToken,
) -> StreamableHttpService<SandboxServer, LocalSessionManager> {
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .disable_allowed_origins()
        .with_cancellation_token(stop);
    StreamableHttpService::new(
        move || Ok(SandboxServer::new(host.clone(), Caller::Http)),
        Arc::new(LocalSessionManager::default()),
        config,
    )
}
