//! `GET /agent/sessions`: the caller's sessions, newest first, a page at
//! a time, filtered by status, kind, one-shot runs and origin.

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::api::http::auth::Caller;
use crate::api::http::error::{ApiError, ErrorBody};
use crate::api::http::extract::ApiQuery;
use crate::api::http::state::AppState;
use crate::protocol::{ORIGINS, OWN_ORIGIN, SessionKind, SessionRecord, SessionStatus, Usage};
use crate::session::SessionError;
use crate::store::SessionFilter;

#[derive(Serialize, ToSchema)]
pub struct SessionSummary {
    pub session_id: Uuid,
    pub session_name: Option<String>,
    pub kind: SessionKind,
    pub status: SessionStatus,
    pub usage: Usage,
    /// A one-shot run of `/agent/run`, closed after its turn.
    pub ephemeral: bool,
    /// The protocol adapter that made it (`a2a`, `agui`, `langgraph`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// A client's labels on it (a LangGraph thread's metadata).
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// What the kind adds (an agent: its `model`; a pipeline: its
    /// `pipeline`).
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub details: serde_json::Map<String, serde_json::Value>,
}

#[derive(Serialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<SessionSummary>,
    /// Set when the page is full: pass it as `before` for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_before: Option<Uuid>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Sessions at most, newest first: 1 to 10000 (default 1000).
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<i64>,
    /// Only sessions created before this one: the `next_before` of the
    /// previous page.
    before: Option<String>,
    /// Only sessions in this status: `idle`, `running`, `interrupted`, `closed`.
    status: Option<String>,
    /// Only sessions of this kind (one this server runs, e.g. `agent`).
    kind: Option<String>,
    /// `false`: no one-shot runs of `/agent/run`; `true`: only those.
    ephemeral: Option<bool>,
    /// Only the sessions a protocol adapter made (`a2a`, `agui`,
    /// `langgraph`), or `conclave`: only those none made.
    origin: Option<String>,
}

/// The caller's sessions, newest first, a page at a time.
#[utoipa::path(get, path = "/agent/sessions", params(ListQuery), responses((status = 200, body = SessionList), (status = 422, body = ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let limit = match query.limit {
        None => 1000,
        Some(n @ 1..=10_000) => n as usize,
        Some(_) => return Err(ApiError::invalid("limit", "must be 1 to 10000")),
    };
    // An empty value (a form's unset field) is no filter.
    let given = |value: Option<String>| value.filter(|v| !v.is_empty());
    let status = given(query.status)
        .map(|s| {
            SessionStatus::parse(&s).ok_or_else(|| {
                ApiError::invalid("status", "must be idle, running, interrupted or closed")
            })
        })
        .transpose()?;
    let kind = match given(query.kind) {
        None => None,
        Some(kind) => {
            state.sessions.tasks().require(&kind, "kind")?;
            Some(SessionKind::new(kind))
        }
    };
    let origin = match given(query.origin) {
        None => None,
        Some(origin) if origin == OWN_ORIGIN => Some(None),
        Some(origin) if ORIGINS.contains(&origin.as_str()) => Some(Some(origin)),
        Some(_) => {
            return Err(ApiError::invalid(
                "origin",
                format!("must be {OWN_ORIGIN} or one of {}", ORIGINS.join(", ")),
            ));
        }
    };
    let before = match given(query.before) {
        None => None,
        Some(text) => {
            let id = Uuid::parse_str(&text)
                .map_err(|_| ApiError::invalid("before", "must be a session id"))?;
            // A cursor must be a session the caller may see: another
            // owner's would tell when that session was made.
            match state.sessions.get(id, caller.owner()).await {
                Ok(_) => Some(id),
                Err(SessionError::NotFound(_)) => {
                    return Err(ApiError::invalid("before", "no session with this id"));
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    let filter = SessionFilter {
        owner: caller.owner().map(str::to_owned),
        status,
        kind,
        ephemeral: query.ephemeral,
        origin,
        metadata: Default::default(),
        before,
        limit: Some(limit),
    };
    let sessions: Vec<SessionSummary> = state
        .sessions
        .list(&filter)
        .await?
        .into_iter()
        .map(|record| {
            let details = state
                .sessions
                .tasks()
                .get(record.kind.as_str())
                .map(|task| task.describe(&record.options))
                .unwrap_or_default();
            summary(record, details)
        })
        .collect();
    let next_before = (sessions.len() == limit)
        .then(|| sessions.last().map(|s| s.session_id))
        .flatten();
    Ok(Json(SessionList {
        sessions,
        next_before,
    }))
}

fn summary(
    record: SessionRecord,
    details: serde_json::Map<String, serde_json::Value>,
) -> SessionSummary {
    SessionSummary {
        session_id: record.id,
        session_name: record.name,
        kind: record.kind,
        status: record.status,
        usage: record.usage,
        ephemeral: record.ephemeral,
        origin: record.origin,
        metadata: record.metadata,
        created_at: record.created_at,
        updated_at: record.updated_at,
        details,
    }
}
