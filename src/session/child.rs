//! A turn of another session run on behalf of this one (a deliberation's
//! tool-using agent, a pipeline's node): its events are forwarded into the
//! parent's log tagged with who ran it, and dropping the call interrupts
//! the child's turn.

use std::sync::Arc;

use futures::StreamExt;

use super::{Session, SessionManager, TurnOptions};
use crate::protocol::{EventKind, ResultStatus, Usage};

/// How the child's turn ended: its result's status and text, and what it
/// spent.
pub struct ChildResult {
    pub status: ResultStatus,
    pub text: Option<String>,
    pub usage: Usage,
    /// The last `error` event of the turn, if any.
    pub error: Option<String>,
}

/// Interrupts a child's turn unless it ended on its own.
struct InterruptOnDrop(Option<Arc<Session>>);

impl Drop for InterruptOnDrop {
    fn drop(&mut self) {
        if let Some(session) = self.0.take() {
            session.interrupt();
        }
    }
}

/// Runs a turn of `child` on `prompt` with `options` (after any turn it
/// is running) and forwards its events, but its `result`, into `parent`
/// with `tag` as their `agent_id`. An error says why no result came.
pub async fn run_turn(
    manager: &SessionManager,
    child: &Arc<Session>,
    prompt: String,
    options: TurnOptions,
    parent: &Session,
    tag: &str,
) -> Result<ChildResult, String> {
    let started = manager
        .start_turn_with(child.clone(), prompt, true, options)
        .await
        .map_err(|e| e.to_string())?;
    let mut guard = InterruptOnDrop(Some(child.clone()));
    let mut events = child.subscribe(started.since, true);
    let mut error = None;
    while let Some(event) = events.next().await {
        match &event.kind {
            EventKind::Result {
                status,
                result,
                usage,
                ..
            } => {
                guard.0 = None;
                return Ok(ChildResult {
                    status: *status,
                    text: result.clone(),
                    usage: usage.clone(),
                    error,
                });
            }
            kind => {
                if let EventKind::Error { message, .. } = kind {
                    error = Some(message.clone());
                }
                parent
                    .emit_as(tag, kind.clone())
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    Err("the session closed during its turn".into())
}
