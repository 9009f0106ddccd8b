//! Operations: health, Prometheus metrics and the OpenAPI document.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa::{OpenApi, ToSchema};

use super::ApiDoc;
use super::state::AppState;

#[derive(Serialize, ToSchema)]
pub struct Health {
    pub status: String,
    pub version: String,
    pub uptime_s: u64,
    pub default_model: String,
}

/// Liveness and basic facts.
#[utoipa::path(get, path = "/health", responses((status = 200, body = Health)))]
pub async fn health(State(state): State<AppState>) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        uptime_s: state.started.elapsed().as_secs(),
        default_model: state.models.default_model().to_string(),
    })
}

/// Prometheus text exposition.
#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text format", content_type = "text/plain")))]
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    if let Some(sandboxes) = &state.sandboxes {
        state
            .metrics
            .sandboxes_live
            .set(sandboxes.live_count() as i64);
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", responses((status = 200, description = "OpenAPI 3.1 document")))]
pub async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
