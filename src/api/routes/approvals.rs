//! Decisions on tool calls that wait (`options.permissions`): `POST
//! /agent/session/{id}/approvals/{call_id}` (and the session WebSocket's
//! `approval` frame, which shares [`decide`]) and `GET /agent/approvals`.
//!
//! Only the session's key, or an admin key, decides; another key's
//! session is "not found". A deliberation's or pipeline's session also
//! decides its agents' calls (their sessions have its owner). A call that
//! is not waiting (decided, timed out, never asked) is a 409, and of two
//! decisions at once one wins and the other gets the 409. An edited input is checked against the tool's
//! schema and the deny rules before it claims the call.

use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::agent::decide::{Refused, decide_read};
use crate::api::http::auth::Caller;
use crate::api::http::error::{ApiError, ErrorBody};
use crate::api::http::extract::JsonObject;
use crate::api::http::state::AppState;
use crate::api::routes::agent::parse_id;
use crate::protocol::Approval;
use crate::session::Session;
use crate::session::approvals::{DecideError, Decision, Pending};

/// What a decision did.
#[derive(Debug, Serialize, ToSchema)]
pub struct DecisionTaken {
    /// The session whose call it was: a deliberation agent's or pipeline
    /// node's own when decided through its deliberation or pipeline.
    pub session_id: Uuid,
    pub call_id: String,
    pub decision: Approval,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
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
) -> Result<Arc<Session>, ApiError> {
    let owner = if caller.admin { None } else { caller.owner() };
    Ok(state.sessions.get(id, owner).await?)
}

/// The waiting call `call_id` of `session`, or of one of its agents when
/// it is a deliberation or a pipeline (the agents' sessions have its
/// owner, so whoever may decide for it may decide for them): the session
/// whose call it is, its agent, and the call as read.
async fn whose_call(
    state: &AppState,
    session: &Arc<Session>,
    call_id: &str,
    agent_id: Option<&str>,
) -> Result<Option<Waiting>, ApiError> {
    let owner = session.owner.as_deref();
    let read = |id| state.approvals.pending(owner, id, call_id);
    if agent_id.is_none()
        && let Some(own) = read(session.id).await.map_err(ApiError::internal)?
    {
        return Ok(Some((session.clone(), None, own)));
    }
    let mut found = state
        .approvals
        .of_agents(owner, session.id, Some(call_id), agent_id)
        .await
        .map_err(ApiError::internal)?;
    if found.len() > 1 {
        let agents: Vec<&str> = found.iter().filter_map(|p| p.agent_id.as_deref()).collect();
        return Err(ApiError::invalid(
            "agent_id",
            format!(
                "agents {} each wait on a call {call_id}: name one with agent_id",
                agents.join(", ")
            ),
        ));
    }
    let Some(child) = found.pop() else {
        return Ok(None);
    };
    let Some(waiting) = read(child.session_id).await.map_err(ApiError::internal)? else {
        return Ok(None);
    };
    let agent = state.sessions.get(child.session_id, owner).await?;
    Ok(Some((agent, child.agent_id, waiting)))
}

/// A waiting call: the session whose call it is, its agent, the call and
/// its record's revision.
type Waiting = (Arc<Session>, Option<String>, (Pending, u64));

/// Decides a waiting call of `session` (or of one of its agents) for
/// `caller`; answers the session whose call it was, and its agent.
pub async fn decide(
    state: &AppState,
    caller: &Caller,
    session: &Arc<Session>,
    call_id: &str,
    decision: Decision,
) -> Result<(Uuid, Option<String>), ApiError> {
    let not_pending = |e: String| ApiError::new(StatusCode::CONFLICT, "not_pending", e);
    let Some((target, agent_id, waiting)) =
        whose_call(state, session, call_id, decision.agent_id.as_deref()).await?
    else {
        return Err(not_pending(
            DecideError::NotPending(call_id.to_string()).to_string(),
        ));
    };
    let by = if caller.owner.is_some() && caller.owner.as_deref() != target.owner.as_deref() {
        "admin"
    } else {
        "user"
    };
    let (approvals, config) = (&state.approvals, &state.config.agent);
    match decide_read(approvals, config, &target, waiting, decision, by).await {
        Ok(()) => Ok((target.id, agent_id)),
        Err(Refused::NotPending(e)) => Err(not_pending(e.to_string())),
        Err(Refused::Input(e)) => Err(ApiError::invalid("input", e)),
        Err(Refused::Store(e)) => Err(ApiError::store(e)),
        Err(Refused::Undelivered(e @ DecideError::Bus(..))) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "bus_unavailable",
            e.to_string(),
        )),
        Err(Refused::Undelivered(e)) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_delivered",
            e.to_string(),
        )),
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
    let (session_id, agent_id) = decide(&state, &caller, &session, &call_id, decision).await?;
    Ok(Json(DecisionTaken {
        session_id,
        call_id,
        decision: verdict,
        agent_id,
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
