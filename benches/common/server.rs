//! The release server as a child process, shared by the benchmarks.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The release server as a child process, killed when dropped.
pub struct ServerProcess {
    child: Child,
    pub addr: SocketAddr,
    data_dir: tempfile::TempDir,
}

impl ServerProcess {
    /// Starts `conclave serve` on 127.0.0.1:0 with extra environment
    /// variables and waits until it says where it listens.
    pub async fn start(envs: &[(&str, String)]) -> Result<ServerProcess, String> {
        let data_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .map_err(|e| format!("cannot make a data directory: {e}"))?;
        ServerProcess::start_in(data_dir, envs, &[]).await
    }

    /// As [`ServerProcess::start`], in a given data directory (where the
    /// caller may have put a config file) and with extra arguments.
    pub async fn start_in(
        data_dir: tempfile::TempDir,
        envs: &[(&str, String)],
        args: &[String],
    ) -> Result<ServerProcess, String> {
        let log = std::fs::File::create(data_dir.path().join("server.log"))
            .map_err(|e| format!("cannot create the server log: {e}"))?;
        let mut child = Command::new(env!("CARGO_BIN_EXE_conclave"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir.path())
            .args(args)
            // These benches measure the server core: no warm sandboxes
            // starting beside them on the same two cores.
            .env("CONCLAVE_SANDBOX__WARM_POOL", "0")
            .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", env!("CARGO_BIN_EXE_conclave")))?;
        let stdout = child.stdout.take().ok_or("the server has no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .map_err(|_| "the server did not say where it listens within 30 s".to_string())?
            .map_err(|e| format!("reading the server's stdout: {e}"))?
            .ok_or_else(|| {
                let log =
                    std::fs::read_to_string(data_dir.path().join("server.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                format!("the server exited before listening: {}", tail.join(" | "))
            })?;
        let addr = first
            .strip_prefix("conclave listening on http://")
            .and_then(|addr| addr.trim().parse().ok())
            .ok_or_else(|| format!("unexpected first line from the server: {first:?}"))?;
        // Keep draining stdout so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(ServerProcess {
            child,
            addr,
            data_dir,
        })
    }

    pub fn data_dir(&self) -> &std::path::Path {
        self.data_dir.path()
    }

    pub fn pid(&self) -> Result<String, String> {
        let pid = self.child.id().ok_or("the server has exited")?;
        Ok(pid.to_string())
    }

    pub fn url(&self) -> Arc<str> {
        format!("http://{}/agent/run", self.addr).into()
    }

    /// The last lines the server logged, to explain a failure.
    pub fn log_tail(&self) -> String {
        let log =
            std::fs::read_to_string(self.data_dir.path().join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

/// The machine's 1, 5 and 15 minute load averages, for a report.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}
