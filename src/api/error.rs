//! One error type for every handler, mapped to a status code once.
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

use crate::session::SessionError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
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

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn body_too_large() -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            "the request body is larger than the server accepts (max_body_bytes)",
        )
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
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
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
            SessionError::Store(e) => ApiError::internal(e),
        }
    }
}

/// A wrong option of any kind: 422 naming it.
impl From<crate::session::OptionError> for ApiError {
    fn from(error: crate::session::OptionError) -> ApiError {
        ApiError::invalid(&error.field, &error.message)
    }
}
