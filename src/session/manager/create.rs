//! Making sessions: stored at once, or (a run's) with its first turn's
//! lease, in one write before that turn.

use std::sync::Arc;

use chrono::Utc;
use uuid::Uuid;

use super::{NewSession, SessionManager, StartedTurn};
use crate::protocol::{SessionRecord, SessionStatus, Usage};
use crate::session::SessionError;
use crate::session::live::Session;
use crate::session::task::TurnOptions;
use crate::store::Release;

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
        let record = self.admit(id, new).await?;
        self.store.create_session(&record).await?;
        self.metrics.sessions_created.inc();
        Ok(self.load(record, 0))
    }

    /// Makes an ephemeral session and starts its one turn (`/agent/run`):
    /// the session and, among replicas, the turn's lease are stored in one
    /// write before the turn starts (what the turn's tools read of it, its
    /// key's sandbox quota and usage, must find it), and the turn reads no
    /// messages.
    pub async fn run_new(
        &self,
        new: NewSession,
        input: String,
    ) -> Result<StartedTurn, SessionError> {
        if self.is_draining() {
            return Err(SessionError::ShuttingDown);
        }
        let record = self
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
        session.create_with_next_write(record, lease.clone());
        let held = held.map(|(held, _)| held);
        if let Err(e) = session.flush().await {
            // Never stored: nothing to delete.
            session.closed.cancel();
            self.forget(session.id);
            return Err(e.into());
        }
        self.metrics.sessions_created.inc();
        let started = self
            .start(
                session.clone(),
                input,
                false,
                TurnOptions::default(),
                Some((held, cancel)),
            )
            .await;
        if started.is_err() {
            self.remove_refused_run(&session, lease.map(|(release, _)| release))
                .await;
        }
        started
    }

    /// A run whose turn was refused (a quota, a budget, a shutdown) goes,
    /// with the session and lease its first write stored.
    async fn remove_refused_run(&self, session: &Session, lease: Option<Release>) {
        if let Err(e) = self.store.delete_session(session.id).await {
            tracing::warn!(session = %session.id, error = %e, "removing a refused run's session");
        }
        if let Some(Release { name, holder }) = lease
            && let Err(e) = self.store.lease_release(&name, &holder).await
        {
            tracing::warn!(lease = %name, error = %e, "releasing a refused run's lease");
        }
        session.closed.cancel();
        self.forget(session.id);
    }

    /// A new session's record, once its kind and its key's quota admit it.
    async fn admit(&self, id: Uuid, new: NewSession) -> Result<SessionRecord, SessionError> {
        self.tasks.require(new.kind.as_str(), "kind")?;
        if let Some(quotas) = &self.quotas {
            quotas.admit_session(new.owner.as_deref()).await?;
        }
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
            created_at: now,
            updated_at: now,
        };
        Ok(record)
    }
}
