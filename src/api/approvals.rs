//! Decisions on tool calls that wait (`options.permissions`): `POST
//! /agent/session/{id}/approvals/{call_id}` (and the session WebSocket's
//! `approval` frame, which shares [`decide`]) and `GET /agent/approvals`.
//!
//! Only the session's key, or an admin key, decides; another key's
//! session is "not found". A call that is not waiting (decided, timed
//! out, never asked) is a 409, and of two decisions at once one wins and
//! the other gets the 409. An edited input is checked against the tool's
//! schema and the deny rules before it claims the call.

use axum::Extension;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use super::agent::parse_id;
use super::auth::Caller;
use super::error::{ApiError, ErrorBody};
use super::extract::JsonObject;
use super::state::AppState;
use crate::agent::decide::Refused;
use crate::protocol::Approval;
use crate::session::Session;
use crate::session::approvals::{Decision, Pending};

/// What a decision did.
#[derive(Debug, Serialize, ToSchema)]
pub struct DecisionTaken {
    pub session_id: Uuid,
    pub call_id: String,
    pub decision: Approval,
}

/// The caller's calls that wait for a decision.
#[derive(Debug, Serialize, ToSchema)]
pub struct PendingList {
    pub approvals: Vec<Pending>,
}

/// Reads a decision body; the error names what is wrong.
pub fn parse_decision(body: Value) -> Result<Decision, ApiError> {
    let decision: Decision = serde_json::from_value(body).map_err(|e| {
        ApiError::invalid(
            "decision",
            format!(
                "{e}; expected {{\"decision\": \"allow\" | \"deny\", \"message\"?, \"input\"?, \
                 \"remember\"?: \"session\", \"rule\"?}}"
            ),
        )
    })?;
    if let Some(rule) = &decision.rule {
        crate::permission::Rule::parse(rule).map_err(|e| ApiError::invalid("rule", e))?;
    }
    if decision.decision == Approval::Deny
        && (decision.input.is_some() || decision.remember.is_some())
    {
        return Err(ApiError::invalid(
            "decision",
            "`input` and `remember` go with `allow` only",
        ));
    }
    Ok(decision)
}

/// The session a caller may decide for: its own, or any with an admin key.
pub async fn decider_session(
    state: &AppState,
    caller: &Caller,
    id: Uuid,
) -> Result<std::sync::Arc<Session>, ApiError> {
    let owner = if caller.admin { None } else { caller.owner() };
    Ok(state.sessions.get(id, owner).await?)
}

/// Decides a waiting call of `session` for `caller`.
pub async fn decide(
    state: &AppState,
    caller: &Caller,
    session: &Session,
    call_id: &str,
    decision: Decision,
) -> Result<(), ApiError> {
    let by = if caller.owner.is_some() && caller.owner.as_deref() != session.owner.as_deref() {
        "admin"
    } else {
        "user"
    };
    let approvals = &state.approvals;
    let config = &state.config.agent;
    match crate::agent::decide::decide(approvals, config, session, call_id, decision, by).await {
        Ok(()) => Ok(()),
        Err(Refused::NotPending(e)) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_pending",
            e.to_string(),
        )),
        Err(Refused::Input(e)) => Err(ApiError::invalid("input", e)),
        Err(Refused::Store(e)) => Err(ApiError::internal(e)),
    }
}

/// Decides a call that waits for approval: `allow` or `deny`, with an
/// optional `message` for the model, an edited `input`, and `remember:
/// "session"` to allow the tool (or `rule`) for the rest of the session.
#[utoipa::path(post, path = "/agent/session/{session_id}/approvals/{call_id}",
    params(("session_id" = Uuid, Path), ("call_id" = String, Path)), request_body = Decision,
    responses((status = 200, body = DecisionTaken), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn post(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, call_id)): Path<(String, String)>,
    JsonObject(body): JsonObject,
) -> Result<Json<DecisionTaken>, ApiError> {
    let session = decider_session(&state, &caller, parse_id(&id)?).await?;
    let decision = parse_decision(Value::Object(body))?;
    let verdict = decision.decision;
    decide(&state, &caller, &session, &call_id, decision).await?;
    Ok(Json(DecisionTaken {
        session_id: session.id,
        call_id,
        decision: verdict,
    }))
}

/// The caller's calls that wait for a decision, across its sessions.
#[utoipa::path(get, path = "/agent/approvals", responses((status = 200, body = PendingList)))]
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<PendingList>, ApiError> {
    let approvals = state
        .approvals
        .list(caller.owner())
        .await
        .map_err(ApiError::internal)?;
    Ok(Json(PendingList { approvals }))
}
