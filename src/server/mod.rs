//! Builds the server from a config and runs it on a listener until the root
//! token is cancelled, so tests bind `127.0.0.1:0` and stop it at will.
//!
//! Shutdown order: stop taking turns (a drain, on SIGTERM, first lets
//! running turns finish for `cluster.drain_s`), interrupt running turns and
//! wait for their `result` events, end follow streams, let connections
//! finish, then close the store (which writes out everything accepted).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpSocket};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod build;
mod run;
mod shared;
mod toolbox;

pub use run::reap_orphans;
pub use toolbox::serve_mcp_stdio;

use crate::agent::ToolRouter;
use crate::api::http::state::AppState;
use crate::config::Config;
use crate::jobs::Jobs;
use crate::store::Store;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{field}: {message}")]
    Config { field: String, message: String },
    #[error("cannot open the store in {dir}: {message}")]
    Store { dir: String, message: String },
    #[error("cannot use the NATS bus at {url}: {message}")]
    Bus { url: String, message: String },
    #[error("model configuration: {0}")]
    Model(String),
    #[error("closing turns cut off by the last stop: {0}")]
    Recover(String),
    #[error("sandbox backend: {0}")]
    Sandbox(String),
    #[error("agent profile: {0}")]
    Agents(String),
    /// A step of the server's assembly did not give what the next needs.
    #[error("assembling the server: {0}")]
    Assembly(String),
}

/// What runs the agent's tool calls.
pub enum Tools {
    /// Sandboxes of the configured backend, through the MCP server, which
    /// is also served at `/mcp`.
    Sandboxed,
    /// A router of the caller's own (tests); no sandboxes, no `/mcp`.
    Custom(Arc<dyn ToolRouter>),
}

/// Binds with a deep accept backlog: a burst of clients must not overflow
/// the default 128 and wait a second for a SYN retry.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(4096)
}

pub struct Server {
    pub state: AppState,
    store: Arc<dyn Store>,
    root: CancellationToken,
    /// The bus's writer, awaited before the store closes.
    bus_tasks: TaskTracker,
    /// Takes other replicas' jobs while the server runs.
    jobs: Arc<dyn Jobs>,
}

impl Server {
    /// Opens the store, builds the providers and closes turns a crash cut off.
    pub async fn build(
        config: Config,
        tools: Tools,
        root: CancellationToken,
    ) -> Result<Server, StartError> {
        Server::build_with_kinds(config, tools, root, Vec::new()).await
    }
}
