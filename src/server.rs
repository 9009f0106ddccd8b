//! Builds the server from a config and runs it on a listener until the root
//! token is cancelled, so tests bind `127.0.0.1:0` and stop it at will.
//!
//! Shutdown order: stop taking turns, interrupt running turns and wait for
//! their `result` events, end follow streams, let connections finish, then
//! close the store (which writes out everything accepted).

use std::sync::Arc;
use std::time::Instant;

use axum::serve::ListenerExt;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};
use tokio_util::sync::CancellationToken;

use crate::agent::{SessionManager, ToolRouter};
use crate::api;
use crate::api::auth::Keys;
use crate::config::Config;
use crate::model::ModelRegistry;
use crate::state::AppState;
use crate::store::{SqliteStore, Store};
use crate::telemetry::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot open the store in {dir}: {message}")]
    Store { dir: String, message: String },
    #[error("model configuration: {0}")]
    Model(String),
    #[error("closing turns cut off by the last stop: {0}")]
    Recover(String),
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

/// How often sessions nobody uses are dropped from memory (they stay in
/// the store and load again on their next use).
const EVICT_EVERY: Duration = Duration::from_secs(30);

pub struct Server {
    pub state: AppState,
    store: Arc<dyn Store>,
    root: CancellationToken,
}

impl Server {
    /// Opens the store, builds the providers and closes turns a crash cut off.
    pub async fn build(
        config: Config,
        tools: Arc<dyn ToolRouter>,
        root: CancellationToken,
    ) -> Result<Server, StartError> {
        let path = config.data_dir.join("conclave.db");
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open(&path).map_err(|e| StartError::Store {
                dir: config.data_dir.display().to_string(),
                message: e.to_string(),
            })?);
        let models = Arc::new(
            ModelRegistry::from_config(&config).map_err(|e| StartError::Model(e.to_string()))?,
        );
        let metrics = Arc::new(Metrics::new());
        let sessions = Arc::new(SessionManager::new(
            store.clone(),
            models,
            tools,
            config.agent.clone(),
            metrics.clone(),
            root.child_token(),
        ));
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
        let state = AppState {
            keys: Arc::new(Keys::new(&config.api_keys)),
            config: Arc::new(config),
            sessions,
            metrics,
            started: Instant::now(),
        };
        Ok(Server { state, store, root })
    }

    /// Serves until the root token is cancelled, then shuts down in order.
    pub async fn run(self, listener: TcpListener) -> std::io::Result<()> {
        let router = api::router(self.state.clone());
        let sessions = self.state.sessions.clone();
        let root = self.root.clone();
        let evictor = {
            let sessions = sessions.clone();
            let root = root.clone();
            tokio::spawn(async move {
                let mut every = tokio::time::interval(EVICT_EVERY);
                loop {
                    tokio::select! {
                        _ = every.tick() => sessions.evict_unused(),
                        _ = root.cancelled() => return,
                    };
                }
            })
        };
        let stopping = async move {
            root.cancelled().await;
            sessions.shutdown().await;
        };
        // Events are small writes that must leave at once: no Nagle delay.
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
        });
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(stopping)
            .await;
        evictor.abort();
        if let Err(e) = self.store.close().await {
            tracing::error!(error = %e, "closing the store failed");
        }
        served
    }
}
