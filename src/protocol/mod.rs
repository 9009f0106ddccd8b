//! The wire format: every type a client sees, in one place (after
//! codex-rs's `protocol` crate). Nothing needs `agent` (or any other
//! session kind) to speak it.
//!
//! - [`events`]: the events of a session's log, their kinds, result
//!   statuses and usage.
//! - [`deliberation`]: proposals, agent results, decisions and the
//!   result of a deliberation.
//! - [`message`]: the conversation history: messages and tool calls.
//! - [`session`]: a session's kind, status and stored record.

pub mod deliberation;
pub mod events;
pub mod message;
pub mod session;

pub use events::{
    Approval, ContextUse, Event, EventKind, FilesChanged, InterventionKind, ResultStatus, Tokens,
    Usage,
};
pub use message::{Message, ToolCall};
pub use session::{ORIGINS, OWN_ORIGIN, SessionKind, SessionRecord, SessionStatus};
