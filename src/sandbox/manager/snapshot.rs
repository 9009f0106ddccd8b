//! The manager's side of workspace snapshots ([`crate::sandbox::snapshots`]):
//! one at each turn end of a session whose sandbox lives, and a new
//! sandbox seeded from one.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use uuid::Uuid;

use super::{Hold, SandboxFor, SandboxManager, lock};
use crate::sandbox::snapshots::{Seed, Snapshots, TurnEnd};
use crate::sandbox::{Result, Sandbox};

impl SandboxManager {
    /// Takes a snapshot of each session's workspace at its turn ends.
    pub fn with_snapshots(mut self, snapshots: Snapshots) -> SandboxManager {
        self.snapshots = Some(Arc::new(snapshots));
        self
    }

    /// The snapshots, where this server takes them.
    pub fn snapshots(&self) -> Option<&Arc<Snapshots>> {
        self.snapshots.as_ref()
    }

    /// Starts the snapshot of the session's workspace at the turn end
    /// `seq`, if its sandbox lives here; the session's next lease waits
    /// for it. Returns at once.
    ///
    /// A session's snapshots are recorded in the order of its turn ends:
    /// each waits for the one started before it, which a turn that leased
    /// no sandbox does not wait for before it ends. Such a turn end shares
    /// the snapshot before it, or, when that one failed, takes its own.
    pub fn snapshot_turn(&self, session: Uuid, owner: Option<&str>, seq: u64) {
        let Some(snapshots) = self.snapshots.clone().filter(|s| s.keep_last() > 0) else {
            return;
        };
        let Some(slot) = lock(&self.slots).get(&session).cloned() else {
            return;
        };
        let Some(sandbox) = slot.sandbox.get().cloned() else {
            return;
        };
        // Counted before this returns: the turn lock is still held, so no
        // call of the next turn has leased the sandbox yet.
        slot.snapshotting.send_modify(|running| *running += 1);
        let dirty = slot.dirty.swap(false, Ordering::AcqRel);
        let (recorded, next) = tokio::sync::oneshot::channel();
        let before = lock(&slot.last_snapshot).replace(next);
        let hold = Hold::new(slot.clone());
        let owner = owner.map(str::to_owned);
        let backend = self.backend.name();
        self.snapshotting.spawn(async move {
            // One that ended without saying (its task was dropped) did
            // not record its turn end either.
            let before_recorded = match before {
                Some(before) => before.await.unwrap_or(false),
                None => true,
            };
            let dirty = dirty || !before_recorded;
            let end = TurnEnd {
                session,
                owner: owner.as_deref(),
                seq,
                dirty,
                backend,
                image: &slot.spec.image,
            };
            let started = std::time::Instant::now();
            let taken = snapshots.take(end, sandbox.as_ref()).await;
            match &taken {
                Ok(()) => tracing::debug!(%session, seq, ms = started.elapsed().as_millis() as u64, dirty, "workspace snapshot taken"),
                // The turn end has no snapshot to fork from; the next
                // one learns it from `recorded` and takes its own.
                Err(e) => {
                    tracing::warn!(%session, seq, error = %e, "the workspace snapshot of a turn end failed")
                }
            }
            let _ = recorded.send(taken.is_ok());
            slot.snapshotting.send_modify(|running| *running -= 1);
            drop(hold);
        });
    }

    /// Drops the deleted session's snapshots (those another session
    /// started from stay).
    pub async fn forget_snapshots(&self, session: Uuid) {
        if let Some(snapshots) = &self.snapshots
            && let Err(e) = snapshots.forget_session(session).await
        {
            tracing::warn!(%session, error = %e, "the deleted session's snapshots stay stored");
        }
    }

    /// Waits until the snapshots of the session's turn ends under way,
    /// if any, are recorded.
    pub async fn snapshot_settled(&self, session: Uuid) {
        let Some(slot) = lock(&self.slots).get(&session).cloned() else {
            return;
        };
        let _ = slot
            .snapshotting
            .subscribe()
            .wait_for(|running| *running == 0)
            .await;
    }

    /// Waits for the snapshots under way (a stopping server).
    pub async fn snapshots_settled(&self) {
        self.snapshotting.close();
        self.snapshotting.wait().await;
        self.snapshotting.reopen();
    }

    /// Makes the session's next sandbox start from its workspace at the
    /// turn end `seq` (a rewind) and destroys the one it has here: true
    /// once that is done; false, with the files left as they are, when
    /// that workspace is no longer kept, snapshots are off here, or the
    /// record could not be written.
    pub async fn rewind_workspace(&self, session: Uuid, seq: u64) -> bool {
        let Some(snapshots) = &self.snapshots else {
            return false;
        };
        // The last turn end's snapshot reads the sandbox about to go.
        self.snapshot_settled(session).await;
        match snapshots.rewind(session, seq).await {
            Ok(true) => {
                self.release_shared(session).await;
                true
            }
            Ok(false) => false,
            Err(e) => {
                tracing::warn!(%session, seq, error = %e, "the rewound session keeps its workspace");
                false
            }
        }
    }

    /// Fills a sandbox just made for `session`: from the turn end a rewind
    /// went back to, or else from the snapshot `seed` unless the session
    /// already had a sandbox of its own at a turn end (then a new sandbox
    /// is a fresh one, as for any session whose sandbox went idle). A
    /// sandbox that cannot be filled is destroyed.
    pub(super) async fn seeded(
        &self,
        session: Uuid,
        sandbox: Arc<dyn Sandbox>,
        whose: &SandboxFor,
        seed: Option<&str>,
    ) -> Result<Arc<dyn Sandbox>> {
        let (SandboxFor::Session { owner }, Some(snapshots)) = (whose, self.snapshots.as_ref())
        else {
            return Ok(sandbox);
        };
        let filled = async {
            // Only a server that takes turn-end snapshots records rewinds.
            let rewound = match snapshots.keep_last() {
                0 => None,
                _ => snapshots.pending(session).await?,
            };
            let from = match &rewound {
                Some(restore) => restore.snapshot.as_deref().or(seed),
                None if seed.is_some() && !snapshots.has_any(session).await? => seed,
                None => None,
            };
            if let Some(snapshot) = from {
                let seed = Seed {
                    snapshot,
                    session,
                    owner: owner.as_deref(),
                };
                snapshots.restore(seed, sandbox.as_ref()).await?;
            }
            match rewound {
                Some(restore) => snapshots.restored(session, &restore).await,
                None => Ok(()),
            }
        };
        match filled.await {
            Ok(()) => Ok(sandbox),
            Err(e) => {
                if let Err(destroyed) = sandbox.destroy().await {
                    tracing::warn!(%session, error = %destroyed, "destroying a sandbox that could not be filled failed");
                }
                Err(e)
            }
        }
    }

    /// A sandbox the session had before, taken over: a rewind recorded
    /// while it lived (one a crash cut short before the sandbox went) no
    /// longer applies to it.
    pub(super) async fn kept_over(
        &self,
        session: Uuid,
        sandbox: Arc<dyn Sandbox>,
    ) -> Arc<dyn Sandbox> {
        if let Some(snapshots) = self.snapshots.as_ref().filter(|s| s.keep_last() > 0) {
            let dropped = match snapshots.pending(session).await {
                Ok(Some(restore)) => snapshots.restored(session, &restore).await,
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            };
            if let Err(e) = dropped {
                tracing::warn!(%session, error = %e, "a rewound workspace's record stays");
            }
        }
        sandbox
    }
}
