//! The root cancellation token and the signals that fire it.

use tokio_util::sync::CancellationToken;

/// Cancels `root` on SIGTERM or ctrl-c.
pub fn on_signal(root: CancellationToken) {
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGTERM");
                    std::future::pending::<()>().await
                }
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! {
            _ = ctrl_c => tracing::info!("ctrl-c: shutting down"),
            _ = term => tracing::info!("SIGTERM: shutting down"),
        }
        root.cancel();
    });
}
