//! Pipeline runs over HTTP, under the `/orchestrator/` paths existing
//! clients call: `POST /orchestrator/pipeline/start`,
//! `GET …/status/{thread_id}`, `GET …/history/{thread_id}`, `POST
//! …/resume/{thread_id}`, `POST …/fork/{thread_id}`, `POST
//! …/cancel/{thread_id}`, `GET /orchestrator/runs/active`, `GET
//! /orchestrator/health`, and `GET /orchestrator/pipelines` (the
//! definitions).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};

use crate::api::http::auth::Caller;
use crate::api::http::error::{ApiError, ErrorBody};
use crate::api::http::extract::JsonObject;
use crate::api::http::state::AppState;
use crate::pipeline::fork::ForkRequest;

/// `{pipeline = "connector", connector_name, connector_type, input, model,
/// mock}` → `202 {thread_id, session_id, pipeline, status: "started"}` at
/// once; the run's events stream on its session. `connector_name` is
/// required by a pipeline whose state has it with no default (the built-in
/// `connector`); a `422` names it when it is missing.
#[utoipa::path(post, path = "/orchestrator/pipeline/start",
    request_body(content = Object, description = "{pipeline, connector_name, connector_type, input, model, mock}"),
    responses((status = 202, description = "{thread_id, session_id, pipeline, status}"), (status = 422, body = ErrorBody)))]
pub async fn start(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let started = state.pipelines.start(caller.owner.clone(), &body).await?;
    Ok((StatusCode::ACCEPTED, Json(started)).into_response())
}

/// `{thread_id, status: queued|running|completed|failed|cancelled|interrupted, node, state, counters, reason, steps, …}`.
#[utoipa::path(get, path = "/orchestrator/pipeline/status/{thread_id}", params(("thread_id" = String, Path)),
    responses((status = 200, description = "The run"), (status = 404, body = ErrorBody)))]
pub async fn status(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        state.pipelines.status(caller.owner(), &thread_id).await?,
    ))
}

/// Every checkpoint: `{thread_id, history: [{step, node, decision, next, status, state, counters, duration_ms, at}]}`.
#[utoipa::path(get, path = "/orchestrator/pipeline/history/{thread_id}", params(("thread_id" = String, Path)),
    responses((status = 200, description = "The checkpoints"), (status = 404, body = ErrorBody)))]
pub async fn history(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        state.pipelines.history(caller.owner(), &thread_id).await?,
    ))
}

/// Continues a stopped run after its last checkpoint; `409` while it runs
/// or once it is over.
#[utoipa::path(post, path = "/orchestrator/pipeline/resume/{thread_id}", params(("thread_id" = String, Path)),
    responses((status = 202, description = "{thread_id, status: resumed, from_step}"), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn resume(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
) -> Result<Response, ApiError> {
    let resumed = state.pipelines.resume(caller.owner(), &thread_id).await?;
    Ok((StatusCode::ACCEPTED, Json(resumed)).into_response())
}

/// `{step?, state?, session_name?}` → `202 {thread_id, session_id,
/// pipeline, status: "started", from_thread, from_step}`: a new run of the
/// caller's whose history is this run's up to checkpoint `step` (the last
/// when not given), whose state there is the checkpoint's with `state`'s
/// fields on top, and whose routing after that step is decided again on
/// it. The source is not touched (it may still run). `404` for another
/// key's run or a step it has not stored (the message lists its steps),
/// `409` when the run would end at that step, `422` naming a bad field.
#[utoipa::path(post, path = "/orchestrator/pipeline/fork/{thread_id}", params(("thread_id" = String, Path)),
    request_body(content = Object, description = "{step, state, session_name}"),
    responses((status = 202, description = "{thread_id, session_id, pipeline, status: started, from_thread, from_step}"),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn fork(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
    mut body: JsonObject,
) -> Result<Response, ApiError> {
    let request = ForkRequest {
        step: body.take("step")?,
        state: body.take("state")?,
        session_name: body.take("session_name")?,
    };
    body.deny_rest()?;
    let forked = state
        .pipelines
        .fork(caller.owner.clone(), &thread_id, request)
        .await?;
    Ok((StatusCode::ACCEPTED, Json(forked)).into_response())
}

/// Stops a running run (the node's turn and its sandbox processes), and
/// answers once it stopped (`cancelled`; `cancelling` when it takes more
/// than 10 s); `409` when it is not running.
#[utoipa::path(post, path = "/orchestrator/pipeline/cancel/{thread_id}", params(("thread_id" = String, Path)),
    responses((status = 202, description = "{thread_id, status: cancelled | cancelling}"), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn cancel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
) -> Result<Response, ApiError> {
    let cancelled = state.pipelines.cancel(caller.owner(), &thread_id).await?;
    Ok((StatusCode::ACCEPTED, Json(cancelled)).into_response())
}

/// The caller's running and queued runs.
#[utoipa::path(get, path = "/orchestrator/runs/active",
    responses((status = 200, description = "{runs: [...]}")))]
pub async fn active(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        json!({"runs": state.pipelines.active(caller.owner()).await?}),
    ))
}

#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RunsQuery {
    /// How many (1 to 500; default 50).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u32>,
}

/// The caller's latest runs, newest first, each as `status` answers it.
#[utoipa::path(get, path = "/orchestrator/runs", params(RunsQuery),
    responses((status = 200, description = "{runs: [...]}"), (status = 422, body = ErrorBody)))]
pub async fn runs(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    crate::api::http::extract::ApiQuery(query): crate::api::http::extract::ApiQuery<RunsQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = match query.limit {
        None => 50,
        Some(n @ 1..=500) => n as usize,
        Some(_) => return Err(ApiError::invalid("limit", "must be 1 to 500")),
    };
    Ok(Json(
        json!({"runs": state.pipelines.recent(caller.owner(), limit).await?}),
    ))
}

/// `{status: ok, test_mode, max_concurrent_pipelines, pipeline_timeout_s, queued, pipelines}`.
#[utoipa::path(get, path = "/orchestrator/health", responses((status = 200, description = "The orchestrator")))]
pub async fn health(State(state): State<AppState>) -> Json<Value> {
    Json(state.pipelines.health())
}

/// The pipelines this server runs.
#[utoipa::path(get, path = "/orchestrator/pipelines", responses((status = 200, description = "{pipelines: [...]}")))]
pub async fn definitions(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"pipelines": state.pipelines.definitions()}))
}

/// `{yaml}` → `{valid: true, pipeline: {name, start, nodes, …}}`, or `422`
/// with the file, line and place of the first mistake. Nothing is saved.
#[utoipa::path(post, path = "/orchestrator/pipelines/validate",
    request_body(content = Object, description = "{yaml}"),
    responses((status = 200, description = "{valid: true, pipeline}"), (status = 422, body = ErrorBody)))]
pub async fn validate(
    State(state): State<AppState>,
    mut body: JsonObject,
) -> Result<Json<Value>, ApiError> {
    let yaml = body.take_text("yaml")?;
    body.deny_rest()?;
    let models = state.models.clone();
    let known = move |model: &str| models.resolve(model).map(|_| ()).map_err(|e| e.to_string());
    // Off the async workers: a parse is bounded (size and depth are
    // checked first) but not free, and other tenants' requests must not
    // wait behind it.
    let parsed = tokio::task::spawn_blocking(move || {
        crate::pipeline::Definition::parse(&yaml, "request")
            .and_then(|d| d.check_models(&yaml, "request", &known).map(|()| d))
    })
    .await
    .map_err(|e| ApiError::internal(format!("validating a pipeline: {e}")))?;
    let definition = parsed.map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_pipeline",
            e.to_string(),
        )
    })?;
    Ok(Json(json!({"valid": true, "pipeline": {
        "name": definition.name, "start": definition.start, "terminal": definition.terminal,
        "nodes": definition.nodes.keys().collect::<Vec<_>>(), "counters": definition.counters}})))
}
