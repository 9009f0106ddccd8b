//! Work on a session that is not a turn but must not overlap one (a
//! workspace upload): the session is held between turns, here and on
//! every other replica, until the work is done.

use std::sync::Arc;

use tokio::sync::OwnedMutexGuard;
use tokio_util::sync::CancellationToken;

use super::SessionManager;
use crate::session::SessionError;
use crate::session::lease::HeldTurn;
use crate::session::live::Session;

/// A session held between turns: no turn starts until it is released.
pub struct BetweenTurns {
    _local: OwnedMutexGuard<()>,
    held: Option<HeldTurn>,
    pub session: Arc<Session>,
}

impl BetweenTurns {
    /// Lets turns start again (on every replica).
    pub async fn release(self) {
        if let Some(held) = self.held {
            held.release().await;
        }
    }
}

impl SessionManager {
    /// Holds `session` between turns, or refuses with `Busy` while a turn
    /// runs (here, or on another replica). A turn asked for meanwhile on
    /// this replica waits for the release, as for a turn that is writing
    /// its result; on another replica it waits with `queue`, else is busy.
    pub async fn hold_between_turns(
        &self,
        session: Arc<Session>,
    ) -> Result<BetweenTurns, SessionError> {
        if self.is_draining() {
            return Err(SessionError::ShuttingDown);
        }
        let local = match session.turn_lock.clone().try_lock_owned() {
            Ok(guard) => guard,
            Err(_) => return Err(SessionError::Busy(session.id)),
        };
        if session.closed.is_cancelled() {
            return Err(SessionError::NotFound(session.id));
        }
        let (held, session) = match &self.leases {
            Some(leases) => {
                let (held, session) = self
                    .take_turn(leases, session, false, &CancellationToken::new())
                    .await?;
                (Some(held), session)
            }
            None => (None, session),
        };
        Ok(BetweenTurns {
            _local: local,
            held,
            session,
        })
    }
}
