//! The LangGraph store on the caller's KV namespace (the one `/kv` uses):
//! item `key` of namespace `["a", "b"]` is KV key `langgraph/store/a.b/key`,
//! its value `{"value", "created_at"}`.

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use bytes::Bytes;
use chrono::Utc;
use serde_json::{Map, Value, json};

use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::api::http::extract::JsonObject;
use crate::api::http::state::AppState;
use crate::api::routes::bus::namespace as kv_namespace;
use crate::store::{Expect, KvEntry};

const PREFIX: &str = "langgraph/store/";
/// Items a search returns by default, and entries one reads at most.
const SEARCH_DEFAULT: usize = 10;
const SCAN_MAX: usize = 10_000;

fn check_labels(labels: &[String], field: &str) -> Result<(), ApiError> {
    if labels
        .iter()
        .any(|l| l.is_empty() || l.contains('.') || l.contains('/'))
    {
        return Err(ApiError::invalid(
            field,
            "labels must be non-empty and hold no '.' or '/'",
        ));
    }
    Ok(())
}

fn kv_key(labels: &[String], key: &str) -> String {
    format!("{PREFIX}{}/{key}", labels.join("."))
}

/// A namespace and item key back from a KV key.
fn parse_key(kv_key: &str) -> Option<(Vec<String>, String)> {
    let (labels, key) = kv_key.strip_prefix(PREFIX)?.split_once('/')?;
    Some((
        labels.split('.').map(str::to_owned).collect(),
        key.to_owned(),
    ))
}

fn item_json(entry: &KvEntry) -> Option<Value> {
    let (namespace, key) = parse_key(&entry.key)?;
    let stored: Value = serde_json::from_slice(&entry.value).ok()?;
    Some(json!({
        "namespace": namespace,
        "key": key,
        "value": stored.get("value"),
        "created_at": stored.get("created_at"),
        "updated_at": entry.updated_at,
    }))
}

fn namespace_of(body: &mut JsonObject, field: &str) -> Result<Vec<String>, ApiError> {
    let labels = body.take::<Vec<String>>(field)?.unwrap_or_default();
    check_labels(&labels, field)?;
    Ok(labels)
}

/// `PUT /store/items`: writes an item (a JSON object).
pub async fn put_item(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    mut body: JsonObject,
) -> Result<StatusCode, ApiError> {
    let (labels, key) = (
        namespace_of(&mut body, "namespace")?,
        body.take_text("key")?,
    );
    let value = body
        .take::<Map<String, Value>>("value")?
        .ok_or_else(|| ApiError::invalid("value", "is required (a JSON object)"))?;
    let ns = kv_namespace(&caller);
    let kv_key = kv_key(&labels, &key);
    crate::bus::kv::check_key(&kv_key)?;
    // An update keeps the item's first creation time.
    let created_at = match state.kv.get(ns, &kv_key).await? {
        Some(entry) => serde_json::from_slice::<Value>(&entry.value)
            .ok()
            .and_then(|v| v.get("created_at").cloned()),
        None => None,
    }
    .unwrap_or_else(|| json!(Utc::now()));
    let stored = json!({"value": value, "created_at": created_at});
    let bytes = Bytes::from(serde_json::to_vec(&stored).map_err(ApiError::internal)?);
    state.kv.put(ns, &kv_key, bytes, Expect::Any).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /store/items?namespace=a.b&key=k`, or with one `namespace=` per
/// label (`namespace=a&namespace=b&key=k`), the form other clients of the
/// API send. `refresh_ttl` is accepted and has no effect (items keep no
/// time to live here).
pub async fn get_item(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let (labels, key) = item_query(raw.as_deref().unwrap_or(""))?;
    check_labels(&labels, "namespace")?;
    let missing = || ApiError::not_found(format!("no item {key:?} in {labels:?}"));
    let entry = state
        .kv
        .get(kv_namespace(&caller), &kv_key(&labels, &key))
        .await?
        .ok_or_else(missing)?;
    item_json(&entry).map(Json).ok_or_else(missing)
}

/// The namespace's labels and the key of an item query: one `namespace`
/// is split at its dots, several are a label each.
fn item_query(raw: &str) -> Result<(Vec<String>, String), ApiError> {
    let mut namespaces = Vec::new();
    let mut key = None;
    for (name, value) in url::form_urlencoded::parse(raw.as_bytes()) {
        match &*name {
            "namespace" => namespaces.push(value.into_owned()),
            "key" if key.is_some() => {
                return Err(ApiError::bad_request("`key` is given more than once"));
            }
            "key" => key = Some(value.into_owned()),
            "refresh_ttl" => {}
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown query parameter `{other}`, expected one of `namespace`, `key`, `refresh_ttl`"
                )));
            }
        }
    }
    let key = key.ok_or_else(|| ApiError::bad_request("missing query parameter `key`"))?;
    let labels = match namespaces.as_slice() {
        [] => Vec::new(),
        [one] if one.is_empty() => Vec::new(),
        [one] => one.split('.').map(str::to_owned).collect(),
        _ => namespaces,
    };
    Ok((labels, key))
}

/// `DELETE /store/items`.
pub async fn delete_item(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    mut body: JsonObject,
) -> Result<StatusCode, ApiError> {
    let (labels, key) = (
        namespace_of(&mut body, "namespace")?,
        body.take_text("key")?,
    );
    state
        .kv
        .delete(kv_namespace(&caller), &kv_key(&labels, &key), Expect::Any)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The caller's items under a namespace prefix (label by label).
async fn items_under(
    state: &AppState,
    caller: &Caller,
    prefix: &[String],
) -> Result<Vec<KvEntry>, ApiError> {
    let entries = state
        .kv
        .list(kv_namespace(caller), PREFIX, SCAN_MAX)
        .await?;
    Ok(entries
        .into_iter()
        .filter(|e| parse_key(&e.key).is_some_and(|(labels, _)| labels.starts_with(prefix)))
        .collect())
}

/// `POST /store/items/search`: items under `namespace_prefix` whose value
/// has every field of `filter` equal; no semantic `query`.
pub async fn search(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    mut body: JsonObject,
) -> Result<Json<Value>, ApiError> {
    let prefix = namespace_of(&mut body, "namespace_prefix")?;
    let filter = body
        .take::<Map<String, Value>>("filter")?
        .unwrap_or_default();
    let limit = body.take::<usize>("limit")?.unwrap_or(SEARCH_DEFAULT);
    let offset = body.take::<usize>("offset")?.unwrap_or(0);
    if body.take::<String>("query")?.is_some() {
        return Err(ApiError::invalid(
            "query",
            "semantic search is not served: filter by fields instead",
        ));
    }
    let items: Vec<Value> = items_under(&state, &caller, &prefix)
        .await?
        .iter()
        .filter_map(item_json)
        .filter(|item| filter.iter().all(|(k, v)| item["value"].get(k) == Some(v)))
        .skip(offset)
        .take(limit)
        .collect();
    Ok(Json(json!({"items": items})))
}

/// `POST /store/namespaces`: the namespaces holding items, filtered by
/// `prefix` and `suffix`, cut to `max_depth` labels.
pub async fn namespaces(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    mut body: JsonObject,
) -> Result<Json<Value>, ApiError> {
    let prefix = namespace_of(&mut body, "prefix")?;
    let suffix = namespace_of(&mut body, "suffix")?;
    let max_depth = body.take::<usize>("max_depth")?;
    let limit = body.take::<usize>("limit")?.unwrap_or(100);
    let offset = body.take::<usize>("offset")?.unwrap_or(0);
    let mut found: Vec<Vec<String>> = items_under(&state, &caller, &prefix)
        .await?
        .iter()
        .filter_map(|e| parse_key(&e.key).map(|(labels, _)| labels))
        .filter(|labels| labels.ends_with(&suffix))
        .map(|mut labels| {
            if let Some(depth) = max_depth {
                labels.truncate(depth);
            }
            labels
        })
        .collect();
    found.sort();
    found.dedup();
    let page: Vec<Vec<String>> = found.into_iter().skip(offset).take(limit).collect();
    Ok(Json(json!({"namespaces": page})))
}
