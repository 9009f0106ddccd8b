//! Push notifications: a client names a URL for a task, and each change
//! of the task's state is POSTed there as a `statusUpdate` stream
//! response. The URL must pass the same outbound allow list as external
//! MCP servers (`mcp.allowed_http_servers`), checked when it is given and
//! on every connection, so a request cannot make the server call its own
//! host or private network.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};
use uuid::Uuid;

use super::rpc::{self, RpcError};
use super::send::{Found, RpcCall, caught_up, find};
use super::task::{self, State, Task};
use crate::api::http::error::ApiError;
use crate::api::http::state::AppState;
use crate::egress::Rules;
use crate::store::Expect;

/// KV namespace of the configs; no API key can name it.
const CONFIGS: &str = "_a2a_push";
/// Configs one task may have.
const MAX_PER_TASK: usize = 8;
/// How long one notification may take.
const POST_TIMEOUT: Duration = Duration::from_secs(10);

fn internal(e: impl std::fmt::Display) -> RpcError {
    ApiError::internal(e).into()
}

fn prefix(owner: Option<&str>, task: &str) -> String {
    format!("{}/{task}/", task::owner_part(owner))
}

/// `CreateTaskPushNotificationConfig`.
pub async fn create(call: &RpcCall<'_>, params: &Value) -> Result<Value, RpcError> {
    let found = find(call, rpc::text(params, "taskId")?).await?;
    register(call, &found, params).await
}

/// Keeps a config for the task and starts notifying, unless it has ended.
pub async fn register(
    call: &RpcCall<'_>,
    found: &Found,
    config: &Value,
) -> Result<Value, RpcError> {
    let url = rpc::text(config, "url")?;
    let rules = call.state.config.mcp.http_rules();
    rules
        .check_url(url)
        .await
        .map_err(|e| RpcError::params(format!("url: {e} (mcp.allowed_http_servers)")))?;
    let task_id = found.id();
    let owner = call.caller.owner();
    let existing = call
        .state
        .kv
        .list(CONFIGS, &prefix(owner, &task_id), MAX_PER_TASK + 1)
        .await
        .map_err(internal)?;
    let id = match config
        .get("id")
        .and_then(Value::as_str)
        .filter(|i| !i.is_empty())
    {
        Some(id) if id.contains('/') => return Err(RpcError::params("id must not contain '/'")),
        Some(id) => id.to_owned(),
        None => Uuid::new_v4().to_string(),
    };
    let key = format!("{}{id}", prefix(owner, &task_id));
    if existing.len() >= MAX_PER_TASK && !existing.iter().any(|e| e.key == key) {
        return Err(RpcError::params(format!(
            "a task has at most {MAX_PER_TASK} push configs"
        )));
    }
    let mut kept = json!({"id": id, "taskId": task_id, "url": url});
    for field in ["token", "authentication"] {
        if let Some(value) = config.get(field).filter(|v| !v.is_null()) {
            kept[field] = value.clone();
        }
    }
    let value = Bytes::from(serde_json::to_vec(&kept).map_err(internal)?);
    call.state
        .kv
        .put(CONFIGS, &key, value, Expect::Any)
        .await
        .map_err(internal)?;
    // The state now is the first one sent: read before the notifier
    // starts, which may take a while to build its client.
    let (task, mark) = caught_up(found).await;
    if !task.state.is_terminal() {
        let notifier = Notifier {
            state: call.state.clone(),
            found: found.clone(),
            key,
            rules,
        };
        tokio::spawn(notifier.run(task, mark));
    }
    Ok(kept)
}

/// `GetTaskPushNotificationConfig`.
pub async fn get(call: &RpcCall<'_>, params: &Value) -> Result<Value, RpcError> {
    let found = find(call, rpc::text(params, "taskId")?).await?;
    let id = rpc::text(params, "id")?;
    let key = format!("{}{id}", prefix(call.caller.owner(), &found.id()));
    let entry = call.state.kv.get(CONFIGS, &key).await.map_err(internal)?;
    let entry = entry.ok_or_else(|| not_found(id))?;
    serde_json::from_slice(&entry.value).map_err(internal)
}

fn not_found(id: &str) -> RpcError {
    RpcError::params(format!("no push config {id:?} for this task"))
}

/// `ListTaskPushNotificationConfigs`: all of them, on one page.
pub async fn list(call: &RpcCall<'_>, params: &Value) -> Result<Value, RpcError> {
    let found = find(call, rpc::text(params, "taskId")?).await?;
    let entries = call
        .state
        .kv
        .list(
            CONFIGS,
            &prefix(call.caller.owner(), &found.id()),
            MAX_PER_TASK,
        )
        .await
        .map_err(internal)?;
    let configs: Vec<Value> = entries
        .iter()
        .filter_map(|e| serde_json::from_slice(&e.value).ok())
        .collect();
    Ok(json!({"configs": configs, "nextPageToken": ""}))
}

/// `DeleteTaskPushNotificationConfig`: its notifier stops before its next
/// POST.
pub async fn delete(call: &RpcCall<'_>, params: &Value) -> Result<Value, RpcError> {
    let found = find(call, rpc::text(params, "taskId")?).await?;
    let id = rpc::text(params, "id")?;
    let key = format!("{}{id}", prefix(call.caller.owner(), &found.id()));
    let deleted = call
        .state
        .kv
        .delete(CONFIGS, &key, Expect::Any)
        .await
        .map_err(internal)?;
    deleted.map(|_| json!({})).ok_or_else(|| not_found(id))
}

/// What follows one task for one config.
struct Notifier {
    state: AppState,
    found: Found,
    key: String,
    rules: Arc<Rules>,
}

impl Notifier {
    /// Follows the task from `mark` on until it ends, POSTing each state
    /// it reaches (the one it is in first) while its config is kept.
    async fn run(self, mut task: Task, mark: u64) {
        let Notifier {
            state,
            found,
            key,
            rules,
        } = self;
        let client = match rules.client().timeout(POST_TIMEOUT).build() {
            Ok(client) => client,
            Err(e) => {
                tracing::warn!(error = %e, "push notifications: no HTTP client");
                return;
            }
        };
        let mut update = json!({"statusUpdate": {"taskId": task.id, "contextId": task.context,
            "status": {"state": task.state.name(), "timestamp": task::stamp(task.timestamp)}}});
        let mut sent: Option<State> = None;
        let mut live = found.session.subscribe(mark, true);
        loop {
            if sent != Some(task.state) {
                if !post(&state, &client, &key, &update).await {
                    return;
                }
                sent = Some(task.state);
            }
            if task.state.is_terminal() {
                return;
            }
            let Some(event) = live.next().await else {
                return;
            };
            if let Some(last) = task
                .apply(&event)
                .into_iter()
                .rfind(|u| u.get("statusUpdate").is_some())
            {
                update = last;
            }
        }
    }
}

/// POSTs one update to the config's URL with its token and credentials;
/// false once the config is gone.
async fn post(state: &AppState, client: &reqwest::Client, key: &str, update: &Value) -> bool {
    let config: Value = match state.kv.get(CONFIGS, key).await {
        Ok(Some(entry)) => serde_json::from_slice(&entry.value).unwrap_or_default(),
        Ok(None) => return false,
        Err(e) => {
            tracing::warn!(error = %e, "push notifications: reading a config");
            return false;
        }
    };
    let Some(url) = config.get("url").and_then(Value::as_str) else {
        return false;
    };
    let mut request = client.post(url).json(update);
    if let Some(token) = config.get("token").and_then(Value::as_str) {
        request = request.header("X-A2A-Notification-Token", token);
    }
    let scheme = config
        .pointer("/authentication/scheme")
        .and_then(Value::as_str);
    let credentials = config
        .pointer("/authentication/credentials")
        .and_then(Value::as_str);
    if let (Some(scheme), Some(credentials)) = (scheme, credentials) {
        request = request.header("Authorization", format!("{scheme} {credentials}"));
    }
    // Delivery is best effort: a receiver that is down misses this update,
    // not the next one.
    match request.send().await {
        Ok(response) if !response.status().is_success() => {
            tracing::info!(%url, status = %response.status(), "push notification refused");
        }
        Ok(_) => {}
        Err(e) => tracing::info!(%url, error = %e, "push notification failed"),
    }
    true
}
