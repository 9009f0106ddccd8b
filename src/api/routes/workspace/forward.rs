//! A live-workspace request (an upload, a download without `at_seq`, a
//! file or a listing) that reached a replica which does not hold the
//! session's sandbox, passed on to the replica that does, at the URL it
//! advertised ([`crate::tools::remote::advertised`]), with its answer
//! streamed back: the client sees one server. A request passed on once is
//! never passed on again; a replica that advertised no URL leaves a 409
//! naming it.

use std::sync::LazyLock;

use axum::body::Body;
use axum::extract::{FromRequestParts, OriginalUri};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::Response;
use futures::TryStreamExt;

use super::Target;
use crate::agent::tools::NotHeldHere;
use crate::api::http::error::ApiError;
use crate::api::http::state::AppState;
use crate::tools::remote::advertised;

/// Marks a request one replica passed on to another.
const FORWARDED: &str = "conclave-forwarded";
/// The request headers passed on (`Host` too: the replica it reached
/// accepted it, and the one passed to checks it the same way); the
/// answer's are chosen as carefully.
const ASKED: [header::HeaderName; 5] = [
    header::HOST,
    header::AUTHORIZATION,
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
    header::ACCEPT,
];
const ANSWERED: [header::HeaderName; 3] = [
    header::CONTENT_TYPE,
    header::CONTENT_DISPOSITION,
    header::CONTENT_LENGTH,
];

/// Replicas talk to each other directly, never through a proxy the
/// process's environment names.
static CLIENT: LazyLock<reqwest::Client> = LazyLock::new(|| {
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(std::time::Duration::from_secs(5))
        .build()
        .unwrap_or_default()
});

/// What a request needs to be sent again.
pub struct Asked {
    method: Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
}

impl<S: Send + Sync> FromRequestParts<S> for Asked {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Asked, Self::Rejection> {
        let OriginalUri(uri) = OriginalUri::from_request_parts(parts, state).await?;
        Ok(Asked {
            method: parts.method.clone(),
            uri,
            headers: parts.headers.clone(),
        })
    }
}

/// The URL of the replica that answers this request for the target's
/// live workspace; `None`: this one (which now holds the sandbox, as a
/// first tool call would make it). A 409 when the holder cannot be
/// reached from here.
pub(super) async fn elsewhere(
    state: &AppState,
    target: &Target<'_>,
    asked: &Asked,
) -> Result<Option<String>, ApiError> {
    let replica = match state.tools.hold_workspace(target.session.id).await {
        Ok(()) => return Ok(None),
        Err(NotHeldHere::Replica(replica)) => replica,
        Err(unknown) => return Err(not_held(target.session.id, unknown)),
    };
    if !asked.headers.contains_key(FORWARDED) {
        match advertised::url_of(state.store.as_ref(), &replica).await {
            Ok(Some(url)) => return Ok(Some(url)),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "finding where replica {replica} is reached"),
        }
    }
    Err(not_held(target.session.id, NotHeldHere::Replica(replica)))
}

/// Sends the request to `url` and streams its answer back.
pub(super) async fn pass_on(
    state: &AppState,
    url: &str,
    asked: Asked,
    body: Body,
) -> Result<Response, ApiError> {
    let path = asked
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut request = CLIENT.request(asked.method, format!("{url}{path}"));
    for name in ASKED {
        if let Some(value) = asked.headers.get(&name) {
            request = request.header(name, value);
        }
    }
    let instance = state
        .sandboxes
        .as_ref()
        .map(|s| s.instance().to_owned())
        .unwrap_or_default();
    let answer = request
        .header(FORWARDED, instance)
        .body(reqwest::Body::wrap_stream(body.into_data_stream()))
        .send()
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                "replica_unreachable",
                format!("the replica holding the session's sandbox, at {url}, did not answer: {e}"),
            )
        })?;
    let mut response = Response::builder().status(answer.status().as_u16());
    for name in ANSWERED {
        if let Some(value) = answer.headers().get(&name) {
            response = response.header(name, value);
        }
    }
    let stream = answer.bytes_stream().map_err(std::io::Error::other);
    response
        .body(Body::from_stream(stream))
        .map_err(ApiError::internal)
}

/// The answer for the live workspace of a sandbox this replica cannot
/// reach: a 409 when another replica holds it and the request cannot be
/// passed on to it, a 503 when the store cannot say who holds it.
pub(super) fn not_held(session: uuid::Uuid, why: NotHeldHere) -> ApiError {
    match why {
        NotHeldHere::Replica(replica) => ApiError::new(
            StatusCode::CONFLICT,
            "sandbox_elsewhere",
            format!(
                "session {session}'s sandbox is on replica {replica}, which serves it and \
                 advertised no URL to pass this request on to (cluster.advertise_url): read a \
                 turn end's snapshot with at_seq, or send this request to that replica"
            ),
        ),
        unknown => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            format!("session {session}: {unknown}; retry"),
        ),
    }
}
