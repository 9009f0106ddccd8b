//! One exec: a thread of its own starts the container and waits for it,
//! while the calling task feeds stdin, streams stdout and stderr, and kills
//! the process tree on timeout or cancel.
//!
//! The process tree: hakoniwa forks a monitor process, which unshares the
//! namespaces, builds the mounts and forks the namespace's init; that init
//! drops to the sandbox's uid and becomes the gate shell, which runs the
//! command. Killing that init makes the kernel kill everything else in its
//! pid namespace, so it is the one handle needed on the whole tree; the
//! monitor then reports and exits.

use std::fs;
use std::io::{self, PipeReader, PipeWriter};
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;

use super::cgroup::SandboxCgroup;
use super::lock;
use super::net;
use super::sys::{self, PidFd};
use crate::sandbox::supervise::{KILL_GRACE, supervise};
use crate::sandbox::{ExecChunk, ExecStatus, SandboxError, Stdin};

/// hakoniwa's exit code when the container itself failed (not the command).
const CONTAINER_FAILED: i32 = 125;

/// Largest chunk read from a pipe at once.
const CHUNK_BYTES: usize = 64 * 1024;

/// Kills one exec's process tree, now or, when the tree does not exist
/// yet, as soon as it does.
#[derive(Debug, Default)]
pub(super) struct KillSwitch {
    state: Mutex<KillState>,
}

#[derive(Debug, Default)]
struct KillState {
    killed: bool,
    /// The pid namespace's init and its pid (in the server's namespace),
    /// once known.
    init: Option<(PidFd, u32)>,
}

impl KillSwitch {
    pub(super) fn kill(&self) {
        let mut state = lock(&self.state);
        state.killed = true;
        if let Some((init, _)) = &state.init {
            init.kill();
        }
    }

    fn arm(&self, init: PidFd, pid: u32) {
        let mut state = lock(&self.state);
        if state.killed {
            init.kill();
        }
        state.init = Some((init, pid));
    }

    /// The init's pid, once armed and unless killed.
    pub(super) fn pid(&self) -> Option<u32> {
        let state = lock(&self.state);
        state
            .init
            .as_ref()
            .filter(|_| !state.killed)
            .map(|(_, pid)| *pid)
    }
}

/// Everything the exec thread needs.
pub(super) struct Launch {
    pub(super) command: hakoniwa::Command,
    /// The exec's root directory, made before and removed after it.
    pub(super) root: PathBuf,
    pub(super) cgroup: Arc<SandboxCgroup>,
    /// Link the exec's network namespace to the host (`net`).
    pub(super) veth: bool,
    /// Bind the egress proxy's listener in the exec's network namespace.
    pub(super) egress: Option<Egress>,
    pub(super) switch: Arc<KillSwitch>,
    /// Held until the container has exited, so that destroying the sandbox
    /// can wait for all of its execs to be gone.
    pub(super) token: TaskTrackerToken,
}

/// What an exec of a sandbox with an allow-list reaches its proxy with.
pub(super) struct Egress {
    pub(super) proxy: Arc<crate::sandbox::proxy::EgressProxy>,
    pub(super) allow: crate::config::AllowList,
    /// The sandbox's id, under which its refusals are told.
    pub(super) key: String,
}

/// Where a started container's pipes come.
pub(super) type Started = oneshot::Receiver<Result<Pipes, SandboxError>>;
/// Where how it ended comes.
pub(super) type Finished = oneshot::Receiver<Result<hakoniwa::ExitStatus, SandboxError>>;

pub(super) struct Pipes {
    stdin: PipeWriter,
    stdout: PipeReader,
    stderr: PipeReader,
}

/// Runs `launch`, writing `stdin` to it and streaming its output to
/// `output`, until it exits or `deadline` or `cancel` kills it.
pub(super) async fn execute(
    launch: Launch,
    stdin: Option<Stdin>,
    output: mpsc::Sender<ExecChunk>,
    deadline: Instant,
    cancel: CancellationToken,
) -> Result<ExecStatus, SandboxError> {
    let started_at = Instant::now();
    let switch = launch.switch.clone();
    let cgroup = launch.cgroup.clone();
    let io_switch = launch.switch.clone();
    let (started_rx, finished_rx) = spawn(launch)?;

    let io = async {
        let (stdin_pipe, stdout, stderr) = started(started_rx).await?;
        tokio::join!(
            feed(stdin_pipe, stdin),
            pump(stdout, ExecChunk::Stdout, &output),
            pump(stderr, ExecChunk::Stderr, &output),
        );
        Ok(())
    };
    let run = async {
        let io = async {
            let done = io.await;
            if done.is_err() {
                // No pipes: the thread has killed the tree already or will
                // find it dead; make sure of it, and wait for it to be reaped.
                io_switch.kill();
            }
            done
        };
        let status = async { finished_rx.await.map_err(|_| thread_died()).and_then(|s| s) };
        tokio::join!(io, status)
    };
    let timeout = deadline.saturating_duration_since(Instant::now());
    let done = supervise(run, timeout, &cancel, KILL_GRACE, || {
        switch.kill();
        // A run of a paused sandbox (its timeout passed meanwhile) acts on
        // the kill only once thawed; the sandbox runs on from then.
        if let Err(e) = cgroup.thaw() {
            tracing::warn!(error = %e, "cannot thaw a sandbox to kill a run");
        }
        Box::pin(async {})
    })
    .await;
    let killed = done.killed();
    let duration = started_at.elapsed();
    let Some((io_result, status)) = done.ended else {
        return Err(SandboxError::Backend(
            "a killed exec did not end within its grace".into(),
        ));
    };
    io_result?;
    let status = status?;
    let exit_code = if killed {
        None
    } else {
        Some(exit_code(&status)?)
    };
    Ok(ExecStatus {
        exit_code,
        timed_out: done.timed_out,
        cancelled: done.cancelled,
        duration,
    })
}

/// The command's exit code; one killed by a signal reports 128 + the
/// signal, as a shell and Docker do (137 for the OOM killer's SIGKILL).
fn exit_code(status: &hakoniwa::ExitStatus) -> Result<i64, SandboxError> {
    match status.exit_code {
        Some(code) => Ok(code.into()),
        None if status.code == CONTAINER_FAILED => Err(SandboxError::Backend(format!(
            "the sandbox container failed: {}",
            status.reason
        ))),
        None => Ok(status.code.into()),
    }
}

/// Starts `launch` on a thread of its own; the first receiver gets its
/// pipes once it is confined, the second how it ended.
pub(super) fn spawn(launch: Launch) -> Result<(Started, Finished), SandboxError> {
    let (started_tx, started_rx) = oneshot::channel();
    let (finished_tx, finished_rx) = oneshot::channel();
    // A thread of its own rather than the blocking pool: hakoniwa's monitor
    // dies with the thread that forked it (PR_SET_PDEATHSIG), and pool
    // threads exit when idle.
    thread::Builder::new()
        .name("sandbox-exec".into())
        .spawn(move || run(launch, started_tx, finished_tx))
        .map_err(|e| SandboxError::Backend(format!("cannot start an exec thread: {e}")))?;
    Ok((started_rx, finished_rx))
}

/// The pipes of a container [`spawn`] started, once it is confined: its
/// stdin, stdout and stderr.
pub(super) async fn started(
    started: Started,
) -> Result<(pipe::Sender, pipe::Receiver, pipe::Receiver), SandboxError> {
    let pipes = started.await.map_err(|_| thread_died())??;
    async_pipes(pipes).map_err(|e| SandboxError::Backend(format!("exec pipes: {e}")))
}

fn thread_died() -> SandboxError {
    SandboxError::Backend("the exec thread ended without reporting".into())
}

fn async_pipes(pipes: Pipes) -> io::Result<(pipe::Sender, pipe::Receiver, pipe::Receiver)> {
    Ok((
        pipe::Sender::from_owned_fd(OwnedFd::from(pipes.stdin))?,
        pipe::Receiver::from_owned_fd(OwnedFd::from(pipes.stdout))?,
        pipe::Receiver::from_owned_fd(OwnedFd::from(pipes.stderr))?,
    ))
}

/// Opens the gate with its line, then writes the request's stdin; dropping
/// the pipe closes it, so the command sees the end of its input.
async fn feed(mut to: pipe::Sender, data: Option<Stdin>) {
    // Errors mean the command exited or closed its stdin without reading
    // it all, which is its business.
    if to.write_all(b"\n").await.is_ok()
        && let Some(data) = data
    {
        let _ = data.write_to(&mut to).await;
    }
}

async fn pump(
    mut from: pipe::Receiver,
    chunk: fn(Bytes) -> ExecChunk,
    to: &mpsc::Sender<ExecChunk>,
) {
    let mut buf = BytesMut::new();
    loop {
        buf.reserve(CHUNK_BYTES);
        match from.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                // A receiver that went away does not stop the command: its
                // output is still read, and dropped, so it never blocks on
                // a full pipe.
                let _ = to.send(chunk(buf.split().freeze())).await;
            }
        }
    }
}

/// The exec thread: starts the container, confines it, hands the pipes
/// over, and waits for it to exit.
fn run(
    launch: Launch,
    started: oneshot::Sender<Result<Pipes, SandboxError>>,
    finished: oneshot::Sender<Result<hakoniwa::ExitStatus, SandboxError>>,
) {
    let Launch {
        mut command,
        root,
        cgroup,
        veth,
        egress,
        switch,
        token: _token,
    } = launch;
    let made = fs::DirBuilder::new()
        .mode(0o755)
        .create(&root)
        .map_err(|e| format!("cannot make the exec's root directory: {e}"))
        .and_then(|()| {
            command
                .spawn()
                .map_err(|e| format!("cannot start the sandbox container: {e}"))
        });
    let mut child = match made {
        Ok(child) => child,
        Err(e) => {
            let _ = fs::remove_dir_all(&root);
            let _ = started.send(Err(SandboxError::Backend(e)));
            return;
        }
    };
    let pipes = match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
        (Some(stdin), Some(stdout), Some(stderr)) => Ok(Pipes {
            stdin,
            stdout,
            stderr,
        }),
        _ => Err(SandboxError::Backend("the container has no pipes".into())),
    }
    .and_then(|pipes| {
        confine(child.id(), &cgroup, veth, egress, &switch).map(|held| (pipes, held))
    });
    // The listener, held until the exec's processes are gone: its socket
    // would keep their namespace alive.
    let (pipes, _listening) = match pipes {
        Ok((pipes, held)) => (Ok(pipes), held),
        Err(e) => (Err(e), None),
    };
    if pipes.is_err() {
        // Dropping the pipes unblocks the gate with end of input, which
        // makes it exit; the kill makes sure.
        switch.kill();
    }
    let _ = started.send(pipes);
    let status = child
        .wait()
        .map_err(|e| SandboxError::Backend(format!("waiting for the sandbox container: {e}")));
    // Only empty mount points are left: the mounts died with the namespace.
    if let Err(e) = fs::remove_dir_all(&root) {
        tracing::warn!(dir = %root.display(), error = %e, "cannot remove an exec's root directory");
    }
    let _ = finished.send(status);
}

/// Arms the kill switch with the pid namespace's init, moves it into the
/// sandbox's cgroups and, with `veth`, links its network namespace to the
/// host, while it still waits at the gate.
fn confine(
    monitor: u32,
    cgroup: &SandboxCgroup,
    veth: bool,
    egress: Option<Egress>,
    switch: &KillSwitch,
) -> Result<Option<crate::sandbox::proxy::Listening>, SandboxError> {
    let failed = |e: io::Error| SandboxError::Backend(format!("cannot confine an exec: {e}"));
    // hakoniwa reports the container started only after forking the init,
    // so a monitor without a child is one whose init has already exited
    // (a failed setup): nothing of the command ever ran.
    let Some(&pid) = sys::children(monitor).map_err(failed)?.first() else {
        return Ok(None);
    };
    let Some(init) = PidFd::open(pid).map_err(failed)? else {
        return Ok(None);
    };
    // The pid might have been reaped and reused between listing and
    // opening it; the monitor forks only once, so a pid still listed as
    // its child is the init the descriptor was opened on.
    if !sys::children(monitor).map_err(failed)?.contains(&pid) {
        return Ok(None);
    }
    switch.arm(init, pid);
    cgroup.add(pid).map_err(failed)?;
    if veth {
        net::attach(pid)
            .map_err(|e| SandboxError::Backend(format!("cannot give an exec its network: {e}")))?;
    }
    egress
        .map(|egress| egress.proxy.listen(pid, egress.allow, egress.key))
        .transpose()
        .map_err(|e| {
            SandboxError::Backend(format!(
                "cannot start the egress proxy in an exec's network namespace: {e}"
            ))
        })
}
