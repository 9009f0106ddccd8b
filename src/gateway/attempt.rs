//! One attempt of a gateway call on a replica, and what makes it a
//! failure worth trying another replica for.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderValue};

use super::pool::{Pool, Replica};
use super::{Endpoint, Gateway, PASSED_ON_ERROR_BODY, client};
use crate::upstream::{bounded_body, retry_after};

impl Gateway {
    /// One attempt: a response to pass on, or a failure worth retrying.
    pub(super) async fn send(
        &self,
        pool: &Pool,
        replica: &Replica,
        endpoint: Endpoint,
        payload: Bytes,
    ) -> Result<http::Response<client::Body>, Failure> {
        // Only for messages: not built for a call that goes well.
        let url = || endpoint.url_on(&replica.url);
        let timeout = Duration::from_secs(pool.config.timeout_s);
        let sent = self.clients.post(replica, endpoint, payload);
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
