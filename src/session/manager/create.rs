//! Making sessions: stored at once, or (a run's) by its first turn's
//! first write, with the turn's lease.

use std::sync::Arc;

use chrono::Utc;
use uuid::Uuid;

use super::{NewSession, SessionManager, StartedTurn};
use crate::protocol::{SessionRecord, SessionStatus, Usage};
use crate::quota::HeldSlot;
use crate::session::SessionError;
use crate::session::live::Session;
use crate::session::task::TurnOptions;

impl SessionManager {
    pub async fn create(&self, new: NewSession) -> Result<Arc<Session>, SessionError> {
        self.create_with_id(Uuid::new_v4(), new).await
    }

    /// [`SessionManager::create`] with an id the caller chose: a protocol
    /// whose clients name their threads (AG-UI's `threadId`). The caller
    /// makes sure no session has it.
    pub async fn create_with_id(
        &self,
        id: Uuid,
        new: NewSession,
    ) -> Result<Arc<Session>, SessionError> {
        let (record, admitted) = self.admit(id, new).await?;
        let created = self.store.create_session(&record).await;
        // Stored (its row counts now), or not made: the slot goes.
        if let Some(admitted) = admitted {
            admitted.release().await;
        }
        created?;
        self.metrics.sessions_created.inc();
        Ok(self.load(record, 0))
    }

    /// Makes an ephemeral session and starts its one turn (`/agent/run`).
    /// The session is stored by the turn's first write, with the turn's
    /// lease among replicas, so the turn starts without waiting for a
    /// write and its first event waits for one commit. Until then no
    /// request can name it (clients learn its id from its events, which
    /// are sent once stored), and the turn reads nothing of it from the
    /// store: its tools take the session from the turn
    /// ([`SessionManager::running_here`]), its sandbox's quota and usage
    /// go to the owner the turn knows. The turn reads no messages.
    pub async fn run_new(
        &self,
        new: NewSession,
        input: String,
    ) -> Result<StartedTurn, SessionError> {
        if self.is_draining() {
            return Err(SessionError::ShuttingDown);
        }
        let (record, admitted) = self
            .admit(
                Uuid::new_v4(),
                NewSession {
                    ephemeral: true,
                    ..new
                },
            )
            .await?;
        let session = self.load(record.clone(), 0);
        // A new session's conversation: nothing stored, never cut; its
        // turn reads none.
        session.history_stored(Some(0), Some(0));
        let cancel = self.shutdown.child_token();
        let held = (self.leases.as_ref()).map(|leases| {
            (
                leases.for_new_session(session.id, cancel.clone()),
                leases.ttl(),
            )
        });
        let lease = held
            .as_ref()
            .map(|(held, ttl)| (held.lease().clone(), *ttl));
        session.create_with_next_write(record, lease);
        let held = held.map(|(held, _)| held);
        let started = self
            .start(
                session.clone(),
                input,
                false,
                TurnOptions::default(),
                Some((held, cancel, admitted)),
            )
            .await;
        match started {
            Ok(started) => {
                self.metrics.sessions_created.inc();
                Ok(started)
            }
            Err(e) => {
                // Refused (a quota, a budget, a shutdown) before the turn
                // wrote anything: the session and its lease were never
                // stored, and the held lease's renewals stop with it.
                session.closed.cancel();
                self.forget(session.id);
                Err(e)
            }
        }
    }

    /// A new session's record, once its kind and its key's quota admit
    /// it, with the `max_concurrent_sessions` slot it holds until stored.
    async fn admit(
        &self,
        id: Uuid,
        new: NewSession,
    ) -> Result<(SessionRecord, Option<HeldSlot>), SessionError> {
        self.tasks.require(new.kind.as_str(), "kind")?;
        let admitted = match &self.quotas {
            Some(quotas) => quotas.admit_session(new.owner.as_deref(), id).await?,
            None => None,
        };
        let now = Utc::now();
        let record = SessionRecord {
            id,
            name: new.name,
            kind: new.kind,
            owner: new.owner,
            options: new.options,
            // An ephemeral session exists to run its one turn: stored as
            // running from the start, it saves the turn a commit before
            // its first event.
            status: if new.ephemeral {
                SessionStatus::Running
            } else {
                SessionStatus::Idle
            },
            usage: Usage::default(),
            ephemeral: new.ephemeral,
            origin: new.origin,
            metadata: new.metadata,
            created_at: now,
            updated_at: now,
        };
        Ok((record, admitted))
    }
}
