//! The `fork_session` tool: `POST /agent/session/{id}/fork` for an IDE or
//! an agent, on the caller's own sessions.

use rmcp::RoleServer;
use rmcp::model::{CallToolResult, ContentBlock, ErrorData};
use rmcp::service::RequestContext;
use uuid::Uuid;

use super::follow::http_owner;
use super::host::{Caller, McpHost};
use super::schema::ForkSession;
use crate::agent::fork::{ForkError, ForkRequest, Forks};
use crate::session::SessionError;

pub async fn run(
    host: &McpHost,
    caller: &Caller,
    args: ForkSession,
    ctx: &RequestContext<RoleServer>,
) -> Result<CallToolResult, ErrorData> {
    let Some(sessions) = host.sessions() else {
        return Err(ErrorData::internal_error(
            "this server runs no sessions",
            None,
        ));
    };
    let refused = |text: String| Ok(CallToolResult::error(vec![ContentBlock::text(text)]));
    let Ok(source) = Uuid::parse_str(&args.session_id) else {
        return refused(format!("session {} not found", args.session_id));
    };
    let owner = http_owner(caller, ctx).flatten();
    let forks = Forks {
        sessions: sessions.clone(),
        store: host.store.clone(),
        sandboxes: Some(host.tools.sandboxes.clone()),
        tools: None,
        max_forks: host.max_forks,
    };
    let request = ForkRequest {
        at_seq: args.at_seq,
        count: args.count,
        session_name: args.session_name,
        options: args.options,
    };
    match forks
        .fork(source, (owner.as_deref(), owner.as_deref()), request)
        .await
    {
        Ok(forked) => {
            let ids: Vec<String> = forked
                .sessions
                .iter()
                .map(|s| s.session_id.to_string())
                .collect();
            let text = format!(
                "Forked session {} at seq {} into {}.",
                forked.from_session,
                forked.at_seq,
                ids.join(", ")
            );
            let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
            result.structured_content = serde_json::to_value(&forked).ok();
            Ok(result)
        }
        Err(
            error @ (ForkError::Sandbox(_)
            | ForkError::Session(SessionError::Store(_) | SessionError::Internal(_))),
        ) => {
            tracing::warn!(%error, "fork_session failed");
            Err(ErrorData::internal_error(
                "the session could not be forked",
                None,
            ))
        }
        Err(other) => refused(other.to_string()),
    }
}
