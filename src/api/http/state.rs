//! The application state every handler shares.

use std::sync::Arc;
use std::time::Instant;

use crate::session::SessionManager;
use tokio_util::sync::CancellationToken;

use crate::api::http::auth::Keys;
use crate::bus::{Bus, Kv};
use crate::config::Config;
use crate::gateway::Gateway;
use crate::mcp::McpHost;
use crate::model::ModelRegistry;
use crate::sandbox::SandboxManager;
use crate::telemetry::Metrics;

/// The state every handler shares, behind one `Arc`: axum clones it for
/// each request, and counting one reference is cheaper than counting the
/// twenty of its parts.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    pub fn new(shared: Shared) -> AppState {
        AppState(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

pub struct Shared {
    pub config: Arc<Config>,
    pub sessions: Arc<SessionManager>,
    /// The models sessions name, with their aliases and prices.
    pub models: Arc<ModelRegistry>,
    pub metrics: Arc<Metrics>,
    pub keys: Arc<Keys>,
    /// The keys' quotas, enforced through the store.
    pub quotas: Arc<crate::quota::Quotas>,
    pub started: Instant,
    /// Sessions, events and the bus's messages; `/ready` pings it.
    pub store: Arc<dyn crate::store::Store>,
    /// Present when tools run in sandboxes (not with test tool routers).
    pub sandboxes: Option<Arc<SandboxManager>>,
    /// The sessions' tools, whichever replica holds a session's sandbox.
    pub tools: Arc<dyn crate::agent::ToolRouter>,
    /// Workspace uploads spooled to the data directory at once
    /// ([`crate::api::routes::workspace::MAX_SPOOLING`]): what the server's
    /// disk holds for them is bounded.
    pub uploads: Arc<tokio::sync::Semaphore>,
    /// Serves `/mcp` when present.
    pub mcp: Option<Arc<McpHost>>,
    /// The OpenAI-compatible gateway and its pools.
    pub gateway: Arc<Gateway>,
    /// Subjects to publish and subscribe to, per tenant.
    pub bus: Arc<dyn Bus>,
    /// The bus's KV, per tenant.
    pub kv: Arc<Kv>,
    /// Prompts dispatched over gateway pools, results on the bus.
    pub rollouts: Arc<crate::rollout::Rollouts>,
    /// Deliberations: submit, poll, list.
    pub deliberations: Arc<crate::deliberation::Deliberations>,
    /// Pipeline runs: start, status, history, resume, cancel.
    pub pipelines: Arc<crate::pipeline::runs::Runs>,
    /// Tool calls that wait for a decision.
    pub approvals: Arc<crate::session::approvals::Approvals>,
    /// Usage per key and the daily budgets.
    pub usage: Arc<crate::usage::Recorder>,
    /// Measures what a key keeps against its `storage_mb` (with keys).
    pub storage: Option<Arc<crate::bus::StorageMeter>>,
    /// Cancelled at shutdown; ends the MCP sessions.
    pub stop: CancellationToken,
}
