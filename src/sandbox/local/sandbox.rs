//! [`LocalSandbox`]: exec, stats and destroy for one sandbox.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::cgroup::SandboxCgroup;
use super::jail::{Jail, Layout};
use super::meta::{read_meta, write_meta};
use super::run::{self, KillSwitch, Launch};
use super::{Host, lock};
use crate::sandbox::{
    ExecChunk, ExecRequest, ExecStatus, LABEL_POOL, LABEL_SESSION, Result, Sandbox, SandboxError,
    SandboxStats,
};

/// One local sandbox.
#[derive(Debug)]
pub struct LocalSandbox {
    pub(super) id: String,
    pub(super) layout: Layout,
    pub(super) host: Arc<Host>,
    pub(super) jail: Jail,
    pub(super) cgroup: Arc<SandboxCgroup>,
    pub(super) execs: Mutex<Execs>,
    /// Holds a token per running exec until its container has exited.
    pub(super) tracker: TaskTracker,
    /// When the CPU usage was last sampled, and what it was.
    pub(super) cpu_sample: Mutex<(Instant, u64)>,
}

#[derive(Debug, Default)]
pub(super) struct Execs {
    destroyed: bool,
    next: u64,
    running: HashMap<u64, Arc<KillSwitch>>,
}

/// Kills an exec's tree when its future ends, however it ends (including
/// being dropped mid-way), and forgets it. After a normal end the tree is
/// gone already and the kill does nothing.
struct ExecGuard<'a> {
    sandbox: &'a LocalSandbox,
    key: u64,
    switch: Arc<KillSwitch>,
}

impl Drop for ExecGuard<'_> {
    fn drop(&mut self) {
        self.switch.kill();
        lock(&self.sandbox.execs).running.remove(&self.key);
    }
}

impl LocalSandbox {
    /// After a command was killed with SIGKILL: when files take most of
    /// the sandbox's memory, says so on its stderr. Files in tmpfs stay
    /// charged to the sandbox, so later commands are mostly killed too
    /// (`rm` included), with no other clue why.
    async fn explain_memory_kill(&self, stderr: &mpsc::Sender<ExecChunk>) {
        let Some((limit, in_files)) = self.cgroup.memory_in_files() else {
            return;
        };
        if in_files.saturating_mul(2) < limit {
            return;
        }
        const MIB: u64 = 1024 * 1024;
        let message = format!(
            "\nconclave: killed for lack of memory: files in /workspace, /tmp and /dev/shm \
             (memory-backed) take {} MiB of the sandbox's {} MiB, so later commands are likely \
             to be killed too, even one that deletes them; delete files, or reset the sandbox \
             (DELETE /sandboxes/{}: the session gets a fresh one at its next call)\n",
            in_files / MIB,
            limit / MIB,
            self.id
        );
        let _ = stderr.send(ExecChunk::Stderr(message.into())).await;
    }
}

#[async_trait]
impl Sandbox for LocalSandbox {
    fn id(&self) -> &str {
        &self.id
    }

    /// Records the session in meta.json in place of the pool label, so a
    /// restarted server finds the sandbox as the session's.
    async fn assign(&self, session_id: &str) -> Result<()> {
        let layout = self.layout.clone();
        let session = session_id.to_string();
        tokio::task::spawn_blocking(move || {
            let mut meta = read_meta(&layout)?;
            meta.spec.labels.remove(LABEL_POOL);
            meta.spec.labels.insert(LABEL_SESSION.into(), session);
            write_meta(&layout, &meta)
        })
        .await
        .map_err(|e| SandboxError::Backend(format!("assigning a sandbox: {e}")))?
        .map_err(|e| SandboxError::Backend(format!("assigning a sandbox: {e}")))
    }

    async fn exec(
        &self,
        request: ExecRequest,
        output: mpsc::Sender<ExecChunk>,
        cancel: CancellationToken,
    ) -> Result<ExecStatus> {
        if request.command.is_empty() {
            return Err(SandboxError::Backend("an exec needs a command".into()));
        }
        // Removed behind this process's back (by another server on the same
        // root, or by hand): say so rather than fail making the exec's root.
        if !self.layout.meta().exists() {
            return Err(SandboxError::Gone(self.id.clone()));
        }
        // Paused by the server that owns it (this is `conclave mcp` sharing
        // the session's sandbox): the exec would freeze as it joined.
        if self.cgroup.frozen() {
            return Err(SandboxError::Backend(format!(
                "sandbox {} is paused (idle); the session's next tool call through \
                 the server resumes it",
                self.id
            )));
        }
        let deadline = Instant::now() + request.timeout;
        let switch = Arc::new(KillSwitch::default());
        let (key, token) = {
            let mut execs = lock(&self.execs);
            if execs.destroyed {
                return Err(SandboxError::Gone(self.id.clone()));
            }
            execs.next += 1;
            let key = execs.next;
            execs.running.insert(key, switch.clone());
            (key, self.tracker.token())
        };
        let _guard = ExecGuard {
            sandbox: self,
            key,
            switch: switch.clone(),
        };
        let egress = match (self.jail.egress(), self.host.proxy.get()) {
            (None, _) => None,
            (Some(allow), Some(proxy)) => Some(run::Egress {
                proxy: proxy.clone(),
                allow: allow.clone(),
                key: self.id.clone(),
            }),
            (Some(_), None) => {
                return Err(SandboxError::Unavailable(
                    "this sandbox has an allow-list, and the backend no egress proxy".into(),
                ));
            }
        };
        let root = self.layout.exec_root();
        let launch = Launch {
            command: self
                .jail
                .command(&request, &root)
                .map_err(SandboxError::Backend)?,
            root,
            cgroup: self.cgroup.clone(),
            veth: self.jail.veth(),
            egress,
            switch,
            token,
        };
        let note = output.clone();
        let status = run::execute(launch, request.stdin, output, deadline, cancel).await?;
        if status.exit_code == Some(137) && !status.timed_out && !status.cancelled {
            self.explain_memory_kill(&note).await;
        }
        Ok(status)
    }

    /// The sandbox's cgroup's CPU accounting.
    async fn cpu_seconds(&self) -> Option<f64> {
        self.cgroup.cpu_usage_ns().map(|ns| ns as f64 / 1e9)
    }

    async fn stats(&self) -> Result<SandboxStats> {
        let now = Instant::now();
        let cpu_percent = self.cgroup.cpu_usage_ns().map(|usage| {
            let mut last = lock(&self.cpu_sample);
            let used = usage.saturating_sub(last.1) as f64;
            let elapsed = now.saturating_duration_since(last.0).as_nanos().max(1) as f64;
            *last = (now, usage);
            used / elapsed * 100.0
        });
        Ok(SandboxStats {
            cpu_percent,
            memory_bytes: self.cgroup.memory_bytes(),
            pids: self.cgroup.pids(),
        })
    }

    /// Freezes the sandbox's cgroup; a host that gave it no freezer cgroup
    /// (not root, or cgroup v2 only) cannot pause it.
    async fn pause(&self) -> Result<bool> {
        if !self.cgroup.can_freeze() {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::info!(
                    "local sandboxes cannot be paused here: no writable cgroup v1 freezer \
                     (run as root on a host that mounts it); idle ones keep running"
                );
            });
            return Ok(false);
        }
        self.cgroup
            .freeze()
            .await
            .map_err(|e| SandboxError::Backend(format!("pausing sandbox {}: {e}", self.id)))?;
        Ok(true)
    }

    async fn resume(&self) -> Result<()> {
        self.cgroup
            .thaw()
            .map_err(|e| SandboxError::Backend(format!("resuming sandbox {}: {e}", self.id)))
    }

    async fn destroy(&self) -> Result<()> {
        let running: Vec<_> = {
            let mut execs = lock(&self.execs);
            execs.destroyed = true;
            execs.running.values().cloned().collect()
        };
        for switch in running {
            switch.kill();
        }
        // A paused sandbox's processes act on the kill once thawed.
        if let Err(e) = self.cgroup.thaw() {
            tracing::warn!(sandbox = %self.id, error = %e, "cannot thaw a sandbox to destroy it");
        }
        self.tracker.close();
        self.tracker.wait().await;
        self.host.purge(&self.id).await
    }
}
