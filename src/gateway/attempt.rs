//! One attempt of a gateway call on a replica, and what makes it a
//! failure worth trying another replica for.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderValue};

use super::pool::{Pool, Replica};
use super::{Endpoint, Gateway, GatewayCall, GatewayError, PASSED_ON_ERROR_BODY, Upstream, client};
use crate::telemetry::call::{CallSpan, Outcome};
use crate::telemetry::otel;
use crate::upstream::{bounded_body, retry_after};

impl Gateway {
    /// Runs a call (see `forward_call`) in a span of its own, with a
    /// child span for each attempt when it takes more than one.
    pub async fn forward(&self, call: GatewayCall) -> Result<Upstream, GatewayError> {
        let model = call.body.get::<String>("model");
        let mut span = if otel::exporting() {
            CallSpan::start(
                model.as_deref().unwrap_or_default(),
                call.session_id.as_deref(),
                &call.parent,
            )
        } else {
            CallSpan::off()
        };
        let forwarded = self.forward_call(call, model, &mut span).await;
        match &forwarded {
            Ok(upstream) => {
                // As an attempt's span says it: the status code.
                let error = upstream
                    .status
                    .is_server_error()
                    .then(|| upstream.status.as_str().to_owned().into());
                span.end(Some(&upstream.replica), error);
            }
            Err(e) => span.end(None, Some(error_type(e).into())),
        }
        forwarded
    }

    /// One attempt, the `number`th of its call, traced in `span`.
    pub(super) async fn send(
        &self,
        pool: &Pool,
        replica: &Replica,
        endpoint: Endpoint,
        payload: Bytes,
        number: u32,
        span: &mut CallSpan,
    ) -> Result<http::Response<client::Body>, Failure> {
        let attempt = span.attempt(number, &replica.id, &replica.url, &replica.model);
        let sent = self
            .send_once(pool, replica, endpoint, payload, attempt.context())
            .await;
        let outcome = match &sent {
            Ok(response) => Outcome::Answered(response.status().as_u16()),
            Err(failure) => Outcome::Failed(failure.response.as_ref().map(|r| r.0.as_u16())),
        };
        span.attempt_ended(attempt, outcome);
        sent
    }

    /// One attempt: a response to pass on, or a failure worth retrying.
    async fn send_once(
        &self,
        pool: &Pool,
        replica: &Replica,
        endpoint: Endpoint,
        payload: Bytes,
        trace: Option<&opentelemetry::Context>,
    ) -> Result<http::Response<client::Body>, Failure> {
        // Only for messages: not built for a call that goes well.
        let url = || endpoint.url_on(&replica.url);
        let timeout = Duration::from_secs(pool.config.timeout_s);
        let sent = self.clients.post(replica, endpoint, payload, trace);
        let response = match tokio::time::timeout(timeout, sent).await {
            Err(_) => {
                return Err(Failure::message(format!(
                    "{}: no response within {}s",
                    url(),
                    pool.config.timeout_s
                )));
            }
            Ok(Err(e)) => return Err(Failure::message(format!("{}: {e}", url()))),
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if !(status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS) {
            return Ok(response);
        }
        let cooldown = retry_after(response.headers(), SystemTime::now())
            .map(|d| d.max(Duration::from_secs(pool.config.cooldown_s)));
        let content_type = response.headers().get(CONTENT_TYPE).cloned();
        // Kept to pass on if this was the last attempt; bounded, as an
        // upstream's error body can be anything.
        let (body, _) = bounded_body(response.into_body(), PASSED_ON_ERROR_BODY).await;
        Err(Failure {
            message: format!(
                "{} answered {status}: {}",
                url(),
                String::from_utf8_lossy(&body[..body.len().min(300)])
            ),
            cooldown,
            response: Some((status, content_type, body)),
        })
    }
}

/// `error.type` of a call's span: the variant's name, as OpenTelemetry
/// wants a low-cardinality class of error.
fn error_type(error: &GatewayError) -> &'static str {
    match error {
        GatewayError::BadRequest(_) => "bad_request",
        GatewayError::UnknownModel { .. } => "unknown_model",
        GatewayError::NoReplica(_) => "no_replica",
        GatewayError::EmptyPool(_) => "empty_pool",
        GatewayError::UnknownPool(_) => "unknown_pool",
        GatewayError::Unreachable { .. } => "unreachable",
        GatewayError::UnknownReplica(_) => "unknown_replica",
        GatewayError::Conflict(_) => "conflict",
        GatewayError::UnknownResponse(_) => "unknown_response",
        GatewayError::NotServed { .. } => "not_served",
        GatewayError::Paused { .. } => "paused",
        GatewayError::StillBusy { .. } => "still_busy",
    }
}

/// A failed attempt: why, how long to cool the replica down, and the
/// upstream answer to pass on if it was the last attempt.
pub(super) struct Failure {
    pub(super) message: String,
    pub(super) cooldown: Option<Duration>,
    pub(super) response: Option<(StatusCode, Option<HeaderValue>, Bytes)>,
}

impl Failure {
    pub(super) fn message(message: String) -> Failure {
        Failure {
            message,
            cooldown: None,
            response: None,
        }
    }
}
