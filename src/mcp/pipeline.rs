//! The `start_pipeline` tool: an IDE starts a pipeline run and follows it,
//! with a progress notification per node; the result is the run's status
//! (state, counters, reason). Cancelling the call cancels the run.

use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::model::{CallToolResult, ErrorData};
use rmcp::service::RequestContext;

use super::follow::{body_of, follow, http_owner};
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
    let Some(runs) = host.live.as_ref().map(|live| &live.pipelines) else {
        return Err(ErrorData::invalid_request(
            "start_pipeline runs in the server: connect to its /mcp",
            None,
        ));
    };
    let owner = http_owner(caller, &ctx).flatten();
    let started = runs
        .start(owner.clone(), &body_of(&args)?)
        .await
        .map_err(refusal)?;
    let session = runs.session(started.session_id).await.map_err(refusal)?;
    let mut done = 0u32;
    follow(
        &session,
        0,
        &ctx,
        None,
        async {
            let _ = runs.cancel(owner.as_deref(), &started.thread_id).await;
        },
        |event| match &event.kind {
            EventKind::NodeCompleted { node, decision, .. } => {
                done += 1;
                Some((f64::from(done), format!("{node}: {decision} (node {done})")))
            }
            _ => None,
        },
    )
    .await;
    let status = runs
        .status(owner.as_deref(), &started.thread_id)
        .await
        .map_err(refusal)?;
    Ok(CallToolResult::structured(status))
}
