//! What replicas share, or what stands in for it on one server: the
//! store, the bus with its KV, the session events' fan-out and the jobs.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::StartError;
use crate::agent::ToolRouter;
use crate::bus::{BusError, EmbeddedBus, Kv, NatsBus};
use crate::config::Config;
use crate::jobs::{self, Handlers, nats::QueueConfig};
use crate::model::ModelRegistry;
use crate::pipeline::definition::Definition;
use crate::session::child::{CHILD_TURN, ChildTurns};
use crate::session::log::{EventLogs, NatsLogs};
use crate::store::{PostgresStore, SqliteStore, Store, postgres};
use crate::telemetry::Metrics;
use crate::tools::remote::ClusterTools;
use crate::{deliberation, pipeline};

/// The PostgreSQL database `store` names (migrated to this version's
/// schema), or else SQLite in the data directory. An error names the URL
/// without its password.
pub(super) async fn open_store(config: &Config) -> Result<Arc<dyn Store>, StartError> {
    if let Some(url) = &config.store {
        let store = PostgresStore::open_sized(url, config.cluster.store_connections())
            .await
            .map_err(|e| StartError::Store {
                dir: postgres::redact(url),
                message: e.to_string(),
            })?;
        return Ok(Arc::new(store));
    }
    let store =
        SqliteStore::open(&config.data_dir.join("conclave.db")).map_err(|e| StartError::Store {
            dir: config.data_dir.display().to_string(),
            message: e.to_string(),
        })?;
    Ok(Arc::new(store))
}

/// The bus, its KV and, among replicas, the session events' fan-out.
pub(super) struct Bus {
    pub bus: Arc<dyn crate::bus::Bus>,
    pub kv: Arc<Kv>,
    pub event_logs: Option<Arc<dyn EventLogs>>,
    /// With keys, what measures the bus's durable publishes and the KV's
    /// puts against each key's `storage_mb` (what else keeps a key's
    /// bytes registers with it).
    pub storage: Option<Arc<crate::bus::StorageMeter>>,
}

/// With keys, the meter of what each key keeps on `bus` and in `store`.
fn storage_meter(
    keys: &Arc<crate::quota::KeyTable>,
    store: &Arc<dyn Store>,
    bus: &Arc<dyn crate::bus::Bus>,
) -> Option<Arc<crate::bus::StorageMeter>> {
    (!keys.is_empty()).then(|| {
        Arc::new(crate::bus::StorageMeter::new(
            keys.clone(),
            store.clone(),
            bus.clone(),
        ))
    })
}

/// The embedded bus on the store, or NATS at `bus.url`; with keys, both
/// the bus and its KV measured against each key's `storage_mb`.
pub(super) async fn connect_bus(
    config: &Config,
    store: &Arc<dyn Store>,
    keys: &Arc<crate::quota::KeyTable>,
    metrics: &Arc<Metrics>,
    bus_tasks: &TaskTracker,
    root: &CancellationToken,
) -> Result<Bus, StartError> {
    let (bus, kv, storage) = match &config.bus.url {
        None => {
            let bus = EmbeddedBus::start(
                store.clone(),
                &config.bus,
                metrics.clone(),
                bus_tasks,
                root.child_token(),
            )
            .await
            .map_err(|e| StartError::Store {
                dir: config.data_dir.display().to_string(),
                message: format!("loading the bus's subjects: {e}"),
            })?;
            let bus: Arc<dyn crate::bus::Bus> = Arc::new(bus);
            let storage = storage_meter(keys, store, &bus);
            let kv = Kv::new(store.clone(), config.bus.max_payload_bytes).metered(storage.clone());
            (bus, Arc::new(kv), storage)
        }
        Some(url) => {
            let failed = |e: BusError| StartError::Bus {
                url: url.clone(),
                message: e.to_string(),
            };
            let bus = NatsBus::connect(
                url,
                "conclave",
                &config.bus,
                metrics.clone(),
                root.child_token(),
            )
            .await
            .map_err(failed)?;
            let nats = Arc::new(bus);
            let bus: Arc<dyn crate::bus::Bus> = nats.clone();
            let storage = storage_meter(keys, store, &bus);
            let kv = nats
                .kv(
                    store.clone(),
                    config.bus.max_payload_bytes,
                    storage.clone(),
                    bus_tasks,
                )
                .await
                .map_err(failed)?;
            (bus, kv, storage)
        }
    };
    let bus: Arc<dyn crate::bus::Bus> = match &storage {
        Some(meter) => Arc::new(crate::bus::MeteredBus::new(bus, meter.clone(), &config.bus)),
        None => bus,
    };
    // With NATS, session events fan out over it too, so a client on any
    // replica streams a turn that runs on another.
    let event_logs: Option<Arc<dyn EventLogs>> = match &config.bus.url {
        Some(url) => {
            let logs = NatsLogs::connect(url, store.clone(), metrics.clone())
                .await
                .map_err(|e| StartError::Bus {
                    url: url.clone(),
                    message: format!("connecting for session events: {e}"),
                })?;
            Some(Arc::new(logs))
        }
        None => None,
    };
    Ok(Bus {
        bus,
        kv,
        event_logs,
        storage,
    })
}

/// The kinds of job any replica may do: deliberation agents' tool-using
/// turns and model calls, pipeline nodes in test mode.
const JOB_KINDS: [&str; 3] = [
    CHILD_TURN,
    deliberation::agents::MODEL_CALL,
    pipeline::agents::MOCK_NODE,
];

/// The queue of the jobs any replica may do: NATS's work queue among
/// replicas, in process on one server.
pub(super) async fn open_jobs(
    config: &Config,
    metrics: &Arc<Metrics>,
) -> Result<crate::jobs::Queue, StartError> {
    let queue = QueueConfig {
        ack_wait: Duration::from_secs(config.cluster.job_ack_wait_s),
        max_running: config.cluster.max_jobs,
    };
    jobs::open(
        config.bus.url.as_deref(),
        &JOB_KINDS,
        queue,
        metrics.clone(),
    )
    .await
    .map_err(|e| StartError::Bus {
        url: config.bus.url.clone().unwrap_or_default(),
        message: e.to_string(),
    })
}

/// The handlers of the [`JOB_KINDS`] this replica does.
pub(super) fn job_handlers(
    models: &Arc<ModelRegistry>,
    definitions: &Arc<std::collections::BTreeMap<String, Arc<Definition>>>,
    child_turns: Arc<ChildTurns>,
    usage: &Arc<crate::usage::Recorder>,
) -> Handlers {
    Handlers::default()
        .with(CHILD_TURN, child_turns)
        .with(
            deliberation::agents::MODEL_CALL,
            Arc::new(deliberation::agents::ModelCalls {
                models: models.clone(),
                usage: usage.clone(),
            }),
        )
        .with(
            pipeline::agents::MOCK_NODE,
            Arc::new(pipeline::agents::MockNodes {
                definitions: definitions.clone(),
            }),
        )
}

/// The sandbox tools of this replica: among replicas, a call runs on the
/// replica holding the session's sandbox ([`crate::tools::remote`]).
pub(super) async fn cluster_tools(
    config: &Config,
    local: Arc<dyn ToolRouter>,
    store: &Arc<dyn Store>,
    instance: String,
    tasks: &TaskTracker,
    root: &CancellationToken,
) -> Result<Arc<dyn ToolRouter>, StartError> {
    let Some(url) = &config.bus.url else {
        return Ok(local);
    };
    let tools = ClusterTools::start(
        local,
        url,
        store.clone(),
        instance,
        root.child_token(),
        tasks,
    )
    .await
    .map_err(|message| StartError::Bus {
        url: url.clone(),
        message,
    })?;
    Ok(tools)
}
