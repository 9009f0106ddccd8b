//! [`LocalSandbox`]: exec, stats and destroy for one sandbox.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use std::path::{Path, PathBuf};

use super::cgroup::SandboxCgroup;
use super::cow;
use super::jail::{Jail, Layout};
use super::meta::{read_meta, write_meta};
use super::resident::{self, RESIDENT_PROCESSES, Resident};
use super::run::{self, KillSwitch, Launch};
use super::{Host, lock};
use crate::sandbox::bulk::{self, Channel, Over};
use crate::sandbox::helper;
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
    /// The resident exec helper (see `resident`).
    pub(super) resident: tokio::sync::Mutex<ResidentState>,
    /// Its workspace is an overlay of layers (see `cow`).
    pub(super) layered: bool,
}

/// Where a sandbox's resident exec helper stands.
#[derive(Debug)]
pub(super) enum ResidentState {
    /// None running: start one at the next exec. Counts the starts that
    /// failed in a row.
    Pending(u8),
    Ready(Resident),
    /// Each exec runs in a container of its own: the sandbox's limits are
    /// per exec, its helper would not start, or it is being destroyed.
    Off,
}

/// Ends a running resident: the next one mounts the workspace anew.
fn stop_resident(state: &mut ResidentState) {
    if matches!(state, ResidentState::Ready(_)) {
        *state = ResidentState::Pending(0);
    }
}

/// Runs blocking file system work off the runtime's threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(std::io::Error::other)?
}

impl ResidentState {
    pub(super) fn for_jail(jail: &Jail) -> ResidentState {
        if jail.per_exec_limits() {
            ResidentState::Off
        } else {
            ResidentState::Pending(0)
        }
    }
}

/// Starts of a resident that may fail in a row (a sandbox whose memory is
/// full of files gets its new container killed) before the sandbox's execs
/// run each in a container of its own for good.
const RESIDENT_TRIES: u8 = 3;

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
    /// How a step on the sandbox's files failed, for its error.
    fn failed(&self, what: &'static str) -> impl Fn(std::io::Error) -> SandboxError + '_ {
        move |e| SandboxError::Backend(format!("{what} of sandbox {}: {e}", self.id))
    }

    /// The egress proxy's listener an exec's (or the resident's) network
    /// namespace needs, for a sandbox with an allow-list.
    fn egress(&self) -> Result<Option<run::Egress>> {
        match (self.jail.egress(), self.host.proxy.get()) {
            (None, _) => Ok(None),
            (Some(allow), Some(proxy)) => Ok(Some(run::Egress {
                proxy: proxy.clone(),
                allow: allow.clone(),
                key: self.id.clone(),
            })),
            (Some(_), None) => Err(SandboxError::Unavailable(
                "this sandbox has an allow-list, and the backend no egress proxy".into(),
            )),
        }
    }

    /// The channel to the resident helper, started when none runs;
    /// `None` when execs run in containers of their own.
    pub(super) async fn resident(&self) -> Option<Arc<helper::Agent>> {
        let mut state = self.resident.lock().await;
        if let ResidentState::Ready(resident) = &*state {
            if !resident.agent.is_closed() {
                return Some(resident.agent.clone());
            }
            *state = ResidentState::Pending(0);
        }
        let ResidentState::Pending(failed) = *state else {
            return None;
        };
        let token = {
            let execs = lock(&self.execs);
            if execs.destroyed {
                return None;
            }
            self.tracker.token()
        };
        let started = match self.egress() {
            Ok(egress) => resident::start(self, egress, token).await,
            Err(e) => Err(e),
        };
        match started {
            Ok(resident) => {
                let agent = resident.agent.clone();
                *state = ResidentState::Ready(resident);
                Some(agent)
            }
            Err(e) if failed + 1 < RESIDENT_TRIES => {
                tracing::info!(sandbox = %self.id, error = %e,
                    "the resident exec helper did not start; this exec runs in a container of its own");
                *state = ResidentState::Pending(failed + 1);
                None
            }
            Err(e) => {
                tracing::warn!(sandbox = %self.id, error = %e,
                    "no resident exec helper: each exec runs in a container of its own");
                *state = ResidentState::Off;
                None
            }
        }
    }

    /// The resident helper and a listener in its network namespace for
    /// one bulk exec; `None` where there is no resident or its namespace
    /// cannot be entered (the server is not root).
    async fn bulk_channel(&self) -> Option<(Arc<helper::Agent>, Channel)> {
        self.resident().await?;
        // The channel and the pid of one and the same resident.
        let (agent, pid) = match &*self.resident.lock().await {
            ResidentState::Ready(resident) => (resident.agent.clone(), resident.pid()?),
            _ => return None,
        };
        match Channel::open(pid) {
            Ok(channel) => Some((agent, channel)),
            Err(e) => {
                tracing::debug!(sandbox = %self.id, error = %e,
                    "cannot enter the resident's network namespace: bulk output through a container of its own");
                None
            }
        }
    }

    /// Runs an exec through the resident helper.
    async fn exec_resident(
        &self,
        agent: Arc<helper::Agent>,
        request: ExecRequest,
        output: mpsc::Sender<ExecChunk>,
        cancel: CancellationToken,
    ) -> Result<ExecStatus> {
        if lock(&self.execs).destroyed {
            return Err(SandboxError::Gone(self.id.clone()));
        }
        let cgroup = self.cgroup.clone();
        // A run of a paused sandbox (its timeout passed meanwhile) acts on
        // the kill only once thawed; the sandbox runs on from then.
        let thaw = move || -> futures::future::BoxFuture<'static, ()> {
            if let Err(e) = cgroup.thaw() {
                tracing::warn!(error = %e, "cannot thaw a sandbox to kill a run");
            }
            Box::pin(async {})
        };
        let note = output.clone();
        let ran = helper::exec(&agent, request, output, &cancel, thaw).await?;
        let mut status = ran.status;
        if ran.closed {
            // The resident container ended under the run: removed (by this
            // process, or by another behind its back), or its init or the
            // helper killed, which in a sandbox is the OOM killer. Either way
            // the run's processes were killed, as an exec's own container's
            // were with it; the next exec starts a new resident.
            let destroyed = lock(&self.execs).destroyed;
            if !destroyed && !self.layout.meta().exists() {
                return Err(SandboxError::Gone(self.id.clone()));
            }
            if !status.timed_out && !status.cancelled {
                status.exit_code = Some(137);
            }
        }
        if ran.stuck {
            tracing::warn!(sandbox = %self.id, "a killed run did not end; ending the sandbox's resident container");
            let mut state = self.resident.lock().await;
            if let ResidentState::Ready(resident) = &*state {
                resident.kill();
                *state = ResidentState::Pending(0);
            }
        }
        if status.exit_code == Some(137) && !status.timed_out && !status.cancelled {
            self.explain_memory_kill(&note).await;
        }
        Ok(status)
    }

    /// Runs an exec in a container of its own, the whole tree of which
    /// ends with it.
    async fn exec_alone(
        &self,
        request: ExecRequest,
        output: mpsc::Sender<ExecChunk>,
        cancel: CancellationToken,
    ) -> Result<ExecStatus> {
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
        let egress = self.egress()?;
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

    /// Checks made before any exec.
    fn can_exec(&self, request: &ExecRequest) -> Result<()> {
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
                "sandbox {} is paused (idle); the session's next tool call through the server resumes it",
                self.id
            )));
        }
        Ok(())
    }

    /// After a command failed: when the workspace's upper layer is full,
    /// says so on its stderr (the command's own error is only "No space
    /// left on device").
    async fn explain_full_disk(&self, stderr: &mpsc::Sender<ExecChunk>) {
        let layout = self.layout.clone();
        let Ok(Ok(Some(limit))) = tokio::task::spawn_blocking(move || cow::full(&layout)).await
        else {
            return;
        };
        let note = crate::sandbox::layers::cow::full_note(limit);
        let _ = stderr
            .send(ExecChunk::Stderr(bytes::Bytes::from(note)))
            .await;
    }

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

    /// Through the resident helper when the request's stdin is bytes;
    /// otherwise (stdin from a file) in a container of its own.
    async fn exec(
        &self,
        request: ExecRequest,
        output: mpsc::Sender<ExecChunk>,
        cancel: CancellationToken,
    ) -> Result<ExecStatus> {
        self.can_exec(&request)?;
        let note = output.clone();
        let status = if helper::takes(&request)
            && let Some(agent) = self.resident().await
        {
            self.exec_resident(agent, request, output, cancel).await?
        } else {
            self.exec_alone(request, output, cancel).await?
        };
        if self.layered && status.exit_code.is_some_and(|code| code != 0) {
            self.explain_full_disk(&note).await;
        }
        Ok(status)
    }

    /// Through the resident helper with stdout on a socket of the
    /// server's in the resident's network namespace (`sandbox::bulk`),
    /// since the helper's channel carries output hex-encoded, twice the
    /// bytes; otherwise (stdin, no resident, no right to enter the
    /// namespace) in a container of its own, whose pipes the server reads
    /// at full speed.
    async fn exec_bulk(
        &self,
        request: ExecRequest,
        output: mpsc::Sender<ExecChunk>,
        cancel: CancellationToken,
    ) -> Result<ExecStatus> {
        self.can_exec(&request)?;
        if request.stdin.is_none()
            && let Some((agent, channel)) = self.bulk_channel().await
        {
            let exec = |wrapped, tx| self.exec_resident(agent, wrapped, tx, cancel.clone());
            match bulk::exec_over(channel, &request, &output, &self.id, exec).await {
                Over::Done(done) => return done,
                Over::Fallback { .. } => {}
            }
        }
        self.exec_alone(request, output, cancel).await
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
        // The resident container's own processes (the gate shell and the
        // helper, whatever threads it runs) are left out: the figure counts
        // what commands run.
        let resident = match &*self.resident.lock().await {
            ResidentState::Ready(_) => RESIDENT_PROCESSES,
            _ => 0,
        };
        Ok(SandboxStats {
            cpu_percent,
            memory_bytes: self.cgroup.memory_bytes(),
            pids: self.cgroup.processes().map(|n| n.saturating_sub(resident)),
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

    async fn freeze(&self, store: &Path) -> Result<Option<Vec<PathBuf>>> {
        if !self.layered {
            return Ok(None);
        }
        // The server walks and copies what the sandbox wrote: nothing of
        // the sandbox's may run meanwhile (a process left behind could
        // swap a file for a link between a look and a copy), so its
        // cgroup is frozen where the host has a freezer.
        let hold = self.cgroup.can_freeze() && !self.cgroup.frozen();
        if hold {
            self.cgroup
                .freeze()
                .await
                .map_err(self.failed("holding the sandbox for a freeze"))?;
        }
        let (layout, store) = (self.layout.clone(), store.to_owned());
        let frozen = blocking(move || cow::freeze(&layout, &store)).await;
        if hold && let Err(e) = self.cgroup.thaw() {
            tracing::warn!(sandbox = %self.id, error = %e, "a sandbox stays frozen after its workspace's freeze");
        }
        frozen
            .map(Some)
            .map_err(self.failed("freezing the workspace"))
    }

    async fn seed(&self, chain: &[PathBuf]) -> Result<bool> {
        if !self.layered {
            return Ok(false);
        }
        // The resident's container keeps the mount it started with: it
        // goes, and no other starts meanwhile.
        let mut state = self.resident.lock().await;
        stop_resident(&mut state);
        let (layout, chain) = (self.layout.clone(), chain.to_vec());
        blocking(move || cow::seed(&layout, &chain))
            .await
            .map_err(self.failed("seeding the workspace"))?;
        drop(state);
        // Warm again for the session's first call.
        self.resident().await;
        Ok(true)
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
        // Dropping it kills it.
        *self.resident.lock().await = ResidentState::Off;
        // A paused sandbox's processes act on the kill once thawed.
        if let Err(e) = self.cgroup.thaw() {
            tracing::warn!(sandbox = %self.id, error = %e, "cannot thaw a sandbox to destroy it");
        }
        self.tracker.close();
        self.tracker.wait().await;
        self.host.purge(&self.id).await
    }
}
