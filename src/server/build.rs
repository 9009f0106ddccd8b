//! Assembling a server from its config, one step after the other: the
//! ground every part stands on (store, metrics, keys, quotas, usage, bus),
//! the models, the tools, the session kinds and their manager, and last
//! recovery from the previous run.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::{Server, StartError, Tools, reap_orphans, shared, toolbox};
use crate::agent::decide::Decider;
use crate::agent::hook::Hooks;
use crate::agent::{AgentTask, ToolRouter, TurnDeps};
use crate::api::http::auth::Keys;
use crate::api::http::state::{AppState, Shared};
use crate::bus::{Bus, Kv, StorageMeter};
use crate::config::Config;
use crate::deliberation::{self, DeliberationTask, Deliberations};
use crate::gateway::Gateway;
use crate::jobs::Jobs;
use crate::mcp::{Live, McpHost};
use crate::model::ModelRegistry;
use crate::pipeline::definition::Definition;
use crate::pipeline::{self, PipelineTask, runs::Runs};
use crate::quota::{KeyTable, Quotas};
use crate::sandbox::SandboxManager;
use crate::session::approvals::Approvals;
use crate::session::child::ChildTurns;
use crate::session::lease::TurnLeases;
use crate::session::log::EventLogs;
use crate::session::{Limits, SessionManager, SessionTask, Tasks};
use crate::store::Store;
use crate::telemetry::Metrics;
use crate::tools::{AgentTools, Toolbox};
use crate::usage::Recorder;

/// What every later step stands on.
struct Ground {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    /// Each key's name and quota, for auth, the quotas and usage.
    key_table: Arc<KeyTable>,
    quotas: Arc<Quotas>,
    usage: Arc<Recorder>,
    /// The bus's writer, awaited before the store closes.
    bus_tasks: TaskTracker,
    /// Measured against each key's `storage_mb` when there are keys.
    bus: Arc<dyn Bus>,
    kv: Arc<Kv>,
    /// Among replicas, the session events' fan-out.
    event_logs: Option<Arc<dyn EventLogs>>,
    storage: Option<Arc<StorageMeter>>,
}

/// What runs the agent's tool calls, and the parts behind it.
struct ToolLayer {
    router: Arc<dyn ToolRouter>,
    sandboxes: Option<Arc<SandboxManager>>,
    /// The sandbox's tools, which the MCP server serves too.
    toolbox: Option<Arc<Toolbox>>,
}

/// What the session kinds share besides the ground.
struct KindParts {
    models: Arc<ModelRegistry>,
    definitions: Arc<BTreeMap<String, Arc<Definition>>>,
    /// Pipeline runs waiting for a place.
    queued: Arc<Mutex<HashSet<Uuid>>>,
    running: Arc<deliberation::Running>,
}

impl Server {
    /// [`Server::build`], running `kinds` besides the built-in ones (a
    /// kind given here replaces a built-in one of the same name).
    pub async fn build_with_kinds(
        config: Config,
        tools: Tools,
        root: CancellationToken,
        kinds: Vec<Arc<dyn SessionTask>>,
    ) -> Result<Server, StartError> {
        crate::bus::check_durables(&config.bus)
            .map_err(|(field, message)| StartError::Config { field, message })?;
        let ground = ground(&config, &root).await?;
        let (gateway, models) = models(&config, &ground.metrics).await?;
        let tools = tool_layer(&config, tools, &ground, &root).await?;
        // With replicas a decision may reach one that does not run the
        // call's turn: it goes on over the bus.
        let approvals = Arc::new(Approvals::new(
            ground.store.clone(),
            config.store.is_some().then(|| ground.bus.clone()),
        ));
        let agent = agent_task(&config, &ground, &models, &tools, &approvals);
        // A deliberation with tool-using agents runs each as an agent
        // session: its kind reaches the manager that runs it.
        let definitions = Arc::new(
            pipeline::definitions(&config.pipelines, &|model| {
                models.resolve(model).map(|_| ()).map_err(|e| e.to_string())
            })
            .map_err(|e| StartError::Model(format!("pipelines: {e}")))?,
        );
        let queue = shared::open_jobs(&config, &ground.metrics).await?;
        let parts = KindParts {
            models: models.clone(),
            definitions,
            queued: Arc::new(Mutex::new(HashSet::new())),
            running: deliberation::Running::new(ground.key_table.clone()),
        };
        // A child turn's handler runs on the manager being made.
        let jobs = |manager: &Weak<SessionManager>| {
            let child_turns = Arc::new(ChildTurns {
                sessions: manager.clone(),
            });
            let handlers =
                shared::job_handlers(&models, &parts.definitions, child_turns, &ground.usage);
            queue.with_handlers(handlers)
        };
        let (sessions, jobs) =
            session_manager(&config, &ground, &parts, agent, kinds, &root, jobs)?;
        crate::agent::profiles::check(&config, sessions.tasks())
            .await
            .map_err(StartError::Agents)?;
        let (deliberations, pipelines) = runs(&config, &ground, &parts, &sessions, &approvals);
        let mcp = tools.toolbox.clone().map(|toolbox| {
            let decider = Decider {
                approvals: approvals.clone(),
                config: Arc::new(config.agent.clone()),
            };
            mcp_host(
                &config,
                &ground,
                (toolbox, tools.router.clone()),
                &sessions,
                &deliberations,
                &pipelines,
                decider,
            )
        });
        recover(&sessions, &ground.store, tools.sandboxes.as_deref()).await?;
        let rollouts = rollouts(&config, &gateway, &ground, &root);
        let Ground {
            store,
            metrics,
            key_table,
            quotas,
            usage,
            bus_tasks,
            bus,
            kv,
            storage,
            event_logs: _,
        } = ground;
        let state = AppState::new(Shared {
            keys: Arc::new(Keys::new(key_table, store.clone())),
            quotas,
            config: Arc::new(config),
            sessions,
            models,
            metrics,
            started: Instant::now(),
            store: store.clone(),
            sandboxes: tools.sandboxes,
            tools: tools.router,
            uploads: Arc::new(tokio::sync::Semaphore::new(
                crate::api::routes::workspace::MAX_SPOOLING,
            )),
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
}

/// Deliberations and pipeline runs, over the sessions.
fn runs(
    config: &Config,
    ground: &Ground,
    parts: &KindParts,
    sessions: &Arc<SessionManager>,
    approvals: &Arc<Approvals>,
) -> (Arc<Deliberations>, Arc<Runs>) {
    let deliberations = Arc::new(Deliberations::new(
        sessions.clone(),
        parts.running.clone(),
        ground.storage.clone(),
        ground.store.clone(),
        parts.models.clone(),
    ));
    let pipelines = Arc::new(Runs::new(
        sessions.clone(),
        ground.store.clone(),
        parts.queued.clone(),
        parts.definitions.clone(),
        config.pipelines.clone(),
        approvals.clone(),
    ));
    (deliberations, pipelines)
}

/// The MCP server's host: the tools, and the tools that start sessions.
fn mcp_host(
    config: &Config,
    ground: &Ground,
    (toolbox, router): (Arc<Toolbox>, Arc<dyn ToolRouter>),
    sessions: &Arc<SessionManager>,
    deliberations: &Arc<Deliberations>,
    pipelines: &Arc<Runs>,
    decider: Decider,
) -> Arc<McpHost> {
    Arc::new(McpHost {
        tools: toolbox,
        store: ground.store.clone(),
        max_forks: config.agent.max_forks,
        scratch: Default::default(),
        live: Some(Live {
            sessions: sessions.clone(),
            deliberations: deliberations.clone(),
            pipelines: pipelines.clone(),
            decider,
            router,
        }),
    })
}

/// Opens the store and the bus, and sets up the keys' quotas and usage.
async fn ground(config: &Config, root: &CancellationToken) -> Result<Ground, StartError> {
    let store = shared::open_store(config).await?;
    let metrics = Arc::new(Metrics::new());
    let key_table = Arc::new(KeyTable::new(config));
    // The quotas are counted in the store so replicas share them; a dead
    // replica's sandboxes and turns free after one turn lease.
    let quotas = Arc::new(Quotas::new(
        key_table.clone(),
        store.clone(),
        Duration::from_secs(config.cluster.turn_lease_s),
    ));
    // What each key spends, per day and model, in the store.
    let usage = Arc::new(Recorder::new(store.clone(), key_table.clone(), &metrics));
    let bus_tasks = TaskTracker::new();
    // Gateway calls' usage, written behind; the rest at shutdown, before
    // the store closes.
    bus_tasks.spawn(usage.clone().write_behind(root.clone()));
    let shared::Bus {
        bus,
        kv,
        event_logs,
        storage,
    } = shared::connect_bus(config, &store, &key_table, &metrics, &bus_tasks, root).await?;
    Ok(Ground {
        store,
        metrics,
        key_table,
        quotas,
        usage,
        bus_tasks,
        bus,
        kv,
        event_logs,
        storage,
    })
}

/// The gateway's pools and the models sessions name.
async fn models(
    config: &Config,
    metrics: &Arc<Metrics>,
) -> Result<(Arc<Gateway>, Arc<ModelRegistry>), StartError> {
    let upstreams = config.allowed_upstreams();
    tracing::info!(?upstreams, "replicas added at run time may be at");
    let gateway = Arc::new(
        Gateway::new(&config.gateway, &upstreams, metrics.clone()).map_err(StartError::Model)?,
    );
    for pool in gateway.pools() {
        let replicas: Vec<String> = pool.replicas().iter().map(|r| r.url.clone()).collect();
        tracing::info!(pool = %pool.name, strategy = ?pool.config.strategy, ?replicas, "gateway pool");
    }
    let models = Arc::new(
        ModelRegistry::with_gateway(config, Some(gateway.clone()))
            .map_err(|e| StartError::Model(e.to_string()))?,
    );
    // A provider whose listing names the default model is asked now, so
    // the log says which model that is; one not up yet is no reason to
    // refuse to start (sandboxes, the bus and named models work without
    // it), and the first turn that needs the default asks again.
    if let Err(e) = models.default_model_now().await {
        tracing::warn!(error = %e, "default model not known yet; asked again at first use");
    }
    Ok((gateway, models))
}

/// The sandboxes of the configured backend and the tools over them, or
/// the caller's own router.
/// Removes what a server that stopped mid-way left in the data directory:
/// uploads being spooled (`uploads/`) and clones being made (`clones/`).
/// Only a server writes there (`conclave mcp` on the same directory does
/// not), and this one has not started any yet.
fn sweep_scratch(data_dir: &std::path::Path) {
    for dir in ["uploads", "clones"] {
        let dir = data_dir.join(dir);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            match removed {
                Ok(()) => {
                    tracing::info!(path = %path.display(), "removed what a stopped server left")
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove what a stopped server left")
                }
            }
        }
    }
}

async fn tool_layer(
    config: &Config,
    tools: Tools,
    ground: &Ground,
    root: &CancellationToken,
) -> Result<ToolLayer, StartError> {
    match tools {
        Tools::Custom(router) => Ok(ToolLayer {
            router,
            sandboxes: None,
            toolbox: None,
        }),
        Tools::Sandboxed => sandboxed(config, ground, root).await,
    }
}

/// [`tool_layer`] on the configured backend.
async fn sandboxed(
    config: &Config,
    ground: &Ground,
    root: &CancellationToken,
) -> Result<ToolLayer, StartError> {
    let accounting = toolbox::Accounting {
        quotas: &ground.quotas,
        storage: ground.storage.as_ref(),
        on_removed: ground.usage.sandbox_hook(),
    };
    let (toolbox, instance) = toolbox::toolbox(config, &ground.store, Some(accounting)).await?;
    let sandboxes = toolbox.sandboxes.clone();
    sandboxes.pause_metrics().register(&ground.metrics);
    if let Some(proxy) = sandboxes.proxy() {
        proxy.register(&ground.metrics);
    }
    sweep_scratch(&config.data_dir);
    let router = AgentTools::new(toolbox.clone(), config.mcp.clone())
        .with_scratch(config.data_dir.join("clones"));
    let router = shared::cluster_tools(
        config,
        Arc::new(router),
        &ground.store,
        instance,
        &ground.bus_tasks,
        root,
    )
    .await?;
    Ok(ToolLayer {
        router,
        sandboxes: Some(sandboxes),
        toolbox: Some(toolbox),
    })
}

/// Rollouts: prompts from the bus to the gateway, answers back.
fn rollouts(
    config: &Config,
    gateway: &Arc<Gateway>,
    ground: &Ground,
    root: &CancellationToken,
) -> Arc<crate::rollout::Rollouts> {
    Arc::new(crate::rollout::Rollouts::new(
        gateway.clone(),
        ground.bus.clone(),
        ground.kv.clone(),
        ground.metrics.clone(),
        config.bus.rollout_concurrency,
        Duration::from_secs(config.bus.response_topic_wait_s),
        root.child_token(),
    ))
}

/// The `agent` session kind.
fn agent_task(
    config: &Config,
    ground: &Ground,
    models: &Arc<ModelRegistry>,
    tools: &ToolLayer,
    approvals: &Arc<Approvals>,
) -> AgentTask {
    AgentTask::new(
        TurnDeps {
            approvals: approvals.clone(),
            hooks: Arc::new(Hooks::new(&config.mcp.allowed_http_servers)),
            store: ground.store.clone(),
            models: models.clone(),
            tools: tools.router.clone(),
            config: config.agent.clone(),
            metrics: ground.metrics.clone(),
            usage: ground.usage.clone(),
        },
        config.mcp.clone(),
    )
}

/// The session manager with the built-in kinds (agent, deliberation,
/// pipeline) and `kinds`, which replace a built-in one of the same name.
fn session_manager(
    config: &Config,
    ground: &Ground,
    parts: &KindParts,
    agent: AgentTask,
    kinds: Vec<Arc<dyn SessionTask>>,
    root: &CancellationToken,
    jobs: impl FnOnce(&Weak<SessionManager>) -> Arc<dyn Jobs>,
) -> Result<(Arc<SessionManager>, Arc<dyn Jobs>), StartError> {
    let limits = Limits {
        turn_timeout: Duration::from_secs(config.agent.turn_timeout_s),
        ephemeral_retention: Duration::from_secs(config.agent.ephemeral_retention_s),
    };
    let mut made = None;
    let sessions = Arc::new_cyclic(|manager| {
        let jobs = made.insert(jobs(manager)).clone();
        let pipelines = PipelineTask::new(pipeline::engine::Deps {
            store: ground.store.clone(),
            config: config.pipelines.clone(),
            definitions: parts.definitions.clone(),
            sessions: manager.clone(),
            slots: Arc::new(crate::sync::KeyedSlots::new(
                config.pipelines.max_concurrent_pipelines,
                config.pipelines.max_concurrent_per_key(),
            )),
            queued: parts.queued.clone(),
            jobs: jobs.clone(),
            hook_rules: config.mcp.http_rules(),
        });
        let deliberation = DeliberationTask::new(deliberation::engine::Deps {
            models: parts.models.clone(),
            bus: ground.bus.clone(),
            store: ground.store.clone(),
            max_tokens: config.agent.max_tokens,
            sessions: manager.clone(),
            permits: Arc::new(tokio::sync::Semaphore::new(
                deliberation::MAX_CONCURRENT_AGENTS,
            )),
            jobs,
            running: parts.running.clone(),
            hook_rules: config.mcp.http_rules(),
        });
        let built_in = Tasks::new()
            .with(Arc::new(agent))
            .with(Arc::new(deliberation))
            .with(Arc::new(pipelines));
        let tasks = kinds.into_iter().fold(built_in, Tasks::with);
        let manager = SessionManager::new(
            ground.store.clone(),
            tasks,
            limits,
            ground.metrics.clone(),
            root.child_token(),
        );
        let manager = match &ground.event_logs {
            Some(logs) => manager
                .with_usage(ground.usage.clone())
                .with_logs(logs.clone()),
            None => manager.with_usage(ground.usage.clone()),
        }
        .with_quotas(ground.quotas.clone())
        .with_storage(ground.storage.clone());
        // A shared store means other replicas: turns take leases there,
        // and interrupts reach them over the bus.
        match config.store {
            Some(_) => manager
                .with_leases(TurnLeases::new(
                    ground.store.clone(),
                    Duration::from_secs(config.cluster.turn_lease_s),
                ))
                .with_signals(ground.bus.clone()),
            None => manager,
        }
    });
    // `Arc::new_cyclic` calls its closure once, before it returns.
    let jobs = made.ok_or_else(|| StartError::Assembly("the job queue was not made".into()))?;
    Ok((sessions, jobs))
}

/// Closes the turns the last stop cut off and removes the sandboxes it
/// left behind.
async fn recover(
    sessions: &SessionManager,
    store: &Arc<dyn Store>,
    sandboxes: Option<&SandboxManager>,
) -> Result<(), StartError> {
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
    if let Some(sandboxes) = sandboxes {
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
    Ok(())
}
