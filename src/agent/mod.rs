//! The agent: the first session kind. A turn is a model with tools:
//! model call → tool calls → model call … until it answers.
//!
//! - [`task`]: [`AgentTask`], the agent as a [`crate::session::SessionTask`]:
//!   its options checked before the session exists, its turns.
//! - [`turn`]: the agent loop.
//! - [`calls`]: a turn's tool calls, from a reply to their results.
//! - [`approve`]: whether a call runs, or waits for a decision.
//! - [`paths`]: file tools' paths resolved before the rules, held to what
//!   opens; searches filtered by deny rules.
//! - [`hook`]: the HTTP hook asked before a call waits for a person.
//! - [`coerce`]: tool arguments brought to the tool's schema.
//! - [`options`]: the agent's options, validated.
//! - [`prompts`]: what a turn says to the model beyond the session's
//!   messages: the default system prompt, the asks for an answer or a fix.
//! - [`tools`]: the `ToolRouter` seam to whatever executes tools.

pub mod approve;
pub mod calls;
pub mod coerce;
pub mod decide;
mod deps;
pub mod fork;
pub mod harness;
pub mod hook;
mod model_call;
pub mod options;
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
pub use options::{A2aAgentSpec, AgentOptions, McpServerSpec, RESERVED_SERVER_NAMES};
pub use task::AgentTask;
pub use tools::{NoTools, ToolChunk, ToolContext, ToolOutput, ToolRouter};
