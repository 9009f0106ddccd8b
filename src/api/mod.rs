//! HTTP transport. Every axum type of the server lives under this module.
//!
//! - [`router`]: the routes, the body limit, auth and JSON fallbacks.
//! - [`http`]: the engine room every request passes through (listener,
//!   guard, auth, body, errors, streams, the shared state).
//! - [`routes`]: the resource routes, one file per resource.
//! - [`grpc`]: the gRPC services (the bus, deliberations).
//! - Protocol adapters: [`a2a`] (A2A JSON-RPC), [`agui`] (AG-UI,
//!   `POST /ag-ui/{agent}`), [`langgraph`] (the LangGraph Platform API
//!   under `/langgraph`).

pub mod a2a;
pub mod agui;
mod constraints;
pub mod grpc;
pub mod http;
pub mod langgraph;
pub mod routes;

use http::{body, browser, error, guard, state, traced};
use routes::{
    agent, agent_sessions, agent_ws, agents, approvals, bus, bus_ws, dashboard, deliberations,
    fork, gateway, gateway_weights, health, mcp, orchestrator, rollouts, sandboxes, usage,
    workspace,
};

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use utoipa::OpenApi;

use error::ApiError;
use state::AppState;

#[derive(OpenApi)]
#[openapi(
    info(title = "Conclave", description = "Streaming agent server with sandbox isolation"),
    paths(
        agent::run, agent::create_session, agent::message, agent::interrupt, agent::compact, agent::status,
        agent::events, agent::delete, agent_sessions::list, fork::fork, fork::session_snapshots, fork::name,
        fork::named, fork::delete, approvals::post, approvals::list, agent_ws::upgrade, health::health, health::ready, health::metrics, health::openapi,
        gateway::chat, gateway::completions, gateway::models, gateway::meta_chat, gateway::meta_completions,
        gateway::meta_models, gateway::responses, gateway::embeddings, gateway::tokenize,
        gateway::detokenize, gateway::meta_responses, gateway::meta_embeddings,
        gateway::meta_tokenize, gateway::meta_detokenize, gateway::replicas, gateway::add_replica, gateway::remove_replica,
        gateway::replica_action, gateway::remove_pool, gateway::traces, sandboxes::list,
        sandboxes::delete, bus::publish, bus::subscribe, bus::get, bus::put, bus::delete, bus::list,
        bus_ws::upgrade, gateway_weights::begin, gateway_weights::commit, rollouts::start, rollouts::progress,
        deliberations::submit, deliberations::result, deliberations::list, orchestrator::start,
        orchestrator::status, orchestrator::history, orchestrator::resume, orchestrator::fork, orchestrator::cancel,
        orchestrator::active, orchestrator::runs, orchestrator::health, orchestrator::definitions, orchestrator::validate,
        dashboard::me, dashboard::ticket, agents::list, agents::get, agui::run, usage::usage,
        workspace::upload, workspace::put_file, workspace::download, workspace::get_file, workspace::list_root,
        workspace::changes::changes
    ),
    components(schemas(crate::protocol::Event, crate::protocol::EventKind)),
    modifiers(&BearerAuth, &CommonStatuses)
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

/// The statuses every route may answer besides its own: 401 on a server
/// with keys (all but `/health` and `/ready`); 400 where the route reads a
/// body or query parameters (not JSON, a field it cannot read, an unknown
/// parameter); where it reads a body, 413 (past `max_body_bytes`), 415 (not
/// sent as its content type) and 422 (a field it cannot accept).
struct CommonStatuses;

impl utoipa::Modify for CommonStatuses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::ParameterIn;
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let error = |description: &str| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .build()
        };
        for (path, item) in openapi.paths.paths.iter_mut() {
            let public = path == "/health" || path == "/ready";
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ];
            for operation in operations.into_iter().flatten() {
                let body = operation.request_body.is_some();
                let query = operation
                    .parameters
                    .iter()
                    .flatten()
                    .any(|p| matches!(p.parameter_in, ParameterIn::Query));
                let responses = &mut operation.responses.responses;
                let mut add = |status: &str, description: &str| {
                    responses
                        .entry(status.to_owned())
                        .or_insert_with(|| error(description).into());
                };
                if body || query {
                    add(
                        "400",
                        "a body that is not JSON, or a field or query parameter that cannot be read",
                    );
                }
                if body {
                    add("413", "a body past max_body_bytes");
                    add(
                        "415",
                        "a body not sent as the content type the operation reads",
                    );
                    add(
                        "422",
                        "a field of the body that cannot be accepted, named in the message",
                    );
                }
                if !public {
                    add(
                        "401",
                        "the server has API keys and the request carries none of them",
                    );
                }
            }
        }
    }
}

pub fn router(state: AppState) -> Router {
    let limit = state.config.max_body_bytes;
    let guard = Arc::new(guard::Guard {
        state: state.clone(),
        policy: browser::BrowserPolicy::new(&state.config),
        limits: body::BodyLimits {
            timeout: std::time::Duration::from_secs(state.config.http.body_timeout_s),
            max_bytes: limit,
        },
    });
    let mut router = Router::new();
    if let Some(mcp) = mcp::routes(&state) {
        router = router.merge(mcp);
    }
    router
        .merge(dashboard::router())
        .route("/auth/me", get(dashboard::me))
        .route("/auth/ticket", post(dashboard::ticket))
        .route("/agent/run", post(workspace::form::run))
        .route("/agent/session", post(workspace::form::create_session))
        .route("/agent/session/{id}/message", post(agent::message))
        .route("/agent/session/{id}/interrupt", post(agent::interrupt))
        .route("/agent/session/{id}/compact", post(agent::compact))
        .route("/agent/session/{id}/status", get(agent::status))
        .route("/agent/session/{id}/events", get(agent::events))
        .route("/agent/session/{id}", delete(agent::delete))
        .route(
            "/agent/session/{id}/workspace",
            get(workspace::download).put(workspace::upload),
        )
        .route("/agent/session/{id}/files/", get(workspace::list_root))
        .route(
            "/agent/session/{id}/changes",
            get(workspace::changes::changes),
        )
        .route(
            "/agent/session/{id}/files/{*path}",
            get(workspace::get_file).put(workspace::put_file),
        )
        .route("/agent/sessions", get(agent_sessions::list))
        .route("/agents", get(agents::list))
        .route("/agents/{name}", get(agents::get))
        .route("/ag-ui/{agent}", post(agui::run))
        .route("/agent/session/{id}/fork", post(fork::fork))
        .route(
            "/agent/session/{id}/snapshots",
            get(fork::session_snapshots),
        )
        .route("/sandboxes/snapshots", post(fork::name).get(fork::named))
        .route("/sandboxes/snapshots/{id}", delete(fork::delete))
        .route(
            "/agent/session/{id}/approvals/{call_id}",
            post(approvals::post),
        )
        .route("/agent/approvals", get(approvals::list))
        .route("/agent/ws", get(agent_ws::upgrade))
        .route("/v1/models", get(gateway::models))
        .route("/meta/{slug}/v1/models", get(gateway::meta_models))
        .route(
            "/gateway/replicas",
            get(gateway::replicas).post(gateway::add_replica),
        )
        .route("/gateway/replicas/{id}", delete(gateway::remove_replica))
        .route("/gateway/pools/{model}", delete(gateway::remove_pool))
        .route(
            "/gateway/pools/{model}/weights/begin",
            post(gateway_weights::begin),
        )
        .route(
            "/gateway/pools/{model}/weights/commit",
            post(gateway_weights::commit),
        )
        .route(
            "/gateway/replicas/{id}/{action}",
            post(gateway::replica_action),
        )
        .route("/gateway/traces", get(gateway::traces))
        .route("/usage", get(usage::usage))
        .route("/bus/publish/{*subject}", post(bus::publish))
        .route("/bus/subscribe", get(bus::subscribe))
        .route("/bus/ws", get(bus_ws::upgrade))
        .route("/kv", get(bus::list))
        .route(
            "/kv/{*key}",
            get(bus::get).put(bus::put).delete(bus::delete),
        )
        .route_service(
            "/conclave.bus.v1.Bus/{*method}",
            grpc::bus::service(state.clone()),
        )
        .route_service(
            "/conclave.orchestrator.v1.Orchestrator/{*method}",
            grpc::deliberations::service(state.clone()),
        )
        .route(
            "/deliberations",
            post(deliberations::submit).get(deliberations::list),
        )
        .route("/deliberations/{task_id}", get(deliberations::result))
        .route("/orchestrator/pipeline/start", post(orchestrator::start))
        .route(
            "/orchestrator/pipeline/status/{thread_id}",
            get(orchestrator::status),
        )
        .route(
            "/orchestrator/pipeline/history/{thread_id}",
            get(orchestrator::history),
        )
        .route(
            "/orchestrator/pipeline/resume/{thread_id}",
            post(orchestrator::resume),
        )
        .route(
            "/orchestrator/pipeline/fork/{thread_id}",
            post(orchestrator::fork),
        )
        .route(
            "/orchestrator/pipeline/cancel/{thread_id}",
            post(orchestrator::cancel),
        )
        .route("/orchestrator/runs", get(orchestrator::runs))
        .route("/orchestrator/runs/active", get(orchestrator::active))
        .route("/orchestrator/health", get(orchestrator::health))
        .route("/orchestrator/pipelines", get(orchestrator::definitions))
        .route(
            "/orchestrator/pipelines/validate",
            post(orchestrator::validate),
        )
        .nest("/langgraph", langgraph::router())
        .merge(a2a::router())
        .route("/rollouts", post(rollouts::start))
        .route("/rollouts/{id}", get(rollouts::progress))
        .route("/sandboxes", get(sandboxes::list))
        .route("/sandboxes/{id}", delete(sandboxes::delete))
        .route("/health", get(health::health))
        .route("/ready", get(health::ready))
        .route("/metrics", get(health::metrics))
        .route("/openapi.json", get(health::openapi))
        .route_layer(axum::middleware::from_fn(traced::run))
        // The calls the gateway forwards: each call's span is made by the
        // gateway, as the request's span (the hot path pays one span).
        .route("/v1/chat/completions", post(gateway::chat))
        .route("/v1/completions", post(gateway::completions))
        .route("/meta/{slug}/v1/chat/completions", post(gateway::meta_chat))
        .route(
            "/meta/{slug}/v1/completions",
            post(gateway::meta_completions),
        )
        .route("/v1/responses", post(gateway::responses))
        .route("/v1/embeddings", post(gateway::embeddings))
        .route("/tokenize", post(gateway::tokenize))
        .route("/detokenize", post(gateway::detokenize))
        .route("/meta/{slug}/v1/responses", post(gateway::meta_responses))
        .route("/meta/{slug}/v1/embeddings", post(gateway::meta_embeddings))
        .route("/meta/{slug}/tokenize", post(gateway::meta_tokenize))
        .route("/meta/{slug}/detokenize", post(gateway::meta_detokenize))
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "method not allowed on this route",
            )
        })
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(guard, guard::run))
        .with_state(state)
}

/// What connections past the listener's caps get: `/health` and `/ready`
/// (probes must see a busy replica alive), and `503` for everything else.
pub fn overflow_router(state: AppState) -> Router {
    let policy = Arc::new(browser::BrowserPolicy::new(&state.config));
    Router::new()
        .route("/health", get(health::health))
        .route("/ready", get(health::ready))
        .fallback(|| async {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_busy",
                "the server holds as many connections as it serves; try again shortly",
            )
        })
        .layer(axum::middleware::from_fn_with_state(policy, browser::check))
        .with_state(state)
}
