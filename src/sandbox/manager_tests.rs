//! The manager's bookkeeping against an in-memory backend: the real
//! backends are exercised by `tests/sandbox.rs`.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::*;
use crate::sandbox::{ExecChunk, ExecRequest, ExecStatus, ManagedSandbox};

#[derive(Default)]
struct Memory {
    /// Live sandboxes: id → labels.
    live: Mutex<BTreeMap<String, BTreeMap<String, String>>>,
    created: AtomicUsize,
    /// How long a stats sample takes, and how many were taken.
    stats_delay: Mutex<Duration>,
    sampled: AtomicUsize,
    /// Pauses asked for; this backend cannot pause.
    pause_asks: AtomicUsize,
    /// When set, an exec waits for a permit of it.
    exec_gate: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
    /// Notified as each exec starts.
    exec_started: tokio::sync::Notify,
    /// Listings asked for.
    listed: AtomicUsize,
    /// Execs run.
    execs: AtomicUsize,
}

struct Fake {
    id: String,
    backend: Arc<Memory>,
}

#[async_trait]
impl SandboxBackend for Arc<Memory> {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Arc<dyn Sandbox>> {
        let n = self.created.fetch_add(1, Ordering::SeqCst);
        let id = format!("sb-{n}");
        lock(&self.live).insert(id.clone(), spec.labels.clone());
        Ok(Arc::new(Fake {
            id,
            backend: self.clone(),
        }))
    }

    async fn attach(&self, id: &str) -> Result<Option<Arc<dyn Sandbox>>> {
        Ok(lock(&self.live).contains_key(id).then(|| {
            Arc::new(Fake {
                id: id.to_string(),
                backend: self.clone(),
            }) as Arc<dyn Sandbox>
        }))
    }

    async fn list_managed(&self) -> Result<Vec<ManagedSandbox>> {
        self.listed.fetch_add(1, Ordering::SeqCst);
        Ok(lock(&self.live)
            .iter()
            .map(|(id, labels)| ManagedSandbox::from_labels(id.clone(), |k| labels.get(k)))
            .collect())
    }

    async fn remove(&self, id: &str) -> Result<()> {
        lock(&self.live).remove(id);
        Ok(())
    }
}

#[async_trait]
impl Sandbox for Fake {
    fn id(&self) -> &str {
        &self.id
    }

    async fn assign(&self, session_id: &str) -> Result<()> {
        let mut live = lock(&self.backend.live);
        let labels = live
            .get_mut(&self.id)
            .ok_or_else(|| SandboxError::Gone(self.id.clone()))?;
        labels.remove(LABEL_POOL);
        labels.insert(LABEL_SESSION.into(), session_id.into());
        Ok(())
    }

    async fn exec(
        &self,
        _request: ExecRequest,
        _output: mpsc::Sender<ExecChunk>,
        _cancel: CancellationToken,
    ) -> Result<ExecStatus> {
        self.backend.execs.fetch_add(1, Ordering::SeqCst);
        self.backend.exec_started.notify_one();
        let gate = lock(&self.backend.exec_gate).clone();
        if let Some(gate) = gate {
            gate.acquire().await.unwrap().forget();
        }
        Ok(ExecStatus::succeeded())
    }

    async fn stats(&self) -> Result<SandboxStats> {
        let delay = *lock(&self.backend.stats_delay);
        tokio::time::sleep(delay).await;
        let n = self.backend.sampled.fetch_add(1, Ordering::SeqCst) as u64 + 1;
        Ok(SandboxStats {
            pids: Some(n),
            ..SandboxStats::default()
        })
    }

    async fn pause(&self) -> Result<bool> {
        self.backend.pause_asks.fetch_add(1, Ordering::SeqCst);
        Ok(false)
    }

    async fn destroy(&self) -> Result<()> {
        self.backend.remove(&self.id).await
    }
}

/// Leases the session's sandbox and gives the lease back.
async fn lease_once(manager: &SandboxManager, session: Uuid) {
    drop(
        manager
            .lease(session, manager.default_spec())
            .await
            .unwrap(),
    );
}

fn manager(configure: impl FnOnce(&mut SandboxConfig)) -> (Arc<Memory>, Arc<SandboxManager>) {
    let memory = Arc::new(Memory::default());
    let mut config = SandboxConfig {
        warm_pool: 0,
        ..SandboxConfig::default()
    };
    configure(&mut config);
    let manager = SandboxManager::new(Arc::new(memory.clone()), config, "me".into());
    (memory, Arc::new(manager))
}

#[tokio::test]
async fn one_sandbox_per_session_until_released() {
    let (memory, manager) = manager(|_| {});
    let session = Uuid::new_v4();
    let first = manager
        .lease(session, manager.default_spec())
        .await
        .unwrap();
    let again = manager
        .lease(session, manager.default_spec())
        .await
        .unwrap();
    assert_eq!(first.sandbox.id(), again.sandbox.id());
    let labels = lock(&memory.live)[first.sandbox.id()].clone();
    assert_eq!(labels[LABEL_SESSION], session.to_string());
    assert_eq!(labels[LABEL_INSTANCE], "me");
    drop((first, again));
    manager.release(session).await;
    assert!(lock(&memory.live).is_empty());
}

#[tokio::test]
async fn the_cap_refuses_new_sessions_not_old_ones() {
    let (_, manager) = manager(|c| c.max_live = 1);
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    let _held = manager.lease(a, manager.default_spec()).await.unwrap();
    let refused = manager.lease(b, manager.default_spec()).await;
    assert!(matches!(refused, Err(SandboxError::Capacity(1))));
    assert!(manager.lease(a, manager.default_spec()).await.is_ok());
}

#[tokio::test]
async fn only_idle_sandboxes_are_reaped() {
    let (memory, manager) = manager(|c| c.idle_ttl_s = 0);
    let (busy, idle) = (Uuid::new_v4(), Uuid::new_v4());
    let held = manager.lease(busy, manager.default_spec()).await.unwrap();
    drop(manager.lease(idle, manager.default_spec()).await.unwrap());
    assert_eq!(manager.reap_idle().await, 1);
    assert_eq!(lock(&memory.live).len(), 1);
    assert!(manager.info(busy).await.is_some());
    assert!(manager.info(idle).await.is_none());
    drop(held);
    assert_eq!(manager.reap_idle().await, 1);
    assert!(lock(&memory.live).is_empty());
}

#[tokio::test]
async fn the_warm_pool_serves_default_sessions_and_refills() {
    let (memory, manager) = manager(|c| c.warm_pool = 2);
    let stop = CancellationToken::new();
    let pool = tokio::spawn({
        let (manager, stop) = (manager.clone(), stop.clone());
        async move { manager.run_pool(stop).await }
    });
    assert!(manager.wait_pooled(2, Duration::from_secs(5)).await);
    let session = Uuid::new_v4();
    let lease = manager
        .lease(session, manager.default_spec())
        .await
        .unwrap();
    // Taken from the pool (no new create) and relabelled for its session.
    assert!(lease.sandbox.id() == "sb-0" || lease.sandbox.id() == "sb-1");
    manager.settled().await;
    let labels = lock(&memory.live)[lease.sandbox.id()].clone();
    assert_eq!(labels.get(LABEL_SESSION), Some(&session.to_string()));
    assert_eq!(labels.get(LABEL_POOL), None);
    assert!(
        manager.wait_pooled(2, Duration::from_secs(5)).await,
        "refilled"
    );
    // A session asking for more than the default gets a sandbox of its own.
    let mut big = manager.default_spec();
    big.memory_mb *= 2;
    let other = manager.lease(Uuid::new_v4(), big).await.unwrap();
    assert_eq!(other.sandbox.id(), "sb-3");
    stop.cancel();
    pool.await.unwrap();
    // Stopping empties the pool; the sessions keep theirs.
    assert_eq!(lock(&memory.live).len(), 2);
}

#[tokio::test]
async fn reaping_keeps_live_sessions_and_other_instances() {
    let (memory, manager) = manager(|_| {});
    let live = Uuid::new_v4();
    for (id, labels) in [
        (
            "live",
            vec![
                (LABEL_INSTANCE, "me".to_string()),
                (LABEL_SESSION, live.to_string()),
            ],
        ),
        (
            "gone",
            vec![
                (LABEL_INSTANCE, "me".to_string()),
                (LABEL_SESSION, Uuid::new_v4().to_string()),
            ],
        ),
        (
            "pool",
            vec![
                (LABEL_INSTANCE, "me".to_string()),
                (LABEL_POOL, "python".to_string()),
            ],
        ),
        (
            "theirs",
            vec![
                (LABEL_INSTANCE, "other".to_string()),
                (LABEL_POOL, "python".to_string()),
            ],
        ),
    ] {
        let labels = labels
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        lock(&memory.live).insert(id.to_string(), labels);
    }
    assert_eq!(manager.reap_orphans(|s| s == live).await.unwrap(), 2);
    let left: Vec<String> = lock(&memory.live).keys().cloned().collect();
    assert_eq!(left, ["live", "theirs"]);
    let lease = manager.lease(live, manager.default_spec()).await.unwrap();
    assert_eq!(lease.sandbox.id(), "live", "taken over, not created");
}

#[tokio::test]
async fn expired_sandboxes_go_whoever_made_them() {
    let (memory, manager) = manager(|_| {});
    let session = Uuid::new_v4();
    let lease = manager
        .lease(session, manager.default_spec())
        .await
        .unwrap();
    let mine = lease.sandbox.id().to_string();
    drop(lease);
    let expires: i64 = lock(&memory.live)[&mine][LABEL_EXPIRES].parse().unwrap();
    let now = chrono::Utc::now().timestamp();
    assert!((expires - now - 24 * 3600).abs() < 60, "{expires} vs {now}");
    let past = (now - 1).to_string();
    for (id, instance) in [("theirs-expired", "other"), ("theirs-fresh", "other")] {
        let mut labels = BTreeMap::from([(LABEL_INSTANCE.to_string(), instance.to_string())]);
        if id.ends_with("expired") {
            labels.insert(LABEL_EXPIRES.into(), past.clone());
        }
        lock(&memory.live).insert(id.to_string(), labels);
    }
    lock(&memory.live)
        .get_mut(&mine)
        .unwrap()
        .insert(LABEL_EXPIRES.into(), past);
    assert_eq!(manager.prune_expired().await.unwrap(), 2);
    let left: Vec<String> = lock(&memory.live).keys().cloned().collect();
    assert_eq!(left, ["theirs-fresh"]);
    assert_eq!(manager.live_count(), 0, "the session's slot went too");
    let again = manager
        .lease(session, manager.default_spec())
        .await
        .unwrap();
    assert_ne!(again.sandbox.id(), mine, "a fresh sandbox");
}

/// A status call never waits on the backend's stats once a first sample
/// exists: a stale one answers while a fresh one is taken in the
/// background.
#[tokio::test(start_paused = true)]
async fn status_answers_from_the_last_sample() {
    let (memory, manager) = manager(|_| {});
    *lock(&memory.stats_delay) = Duration::from_secs(1);
    let session = Uuid::new_v4();
    lease_once(&manager, session).await;
    let first = manager.info(session).await.unwrap();
    assert_eq!(
        first.stats.pids,
        Some(1),
        "the first sample is taken at once"
    );
    let quick = Duration::from_millis(10);
    let cached = tokio::time::timeout(quick, manager.info(session)).await;
    assert_eq!(cached.expect("no wait").unwrap().stats.pids, Some(1));
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Stale: answered at once, refreshed behind the answer.
    let stale = tokio::time::timeout(quick, manager.info(session)).await;
    assert_eq!(stale.expect("no wait").unwrap().stats.pids, Some(1));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let fresh = manager.info(session).await.unwrap();
    assert_eq!(fresh.stats.pids, Some(2));
    assert_eq!(memory.sampled.load(Ordering::SeqCst), 2);
}

/// A sandbox its backend cannot pause is asked once, and goes on running.
#[tokio::test]
async fn a_sandbox_that_cannot_pause_is_asked_once() {
    let (memory, manager) = manager(|c| c.pause_after_s = 1);
    let session = Uuid::new_v4();
    lease_once(&manager, session).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while memory.pause_asks.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "no pause was asked for");
        assert_eq!(manager.pause_idle().await, 0);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..3 {
        assert_eq!(manager.pause_idle().await, 0);
    }
    assert_eq!(memory.pause_asks.load(Ordering::SeqCst), 1);
    assert!(!manager.is_paused(session));
    assert_eq!(manager.info(session).await.unwrap().state, "running");
    assert_eq!(manager.pause_metrics().pauses.get(), 0);
}

/// A session's sandbox takes a slot of the key the lease names, whether
/// or not the session is stored yet (a run's is stored by its first
/// write), and its usage is counted under that key when it goes; a
/// scratch sandbox counts under no key.
#[tokio::test]
async fn a_sessions_sandbox_counts_under_the_key_the_lease_names() {
    use crate::config::{Config, key_owner};
    use crate::quota::{KeyTable, Quotas};
    use crate::store::SqliteStore;

    let dir = tempfile::tempdir().unwrap();
    // No session is stored: the slot's key comes from the lease alone.
    let store: Arc<dyn crate::store::Store> =
        Arc::new(SqliteStore::open(&dir.path().join("conclave.db")).unwrap());
    let config = Config {
        api_keys: vec!["greedy-key-0123456789".into()],
        ..Config::default()
    };
    let table = Arc::new(KeyTable::new(&config));
    let quotas = Arc::new(Quotas::new(table, store, Duration::from_secs(60)));
    let memory = Arc::new(Memory::default());
    let config = SandboxConfig {
        warm_pool: 0,
        ..SandboxConfig::default()
    };
    let counted = Arc::new(Mutex::new(Vec::new()));
    let manager = SandboxManager::new(Arc::new(memory.clone()), config, "me".into())
        .with_quotas(quotas)
        .with_on_removed({
            let counted = counted.clone();
            Arc::new(move |session, owner, _, _| {
                lock(&counted).push((session, owner));
                Box::pin(async {})
            })
        });
    let owner = key_owner("greedy-key-0123456789");
    let whose = || SandboxFor::Session {
        owner: Some(owner.clone()),
    };
    // The built-in default: 16 sandboxes a key.
    let sessions: Vec<Uuid> = (0..17).map(|_| Uuid::new_v4()).collect();
    for session in &sessions[..16] {
        let lease = manager.lease_from(*session, manager.default_spec(), whose(), None);
        drop(lease.await.unwrap());
    }
    let refused = manager
        .lease_from(sessions[16], manager.default_spec(), whose(), None)
        .await;
    assert!(
        matches!(refused, Err(SandboxError::Quota(_))),
        "the key's 17th sandbox was not refused"
    );
    let scratch = Uuid::new_v4();
    let lease = manager.lease_from(
        scratch,
        manager.default_spec(),
        SandboxFor::Scratch { owner: None },
        None,
    );
    drop(lease.await.unwrap());

    manager.release(sessions[0]).await;
    manager.release(scratch).await;
    assert_eq!(*lock(&counted), [(sessions[0], Some(owner.clone()))]);
    // The released slot is the key's again.
    let lease = manager.lease_from(sessions[16], manager.default_spec(), whose(), None);
    drop(lease.await.unwrap());
}

/// A manager without a pool that keeps the last 3 turn ends' snapshots
/// in `dir`, and a session whose turn 1 used its sandbox (its snapshot
/// recorded).
async fn after_one_turn(dir: &tempfile::TempDir) -> (Arc<Memory>, SandboxManager, Uuid) {
    use crate::sandbox::snapshots::Snapshots;
    use crate::store::SqliteStore;

    let store: Arc<dyn crate::store::Store> =
        Arc::new(SqliteStore::open(&dir.path().join("conclave.db")).unwrap());
    let snapshots = Snapshots::new(
        store,
        dir.path().join("snapshots"),
        3,
        "me".into(),
        Duration::from_secs(10),
    );
    let memory = Arc::new(Memory::default());
    let config = SandboxConfig {
        warm_pool: 0,
        ..SandboxConfig::default()
    };
    let manager = SandboxManager::new(Arc::new(memory.clone()), config, "me".into())
        .with_snapshots(snapshots);
    let session = Uuid::new_v4();
    lease_once(&manager, session).await;
    manager.snapshot_turn(session, None, 1);
    manager.snapshot_settled(session).await;
    (memory, manager, session)
}

/// A turn that leased no sandbox ends while the snapshot of the turn
/// before it is still being taken: its turn end is recorded after that
/// one and shares it, rather than the older snapshot the store held when
/// it ended; the snapshots settle together.
#[tokio::test]
async fn a_turn_end_waits_for_the_snapshot_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let (memory, manager, session) = after_one_turn(&dir).await;

    // Turn 2 calls a tool; the tar of its turn end hangs while turn 3,
    // which calls none, ends.
    lease_once(&manager, session).await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    *lock(&memory.exec_gate) = Some(gate.clone());
    manager.snapshot_turn(session, None, 2);
    manager.snapshot_turn(session, None, 3);
    memory.exec_started.notified().await;
    // Time for a turn end that did not wait for the one before it (as
    // before they were chained) to record itself while the tar hangs.
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    gate.add_permits(1);
    manager.snapshot_settled(session).await;

    let kept = manager
        .snapshots()
        .unwrap()
        .of_session(session)
        .await
        .unwrap();
    let turns: Vec<Vec<u64>> = kept.into_iter().map(|s| s.turns).collect();
    assert_eq!(turns, [vec![1], vec![2, 3]]);
}

/// A rewind drops the session's sandbox and its next one is filled from
/// the turn end's snapshot (one exec: the unpack) before the lease
/// returns, once: the sandbox after it is made as any other.
#[tokio::test]
async fn a_rewound_sessions_next_sandbox_is_filled_from_the_turn_end() {
    let dir = tempfile::tempdir().unwrap();
    let (memory, manager, session) = after_one_turn(&dir).await;
    let snapshots = manager.snapshots().unwrap().clone();
    assert_eq!(memory.execs.load(Ordering::SeqCst), 1, "the turn end's tar");

    assert!(manager.rewind_workspace(session, 1).await);
    assert!(lock(&memory.live).is_empty(), "the sandbox went");
    assert!(snapshots.pending(session).await.unwrap().is_some());
    lease_once(&manager, session).await;
    assert_eq!(memory.execs.load(Ordering::SeqCst), 2, "filled from it");
    assert_eq!(snapshots.pending(session).await.unwrap(), None);

    // Released (gone idle): the next one is a fresh one, as before.
    manager.release(session).await;
    lease_once(&manager, session).await;
    assert_eq!(memory.execs.load(Ordering::SeqCst), 2);
    // A turn end no longer kept leaves the sandbox as it is.
    assert!(!manager.rewind_workspace(session, 7).await);
    assert_eq!(lock(&memory.live).len(), 1);
}

/// Two processes on one data directory: the second finds the session
/// sandbox the first made, and a new session's lease lists nothing.
#[tokio::test]
async fn a_session_sandbox_of_another_process_is_found_by_its_mark_and_only_then() {
    let dir = tempfile::tempdir().unwrap();
    let memory = Arc::new(Memory::default());
    let process = || {
        let manager = SandboxManager::new(
            Arc::new(memory.clone()),
            SandboxConfig::default(),
            "same-data-dir".into(),
        );
        Arc::new(manager.with_marks(dir.path().join("sandbox-sessions")))
    };
    let (server, mcp) = (process(), process());
    let shared = Uuid::new_v4();
    lease_once(&server, shared).await;
    assert_eq!(
        memory.listed.load(Ordering::SeqCst),
        0,
        "a new session lists nothing"
    );
    lease_once(&mcp, shared).await;
    assert_eq!(
        memory.created.load(Ordering::SeqCst),
        1,
        "the sandbox is shared"
    );
    assert_eq!(memory.listed.load(Ordering::SeqCst), 1);
    lease_once(&mcp, Uuid::new_v4()).await;
    assert_eq!(memory.listed.load(Ordering::SeqCst), 1);
    // Gone with its session, the mark goes too: a later lease lists nothing.
    server.release(shared).await;
    mcp.release_all_except(|_| true).await;
    lease_once(&mcp, shared).await;
    assert_eq!(memory.listed.load(Ordering::SeqCst), 1);
    assert_eq!(memory.created.load(Ordering::SeqCst), 3);
}
