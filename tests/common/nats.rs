//! A nats-server of a test's own (`CONCLAVE_TEST_NATS_SERVER`, which
//! scripts/test.sh sets), on a free port, killed when dropped.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

pub struct NatsServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
    jetstream: bool,
    port: u16,
    pub url: String,
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl NatsServer {
    /// Started and listening; with `jetstream` its store is a temporary
    /// directory.
    pub async fn start(jetstream: bool) -> NatsServer {
        let mut server = NatsServer {
            child: None,
            dir: tempfile::tempdir().unwrap(),
            jetstream,
            port: free_port(),
            url: String::new(),
        };
        server.url = format!("nats://127.0.0.1:{}", server.port);
        server.restart().await;
        server
    }

    /// Kills the server (as a crash would: no lame-duck goodbye) and
    /// waits for it to be gone; its store stays.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.unwrap();
        }
    }

    /// Starts the server again on the same port and store, and waits
    /// until it listens.
    pub async fn restart(&mut self) {
        let binary = std::env::var("CONCLAVE_TEST_NATS_SERVER").unwrap_or_else(|_| {
            panic!(
                "CONCLAVE_TEST_NATS_SERVER is not set: this test starts its own nats-server \
                 (scripts/test.sh sets it)"
            )
        });
        let port = self.port;
        let mut command = Command::new(binary);
        command.args(["-a", "127.0.0.1", "-p", &port.to_string()]);
        if self.jetstream {
            command.arg("-js").arg("-sd").arg(self.dir.path());
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("nats-server starts");
        self.child = Some(child);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "nats-server did not listen on 127.0.0.1:{port}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
