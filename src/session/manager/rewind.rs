//! Rewinds: a session taken back to an earlier turn end, as if the turns
//! after it had not happened. The history is cut back to what it held at
//! that end; the event log stays append-only and says so with `rewound`.

use std::collections::HashMap;
use std::sync::Arc;

use super::SessionManager;
use crate::protocol::EventKind;
use crate::session::live::Session;
use crate::session::{OptionError, SessionError, SessionTask};

/// Events read per page while looking for the turn end.
const PAGE: usize = 4096;

/// Where the history stood at a point of the log: its seq, how many
/// messages it held (`None`: not known, a turn closed by a restart), and
/// the turn end whose workspace it had (a rewind's is the one it went
/// back to).
type End = (u64, Option<u64>, u64);

impl SessionManager {
    /// Rewinds the session to its last turn end at or before `at_seq`:
    /// the stored history and the one the session keeps are cut back to
    /// that end's `history_len`, and a `rewound` event says so. Nothing
    /// happens when no event came after that end. The caller holds the
    /// session's turn, so no turn runs meanwhile.
    pub(in crate::session) async fn rewind(
        &self,
        task: &dyn SessionTask,
        session: &Arc<Session>,
        at_seq: u64,
    ) -> Result<(), SessionError> {
        let (to_seq, history_len, files_at) = self.end_before(session, at_seq).await?;
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
        // The files first: a rewind that fails after them has cut no
        // history, and the restore waits for the next sandbox to be made.
        let restored = task.rewind_workspace(session, files_at).await;
        session
            .rewind_history(usize::try_from(history_len).unwrap_or(usize::MAX))
            .await?;
        session.emit(EventKind::Rewound {
            to_seq,
            history_len,
            workspace: if restored { "restored" } else { "kept" }.into(),
        })?;
        session.flush().await?;
        Ok(())
    }

    /// The last point at or before `at_seq` where the history is known
    /// whole: a turn's `result`, an earlier rewind, the fork the session
    /// started as, or files put in between turns; `(0, Some(0), 0)` before all of them.
    async fn end_before(&self, session: &Session, at_seq: u64) -> Result<End, SessionError> {
        let mut end: End = (0, Some(0), 0);
        // Each earlier rewind's seq and the turn end whose files it has.
        let mut rewinds: HashMap<u64, u64> = HashMap::new();
        let mut since = 0;
        loop {
            let page = self.store.events_since(session.id, since, PAGE).await?;
            let Some(last) = page.last() else { break };
            since = last.seq;
            for event in page.iter().take_while(|e| e.seq <= at_seq) {
                match &event.kind {
                    EventKind::Result { history_len, .. } => {
                        end = (event.seq, *history_len, event.seq);
                    }
                    EventKind::Rewound {
                        history_len,
                        to_seq,
                        ..
                    } => {
                        let files_at = rewinds.get(to_seq).copied().unwrap_or(*to_seq);
                        rewinds.insert(event.seq, files_at);
                        end = (event.seq, Some(*history_len), files_at);
                    }
                    EventKind::Forked { history_len, .. } => {
                        end = (event.seq, *history_len, event.seq);
                    }
                    // Files put in between turns stay: a point of its
                    // own (as for forks), the history as it was, the
                    // workspace the upload's (it has its own snapshot).
                    EventKind::WorkspaceUploaded { .. } => end = (event.seq, end.1, event.seq),
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
