//! Weight sync around a gateway pool (admin keys only):
//! `POST /gateway/pools/{model}/weights/begin` pauses the pool and answers
//! once the calls in flight have ended; `…/weights/commit {version}`
//! records the version on each replica, resumes the pool and publishes
//! `sync/weights_ready {model, version}` on the caller's bus.

use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::{Extension, Json};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::IntoParams;

use crate::api::http::auth::Caller;
use crate::api::http::error::{ApiError, ErrorBody};
use crate::api::http::extract::{ApiQuery, JsonObject};
use crate::api::http::state::AppState;
use crate::api::routes::bus::namespace;
use crate::bus::Subject;

/// The longest `begin` waits for calls in flight, by default and at most.
const BEGIN_DEFAULT_S: u64 = 300;
const BEGIN_MAX_S: u64 = 3600;
/// Where a commit is announced.
pub const WEIGHTS_READY: &str = "sync/weights_ready";

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct BeginQuery {
    /// Seconds to wait for the calls in flight (default 300, at most 3600).
    timeout_s: Option<u64>,
}

/// Pauses the pool: new calls wait, calls in flight finish; answers once
/// none is left (`504 pool_busy` after `timeout_s`, the pool still paused).
#[utoipa::path(post, path = "/gateway/pools/{model}/weights/begin", params(("model" = String, Path), BeginQuery),
    responses((status = 200, description = "{model, paused, waited_ms}"), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub async fn begin(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(model): Path<String>,
    ApiQuery(query): ApiQuery<BeginQuery>,
) -> Result<Json<Value>, ApiError> {
    caller.require_admin("pausing a pool for a weight update")?;
    let timeout_s = query.timeout_s.unwrap_or(BEGIN_DEFAULT_S);
    if timeout_s > BEGIN_MAX_S {
        return Err(ApiError::invalid(
            "timeout_s",
            format!("at most {BEGIN_MAX_S}"),
        ));
    }
    let started = Instant::now();
    tokio::select! {
        begun = state.gateway.begin_weights(&model, Duration::from_secs(timeout_s)) => begun?,
        () = state.stop.cancelled() => return Err(ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE, "shutting_down", "the server is shutting down")),
    }
    Ok(Json(json!({
        "model": model,
        "paused": true,
        "waited_ms": started.elapsed().as_millis() as u64,
    })))
}

/// `{version}`: records it on every replica of the pool, resumes the pool
/// (the calls waiting go on, under this version) and publishes
/// `sync/weights_ready {model, version}`.
#[utoipa::path(post, path = "/gateway/pools/{model}/weights/commit", params(("model" = String, Path)),
    request_body(content = Value, description = "{\"version\": any JSON value}"),
    responses((status = 200, description = "{model, version, replicas, seq}"), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn commit(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(model): Path<String>,
    mut body: JsonObject,
) -> Result<Json<Value>, ApiError> {
    caller.require_admin("committing a weight update")?;
    let version = body
        .take::<Value>("version")?
        .filter(|v| !v.is_null())
        .ok_or_else(|| ApiError::invalid("version", "required (a number or a string)"))?;
    body.deny_rest()?;
    let replicas = state.gateway.commit_weights(&model, version.clone())?;
    let subject = Subject::parse(WEIGHTS_READY).map_err(ApiError::internal)?;
    let payload = json!({"model": model, "version": version});
    let seq = state
        .bus
        .publish(
            namespace(&caller),
            &subject,
            Bytes::from(payload.to_string()),
        )
        .await?;
    Ok(Json(json!({
        "model": model,
        "version": version,
        "replicas": replicas,
        "seq": seq,
    })))
}
