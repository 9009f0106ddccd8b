//! The application state every handler shares.

use std::sync::Arc;
use std::time::Instant;

use crate::session::SessionManager;
use tokio_util::sync::CancellationToken;

use super::auth::Keys;
use crate::bus::{Bus, Kv};
use crate::config::Config;
use crate::gateway::Gateway;
use crate::mcp::McpHost;
use crate::model::ModelRegistry;
use crate::sandbox::SandboxManager;
use crate::telemetry::Metrics;

#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub sessions: Arc<SessionManager>,
    /// The models sessions name, with their aliases and prices.
    pub models: Arc<ModelRegistry>,
    pub metrics: Arc<Metrics>,
    pub keys: Arc<Keys>,
    pub started: Instant,
    /// Sessions, events and the bus's messages; `/ready` pings it.
    pub store: Arc<dyn crate::store::Store>,
    /// Present when tools run in sandboxes (not with test tool routers).
    pub sandboxes: Option<Arc<SandboxManager>>,
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
    /// Cancelled at shutdown; ends the MCP sessions.
    pub stop: CancellationToken,
}
