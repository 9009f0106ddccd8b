//! Deliberations: a task for N agents of a role, run in
//! parallel; each agent's answer is published on the caller's bus
//! (`agent.response.completed` / `agent.response.failed`), a collector
//! gathers them from the bus, and `deliberation.completed` follows once
//! every agent answered or the deadline passed. Options add critique
//! rounds, a judge or a vote that writes a `decision`, one budget for the
//! whole deliberation, and tool-using agents, each an agent session with
//! its own sandbox.
//!
//! A deliberation runs as the turn of a `deliberation` session, so it
//! streams, replays and is interrupted like any session; `POST
//! /deliberations` is that with an ephemeral session whose id is the
//! `task_id`.
//!
//! - [`task`]: the session kind: options and the turn.
//! - [`engine`]: one deliberation: rounds of agents, the collector, the
//!   aggregation, the budget.
//! - [`agents`]: what one agent does in a round: a model call, or a turn
//!   of its own agent session when it uses tools.
//! - `collector`: one round: the agents at once, their answers taken
//!   from the bus.
//! - `aggregate`: the judge or the vote after the last round.
//! - [`records`]: the durable result of each deliberation (kept in the
//!   store's KV), its listing, and finishing one a crash cut off.
//! - [`prompts`]: what the agents are told; reading a judge's or a voter's
//!   choice.

pub mod agents;
mod aggregate;
mod collector;
pub mod engine;
pub mod prompts;
pub mod records;
pub mod running;
pub mod task;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

pub use records::Deliberations;
pub use running::Running;
pub use task::DeliberationTask;

use crate::protocol::SessionKind;
use crate::protocol::deliberation::Aggregate;
use crate::session::OptionError;

pub const KIND: SessionKind = SessionKind::named("deliberation");

/// What `POST /deliberations` (and gRPC's `Deliberate`) says it did.
pub fn submitted_message(total_agents: u32, role: &str) -> String {
    let agents = if total_agents == 1 { "agent" } else { "agents" };
    format!("deliberation submitted to {total_agents} {agents} (role {role})")
}

/// The most agents one deliberation runs.
pub const MAX_AGENTS: u32 = 1024;
/// Agent calls (model calls or tool-using turns) running at once across
/// every deliberation of the server; the rest wait, within their time
/// limits, so one caller's large deliberations cannot take every
/// connection to the models.
pub const MAX_CONCURRENT_AGENTS: usize = 512;
/// The most critique rounds.
pub const MAX_ROUNDS: u32 = 5;
/// The most agent calls one deliberation may make: each agent once in the
/// first round and once in each critique round, and once more for a vote
/// (a judge is one call).
pub const MAX_AGENT_CALLS: u64 = 2048;
/// The most prompt text one deliberation may send: its task and its
/// constraints go into every call.
pub const MAX_PROMPT_BYTES: u64 = 256 * 1024 * 1024;

/// A deliberation's options (a `deliberation` session's, or the body of
/// `POST /deliberations` besides `task_description`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliberationOptions {
    /// The agents' role; their ids are `agent-{role}-001`, … (lowercased).
    #[serde(default = "default_role")]
    pub role: String,
    #[serde(default = "default_agents")]
    pub num_agents: u32,
    /// `rubric`, `requirements` (a list), `max_iterations`, or any other
    /// key: all go into the agents' system prompt.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub constraints: Map<String, Value>,
    /// Critique rounds after the first proposals.
    #[serde(default)]
    pub rounds: u32,
    #[serde(default)]
    pub aggregate: Aggregate,
    /// Models (aliases or gateway pools) the agents are spread over, in
    /// turn; empty: the server's default model.
    #[serde(default)]
    pub models: Vec<String>,
    /// The judge's model; the first of `models` when not given.
    #[serde(default)]
    pub judge_model: Option<String>,
    /// Every agent is a tool-using agent with its own sandbox.
    #[serde(default)]
    pub tools: bool,
    /// The whole deliberation's deadline.
    #[serde(default = "default_timeout")]
    pub timeout_s: u64,
    /// One agent's limit per round; the deadline when not given.
    #[serde(default)]
    pub agent_timeout_s: Option<u64>,
    /// One budget for all agents, rounds and the aggregation.
    #[serde(default)]
    pub max_budget_usd: Option<f64>,
    /// The same in tokens (input and output).
    #[serde(default)]
    pub max_budget_tokens: Option<u64>,
    /// Cap on tokens per model call.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Tool-using agents' calls: what runs, what waits for a decision,
    /// what never runs (as an agent session's `permissions`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<crate::permission::Permissions>,
}

fn default_role() -> String {
    "general".into()
}

fn default_agents() -> u32 {
    3
}

fn default_timeout() -> u64 {
    300
}

impl DeliberationOptions {
    /// Reads and checks the options of a request body (nested under
    /// `options` or flat; `reserved` are the route's own fields).
    pub fn from_body(
        body: &Map<String, Value>,
        reserved: &[&str],
    ) -> Result<DeliberationOptions, OptionError> {
        let options: DeliberationOptions = crate::session::options::from_body(body, reserved)?;
        options.check()?;
        Ok(options)
    }

    /// The agent calls the deliberation makes at most (see
    /// [`MAX_AGENT_CALLS`]).
    pub fn calls(&self) -> u64 {
        let agents = u64::from(self.num_agents);
        let aggregation = match self.aggregate {
            Aggregate::None => 0,
            Aggregate::Judge => 1,
            Aggregate::Vote => agents,
        };
        agents * u64::from(self.rounds + 1) + aggregation
    }

    /// Refuses a task (of `task_bytes`) that with the constraints would
    /// make the deliberation send more than [`MAX_PROMPT_BYTES`]; `field`
    /// is named.
    pub fn check_prompt_bytes(&self, field: &str, task_bytes: usize) -> Result<(), OptionError> {
        let constraints = prompts::render_constraints(&self.constraints).len();
        let each = (task_bytes + constraints) as u64;
        let total = each.saturating_mul(self.calls());
        if total > MAX_PROMPT_BYTES {
            return Err(OptionError::new(
                field,
                format!(
                    "the task and constraints ({each} bytes) go into each of {} agent calls, \
                     {total} bytes in all; a deliberation sends at most {MAX_PROMPT_BYTES}",
                    self.calls()
                ),
            ));
        }
        Ok(())
    }

    fn check(&self) -> Result<(), OptionError> {
        let role_ok = !self.role.is_empty()
            && self.role.len() <= 64
            && self
                .role
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !role_ok {
            return Err(OptionError::new(
                "options.role",
                "1 to 64 letters, digits, `_` or `-` (it becomes part of each agent's id)",
            ));
        }
        if !(1..=MAX_AGENTS).contains(&self.num_agents) {
            return Err(OptionError::new(
                "options.num_agents",
                format!("must be between 1 and {MAX_AGENTS}"),
            ));
        }
        if self.rounds > MAX_ROUNDS {
            return Err(OptionError::new(
                "options.rounds",
                format!("at most {MAX_ROUNDS} critique rounds"),
            ));
        }
        let calls = self.calls();
        if calls > MAX_AGENT_CALLS {
            let votes = if self.aggregate == Aggregate::Vote {
                " and a vote"
            } else {
                ""
            };
            return Err(OptionError::new(
                "options.num_agents",
                format!(
                    "{} agents over {} round(s){votes} make {calls} agent calls; a deliberation \
                     makes at most {MAX_AGENT_CALLS} (fewer agents or rounds)",
                    self.num_agents,
                    self.rounds + 1
                ),
            ));
        }
        self.check_prompt_bytes("options.constraints", 0)?;
        if !(1..=86_400).contains(&self.timeout_s) {
            return Err(OptionError::new(
                "options.timeout_s",
                "must be between 1 and 86400",
            ));
        }
        if self.agent_timeout_s == Some(0) {
            return Err(OptionError::new(
                "options.agent_timeout_s",
                "must be at least 1",
            ));
        }
        if self
            .max_budget_usd
            .is_some_and(|b| !(b > 0.0 && b.is_finite()))
        {
            return Err(OptionError::new(
                "options.max_budget_usd",
                "must be a positive number",
            ));
        }
        if self.max_budget_tokens == Some(0) {
            return Err(OptionError::new(
                "options.max_budget_tokens",
                "must be at least 1",
            ));
        }
        if self.max_tokens == Some(0) {
            return Err(OptionError::new("options.max_tokens", "must be at least 1"));
        }
        if let Some(permissions) = &self.permissions {
            permissions
                .validate("options.permissions")
                .map_err(|e| OptionError::new(e.field, e.message))?;
        }
        Ok(())
    }

    /// The id of the agent at `index` (0-based): `agent-{role}-{n:03}`,
    /// with the role in lower case and `n` counted from 1.
    pub fn agent_id(&self, index: usize) -> String {
        format!("agent-{}-{:03}", self.role.to_lowercase(), index + 1)
    }

    /// The model of the agent at `index`: `models` taken in turn.
    pub fn model_of(&self, index: usize, default: &str) -> String {
        if self.models.is_empty() {
            default.to_owned()
        } else {
            self.models[index % self.models.len()].clone()
        }
    }

    /// The sampling temperature of the agent at `index`: the first at
    /// 0.7, the rest at 0.9, so that their answers differ.
    pub fn temperature_of(index: usize) -> f32 {
        if index == 0 { 0.7 } else { 0.9 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_submitted_message_counts_agents_apart_from_their_role() {
        assert_eq!(
            submitted_message(3, "general"),
            "deliberation submitted to 3 agents (role general)"
        );
        assert_eq!(
            submitted_message(1, "DEV"),
            "deliberation submitted to 1 agent (role DEV)"
        );
    }
    use serde_json::json;

    fn parse(body: Value) -> Result<DeliberationOptions, OptionError> {
        DeliberationOptions::from_body(body.as_object().unwrap(), &["task_description"])
    }

    #[test]
    fn defaults_are_the_seeds() {
        let options = parse(json!({"task_description": "x", "role": "DEV"})).unwrap();
        assert_eq!(options.num_agents, 3);
        assert_eq!(options.agent_id(0), "agent-dev-001");
        assert_eq!(options.agent_id(11), "agent-dev-012");
        assert_eq!(DeliberationOptions::temperature_of(0), 0.7);
        assert_eq!(DeliberationOptions::temperature_of(1), 0.9);
        assert_eq!(options.aggregate, Aggregate::None);
    }

    #[test]
    fn bad_options_name_the_field() {
        for (body, field) in [
            (json!({"num_agents": 0}), "options.num_agents"),
            (json!({"num_agents": 5000}), "options.num_agents"),
            (json!({"role": "a b"}), "options.role"),
            (json!({"rounds": 9}), "options.rounds"),
            (json!({"aggregate": "dice"}), "options.aggregate"),
            (json!({"max_budget_usd": -1}), "options.max_budget_usd"),
            (json!({"options": {"timeout_s": 0}}), "options.timeout_s"),
            (json!({"nonsense": 1}), "nonsense"),
            (json!({"options": {"nonsense": 1}}), "options.nonsense"),
        ] {
            let err = parse(body.clone()).unwrap_err();
            assert_eq!(err.field, field, "{body}: {err}");
        }
    }

    #[test]
    fn models_are_taken_in_turn() {
        let options = parse(json!({"models": ["a", "b"]})).unwrap();
        assert_eq!(options.model_of(0, "demo"), "a");
        assert_eq!(options.model_of(3, "demo"), "b");
        assert_eq!(parse(json!({})).unwrap().model_of(2, "demo"), "demo");
    }
}
