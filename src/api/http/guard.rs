//! The one middleware every request passes on its way to a route, doing in
//! order what would otherwise be six layers (each a boxed future and a
//! clone of the rest of the stack, for every call the gateway forwards):
//!
//! 0. the request keeps the client's `x-request-id` or gets a new one (a
//!    UUID), which its response carries back;
//! 1. its access-log line begins ([`access_log`](crate::api::http::access_log));
//! 2. the browser checks ([`browser`](crate::api::http::browser));
//! 3. the caller is identified by its key or ticket
//!    ([`auth`](crate::api::http::auth));
//! 4. a body is read whole within its deadline and limit
//!    ([`body`](crate::api::http::body));
//! 5. the route answers; an error met before a gRPC service is given gRPC's
//!    form ([`grpc`](crate::api::grpc::bus)) and the log line is written.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{auth, body};
use crate::api::grpc::{bus as grpc, error as grpc_error};
use crate::api::http::access_log::Line;
use crate::api::http::body::BodyLimits;
use crate::api::http::browser::{self, BrowserPolicy};
use crate::api::http::state::AppState;

/// What the checks need.
pub struct Guard {
    pub state: AppState,
    pub policy: BrowserPolicy,
    pub limits: BodyLimits,
}

const X_REQUEST_ID: &str = "x-request-id";

pub async fn run(State(guard): State<Arc<Guard>>, mut request: Request, next: Next) -> Response {
    let id = request.headers().get(X_REQUEST_ID).cloned().or_else(|| {
        let mut text = uuid::Uuid::encode_buffer();
        let id = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut text);
        let id = HeaderValue::from_str(id).ok()?;
        request.headers_mut().insert(X_REQUEST_ID, id.clone());
        Some(id)
    });
    let line = Line::start(&request);
    let grpc = grpc::is_grpc(request.headers());
    let mut response = match admit(&guard, request).await {
        Ok(request) => next.run(request).await,
        Err(refused) => refused,
    };
    if grpc {
        response = grpc_error::error_as_status(response).await;
    }
    if let Some(line) = line {
        line.finish(&response);
    }
    if let Some(id) = id {
        response.headers_mut().entry(X_REQUEST_ID).or_insert(id);
    }
    response
}

/// The request, checked, identified and with its body read; or the answer
/// that refuses it.
async fn admit(guard: &Guard, request: Request) -> Result<Request, Response> {
    if let Some(refused) = browser::refusal(&guard.policy, &request) {
        return Err(refused.into_response());
    }
    let request = auth::identify(&guard.state, request)
        .await
        .map_err(IntoResponse::into_response)?;
    body::read_whole(guard.limits, request).await
}
