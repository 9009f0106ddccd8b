//! Reads a request's body whole before routing, within
//! `http.body_timeout_s` and `max_body_bytes`: a client that stalls
//! mid-body gets `408` and its connection back, instead of holding a
//! handler (and a turn's resources) open. Bodies here are small JSON
//! documents, so nothing streams a request body.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::api::http::error::ApiError;

/// The deadline and the size limit.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    pub timeout: Duration,
    pub max_bytes: usize,
}

/// The request with its body read whole, or the response that refuses it.
pub async fn read_whole(limits: BodyLimits, request: Request) -> Result<Request, Response> {
    if matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    ) || crate::api::routes::workspace::streams_body(request.method(), request.uri().path())
        || crate::api::routes::workspace::form::streams_form(
            request.method(),
            request.uri().path(),
            request.headers(),
        )
    {
        return Ok(request);
    }
    let (parts, body) = request.into_parts();
    let mut read = std::pin::pin!(axum::body::to_bytes(body, limits.max_bytes));
    // A small body has mostly arrived with its head: read it without
    // arming a timer.
    let read = match futures::poll!(read.as_mut()) {
        std::task::Poll::Ready(read) => Ok(read),
        std::task::Poll::Pending => tokio::time::timeout(limits.timeout, read).await,
    };
    let bytes = match read {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            return Err(if too_large {
                ApiError::body_too_large(Some(limits.max_bytes))
            } else {
                ApiError::bad_request(format!("cannot read the request body: {e}"))
            }
            .into_response());
        }
        Err(_) => {
            let mut response = ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the request body did not arrive within {} s (http.body_timeout_s)",
                    limits.timeout.as_secs()
                ),
            )
            .into_response();
            // The rest of the body may never come: do not wait for it.
            response.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
            return Err(response);
        }
    };
    Ok(Request::from_parts(parts, Body::from(bytes)))
}
