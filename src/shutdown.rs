//! The signals that stop the server: the first SIGTERM or ctrl-c drains it
//! (running turns may finish, new ones go to other replicas), a second one
//! stops it at once.

use tokio_util::sync::CancellationToken;

/// Cancels `drain` on the first SIGTERM or ctrl-c and `root` on the next.
pub fn on_signal(drain: CancellationToken, root: CancellationToken) {
    tokio::spawn(async move {
        #[cfg(unix)]
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => Some(signal),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGTERM");
                    None
                }
            };
        for (token, what) in [(drain, "draining"), (root, "stopping now")] {
            #[cfg(unix)]
            let terminated = async {
                match term.as_mut() {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            #[cfg(not(unix))]
            let terminated = std::future::pending::<()>();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => tracing::info!("ctrl-c: {what}"),
                _ = terminated => tracing::info!("SIGTERM: {what}"),
            }
            token.cancel();
        }
    });
}
