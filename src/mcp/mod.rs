//! Conclave's MCP server, for IDEs and other MCP clients.
//!
//! Layout:
//!
//! - [`server`]: the rmcp server, served over streamable HTTP at `/mcp`
//!   and over stdio by `conclave mcp`: an adapter over the sandbox tools
//!   ([`crate::tools`]) and the tools that start sessions.
//! - [`host`]: what it needs from the server (the tools, the store for
//!   session and owner checks, the sessions when the server runs them) and
//!   who is calling.
//! - [`schema`]: the result wrappers and the session tools' parameters.
//! - [`progress`]: a running command's output as progress notifications.
//! - [`run_agent`], [`deliberate`], [`pipeline`], [`fork`]: the tools that
//!   hand a task to agents of the server's sessions (only on `/mcp`),
//!   following the session's turn with [`follow`] into progress
//!   notifications.
//! - [`approval`]: a `run_agent` call that waits for approval, put to
//!   the client as an elicitation, or explained as the HTTP decision.
//! - [`scratch`]: the scratch sandboxes stateless (2026-07-28) calls are
//!   handed, by id.
//! - [`resources`]: the caller's sessions as resources, with update
//!   notifications to subscribers.
//! - [`proxy`]: `conclave mcp` relaying stdio to a running server's `/mcp`
//!   with the caller's key, so IDEs started by command reach live sessions.

pub mod approval;
pub mod deliberate;
pub mod follow;
pub mod fork;
pub mod host;
pub mod pipeline;
pub mod progress;
pub mod proxy;
pub mod resources;
pub mod run_agent;
pub mod schema;
pub mod scratch;
pub mod server;
pub mod transfer;

use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

pub use host::{Caller, Live, McpHost, McpOwner};
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

/// `prompts/list` on a server that declares no prompts: an unknown method,
/// as MCP answers any request of a capability not declared.
fn no_prompts() -> rmcp::ErrorData {
    rmcp::ErrorData::method_not_found::<rmcp::model::ListPromptsRequestMethod>()
}
