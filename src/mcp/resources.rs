//! A caller's sessions as MCP resources: `conclave://sessions/{id}` (the
//! status, history and usage, as JSON), `conclave://sessions/{id}/events`
//! (the event log, as NDJSON) and `conclave://sessions/{id}/files/{path}`
//! (a file of its workspace, text or base64). A subscriber hears
//! `notifications/resources/updated` while a turn writes events (through
//! `resources/subscribe` under the 2025 revisions, on a
//! `subscriptions/listen` stream under 2026-07-28). Another
//! key's session is "not found" for reading and subscribing alike.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use rmcp::RoleServer;
use rmcp::model::{
    ErrorData, ListResourceTemplatesResult, ListResourcesResult, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate, ResourceUpdatedNotification,
    ResourceUpdatedNotificationParam, ServerNotification, SubscriptionFilter,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use serde::Deserialize as _;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::follow::http_owner;
use super::host::{Caller, McpHost};
use crate::session::{Session, SessionError, SessionManager};
use crate::store::SessionFilter;
use crate::sync::lock;

const PREFIX: &str = "conclave://sessions/";
const EVENTS_SUFFIX: &str = "/events";
const FILES_INFIX: &str = "/files/";
/// Bytes of a workspace file a read returns: larger ones are refused (the
/// official SDKs take messages of 1 MiB; base64 makes a third more).
const MAX_FILE_BYTES: usize = 512 * 1024;
/// Sessions a listing shows, the newest first.
const MAX_LISTED: usize = 500;
/// Bytes of NDJSON an events read returns: its latest events, so that the
/// answer fits the official SDKs' 1 MiB message limit.
const MAX_EVENTS_BYTES: usize = 768 * 1024;
/// At most one update notification per subscription this often: the
/// events in between are one update.
const UPDATE_EVERY: Duration = Duration::from_millis(250);

/// What a URI names.
#[derive(Debug, Clone, PartialEq)]
enum ResourceUri {
    Status(Uuid),
    Events(Uuid),
    /// A file of the session's workspace, by its path there.
    File(Uuid, String),
}

impl ResourceUri {
    fn parse(uri: &str) -> Option<ResourceUri> {
        let rest = uri.strip_prefix(PREFIX)?;
        if let Some((id, path)) = rest.split_once(FILES_INFIX) {
            let id = Uuid::parse_str(id).ok()?;
            return (!path.is_empty()).then(|| ResourceUri::File(id, path.to_owned()));
        }
        match rest.strip_suffix(EVENTS_SUFFIX) {
            Some(id) => Uuid::parse_str(id).ok().map(ResourceUri::Events),
            None => Uuid::parse_str(rest).ok().map(ResourceUri::Status),
        }
    }

    fn session(&self) -> Uuid {
        match self {
            ResourceUri::Status(id) | ResourceUri::Events(id) | ResourceUri::File(id, _) => *id,
        }
    }
}

fn not_found(uri: &str) -> ErrorData {
    ErrorData::resource_not_found(format!("no resource {uri}"), None)
}

fn internal(error: impl std::fmt::Display) -> ErrorData {
    tracing::warn!(%error, "a session resource failed");
    ErrorData::internal_error("the session could not be read", None)
}

fn manager(host: &McpHost) -> Result<&Arc<SessionManager>, ErrorData> {
    host.sessions().ok_or_else(|| {
        ErrorData::invalid_request(
            "session resources are the server's: connect to its /mcp",
            None,
        )
    })
}

/// The session a URI names, if the caller may see it.
async fn find(
    host: &McpHost,
    caller: &Caller,
    uri: &str,
    ctx: &RequestContext<RoleServer>,
) -> Result<(ResourceUri, Arc<Session>), ErrorData> {
    let target = ResourceUri::parse(uri).ok_or_else(|| not_found(uri))?;
    let owner = http_owner(caller, ctx).flatten();
    match manager(host)?.get(target.session(), owner.as_deref()).await {
        Ok(session) => Ok((target, session)),
        Err(SessionError::NotFound(_)) => Err(not_found(uri)),
        Err(e) => Err(internal(e)),
    }
}

pub fn templates() -> ListResourceTemplatesResult {
    ListResourceTemplatesResult::with_all_items(vec![
        ResourceTemplate::new(format!("{PREFIX}{{session_id}}"), "session")
            .with_title("Conclave session")
            .with_description("An agent session's status, history and usage.")
            .with_mime_type("application/json"),
        ResourceTemplate::new(
            format!("{PREFIX}{{session_id}}{EVENTS_SUFFIX}"),
            "session-events",
        )
        .with_title("Conclave session events")
        .with_description("A session's event log, one JSON event per line.")
        .with_mime_type("application/x-ndjson"),
        ResourceTemplate::new(
            format!("{PREFIX}{{session_id}}{FILES_INFIX}{{path}}"),
            "workspace-file",
        )
        .with_title("A file of a session's workspace")
        .with_description(
            "A file of an agent session's /workspace, as text or base64 (at most 512 KiB; \
                 GET /agent/session/{id}/files/{path} streams any size).",
        ),
    ])
}

/// The caller's sessions, each as its status and its events.
pub async fn list(
    host: &McpHost,
    caller: &Caller,
    ctx: &RequestContext<RoleServer>,
) -> Result<ListResourcesResult, ErrorData> {
    let Some(sessions) = host.sessions() else {
        return Ok(ListResourcesResult::default());
    };
    let filter = SessionFilter {
        owner: http_owner(caller, ctx).flatten(),
        limit: Some(MAX_LISTED),
        ..SessionFilter::default()
    };
    let records = sessions.list(&filter).await.map_err(internal)?;
    let resources = records
        .iter()
        .flat_map(|record| {
            let name = record
                .name
                .clone()
                .unwrap_or_else(|| format!("session {}", record.id));
            let status = format!("{PREFIX}{}", record.id);
            [
                Resource::new(status.clone(), name.clone())
                    .with_description(format!(
                        "{} session, {}",
                        record.kind,
                        record.status.as_str()
                    ))
                    .with_mime_type("application/json"),
                Resource::new(format!("{status}{EVENTS_SUFFIX}"), format!("{name} events"))
                    .with_mime_type("application/x-ndjson"),
            ]
        })
        .collect();
    Ok(ListResourcesResult::with_all_items(resources))
}

pub async fn read(
    host: &McpHost,
    caller: &Caller,
    uri: &str,
    ctx: &RequestContext<RoleServer>,
) -> Result<ReadResourceResult, ErrorData> {
    let (target, session) = find(host, caller, uri, ctx).await?;
    let contents = match target {
        ResourceUri::Status(_) => {
            let history = manager(host)?.history(&session).await.map_err(internal)?;
            let status = json!({
                "session_id": session.id,
                "session_name": session.name,
                "kind": session.kind,
                "status": session.status(),
                "running": session.is_running(),
                "usage": session.usage(),
                "history": history,
                "last_seq": session.last_seq(),
                "created_at": session.created_at,
                "updated_at": session.updated_at(),
            });
            ResourceContents::text(status.to_string(), uri).with_mime_type("application/json")
        }
        ResourceUri::File(_, path) => {
            host.held_here(caller, session.id).await?;
            workspace_file(host, &session, &path, uri).await?
        }
        ResourceUri::Events(_) => {
            let lines: Vec<String> = session
                .replay(0)
                .filter_map(|event| async move { serde_json::to_string(&*event).ok() })
                .collect()
                .await;
            ResourceContents::text(latest_lines(&lines, MAX_EVENTS_BYTES), uri)
                .with_mime_type("application/x-ndjson")
        }
    };
    Ok(ReadResourceResult::new(vec![contents]))
}

/// A file of the session's workspace: text when it is UTF-8, else base64.
async fn workspace_file(
    host: &McpHost,
    session: &Session,
    path: &str,
    uri: &str,
) -> Result<ResourceContents, ErrorData> {
    let invalid = |message: String| ErrorData::invalid_params(message, None);
    if session.kind != crate::protocol::SessionKind::AGENT {
        return Err(not_found(uri));
    }
    let path = crate::sandbox::files::confine(path, crate::sandbox::WORKSPACE)
        .map_err(|e| invalid(e.to_string()))?;
    let options =
        crate::agent::AgentOptions::deserialize(session.options.as_ref()).map_err(internal)?;
    let sandboxes = &host.tools.sandboxes;
    let place =
        crate::tools::place::Place::session(sandboxes, session.id, &options, session.owner.clone())
            .map_err(|e| invalid(e.0))?;
    let lease = place.lease(sandboxes).await.map_err(internal)?;
    let (data, truncated) = crate::sandbox::files::read(lease.sandbox.as_ref(), &path)
        .await
        .map_err(|e| match e {
            crate::sandbox::SandboxError::File(m) if m.contains("does not exist") => not_found(uri),
            other => invalid(other.to_string()),
        })?;
    if truncated || data.len() > MAX_FILE_BYTES {
        return Err(invalid(format!(
            "{path} is larger than {MAX_FILE_BYTES} bytes; GET /agent/session/{}/files/… streams it",
            session.id
        )));
    }
    let mime = mime_guess::from_path(&path)
        .first_or_octet_stream()
        .to_string();
    // An MCP client's model reads it: the session's secrets go as they do
    // from the tools.
    let data = place.scrubber().scrub_bytes(&data);
    Ok(match String::from_utf8(data) {
        Ok(text) => ResourceContents::text(text, uri).with_mime_type(mime),
        Err(e) => {
            use base64::Engine as _;
            let blob = base64::engine::general_purpose::STANDARD.encode(e.into_bytes());
            ResourceContents::blob(blob, uri).with_mime_type(mime)
        }
    })
}

/// The last lines that fit in `max` bytes, each ending in a newline.
fn latest_lines(lines: &[String], max: usize) -> String {
    let mut size = 0;
    let kept = lines
        .iter()
        .rev()
        .take_while(|line| {
            size += line.len() + 1;
            size <= max
        })
        .count();
    lines[lines.len() - kept..]
        .iter()
        .flat_map(|line| [line.as_str(), "\n"])
        .collect()
}

/// One connection's subscriptions by URI; they end with it.
#[derive(Default)]
pub struct Subscriptions(Mutex<HashMap<String, CancellationToken>>);

impl Drop for Subscriptions {
    fn drop(&mut self) {
        for token in lock(&self.0).values() {
            token.cancel();
        }
    }
}

/// Sends `notifications/resources/updated` for `uri` while the session's
/// log grows, until an unsubscribe, the connection's end or the session's.
pub async fn subscribe(
    host: &McpHost,
    caller: &Caller,
    subscriptions: &Subscriptions,
    uri: &str,
    ctx: &RequestContext<RoleServer>,
) -> Result<(), ErrorData> {
    let (_, session) = find(host, caller, uri, ctx).await?;
    let stop = CancellationToken::new();
    if let Some(earlier) = lock(&subscriptions.0).insert(uri.to_string(), stop.clone()) {
        earlier.cancel();
    }
    let (peer, uri) = (ctx.peer.clone(), uri.to_string());
    tokio::spawn(watch(session, stop, move || {
        let (peer, update) = (
            peer.clone(),
            ResourceUpdatedNotificationParam::new(uri.clone()),
        );
        async move { peer.notify_resource_updated(update).await.is_ok() }
    }));
    Ok(())
}

/// Runs `update` while the session's log grows (at most one per
/// [`UPDATE_EVERY`]), until `stop`, the session's end or an update that
/// could not be sent.
async fn watch<F, U>(session: Arc<Session>, stop: CancellationToken, mut update: U)
where
    U: FnMut() -> F,
    F: std::future::Future<Output = bool>,
{
    let mut events = session.subscribe(session.last_seq(), false);
    loop {
        tokio::select! {
            event = events.next() => if event.is_none() { return },
            _ = stop.cancelled() => return,
        }
        if !update().await {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(UPDATE_EVERY) => {}
            _ = stop.cancelled() => return,
        }
        // What came meanwhile is told by the next update.
        while let Some(event) = events.next().now_or_never() {
            if event.is_none() {
                return;
            }
        }
    }
}

/// What a `subscriptions/listen` (2026-07-28) is given of what it asks:
/// updates of resources this server has (which session they name, and
/// whether it is the caller's, is decided by [`listen`]).
pub fn listenable(requested: &SubscriptionFilter) -> SubscriptionFilter {
    let uris = requested
        .resource_subscriptions
        .iter()
        .flatten()
        .filter(|uri| ResourceUri::parse(uri).is_some())
        .cloned()
        .collect();
    let mut accepted = SubscriptionFilter::new();
    accepted.resource_subscriptions = Some(uris);
    accepted
}

/// A `subscriptions/listen` stream: `notifications/resources/updated`
/// for each accepted resource of the caller's while its session's log
/// grows, until the client ends the request. A resource of another key's
/// (or none) is never updated, so that the stream says nothing about it.
pub async fn listen(
    host: &McpHost,
    caller: &Caller,
    subscription: SubscriptionContext,
) -> Result<(), ErrorData> {
    let ctx = subscription.request_context();
    let stop = ctx.ct.child_token();
    let _stop_on_end = stop.clone().drop_guard();
    let uris = subscription
        .accepted()
        .resource_subscriptions
        .clone()
        .unwrap_or_default();
    for uri in uris {
        let Ok((_, session)) = find(host, caller, &uri, ctx).await else {
            continue;
        };
        let sink = subscription.sink().clone();
        tokio::spawn(watch(session, stop.clone(), move || {
            let (sink, uri) = (sink.clone(), uri.clone());
            async move {
                let update =
                    ResourceUpdatedNotification::new(ResourceUpdatedNotificationParam::new(uri));
                let update = ServerNotification::ResourceUpdatedNotification(update);
                sink.send(update).await.is_ok()
            }
        }));
    }
    subscription.cancelled().await;
    Ok(())
}

pub fn unsubscribe(subscriptions: &Subscriptions, uri: &str) {
    if let Some(stop) = lock(&subscriptions.0).remove(uri) {
        stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_name_a_session_or_its_events() {
        let id = Uuid::new_v4();
        assert_eq!(
            ResourceUri::parse(&format!("conclave://sessions/{id}")),
            Some(ResourceUri::Status(id))
        );
        assert_eq!(
            ResourceUri::parse(&format!("conclave://sessions/{id}/events")),
            Some(ResourceUri::Events(id))
        );
        assert_eq!(
            ResourceUri::parse(&format!("conclave://sessions/{id}/files/src/a.py")),
            Some(ResourceUri::File(id, "src/a.py".into()))
        );
        for bad in [
            "conclave://sessions/x",
            "file:///etc/passwd",
            "conclave://sessions/",
            "conclave://sessions/x/files/a",
        ] {
            assert_eq!(ResourceUri::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_events_read_keeps_the_latest_lines() {
        let lines: Vec<String> = (1..=5).map(|n| format!("{{\"seq\":{n}}}")).collect();
        assert_eq!(latest_lines(&lines, 22), "{\"seq\":4}\n{\"seq\":5}\n");
        assert_eq!(latest_lines(&lines, 1000).lines().count(), 5);
    }
}
