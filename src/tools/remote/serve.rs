//! The owner's side: answering other replicas' requests for sessions
//! whose tools are here.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::{Calls, ClusterTools, ForwardedReply, OUTPUT_BACKLOG, PREFIX, Request};
use crate::agent::{ToolChunk, ToolContext};

impl ClusterTools {
    /// Answers other replicas' requests for sessions whose tools are here.
    pub(super) async fn serve(
        self: Arc<Self>,
        mut requests: async_nats::Subscriber,
        stop: CancellationToken,
        tasks: TaskTracker,
    ) {
        let calls: Calls = Arc::default();
        let mine = format!("{PREFIX}.{}.", self.instance);
        loop {
            let message = tokio::select! {
                message = requests.next() => match message {
                    Some(message) => message,
                    None => return,
                },
                _ = stop.cancelled() => return,
            };
            let leaf = message
                .subject
                .as_str()
                .strip_prefix(mine.as_str())
                .unwrap_or_default()
                .to_owned();
            if let Some(call) = leaf.strip_prefix("cancel.") {
                if let Ok(call) = Uuid::parse_str(call)
                    && let Some(token) = crate::sync::lock(&calls).get(&call)
                {
                    token.cancel();
                }
                continue;
            }
            let Some(reply) = message.reply.clone() else {
                continue;
            };
            if leaf == "ping" {
                let _ = self.client.publish(reply, Bytes::new()).await;
                continue;
            }
            let request: Request = match serde_json::from_slice(&message.payload) {
                Ok(request) => request,
                Err(e) => {
                    tracing::warn!(error = %e, "an unreadable tool request was dropped");
                    continue;
                }
            };
            let tools = self.clone();
            let calls = calls.clone();
            tasks.spawn(async move {
                tools.answer(&leaf, request, reply.to_string(), calls).await;
            });
        }
    }

    /// Does one forwarded request here and sends what it gives.
    async fn answer(&self, leaf: &str, request: Request, reply: String, calls: Calls) {
        let ctx = ToolContext {
            session_id: request.session_id,
            options: Arc::new(request.options),
            owner: request.owner,
        };
        let send = |body: Vec<u8>| {
            let client = self.client.clone();
            let reply = reply.clone();
            async move {
                if let Err(e) = client.publish(reply, body.into()).await {
                    tracing::warn!(error = %e, "sending a tool reply failed");
                }
            }
        };
        match (leaf, request.call) {
            ("specs", _) => {
                let specs = self.local.specs(&ctx).await;
                send(serde_json::to_vec(&specs).unwrap_or_default()).await;
            }
            ("release", _) => {
                self.local.release(ctx.session_id).await;
                send(Vec::new()).await;
            }
            ("delete", _) => {
                self.local.delete(ctx.session_id).await;
                send(Vec::new()).await;
            }
            ("turn_ended", _) => {
                if let Some(seq) = request.seq {
                    let owner = ctx.owner.as_deref();
                    self.local.turn_ended(ctx.session_id, owner, seq).await;
                }
                send(Vec::new()).await;
            }
            ("turn_changes", _) => {
                let changes = self.local.turn_changes(&ctx).await;
                send(serde_json::to_vec(&changes).unwrap_or_default()).await;
            }
            ("snapshots_settled", _) => {
                self.local.snapshots_settled(ctx.session_id).await;
                send(Vec::new()).await;
            }
            ("call", Some(call)) => {
                let cancel = CancellationToken::new();
                crate::sync::lock(&calls).insert(call.id, cancel.clone());
                let (sink, mut printed) = mpsc::channel::<ToolChunk>(OUTPUT_BACKLOG);
                let running = self
                    .local
                    .call_with_output(&ctx, &call.name, call.input, cancel, sink);
                tokio::pin!(running);
                let output = loop {
                    tokio::select! {
                        output = &mut running => break output,
                        Some(chunk) = printed.recv() => send(encode_chunk(chunk)).await,
                    }
                };
                while let Ok(chunk) = printed.try_recv() {
                    send(encode_chunk(chunk)).await;
                }
                crate::sync::lock(&calls).remove(&call.id);
                let done = ForwardedReply::Done {
                    output: output.output,
                    is_error: output.is_error,
                };
                send(serde_json::to_vec(&done).unwrap_or_default()).await;
            }
            (other, _) => tracing::warn!(leaf = other, "an unknown tool request was dropped"),
        }
    }
}

fn encode_chunk(chunk: ToolChunk) -> Vec<u8> {
    let reply = ForwardedReply::Chunk {
        stream: chunk.stream,
        content: chunk.content,
    };
    serde_json::to_vec(&reply).unwrap_or_default()
}
