//! The agent as a session kind: its options, checked before the session
//! exists, and its turns, run by the session machinery.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value};
use uuid::Uuid;

use super::deps::TurnDeps;
use super::options::{AgentOptions, McpServerSpec};
use super::turn;
use crate::config::McpConfig;
use crate::protocol::SessionKind;
use crate::session::{OptionError, Outcome, Session, SessionError, SessionTask, Turn};
use crate::store::StoreError;

/// Runs `agent` sessions: a model with tools, turn by turn.
pub struct AgentTask {
    deps: TurnDeps,
    /// Where a session's own MCP servers may be.
    mcp: McpConfig,
}

impl AgentTask {
    pub fn new(deps: TurnDeps, mcp: McpConfig) -> AgentTask {
        AgentTask { deps, mcp }
    }

    /// Validates options as a route takes them: the model must resolve,
    /// the tools must accept them, and each MCP server must be one the
    /// operator allows (HTTP ones checked after DNS), and so must each
    /// A2A agent's URL (its card's interface URL is checked when the card
    /// is read).
    pub async fn check(&self, options: &AgentOptions) -> Result<(), SessionError> {
        if let Some(model) = &options.model {
            self.deps
                .models
                .resolve(model)
                .map_err(|e| OptionError::new("options.model", e.to_string()))?;
        }
        self.deps.tools.check_options(options).await?;
        let rules = self.mcp.http_rules();
        super::hook::check_hook_url(&rules, options.permissions.as_ref()).await?;
        for (name, spec) in options.mcp_servers.iter().flatten() {
            match spec {
                McpServerSpec::Http { url, .. } => {
                    rules.check_url(url).await.map_err(|e| {
                        OptionError::new(
                            format!("options.mcp_servers.{name}.url"),
                            format!("{e} (mcp.allowed_http_servers)"),
                        )
                    })?;
                }
                McpServerSpec::Stdio { command, args, env } => {
                    self.mcp.check_stdio_command(command, args).map_err(|e| {
                        OptionError::new(format!("options.mcp_servers.{name}.command"), e)
                    })?;
                    self.mcp.check_stdio_env(env.keys()).map_err(|e| {
                        OptionError::new(format!("options.mcp_servers.{name}.env"), e)
                    })?;
                }
            }
        }
        if let Some(git) = options.workspace.as_ref().and_then(|w| w.git.as_ref()) {
            rules.check_url(&git.url).await.map_err(|e| {
                OptionError::new(
                    "options.workspace.git.url",
                    format!("{e} (mcp.allowed_http_servers)"),
                )
            })?;
        }
        for (name, agent) in options.a2a_agents.iter().flatten() {
            rules.check_url(agent.url()).await.map_err(|e| {
                OptionError::new(
                    format!("options.a2a_agents.{name}"),
                    format!("{e} (mcp.allowed_http_servers)"),
                )
            })?;
        }
        Ok(())
    }
}

#[async_trait]
impl SessionTask for AgentTask {
    fn kind(&self) -> SessionKind {
        SessionKind::AGENT
    }

    async fn options(
        &self,
        body: &Map<String, Value>,
        fields: &[&str],
    ) -> Result<Value, SessionError> {
        let options = AgentOptions::from_body(body, fields)?;
        self.check(&options).await?;
        serde_json::to_value(&options)
            .map_err(|e| SessionError::Internal(format!("storing options: {e}")))
    }

    fn describe(&self, options: &Value) -> Map<String, Value> {
        // `null` while the default model is a provider's listing that has
        // not been read yet.
        let model = options
            .get("model")
            .and_then(Value::as_str)
            .or_else(|| self.deps.models.default_model());
        Map::from_iter([("model".to_owned(), Value::from(model))])
    }

    async fn run(&self, turn: &mut Turn, input: String) -> Result<Outcome, StoreError> {
        turn::run(&self.deps, turn, input).await
    }

    async fn close_cut_off(&self, session: &Arc<Session>) -> Result<(), StoreError> {
        turn::close_cut_off(&self.deps, session).await
    }

    async fn turn_ended(&self, session: &Arc<Session>, seq: u64) {
        self.deps
            .tools
            .turn_ended(session.id, session.owner.as_deref(), seq)
            .await;
    }

    async fn rewind_workspace(&self, session: &Arc<Session>, seq: u64) -> bool {
        self.deps.tools.rewind_workspace(session.id, seq).await
    }

    async fn release(&self, session: Uuid) {
        self.deps.tools.release(session).await;
    }

    async fn release_made_here(&self, session: Uuid) {
        self.deps.tools.release_made_here(session).await;
    }

    async fn delete(&self, session: Uuid) {
        self.deps.tools.delete(session).await;
        if let Err(e) = self.deps.approvals.forget_rules(session).await {
            tracing::warn!(%session, error = %e, "the session's remembered permission rules stay stored");
        }
    }
}
