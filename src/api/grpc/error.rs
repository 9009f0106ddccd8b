//! Where errors take gRPC's form, for both gRPC services (the bus and the
//! orchestrator): the errors of the parts they serve map to status codes
//! here, as `error.rs` maps them for HTTP, and an HTTP refusal met before
//! a service (auth, the browser checks, limits) becomes a status too.

use tonic::Status;

use crate::bus::BusError;
use crate::bus::kv::KvError;
use crate::deliberation::records::DeliberationError;
use crate::rollout::RolloutError;
use crate::session::SessionError;

impl From<BusError> for Status {
    fn from(error: BusError) -> Status {
        match error {
            BusError::Subject(e) => Status::invalid_argument(e.to_string()),
            BusError::TooLarge { .. } => Status::resource_exhausted(error.to_string()),
            BusError::Closed => Status::unavailable(error.to_string()),
            BusError::Store(e) => internal(e),
            BusError::Quota(e) => Status::resource_exhausted(e.to_string()),
            BusError::Nats(e) => {
                tracing::error!(error = %e, "the NATS bus failed");
                Status::unavailable("the bus is unavailable; see the server log")
            }
        }
    }
}

impl From<KvError> for Status {
    fn from(error: KvError) -> Status {
        match error {
            KvError::BadKey { .. } => Status::invalid_argument(error.to_string()),
            KvError::TooLarge { .. } => Status::resource_exhausted(error.to_string()),
            KvError::Store(e) => internal(e),
            KvError::Quota(e) => Status::resource_exhausted(e.to_string()),
        }
    }
}

impl From<RolloutError> for Status {
    fn from(error: RolloutError) -> Status {
        match error {
            RolloutError::Invalid { .. } => Status::invalid_argument(error.to_string()),
            RolloutError::UnknownModel(_) => Status::not_found(error.to_string()),
            RolloutError::ShuttingDown => Status::unavailable(error.to_string()),
        }
    }
}

impl From<DeliberationError> for Status {
    fn from(error: DeliberationError) -> Status {
        match error {
            DeliberationError::NotFound(_) => Status::not_found(error.to_string()),
            DeliberationError::Session(SessionError::Option(e)) => {
                Status::invalid_argument(e.to_string())
            }
            DeliberationError::Session(SessionError::ShuttingDown) => {
                Status::unavailable(error.to_string())
            }
            other => internal(other),
        }
    }
}

/// A failure of the server itself: logged in full, answered in brief.
fn internal(error: impl std::fmt::Display) -> Status {
    tracing::error!(%error, "internal error");
    Status::internal("internal server error; see the server log")
}

/// Gives an error a gRPC request met before its service (auth, the
/// browser checks, limits) gRPC's form: the status in the headers of an
/// HTTP 200, with the JSON error's message.
pub async fn error_as_status(response: axum::response::Response) -> axum::response::Response {
    if response.status().is_success() {
        return response;
    }
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let message = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("HTTP {status}"));
    refusal(status, &message)
}

fn refusal(status: u16, message: &str) -> axum::response::Response {
    let status = match status {
        401 => Status::unauthenticated(message),
        403 => Status::permission_denied(message),
        404 => Status::unimplemented(message),
        413 => Status::resource_exhausted(message),
        503 => Status::unavailable(message),
        _ => Status::invalid_argument(message),
    };
    let (parts, body) = status.into_http::<tonic::body::Body>().into_parts();
    axum::response::Response::from_parts(parts, axum::body::Body::new(body))
}
