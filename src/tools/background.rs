//! Background runs: `execute_shell {background: true}` starts a command that
//! may outlive the call (a dev server, a watcher), where every other call's
//! processes die with it. `list_background` shows a sandbox's runs and the
//! tail of their output; `kill_background` stops one, its whole process
//! tree with it.
//!
//! A run is an ordinary exec of the sandbox with the longest timeout
//! allowed (`sandbox.max_exec_timeout_s`), holding a lease on the sandbox
//! so the idle reaper leaves it alone while it runs (though an idle sandbox
//! is still paused, `sandbox.pause_after_s`, and the run with it). Runs belong to the
//! sandbox they run in (a session's, or an MCP connection's scratch one):
//! a caller sees and kills only runs of a sandbox it may use, and they end
//! when that sandbox goes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use schemars::transform::RestrictFormats;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::sandbox::{ExecChunk, ExecRequest, Lease, exec_collect};
use crate::sync::lock;

/// Output kept per stream of a run: its last bytes.
const KEEP_BYTES: usize = 16 * 1024;
/// Runs going at once in one sandbox.
const MAX_RUNNING: usize = 8;
/// Ended runs remembered per sandbox, the oldest forgotten first.
const MAX_ENDED: usize = 16;
/// How long `kill` waits for a run to be gone.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// A run as the tools show it.
#[derive(Debug, Clone, Serialize, JsonSchema, PartialEq)]
#[schemars(transform = RestrictFormats::default())]
pub struct RunView {
    pub id: String,
    pub command: String,
    /// `running`, `exited`, `killed`, `timeout` or `failed` (it could not
    /// start, or its sandbox went).
    pub status: String,
    pub exit_code: Option<i64>,
    pub started_at: DateTime<Utc>,
    /// The last 16 KiB of each stream.
    pub stdout_tail: String,
    pub stderr_tail: String,
}

#[derive(Debug, Clone, Serialize, JsonSchema, PartialEq)]
#[schemars(transform = RestrictFormats::default())]
pub struct RunList {
    pub runs: Vec<RunView>,
}

struct Run {
    id: String,
    /// The sandbox it runs in: a session id, or a scratch sandbox's.
    sandbox: String,
    command: String,
    started_at: DateTime<Utc>,
    cancel: CancellationToken,
    state: Mutex<State>,
    ended: tokio::sync::watch::Sender<bool>,
}

#[derive(Default)]
struct State {
    stdout: VecDeque<u8>,
    stderr: VecDeque<u8>,
    status: Option<&'static str>,
    exit_code: Option<i64>,
}

fn keep_tail(buffer: &mut VecDeque<u8>, data: &[u8]) {
    buffer.extend(data);
    let excess = buffer.len().saturating_sub(KEEP_BYTES);
    buffer.drain(..excess);
}

impl Run {
    fn view(&self) -> RunView {
        let state = lock(&self.state);
        let text = |b: &VecDeque<u8>| {
            String::from_utf8_lossy(&b.iter().copied().collect::<Vec<_>>()).into_owned()
        };
        RunView {
            id: self.id.clone(),
            command: self.command.clone(),
            status: state.status.unwrap_or("running").to_string(),
            exit_code: state.exit_code,
            started_at: self.started_at,
            stdout_tail: text(&state.stdout),
            stderr_tail: text(&state.stderr),
        }
    }

    fn running(&self) -> bool {
        lock(&self.state).status.is_none()
    }
}

/// Every sandbox's background runs.
#[derive(Default)]
pub struct BackgroundRuns {
    runs: Mutex<Vec<Arc<Run>>>,
}

impl BackgroundRuns {
    /// Starts `request` in the leased sandbox and returns at once.
    pub fn start(
        &self,
        sandbox: String,
        command: String,
        lease: Lease,
        request: ExecRequest,
    ) -> Result<RunView, String> {
        let run = {
            let mut runs = lock(&self.runs);
            let running = runs
                .iter()
                .filter(|r| r.sandbox == sandbox && r.running())
                .count();
            if running >= MAX_RUNNING {
                return Err(format!(
                    "{MAX_RUNNING} background runs are going in this sandbox already; kill one first"
                ));
            }
            // Forget the oldest ended runs of this sandbox past the limit.
            let ended: Vec<String> = runs
                .iter()
                .filter(|r| r.sandbox == sandbox && !r.running())
                .map(|r| r.id.clone())
                .collect();
            let forget = ended.len().saturating_sub(MAX_ENDED - 1);
            runs.retain(|r| !ended[..forget].contains(&r.id));
            let run = Arc::new(Run {
                id: format!("bg-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
                sandbox,
                command,
                started_at: Utc::now(),
                cancel: CancellationToken::new(),
                state: Mutex::new(State::default()),
                ended: tokio::sync::watch::channel(false).0,
            });
            runs.push(run.clone());
            run
        };
        let view = run.view();
        // Its lease keeps the sandbox from the idle reaper, not from being
        // paused: the run is frozen with it and goes on when it resumes.
        let lease = lease.into_background();
        tokio::spawn(async move {
            let result = exec_collect(
                lease.sandbox.as_ref(),
                request,
                1,
                run.cancel.clone(),
                |chunk| {
                    let mut state = lock(&run.state);
                    match chunk {
                        ExecChunk::Stdout(data) => keep_tail(&mut state.stdout, data),
                        ExecChunk::Stderr(data) => keep_tail(&mut state.stderr, data),
                    }
                },
            )
            .await;
            drop(lease);
            {
                let mut state = lock(&run.state);
                match result {
                    Ok((status, _)) => {
                        state.exit_code = status.exit_code;
                        state.status = Some(if run.cancel.is_cancelled() {
                            "killed"
                        } else if status.timed_out {
                            "timeout"
                        } else {
                            "exited"
                        });
                    }
                    Err(e) => {
                        keep_tail(&mut state.stderr, e.to_string().as_bytes());
                        state.status = Some(if run.cancel.is_cancelled() {
                            "killed"
                        } else {
                            "failed"
                        });
                    }
                }
            }
            run.ended.send_replace(true);
        });
        Ok(view)
    }

    /// The runs of one sandbox, oldest first.
    pub fn list(&self, sandbox: &str) -> RunList {
        RunList {
            runs: lock(&self.runs)
                .iter()
                .filter(|r| r.sandbox == sandbox)
                .map(|r| r.view())
                .collect(),
        }
    }

    /// Kills run `id` of the sandbox and waits until it has ended.
    pub async fn kill(&self, sandbox: &str, id: &str) -> Option<RunView> {
        let run = lock(&self.runs)
            .iter()
            .find(|r| r.sandbox == sandbox && r.id == id)
            .cloned()?;
        run.cancel.cancel();
        let mut ended = run.ended.subscribe();
        let _ = tokio::time::timeout(KILL_WAIT, ended.wait_for(|ended| *ended)).await;
        Some(run.view())
    }
}
