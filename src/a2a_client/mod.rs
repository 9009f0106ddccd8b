//! A session's remote A2A agents (`options.a2a_agents`), each offered to
//! the model as the tool `a2a__{name}`.
//!
//! A call sends the model's message with A2A 1.0's JSON-RPC binding:
//! `SendStreamingMessage`, whose status and artifact updates become the
//! call's live output, or `SendMessage` when the card says the agent does
//! not stream. The remote `contextId` is kept per session and agent, so
//! the next call continues the same remote conversation (and the same task
//! when the agent asked for input). An interrupted turn sends `CancelTask`.
//!
//! Agents are reached only where `mcp.allowed_http_servers` allows, as
//! HTTP MCP servers are: the configured URL is checked when the session is
//! created, the card's interface URL when the card is read, and every
//! connection again after DNS ([`crate::egress`]).
//!
//! - [`card`]: the card read, the interface chosen, the tool described.
//! - [`rpc`]: JSON-RPC and SSE over HTTP, with capped reads.
//! - [`progress`]: one call's events into live output and a result.
//! - [`wire`]: the protocol's messages.

mod card;
mod progress;
mod rpc;
mod wire;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{OnceCell, mpsc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::agent::{A2aAgentSpec, ToolChunk, ToolOutput};
use crate::config::McpConfig;
use crate::model::ToolSpec;
use crate::sync::lock;
use card::Remote;
use progress::Progress;
use wire::{StreamResponse, Task};

/// The prefix of the tools of remote agents.
pub const TOOL_PREFIX: &str = "a2a__";

/// How long a card may take.
const CARD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the agent may stay silent in a stream (and answer a
/// `SendStreamingMessage` at all).
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest one call may run, however it goes on.
const CALL_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// `GetTask` and `CancelTask`.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);
/// Between two `GetTask`s of a task the agent left running.
const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Where a session stands with one agent.
#[derive(Default)]
struct Agent {
    /// Read at first use; a card that could not be read is tried again.
    remote: OnceCell<Arc<Remote>>,
    /// Held for a whole call: calls to one agent go one after another, so
    /// each continues the conversation the one before left.
    conversation: tokio::sync::Mutex<Conversation>,
}

#[derive(Default)]
struct Conversation {
    context_id: Option<String>,
    /// The task that waits for the caller's answer.
    waiting_task: Option<String>,
}

/// The ids of a call's task and context, as far as they are known.
#[derive(Debug, Clone, Default)]
struct Known {
    task_id: Option<String>,
    context_id: Option<String>,
}

pub struct RemoteAgents {
    rules: Arc<crate::egress::Rules>,
    /// Connects only where the rules allow; `None` when the list is empty.
    http: Option<reqwest::Client>,
    sessions: Mutex<HashMap<Uuid, HashMap<String, Arc<Agent>>>>,
}

impl RemoteAgents {
    pub fn new(config: &McpConfig) -> RemoteAgents {
        let rules = config.http_rules();
        let http = (!config.allowed_http_servers.is_empty())
            .then(|| rules.client().connect_timeout(CARD_TIMEOUT).build().ok())
            .flatten();
        RemoteAgents {
            rules,
            http,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    fn agent(&self, session: Uuid, name: &str) -> Arc<Agent> {
        lock(&self.sessions)
            .entry(session)
            .or_default()
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    async fn remote(
        &self,
        agent: &Agent,
        name: &str,
        spec: &A2aAgentSpec,
    ) -> Result<Arc<Remote>, String> {
        let Some(http) = &self.http else {
            return Err(
                "remote A2A agents are turned off (mcp.allowed_http_servers is empty)".into(),
            );
        };
        agent
            .remote
            .get_or_try_init(|| async {
                card::read(http, &self.rules, name, spec, CARD_TIMEOUT)
                    .await
                    .map(Arc::new)
            })
            .await
            .cloned()
            .map_err(|e| format!("the remote agent '{name}': {e}"))
    }

    /// One tool per agent; one whose card cannot be read is offered too,
    /// described by its URL, so that calling it says what is wrong.
    pub async fn specs(
        &self,
        session: Uuid,
        agents: &BTreeMap<String, A2aAgentSpec>,
    ) -> Vec<ToolSpec> {
        let described = agents.iter().map(|(name, spec)| async move {
            let agent = self.agent(session, name);
            match self.remote(&agent, name, spec).await {
                Ok(remote) => remote.tool.clone(),
                Err(e) => {
                    tracing::warn!(%session, error = %e, "remote A2A agent unavailable");
                    card::unread_tool(name, spec.url(), &e)
                }
            }
        });
        futures::future::join_all(described).await
    }

    /// Calls `a2a__{name}`: sends `input.message`, shows what the agent
    /// streams on `output`, and returns its answer.
    pub async fn call(
        &self,
        session: Uuid,
        agents: &BTreeMap<String, A2aAgentSpec>,
        name: &str,
        input: &Value,
        cancel: CancellationToken,
        output: Option<mpsc::Sender<ToolChunk>>,
    ) -> ToolOutput {
        let Some(spec) = agents.get(name) else {
            return ToolOutput::error(format!("no remote agent named '{name}' in this session"));
        };
        let Some(text) = input.get("message").and_then(Value::as_str) else {
            return ToolOutput::error("'message' is required and must be a string");
        };
        let agent = self.agent(session, name);
        let remote = tokio::select! {
            remote = self.remote(&agent, name, spec) => remote,
            _ = cancel.cancelled() => return ToolOutput::error("interrupted"),
        };
        let remote = match remote {
            Ok(remote) => remote,
            Err(e) => return ToolOutput::error(e),
        };
        let mut conversation = tokio::select! {
            held = agent.conversation.lock() => held,
            _ = cancel.cancelled() => return ToolOutput::error("interrupted"),
        };
        let message = wire::user_message(
            text,
            conversation.context_id.as_deref(),
            conversation.waiting_task.as_deref(),
        );
        let mut progress = Progress::default();
        // The ids as soon as they are known, for a cancel that comes while
        // the exchange (which holds `progress`) is still open.
        let known = Mutex::new(Known::default());
        let ended = {
            let exchange = async {
                let exchanged = self.exchange(&remote, message, &mut progress, &known, output);
                tokio::time::timeout(CALL_TIMEOUT, exchanged)
                    .await
                    .unwrap_or_else(|_| Err(format!("no end within {}s", CALL_TIMEOUT.as_secs())))
            };
            let mut exchange = std::pin::pin!(exchange);
            tokio::select! {
                ended = &mut exchange => ended,
                _ = cancel.cancelled() => {
                    // Cancelled while the stream is still open: the agent
                    // hears CancelTask before it sees the caller leave.
                    let known = lock(&known).clone();
                    if known.context_id.is_some() {
                        conversation.context_id = known.context_id;
                    }
                    conversation.waiting_task = None;
                    return self.cancel_task(&remote, name, known.task_id.as_deref()).await;
                }
            }
        };
        if progress.context_id.is_some() {
            conversation.context_id = progress.context_id.clone();
        }
        conversation.waiting_task = progress
            .state
            .waits()
            .then(|| progress.task_id.clone())
            .flatten();
        match ended {
            Ok(()) => progress.outcome(name),
            Err(e) => match progress.task_id.as_deref().filter(|_| !progress.finished()) {
                // The task may still run there: ask it to stop.
                Some(task) => {
                    let _ = self.cancel(&remote, task).await;
                    ToolOutput::error(format!(
                        "the remote agent '{name}': {e} (its task {task} was asked to stop)"
                    ))
                }
                None => ToolOutput::error(format!("the remote agent '{name}': {e}")),
            },
        }
    }

    /// Sends the message and follows the task until it settles.
    async fn exchange(
        &self,
        remote: &Remote,
        message: Value,
        progress: &mut Progress,
        known: &Mutex<Known>,
        output: Option<mpsc::Sender<ToolChunk>>,
    ) -> Result<(), String> {
        let http = self
            .http
            .as_ref()
            .ok_or("remote A2A agents are turned off")?;
        let params = json!({"message": message});
        let mut out = Vec::new();
        // What the agent said goes out as live output (dropped when the
        // reader is slow); the ids are noted for a cancel.
        let show = |progress: &Progress, out: &mut Vec<ToolChunk>| {
            for chunk in out.drain(..) {
                if let Some(output) = &output {
                    let _ = output.try_send(chunk);
                }
            }
            *lock(known) = Known {
                task_id: progress.task_id.clone(),
                context_id: progress.context_id.clone(),
            };
        };
        if remote.streaming {
            let mut events = rpc::stream(http, &remote.endpoint, params, IDLE_TIMEOUT).await?;
            while let Some(event) = events.next().await {
                progress.apply(event?, &mut out);
                show(progress, &mut out);
                if progress.finished() {
                    return Ok(());
                }
            }
        } else {
            let answer: StreamResponse =
                rpc::call(http, &remote.endpoint, "SendMessage", params, CALL_TIMEOUT).await?;
            progress.apply(answer, &mut out);
            show(progress, &mut out);
        }
        // The stream ended, or the answer came, before the task settled:
        // ask after it until it does.
        while !progress.finished() {
            let Some(task) = progress.task_id.clone() else {
                return Err("it answered with neither a task nor a message".into());
            };
            tokio::time::sleep(POLL_INTERVAL).await;
            let task: Task = rpc::call(
                http,
                &remote.endpoint,
                "GetTask",
                json!({"id": task}),
                CONTROL_TIMEOUT,
            )
            .await?;
            progress.apply(
                StreamResponse {
                    task: Some(task),
                    ..StreamResponse::default()
                },
                &mut out,
            );
            show(progress, &mut out);
        }
        Ok(())
    }

    async fn cancel(&self, remote: &Remote, task: &str) -> Result<Task, String> {
        let http = self
            .http
            .as_ref()
            .ok_or("remote A2A agents are turned off")?;
        rpc::call(
            http,
            &remote.endpoint,
            "CancelTask",
            json!({"id": task}),
            CONTROL_TIMEOUT,
        )
        .await
    }

    /// The result of an interrupted call, after asking the agent to stop
    /// the task it runs.
    async fn cancel_task(&self, remote: &Remote, name: &str, task: Option<&str>) -> ToolOutput {
        let Some(task) = task else {
            return ToolOutput::error("interrupted");
        };
        match self.cancel(remote, task).await {
            Ok(cancelled) => ToolOutput::error(format!(
                "interrupted: the remote agent '{name}' was asked to cancel its task {task} (now {})",
                cancelled.status.state.wire_name()
            )),
            Err(e) => {
                tracing::warn!(agent = name, task, error = %e, "a remote A2A task may still run");
                ToolOutput::error(format!(
                    "interrupted; cancelling the remote agent '{name}''s task {task} failed: {e}"
                ))
            }
        }
    }

    /// Forgets the session's conversations.
    pub fn release(&self, session: Uuid) {
        lock(&self.sessions).remove(&session);
    }
}
