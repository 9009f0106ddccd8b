//! HTTP transport. Every axum type of the server lives under this module.
//!
//! - [`router`]: the routes, the body limit, auth and JSON fallbacks.
//! - [`error`]: `ApiError`, the one error every handler returns.
//! - [`extract`]: JSON body and query extractors with `ApiError` rejections.
//! - [`auth`]: bearer keys and the caller identity.
//! - [`stream`]: events as NDJSON or SSE.
//! - [`agent`], [`ws`], [`ops`], [`gateway`]: the handlers.

pub mod agent;
pub mod auth;
pub mod error;
pub mod extract;
pub mod gateway;
pub mod ops;
pub mod stream;
pub mod ws;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use utoipa::OpenApi;

use crate::state::AppState;
use error::ApiError;

#[derive(OpenApi)]
#[openapi(
    info(title = "Conclave", description = "Streaming agent server with sandbox isolation"),
    paths(
        agent::run, agent::create_session, agent::message, agent::interrupt, agent::status,
        agent::events, agent::delete, agent::list, ws::upgrade, ops::health, ops::metrics, ops::openapi,
        gateway::chat, gateway::completions, gateway::models, gateway::meta_chat, gateway::meta_completions,
        gateway::meta_models, gateway::replicas, gateway::add_replica, gateway::remove_replica,
        gateway::replica_action, gateway::traces
    ),
    components(schemas(crate::agent::events::Event, crate::agent::events::EventKind)),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{
            HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
        };
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        openapi.security = Some(vec![SecurityRequirement::new(
            "bearer",
            Vec::<String>::new(),
        )]);
    }
}

pub fn router(state: AppState) -> Router {
    let limit = state.config.max_body_bytes;
    let mut router = Router::new();
    if let Some(host) = &state.mcp {
        let allowed: Arc<[String]> = state.config.mcp.allowed_hosts.clone().into();
        let mcp = Router::new()
            .nest_service(
                "/mcp",
                crate::mcp::http_service(
                    host.clone(),
                    state.config.mcp.allowed_hosts.clone(),
                    state.stop.child_token(),
                ),
            )
            .layer(axum::middleware::from_fn_with_state(allowed, check_host));
        router = router.merge(mcp);
    }
    router
        .route("/agent/run", post(agent::run))
        .route("/agent/session", post(agent::create_session))
        .route("/agent/session/{id}/message", post(agent::message))
        .route("/agent/session/{id}/interrupt", post(agent::interrupt))
        .route("/agent/session/{id}/status", get(agent::status))
        .route("/agent/session/{id}/events", get(agent::events))
        .route("/agent/session/{id}", delete(agent::delete))
        .route("/agent/sessions", get(agent::list))
        .route("/agent/ws", get(ws::upgrade))
        .route("/v1/chat/completions", post(gateway::chat))
        .route("/v1/completions", post(gateway::completions))
        .route("/v1/models", get(gateway::models))
        .route("/meta/{slug}/v1/chat/completions", post(gateway::meta_chat))
        .route(
            "/meta/{slug}/v1/completions",
            post(gateway::meta_completions),
        )
        .route("/meta/{slug}/v1/models", get(gateway::meta_models))
        .route(
            "/gateway/replicas",
            get(gateway::replicas).post(gateway::add_replica),
        )
        .route("/gateway/replicas/{id}", delete(gateway::remove_replica))
        .route(
            "/gateway/replicas/{id}/{action}",
            post(gateway::replica_action),
        )
        .route("/gateway/traces", get(gateway::traces))
        .route("/health", get(ops::health))
        .route("/metrics", get(ops::metrics))
        .route("/openapi.json", get(ops::openapi))
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "method not allowed on this route",
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_key,
        ))
        .layer(DefaultBodyLimit::max(limit))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

/// Refuses `/mcp` requests whose `Host` is not in `mcp.allowed_hosts` (a
/// name matches any port), so a web page on another name that resolves to
/// this server (DNS rebinding) cannot drive the tools. rmcp checks the same
/// again; this one answers in the API's JSON error format.
async fn check_host(
    State(allowed): State<Arc<[String]>>,
    request: Request,
    next: Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()))
        .unwrap_or_default()
        .to_string();
    let name = host_name(&host);
    if allowed.iter().any(|a| a.eq_ignore_ascii_case(name)) {
        return next.run(request).await;
    }
    ApiError::new(
        StatusCode::FORBIDDEN,
        "host_not_allowed",
        format!("/mcp does not answer for Host {host:?}; add the name to mcp.allowed_hosts"),
    )
    .into_response()
}

/// The name of a `Host` value: without its port, and without the brackets
/// of an IPv6 address.
fn host_name(host: &str) -> &str {
    match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    }
}

#[cfg(test)]
mod tests {
    use super::host_name;

    #[test]
    fn host_names_lose_port_and_brackets() {
        assert_eq!(host_name("localhost:8080"), "localhost");
        assert_eq!(host_name("localhost"), "localhost");
        assert_eq!(host_name("[::1]:80"), "::1");
        assert_eq!(host_name("[::1]"), "::1");
        assert_eq!(host_name("127.0.0.1:1"), "127.0.0.1");
        assert_eq!(host_name(""), "");
    }
}
