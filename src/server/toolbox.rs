//! The sandboxes and the tools over them, built the same way for
//! `conclave serve` and for `conclave mcp` serving the tools itself, so
//! both use the configured store (PostgreSQL or the data directory's
//! SQLite) and the same limits.

use std::collections::HashSet;
use std::sync::Arc;

use rmcp::ServiceExt;

use super::{StartError, shared};
use crate::config::Config;
use crate::mcp::{Caller, McpHost, SandboxServer};
use crate::protocol::SessionStatus;
use crate::sandbox::{self, SandboxManager};
use crate::store::{Store, postgres};
use crate::tools::Toolbox;

/// The JetStream object store bucket of the snapshots' files.
pub const SNAPSHOT_BUCKET: &str = "conclave_snapshots";

/// What a server counts its sandboxes against: the keys' quotas, the
/// storage meter named snapshots count in, and the usage a removed
/// sandbox adds to.
pub(super) struct Accounting<'a> {
    pub quotas: &'a Arc<crate::quota::Quotas>,
    pub storage: Option<&'a Arc<crate::bus::StorageMeter>>,
    pub on_removed: crate::sandbox::manager::OnRemoved,
}

/// The configured backend's sandboxes, as the data directory's instance,
/// and the tools over them, counted with `accounting` when given. Also
/// returns the instance id.
pub(super) async fn toolbox(
    config: &Config,
    store: &Arc<dyn Store>,
    accounting: Option<Accounting<'_>>,
) -> Result<(Arc<Toolbox>, String), StartError> {
    let secrets = sandbox::secrets::SecretStore::from_config(config);
    let proxy = Arc::new(sandbox::proxy::EgressProxy::new(
        &config.sandbox.network,
        secrets.scrubber_of_all(),
    ));
    let backend = sandbox::connect(&config.sandbox, &config.data_dir, proxy.clone())
        .await
        .map_err(|e| StartError::Sandbox(e.to_string()))?;
    let instance = sandbox::instance_id(&config.data_dir).map_err(|e| StartError::Store {
        dir: config.data_dir.display().to_string(),
        message: format!("instance-id: {e}"),
    })?;
    let snapshots = sandbox::snapshots::Snapshots::new(
        store.clone(),
        config.data_dir.join("snapshots"),
        config.sandbox.snapshots.keep_last,
        instance.clone(),
        std::time::Duration::from_secs(config.sandbox.max_exec_timeout_s),
    );
    // Among replicas (the bus on NATS), a fork, a download or a
    // `from_snapshot` session on any of them reads the files in NATS.
    let snapshots = match &config.bus.url {
        Some(url) => {
            let files = crate::bus::NatsFiles::connect(url, SNAPSHOT_BUCKET)
                .await
                .map_err(|e| StartError::Bus {
                    url: url.clone(),
                    message: format!("opening the snapshots' object store: {e}"),
                })?;
            snapshots.with_shared(Arc::new(files))
        }
        None => snapshots,
    };
    let sandboxes = SandboxManager::new(backend, config.sandbox.clone(), instance.clone())
        .with_snapshots(snapshots)
        .with_marks(config.data_dir.join("sandbox-sessions"))
        .with_secrets(secrets)
        .with_proxy(proxy);
    let sandboxes = Arc::new(match accounting {
        Some(accounting) => {
            // Named snapshots count in a key's `storage_mb`.
            if let (Some(meter), Some(named)) = (accounting.storage, sandboxes.snapshots()) {
                meter.count_also(named.clone());
            }
            sandboxes
                .with_quotas(accounting.quotas.clone())
                .with_on_removed(accounting.on_removed)
        }
        None => sandboxes,
    });
    Ok((Arc::new(Toolbox::new(sandboxes)), instance))
}

/// Serves the sandbox tools over stdin/stdout until the client closes
/// them, on the store and sandboxes `conclave serve` would use with this
/// config; no HTTP, and no sessions run here (so no `run_agent`). A call
/// naming a session uses that session's sandbox, the one a server on the
/// same data directory uses (made by whichever process came first), and
/// leaves it running at exit for the session's next turn; calls that name
/// no session share a scratch sandbox destroyed at exit.
///
/// Unlike [`super::Server::build`], this closes no turns and removes no
/// sandboxes at start: a server on the same store may be running them.
pub async fn serve_mcp_stdio(config: Config) -> anyhow::Result<()> {
    let store = shared::open_store(&config).await?;
    // The one trusted local client: no key, no quota.
    let (tools, _) = toolbox(&config, &store, None).await?;
    let sandboxes = tools.sandboxes.clone();
    let store_name = match &config.store {
        Some(url) => postgres::redact(url),
        None => "sqlite in the data directory".to_string(),
    };
    tracing::info!(
        backend = sandboxes.backend_name(),
        store = %store_name,
        "conclave mcp: serving sandbox tools on stdio"
    );
    let host = McpHost {
        tools,
        store: store.clone(),
        max_forks: config.agent.max_forks,
        scratch: Default::default(),
        live: None,
    };
    let server = SandboxServer::new(Arc::new(host), Caller::Trusted);
    let running = server.serve(rmcp::transport::stdio()).await?;
    let ended = running.waiting().await;
    let mut live = HashSet::new();
    for id in sandboxes.leased_sessions() {
        if let Ok(Some(record)) = store.get_session(id).await
            && record.status != SessionStatus::Closed
        {
            live.insert(id);
        }
    }
    sandboxes.release_all_except(|id| live.contains(&id)).await;
    store.close().await?;
    ended?;
    Ok(())
}
