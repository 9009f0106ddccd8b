//! Agent sessions and their turns.
//!
//! - [`calls`]: a turn's tool calls, from a reply to their results.
//! - [`coerce`]: tool arguments brought to the tool's schema.
//! - `events`: the wire events every stream carries, re-exported from
//!   [`crate::events`] (the store keeps them too).
//! - [`options`]: session options, flat or nested, validated.
//! - [`session`]: one live session: event hub (store first, then broadcast),
//!   subscriptions with replay, interrupt.
//! - [`manager`]: create/get/list/delete sessions, start turns, recover
//!   turns a crash cut off, shut down.
//! - [`turn`]: the agent loop.
//! - [`tools`]: the `ToolRouter` seam to whatever executes tools.

pub mod calls;
pub mod coerce;
pub mod manager;
pub mod options;
pub mod session;
pub mod tools;
pub mod turn;

pub use crate::events;

pub use manager::{AgentError, NewSession, SessionManager, StartedTurn};
pub use options::{AgentOptions, McpServerSpec};
pub use session::Session;
pub use tools::{NoTools, ToolChunk, ToolContext, ToolOutput, ToolRouter};
