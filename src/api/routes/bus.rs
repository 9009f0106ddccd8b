//! The bus over HTTP: publish, subscribe (NDJSON or SSE), and the KV.
//! Every route works in the caller's namespace: the hash of its API key.

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use utoipa::IntoParams;

use crate::api::http::auth::Caller;
use crate::api::http::error::{ApiError, ErrorBody};
use crate::api::http::extract::ApiQuery;
use crate::api::http::state::AppState;
use crate::api::http::stream::json_stream;
use crate::bus::{BusError, KvChange, Pattern, Since, Subject};
use crate::store::{Expect, KvEntry, KvWrite};

/// Longest `?wait=` on a KV read, in seconds.
const MAX_WAIT_S: f64 = 300.0;
/// Entries a KV listing returns by default and at most.
const LIST_DEFAULT: usize = 1000;
const LIST_MAX: usize = 10_000;

/// The caller's bus namespace: its key's hash, or `local` without auth.
pub fn namespace(caller: &Caller) -> &str {
    caller.owner().unwrap_or("local")
}

/// The request body as a JSON payload, checked.
fn json_payload(body: &Bytes, what: &str) -> Result<(), ApiError> {
    serde_json::from_slice::<&RawValue>(body)
        .map(|_| ())
        .map_err(|e| ApiError::bad_request(format!("the {what} must be a JSON value: {e}")))
}

/// Publishes the JSON body to `subject`; answers its `seq` at once.
#[utoipa::path(post, path = "/bus/publish/{subject}", params(("subject" = String, Path, description = "Tokens separated by . or /")),
    request_body(content = Value, description = "Any JSON value"),
    responses((status = 202, description = "{subject, seq}"), (status = 400, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn publish(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(subject): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let subject = Subject::parse(&subject).map_err(BusError::from)?;
    json_payload(&body, "message")?;
    let seq = state
        .bus
        .publish(namespace(&caller), &subject, body)
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"subject": subject.as_str(), "seq": seq})),
    )
        .into_response())
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SubscribeQuery {
    /// Subject patterns separated by commas (`a.*,sync/>`).
    subjects: String,
    /// `new` (the default), `all`, a `seq` (kept messages after it on each
    /// subject) or an RFC 3339 time.
    since: Option<String>,
}

/// The parsed `subjects` and `since` of a subscription.
pub fn subscription(
    subjects: &str,
    since: Option<&str>,
) -> Result<(Vec<Pattern>, Since), ApiError> {
    let patterns = Pattern::parse_list(subjects).map_err(BusError::from)?;
    let since = Since::parse(since.unwrap_or("new")).map_err(|e| ApiError::invalid("since", e))?;
    Ok((patterns, since))
}

/// Messages of the subjects as they are published: NDJSON, or SSE with
/// `Accept: text/event-stream`. Each line is `{"type":"message",subject,
/// seq,time,data}` or `{"type":"lagged",subject,since,missed}`.
#[utoipa::path(get, path = "/bus/subscribe", params(SubscribeQuery),
    responses((status = 200, description = "A stream of messages"), (status = 400, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn subscribe(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<SubscribeQuery>,
) -> Result<Response, ApiError> {
    let (patterns, since) = subscription(&query.subjects, query.since.as_deref())?;
    let deliveries = state
        .bus
        .subscribe(namespace(&caller), patterns, since)
        .await?
        .take_until(state.stop.clone().cancelled_owned());
    Ok(json_stream(
        &headers,
        deliveries.map(|d| (d.type_name(), d.seq(), d.json())),
    ))
}

/// A KV entry as the API shows it.
#[derive(Serialize)]
struct EntryJson<'a> {
    key: &'a str,
    /// The value when it is JSON.
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<&'a RawValue>,
    /// The value base64-encoded when it is not JSON (gRPC clients may
    /// store any bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    value_base64: Option<String>,
    revision: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    updated_at: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
}

impl<'a> EntryJson<'a> {
    fn new(key: &'a str, value: Option<&'a [u8]>, revision: u64) -> EntryJson<'a> {
        let json = value.and_then(|v| {
            std::str::from_utf8(v)
                .ok()
                .and_then(|t| serde_json::from_str::<&RawValue>(t).ok())
        });
        let value_base64 = match (value, json) {
            (Some(v), None) => Some(base64::engine::general_purpose::STANDARD.encode(v)),
            _ => None,
        };
        EntryJson {
            key,
            value: json,
            value_base64,
            revision,
            updated_at: None,
            kind: None,
        }
    }

    fn of(entry: &'a KvEntry) -> EntryJson<'a> {
        EntryJson {
            updated_at: Some(entry.updated_at),
            ..EntryJson::new(&entry.key, Some(&entry.value), entry.revision)
        }
    }

    fn bytes(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }
}

fn change_json(change: &KvChange) -> Bytes {
    EntryJson {
        kind: Some(if change.value.is_some() {
            "put"
        } else {
            "delete"
        }),
        ..EntryJson::new(&change.key, change.value.as_deref(), change.revision)
    }
    .bytes()
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct GetQuery {
    /// Seconds to wait until the key exists (or, with `after`, until it
    /// is written past that revision); at most 300.
    wait: Option<f64>,
    /// With `wait`: a revision the key must pass.
    after: Option<u64>,
}

fn wait_time(wait: f64) -> Result<Duration, ApiError> {
    if !(0.0..=MAX_WAIT_S).contains(&wait) {
        return Err(ApiError::invalid(
            "wait",
            format!("must be between 0 and {MAX_WAIT_S} seconds"),
        ));
    }
    Ok(Duration::from_secs_f64(wait))
}

/// A key's value and revision; `?wait=SECONDS` waits for it to exist or
/// change instead of polling.
#[utoipa::path(get, path = "/kv/{key}", params(("key" = String, Path, description = "The key"), GetQuery),
    responses((status = 200, description = "{key, value, revision, updated_at}"), (status = 404, body = ErrorBody), (status = 400, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(key): Path<String>,
    ApiQuery(query): ApiQuery<GetQuery>,
) -> Result<Response, ApiError> {
    let ns = namespace(&caller);
    let entry = match query.wait {
        Some(wait) => {
            let timeout = wait_time(wait)?;
            tokio::select! {
                entry = state.kv.wait(ns, &key, query.after, timeout) => entry?,
                () = state.stop.cancelled() => return Err(BusError::Closed.into()),
            }
        }
        None => state.kv.get(ns, &key).await?,
    };
    let entry = entry.ok_or_else(|| ApiError::not_found(format!("no key {key:?}")))?;
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        EntryJson::of(&entry).bytes(),
    )
        .into_response())
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WriteQuery {
    /// Only if the key is at this revision (`0`: only if it does not exist).
    if_revision: Option<u64>,
}

fn conflict(key: &str, current: Option<u64>, wanted: Expect) -> ApiError {
    let found = current.map_or_else(
        || "does not exist".to_owned(),
        |r| format!("is at revision {r}"),
    );
    let wanted = match wanted {
        Expect::Revision(r) => format!("revision {r}"),
        _ => "no key".to_owned(),
    };
    ApiError::new(
        StatusCode::CONFLICT,
        "revision_mismatch",
        format!("key {key:?} {found}, not {wanted}"),
    )
}

/// Writes the JSON body as the key's value.
#[utoipa::path(put, path = "/kv/{key}", params(("key" = String, Path, description = "The key"), WriteQuery),
    request_body(content = Value, description = "Any JSON value"),
    responses((status = 200, description = "{key, revision}"), (status = 409, body = ErrorBody), (status = 400, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn put(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(key): Path<String>,
    ApiQuery(query): ApiQuery<WriteQuery>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    crate::bus::kv::check_key(&key)?;
    json_payload(&body, "value")?;
    let expect = Expect::if_revision(query.if_revision);
    match state.kv.put(namespace(&caller), &key, body, expect).await? {
        KvWrite::Done(revision) => Ok(Json(json!({"key": key, "revision": revision}))),
        KvWrite::Conflict { current } => Err(conflict(&key, current, expect)),
    }
}

/// Deletes the key.
#[utoipa::path(delete, path = "/kv/{key}", params(("key" = String, Path, description = "The key"), WriteQuery),
    responses((status = 200, description = "{key, revision}"), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(key): Path<String>,
    ApiQuery(query): ApiQuery<WriteQuery>,
) -> Result<Json<Value>, ApiError> {
    let expect = Expect::if_revision(query.if_revision);
    match state.kv.delete(namespace(&caller), &key, expect).await? {
        Some(KvWrite::Done(revision)) => Ok(Json(json!({"key": key, "revision": revision}))),
        Some(KvWrite::Conflict { current }) => Err(conflict(&key, current, expect)),
        None => Err(ApiError::not_found(format!("no key {key:?}"))),
    }
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only keys starting with this.
    prefix: Option<String>,
    /// At most this many entries (default 1000, at most 10000).
    limit: Option<usize>,
    /// Stream the entries, then every change, as NDJSON (or SSE).
    watch: Option<bool>,
}

/// The keys with a prefix; with `watch=true`, their values then every
/// change as a stream of `{type: put|delete, key, value, revision}`.
#[utoipa::path(get, path = "/kv", params(ListQuery),
    responses((status = 200, description = "{entries} or a stream of changes"), (status = 400, body = ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Response, ApiError> {
    let ns = namespace(&caller).to_owned();
    let prefix = query.prefix.unwrap_or_default();
    let limit = query.limit.unwrap_or(LIST_DEFAULT).min(LIST_MAX);
    if query.watch != Some(true) {
        let entries = state.kv.list(&ns, &prefix, limit).await?;
        let entries: Vec<Value> = entries
            .iter()
            .map(|e| serde_json::to_value(EntryJson::of(e)).unwrap_or_default())
            .collect();
        return Ok(Json(json!({"entries": entries})).into_response());
    }
    // Watching from before the listing, so no write falls between them;
    // changes the listing already shows are skipped.
    let changes = state.kv.watch(&ns, &prefix);
    let entries = state.kv.list(&ns, &prefix, usize::MAX).await?;
    let listed = entries.iter().map(|e| e.revision).max().unwrap_or(0);
    let snapshot: Vec<_> = entries
        .iter()
        .map(|e| {
            let mut json = EntryJson::of(e);
            json.kind = Some("put");
            ("put", Some(e.revision), json.bytes())
        })
        .collect();
    let live = changes
        .filter(move |c| std::future::ready(c.revision > listed))
        .map(|c: Arc<KvChange>| {
            let kind = if c.value.is_some() { "put" } else { "delete" };
            (kind, Some(c.revision), change_json(&c))
        });
    let items = futures::stream::iter(snapshot)
        .chain(live)
        .take_until(state.stop.clone().cancelled_owned());
    Ok(json_stream(&headers, items))
}
