//! How full a session's context window is, as its status shows it: what
//! the session's last turn reported in its `result`.

use super::SessionManager;
use crate::protocol::events::{ContextUse, EventKind};
use crate::session::SessionError;
use crate::session::live::Session;

/// How many of the log's last events are read for the last `result`: a
/// turn's `result` is its last event, and what follows it before the next
/// turn's (its sandbox's events, the next prompt) is a few.
const TAIL: usize = 32;

impl SessionManager {
    /// The window use the session's last turn reported: the one this
    /// process measured, else the last `result` in the stored log (a
    /// session run before a restart or on another replica). `None` before
    /// any turn called a model, or when the last `result` is further back
    /// than the log's last events (a turn under way elsewhere).
    pub async fn context_use(&self, session: &Session) -> Result<Option<ContextUse>, SessionError> {
        if let Some(measured) = session.measured() {
            return Ok(Some(measured.context));
        }
        // The store's, not this process's: another replica may have
        // logged turns since this one last saw the session.
        let last = self.store.last_seq(session.id).await?;
        let tail = self
            .store
            .events_since(session.id, last.saturating_sub(TAIL as u64), TAIL)
            .await?;
        Ok(tail
            .into_iter()
            .rev()
            .find_map(|event| match event.kind {
                EventKind::Result { context, .. } => Some(context),
                _ => None,
            })
            .flatten())
    }
}
