//! The `start_pipeline` tool: an IDE starts a pipeline run and follows it,
//! with a progress notification per node; the result is the run's status
//! (state, counters, reason). Cancelling the call cancels the run.

use std::sync::Arc;

use futures::StreamExt;
use rmcp::RoleServer;
use rmcp::model::{CallToolResult, ErrorData, ProgressNotificationParam};
use rmcp::service::RequestContext;
use serde_json::{Map, Value};

use super::host::{Caller, McpHost};
use super::schema::StartPipeline;
use crate::pipeline::runs::RunError;
use crate::protocol::EventKind;
use crate::session::SessionError;

fn refusal(error: RunError) -> ErrorData {
    match error {
        RunError::Session(SessionError::Option(e)) => {
            ErrorData::invalid_params(e.to_string(), None)
        }
        other => ErrorData::internal_error(other.to_string(), None),
    }
}

pub async fn run(
    host: &Arc<McpHost>,
    caller: &Caller,
    args: StartPipeline,
    ctx: RequestContext<RoleServer>,
) -> Result<CallToolResult, ErrorData> {
    let Some(runs) = host.pipelines.get() else {
        return Err(ErrorData::invalid_request(
            "start_pipeline runs in the server: connect to its /mcp",
            None,
        ));
    };
    let owner = super::deliberate::owner(caller, &ctx);
    let body: Map<String, Value> = match serde_json::to_value(&args) {
        Ok(Value::Object(map)) => map,
        _ => return Err(ErrorData::internal_error("encoding the options", None)),
    };
    let started = runs.start(owner.clone(), &body).await.map_err(refusal)?;
    let thread = started["thread_id"].as_str().unwrap_or_default().to_owned();
    let session = started["session_id"]
        .as_str()
        .and_then(|id| uuid::Uuid::parse_str(id).ok())
        .ok_or_else(|| ErrorData::internal_error("the run has no session", None))?;
    let session = runs.session(session).await.map_err(refusal)?;
    let token = ctx.meta.get_progress_token();
    let mut events = session.subscribe(0, true);
    let mut done = 0u32;
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            _ = ctx.ct.cancelled() => {
                let _ = runs.cancel(owner.as_deref(), &thread).await;
                continue;
            }
        };
        let Some(event) = event else { break };
        match &event.kind {
            EventKind::NodeCompleted { node, decision, .. } => {
                done += 1;
                if let Some(token) = &token {
                    let param = ProgressNotificationParam::new(token.clone(), f64::from(done))
                        .with_message(format!("{node}: {decision} (node {done})"));
                    let _ = ctx.peer.notify_progress(param).await;
                }
            }
            EventKind::Result { .. } => break,
            _ => {}
        }
    }
    let status = runs
        .status(owner.as_deref(), &thread)
        .await
        .map_err(refusal)?;
    Ok(CallToolResult::structured(status))
}
