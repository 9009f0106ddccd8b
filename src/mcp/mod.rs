//! Conclave's MCP server and the agent's client of it.
//!
//! Layout:
//!
//! - [`server`]: the rmcp server of sandbox tools (`execute_code`,
//!   `execute_shell`, `read_file`, `write_file`, `edit_file`, `list_files`,
//!   `glob`, `grep`), served over streamable HTTP at `/mcp` and over stdio by
//!   `conclave mcp`.
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
//! - [`resources`]: the caller's sessions as resources, with update
//!   notifications to subscribers.
//! - [`proxy`]: `conclave mcp` relaying stdio to a running server's `/mcp`
//!   with the caller's key, so IDEs started by command reach live sessions.
//! - [`external`]: a session's own MCP servers (`options.mcp_servers`).
//! - [`client`]: the agent's [`crate::agent::ToolRouter`]: Claude Code's
//!   built-in tools mapped onto the server's, through an in-process client.

pub mod background;
pub mod client;
pub mod deliberate;
pub mod external;
pub mod follow;
pub mod host;
pub mod pipeline;
pub mod progress;
pub mod proxy;
pub mod remote;
pub mod resources;
pub mod run_agent;
pub mod schema;
pub mod server;

use std::sync::Arc;

use rmcp::ServiceExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::sandbox::{self, SandboxManager};
use crate::store::{SqliteStore, Store};

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

/// Serves the sandbox tools over stdin/stdout until the client closes them.
/// A call naming a session uses that session's sandbox, the one the server
/// on the same data directory uses (made by whichever process came first),
/// and leaves it running at exit for the session's next turn; calls that
/// name no session share a scratch sandbox destroyed at exit.
pub async fn serve_stdio(config: Config) -> anyhow::Result<()> {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&config.data_dir.join("conclave.db"))?);
    let backend = sandbox::connect(&config.sandbox, &config.data_dir).await?;
    tracing::info!(
        backend = backend.name(),
        "conclave mcp: serving sandbox tools on stdio"
    );
    let instance = sandbox::instance_id(&config.data_dir)?;
    let sandboxes = Arc::new(SandboxManager::new(
        backend,
        config.sandbox.clone(),
        instance,
    ));
    let host = Arc::new(McpHost {
        sandboxes: sandboxes.clone(),
        store: store.clone(),
        max_output_bytes: 1024 * 1024,
        max_entries: 2000,
        background: Default::default(),
        deliberations: Default::default(),
        pipelines: Default::default(),
        sessions: Default::default(),
    });
    let server = SandboxServer::new(host, Caller::Trusted);
    let running = server.serve(rmcp::transport::stdio()).await?;
    let ended = running.waiting().await;
    let mut sessions = std::collections::HashSet::new();
    for id in sandboxes.leased_sessions() {
        if let Ok(Some(record)) = store.get_session(id).await
            && record.status != crate::protocol::SessionStatus::Closed
        {
            sessions.insert(id);
        }
    }
    sandboxes
        .release_all_except(|id| sessions.contains(&id))
        .await;
    store.close().await?;
    ended?;
    Ok(())
}
