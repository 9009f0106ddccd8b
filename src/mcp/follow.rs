//! What the agent tools (`deliberate`, `start_pipeline`) share: who calls,
//! their arguments as a route's JSON body, and following the session that
//! does the work, with progress notifications, until its turn's `result`.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use rmcp::RoleServer;
use rmcp::model::{ErrorData, ProgressNotificationParam};
use rmcp::service::RequestContext;
use serde::Serialize;
use serde_json::{Map, Value};

use super::host::{Caller, McpOwner};
use crate::protocol::Event;
use crate::session::Session;

/// The API key a call acts for: `None` for the trusted servers (the
/// agent's client, the stdio `conclave mcp`), `Some(key or none)` for an
/// HTTP caller.
pub fn http_owner(caller: &Caller, ctx: &RequestContext<RoleServer>) -> Option<Option<String>> {
    match caller {
        Caller::Trusted => None,
        Caller::Http => Some(
            ctx.extensions
                .get::<http::request::Parts>()
                .and_then(|parts| parts.extensions.get::<McpOwner>())
                .and_then(|o| o.0.clone()),
        ),
    }
}

/// The span of a tool call that starts work, a child of the MCP client's
/// trace (its `_meta`, or the HTTP request's `traceparent`).
pub fn call_span(tool: &str, ctx: &RequestContext<RoleServer>) -> crate::telemetry::spans::Span {
    let parts = ctx.extensions.get::<http::request::Parts>();
    crate::telemetry::spans::mcp_call(tool, &ctx.meta, parts.map(|p| &p.headers))
}

/// A tool's arguments as the JSON body its HTTP route takes.
pub fn body_of(args: &impl Serialize) -> Result<Map<String, Value>, ErrorData> {
    match serde_json::to_value(args) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(ErrorData::internal_error("encoding the arguments", None)),
    }
}

/// Follows `session`'s turn from the event after `since` to its `result`,
/// which it returns (`None` if the session went first): `note` turns an
/// event into a progress notification (progress, message), sent when the
/// client asked for progress. A cancelled call runs `on_cancel` once and
/// keeps following until the turn ends.
pub async fn follow<F>(
    session: &Session,
    since: u64,
    ctx: &RequestContext<RoleServer>,
    total: Option<f64>,
    on_cancel: F,
    note: impl FnMut(&Event) -> Option<(f64, String)>,
) -> Option<Arc<Event>>
where
    F: Future<Output = ()>,
{
    follow_until(session, since, ctx, total, on_cancel, note, |_| false).await
}

/// [`follow`], returning also at the first event `stop` picks (the turn
/// goes on).
pub async fn follow_until<F>(
    session: &Session,
    since: u64,
    ctx: &RequestContext<RoleServer>,
    total: Option<f64>,
    on_cancel: F,
    mut note: impl FnMut(&Event) -> Option<(f64, String)>,
    stop: impl Fn(&Event) -> bool,
) -> Option<Arc<Event>>
where
    F: Future<Output = ()>,
{
    let token = ctx.meta.get_progress_token();
    let mut events = session.subscribe(since, true);
    tokio::pin!(on_cancel);
    let mut cancelled = false;
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            _ = ctx.ct.cancelled(), if !cancelled => {
                (&mut on_cancel).await;
                cancelled = true;
                continue;
            }
        };
        let event = event?;
        if event.ends_turn() || stop(&event) {
            return Some(event);
        }
        if let (Some((progress, message)), Some(token)) = (note(&event), &token) {
            let mut param =
                ProgressNotificationParam::new(token.clone(), progress).with_message(message);
            if let Some(total) = total {
                param = param.with_total(total);
            }
            // A client that went away just misses the note.
            let _ = ctx.peer.notify_progress(param).await;
        }
    }
}
