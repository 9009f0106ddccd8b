//! Running a built server: its background chores, serving, and the
//! shutdown in order.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Server;
use crate::api;
use crate::protocol::SessionStatus;
use crate::sandbox::SandboxManager;
use crate::sandbox::snapshots::SWEEP_AFTER;
use crate::session::SessionManager;
use crate::store::Store;
use crate::tools::remote::advertised;

/// How often sessions nobody uses are dropped from memory (they stay in
/// the store and load again on their next use).
const EVICT_EVERY: Duration = Duration::from_secs(30);
/// How long a stopping server waits for workspace snapshots under way.
const SNAPSHOT_GRACE: Duration = Duration::from_secs(60);

/// Runs `work` every `period` until `stop`: the server's background chores.
async fn periodically<F, W>(period: Duration, stop: CancellationToken, mut work: F)
where
    F: FnMut() -> W,
    W: std::future::Future<Output = ()>,
{
    let mut every = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.cancelled() => return,
        }
        work().await;
    }
}

impl Server {
    /// Serves until the root token is cancelled, then shuts down in order.
    pub async fn run(self, listener: TcpListener) -> std::io::Result<()> {
        self.run_draining(listener, CancellationToken::new()).await
    }

    /// [`Server::run`], draining first when `drain` is cancelled (SIGTERM):
    /// `/ready` answers 503 and new turns are refused at once, running
    /// turns get `cluster.drain_s` to finish, then the root token is
    /// cancelled and the rest are interrupted.
    pub async fn run_draining(
        self,
        listener: TcpListener,
        drain: CancellationToken,
    ) -> std::io::Result<()> {
        let router = api::router(self.state.clone());
        // Background tasks end on the root token and are awaited at
        // shutdown, so none is cut off half way through its work.
        let background = TaskTracker::new();
        self.start_chores(&background, &drain);
        let sandbox_tasks = self
            .state
            .sandboxes
            .clone()
            .map(|sandboxes| tokio::spawn(sandbox_chores(sandboxes, self.root.clone())));
        let stopping = stopping(
            self.state.sessions.clone(),
            self.root.clone(),
            drain,
            Duration::from_secs(self.state.config.cluster.drain_s),
        );
        let open_files = rlimit::Resource::NOFILE
            .get()
            .map(|(soft, _)| soft)
            .unwrap_or(1024);
        let limits = api::http::serve::Limits::new(&self.state.config.http, open_files);
        tracing::info!(
            max_connections = limits.max_connections,
            per_client = limits.max_connections_per_client,
            "connection limits"
        );
        let overflow = api::overflow_router(self.state.clone());
        let advertised = self.advertise(listener.local_addr().ok()).await;
        let served = api::http::serve::serve(listener, router, overflow, limits, stopping).await;
        if let Some(instance) = advertised
            && let Err(e) = advertised::withdraw(self.store.as_ref(), &instance).await
        {
            tracing::warn!(error = %e, "forgetting this replica's URL in the store");
        }
        background.close();
        background.wait().await;
        self.shut_down(sandbox_tasks).await;
        served
    }

    /// Among replicas, says in the store where this one is reached
    /// (`cluster.advertise_url`, else the listen address when it names one
    /// host), so the others pass on requests for the live workspace of
    /// sessions whose sandbox is here. The instance advertised.
    async fn advertise(&self, listening: Option<std::net::SocketAddr>) -> Option<String> {
        let config = &self.state.config;
        let sandboxes = self.state.sandboxes.as_ref()?;
        config.bus.url.as_ref()?;
        let url = match (&config.cluster.advertise_url, listening) {
            (Some(url), _) => url.trim_end_matches('/').to_owned(),
            (None, Some(addr)) if !addr.ip().is_unspecified() => format!("http://{addr}"),
            _ => {
                tracing::info!(
                    "no cluster.advertise_url: other replicas answer 409 for the live workspace of sessions whose sandbox is here"
                );
                return None;
            }
        };
        let instance = sandboxes.instance().to_owned();
        match advertised::advertise(self.store.as_ref(), &instance, &url).await {
            Ok(()) => {
                tracing::info!(%url, "other replicas reach this one at");
                Some(instance)
            }
            Err(e) => {
                tracing::warn!(error = %e, "saying where this replica is reached");
                None
            }
        }
    }

    /// The chores that run while the server serves: health checks, quota
    /// renewals, expiring and evicting sessions, taking other replicas'
    /// jobs and, with replicas, their signals and abandoned turns.
    fn start_chores(&self, background: &TaskTracker, drain: &CancellationToken) {
        let root = &self.root;
        let sessions = &self.state.sessions;
        background.spawn(
            self.state
                .gateway
                .clone()
                .run_health_checks(root.child_token()),
        );
        background.spawn(self.state.quotas.clone().renew(root.child_token()));
        // Expired ephemeral sessions go within half their retention.
        let retention = Duration::from_secs(self.state.config.agent.ephemeral_retention_s);
        let period = if retention.is_zero() {
            EVICT_EVERY
        } else {
            EVICT_EVERY.min((retention / 2).max(Duration::from_millis(250)))
        };
        let expiring = sessions.clone();
        background.spawn(periodically(period, root.clone(), move || {
            let sessions = expiring.clone();
            async move {
                match sessions.expire_ephemeral().await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(sessions = n, "expired ephemeral sessions deleted"),
                    Err(e) => tracing::warn!(error = %e, "expiring ephemeral sessions failed"),
                }
                sessions.evict_unused();
            }
        }));
        // Draining, the replica takes no more jobs and hands back those it
        // is doing.
        let taking = root.child_token();
        background.spawn(self.jobs.clone().serve(taking.clone()));
        let drain = drain.clone();
        background.spawn(async move {
            tokio::select! {
                _ = drain.cancelled() => taking.cancel(),
                _ = taking.cancelled() => {}
            }
        });
        if self.state.config.store.is_none() {
            return;
        }
        background.spawn(sessions.clone().listen(root.child_token()));
        background.spawn(self.state.approvals.clone().listen(root.child_token()));
        // Turns of replicas that died are closed a third of a lease after
        // their leases expire, at the latest.
        let period = Duration::from_secs(self.state.config.cluster.turn_lease_s) / 3;
        let closing = sessions.clone();
        background.spawn(periodically(period, root.clone(), move || {
            let sessions = closing.clone();
            async move {
                match sessions.close_abandoned().await {
                    Ok(0) => {}
                    Ok(n) => tracing::warn!(
                        sessions = n,
                        "closed turns of a replica that stopped as interrupted"
                    ),
                    Err(e) => tracing::warn!(error = %e, "closing abandoned turns failed"),
                }
            }
        }));
    }

    /// After serving: the sandboxes no session needs, the rollouts, the
    /// bus's writes, then the store.
    async fn shut_down(self, sandbox_tasks: Option<JoinHandle<()>>) {
        // The pool task destroys its ready sandboxes once the root is cancelled.
        if let Some(task) = sandbox_tasks {
            let _ = task.await;
        }
        // Scratch sandboxes of MCP connections and those of sessions gone
        // meanwhile go now, not at the next start; live sessions keep theirs.
        if let Some(sandboxes) = &self.state.sandboxes {
            // A turn end's snapshot under way is finished rather than cut
            // off, so that turn end stays forkable after the restart.
            let settled = sandboxes.snapshots_settled();
            if tokio::time::timeout(SNAPSHOT_GRACE, settled).await.is_err() {
                tracing::warn!(
                    "a workspace snapshot was still being taken at shutdown; its turn end has none"
                );
            }
            match reap_orphans(self.store.as_ref(), sandboxes).await {
                Ok(0) => {}
                Ok(removed) => tracing::info!(removed, "removed sandboxes no live session owns"),
                Err(e) => tracing::error!(error = %e, "removing sandboxes at shutdown failed"),
            }
        }
        // Rollouts stop at the root token; then the bus stores the durable
        // messages it still holds.
        self.state.rollouts.shutdown().await;
        self.bus_tasks.close();
        self.bus_tasks.wait().await;
        // Gateway calls that ended after the writer stopped.
        self.state.usage.flush().await;
        if let Err(e) = self.store.close().await {
            tracing::error!(error = %e, "closing the store failed");
        }
    }
}

/// How often the snapshot directory is swept.
const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// The sandbox pool, and removing idle, paused-too-long and expired
/// sandboxes, until `root` is cancelled.
async fn sandbox_chores(sandboxes: Arc<SandboxManager>, root: CancellationToken) {
    let idle_every = Duration::from_secs((sandboxes.config().idle_ttl_s / 4).clamp(1, 30));
    let reaper = async {
        let mut every = tokio::time::interval(idle_every);
        loop {
            every.tick().await;
            sandboxes.reap_idle().await;
        }
    };
    let pauser = async {
        let Some(period) = sandboxes.pause_every() else {
            return std::future::pending().await;
        };
        let mut every = tokio::time::interval(period);
        loop {
            every.tick().await;
            sandboxes.pause_idle().await;
        }
    };
    // Expired sandboxes of every instance on the host go too.
    let prune_every = Duration::from_secs((sandboxes.config().max_lifetime_s / 4).clamp(1, 60));
    let pruner = async {
        let mut every = tokio::time::interval(prune_every);
        loop {
            every.tick().await;
            if let Err(e) = sandboxes.prune_expired().await {
                tracing::warn!(error = %e, "removing expired sandboxes failed");
            }
        }
    };
    // Snapshot files whose record is gone (deleted on another replica).
    let sweeper = async {
        let Some(snapshots) = sandboxes.snapshots() else {
            return std::future::pending().await;
        };
        let mut every = tokio::time::interval(SWEEP_EVERY);
        loop {
            every.tick().await;
            match snapshots.sweep(SWEEP_AFTER).await {
                Ok(0) => {}
                Ok(removed) => tracing::info!(removed, "removed snapshot files no record names"),
                Err(e) => tracing::warn!(error = %e, "sweeping the snapshot directory failed"),
            }
        }
    };
    tokio::select! {
        _ = sandboxes.run_pool(root.clone()) => {}
        _ = reaper => {}
        _ = pauser => {}
        _ = pruner => {}
        _ = sweeper => {}
    }
}

/// Ends when the server should stop taking connections: at the root
/// token, or after a drain of at most `drain_for`; then interrupts the
/// turns still running and waits for their results.
async fn stopping(
    sessions: Arc<SessionManager>,
    root: CancellationToken,
    drain: CancellationToken,
    drain_for: Duration,
) {
    tokio::select! {
        _ = root.cancelled() => {}
        _ = drain.cancelled() => {
            tracing::info!(
                drain_s = drain_for.as_secs(),
                "draining: no new turns, running ones may finish"
            );
            tokio::select! {
                _ = tokio::time::timeout(drain_for, sessions.drain()) => {}
                _ = root.cancelled() => {}
            }
            root.cancel();
        }
    }
    sessions.shutdown().await;
}

/// Removes the sandboxes no live session owns: pool ones, MCP scratch ones,
/// those of closed or deleted sessions. A live session's is kept (and
/// taken over). Returns how many were removed.
pub async fn reap_orphans(store: &dyn Store, sandboxes: &SandboxManager) -> Result<usize, String> {
    let live: std::collections::HashSet<uuid::Uuid> = store
        .list_sessions(&crate::store::SessionFilter::default())
        .await
        .map_err(|e| format!("listing sessions: {e}"))?
        .into_iter()
        .filter(|s| s.status != SessionStatus::Closed)
        .map(|s| s.id)
        .collect();
    sandboxes
        .reap_orphans(|id| live.contains(&id))
        .await
        .map_err(|e| format!("reaping orphans: {e}"))
}
