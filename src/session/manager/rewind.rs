//! Rewinds: a session taken back to an earlier turn end, as if the turns
//! after it had not happened. The history is cut back to what it held at
//! that end; the event log stays append-only and says so with `rewound`.

use super::SessionManager;
use crate::protocol::EventKind;
use crate::session::live::Session;
use crate::session::{OptionError, SessionError};

/// Events read per page while looking for the turn end.
const PAGE: usize = 4096;

/// Where the history stood at a point of the log: its seq and how many
/// messages it held (`None`: not known, a turn closed by a restart).
type End = (u64, Option<u64>);

impl SessionManager {
    /// Rewinds the session to its last turn end at or before `at_seq`:
    /// the stored history and the one the session keeps are cut back to
    /// that end's `history_len`, and a `rewound` event says so. Nothing
    /// happens when no event came after that end. The caller holds the
    /// session's turn, so no turn runs meanwhile.
    pub(in crate::session) async fn rewind(
        &self,
        session: &Session,
        at_seq: u64,
    ) -> Result<(), SessionError> {
        let (to_seq, history_len) = self.end_before(session, at_seq).await?;
        if to_seq >= session.last_seq() {
            return Ok(());
        }
        let Some(history_len) = history_len else {
            return Err(SessionError::Option(OptionError::new(
                "rewind",
                format!(
                    "the history at the turn end {to_seq} is not known (the turn was closed by a restart)"
                ),
            )));
        };
        session
            .rewind_history(usize::try_from(history_len).unwrap_or(usize::MAX))
            .await?;
        // The workspace stays as the last turn left it: restoring the
        // sandbox from the snapshot of that turn end is not done yet.
        session.emit(EventKind::Rewound {
            to_seq,
            history_len,
            workspace: "kept".into(),
        })?;
        session.flush().await?;
        Ok(())
    }

    /// The last point at or before `at_seq` where the history is known
    /// whole: a turn's `result`, an earlier rewind, or the fork the
    /// session started as; `(0, Some(0))` before all of them.
    async fn end_before(&self, session: &Session, at_seq: u64) -> Result<End, SessionError> {
        let mut end: End = (0, Some(0));
        let mut since = 0;
        loop {
            let page = self.store.events_since(session.id, since, PAGE).await?;
            let Some(last) = page.last() else { break };
            since = last.seq;
            for event in page.iter().take_while(|e| e.seq <= at_seq) {
                match &event.kind {
                    EventKind::Result { history_len, .. } => end = (event.seq, *history_len),
                    EventKind::Rewound { history_len, .. } => {
                        end = (event.seq, Some(*history_len));
                    }
                    EventKind::Forked { history_len, .. } => end = (event.seq, *history_len),
                    _ => {}
                }
            }
            if page.len() < PAGE || since >= at_seq {
                break;
            }
        }
        Ok(end)
    }
}
