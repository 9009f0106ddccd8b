//! `POST /rollouts` and `GET /rollouts/{id}`: prompts dispatched over a
//! gateway pool, each result published on the caller's bus.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Map, Value, json};

use crate::api::http::auth::Caller;
use crate::api::http::error::{ApiError, ErrorBody};
use crate::api::http::extract::JsonObject;
use crate::api::http::state::AppState;
use crate::api::routes::bus::namespace;
use crate::bus::Subject;
use crate::rollout::{Input, RolloutRequest};

/// Sampling parameters a rollout passes on.
const SAMPLING: [&str; 6] = [
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "logprobs",
    "return_token_ids",
];

fn parse(body: &mut JsonObject) -> Result<RolloutRequest, ApiError> {
    let model = body.take_text("model")?;
    let prompts: Option<Vec<String>> = body.take("prompts")?;
    let messages: Option<Vec<Vec<Value>>> = body.take("messages")?;
    let inputs = match (prompts, messages) {
        (Some(prompts), None) => prompts.into_iter().map(Input::Prompt).collect(),
        (None, Some(messages)) => messages.into_iter().map(Input::Messages).collect(),
        _ => {
            return Err(ApiError::invalid(
                "prompts",
                "give either prompts (strings) or messages (one chat per prompt)",
            ));
        }
    };
    let sampling: Map<String, Value> = body.take("sampling")?.unwrap_or_default();
    if let Some(unknown) = sampling.keys().find(|k| !SAMPLING.contains(&k.as_str())) {
        return Err(ApiError::invalid(
            "sampling",
            format!(
                "unknown parameter {unknown:?}; known: {}",
                SAMPLING.join(", ")
            ),
        ));
    }
    let response_topic = body
        .take::<String>("response_topic")?
        .map(|t| Subject::parse(&t))
        .transpose()
        .map_err(|e| ApiError::invalid("response_topic", e))?;
    let metadata = body.take::<Value>("metadata")?.unwrap_or(Value::Null);
    body.deny_rest()?;
    Ok(RolloutRequest {
        model,
        inputs,
        sampling,
        response_topic,
        metadata,
    })
}

/// `{model, prompts | messages, sampling, response_topic?, metadata?}` →
/// `202 {rollout_id}` at once. Each completion is published on
/// `response_topic` (by default the KV key `inference_response_topic`,
/// waited for) as `{rollout_id, index, prompt, outputs, replica,
/// weights_version, usage, metadata}` (or with `error`), then
/// `rollout.completed {rollout_id, count, failed, duration_ms}`.
#[utoipa::path(post, path = "/rollouts", request_body(content = Object, description = "{model, prompts | messages, sampling, response_topic?, metadata?}"),
    responses((status = 202, description = "{rollout_id}"), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn start(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    mut body: JsonObject,
) -> Result<Response, ApiError> {
    let request = parse(&mut body)?;
    let id = state
        .rollouts
        .start(namespace(&caller), caller.owner.clone(), request)?;
    Ok((StatusCode::ACCEPTED, Json(json!({"rollout_id": id}))).into_response())
}

/// A rollout's progress: `{rollout_id, model, total, completed, failed,
/// state, response_topic, started_at, duration_ms, error?}`.
#[utoipa::path(get, path = "/rollouts/{id}", params(("id" = String, Path)),
    responses((status = 200, description = "The progress"), (status = 404, body = ErrorBody)))]
pub async fn progress(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let unknown = || ApiError::not_found(format!("no rollout {id:?}"));
    let uuid = uuid::Uuid::parse_str(&id).map_err(|_| unknown())?;
    let progress = state
        .rollouts
        .progress(namespace(&caller), uuid)
        .ok_or_else(unknown)?;
    serde_json::to_value(progress)
        .map(Json)
        .map_err(ApiError::internal)
}
