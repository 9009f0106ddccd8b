//! The `deliberate` tool: an IDE hands a task to N agents and gets their
//! proposals (and the decision) back, with a progress notification as each
//! agent finishes. Cancelling the call stops every agent.

use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::model::{CallToolResult, ErrorData};
use rmcp::service::RequestContext;

use super::follow::{body_of, follow, http_owner};
use super::host::{Caller, McpHost};
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

pub async fn run(
    host: &Arc<McpHost>,
    caller: &Caller,
    args: Deliberate,
    ctx: RequestContext<RoleServer>,
) -> Result<CallToolResult, ErrorData> {
    let Some(deliberations) = host.live.as_ref().map(|live| &live.deliberations) else {
        return Err(ErrorData::invalid_request(
            "deliberate runs in the server: connect to its /mcp (conclave mcp serves only the sandbox tools)",
            None,
        ));
    };
    let owner = http_owner(caller, &ctx).flatten();
    let pending = deliberations
        .submit(owner.clone(), &body_of(&args)?)
        .await
        .map_err(refusal)?;
    let session = deliberations
        .session(pending.session_id)
        .await
        .map_err(refusal)?;
    let total = pending.total_agents;
    let mut answered = 0u32;
    follow(
        &session,
        0,
        &ctx,
        Some(f64::from(total)),
        async {
            session.interrupt();
        },
        |event| {
            let (how, round) = match &event.kind {
                EventKind::AgentCompleted { round, .. } => ("completed", *round),
                EventKind::AgentFailed { round, .. } => ("failed", *round),
                _ => return None,
            };
            if round == 0 {
                answered += 1;
            }
            let agent = event.agent_id.as_deref().unwrap_or("an agent");
            Some((
                f64::from(answered),
                format!("{agent} {how} (round {round}; {answered} of {total} answered)"),
            ))
        },
    )
    .await;
    let result = deliberations
        .get(owner.as_deref(), pending.task_id)
        .await
        .map_err(refusal)?;
    let value = serde_json::to_value(&result)
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
    Ok(CallToolResult::structured(value))
}
