//! [`DockerSandbox`]: one container, its execs through the resident helper
//! (or `docker exec` where the image cannot boot it), stats and removal.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use async_trait::async_trait;
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::ContainerStatsResponse;
use bollard::query_parameters::{RenameContainerOptions, RestartContainerOptions, StatsOptions};

use futures::StreamExt;
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::agent::{Boot, connect};
use super::egress::Egress;
use super::layered::Layered;
use super::{
    SESSION_PREFIX, backend_error, is_not_found, is_paused, remove_container, remove_workspace,
};
use crate::sandbox::bulk::{self, Channel, Over};
use crate::sandbox::helper::{self, Agent};
use crate::sandbox::supervise::{KILL_GRACE, supervise};
use bollard::errors::Error as DockerError;

use crate::sandbox::{
    EXEC_MARKER, ExecChunk, ExecRequest, ExecStatus, Result, Sandbox, SandboxError, SandboxStats,
    kill_by_marker,
};

pub(super) struct DockerSandbox {
    docker: Docker,
    id: String,
    /// The previous CPU sample (container total, system total), so
    /// `stats` reports use since the last call rather than since start.
    last_cpu: Mutex<Option<(u64, u64)>>,
    agent: Mutex<AgentState>,
    /// Paused by [`Sandbox::pause`] here: a run killed meanwhile (its
    /// timeout passed) unpauses it first, since frozen processes cannot
    /// act on the kill.
    paused: AtomicBool,
    /// The egress proxy's listener, for a sandbox with an allow-list.
    egress: Option<Egress>,
    /// The container's main process, whose network namespace the bulk
    /// path's listener is bound in (read once; forgotten at a restart).
    pid: std::sync::Mutex<Option<u32>>,
    /// Set once the bulk path's socket could not be used here (no right
    /// to enter the namespace, no bash in the image): the attach stream
    /// carries bulk output from then on.
    no_bulk_socket: AtomicBool,
    /// Its layered workspace; `None`: a tmpfs.
    workspace: Option<Arc<Layered>>,
}

/// Where a sandbox's exec helper stands.
enum AgentState {
    /// Not connected yet: connect on the next exec.
    Pending(Boot),
    Ready(Arc<Agent>),
    /// It could not be started in this container: use `docker exec`.
    Unusable,
}

impl DockerSandbox {
    pub(super) fn new(
        docker: Docker,
        id: String,
        boot: Boot,
        egress: Option<Egress>,
        workspace: Option<Arc<Layered>>,
    ) -> DockerSandbox {
        DockerSandbox {
            docker,
            id,
            last_cpu: Mutex::new(None),
            agent: Mutex::new(AgentState::Pending(boot)),
            paused: AtomicBool::new(false),
            egress,
            pid: std::sync::Mutex::new(None),
            no_bulk_socket: AtomicBool::new(false),
            workspace,
        }
    }

    /// Binds the egress proxy's listener in the container's namespace, for
    /// a sandbox with an allow-list (again after a restart).
    pub(super) async fn listen(&self) -> Result<()> {
        match &self.egress {
            Some(egress) => egress.ensure(&self.docker, &self.id).await,
            None => Ok(()),
        }
    }

    /// Unpauses the container before a kill: the helper and the run's
    /// processes are frozen while it is paused, and a kill that cannot end
    /// the run would restart the container, losing its workspace (a tmpfs
    /// one).
    async fn thaw_for_kill(&self) {
        if self.paused.load(Ordering::Acquire)
            && let Err(e) = self.resume().await
        {
            tracing::warn!(sandbox = %self.id, error = %e, "cannot unpause a sandbox to kill a run");
        }
    }

    /// The connection to the exec helper, made on first use; `None` when the
    /// helper cannot run here.
    pub(super) async fn agent(&self) -> Option<Arc<Agent>> {
        let mut state = self.agent.lock().await;
        if let AgentState::Ready(agent) = &*state {
            if !agent.is_closed() {
                return Some(agent.clone());
            }
            *state = AgentState::Pending(Boot::Unknown);
        }
        let AgentState::Pending(boot) = *state else {
            return None;
        };
        match connect(&self.docker, &self.id, boot).await {
            Ok(agent) => {
                let agent = Arc::new(agent);
                *state = AgentState::Ready(agent.clone());
                Some(agent)
            }
            Err(message) => {
                tracing::warn!(sandbox = %self.id, error = %message, "no exec helper; using docker exec");
                *state = AgentState::Unusable;
                None
            }
        }
    }

    /// Restarts the container, which kills every process in it; its boot
    /// script then waits for a new helper.
    async fn restart(&self) {
        let options = RestartContainerOptions {
            t: Some(0),
            ..Default::default()
        };
        // The restarted container binds what is on top of the workspace
        // then: the shared mount, on which the overlay goes back.
        if let Some(workspace) = &self.workspace {
            let workspace = workspace.clone();
            if let Err(e) = blocking(move || workspace.detach_overlay()).await {
                tracing::error!(sandbox = %self.id, error = %e, "cannot take the workspace off for a restart");
            }
        }
        if let Err(e) = self.docker.restart_container(&self.id, Some(options)).await {
            tracing::error!(sandbox = %self.id, error = %e, "restart failed");
        }
        if let Some(workspace) = &self.workspace {
            let workspace = workspace.clone();
            if let Err(e) = blocking(move || workspace.mount()).await {
                tracing::error!(sandbox = %self.id, error = %e, "cannot mount the workspace after a restart");
            }
        }
        let mut state = self.agent.lock().await;
        if !matches!(*state, AgentState::Unusable) {
            *state = AgentState::Pending(Boot::Fresh);
        }
        drop(state);
        *lock(&self.pid) = None;
        if let Err(e) = self.listen().await {
            tracing::error!(sandbox = %self.id, error = %e, "no egress proxy after the restart");
        }
    }

    /// A listener for one bulk exec in the container's network namespace;
    /// `None` where this sandbox cannot have one.
    async fn bulk_channel(&self) -> Option<Channel> {
        if self.no_bulk_socket.load(Ordering::Relaxed) {
            return None;
        }
        let known = *lock(&self.pid);
        let pid = match known {
            Some(pid) => pid,
            None => {
                let info = self.docker.inspect_container(&self.id, None).await.ok()?;
                let pid = info.state.and_then(|s| s.pid).filter(|pid| *pid > 0)? as u32;
                *lock(&self.pid) = Some(pid);
                pid
            }
        };
        match Channel::open(pid) {
            Ok(channel) => Some(channel),
            Err(e) => {
                // No right to enter it (not root), or the pid is not this
                // server's to see (a server in a container of its own):
                // neither changes while this sandbox lives.
                *lock(&self.pid) = None;
                tracing::info!(sandbox = %self.id, error = %e,
                    "cannot enter the sandbox's network namespace: bulk output goes through docker exec");
                self.no_bulk_socket.store(true, Ordering::Relaxed);
                None
            }
        }
    }

    /// Runs an exec with `docker exec`.
    async fn exec_direct(
        &self,
        request: ExecRequest,
        output: mpsc::Sender<ExecChunk>,
        cancel: CancellationToken,
    ) -> Result<ExecStatus> {
        let started = Instant::now();
        let marker = Uuid::new_v4().simple().to_string();
        let mut env: Vec<String> = request
            .env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        env.push(format!("{EXEC_MARKER}={marker}"));
        let exec = self
            .docker
            .create_exec(
                &self.id,
                CreateExecOptions {
                    cmd: Some(request.command.clone()),
                    env: Some(env),
                    working_dir: Some(request.workdir.clone()),
                    attach_stdin: Some(request.stdin.is_some()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| {
                if is_not_found(&e) {
                    SandboxError::Gone(self.id.clone())
                } else if is_paused(&e) {
                    // Paused by the server that owns it (`conclave mcp`
                    // sharing the session's sandbox, which attached to it
                    // before): an exec would wait for as long as it stays so.
                    SandboxError::Backend(format!(
                        "sandbox {} is paused (idle); the session's next tool call \
                         through the server resumes it",
                        self.id
                    ))
                } else {
                    backend_error(e)
                }
            })?;
        let options = StartExecOptions {
            output_capacity: Some(64 * 1024),
            ..Default::default()
        };
        let StartExecResults::Attached {
            output: mut stream,
            mut input,
        } = self
            .docker
            .start_exec(&exec.id, Some(options))
            .await
            .map_err(backend_error)?
        else {
            return Err(SandboxError::Backend("exec started detached".into()));
        };
        if let Some(stdin) = &request.stdin {
            // A command that exits without reading its input is not an error.
            let _ = stdin.write_to(&mut input).await;
        }
        drop(input);

        let pump = async {
            while let Some(chunk) = stream.next().await {
                match chunk {
                    Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
                        let _ = output.send(ExecChunk::Stdout(message)).await;
                    }
                    Ok(LogOutput::StdErr { message }) => {
                        let _ = output.send(ExecChunk::Stderr(message)).await;
                    }
                    Ok(LogOutput::StdIn { .. }) => {}
                    Err(e) => return Err(backend_error(e)),
                }
            }
            Ok(())
        };
        let done = supervise(pump, request.timeout, &cancel, KILL_GRACE, || {
            Box::pin(self.kill_exec(&marker))
        })
        .await;
        let killed = done.killed();
        match done.ended {
            Some(pumped) => pumped?,
            None => {
                tracing::warn!(sandbox = %self.id, "a killed exec did not end; restarting the container");
                self.restart().await;
            }
        }
        let exit_code = match self.docker.inspect_exec(&exec.id).await {
            Ok(inspect) if !killed => inspect.exit_code,
            _ => None,
        };
        Ok(ExecStatus {
            exit_code,
            timed_out: done.timed_out,
            cancelled: done.cancelled,
            duration: started.elapsed(),
        })
    }

    /// Runs an exec through the helper.
    async fn exec_with_agent(
        &self,
        agent: Arc<Agent>,
        request: ExecRequest,
        output: mpsc::Sender<ExecChunk>,
        cancel: CancellationToken,
    ) -> Result<ExecStatus> {
        let thaw = || -> futures::future::BoxFuture<'_, ()> { Box::pin(self.thaw_for_kill()) };
        let ran = helper::exec(&agent, request, output, &cancel, thaw).await?;
        if ran.closed {
            return Err(SandboxError::Gone(self.id.clone()));
        }
        if ran.stuck {
            tracing::warn!(sandbox = %self.id, "a killed run did not end; restarting the container");
            self.restart().await;
        }
        Ok(ran.status)
    }

    /// Kills every process of the exec marked `marker`, restarting the
    /// container if the kill itself cannot run.
    async fn kill_exec(&self, marker: &str) {
        self.thaw_for_kill().await;
        let killed = tokio::time::timeout(KILL_GRACE, async {
            let exec = self
                .docker
                .create_exec(
                    &self.id,
                    CreateExecOptions {
                        cmd: Some(kill_by_marker(marker)),
                        attach_stdout: Some(true),
                        attach_stderr: Some(true),
                        ..Default::default()
                    },
                )
                .await?;
            if let StartExecResults::Attached { mut output, .. } =
                self.docker.start_exec(&exec.id, None).await?
            {
                while output.next().await.is_some() {}
            }
            let inspect = self.docker.inspect_exec(&exec.id).await?;
            Ok::<_, DockerError>(inspect.exit_code == Some(0))
        })
        .await;
        if !matches!(killed, Ok(Ok(true))) {
            tracing::warn!(sandbox = %self.id, "kill exec failed; restarting the container");
            self.restart().await;
        }
    }
}

#[async_trait]
impl Sandbox for DockerSandbox {
    fn id(&self) -> &str {
        &self.id
    }

    async fn assign(&self, session_id: &str) -> Result<()> {
        let options = RenameContainerOptions {
            name: format!("{SESSION_PREFIX}{session_id}"),
        };
        self.docker
            .rename_container(&self.id, options)
            .await
            .map_err(backend_error)
    }

    async fn exec(
        &self,
        request: ExecRequest,
        output: mpsc::Sender<ExecChunk>,
        cancel: CancellationToken,
    ) -> Result<ExecStatus> {
        let note = self.workspace.as_ref().map(|_| output.clone());
        let status = if helper::takes(&request)
            && let Some(agent) = self.agent().await
        {
            self.exec_with_agent(agent, request, output, cancel).await?
        } else {
            self.exec_direct(request, output, cancel).await?
        };
        if let (Some(workspace), Some(note)) = (&self.workspace, note)
            && status.exit_code.is_some_and(|code| code != 0)
        {
            explain_full_disk(workspace.clone(), &note).await;
        }
        Ok(status)
    }

    /// Through `docker exec` rather than the helper, whose channel carries
    /// output as hex lines read at a paced rate (a few MB/s): fine for a
    /// command's output, far too slow for the tar of a workspace.
    ///
    /// A command without stdin (the tar of a workspace, a file read out)
    /// writes its stdout to a socket of the server's in the container's
    /// network namespace instead ([`bulk`]), where that can be done.
    async fn exec_bulk(
        &self,
        request: ExecRequest,
        output: mpsc::Sender<ExecChunk>,
        cancel: CancellationToken,
    ) -> Result<ExecStatus> {
        if request.stdin.is_none()
            && let Some(channel) = self.bulk_channel().await
        {
            let exec = |wrapped, tx| self.exec(wrapped, tx, cancel.clone());
            match bulk::exec_over(channel, &request, &output, &self.id, exec).await {
                Over::Done(done) => return done,
                Over::Fallback { no_bash } => {
                    if no_bash {
                        tracing::info!(sandbox = %self.id,
                            "no bash in the sandbox's image: bulk output goes through docker exec");
                        self.no_bulk_socket.store(true, Ordering::Relaxed);
                    }
                    *lock(&self.pid) = None;
                }
            }
        }
        self.exec_direct(request, output, cancel).await
    }

    /// The container's cgroup CPU usage as the daemon reports it.
    async fn cpu_seconds(&self) -> Option<f64> {
        let options = StatsOptions {
            stream: false,
            one_shot: true,
        };
        let sample = self
            .docker
            .stats(&self.id, Some(options))
            .next()
            .await?
            .ok()?;
        let used = sample.cpu_stats?.cpu_usage?.total_usage?;
        Some(used as f64 / 1e9)
    }

    async fn stats(&self) -> Result<SandboxStats> {
        let options = StatsOptions {
            stream: false,
            one_shot: true,
        };
        let mut stream = self.docker.stats(&self.id, Some(options));
        let sample: ContainerStatsResponse = match stream.next().await {
            Some(Ok(sample)) => sample,
            Some(Err(e)) if is_not_found(&e) => return Err(SandboxError::Gone(self.id.clone())),
            Some(Err(e)) => return Err(backend_error(e)),
            None => return Ok(SandboxStats::default()),
        };
        let cpu = sample.cpu_stats.as_ref();
        let container = cpu
            .and_then(|c| c.cpu_usage.as_ref())
            .and_then(|u| u.total_usage);
        let system = cpu.and_then(|c| c.system_cpu_usage);
        let online = cpu.and_then(|c| c.online_cpus).unwrap_or(1).max(1);
        let cpu_percent = match (container, system) {
            (Some(container), Some(system)) => {
                let mut last = self.last_cpu.lock().await;
                let previous = last.replace((container, system));
                previous.and_then(|(pc, ps)| {
                    let dc = container.checked_sub(pc)? as f64;
                    let ds = system.checked_sub(ps)? as f64;
                    (ds > 0.0).then(|| dc / ds * f64::from(online) * 100.0)
                })
            }
            _ => None,
        };
        Ok(SandboxStats {
            cpu_percent,
            memory_bytes: sample.memory_stats.and_then(|m| m.usage),
            pids: sample.pids_stats.and_then(|p| p.current),
        })
    }

    async fn pause(&self) -> Result<bool> {
        match self.docker.pause_container(&self.id).await {
            Ok(()) => {}
            // By another process on this data directory.
            Err(DockerError::DockerResponseServerError { message, .. })
                if message.contains("already paused") => {}
            Err(e) if is_not_found(&e) => return Err(SandboxError::Gone(self.id.clone())),
            Err(e) => return Err(backend_error(e)),
        }
        self.paused.store(true, Ordering::Release);
        Ok(true)
    }

    async fn resume(&self) -> Result<()> {
        match self.docker.unpause_container(&self.id).await {
            Ok(()) => {}
            // Unpaused meanwhile: by another process attaching it, or by a
            // kill (`thaw_for_kill`).
            Err(DockerError::DockerResponseServerError { message, .. })
                if message.contains("not paused") => {}
            Err(e) if is_not_found(&e) => return Err(SandboxError::Gone(self.id.clone())),
            Err(e) => return Err(backend_error(e)),
        }
        self.paused.store(false, Ordering::Release);
        Ok(())
    }

    async fn destroy(&self) -> Result<()> {
        // Force removal kills a paused container too, but the attach stream
        // of its helper is then left open, and a run waiting on it with it.
        self.thaw_for_kill().await;
        remove_container(&self.docker, &self.id).await?;
        match &self.workspace {
            Some(workspace) => remove_workspace(workspace.clone()).await,
            None => Ok(()),
        }
    }

    async fn freeze(&self, store: &Path) -> Result<Option<Vec<PathBuf>>> {
        let Some(workspace) = self.workspace.clone() else {
            return Ok(None);
        };
        // The server walks and copies what the sandbox wrote: nothing of
        // the sandbox's may run meanwhile (a process left behind could
        // swap a file for a link between a look and a copy).
        let hold = !self.paused.load(Ordering::Acquire);
        if hold {
            self.docker
                .pause_container(&self.id)
                .await
                .map_err(backend_error)?;
        }
        let store = store.to_owned();
        let frozen = blocking(move || workspace.freeze(&store)).await;
        if hold && let Err(e) = self.docker.unpause_container(&self.id).await {
            tracing::warn!(sandbox = %self.id, error = %e, "a sandbox stays paused after its workspace's freeze");
        }
        frozen.map(Some).map_err(|e| {
            SandboxError::Backend(format!("freezing the workspace of {}: {e}", self.id))
        })
    }

    async fn seed(&self, chain: &[PathBuf]) -> Result<bool> {
        let Some(workspace) = self.workspace.clone() else {
            return Ok(false);
        };
        // The new overlay reaches the running container (`layered`).
        let chain = chain.to_vec();
        blocking(move || workspace.seed(&chain))
            .await
            .map_err(|e| {
                SandboxError::Backend(format!("seeding the workspace of {}: {e}", self.id))
            })?;
        Ok(true)
    }
}

/// After a command failed: when the workspace's upper layer is full, says
/// so on its stderr.
async fn explain_full_disk(workspace: Arc<Layered>, stderr: &mpsc::Sender<ExecChunk>) {
    let Ok(Some(limit)) = blocking(move || workspace.full()).await else {
        return;
    };
    let note = crate::sandbox::layers::cow::full_note(limit);
    let _ = stderr
        .send(ExecChunk::Stderr(bytes::Bytes::from(note)))
        .await;
}

/// Runs file system work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
