//! What a turn stands on: the parts every turn uses, and how its loop
//! fails.

use std::sync::Arc;

use super::tools::ToolRouter;
use crate::config::AgentConfig;
use crate::model::{ModelError, ModelRegistry};
use crate::store::{Store, StoreError};
use crate::telemetry::Metrics;

/// What every turn uses, shared by all sessions.
pub struct TurnDeps {
    pub store: Arc<dyn Store>,
    pub models: Arc<ModelRegistry>,
    pub tools: Arc<dyn ToolRouter>,
    pub config: AgentConfig,
    pub metrics: Arc<Metrics>,
    /// Calls that wait for a decision.
    pub approvals: Arc<crate::session::approvals::Approvals>,
    /// The permission hooks' client, under the MCP servers' allow list.
    pub hooks: Arc<super::hook::Hooks>,
    /// Usage per key and the daily budgets.
    pub usage: Arc<crate::usage::Recorder>,
}

/// Why a turn's loop stopped short of an answer.
pub(super) enum LoopError {
    Store(StoreError),
    Model(ModelError),
}

impl From<StoreError> for LoopError {
    fn from(e: StoreError) -> Self {
        LoopError::Store(e)
    }
}
