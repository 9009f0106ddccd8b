//! Replica pools: their replicas' states and figures; the pool's policy
//! (`policy/`) picks a replica for a call.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::policy::{self, Pick, Policy, Ring};
use crate::config::PoolConfig;
use crate::sync::{lock, read, write};
use crate::telemetry::{Metrics, ReplicaLabel};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

/// What an operator set a replica to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaState {
    Active,
    /// No new calls; removed once its calls in flight have ended.
    Draining,
    /// No new calls until resumed.
    Paused,
}

impl ReplicaState {
    fn from_u8(value: u8) -> ReplicaState {
        match value {
            1 => ReplicaState::Draining,
            2 => ReplicaState::Paused,
            _ => ReplicaState::Active,
        }
    }
}

/// One inference server and what the gateway knows of it.
pub struct Replica {
    pub id: String,
    /// Base URL without a trailing slash, `http://host:port/v1`.
    pub url: String,
    /// The model name sent to it.
    pub model: String,
    pub api_key: Option<String>,
    /// Added by a request rather than the config file: its connections
    /// pass `gateway.allowed_upstreams`.
    pub guarded: bool,
    state: AtomicU8,
    healthy: AtomicBool,
    /// Consecutive failed and passed health checks.
    check_failures: AtomicU32,
    check_passes: AtomicU32,
    /// Set by a failed call: no new calls until then.
    cooldown_until: Mutex<Option<Instant>>,
    outstanding: AtomicU64,
    requests: AtomicU64,
    failures: AtomicU64,
    /// Sum of the latencies of finished calls, in microseconds.
    latency_us: AtomicU64,
    completed: AtomicU64,
    /// The weights version committed while it was in the pool.
    weights_version: Mutex<Option<serde_json::Value>>,
    /// Its series of the gateway's metrics, found once.
    figures: OnceLock<Figures>,
    /// Its endpoints' URLs, parsed once, in the order of `Endpoint::ALL`
    /// (`None` if the base URL does not parse: the call then fails naming
    /// it).
    urls: Option<[reqwest::Url; 6]>,
    /// What a call over `http` needs, and its idle connections (see
    /// `client`).
    plain: Option<Arc<super::client::Plain>>,
}

/// A replica's calls and latencies by outcome, as the metrics count them.
pub struct Figures {
    pub ok: (Counter, Histogram),
    pub error: (Counter, Histogram),
}

/// A replica's figures, for `GET /gateway/replicas`.
#[derive(Debug, Serialize)]
pub struct ReplicaView {
    pub id: String,
    pub url: String,
    pub model: String,
    pub state: ReplicaState,
    pub healthy: bool,
    pub cooling_down: bool,
    pub outstanding: u64,
    pub requests: u64,
    pub failures: u64,
    pub mean_latency_ms: Option<f64>,
    /// The last weights version committed for its pool.
    pub weights_version: Option<serde_json::Value>,
}

impl Replica {
    pub fn new(id: String, url: &str, model: String, api_key: Option<String>) -> Replica {
        Replica {
            id,
            url: url.trim_end_matches('/').to_string(),
            model,
            api_key,
            guarded: false,
            state: AtomicU8::new(0),
            healthy: AtomicBool::new(true),
            check_failures: AtomicU32::new(0),
            check_passes: AtomicU32::new(0),
            cooldown_until: Mutex::new(None),
            outstanding: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            latency_us: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            weights_version: Mutex::new(None),
            figures: OnceLock::new(),
            urls: None,
            plain: None,
        }
        .with_urls()
    }

    fn with_urls(mut self) -> Replica {
        let urls: Option<Vec<reqwest::Url>> = super::Endpoint::ALL
            .iter()
            .map(|endpoint| reqwest::Url::parse(&endpoint.url_on(&self.url)).ok())
            .collect();
        self.urls = urls.and_then(|urls| urls.try_into().ok());
        self.plain = self
            .urls
            .as_ref()
            .and_then(|urls| super::client::Plain::new(urls).map(Arc::new));
        self
    }

    /// How to call it when it is served on `http`.
    pub fn plain(&self) -> Option<&Arc<super::client::Plain>> {
        self.plain.as_ref()
    }

    /// The URL of `endpoint` on this replica.
    pub fn endpoint_url(&self, endpoint: super::Endpoint) -> Result<reqwest::Url, String> {
        match &self.urls {
            Some(urls) => Ok(urls[endpoint.index()].clone()),
            None => Err(format!("{}: not a URL", endpoint.url_on(&self.url))),
        }
    }

    /// Its series of `metrics`, labelled with `pool` the first time: a
    /// call then counts without building labels.
    pub fn figures(&self, metrics: &Metrics, pool: &str) -> &Figures {
        self.figures.get_or_init(|| {
            let series = |outcome: &'static str| {
                let label = ReplicaLabel {
                    pool: pool.to_owned(),
                    replica: self.id.clone(),
                    outcome,
                };
                (
                    metrics.gateway_calls.get_or_create(&label).clone(),
                    metrics.gateway_latency.get_or_create(&label).clone(),
                )
            };
            Figures {
                ok: series("ok"),
                error: series("error"),
            }
        })
    }

    pub fn weights_version(&self) -> Option<serde_json::Value> {
        lock(&self.weights_version).clone()
    }

    pub fn set_weights_version(&self, version: serde_json::Value) {
        *lock(&self.weights_version) = Some(version);
    }

    pub fn state(&self) -> ReplicaState {
        ReplicaState::from_u8(self.state.load(Ordering::Relaxed))
    }

    pub fn set_state(&self, state: ReplicaState) {
        self.state.store(state as u8, Ordering::Relaxed);
    }

    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub fn outstanding(&self) -> u64 {
        self.outstanding.load(Ordering::Relaxed)
    }

    fn cooling_down(&self, now: Instant) -> bool {
        lock(&self.cooldown_until).is_some_and(|until| until > now)
    }

    /// Active and healthy: may take calls (a cooling-down one only when no
    /// other can).
    fn usable(&self) -> bool {
        self.state() == ReplicaState::Active && self.healthy()
    }

    /// Counts a call as started; the guard ends it.
    pub fn start_call(self: &Arc<Self>) -> CallGuard {
        self.outstanding.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        CallGuard {
            replica: self.clone(),
            started: Instant::now(),
        }
    }

    /// A call failed in a way worth avoiding the replica for a while.
    pub fn cool_down(&self, period: Duration) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        *lock(&self.cooldown_until) = Some(Instant::now() + period);
    }

    /// Records a health check; returns the new health when it changed.
    pub fn record_check(
        &self,
        passed: bool,
        failure_threshold: u32,
        success_threshold: u32,
    ) -> Option<bool> {
        if passed {
            self.check_failures.store(0, Ordering::Relaxed);
            let passes = self.check_passes.fetch_add(1, Ordering::Relaxed) + 1;
            if !self.healthy() && passes >= success_threshold {
                self.healthy.store(true, Ordering::Relaxed);
                *lock(&self.cooldown_until) = None;
                return Some(true);
            }
        } else {
            self.check_passes.store(0, Ordering::Relaxed);
            let failures = self.check_failures.fetch_add(1, Ordering::Relaxed) + 1;
            if self.healthy() && failures >= failure_threshold {
                self.healthy.store(false, Ordering::Relaxed);
                return Some(false);
            }
        }
        None
    }

    pub fn view(&self) -> ReplicaView {
        let completed = self.completed.load(Ordering::Relaxed);
        ReplicaView {
            id: self.id.clone(),
            url: self.url.clone(),
            model: self.model.clone(),
            state: self.state(),
            healthy: self.healthy(),
            cooling_down: self.cooling_down(Instant::now()),
            outstanding: self.outstanding(),
            requests: self.requests.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            mean_latency_ms: (completed > 0).then(|| {
                self.latency_us.load(Ordering::Relaxed) as f64 / completed as f64 / 1000.0
            }),
            weights_version: self.weights_version(),
        }
    }
}

/// A call in flight on a replica; dropping it ends the call.
pub struct CallGuard {
    pub replica: Arc<Replica>,
    started: Instant,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let micros = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.replica.latency_us.fetch_add(micros, Ordering::Relaxed);
        self.replica.completed.fetch_add(1, Ordering::Relaxed);
        self.replica.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A model name and the replicas that serve it.
pub struct Pool {
    pub name: String,
    pub config: PoolConfig,
    members: RwLock<Members>,
    next: AtomicUsize,
    /// How `config.strategy` picks.
    policy: Box<dyn Policy>,
    /// Paused around weight updates.
    pub weights: Arc<super::weights::WeightGate>,
}

#[derive(Clone)]
struct Members {
    replicas: Arc<Vec<Arc<Replica>>>,
    ring: Arc<Ring>,
}

impl Pool {
    /// A pool with the given replicas; `config.replicas` is not read.
    pub fn new(name: String, config: PoolConfig, replicas: Vec<Arc<Replica>>) -> Pool {
        let ring = Arc::new(Ring::new(&replicas));
        Pool {
            name,
            policy: policy::for_pool(&config),
            config,
            members: RwLock::new(Members {
                replicas: Arc::new(replicas),
                ring,
            }),
            next: AtomicUsize::new(0),
            weights: Arc::default(),
        }
    }

    fn members(&self) -> Members {
        read(&self.members).clone()
    }

    pub fn replicas(&self) -> Arc<Vec<Arc<Replica>>> {
        self.members().replicas
    }

    pub fn add(&self, replica: Arc<Replica>) {
        let mut members = write(&self.members);
        let mut replicas = members.replicas.as_ref().clone();
        replicas.push(replica);
        members.ring = Arc::new(Ring::new(&replicas));
        members.replicas = Arc::new(replicas);
    }

    /// Removes a replica; calls in flight on it finish.
    pub fn remove(&self, id: &str) -> Option<Arc<Replica>> {
        let mut members = write(&self.members);
        let at = members.replicas.iter().position(|r| r.id == id)?;
        let mut replicas = members.replicas.as_ref().clone();
        let removed = replicas.remove(at);
        members.ring = Arc::new(Ring::new(&replicas));
        members.replicas = Arc::new(replicas);
        Some(removed)
    }

    /// Picks the replica for a call, skipping `tried`. Replicas cooling
    /// down are used only when no other usable one is left.
    pub fn pick(
        &self,
        session: Option<&str>,
        body: Option<&super::json::Object>,
        tried: &[Arc<Replica>],
    ) -> Option<Arc<Replica>> {
        let members = self.members();
        let now = Instant::now();
        let open = |r: &&Arc<Replica>| r.usable() && !tried.iter().any(|t| Arc::ptr_eq(t, r));
        let mut candidates: Vec<&Arc<Replica>> = members
            .replicas
            .iter()
            .filter(open)
            .filter(|r| !r.cooling_down(now))
            .collect();
        if candidates.is_empty() {
            candidates = members.replicas.iter().filter(open).collect();
        }
        if candidates.is_empty() {
            return None;
        }
        let turn = self.next.fetch_add(1, Ordering::Relaxed);
        let chosen = self.policy.pick(&Pick {
            candidates: &candidates,
            session,
            turn,
            ring: &members.ring,
            load_factor: self.config.affinity_load_factor,
            body: body.filter(|_| self.policy.reads_body()),
            balance_abs: self.config.cache_balance_abs,
            balance_rel: self.config.cache_balance_rel,
        });
        Some(chosen.clone())
    }

    /// Replica `id`, when it is a member that may take calls and was not
    /// tried (one cooling down too: no other has what the call needs).
    pub fn pinned(&self, id: &str, tried: &[Arc<Replica>]) -> Option<Arc<Replica>> {
        let members = self.members();
        let replica = members.replicas.iter().find(|r| r.id == id)?;
        let open = replica.usable() && !tried.iter().any(|t| Arc::ptr_eq(t, replica));
        open.then(|| replica.clone())
    }

    /// Ids of the draining replicas with nothing in flight, removed.
    pub fn remove_drained(&self) -> Vec<String> {
        let drained: Vec<String> = self
            .replicas()
            .iter()
            .filter(|r| r.state() == ReplicaState::Draining && r.outstanding() == 0)
            .map(|r| r.id.clone())
            .collect();
        for id in &drained {
            self.remove(id);
        }
        drained
    }
}

/// A pool of `n` replicas `r0`… on `strategy`, for the policies' tests.
#[cfg(test)]
pub(in crate::gateway) fn test_pool(strategy: crate::config::Strategy, n: usize) -> Pool {
    let replicas = (0..n)
        .map(|i| {
            Arc::new(Replica::new(
                format!("r{i}"),
                "http://h/v1",
                "m".into(),
                None,
            ))
        })
        .collect();
    Pool::new(
        "m".into(),
        PoolConfig {
            strategy,
            ..PoolConfig::default()
        },
        replicas,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Strategy;

    fn pool(strategy: Strategy, n: usize) -> Pool {
        test_pool(strategy, n)
    }

    fn counts(pool: &Pool, picks: usize, session: impl Fn(usize) -> Option<String>) -> Vec<usize> {
        let mut counts = vec![0; pool.replicas().len()];
        for i in 0..picks {
            let r = pool
                .pick(session(i).as_deref(), None, &[])
                .expect("a replica");
            counts[r.id[1..].parse::<usize>().unwrap()] += 1;
        }
        counts
    }

    #[test]
    fn round_robin_takes_turns_and_skips_what_it_must() {
        let pool = pool(Strategy::RoundRobin, 3);
        assert_eq!(counts(&pool, 30, |_| None), vec![10, 10, 10]);
        let replicas = pool.replicas();
        replicas[1].set_state(ReplicaState::Paused);
        assert_eq!(counts(&pool, 30, |_| None)[1], 0);
        replicas[1].set_state(ReplicaState::Active);
        replicas[2].cool_down(Duration::from_secs(60));
        assert_eq!(counts(&pool, 30, |_| None)[2], 0);
        // Tried replicas are skipped; with every other one tried, a replica
        // cooling down is still better than none.
        let tried = vec![replicas[0].clone(), replicas[1].clone()];
        assert_eq!(pool.pick(None, None, &tried).unwrap().id, "r2");
        let all: Vec<_> = replicas.iter().cloned().collect();
        assert!(pool.pick(None, None, &all).is_none());
    }

    #[test]
    fn shuffle_spreads() {
        let pool = pool(Strategy::Shuffle, 4);
        let counts = counts(&pool, 4000, |_| None);
        assert!(counts.iter().all(|c| (700..1300).contains(c)), "{counts:?}");
    }

    #[test]
    fn least_outstanding_avoids_the_busy() {
        let pool = pool(Strategy::LeastOutstanding, 3);
        let replicas = pool.replicas();
        let _busy = [
            replicas[0].start_call(),
            replicas[0].start_call(),
            replicas[1].start_call(),
        ];
        assert_eq!(pool.pick(None, None, &[]).unwrap().id, "r2");
        let _more = replicas[2].start_call();
        assert_ne!(pool.pick(None, None, &[]).unwrap().id, "r0");
    }

    #[test]
    fn power_of_two_picks_the_less_loaded_of_two_and_spreads() {
        // Of two replicas it always compares both: the idle one wins.
        let pool2 = pool(Strategy::PowerOfTwo, 2);
        let replicas = pool2.replicas();
        let _busy = [replicas[0].start_call(), replicas[0].start_call()];
        assert_eq!(counts(&pool2, 200, |_| None), vec![0, 200]);
        // Of four, the busiest is never picked (it always loses its draw),
        // and idle replicas share the calls.
        let pool4 = pool(Strategy::PowerOfTwo, 4);
        let replicas = pool4.replicas();
        let _busy = [replicas[3].start_call()];
        let counts = counts(&pool4, 3000, |_| None);
        assert_eq!(counts[3], 0, "{counts:?}");
        assert!(
            counts[..3].iter().all(|c| (700..1300).contains(c)),
            "{counts:?}"
        );
    }

    #[test]
    fn affinity_is_sticky_spread_and_moves_only_a_leavers_sessions() {
        let pool = pool(Strategy::SessionAffinity, 4);
        let sessions: Vec<String> = (0..2000).map(|i| format!("session-{i}")).collect();
        let placed = |pool: &Pool| -> Vec<String> {
            sessions
                .iter()
                .map(|s| pool.pick(Some(s), None, &[]).unwrap().id.clone())
                .collect()
        };
        let before = placed(&pool);
        assert_eq!(before, placed(&pool), "a session changed replica");
        for i in 0..4 {
            let share = before.iter().filter(|id| **id == format!("r{i}")).count();
            assert!((300..700).contains(&share), "r{i} has {share} of 2000");
        }
        pool.remove("r2");
        let after = placed(&pool);
        for (was, now) in before.iter().zip(&after) {
            if was != "r2" {
                assert_eq!(was, now, "a session of a staying replica moved");
            }
        }
        // An unhealthy replica's sessions move, the rest stay.
        let replicas = pool.replicas();
        replicas[0].record_check(false, 1, 1);
        let unhealthy = placed(&pool);
        for (was, now) in after.iter().zip(&unhealthy) {
            if was != "r0" {
                assert_eq!(was, now);
            } else {
                assert_ne!(now, "r0");
            }
        }
    }

    #[test]
    fn affinity_spills_past_the_load_bound() {
        let pool = pool(Strategy::SessionAffinity, 2);
        let home = pool.pick(Some("s"), None, &[]).unwrap();
        let _held: Vec<_> = (0..4).map(|_| home.start_call()).collect();
        // Mean load with one more call is 2.5 per replica, bound 1.25×: 4
        // in flight is over it.
        assert_ne!(pool.pick(Some("s"), None, &[]).unwrap().id, home.id);
    }

    #[test]
    fn health_checks_need_their_thresholds() {
        let r = Replica::new("r".into(), "http://h/v1", "m".into(), None);
        assert_eq!(r.record_check(false, 2, 2), None);
        assert_eq!(r.record_check(false, 2, 2), Some(false));
        assert!(!r.healthy());
        assert_eq!(r.record_check(true, 2, 2), None);
        assert_eq!(r.record_check(false, 2, 2), None);
        assert_eq!(r.record_check(true, 2, 2), None);
        assert_eq!(r.record_check(true, 2, 2), Some(true));
    }
}
