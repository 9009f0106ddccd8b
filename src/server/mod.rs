//! Builds the server from a config and runs it on a listener until the root
//! token is cancelled, so tests bind `127.0.0.1:0` and stop it at will.
//!
//! Shutdown order: stop taking turns (a drain, on SIGTERM, first lets
//! running turns finish for `cluster.drain_s`), interrupt running turns and
//! wait for their `result` events, end follow streams, let connections
//! finish, then close the store (which writes out everything accepted).

use std::sync::Arc;
use std::time::Instant;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod shared;
mod tools;

pub use tools::serve_mcp_stdio;

use crate::deliberation::{self, DeliberationTask, Deliberations};
use crate::pipeline::{self, PipelineTask};

use crate::agent::decide::Decider;
use crate::agent::hook::Hooks;
use crate::agent::turn::TurnDeps;
use crate::agent::{AgentTask, ToolRouter};
use crate::api;
use crate::api::auth::Keys;
use crate::api::state::{AppState, Shared};
use crate::config::Config;
use crate::gateway::Gateway;
use crate::jobs::Jobs;
use crate::mcp::SandboxTools;
use crate::model::ModelRegistry;
use crate::protocol::SessionStatus;
use crate::sandbox::SandboxManager;
use crate::session::approvals::Approvals;
use crate::session::child::ChildTurns;
use crate::session::lease::TurnLeases;
use crate::session::{Limits, SessionManager, SessionTask, Tasks};
use crate::store::Store;
use crate::telemetry::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot open the store in {dir}: {message}")]
    Store { dir: String, message: String },
    #[error("cannot use the NATS bus at {url}: {message}")]
    Bus { url: String, message: String },
    #[error("model configuration: {0}")]
    Model(String),
    #[error("closing turns cut off by the last stop: {0}")]
    Recover(String),
    #[error("sandbox backend: {0}")]
    Sandbox(String),
    #[error("agent profile: {0}")]
    Agents(String),
}

/// What runs the agent's tool calls.
pub enum Tools {
    /// Sandboxes of the configured backend, through the MCP server, which
    /// is also served at `/mcp`.
    Sandboxed,
    /// A router of the caller's own (tests); no sandboxes, no `/mcp`.
    Custom(Arc<dyn ToolRouter>),
}

/// Binds with a deep accept backlog: a burst of clients must not overflow
/// the default 128 and wait a second for a SYN retry.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(4096)
}

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

/// How often sessions nobody uses are dropped from memory (they stay in
/// the store and load again on their next use).
const EVICT_EVERY: Duration = Duration::from_secs(30);
/// How long a stopping server waits for workspace snapshots under way.
const SNAPSHOT_GRACE: Duration = Duration::from_secs(60);

pub struct Server {
    pub state: AppState,
    store: Arc<dyn Store>,
    root: CancellationToken,
    /// The bus's writer, awaited before the store closes.
    bus_tasks: TaskTracker,
    /// Takes other replicas' jobs while the server runs.
    jobs: Arc<dyn Jobs>,
}

impl Server {
    /// Opens the store, builds the providers and closes turns a crash cut off.
    pub async fn build(
        config: Config,
        tools: Tools,
        root: CancellationToken,
    ) -> Result<Server, StartError> {
        Server::build_with_kinds(config, tools, root, Vec::new()).await
    }

    /// [`Server::build`], running `kinds` besides the built-in ones (a
    /// kind given here replaces a built-in one of the same name).
    pub async fn build_with_kinds(
        config: Config,
        tools: Tools,
        root: CancellationToken,
        kinds: Vec<Arc<dyn SessionTask>>,
    ) -> Result<Server, StartError> {
        let store = shared::open_store(&config).await?;
        let metrics = Arc::new(Metrics::new());
        // Each key's name and quota, for auth, the quotas and usage.
        let key_table = Arc::new(crate::quota::KeyTable::new(&config));
        // Their quotas, counted in the store so replicas share them; a
        // dead replica's sandboxes and turns free after one turn lease.
        let quotas = Arc::new(crate::quota::Quotas::new(
            key_table.clone(),
            store.clone(),
            Duration::from_secs(config.cluster.turn_lease_s),
        ));
        // What each key spends, per day and model, in the store.
        let usage = Arc::new(crate::usage::Recorder::new(
            store.clone(),
            key_table.clone(),
            &metrics,
        ));
        let bus_tasks = TaskTracker::new();
        let shared::Bus {
            bus,
            kv,
            event_logs,
        } = shared::connect_bus(&config, &store, &metrics, &bus_tasks, &root).await?;
        let (bus, storage) = shared::metered(bus, &kv, &key_table, &store, &config);
        let upstreams = config.allowed_upstreams();
        tracing::info!(?upstreams, "replicas added at run time may be at");
        let gateway = Arc::new(
            Gateway::new(&config.gateway, &upstreams, metrics.clone())
                .map_err(StartError::Model)?,
        );
        for pool in gateway.pools() {
            let replicas: Vec<String> = pool.replicas().iter().map(|r| r.url.clone()).collect();
            tracing::info!(pool = %pool.name, strategy = ?pool.config.strategy, ?replicas, "gateway pool");
        }
        let models = Arc::new(
            ModelRegistry::with_gateway(&config, Some(gateway.clone()))
                .map_err(|e| StartError::Model(e.to_string()))?,
        );
        // A provider whose listing names the default model is asked now, so
        // the log says which model that is; one not up yet is no reason to
        // refuse to start (sandboxes, the bus and named models work without
        // it), and the first turn that needs the default asks again.
        if let Err(e) = models.default_model_now().await {
            tracing::warn!(error = %e, "default model not known yet; asked again at first use");
        }
        let (tools, sandboxes, mcp): (Arc<dyn ToolRouter>, _, _) = match tools {
            Tools::Custom(router) => (router, None, None),
            Tools::Sandboxed => {
                let (sandboxes, host, instance) =
                    tools::sandbox_host(&config, &store, Some((&quotas, storage.as_ref()))).await?;
                sandboxes.on_removed(usage.sandbox_hook());
                metrics.register_sandbox_pauses(sandboxes.pause_metrics());
                let router = SandboxTools::connect(host.clone(), config.mcp.clone())
                    .await
                    .map_err(|e| StartError::Sandbox(e.to_string()))?;
                let router = shared::cluster_tools(
                    &config,
                    Arc::new(router),
                    &store,
                    instance,
                    &bus_tasks,
                    &root,
                )
                .await?;
                (router, Some(sandboxes), Some(host))
            }
        };
        // With replicas a decision may reach one that does not run the
        // call's turn: it goes on over the bus.
        let approvals = Arc::new(Approvals::new(
            store.clone(),
            config.store.is_some().then(|| bus.clone()),
        ));
        let agent = AgentTask::new(
            TurnDeps {
                approvals: approvals.clone(),
                hooks: Arc::new(Hooks::new(&config.mcp.allowed_http_servers)),
                store: store.clone(),
                models: models.clone(),
                tools,
                config: config.agent.clone(),
                metrics: metrics.clone(),
                usage: usage.clone(),
            },
            config.mcp.clone(),
        );
        let limits = Limits {
            turn_timeout: Duration::from_secs(config.agent.turn_timeout_s),
            ephemeral_retention: Duration::from_secs(config.agent.ephemeral_retention_s),
        };
        // A deliberation with tool-using agents runs each as an agent
        // session: its kind reaches the manager that runs it.
        let definitions = Arc::new(
            pipeline::definitions(&config.pipelines, &|model| {
                models.resolve(model).map(|_| ()).map_err(|e| e.to_string())
            })
            .map_err(|e| StartError::Model(format!("pipelines: {e}")))?,
        );
        let child_turns = Arc::new(ChildTurns::default());
        let jobs = shared::start_jobs(
            &config,
            &models,
            &definitions,
            &metrics,
            child_turns.clone(),
            &usage,
        )
        .await?;
        let queued = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
        let running = deliberation::Running::new(key_table.clone());
        let sessions = Arc::new_cyclic(|manager| {
            let pipelines = PipelineTask::new(pipeline::engine::Deps {
                store: store.clone(),
                config: config.pipelines.clone(),
                definitions: definitions.clone(),
                sessions: manager.clone(),
                slots: Arc::new(crate::sync::KeyedSlots::new(
                    config.pipelines.max_concurrent_pipelines,
                    config.pipelines.max_concurrent_per_key(),
                )),
                queued: queued.clone(),
                jobs: jobs.clone(),
                hook_rules: config.mcp.http_rules(),
            });
            let deliberation = DeliberationTask::new(deliberation::engine::Deps {
                models: models.clone(),
                bus: bus.clone(),
                store: store.clone(),
                max_tokens: config.agent.max_tokens,
                sessions: manager.clone(),
                permits: Arc::new(tokio::sync::Semaphore::new(
                    deliberation::MAX_CONCURRENT_AGENTS,
                )),
                jobs: jobs.clone(),
                running: running.clone(),
                hook_rules: config.mcp.http_rules(),
            });
            let built_in = Tasks::new()
                .with(Arc::new(agent))
                .with(Arc::new(deliberation))
                .with(Arc::new(pipelines));
            let tasks = kinds.into_iter().fold(built_in, Tasks::with);
            let manager = SessionManager::new(
                store.clone(),
                tasks,
                limits,
                metrics.clone(),
                root.child_token(),
            );
            let manager = match event_logs {
                Some(logs) => manager.with_usage(usage.clone()).with_logs(logs),
                None => manager.with_usage(usage.clone()),
            }
            .with_quotas(quotas.clone())
            .with_storage(storage.clone());
            // A shared store means other replicas: turns take leases there,
            // and interrupts reach them over the bus.
            match config.store {
                Some(_) => manager
                    .with_leases(TurnLeases::new(
                        store.clone(),
                        Duration::from_secs(config.cluster.turn_lease_s),
                    ))
                    .with_signals(bus.clone()),
                None => manager,
            }
        });
        let _ = child_turns.sessions.set(Arc::downgrade(&sessions));
        crate::agent::profiles::check(&config, sessions.tasks())
            .await
            .map_err(StartError::Agents)?;
        let deliberations = Arc::new(Deliberations::new(
            sessions.clone(),
            running,
            storage.clone(),
            store.clone(),
            models.clone(),
        ));
        let pipelines = Arc::new(pipeline::runs::Runs::new(
            sessions.clone(),
            store.clone(),
            queued,
            definitions,
            config.pipelines.clone(),
            approvals.clone(),
        ));
        if let Some(host) = &mcp {
            let _ = host.deliberations.set(deliberations.clone());
            let _ = host.pipelines.set(pipelines.clone());
            let _ = host.sessions.set(sessions.clone());
            let _ = host.decider.set(Decider {
                approvals: approvals.clone(),
                config: Arc::new(config.agent.clone()),
            });
        }
        let recovered = sessions
            .recover()
            .await
            .map_err(|e| StartError::Recover(e.to_string()))?;
        if recovered > 0 {
            tracing::warn!(
                sessions = recovered,
                "closed turns cut off by the last stop as interrupted"
            );
        }
        if let Some(sandboxes) = &sandboxes {
            let reaped = reap_orphans(store.as_ref(), sandboxes)
                .await
                .map_err(StartError::Sandbox)?;
            if reaped > 0 {
                tracing::warn!(
                    sandboxes = reaped,
                    "removed sandboxes a previous run left behind"
                );
            }
            tracing::info!(backend = sandboxes.backend_name(), "sandbox backend ready");
        }
        let rollouts = Arc::new(crate::rollout::Rollouts::new(
            gateway.clone(),
            bus.clone(),
            kv.clone(),
            metrics.clone(),
            config.bus.rollout_concurrency,
            Duration::from_secs(config.bus.response_topic_wait_s),
            root.child_token(),
        ));
        let state = AppState::new(Shared {
            keys: Arc::new(Keys::new(key_table, store.clone())),
            quotas,
            config: Arc::new(config),
            sessions,
            models,
            metrics,
            started: Instant::now(),
            store: store.clone(),
            sandboxes,
            mcp,
            gateway,
            bus,
            kv,
            rollouts,
            deliberations,
            pipelines,
            approvals,
            usage,
            storage,
            stop: root.child_token(),
        });
        Ok(Server {
            state,
            store,
            root,
            bus_tasks,
            jobs,
        })
    }

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
        let sessions = self.state.sessions.clone();
        let root = self.root.clone();
        // Background tasks end on the root token and are awaited at
        // shutdown, so none is cut off half way through its work.
        let background = TaskTracker::new();
        background.spawn(
            self.state
                .gateway
                .clone()
                .run_health_checks(root.child_token()),
        );
        background.spawn(self.state.quotas.clone().renew(root.child_token()));
        {
            let sessions = sessions.clone();
            let root = root.clone();
            // Expired ephemeral sessions go within half their retention.
            let retention = Duration::from_secs(self.state.config.agent.ephemeral_retention_s);
            let period = if retention.is_zero() {
                EVICT_EVERY
            } else {
                EVICT_EVERY.min((retention / 2).max(Duration::from_millis(250)))
            };
            background.spawn(periodically(period, root, move || {
                let sessions = sessions.clone();
                async move {
                    match sessions.expire_ephemeral().await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(sessions = n, "expired ephemeral sessions deleted"),
                        Err(e) => tracing::warn!(error = %e, "expiring ephemeral sessions failed"),
                    }
                    sessions.evict_unused();
                }
            }));
        }
        {
            // Draining, the replica takes no more jobs and hands back those
            // it is doing.
            let taking = root.child_token();
            background.spawn(self.jobs.clone().serve(taking.clone()));
            let drain = drain.clone();
            background.spawn(async move {
                tokio::select! {
                    _ = drain.cancelled() => taking.cancel(),
                    _ = taking.cancelled() => {}
                }
            });
        }
        if self.state.config.store.is_some() {
            background.spawn(sessions.clone().listen(root.child_token()));
            background.spawn(self.state.approvals.clone().listen(root.child_token()));
            let sessions = sessions.clone();
            let root = root.clone();
            // Turns of replicas that died are closed a third of a lease
            // after their leases expire, at the latest.
            let period = Duration::from_secs(self.state.config.cluster.turn_lease_s) / 3;
            background.spawn(periodically(period, root, move || {
                let sessions = sessions.clone();
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
        let sandbox_tasks = self.state.sandboxes.clone().map(|sandboxes| {
            let root = root.clone();
            tokio::spawn(async move {
                let idle_every =
                    Duration::from_secs((sandboxes.config().idle_ttl_s / 4).clamp(1, 30));
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
                let prune_every =
                    Duration::from_secs((sandboxes.config().max_lifetime_s / 4).clamp(1, 60));
                let pruner = async {
                    let mut every = tokio::time::interval(prune_every);
                    loop {
                        every.tick().await;
                        if let Err(e) = sandboxes.prune_expired().await {
                            tracing::warn!(error = %e, "removing expired sandboxes failed");
                        }
                    }
                };
                tokio::select! {
                    _ = sandboxes.run_pool(root.clone()) => {}
                    _ = reaper => {}
                    _ = pauser => {}
                    _ = pruner => {}
                }
            })
        });
        let drain_for = Duration::from_secs(self.state.config.cluster.drain_s);
        let stopping = async move {
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
        };
        let open_files = rlimit::Resource::NOFILE
            .get()
            .map(|(soft, _)| soft)
            .unwrap_or(1024);
        let limits = api::serve::Limits::new(&self.state.config.http, open_files);
        tracing::info!(
            max_connections = limits.max_connections,
            per_client = limits.max_connections_per_client,
            "connection limits"
        );
        let overflow = api::overflow_router(self.state.clone());
        let served = api::serve::serve(listener, router, overflow, limits, stopping).await;
        background.close();
        background.wait().await;
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
        if let Err(e) = self.store.close().await {
            tracing::error!(error = %e, "closing the store failed");
        }
        served
    }
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
