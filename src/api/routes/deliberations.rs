//! `POST /deliberations`, `GET /deliberations/{task_id}`, `GET
//! /deliberations`: submit a deliberation, poll its result, list them.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::json;
use uuid::Uuid;

use crate::api::http::auth::Caller;
use crate::api::http::error::{ApiError, ErrorBody};
use crate::api::http::extract::{ApiQuery, JsonObject};
use crate::api::http::state::AppState;
use crate::protocol::deliberation::DeliberationResult;

/// `{task_description, role, num_agents = 3, constraints, rounds,
/// aggregate, models, judge_model, tools, timeout_s, agent_timeout_s,
/// max_budget_usd, max_budget_tokens, max_tokens}` (options flat or under
/// `options`) → `202 {task_id, status: "SUBMITTED", message, session_id}`
/// at once. The agents' events stream on the session; poll the result at
/// `/deliberations/{task_id}`.
#[utoipa::path(post, path = "/deliberations",
    request_body(content = Object, description = "{task_description, role, num_agents, constraints, rounds, aggregate, models, tools, timeout_s, …}"),
    responses((status = 202, description = "{task_id, status: SUBMITTED, message, session_id}"),
        (status = 422, body = ErrorBody)))]
pub async fn submit(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let pending = state
        .deliberations
        .submit(caller.owner.clone(), &body)
        .await?;
    let body = json!({
        "task_id": pending.task_id,
        "status": "SUBMITTED",
        "message": crate::deliberation::submitted_message(pending.total_agents, &pending.role),
        "session_id": pending.session_id,
    });
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

/// A deliberation: `PENDING` with the answers so far, then `COMPLETED`
/// (an agent succeeded) or `FAILED`.
#[utoipa::path(get, path = "/deliberations/{task_id}", params(("task_id" = String, Path)),
    responses((status = 200, body = DeliberationResult), (status = 404, body = ErrorBody)))]
pub async fn result(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(task_id): Path<String>,
) -> Result<Json<DeliberationResult>, ApiError> {
    let task_id = Uuid::parse_str(&task_id)
        .map_err(|_| ApiError::not_found(format!("deliberation {task_id:?} not found")))?;
    Ok(Json(
        state
            .deliberations
            .get(caller.owner.as_deref(), task_id)
            .await?,
    ))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// At most this many (500 at most; 100 by default).
    limit: Option<usize>,
}

/// The caller's deliberations, newest first, without the proposals.
#[utoipa::path(get, path = "/deliberations", params(ListQuery),
    responses((status = 200, description = "{deliberations: [...]}"), (status = 400, body = ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let listed = state
        .deliberations
        .list(caller.owner.as_deref(), query.limit.unwrap_or(100))
        .await?;
    Ok(Json(json!({"deliberations": listed})))
}
