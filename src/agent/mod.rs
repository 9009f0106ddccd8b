//! The agent: the first session kind. A turn is a model with tools:
//! model call → tool calls → model call … until it answers.
//!
//! - [`task`]: [`AgentTask`], the agent as a [`crate::session::SessionTask`]:
//!   its options checked before the session exists, its turns.
//! - [`turn`]: the agent loop.
//! - [`calls`]: a turn's tool calls, from a reply to their results.
//! - `deps`: what every turn stands on ([`TurnDeps`]) and how its loop
//!   fails.
//! - `plan`: what a turn settles before its first model call.
//! - `context`: the model's window, the size of what a turn sends, and
//!   compaction of the older part of the history into a summary.
//! - `model_call`: one model call of a turn: streamed, watched, counted
//!   and traced.
//! - `spend`: a turn's usage, recorded as it goes.
//! - [`harness`]: what the loop does beyond model → tools → model, chosen
//!   per model.
//! - [`approve`]: whether a call runs, or waits for a decision;
//!   its `paths` resolves file tools' paths before the rules, holds
//!   the tool to what opens, and filters searches by deny rules.
//! - [`decide`]: deciding a waiting call, the same for every way a
//!   decision arrives (HTTP, the WebSocket, an MCP elicitation).
//! - [`hook`]: the HTTP hook asked before a call waits for a person.
//! - [`coerce`]: tool arguments brought to the tool's schema.
//! - [`options`]: the agent's options, validated.
//! - [`prompts`]: what a turn says to the model beyond the session's
//!   messages: the default system prompt, the asks for an answer or a fix.
//! - [`tools`]: the `ToolRouter` seam to whatever executes tools.
//! - [`fork`]: forks of an agent session, from a turn end, with the
//!   sandbox's workspace as it was then.
//! - [`profiles`]: named agents of the configuration (`[agents.NAME]`),
//!   which protocol adapters address by name.

pub mod approve;
pub mod calls;
pub mod coerce;
mod context;
pub mod decide;
mod deps;
pub mod fork;
pub mod harness;
pub mod hook;
mod model_call;
pub mod options;
mod plan;
pub mod profiles;
pub mod prompts;
mod spend;
pub mod task;
pub mod tools;
pub mod turn;

pub use approve::EXPECT_PATH;
pub use deps::TurnDeps;
pub use harness::READ_ONLY_TOOLS;
pub use hook::check_hook_url;
pub use options::{
    A2aAgentSpec, AgentOptions, Compaction, EnvValue, GitSource, McpServerSpec, NetworkAllow,
    NetworkOption, RESERVED_SERVER_NAMES, SecretRef, WorkspaceOptions,
};
pub use task::AgentTask;
pub use tools::{NoTools, Seeded, ToolChunk, ToolContext, ToolOutput, ToolRouter};
