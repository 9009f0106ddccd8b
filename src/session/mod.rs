//! The machinery every session kind shares: the live session with its
//! durable event log and streams, the turn lock, `queue` and interrupt,
//! the closing `result`, status and usage, and the turns a crash cut off.
//! What a session runs is a [`SessionTask`] of its kind; the agent turn
//! is the first.
//!
//! - [`child`]: a turn of another session run for this one, its events
//!   forwarded with a tag.
//! - [`live`]: one live session: its state, its log, interrupt.
//! - [`log`]: the [`log::EventLog`] seam (append returns the `seq`;
//!   subscribe from a `seq`) and its embedded implementation: store
//!   first, in batches, then broadcast; replay from the store.
//! - [`manager`]: create/get/list/delete sessions, run their turns, close
//!   turns a crash cut off, shut down.
//! - [`options`]: options nested or flat in a request, errors that name
//!   the option.
//! - [`task`]: the [`SessionTask`] seam and the registry of kinds.

pub mod approvals;
pub mod child;
pub mod lease;
#[cfg(test)]
mod lease_tests;
pub mod live;
pub mod log;
pub mod manager;
pub mod options;
#[cfg(test)]
mod rewind_tests;
pub mod signal;
pub mod task;
#[cfg(test)]
mod tests;

use uuid::Uuid;

pub use live::{Measured, Session};
pub use manager::{Limits, NewSession, SessionManager, StartedTurn};
pub use options::OptionError;
pub use task::{OnBehalfOf, Outcome, Preset, SessionTask, Tasks, ToolAnswer, Turn, TurnOptions};

use crate::protocol::SessionKind;
use crate::store::StoreError;

/// What the session machinery refuses, typed so the API maps each to its
/// status once (`api/error.rs`).
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("session {0} not found")]
    NotFound(Uuid),
    #[error(
        "session {0} is running a turn; interrupt it, wait for its result, or send with \"queue\": true"
    )]
    Busy(Uuid),
    #[error("session {0} is closed")]
    Closed(Uuid),
    #[error("invalid option {0}")]
    Option(#[from] OptionError),
    #[error("this server does not run {0} sessions")]
    KindNotServed(SessionKind),
    #[error(
        "this replica is draining before it stops and takes no new turns; retry on another replica"
    )]
    ShuttingDown,
    /// A check a task could not make (e.g. the sandbox backend did not
    /// answer); logged in full, answered in brief.
    #[error("{0}")]
    Internal(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The session's key is past one of its quotas.
    #[error(transparent)]
    Quota(#[from] crate::quota::QuotaExceeded),
    /// The bus between replicas refused a signal.
    #[error(transparent)]
    Bus(Box<crate::bus::BusError>),
    /// No replica took a signal for a turn that still runs.
    #[error("{0}")]
    Unreachable(String),
}

impl From<crate::quota::QuotaError> for SessionError {
    fn from(error: crate::quota::QuotaError) -> Self {
        match error {
            crate::quota::QuotaError::Exceeded(e) => SessionError::Quota(e),
            crate::quota::QuotaError::Store(e) => SessionError::Store(e),
        }
    }
}
