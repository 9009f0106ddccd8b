//! The `deliberate` tool: an IDE hands a task to N agents and gets their
//! proposals (and the decision) back, with a progress notification as each
//! agent finishes. Cancelling the call stops every agent.

use std::sync::Arc;

use futures::StreamExt;
use rmcp::RoleServer;
use rmcp::model::{CallToolResult, ErrorData, ProgressNotificationParam};
use rmcp::service::RequestContext;
use serde_json::{Map, Value};

use super::host::{Caller, McpHost, McpOwner};
use super::schema::Deliberate;
use crate::deliberation::records::DeliberationError;
use crate::protocol::EventKind;
use crate::session::SessionError;

fn refusal(error: DeliberationError) -> ErrorData {
    match error {
        DeliberationError::Session(SessionError::Option(e)) => {
            ErrorData::invalid_params(e.to_string(), None)
        }
        other => ErrorData::internal_error(other.to_string(), None),
    }
}

/// The key of an HTTP caller; none for the trusted stdio server.
pub(super) fn owner(caller: &Caller, ctx: &RequestContext<RoleServer>) -> Option<String> {
    match caller {
        Caller::Trusted => None,
        Caller::Http => ctx
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<McpOwner>())
            .and_then(|o| o.0.clone()),
    }
}

pub async fn run(
    host: &Arc<McpHost>,
    caller: &Caller,
    args: Deliberate,
    ctx: RequestContext<RoleServer>,
) -> Result<CallToolResult, ErrorData> {
    let Some(deliberations) = host.deliberations.get() else {
        return Err(ErrorData::invalid_request(
            "deliberate runs in the server: connect to its /mcp (conclave mcp serves only the sandbox tools)",
            None,
        ));
    };
    let owner = owner(caller, &ctx);
    let body: Map<String, Value> = match serde_json::to_value(&args) {
        Ok(Value::Object(map)) => map,
        _ => return Err(ErrorData::internal_error("encoding the options", None)),
    };
    let pending = deliberations
        .submit(owner.clone(), &body)
        .await
        .map_err(refusal)?;
    let session = deliberations
        .session(pending.session_id)
        .await
        .map_err(refusal)?;
    let total = f64::from(pending.total_agents);
    let token = ctx.meta.get_progress_token();
    let mut events = session.subscribe(0, true);
    let mut answered = 0u32;
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            _ = ctx.ct.cancelled() => {
                session.interrupt();
                continue;
            }
        };
        let Some(event) = event else { break };
        let note = match &event.kind {
            EventKind::AgentCompleted { round, .. } => Some(("completed", *round)),
            EventKind::AgentFailed { round, .. } => Some(("failed", *round)),
            EventKind::Result { .. } => break,
            _ => None,
        };
        if let (Some((how, round)), Some(token)) = (note, &token) {
            if round == 0 {
                answered += 1;
            }
            let agent = event.agent_id.as_deref().unwrap_or("an agent");
            let param = ProgressNotificationParam::new(token.clone(), f64::from(answered))
                .with_total(total)
                .with_message(format!(
                    "{agent} {how} (round {round}; {answered} of {} answered)",
                    pending.total_agents
                ));
            // A client that went away just misses the note.
            let _ = ctx.peer.notify_progress(param).await;
        }
    }
    let result = deliberations
        .get(owner.as_deref(), pending.task_id)
        .await
        .map_err(refusal)?;
    let value = serde_json::to_value(&result)
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
    Ok(CallToolResult::structured(value))
}
