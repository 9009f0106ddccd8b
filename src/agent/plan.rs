//! What a turn settles before its first model call: the model, the
//! tools offered, the gate, the system prompt, the most calls it may
//! make, and its context (the model's window).

use std::sync::Arc;

use super::approve::Gate;
use super::context::Context;
use super::deps::{LoopError, TurnDeps};
use super::options::AgentOptions;
use super::prompts::default_system_prompt;
use super::spend::TurnSpend;
use super::tools::ToolContext;
use crate::model::{ChatRequest, Message, ModelError, ResolvedModel, ToolSpec};
use crate::permission::PLAN_NOTE;
use crate::session::{Session, Turn};

/// The model the session names, else the default one (which a provider
/// may have to be asked for).
pub(super) async fn model_name(
    deps: &TurnDeps,
    options: &AgentOptions,
) -> Result<String, ModelError> {
    match &options.model {
        Some(name) => Ok(name.clone()),
        None => deps.models.default_model_now().await,
    }
}

/// The model's name for the metrics; `default` while it is not known.
pub(super) fn model_label(deps: &TurnDeps, options: &AgentOptions) -> String {
    options
        .model
        .as_deref()
        .or_else(|| deps.models.default_model())
        .unwrap_or("default")
        .to_string()
}

/// What a turn settles before its first model call.
pub(super) struct Plan {
    pub(super) model: ResolvedModel,
    pub(super) ctx: ToolContext,
    /// The tools offered: the server's the options allow, and the
    /// client's own.
    pub(super) tools: Vec<ToolSpec>,
    /// The names of the client's tools, whose calls the client runs.
    pub(super) client: Vec<String>,
    /// Model calls the turn may make.
    pub(super) max_calls: u32,
    pub(super) gate: Gate,
    pub(super) system: Option<String>,
}

impl Plan {
    pub(super) async fn new(
        deps: &TurnDeps,
        turn: &mut Turn,
        options: &Arc<AgentOptions>,
        spend: &mut TurnSpend,
    ) -> Result<Plan, LoopError> {
        let session = &turn.session;
        let name = model_name(deps, options).await.map_err(LoopError::Model)?;
        let model = deps.models.resolve(&name).map_err(LoopError::Model)?;
        spend.model = model.name.clone();
        turn.cost_known = model.price.is_some();
        let ctx = ToolContext {
            session_id: session.id,
            options: options.clone(),
            owner: session.owner.clone(),
        };
        let client_tools = &turn.options.client_tools;
        let mut tools: Vec<_> = deps
            .tools
            .specs(&ctx)
            .await
            .into_iter()
            .filter(
                |spec| match (&options.allowed_tools, &model.default_tools) {
                    (None, Some(defaults)) => defaults.contains(&spec.name),
                    _ => options.allows(&spec.name),
                },
            )
            .filter(|spec| !client_tools.iter().any(|c| c.name == spec.name))
            .collect();
        let client = client_tools.iter().map(|c| c.name.clone()).collect();
        tools.extend(client_tools.iter().cloned());
        let gate = Gate::new(&deps.config, options, session.owner.as_deref())
            .on_behalf_of(turn.options.on_behalf_of.clone());
        let mut system = options
            .system_prompt
            .clone()
            .or_else(|| default_system_prompt(&tools, options.working_dir.as_deref()));
        if gate.plans() {
            system = Some(match system {
                Some(prompt) => format!("{prompt}\n\n{PLAN_NOTE}"),
                None => PLAN_NOTE.to_string(),
            });
        }
        Ok(Plan {
            model,
            ctx,
            tools,
            client,
            max_calls: options.max_turns.unwrap_or(deps.config.max_turns),
            gate,
            system,
        })
    }

    /// The turn's context: its model's window, and what it sends.
    pub(super) async fn context(
        &self,
        deps: &TurnDeps,
        options: &AgentOptions,
        history: &[Message],
    ) -> Context {
        let fixed = (self.system.as_deref(), self.tools.as_slice());
        Context::new(deps, &self.model, options, fixed, history).await
    }

    /// The next model call's request, on the history as it is.
    pub(super) fn request(
        &self,
        deps: &TurnDeps,
        session: &Session,
        options: &AgentOptions,
        history: &Arc<Vec<Message>>,
    ) -> ChatRequest {
        ChatRequest {
            model: self.model.upstream_model.clone(),
            system: self.system.clone(),
            messages: Arc::clone(history),
            tools: self.tools.clone(),
            temperature: options.temperature,
            max_tokens: Some(options.max_tokens.unwrap_or(deps.config.max_tokens)),
            session_id: Some(session.id.to_string()),
            owner: session.owner.clone(),
            reasoning: options.reasoning,
            ..ChatRequest::default()
        }
    }
}
