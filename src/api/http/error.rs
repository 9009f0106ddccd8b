//! One error type for every handler, and the one place where the errors
//! of the parts under it (sessions, the bus and its KV, the gateway,
//! deliberations, pipeline runs, rollouts) map to status codes.
//!
//! The body is always `{"error": {"code", "message"}}`. 4xx messages say
//! exactly what was wrong with the request; 5xx messages never carry
//! internals (those go to the log).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;

use crate::bus::BusError;
use crate::bus::kv::KvError;
use crate::deliberation::records::DeliberationError;
use crate::gateway::GatewayError;
use crate::pipeline::runs::RunError;
use crate::rollout::RolloutError;
use crate::session::SessionError;
use crate::store::StoreError;

/// How long a client is told to wait while the store is unreachable.
const STORE_RETRY_S: u64 = 5;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// More fields of the error object (a quota's name and reset).
    pub detail: Option<serde_json::Value>,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
}

/// The JSON shape of every error, for the OpenAPI document.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            detail: None,
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn invalid(field: &str, message: impl std::fmt::Display) -> ApiError {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            format!("{field}: {message}"),
        )
    }

    /// A 422: the request is well formed but cannot be done as asked.
    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// A body past `max_body_bytes` (`limit`, where the caller knows it).
    pub fn body_too_large(limit: Option<usize>) -> ApiError {
        let message = match limit {
            Some(limit) => format!(
                "the request body is larger than the server accepts: max_body_bytes is \
                 {limit} bytes"
            ),
            None => "the request body is larger than the server accepts (max_body_bytes)".into(),
        };
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", message)
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// A failure of the server itself: logged in full, answered in brief.
    pub fn internal(error: impl std::fmt::Display) -> ApiError {
        tracing::error!(%error, "internal error");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal server error; see the server log",
        )
    }

    /// A store failure: `503 store_unavailable` with `Retry-After` when
    /// the store cannot be reached now (a database restarting), else an
    /// internal error.
    pub fn store(error: StoreError) -> ApiError {
        match error {
            StoreError::Unavailable(_) => {
                tracing::warn!(%error, "the store is unavailable");
                let mut api = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    "the store (the database) cannot be reached now; retry",
                );
                api.retry_after = Some(STORE_RETRY_S);
                api
            }
            error => ApiError::internal(error),
        }
    }

    /// The JSON body: `{"error": {"code", "message"}}`, and the
    /// detail's fields beside them.
    pub fn body(&self) -> serde_json::Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let (Some(serde_json::Value::Object(detail)), Some(fields)) =
            (&self.detail, error.as_object_mut())
        {
            for (name, value) in detail {
                fields.entry(name.clone()).or_insert_with(|| value.clone());
            }
        }
        json!({ "error": error })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

/// Past a quota: 429 with `Retry-After`, naming the quota and its reset.
impl From<crate::quota::QuotaExceeded> for ApiError {
    fn from(error: crate::quota::QuotaExceeded) -> ApiError {
        let mut api = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "quota_exceeded",
            error.to_string(),
        );
        api.detail = Some(error.detail());
        api.retry_after = Some(error.retry_after.as_secs().max(1));
        api
    }
}

impl From<crate::quota::QuotaError> for ApiError {
    fn from(error: crate::quota::QuotaError) -> Self {
        match error {
            crate::quota::QuotaError::Exceeded(e) => e.into(),
            crate::quota::QuotaError::Store(e) => ApiError::store(e),
        }
    }
}

impl From<SessionError> for ApiError {
    fn from(error: SessionError) -> ApiError {
        match error {
            SessionError::NotFound(_) => ApiError::not_found(error.to_string()),
            SessionError::Busy(_) => {
                ApiError::new(StatusCode::CONFLICT, "session_busy", error.to_string())
            }
            SessionError::Closed(_) => {
                ApiError::new(StatusCode::CONFLICT, "session_closed", error.to_string())
            }
            SessionError::Option(e) => ApiError::from(e),
            SessionError::KindNotServed(_) => {
                ApiError::new(StatusCode::CONFLICT, "kind_not_served", error.to_string())
            }
            SessionError::ShuttingDown => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                error.to_string(),
            ),
            SessionError::Internal(e) => ApiError::internal(e),
            SessionError::Store(e) => ApiError::store(e),
            SessionError::Quota(e) => ApiError::from(e),
            SessionError::Bus(e) => ApiError::from(*e),
            SessionError::Unreachable(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "turn_unreachable",
                error.to_string(),
            ),
        }
    }
}

/// A wrong option of any kind: 422 naming it.
impl From<crate::session::OptionError> for ApiError {
    fn from(error: crate::session::OptionError) -> ApiError {
        ApiError::invalid(&error.field, &error.message)
    }
}

/// The bus: a bad subject or an oversized payload is the caller's; NATS
/// trouble is answered as unavailable, with the cause in the log.
impl From<BusError> for ApiError {
    fn from(error: BusError) -> ApiError {
        match error {
            BusError::Subject(e) => {
                ApiError::new(StatusCode::BAD_REQUEST, "bad_subject", e.to_string())
            }
            BusError::TooLarge { .. } => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                error.to_string(),
            ),
            BusError::Closed => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                error.to_string(),
            ),
            BusError::Store(e) => ApiError::store(e),
            BusError::Quota(e) => ApiError::from(e),
            BusError::Nats(e) => {
                tracing::error!(error = %e, "the NATS bus failed");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "bus_unavailable",
                    "the bus is unavailable; see the server log",
                )
            }
        }
    }
}

/// The KV: a bad key or an oversized value is the caller's.
impl From<KvError> for ApiError {
    fn from(error: KvError) -> ApiError {
        match error {
            KvError::BadKey { .. } => {
                ApiError::new(StatusCode::BAD_REQUEST, "bad_key", error.to_string())
            }
            KvError::TooLarge { .. } => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                error.to_string(),
            ),
            KvError::Store(e) => ApiError::store(e),
            KvError::Quota(e) => ApiError::from(e),
        }
    }
}

/// The gateway: each failure of a pool or its replicas, with its code.
impl From<GatewayError> for ApiError {
    fn from(error: GatewayError) -> ApiError {
        let (status, code) = match &error {
            GatewayError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            GatewayError::UnknownModel { .. } => (StatusCode::NOT_FOUND, "model_not_found"),
            GatewayError::NoReplica(_) | GatewayError::EmptyPool(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "no_replica")
            }
            GatewayError::UnknownPool(_) => (StatusCode::NOT_FOUND, "not_found"),
            GatewayError::Unreachable { .. } => (StatusCode::BAD_GATEWAY, "upstream_unreachable"),
            GatewayError::UnknownReplica(_) => (StatusCode::NOT_FOUND, "not_found"),
            GatewayError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            GatewayError::UnknownResponse(_) => (StatusCode::NOT_FOUND, "response_not_found"),
            GatewayError::NotServed { .. } => (StatusCode::NOT_FOUND, "endpoint_not_served"),
            GatewayError::Paused { .. } => (StatusCode::SERVICE_UNAVAILABLE, "pool_paused"),
            GatewayError::StillBusy { .. } => (StatusCode::GATEWAY_TIMEOUT, "pool_busy"),
        };
        ApiError::new(status, code, error.to_string())
    }
}

/// Deliberations.
impl From<DeliberationError> for ApiError {
    fn from(error: DeliberationError) -> ApiError {
        match error {
            DeliberationError::NotFound(_) => ApiError::not_found(error.to_string()),
            DeliberationError::Session(e) => e.into(),
            DeliberationError::Store(e) => ApiError::store(e),
        }
    }
}

/// Pipeline runs: a run that is not in a state to do what was asked is a
/// conflict.
impl From<RunError> for ApiError {
    fn from(error: RunError) -> ApiError {
        match error {
            RunError::NotFound(_) => ApiError::not_found(error.to_string()),
            RunError::UnknownStep { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "unknown_step", error.to_string())
            }
            RunError::Conflict(..) => {
                ApiError::new(StatusCode::CONFLICT, "run_conflict", error.to_string())
            }
            RunError::Session(e) => e.into(),
            RunError::Store(e) => ApiError::store(e),
        }
    }
}

/// Rollouts.
impl From<RolloutError> for ApiError {
    fn from(error: RolloutError) -> ApiError {
        match error {
            RolloutError::Invalid { field, message } => ApiError::invalid(field, message),
            RolloutError::UnknownModel(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "model_not_found", error.to_string())
            }
            RolloutError::ShuttingDown => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                error.to_string(),
            ),
        }
    }
}
