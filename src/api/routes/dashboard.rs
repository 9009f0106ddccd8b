//! The browser dashboard: `static/` embedded in the binary at build time
//! (rust-embed), served with an ETag (a `304` when the browser has it),
//! `Cache-Control: no-cache` so an upgraded server is never shadowed by a
//! stale file, gzip or brotli as the browser accepts, and a content
//! security policy that lets the page talk to this server only.
//!
//! `GET /` and every `GET /ui/…` answer `index.html` (the page routes
//! itself); `GET /static/PATH` answers `static/PATH`. None needs a key:
//! the files hold no data, and the page asks for a key before it reads any.
//! `GET /auth/me` and `POST /auth/ticket` are the page's two auth calls.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json};
use serde_json::{Value, json};
use tower_http::compression::CompressionLayer;

use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::api::http::state::AppState;
use crate::api::http::tickets::TICKET_TTL;

#[derive(rust_embed::Embed)]
#[folder = "static/"]
struct Assets;

/// The page's only sources are this server: no inline script, no CDN, no
/// frame around it.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                   img-src 'self' data:; connect-src 'self'; object-src 'none'; \
                   base-uri 'none'; frame-ancestors 'none'; form-action 'self'";

/// The dashboard's routes, compressed (the API's streams are not: a
/// compressor would hold their events back).
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(index))
        .route("/ui", get(index))
        .route("/ui/{*view}", get(index))
        .route("/static/{*path}", get(asset))
        .layer(CompressionLayer::new().gzip(true).br(true))
}

async fn index(headers: HeaderMap) -> Response {
    file("index.html", &headers)
}

async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    file(&path, &headers)
}

/// One embedded file, or `304` when the browser's copy is current.
fn file(path: &str, headers: &HeaderMap) -> Response {
    let Some(found) = Assets::get(path) else {
        return ApiError::not_found(format!("no file {path} in the dashboard")).into_response();
    };
    let etag = format!("\"{}\"", hex::encode(&found.metadata.sha256_hash()[..16]));
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|tag| tag.trim() == etag));
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        found.data.into_owned().into_response()
    };
    let set = response.headers_mut();
    if !fresh {
        let mime = found.metadata.mimetype();
        if let Ok(value) = HeaderValue::from_str(mime) {
            set.insert(header::CONTENT_TYPE, value);
        }
    }
    if let Ok(value) = HeaderValue::from_str(&etag) {
        set.insert(header::ETAG, value);
    }
    set.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    set.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    set.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    set.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// `GET /auth/me`: whether the server wants keys, and whether the caller's
/// is an admin's. Without a valid key on a keyed server the auth layer
/// answers `401` first. A key sent to a server without keys is ignored,
/// and `note` says so: the caller is not who it may think it is.
#[utoipa::path(get, path = "/auth/me",
    responses((status = 200, description = "{auth, admin, note?}"), (status = 401, body = crate::api::http::error::ErrorBody)))]
pub async fn me(
    axum::extract::State(state): axum::extract::State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
) -> Json<Value> {
    let auth = state.keys.enabled();
    let mut me = json!({"auth": auth, "admin": caller.admin});
    if !auth && headers.contains_key(header::AUTHORIZATION) {
        me["note"] = json!(
            "this server has no API keys (api_keys unset): the key sent was ignored, and every \
             caller shares the same sessions"
        );
    }
    Json(me)
}

/// `POST /auth/ticket`: a single-use ticket for one WebSocket
/// (`?ticket=`), valid for 30 seconds, standing for the caller's key.
#[utoipa::path(post, path = "/auth/ticket",
    request_body(content = Object, description = "an empty object: {}"),
    responses((status = 200, description = "{ticket, expires_in_s}"), (status = 429, body = crate::api::http::error::ErrorBody)))]
pub async fn ticket(
    axum::extract::State(state): axum::extract::State<AppState>,
    Extension(caller): Extension<Caller>,
    body: crate::api::http::extract::JsonObject,
) -> Result<Json<Value>, ApiError> {
    body.deny_rest()?;
    let issued = state
        .keys
        .issue_ticket(&caller)
        .await
        .map_err(ApiError::internal)?;
    let ticket = issued.ok_or_else(|| {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_tickets",
            "this key asked for as many tickets as it may in 30 s; use them or wait",
        )
    })?;
    Ok(Json(
        json!({"ticket": ticket, "expires_in_s": TICKET_TTL.as_secs()}),
    ))
}
