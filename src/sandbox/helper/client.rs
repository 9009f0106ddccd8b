//! [`Agent`]: an open channel to one sandbox's `conclave-exec`, and
//! [`exec`], one run through it from request to status.

use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::Stream;
use futures::future::BoxFuture;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::replies::{HelperReply, Output, Pacing, Routes, read_replies};
use crate::sandbox::supervise::{KILL_GRACE, supervise};
use crate::sandbox::{ExecChunk, ExecRequest, ExecStatus, SandboxError};
use crate::sync::lock;

/// Replies queued per run before the channel waits for its reader.
const RUN_QUEUE: usize = 256;

/// An open channel to one sandbox's helper.
pub struct Agent {
    input: tokio::sync::Mutex<Pin<Box<dyn AsyncWrite + Send>>>,
    routes: Routes,
    next_id: AtomicU64,
    /// Cancelled when the channel ends (the sandbox stopped).
    closed: CancellationToken,
    _reader: AbortOnDropHandle<()>,
}

/// A run in flight: its replies, and its route removed when dropped.
pub struct RunHandle {
    pub id: u64,
    replies: mpsc::Receiver<HelperReply>,
    routes: Routes,
}

impl Drop for RunHandle {
    fn drop(&mut self) {
        lock(&self.routes).remove(&self.id);
    }
}

impl Agent {
    /// Talks to a helper through `input` (its stdin) and `output` (what
    /// its stdout and stderr carry), read with `pacing`; `sandbox` names it
    /// in the log. Nothing is sent yet: [`Agent::hello`] checks it is up.
    pub fn new(
        input: Pin<Box<dyn AsyncWrite + Send>>,
        output: impl Stream<Item = Output> + Send + Unpin + 'static,
        sandbox: String,
        pacing: Pacing,
    ) -> Agent {
        let routes = Routes::default();
        let closed = CancellationToken::new();
        let reader = tokio::spawn(read_replies(
            output,
            routes.clone(),
            closed.clone(),
            sandbox,
            pacing,
        ));
        Agent {
            input: tokio::sync::Mutex::new(input),
            routes,
            // Ids never repeat within one helper's life, across servers too.
            next_id: AtomicU64::new(u64::from(rand_u32()) << 32),
            closed,
            _reader: AbortOnDropHandle::new(reader),
        }
    }

    /// Writes `before`, then a hello, and waits for its answer: the
    /// Landlock ABI version the helper seals runs with, 0 for none.
    pub async fn hello(&self, before: &[u8], timeout: Duration) -> Result<u32, String> {
        let mut run = self.route();
        let mut message = before.to_vec();
        message.extend_from_slice(format!("\nh {}\n", run.id).as_bytes());
        // The write is timed too: a sandbox that stopped reading its stdin
        // (a boot script that gave up) never takes all of a helper.
        let answered = tokio::time::timeout(timeout, async {
            self.write(&message).await?;
            Ok::<_, String>(run.replies.recv().await)
        });
        match answered.await {
            Ok(Ok(Some(HelperReply::Hello { landlock }))) => Ok(landlock),
            Ok(Ok(_)) => Err("the channel closed before the helper answered".into()),
            Ok(Err(message)) => Err(message),
            Err(_) => Err(format!(
                "the helper did not answer within {} ms",
                timeout.as_millis()
            )),
        }
    }

    fn route(&self) -> RunHandle {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, replies) = mpsc::channel(RUN_QUEUE);
        lock(&self.routes).insert(id, tx);
        RunHandle {
            id,
            replies,
            routes: self.routes.clone(),
        }
    }

    async fn write(&self, data: &[u8]) -> Result<(), String> {
        let mut input = self.input.lock().await;
        input
            .write_all(data)
            .await
            .and(input.flush().await)
            .map_err(|e| format!("writing to the helper: {e}"))
    }

    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Starts a run; its output, exit or failure come on the handle.
    async fn start(&self, request: &ExecRequest) -> Result<RunHandle, String> {
        let run = self.route();
        let mut line = format!("r {} {} ", run.id, hex::encode(&request.workdir));
        match &request.stdin {
            Some(stdin) => match stdin.bytes() {
                Some(data) => line.push_str(&hex::encode(data)),
                None => return Err("the helper takes stdin as bytes, not a file".into()),
            },
            None => line.push('-'),
        }
        let _ = write!(line, " {}", request.command.len());
        for arg in &request.command {
            let _ = write!(line, " {}", hex::encode(arg));
        }
        let _ = write!(line, " {}", request.env.len());
        for (key, value) in &request.env {
            let _ = write!(line, " {}", hex::encode(format!("{key}={value}")));
        }
        line.push('\n');
        self.write(line.as_bytes()).await?;
        Ok(run)
    }

    /// Asks the helper to kill a run's processes; its exit follows.
    async fn kill(&self, id: u64) -> Result<(), String> {
        self.write(format!("k {id}\n").as_bytes()).await
    }
}

/// Whether [`exec`] can take a request: the channel carries stdin as
/// bytes in the request line, never a file.
pub fn takes(request: &ExecRequest) -> bool {
    request.stdin.as_ref().is_none_or(|s| s.bytes().is_some())
}

/// How a run through the helper went.
pub struct Ran {
    pub status: ExecStatus,
    /// The run was killed and did not end within the grace: the helper
    /// does not answer, and the caller starts the sandbox's helper anew.
    pub stuck: bool,
    /// The channel closed before the run ended (the helper was killed,
    /// or the sandbox ended): `status` has no exit code.
    pub closed: bool,
}

/// Kills the run when the exec's future is dropped before it ended.
struct KillOnDrop {
    agent: Arc<Agent>,
    id: u64,
    ended: bool,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let (agent, id) = (self.agent.clone(), self.id);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = agent.kill(id).await;
            });
        }
    }
}

/// Runs `request` through `agent` (see [`takes`]), streaming its output to
/// `output` until it exits, or `request.timeout` or `cancel` kill it;
/// `thaw` runs before the kill (a paused sandbox acts on it only once
/// thawed). A run whose future is dropped is killed too.
pub async fn exec<'k>(
    agent: &Arc<Agent>,
    request: ExecRequest,
    output: mpsc::Sender<ExecChunk>,
    cancel: &CancellationToken,
    thaw: impl Fn() -> BoxFuture<'k, ()>,
) -> Result<Ran, SandboxError> {
    let started = Instant::now();
    let mut run = agent.start(&request).await.map_err(SandboxError::Backend)?;
    let mut guard = KillOnDrop {
        agent: agent.clone(),
        id: run.id,
        ended: false,
    };
    let replies = async {
        loop {
            match run.replies.recv().await {
                Some(HelperReply::Stdout(data)) => {
                    let _ = output.send(ExecChunk::Stdout(data)).await;
                }
                Some(HelperReply::Stderr(data)) => {
                    let _ = output.send(ExecChunk::Stderr(data)).await;
                }
                Some(HelperReply::Exit(code)) => return Some(code),
                // Like a shell that cannot find the command.
                Some(HelperReply::Failed(message)) => {
                    let line = Bytes::from(format!("{message}\n"));
                    let _ = output.send(ExecChunk::Stderr(line)).await;
                    return Some(127);
                }
                Some(HelperReply::Hello { .. }) => {}
                None => return None,
            }
        }
    };
    let id = guard.id;
    let done = supervise(replies, request.timeout, cancel, KILL_GRACE, || {
        let (agent, thawed) = (agent.clone(), thaw());
        Box::pin(async move {
            thawed.await;
            let _ = agent.kill(id).await;
        })
    })
    .await;
    let killed = done.killed();
    let (exit_code, stuck, closed) = match done.ended {
        Some(code) => {
            guard.ended = true;
            (
                code.filter(|_| !killed).map(i64::from),
                false,
                code.is_none(),
            )
        }
        None => (None, true, false),
    };
    Ok(Ran {
        status: ExecStatus {
            exit_code,
            timed_out: done.timed_out,
            cancelled: done.cancelled,
            duration: started.elapsed(),
        },
        stuck,
        closed,
    })
}

/// A random number without a dependency: the low bits of a v4 uuid.
fn rand_u32() -> u32 {
    uuid::Uuid::new_v4().as_u128() as u32
}
