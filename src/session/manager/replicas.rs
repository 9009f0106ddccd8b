//! The session manager with replicas sharing its store: the turn leases
//! (one turn per session among them), the store as the truth about a
//! session another replica may have changed, the turns of replicas that
//! died, and interrupts for turns that run elsewhere.

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{CUT_OFF_ELSEWHERE, LEASE_POLL, Runner, SessionManager};
use crate::protocol::{EventKind, SessionStatus};
use crate::session::SessionError;
use crate::session::lease::{HeldTurn, TakeError, Taken, TurnLeases, session_of};
use crate::session::live::Session;
use crate::session::signal::Signals;
use crate::store::SessionEnd;

impl SessionManager {
    /// Sends interrupts for turns of other replicas over `bus`, and takes
    /// theirs once [`SessionManager::listen`] runs.
    pub fn with_signals(mut self, bus: Arc<dyn crate::bus::Bus>) -> SessionManager {
        self.signals = Some(Arc::new(Signals::new(bus)));
        self
    }

    /// Interrupts this replica's turns that other replicas were asked to
    /// interrupt, until `stop` (nothing to do without signals).
    pub async fn listen(self: Arc<Self>, stop: CancellationToken) {
        let Some(signals) = self.signals.clone() else {
            return;
        };
        if let Err(e) = signals.listen(Arc::downgrade(&self), stop).await {
            tracing::error!(error = %e, "this replica cannot take interrupts from the others");
        }
    }

    /// Stops the session's turn if it runs on this replica: true if it
    /// did.
    pub(in crate::session) fn interrupt_here(&self, id: Uuid) -> bool {
        let session = self.live().get(&id).cloned();
        session.is_some_and(|session| session.interrupt_here())
    }

    /// Stops the session's running turn wherever it runs, and answers once
    /// it has: true if a turn was running and was stopped, false if none
    /// runs. With replicas, a turn that runs elsewhere is stopped only
    /// when its replica acknowledges the interrupt; none doing so while
    /// the session still runs is an error ([`SessionError::Unreachable`]),
    /// never a `true`.
    pub async fn interrupt(&self, session: &Arc<Session>) -> Result<bool, SessionError> {
        if session.interrupt_here() {
            return Ok(true);
        }
        let Some(signals) = &self.signals else {
            return Ok(false);
        };
        if session.status() != SessionStatus::Running {
            return Ok(false);
        }
        if signals
            .interrupt_acked(session.id)
            .await
            .map_err(|e| SessionError::Bus(Box::new(e)))?
        {
            return Ok(true);
        }
        // Nobody took it: the turn ended meanwhile, or its replica is gone.
        match self.store.get_session(session.id).await? {
            Some(record) if record.status == SessionStatus::Running => {
                Err(SessionError::Unreachable(format!(
                    "the replica running session {}'s turn did not take the interrupt within {} s \
                     (it may have stopped: the turn is closed as interrupted once its lease \
                     expires); retry",
                    session.id,
                    crate::session::signal::ACK_WAIT.as_secs()
                )))
            }
            _ => Ok(false),
        }
    }

    /// With replicas, the store is the truth: another replica may have run
    /// a turn of this session or deleted it since this copy was loaded.
    pub(in crate::session) async fn refreshed(
        &self,
        session: Arc<Session>,
    ) -> Result<Arc<Session>, SessionError> {
        if session.is_running() {
            return Ok(session);
        }
        match self.store.get_session(session.id).await? {
            Some(record) => {
                session.update_from(&record);
                Ok(session)
            }
            None => {
                session.closed.cancel();
                self.forget(session.id);
                Err(SessionError::NotFound(session.id))
            }
        }
    }

    /// Takes the session's turn lease: at once, or without `queue` after a
    /// turn that has already stored its result lets go; with `queue` once
    /// the running turn ends, on whichever replica. Answers the session
    /// as the store has it now, its log continuing from the store's last
    /// `seq` (another replica may have run turns since this copy loaded).
    pub(in crate::session) async fn take_turn(
        &self,
        leases: &TurnLeases,
        session: Arc<Session>,
        queue: bool,
        cancel: &CancellationToken,
    ) -> Result<(HeldTurn, Arc<Session>), SessionError> {
        // A turn that has stored its result is only writing its state out:
        // wait for it up to a lease (past that, its replica died and the
        // lease has expired).
        let finishing_for = leases.ttl();
        let started = Instant::now();
        loop {
            if let Some((held, end)) = self.take_lease(leases, &session, cancel).await? {
                let session = self.resync(session, end);
                // Still `running` under a lease that was free, with a log:
                // its turn's replica died before a sweep closed it. It is
                // closed first, so the log ends that turn before this one
                // starts. (A session stored running with no event yet is
                // an ephemeral one about to take its first turn.)
                if session.status() == SessionStatus::Running
                    && session.last_seq() > 0
                    && let Err(e) = self.close_here(&session, CUT_OFF_ELSEWHERE).await
                {
                    held.release().await;
                    return Err(e);
                }
                return Ok((held, session));
            }
            if !queue {
                let finishing = self.stored_result(&session).await?;
                if !finishing || started.elapsed() > finishing_for {
                    return Err(SessionError::Busy(session.id));
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(LEASE_POLL) => {}
                _ = self.shutdown.cancelled() => return Err(SessionError::ShuttingDown),
                _ = session.closed.cancelled() => return Err(SessionError::NotFound(session.id)),
            }
        }
    }

    /// Whether the session's last stored event is a `result`.
    async fn stored_result(&self, session: &Session) -> Result<bool, SessionError> {
        let last = self.store.last_seq(session.id).await?;
        let events = self
            .store
            .events_since(session.id, last.saturating_sub(1), 1)
            .await?;
        Ok(events
            .first()
            .is_some_and(|e| matches!(e.kind, EventKind::Result { .. })))
    }

    /// Takes the session's turn lease and reads the session as stored;
    /// `None` while another turn holds it. A session deleted elsewhere is
    /// forgotten here.
    async fn take_lease(
        &self,
        leases: &TurnLeases,
        session: &Session,
        lost: &CancellationToken,
    ) -> Result<Option<(HeldTurn, SessionEnd)>, SessionError> {
        match leases.take_turn(session.id, lost.clone()).await {
            Ok(taken) => Ok(taken),
            Err(TakeError::Store(e)) => Err(e.into()),
            Err(TakeError::NoSession) => {
                session.closed.cancel();
                self.forget(session.id);
                Err(SessionError::NotFound(session.id))
            }
        }
    }

    /// The session as `end` says the store has it, its log continuing
    /// from the stored events.
    fn resync(&self, session: Arc<Session>, end: SessionEnd) -> Arc<Session> {
        // The same last `seq`: this copy's log is up to date (no turn ran
        // elsewhere since its last, or it followed them). A fresh copy
        // keeps no history.
        let session = if end.last_seq == session.last_seq() {
            session.update_from(&end.record);
            session
        } else {
            let log = self
                .logs
                .open(session.id, end.last_seq, session.closed.clone());
            let fresh = Arc::new(session.reloaded(end.record, log));
            self.live().insert(session.id, fresh.clone());
            fresh
        };
        session.history_stored(end.messages, end.cuts);
        session
    }

    /// Closes the turns of replicas that died: each turn lease that expired
    /// is taken over and its turn closed as `interrupted`. Answers how many.
    pub async fn close_abandoned(&self) -> Result<usize, SessionError> {
        let Some(leases) = &self.leases else {
            return Ok(0);
        };
        let mut closed = 0;
        for lease in leases.abandoned().await? {
            let Some(id) = session_of(&lease) else {
                continue;
            };
            let session = match self.get(id, None).await {
                Ok(session) => session,
                Err(SessionError::NotFound(_)) => {
                    // Deleted meanwhile: the lease only has to go.
                    if let Taken::Held(held) = leases.take(id, CancellationToken::new()).await? {
                        held.release().await;
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            if self
                .close_if_cut_off(leases, session.clone(), CUT_OFF_ELSEWHERE)
                .await?
            {
                closed += 1;
                if self.task_of(&session)?.resumes_when_cut_off() {
                    // Closing it may have reloaded the session.
                    let session = self.get(id, None).await?;
                    match self.start_turn(session, String::new(), false).await {
                        Ok(_) => {
                            tracing::info!(%id, "resumed a turn another replica's death cut off")
                        }
                        Err(e) => tracing::warn!(%id, error = %e, "resuming a cut-off turn failed"),
                    }
                }
            }
        }
        Ok(closed)
    }

    /// Takes a free or expired turn lease and closes the turn it guarded
    /// if the session is still `running`; false when a live turn holds it.
    pub(in crate::session) async fn close_if_cut_off(
        &self,
        leases: &TurnLeases,
        session: Arc<Session>,
        message: &str,
    ) -> Result<bool, SessionError> {
        let _local = session.turn_lock.clone().lock_owned().await;
        let Some((held, end)) = self
            .take_lease(leases, &session, &CancellationToken::new())
            .await?
        else {
            return Ok(false);
        };
        let outcome = async {
            let session = self.resync(session, end);
            if session.status() != SessionStatus::Running {
                return Ok(false);
            }
            self.close_here(&session, message).await?;
            Ok::<_, SessionError>(true)
        }
        .await;
        held.release().await;
        outcome
    }

    /// Closes the cut-off turn of a session whose lease this replica holds
    /// now: an `interrupted` result saying why.
    async fn close_here(&self, session: &Arc<Session>, message: &str) -> Result<(), SessionError> {
        let task = self.task_of(session)?.clone();
        let runner = Runner {
            task,
            metrics: self.metrics.clone(),
            turn_timeout: self.limits.turn_timeout,
            turn_slot: Default::default(),
            lease: None,
            storage: self.storage.clone(),
        };
        runner.close_cut_off(session, message).await?;
        Ok(())
    }
}
