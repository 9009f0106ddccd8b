//! One sandbox per session, created at its first tool call.
//!
//! The manager keeps the live sandboxes by session, destroys those idle
//! longer than the TTL, refuses new ones past the cap, keeps a warm pool of
//! ready sandboxes of the default spec (so a new session's first exec does
//! not wait for a container start), and at start-up reaps what a previous
//! run left behind: pool sandboxes, and those whose session is gone.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{Notify, OnceCell, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use utoipa::ToSchema;
use uuid::Uuid;

use super::{
    LABEL_CREATED, LABEL_EXPIRES, LABEL_INSTANCE, LABEL_MANAGED, LABEL_POOL, LABEL_SESSION, Result,
    Sandbox, SandboxBackend, SandboxError, SandboxSpec, SandboxStats,
};
use crate::config::SandboxConfig;
use crate::sync::lock;

/// A session's sandbox as its status shows it.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SandboxInfo {
    pub backend: String,
    pub id: String,
    /// `running`, `paused` (idle for `sandbox.pause_after_s`; the next
    /// tool call resumes it), or `gone` when the backend no longer has it.
    pub state: String,
    pub image: String,
    #[serde(flatten)]
    pub stats: SandboxStats,
}

struct Slot {
    spec: SandboxSpec,
    sandbox: OnceCell<Arc<dyn Sandbox>>,
    /// Leases held now; an idle sandbox is one with none.
    leases: AtomicUsize,
    /// Signalled whenever a lease ends.
    released: Notify,
    last_used: Mutex<Instant>,
    /// When the session took the slot, whence its sandbox's wall time counts.
    born: Instant,
    /// The latest resource sample, so a status call never waits on the
    /// backend's stats (docker's take tens of milliseconds).
    sampled: Mutex<Option<stats::Sample>>,
    sampling: std::sync::atomic::AtomicBool,
    /// Leased since the last snapshot of its workspace.
    dirty: std::sync::atomic::AtomicBool,
    /// Turn-end snapshots started and not yet recorded; a lease waits
    /// until there are none, so the next turn's calls change nothing a
    /// snapshot is reading.
    snapshotting: watch::Sender<usize>,
    /// Whether the last turn-end snapshot started was recorded, once it
    /// ends: the next one waits for it (a turn that leased no sandbox
    /// ends without waiting for the one before, and shares what that
    /// one records).
    last_snapshot: Mutex<Option<tokio::sync::oneshot::Receiver<bool>>>,
    pause: pause::PauseState,
    /// The key's quota slot this sandbox holds, given back when the slot
    /// goes (the sandbox is destroyed or reaped).
    quota: Mutex<Option<crate::quota::HeldSlot>>,
    /// Whose it is: its usage is counted under the session's key.
    whose: SandboxFor,
}

/// Which sandbox a lease asks for: a session's, with the key that owns
/// the session (the caller knows it: the session's turn or its record),
/// or an MCP connection's scratch sandbox, with the key that opened the
/// connection (none for `conclave mcp` on stdio): it takes one of that
/// key's `max_sandboxes` slots, and its usage counts under no key.
#[derive(Clone, Debug)]
pub enum SandboxFor {
    Session { owner: Option<String> },
    Scratch { owner: Option<String> },
}

pub struct SandboxManager {
    backend: Arc<dyn SandboxBackend>,
    /// Labels every sandbox made here; only sandboxes carrying it are
    /// reaped, so servers sharing a daemon leave each other's alone.
    instance: String,
    config: SandboxConfig,
    slots: Mutex<HashMap<Uuid, Arc<Slot>>>,
    /// Ready sandboxes of the default spec, not yet any session's.
    pool: Mutex<Vec<Arc<dyn Sandbox>>>,
    /// Wakes the refill task when the pool was drawn from.
    drawn: Notify,
    /// The pool's size, for those waiting for it to fill.
    pool_size: watch::Sender<usize>,
    /// Sandboxes of live sessions found at start-up, by session; taken over
    /// at the session's next tool call.
    found: Mutex<HashMap<Uuid, String>>,
    /// Relabelling of claimed pool sandboxes, running in the background.
    assigning: TaskTracker,
    /// Turn-end snapshots of workspaces; `None` takes none.
    snapshots: Option<Arc<super::snapshots::Snapshots>>,
    /// Snapshots being taken, waited for at shutdown.
    snapshotting: TaskTracker,
    pause_metrics: pause::PauseMetrics,
    /// The keys' `max_sandboxes`; `None` counts none.
    quotas: Option<quota::SandboxQuotas>,
    /// Told each session sandbox's CPU and wall time as it is removed.
    removed: Option<usage::OnRemoved>,
    /// Which sessions' sandboxes processes on the data directory made.
    marks: Option<shared::Marks>,
    /// The secrets sessions may put in their sandboxes' environment.
    secrets: Arc<super::secrets::SecretStore>,
    /// The egress proxy of sandboxes given an allow-list.
    proxy: Option<Arc<super::proxy::EgressProxy>>,
}

/// A session's hold on its sandbox; while one is held the sandbox is not
/// idle, and dropping it starts the idle clock again.
pub struct Lease {
    _background: Option<pause::Background>,
    _hold: Hold,
    pub sandbox: Arc<dyn Sandbox>,
}

/// Counts as a lease from before the sandbox exists, so the idle reaper
/// never takes a sandbox being provisioned or used, even if the caller is
/// cancelled mid-way.
struct Hold(Arc<Slot>);

impl Hold {
    fn new(slot: Arc<Slot>) -> Hold {
        slot.leases.fetch_add(1, Ordering::AcqRel);
        Hold(slot)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        *lock(&self.0.last_used) = Instant::now();
        self.0.leases.fetch_sub(1, Ordering::AcqRel);
        self.0.released.notify_waiters();
    }
}

impl SandboxManager {
    pub fn new(
        backend: Arc<dyn SandboxBackend>,
        config: SandboxConfig,
        instance: String,
    ) -> SandboxManager {
        SandboxManager {
            backend,
            instance,
            config,
            slots: Mutex::new(HashMap::new()),
            pool: Mutex::new(Vec::new()),
            drawn: Notify::new(),
            pool_size: watch::Sender::new(0),
            found: Mutex::new(HashMap::new()),
            assigning: TaskTracker::new(),
            snapshots: None,
            snapshotting: TaskTracker::new(),
            pause_metrics: Default::default(),
            quotas: None,
            removed: None,
            marks: None,
            secrets: Default::default(),
            proxy: None,
        }
    }

    /// Whether the backend can start sandboxes of `image`.
    pub async fn has_image(&self, image: &str) -> Result<bool> {
        self.backend.has_image(image).await
    }

    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// The spec of a sandbox made with the configured defaults.
    pub fn default_spec(&self) -> SandboxSpec {
        SandboxSpec {
            image: self.config.image.clone(),
            cpus: self.config.cpus,
            memory_mb: self.config.memory_mb,
            pids: self.config.pids,
            disk_mb: self.config.disk_mb,
            network: false,
            egress: None,
            env: BTreeMap::new(),
            labels: BTreeMap::new(),
        }
    }

    /// Removes what a previous run left: pool sandboxes, and sandboxes whose
    /// session `is_live` denies. Those of live sessions are kept to be taken
    /// over. Returns how many were removed.
    pub async fn reap_orphans(&self, is_live: impl Fn(Uuid) -> bool) -> Result<usize> {
        let mut removed = 0;
        let ours = self.backend.list_managed().await?;
        for managed in ours
            .into_iter()
            .filter(|m| m.instance.as_deref() == Some(self.instance.as_str()))
        {
            let session = managed
                .session
                .as_deref()
                .and_then(|s| Uuid::parse_str(s).ok());
            match session {
                Some(session) if is_live(session) => {
                    lock(&self.found).insert(session, managed.id);
                }
                _ => {
                    self.backend.remove(&managed.id).await?;
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }

    /// The sandbox of a session without an owner, created (or taken from
    /// the pool, or taken over from a previous run) at the first call.
    pub async fn lease(&self, session: Uuid, spec: SandboxSpec) -> Result<Lease> {
        self.lease_from(session, spec, SandboxFor::Session { owner: None }, None)
            .await
    }

    /// [`SandboxManager::lease`] of `whose` sandbox, which starts from the
    /// workspace of the snapshot `seed` (one the session's key may read)
    /// when it is first made.
    pub async fn lease_from(
        &self,
        session: Uuid,
        spec: SandboxSpec,
        whose: SandboxFor,
        seed: Option<&str>,
    ) -> Result<Lease> {
        // A session without a sandbox yet takes one of its key's slots
        // first (a store round trip, so outside the map's lock).
        let known = lock(&self.slots).contains_key(&session);
        let mut quota = match (&self.quotas, known) {
            (Some(quotas), false) => quotas.take_sandbox(&whose).await?,
            _ => None,
        };
        let slot = {
            let mut slots = lock(&self.slots);
            match slots.get(&session) {
                Some(slot) => slot.clone(),
                None => {
                    if slots.len() >= self.config.max_live {
                        return Err(SandboxError::Capacity(self.config.max_live));
                    }
                    let slot = Arc::new(Slot {
                        quota: Mutex::new(quota.take()),
                        whose,
                        spec,
                        sandbox: OnceCell::new(),
                        leases: AtomicUsize::new(0),
                        released: Notify::new(),
                        last_used: Mutex::new(Instant::now()),
                        born: Instant::now(),
                        sampled: Mutex::new(None),
                        sampling: Default::default(),
                        dirty: Default::default(),
                        snapshotting: watch::Sender::new(0),
                        last_snapshot: Mutex::new(None),
                        pause: Default::default(),
                    });
                    slots.insert(session, slot.clone());
                    slot
                }
            }
        };
        let hold = Hold::new(slot.clone());
        let made = slot
            .sandbox
            .get_or_try_init(|| self.provision(session, &slot.spec, &slot.whose, seed))
            .await;
        match made {
            Ok(sandbox) => {
                let sandbox = sandbox.clone();
                // A snapshot of the previous turn's end reads the workspace:
                // this lease's calls wait until it has.
                let _ = slot
                    .snapshotting
                    .subscribe()
                    .wait_for(|running| *running == 0)
                    .await;
                slot.dirty.store(true, Ordering::Release);
                self.resume_paused(&slot, sandbox.as_ref()).await?;
                Ok(Lease {
                    sandbox,
                    _background: None,
                    _hold: hold,
                })
            }
            Err(e) => {
                let mut slots = lock(&self.slots);
                if slots
                    .get(&session)
                    .is_some_and(|s| Arc::ptr_eq(s, &slot) && !s.sandbox.initialized())
                {
                    slots.remove(&session);
                }
                Err(e)
            }
        }
    }

    async fn provision(
        &self,
        session: Uuid,
        spec: &SandboxSpec,
        whose: &SandboxFor,
        seed: Option<&str>,
    ) -> Result<Arc<dyn Sandbox>> {
        let previous = lock(&self.found).remove(&session);
        if let Some(id) = previous
            && let Some(sandbox) = self.backend.attach(&id).await?
        {
            tracing::info!(%session, sandbox = %id, "took over the sandbox of a previous run");
            return Ok(self.kept_over(session, sandbox).await);
        }
        // Another process on this data directory (`conclave mcp` beside the
        // server, or the server beside it) may have made the session's
        // sandbox: share it rather than make a second one.
        if let Some(sandbox) = self.existing(session).await? {
            tracing::info!(%session, sandbox = sandbox.id(), "using the session's sandbox made by another process");
            return Ok(self.kept_over(session, sandbox).await);
        }
        if *spec == self.default_spec() {
            let pooled = {
                let mut pool = lock(&self.pool);
                let taken = pool.pop();
                self.pool_size.send_replace(pool.len());
                taken
            };
            if let Some(sandbox) = pooled {
                self.drawn.notify_one();
                // The relabel only matters to a restart finding the sandbox
                // again, so it is kept off the first exec's path.
                let (assigned, marks) = (sandbox.clone(), self.marks.clone());
                self.assigning.spawn(async move {
                    if let Some(marks) = marks {
                        marks.set(session);
                    }
                    if let Err(e) = assigned.assign(&session.to_string()).await {
                        tracing::warn!(%session, error = %e, "a claimed pool sandbox could not be relabelled; a restart will not find it");
                    }
                });
                return self.seeded(session, sandbox, whose, seed).await;
            } else {
                self.drawn.notify_one();
            }
        }
        let mut spec = spec.clone();
        self.label(&mut spec);
        spec.labels
            .insert(LABEL_SESSION.into(), session.to_string());
        let sandbox = self.backend.create(&spec).await?;
        if let Some(marks) = &self.marks {
            marks.set(session);
        }
        tracing::info!(%session, sandbox = sandbox.id(), backend = self.backend.name(), "sandbox created");
        self.seeded(session, sandbox, whose, seed).await
    }

    /// Waits until nothing uses the session's sandbox (an interrupted
    /// call has finished killing its processes), or `within` passes.
    pub async fn wait_unused(&self, session: Uuid, within: Duration) -> bool {
        let Some(slot) = lock(&self.slots).get(&session).cloned() else {
            return true;
        };
        let wait = async {
            loop {
                let released = slot.released.notified();
                tokio::pin!(released);
                released.as_mut().enable();
                if slot.leases.load(Ordering::Acquire) == 0 {
                    return;
                }
                released.await;
            }
        };
        tokio::time::timeout(within, wait).await.is_ok()
    }

    /// Destroys the session's sandbox (the session was deleted or its
    /// ephemeral run ended).
    pub async fn release(&self, session: Uuid) {
        let slot = lock(&self.slots).remove(&session);
        let found = lock(&self.found).remove(&session);
        // Given back now, not when the slot's last reference goes: the
        // key's next sandbox may be asked for at once.
        let quota = slot.as_ref().and_then(|s| lock(&s.quota).take());
        if let Some(quota) = quota {
            quota.release().await;
        }
        if let Some(slot) = &slot
            && let Err(e) = self.destroy_counted(session, slot).await
        {
            tracing::warn!(%session, error = %e, "destroying a sandbox failed");
        }
        if let Some(id) = found {
            let _ = self.backend.remove(&id).await;
        }
    }

    /// Marks a sandbox about to be made as this instance's, expiring after
    /// `sandbox.max_lifetime_s`.
    fn label(&self, spec: &mut SandboxSpec) {
        let now = chrono::Utc::now().timestamp();
        let expires = now + i64::try_from(self.config.max_lifetime_s).unwrap_or(i64::MAX / 2);
        spec.labels.insert(LABEL_CREATED.into(), now.to_string());
        spec.labels.insert(LABEL_MANAGED.into(), "true".into());
        spec.labels
            .insert(LABEL_INSTANCE.into(), self.instance.clone());
        spec.labels
            .insert(LABEL_EXPIRES.into(), expires.to_string());
    }

    /// Sandboxes this manager holds: sessions' and the warm pool's.
    pub fn live_count(&self) -> usize {
        let sessions = lock(&self.slots)
            .values()
            .filter(|slot| slot.sandbox.initialized())
            .count();
        sessions + lock(&self.pool).len()
    }

    /// Destroys the sandboxes this manager holds except those `keep` names
    /// (a `conclave mcp` process ending: its scratch sandboxes go, the
    /// sandboxes of sessions stay for the server and the next turn).
    pub async fn release_all_except(&self, keep: impl Fn(Uuid) -> bool) {
        let sessions: Vec<Uuid> = lock(&self.slots).keys().copied().collect();
        for session in sessions {
            if keep(session) {
                lock(&self.slots).remove(&session);
            } else {
                self.release(session).await;
            }
        }
    }

    /// Whether a sandbox slot for `session` is held (not released or reaped).
    pub fn holds(&self, session: Uuid) -> bool {
        lock(&self.slots).contains_key(&session)
    }

    /// The sessions this manager holds a sandbox slot for.
    pub fn leased_sessions(&self) -> Vec<Uuid> {
        lock(&self.slots).keys().copied().collect()
    }

    /// Destroys sandboxes nobody has used for the idle TTL.
    pub async fn reap_idle(&self) -> usize {
        let ttl = Duration::from_secs(self.config.idle_ttl_s);
        let idle: Vec<(Uuid, Arc<Slot>)> = {
            let mut slots = lock(&self.slots);
            let expired: Vec<Uuid> = slots
                .iter()
                .filter(|(_, slot)| {
                    slot.unused()
                        && slot.sandbox.initialized()
                        && lock(&slot.last_used).elapsed() >= ttl
                })
                .map(|(id, _)| *id)
                .collect();
            expired
                .into_iter()
                .filter_map(|id| slots.remove(&id).map(|slot| (id, slot)))
                .collect()
        };
        for (session, slot) in &idle {
            if let Some(sandbox) = slot.sandbox.get() {
                tracing::info!(%session, sandbox = sandbox.id(), "idle sandbox destroyed");
                let _ = self.destroy_counted(*session, slot).await;
            }
        }
        idle.len()
    }

    /// Keeps the warm pool full until `stop`, then destroys what is in it.
    pub async fn run_pool(&self, stop: CancellationToken) {
        let mut failures = 0u32;
        loop {
            let want = {
                let live = lock(&self.slots).len();
                let pooled = lock(&self.pool).len();
                let room = self.config.max_live.saturating_sub(live + pooled);
                self.config.warm_pool.saturating_sub(pooled).min(room)
            };
            if want == 0 {
                tokio::select! {
                    _ = self.drawn.notified() => continue,
                    _ = stop.cancelled() => break,
                }
            }
            let mut spec = self.default_spec();
            self.label(&mut spec);
            spec.labels
                .insert(LABEL_POOL.into(), pool_label(&spec.image));
            // Not cut short by `stop`: an abandoned create finishes and
            // destroys its sandbox in a task that a stopping server does not
            // wait for. A finished one is in the pool, destroyed below.
            match self.backend.create(&spec).await {
                Ok(sandbox) => {
                    failures = 0;
                    let mut pool = lock(&self.pool);
                    pool.push(sandbox);
                    self.pool_size.send_replace(pool.len());
                    if stop.is_cancelled() {
                        break;
                    }
                }
                Err(e) => {
                    failures += 1;
                    let wait = Duration::from_secs(2u64.pow(failures.min(6)));
                    tracing::warn!(error = %e, retry_in_s = wait.as_secs(), "warm pool refill failed");
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = stop.cancelled() => break,
                    }
                }
            }
        }
        let pooled: Vec<_> = lock(&self.pool).drain(..).collect();
        self.pool_size.send_replace(0);
        self.settled().await;
        for sandbox in pooled {
            let _ = sandbox.destroy().await;
        }
    }

    /// Waits until every claimed pool sandbox carries its session.
    pub async fn settled(&self) {
        self.assigning.close();
        self.assigning.wait().await;
        self.assigning.reopen();
    }

    /// How many sandboxes wait in the pool (for tests and metrics).
    pub fn pooled(&self) -> usize {
        lock(&self.pool).len()
    }

    /// Waits until the pool holds `n` sandboxes or `within` passes.
    pub async fn wait_pooled(&self, n: usize, within: Duration) -> bool {
        let mut size = self.pool_size.subscribe();
        tokio::time::timeout(within, size.wait_for(|&len| len >= n))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

/// Labels allow only `[A-Za-z0-9._-]`: the image name is made to fit.
fn pool_label(image: &str) -> String {
    image
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect()
}

mod pause;
mod quota;
mod shared;
mod snapshot;
mod stats;
mod usage;
pub use usage::OnRemoved;

pub use pause::PauseMetrics;

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
