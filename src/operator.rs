//! `conclave sandboxes list|prune`: an operator's view of every sandbox
//! Conclave made on this host's backend, whichever data directory made it
//! and whether or not its server still runs.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::config::Config;
use crate::sandbox::{self, ManagedSandbox, SandboxBackend, SandboxManager};
use crate::store::{SqliteStore, Store};

/// How much `prune` removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prune {
    /// Expired sandboxes, and those of this data directory that no live
    /// session owns (when its server is not running).
    Default,
    /// Every sandbox Conclave made on the backend.
    All,
}

async fn backend(config: &Config) -> anyhow::Result<Arc<dyn SandboxBackend>> {
    let secrets = sandbox::secrets::SecretStore::from_config(config);
    let proxy = Arc::new(sandbox::proxy::EgressProxy::new(
        &config.sandbox.network,
        secrets.scrubber_of_all(),
    ));
    Ok(sandbox::connect(&config.sandbox, &config.data_dir, proxy).await?)
}

fn expires(at: Option<i64>) -> String {
    at.and_then(|at| DateTime::<Utc>::from_timestamp(at, 0))
        .map(|t| t.to_rfc3339())
        .unwrap_or_else(|| "never".into())
}

/// One line per sandbox, with a header.
pub fn table(sandboxes: &[ManagedSandbox], own_instance: Option<&str>) -> String {
    let now = Utc::now().timestamp();
    let mut out = format!(
        "{:<20} {:<10} {:<44} {:<26} {}\n",
        "ID", "INSTANCE", "FOR", "EXPIRES", "STATE"
    );
    for s in sandboxes {
        let id: String = s.id.chars().take(20).collect();
        let instance = match (s.instance.as_deref(), own_instance) {
            (Some(i), Some(own)) if i == own => "this".to_string(),
            (Some(i), _) => i.chars().take(10).collect(),
            (None, _) => "-".into(),
        };
        let owner = match (&s.session, &s.pool) {
            (Some(session), _) => format!("session {session}"),
            (None, Some(pool)) => format!("pool {pool}"),
            (None, None) => "-".into(),
        };
        let state = if s.expired(now) { "expired" } else { "ok" };
        out.push_str(&format!(
            "{id:<20} {instance:<10} {owner:<44} {:<26} {state}\n",
            expires(s.expires)
        ));
    }
    out
}

pub async fn list(config: &Config) -> anyhow::Result<String> {
    let backend = backend(config).await?;
    let own = own_instance(config);
    let sandboxes = backend.list_managed().await?;
    Ok(table(&sandboxes, own.as_deref()))
}

/// The instance id of the data directory, if it has one already.
fn own_instance(config: &Config) -> Option<String> {
    std::fs::read_to_string(config.data_dir.join("instance-id"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Removes what `how` says; returns a report for the operator.
pub async fn prune(config: &Config, how: Prune) -> anyhow::Result<String> {
    let backend = backend(config).await?;
    let mut report = String::new();
    if how == Prune::All {
        let all = backend.list_managed().await?;
        for s in &all {
            backend.remove(&s.id).await?;
        }
        report.push_str(&format!("removed {} sandbox(es)\n", all.len()));
        return Ok(report);
    }
    // A data directory never used has no instance (and is not made here).
    let instance = own_instance(config);
    let manager = SandboxManager::new(
        backend,
        config.sandbox.clone(),
        instance.clone().unwrap_or_default(),
    );
    let expired = manager.prune_expired().await?;
    report.push_str(&format!("removed {expired} expired sandbox(es)\n"));
    if instance.is_none() {
        return Ok(report);
    }
    match crate::locate::running_on(&config.data_dir) {
        Some(server) => report.push_str(&format!(
            "kept this data directory's other sandboxes: its server runs (pid {}), and reaps its own\n",
            server.pid
        )),
        None => {
            let store: Arc<dyn Store> =
                Arc::new(SqliteStore::open(&config.data_dir.join("conclave.db"))?);
            let orphans = crate::server::reap_orphans(store.as_ref(), &manager)
                .await
                .map_err(anyhow::Error::msg)?;
            store.close().await?;
            report.push_str(&format!(
                "removed {orphans} sandbox(es) of {} that no live session owns\n",
                config.data_dir.display()
            ));
        }
    }
    Ok(report)
}
