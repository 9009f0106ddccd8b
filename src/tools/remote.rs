//! Tool calls carried to the replica that holds the session's sandbox.
//!
//! With docker or local sandboxes a session's workspace lives on one host.
//! Among replicas, the first replica to run a tool call of a session owns
//! its tools: the store says so (KV namespace `_sandbox_owners`, key the
//! session, value the owner's instance id, written with compare-and-set).
//! A call on another replica goes to the owner over NATS
//! (`conclave.tools.<instance>.call`, the answer and what the call prints
//! streamed back to an inbox); its release and its delete go the same way,
//! and so do a turn end to snapshot, what a turn changed, and a wait for
//! the snapshots under way ([`workspace`]),
//! and so does the list of tools it is offered when that list holds its
//! own MCP servers or A2A agents (the sandbox's tools alone are the same
//! on every replica, listed without asking the store).
//!
//! A replica that stopped has no subscription left, so NATS answers "no
//! responders" at once: the replica that finds this takes the session
//! over (compare-and-set on the owner's revision), runs the call in a new
//! sandbox (or in the old one, when this replica can reach it: the same
//! docker daemon, the same kubernetes namespace) and says so with a
//! `status` event: the workspace was lost, or kept. A
//! call whose owner dies while it runs ends with an error saying so; the
//! next call takes over.

use std::sync::Arc;
use std::time::Duration;

use async_nats::{Client, StatusCode};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::agent::tools::{NotHeldHere, STATUS_STREAM};
use crate::agent::{AgentOptions, ToolChunk, ToolContext, ToolOutput, ToolRouter};
use crate::model::ToolSpec;
use crate::session::SessionError;
use crate::store::{Expect, KvWrite, Store, StoreError};

/// The store's KV namespace of owners (no API key can name it).
const OWNERS: &str = "_sandbox_owners";
pub mod advertised;
mod serve;
mod workspace;

const PREFIX: &str = "conclave.tools";
/// Silence from an owner running a call before it is asked whether it
/// still lives.
const QUIET: Duration = Duration::from_secs(5);
/// How long an owner has to answer that question.
const PING_WAIT: Duration = Duration::from_secs(5);
/// Chunks of a forwarded call's output queued on the owner before it
/// drops them (the call's result is never dropped).
const OUTPUT_BACKLOG: usize = 256;

/// The cancels of the forwarded calls running here, by call.
type Calls = Arc<std::sync::Mutex<std::collections::HashMap<Uuid, CancellationToken>>>;

/// A forwarded request, as the owner reads it.
#[derive(Debug, Serialize, Deserialize)]
struct Request {
    session_id: Uuid,
    options: AgentOptions,
    /// The session's owner, whose `max_sandboxes` its sandbox counts in
    /// (absent from a replica that sends none: no key).
    #[serde(default)]
    owner: Option<String>,
    /// The tool call (none for the tools offered, release, delete).
    call: Option<ForwardedCall>,
    /// The turn end whose snapshot to take (`turn_ended`).
    #[serde(default)]
    seq: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
struct ForwardedCall {
    id: Uuid,
    name: String,
    input: Value,
}

/// What the owner streams back for a call.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ForwardedReply {
    Chunk { stream: String, content: String },
    Done { output: Value, is_error: bool },
}

/// Who holds a session's tools, and the revision of the store's entry
/// that says so.
enum Owner {
    Here { revision: u64 },
    There { replica: String, revision: u64 },
}

/// How a forwarded exchange ended.
enum Forwarded<T> {
    Answered(T),
    /// Nobody listens for the owner any more: it stopped, before the
    /// request reached it (`received` false: NATS found no responder) or
    /// after (it stopped answering).
    Gone {
        received: bool,
    },
    Failed(String),
}

/// The tools of a replica among others: calls run here when this replica
/// holds the session's sandbox, on the replica that does otherwise.
pub struct ClusterTools {
    local: Arc<dyn ToolRouter>,
    client: Client,
    store: Arc<dyn Store>,
    instance: String,
    /// Sessions the store last said this replica holds the tools of, with
    /// the revision of that entry: the tools a turn is offered are listed
    /// here without asking the store again, and a release drops the entry
    /// if it is still at that revision without reading it first. A call
    /// always asks (another replica may have taken the session over);
    /// what it finds updates this.
    held_here: std::sync::Mutex<std::collections::HashMap<Uuid, u64>>,
    /// Sessions whose calls this replica carried to another, by that
    /// replica: where their turn ends are told without asking the store.
    held_there: std::sync::Mutex<std::collections::HashMap<Uuid, String>>,
}

impl ClusterTools {
    /// Connects to NATS and answers other replicas' calls for sessions
    /// whose sandbox is here until `stop`.
    pub async fn start(
        local: Arc<dyn ToolRouter>,
        url: &str,
        store: Arc<dyn Store>,
        instance: String,
        stop: CancellationToken,
        tasks: &TaskTracker,
    ) -> Result<Arc<ClusterTools>, String> {
        let client = async_nats::ConnectOptions::new()
            .name("conclave-tools")
            .connect(url)
            .await
            .map_err(|e| format!("connecting for tool calls: {e}"))?;
        let requests = client
            .subscribe(format!("{PREFIX}.{instance}.>"))
            .await
            .map_err(|e| format!("listening for tool calls: {e}"))?;
        let tools = Arc::new(ClusterTools {
            local,
            client,
            store,
            instance,
            held_here: Default::default(),
            held_there: Default::default(),
        });
        tasks.spawn(tools.clone().serve(requests, stop, tasks.clone()));
        Ok(tools)
    }

    /// The session's owner; a session nobody owns becomes this replica's.
    async fn owner(&self, session: Uuid) -> Result<Owner, StoreError> {
        let owner = self.read_owner(session).await?;
        let mut held = crate::sync::lock(&self.held_here);
        let mut there = crate::sync::lock(&self.held_there);
        match &owner {
            Owner::Here { revision } => {
                held.insert(session, *revision);
                there.remove(&session);
            }
            Owner::There { replica, .. } => {
                held.remove(&session);
                there.insert(session, replica.clone());
            }
        }
        Ok(owner)
    }

    async fn read_owner(&self, session: Uuid) -> Result<Owner, StoreError> {
        let key = session.to_string();
        loop {
            match self.store.kv_get(OWNERS, &key).await? {
                Some(entry) if entry.value == self.instance.as_bytes() => {
                    return Ok(Owner::Here {
                        revision: entry.revision,
                    });
                }
                Some(entry) => {
                    return Ok(Owner::There {
                        replica: String::from_utf8_lossy(&entry.value).into_owned(),
                        revision: entry.revision,
                    });
                }
                None => {
                    let claimed = self
                        .store
                        .kv_put(OWNERS, &key, self.instance.as_bytes(), Expect::Absent)
                        .await?;
                    if let KvWrite::Done(revision) = claimed {
                        return Ok(Owner::Here { revision });
                    }
                }
            }
        }
    }

    /// Takes the session over from an owner that stopped; the new entry's
    /// revision, or `None` when another replica took it first.
    async fn take_over(&self, session: Uuid, revision: u64) -> Result<Option<u64>, StoreError> {
        let write = self
            .store
            .kv_put(
                OWNERS,
                &session.to_string(),
                self.instance.as_bytes(),
                Expect::Revision(revision),
            )
            .await?;
        Ok(match write {
            KvWrite::Done(revision) => Some(revision),
            KvWrite::Conflict { .. } => None,
        })
    }

    /// Sends `request` to `replica`'s `leaf` and hands each reply to
    /// `on_reply` until it answers `Some`. While the owner is quiet for
    /// [`QUIET`] it is asked whether it lives; `cancel` is passed on.
    async fn exchange<T>(
        &self,
        replica: &str,
        leaf: &str,
        request: &Request,
        cancel: Option<&CancellationToken>,
        mut on_reply: impl FnMut(Bytes) -> Result<Option<T>, String>,
    ) -> Forwarded<T> {
        let payload = match serde_json::to_vec(request) {
            Ok(payload) => payload,
            Err(e) => return Forwarded::Failed(format!("encoding a tool request: {e}")),
        };
        let inbox = self.client.new_inbox();
        let mut replies = match self.client.subscribe(inbox.clone()).await {
            Ok(replies) => replies,
            Err(e) => return Forwarded::Failed(format!("NATS: {e}")),
        };
        if let Err(e) = self
            .client
            .publish_with_reply(format!("{PREFIX}.{replica}.{leaf}"), inbox, payload.into())
            .await
        {
            return Forwarded::Failed(format!("NATS: {e}"));
        }
        let mut cancel_sent = false;
        loop {
            let cancelled = async {
                match cancel {
                    Some(cancel) if !cancel_sent => cancel.cancelled().await,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                reply = tokio::time::timeout(QUIET, replies.next()) => match reply {
                    Ok(None) => return Forwarded::Failed("the connection to NATS closed".into()),
                    Ok(Some(message)) if message.status == Some(StatusCode::NO_RESPONDERS) => {
                        return Forwarded::Gone { received: false };
                    }
                    Ok(Some(message)) => match on_reply(message.payload) {
                        Ok(Some(answer)) => return Forwarded::Answered(answer),
                        Ok(None) => {}
                        Err(e) => return Forwarded::Failed(e),
                    },
                    Err(_) => {
                        if !self.alive(replica).await {
                            return Forwarded::Gone { received: true };
                        }
                    }
                },
                _ = cancelled => {
                    cancel_sent = true;
                    if let Some(call) = &request.call {
                        let subject = format!("{PREFIX}.{replica}.cancel.{}", call.id);
                        let _ = self.client.publish(subject, Bytes::new()).await;
                    }
                }
            }
        }
    }

    /// Whether `replica` still answers.
    async fn alive(&self, replica: &str) -> bool {
        let ping = self
            .client
            .request(format!("{PREFIX}.{replica}.ping"), Bytes::new());
        matches!(tokio::time::timeout(PING_WAIT, ping).await, Ok(Ok(_)))
    }

    async fn settle_here(&self, session: Uuid, leaf: &str) {
        if leaf == "delete" {
            self.local.delete(session).await;
        } else {
            self.local.release(session).await;
        }
    }

    /// Runs `leaf` (release or delete) where the session's tools are.
    async fn settle(&self, session: Uuid, leaf: &str) {
        let key = session.to_string();
        crate::sync::lock(&self.held_there).remove(&session);
        // Held here: the entry goes first, only if no replica took the
        // session over since (one round trip where reading it and then
        // deleting it took two).
        let held = crate::sync::lock(&self.held_here).remove(&session);
        if let Some(revision) = held {
            match self
                .store
                .kv_delete(OWNERS, &key, Expect::Revision(revision))
                .await
            {
                Ok(KvWrite::Done(_)) => return self.settle_here(session, leaf).await,
                Ok(KvWrite::Conflict { .. }) => {}
                Err(e) => {
                    tracing::warn!(%session, error = %e, "forgetting a session's tools");
                    return self.settle_here(session, leaf).await;
                }
            }
        }
        let owner = match self.store.kv_get(OWNERS, &key).await {
            Ok(owner) => owner,
            Err(e) => {
                tracing::warn!(%session, error = %e, "finding a session's tools to {leaf} them");
                return;
            }
        };
        let recorded = owner.is_some();
        match owner {
            Some(entry) if entry.value != self.instance.as_bytes() => {
                let replica = String::from_utf8_lossy(&entry.value).into_owned();
                let request = Request {
                    session_id: session,
                    options: AgentOptions::default(),
                    owner: None,
                    call: None,
                    seq: None,
                };
                let settled = self
                    .exchange(&replica, leaf, &request, None, |_| Ok(Some(())))
                    .await;
                // Its replica stopped: free the sandbox here if this
                // replica can reach it.
                if let Forwarded::Gone { .. } = settled
                    && self.local.adopt(session).await
                {
                    self.settle_here(session, leaf).await;
                }
            }
            _ => self.settle_here(session, leaf).await,
        }
        crate::sync::lock(&self.held_here).remove(&session);
        // Nobody owned the session's tools (it made no call): no entry to
        // forget.
        if recorded && let Err(e) = self.store.kv_delete(OWNERS, &key, Expect::Any).await {
            tracing::warn!(%session, error = %e, "forgetting a session's tools");
        }
    }
}

/// The note a call gets when it took over the sandbox of a replica that
/// stopped (on the same docker daemon or kubernetes namespace).
fn adopted(replica: &str) -> String {
    format!(
        "the session's sandbox was served by replica {replica}, which stopped: \
         this replica took it over, and the workspace is kept"
    )
}

/// The note a call gets when its session's workspace was on a replica
/// that stopped.
fn lost(replica: &str) -> String {
    format!(
        "the session's workspace was on replica {replica}, which stopped: it is lost, \
         and this call runs in a new sandbox on this replica"
    )
}

#[async_trait]
impl ToolRouter for ClusterTools {
    async fn specs(&self, ctx: &ToolContext) -> Vec<ToolSpec> {
        // The sandbox's own tools are the same on every replica: only a
        // session's MCP servers and A2A agents are connected where its
        // tools are, so only they need the owner (and listing claims
        // nothing: the first call does).
        let connected = ctx.options.mcp_servers.is_some() || ctx.options.a2a_agents.is_some();
        if !connected || crate::sync::lock(&self.held_here).contains_key(&ctx.session_id) {
            return self.local.specs(ctx).await;
        }
        match self.owner(ctx.session_id).await {
            Ok(Owner::There { replica, .. }) => {
                let request = Request {
                    session_id: ctx.session_id,
                    options: (*ctx.options).clone(),
                    owner: ctx.owner.clone(),
                    call: None,
                    seq: None,
                };
                let read = |body: Bytes| {
                    serde_json::from_slice::<Vec<ToolSpec>>(&body)
                        .map(Some)
                        .map_err(|e| e.to_string())
                };
                match self.exchange(&replica, "specs", &request, None, read).await {
                    Forwarded::Answered(specs) => specs,
                    // Gone: the next call takes the session over; until
                    // then this replica's tools are the same ones.
                    Forwarded::Gone { .. } | Forwarded::Failed(_) => self.local.specs(ctx).await,
                }
            }
            _ => self.local.specs(ctx).await,
        }
    }

    async fn call(
        &self,
        ctx: &ToolContext,
        name: &str,
        input: Value,
        cancel: CancellationToken,
    ) -> ToolOutput {
        let (sink, _) = mpsc::channel(1);
        self.call_with_output(ctx, name, input, cancel, sink).await
    }

    async fn call_with_output(
        &self,
        ctx: &ToolContext,
        name: &str,
        input: Value,
        cancel: CancellationToken,
        output: mpsc::Sender<ToolChunk>,
    ) -> ToolOutput {
        let failed = |e: StoreError| {
            ToolOutput::error(format!(
                "finding the replica with the session's sandbox: {e}"
            ))
        };
        loop {
            let (replica, revision) = match self.owner(ctx.session_id).await {
                Err(e) => return failed(e),
                Ok(Owner::Here { .. }) => {
                    return self
                        .local
                        .call_with_output(ctx, name, input, cancel, output)
                        .await;
                }
                Ok(Owner::There { replica, revision }) => (replica, revision),
            };
            let request = Request {
                session_id: ctx.session_id,
                options: (*ctx.options).clone(),
                owner: ctx.owner.clone(),
                call: Some(ForwardedCall {
                    id: Uuid::new_v4(),
                    name: name.to_owned(),
                    input: input.clone(),
                }),
                seq: None,
            };
            let read = |body: Bytes| match serde_json::from_slice::<ForwardedReply>(&body) {
                Ok(ForwardedReply::Chunk { stream, content }) => {
                    let _ = output.try_send(ToolChunk { stream, content });
                    Ok(None)
                }
                Ok(ForwardedReply::Done { output, is_error }) => {
                    Ok(Some(ToolOutput { output, is_error }))
                }
                Err(e) => Err(format!("an unreadable tool reply: {e}")),
            };
            let forwarded = self
                .exchange(&replica, "call", &request, Some(&cancel), read)
                .await;
            match forwarded {
                Forwarded::Answered(answer) => return answer,
                Forwarded::Failed(e) => return ToolOutput::error(e),
                Forwarded::Gone { received } => {
                    match self.take_over(ctx.session_id, revision).await {
                        Err(e) => return failed(e),
                        // Another replica took it first: ask again.
                        Ok(None) => continue,
                        Ok(Some(taken)) => {
                            crate::sync::lock(&self.held_here).insert(ctx.session_id, taken);
                            let note = if self.local.adopt(ctx.session_id).await {
                                adopted(&replica)
                            } else {
                                lost(&replica)
                            };
                            let _ = output
                                .send(ToolChunk {
                                    stream: STATUS_STREAM.into(),
                                    content: note,
                                })
                                .await;
                            if received {
                                return ToolOutput::error(format!(
                                    "replica {replica} stopped while it ran this call"
                                ));
                            }
                            return self
                                .local
                                .call_with_output(ctx, name, input, cancel, output)
                                .await;
                        }
                    }
                }
            }
        }
    }

    async fn check_options(&self, options: &AgentOptions) -> Result<(), SessionError> {
        self.local.check_options(options).await
    }

    /// Told where the turn's calls ran: here, or on the replica holding
    /// the session's sandbox, asked over NATS.
    async fn turn_changes(&self, ctx: &ToolContext) -> Option<crate::protocol::FilesChanged> {
        self.changes_where_held(ctx).await
    }

    /// Before the session's first turn no replica holds its sandbox: the
    /// turn's replica makes it here, as its first call would.
    async fn seed_workspace(
        &self,
        ctx: &ToolContext,
        cancel: CancellationToken,
    ) -> Result<Option<crate::agent::Seeded>, String> {
        self.local.seed_workspace(ctx, cancel).await
    }

    /// The replica holding the session's sandbox snapshots it: here, or
    /// told over NATS.
    async fn turn_ended(&self, session_id: Uuid, owner: Option<&str>, seq: u64) {
        self.forward_turn_end(session_id, owner, seq).await;
    }

    async fn snapshots_settled(&self, session_id: Uuid) {
        self.settle_snapshots(session_id).await;
    }

    /// Recorded in the store every replica reads; the sandbox goes
    /// wherever it is.
    async fn rewind_workspace(&self, session_id: Uuid, seq: u64) -> bool {
        self.settle_snapshots(session_id).await;
        if !self.local.rewind_workspace(session_id, seq).await {
            return false;
        }
        self.settle(session_id, "release").await;
        true
    }

    async fn hold_workspace(&self, session_id: Uuid) -> Result<(), NotHeldHere> {
        self.hold(session_id).await
    }

    async fn release(&self, session_id: Uuid) {
        self.settle(session_id, "release").await;
    }

    /// No other replica ran a turn of the session, so none ran its tools:
    /// with no call here there is no owner to look up (one store read
    /// fewer for every `/agent/run` that calls no tool).
    async fn release_made_here(&self, session_id: Uuid) {
        let held = crate::sync::lock(&self.held_here).contains_key(&session_id);
        if held {
            self.settle(session_id, "release").await;
        } else {
            self.settle_here(session_id, "release").await;
        }
    }

    async fn delete(&self, session_id: Uuid) {
        self.settle(session_id, "delete").await;
    }
}
