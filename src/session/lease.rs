//! Turns across replicas. Replicas that share a store (PostgreSQL) run a
//! session's turns one at a time among all of them: a turn holds the lease
//! `turn:{session}` in the store, which its replica renews every third of
//! `cluster.turn_lease_s`. A replica that dies stops renewing; once the
//! lease has expired a survivor takes it and closes the cut-off turn as
//! `interrupted`, so the session takes messages again anywhere.
//!
//! A turn that loses its lease (its replica could not reach the store for
//! a whole lease, and another replica closed the turn) is cancelled: two
//! replicas never run one session's turn at once.
//!
//! Most turns end long before their first renewal is due, so a turn
//! starts no task of its own: it enters the replica's register of held
//! leases, which one task looks over every sixth of a lease, and only a
//! turn still running at half its first renewal's wait gets a task that
//! renews it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use uuid::Uuid;

use crate::store::{Lease, Release, SessionEnd, Store, StoreError, TurnLease};
use crate::sync::lock;

/// The leases of this replica's turns.
pub struct TurnLeases {
    store: Arc<dyn Store>,
    /// This process among the replicas: host name and a random id.
    replica: String,
    ttl: Duration,
    register: Arc<Mutex<Register>>,
}

/// The leases this replica's turns hold, in the order they were taken
/// (all have one length, so also in the order their renewals fall due).
#[derive(Default)]
struct Register {
    next: u64,
    held: BTreeMap<u64, Entry>,
}

/// A held lease, and its renewals once they have started.
struct Entry {
    taken: Instant,
    release: Release,
    releasing: Arc<AtomicBool>,
    lost: CancellationToken,
    unstored: bool,
    renewals: Option<DropGuard>,
}

/// A turn's place in the register; its drop takes the lease out, which
/// stops its renewals.
struct Registered {
    register: Arc<Mutex<Register>>,
    key: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        // Dropped after the lock is let go: its guard stops the renewer.
        let entry = lock(&self.register).held.remove(&self.key);
        drop(entry);
    }
}

/// A turn's lease while it runs; renewed in the background until
/// [`HeldTurn::release`] (or its drop, which stops the renewals and lets
/// the lease expire). A turn gives it up with its result's write
/// ([`HeldTurn::release_with_result`]); `release` then has nothing left
/// to write.
pub struct HeldTurn {
    store: Arc<dyn Store>,
    release: Release,
    /// Set once the lease is to go with the turn's last write: a renewal
    /// that then finds it gone stops without calling the turn lost.
    releasing: Arc<AtomicBool>,
    /// Set once that write is stored.
    released: AtomicBool,
    _renewals: Registered,
}

/// What taking a session's turn lease found.
pub enum Taken {
    Held(HeldTurn),
    /// Another turn has it, on this replica or another.
    Busy(Lease),
}

/// Why a session's turn lease was not taken, besides its being busy.
#[derive(Debug, thiserror::Error)]
pub enum TakeError {
    #[error("no such session")]
    NoSession,
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub fn lease_name(session: Uuid) -> String {
    format!("turn:{session}")
}

/// The session of a lease's name, for the leases of turns.
pub fn session_of(lease: &Lease) -> Option<Uuid> {
    lease
        .name
        .strip_prefix("turn:")
        .and_then(|id| Uuid::parse_str(id).ok())
}

impl TurnLeases {
    pub fn new(store: Arc<dyn Store>, ttl: Duration) -> TurnLeases {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        let register = Arc::new(Mutex::new(Register::default()));
        tokio::spawn(look_over(Arc::downgrade(&register), store.clone(), ttl));
        TurnLeases {
            store,
            replica: format!("{host}-{}", Uuid::new_v4().simple()),
            ttl,
            register,
        }
    }

    /// This replica's name in the leases it holds.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// How long a dead replica's turn stays held.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Takes the session's turn lease for one turn. While held it is
    /// renewed; if a renewal finds it taken by another holder, or none
    /// succeeds for a whole lease, `lost` is cancelled (the turn stops).
    pub async fn take(&self, session: Uuid, lost: CancellationToken) -> Result<Taken, StoreError> {
        let (name, holder) = self.names(session);
        let lease = self.store.lease_acquire(&name, &holder, self.ttl).await?;
        if lease.holder != holder {
            return Ok(Taken::Busy(lease));
        }
        Ok(Taken::Held(self.held(
            Release { name, holder },
            lost,
            false,
        )))
    }

    /// [`TurnLeases::take`] for a session that must exist, reading it as
    /// the store has it once the lease is taken (one round trip where the
    /// store can).
    pub async fn take_turn(
        &self,
        session: Uuid,
        lost: CancellationToken,
    ) -> Result<Option<(HeldTurn, SessionEnd)>, TakeError> {
        let (name, holder) = self.names(session);
        match self
            .store
            .take_turn(session, (&name, &holder), self.ttl)
            .await?
        {
            TurnLease::Held(end) => Ok(Some((
                self.held(Release { name, holder }, lost, false),
                *end,
            ))),
            TurnLease::Busy => Ok(None),
            TurnLease::NoSession => Err(TakeError::NoSession),
        }
    }

    /// The lease of the first turn of a session made with its first
    /// write, which takes the lease in the store (see
    /// [`crate::store::Creation`]); until that write its renewals find
    /// nothing and wait, for up to a lease.
    pub fn for_new_session(&self, session: Uuid, lost: CancellationToken) -> HeldTurn {
        let (name, holder) = self.names(session);
        self.held(Release { name, holder }, lost, true)
    }

    /// The lease's name for `session` and a holder name for one turn: two
    /// turns of one replica exclude each other as turns of two replicas do.
    fn names(&self, session: Uuid) -> (String, String) {
        let holder = format!("{}/{}", self.replica, Uuid::new_v4().simple());
        (lease_name(session), holder)
    }

    /// A lease just taken (or, `unstored`, to be taken by its session's
    /// first write), renewed from now on.
    fn held(&self, release: Release, lost: CancellationToken, unstored: bool) -> HeldTurn {
        let releasing = Arc::new(AtomicBool::new(false));
        let entry = Entry {
            taken: Instant::now(),
            release: release.clone(),
            releasing: releasing.clone(),
            lost,
            unstored,
            renewals: None,
        };
        let key = {
            let mut register = lock(&self.register);
            let key = register.next;
            register.next += 1;
            register.held.insert(key, entry);
            key
        };
        HeldTurn {
            store: self.store.clone(),
            release,
            releasing,
            released: AtomicBool::new(false),
            _renewals: Registered {
                register: self.register.clone(),
                key,
            },
        }
    }

    /// How many leases this replica holds, and how many of them it renews.
    #[cfg(test)]
    pub(super) fn registered(&self) -> (usize, usize) {
        let register = lock(&self.register);
        let renewing = register
            .held
            .values()
            .filter(|entry| entry.renewals.is_some())
            .count();
        (register.held.len(), renewing)
    }

    /// The turn leases whose replicas stopped renewing them.
    pub async fn abandoned(&self) -> Result<Vec<Lease>, StoreError> {
        self.store.leases_expired("turn:").await
    }
}

impl HeldTurn {
    /// The lease's name and holder.
    pub fn lease(&self) -> &Release {
        &self.release
    }

    /// The lease, to be given up in the write of the turn's `result`:
    /// from now on a renewal that finds it gone stops quietly.
    pub fn release_with_result(&self) -> Release {
        self.releasing.store(true, Ordering::Release);
        self.release.clone()
    }

    /// The write that gave the lease up is stored.
    pub fn released_with_result(&self) {
        self.released.store(true, Ordering::Release);
    }

    /// Stops the renewals and gives the lease up, unless the turn's
    /// result did.
    pub async fn release(self) {
        let HeldTurn {
            store,
            release,
            released,
            _renewals,
            ..
        } = self;
        drop(_renewals);
        if released.load(Ordering::Acquire) {
            return;
        }
        if let Err(e) = store.lease_release(&release.name, &release.holder).await {
            // It expires on its own; a survivor then finds the turn settled.
            tracing::warn!(lease = %release.name, error = %e, "releasing a turn's lease failed");
        }
    }
}

/// Looks over the register every sixth of a lease, for as long as its
/// [`TurnLeases`] lasts, and starts the renewals of each lease held for
/// half a third of a lease or more: before its first renewal falls due.
async fn look_over(register: Weak<Mutex<Register>>, store: Arc<dyn Store>, ttl: Duration) {
    let every = ttl / 3;
    let mut ticks = tokio::time::interval((every / 2).max(Duration::from_millis(1)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(register) = register.upgrade() else {
            return;
        };
        let now = Instant::now();
        let mut register = lock(&register);
        for entry in register.held.values_mut() {
            if now.saturating_duration_since(entry.taken) < every / 2 {
                // Taken in order: the rest are younger.
                break;
            }
            if entry.renewals.is_none() {
                let stop = CancellationToken::new();
                tokio::spawn(renew(store.clone(), entry, ttl, stop.clone()));
                entry.renewals = Some(stop.drop_guard());
            }
        }
    }
}

/// Renews a lease every third of its length, counted from when it was
/// taken, until `stop`; cancels `lost` when it is another holder's or
/// could not be renewed for a whole lease. Once `releasing` is set, a
/// lease found gone was given up by the turn; with `unstored`, a lease
/// not found before it was ever renewed is still to be taken by its
/// session's first write, for up to a lease.
fn renew(
    store: Arc<dyn Store>,
    entry: &Entry,
    ttl: Duration,
    stop: CancellationToken,
) -> impl Future<Output = ()> + Send + use<> {
    let Release { name, holder } = entry.release.clone();
    let releasing = entry.releasing.clone();
    let lost = entry.lost.clone();
    let mut unstored = entry.unstored;
    let mut renewed = entry.taken;
    async move {
        let every = ttl / 3;
        let mut due = renewed + every;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(due) => {}
            }
            // Only extended, never taken again: a renewal that meets a
            // lease released meanwhile (with the turn's result) must not
            // bring it back.
            match store.lease_renew(&name, &holder, ttl).await {
                Ok(Some(_)) => {
                    renewed = Instant::now();
                    unstored = false;
                }
                Ok(None) if releasing.load(Ordering::Acquire) => return,
                Ok(None) if unstored && renewed.elapsed() < ttl => {}
                Ok(None) => {
                    tracing::error!(lease = %name,
                        "this turn's lease was taken by another replica; the turn stops");
                    lost.cancel();
                    return;
                }
                Err(e) if renewed.elapsed() >= ttl => {
                    tracing::error!(lease = %name, error = %e,
                        "this turn's lease could not be renewed for a whole lease; the turn stops");
                    lost.cancel();
                    return;
                }
                Err(e) => {
                    tracing::warn!(lease = %name, error = %e, "renewing a turn's lease failed")
                }
            }
            due = Instant::now() + every;
        }
    }
}
