//! Operations: liveness and readiness, Prometheus metrics and the OpenAPI
//! document. `/health` and `/ready` need no key: orchestrators' probes
//! carry none.

use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::{Extension, Json};
use serde::Serialize;
use utoipa::{OpenApi, ToSchema};

use crate::api::ApiDoc;
use crate::api::http::auth::Caller;
use crate::api::http::state::AppState;

#[derive(Serialize, ToSchema)]
pub struct Health {
    pub status: String,
    pub version: String,
    pub uptime_s: u64,
    /// `null` while the default model is the first one a provider lists
    /// and it has not answered yet.
    pub default_model: Option<String>,
}

/// Liveness and basic facts: `200` while the process serves, draining
/// included (a liveness probe must not restart a replica that is finishing
/// its turns).
#[utoipa::path(get, path = "/health", security(()), responses((status = 200, body = Health)))]
pub async fn health(State(state): State<AppState>) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        uptime_s: state.started.elapsed().as_secs(),
        default_model: state.models.default_model().map(str::to_owned),
    })
}

/// How long `/ready` waits for the store and the bus: a probe's own
/// timeout is a second or more, and a backend slower than this is as good
/// as down for turns.
const READY_TIMEOUT: Duration = Duration::from_millis(800);

/// What one readiness check found.
#[derive(Serialize, ToSchema, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    Ok,
    Failed,
    TimedOut,
}

#[derive(Serialize, ToSchema)]
pub struct Readiness {
    /// `ready`, or `not_ready` with the reason in the fields below.
    pub status: &'static str,
    pub store: Check,
    pub bus: Check,
    /// The replica was told to stop: it finishes its running turns and
    /// takes no new ones.
    pub draining: bool,
}

/// Runs one check within [`READY_TIMEOUT`]; a failure is logged, the answer
/// names only what failed.
async fn check<E: std::fmt::Display>(
    what: &str,
    ping: impl std::future::Future<Output = Result<(), E>>,
) -> Check {
    match tokio::time::timeout(READY_TIMEOUT, ping).await {
        Ok(Ok(())) => Check::Ok,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness: the {what} failed");
            Check::Failed
        }
        Err(_) => {
            tracing::warn!("readiness: the {what} did not answer within {READY_TIMEOUT:?}");
            Check::TimedOut
        }
    }
}

/// Readiness: `200` when the store and the bus answer and the replica is
/// not draining; `503` naming what failed otherwise, so a load balancer
/// sends turns elsewhere.
#[utoipa::path(get, path = "/ready", security(()), responses(
    (status = 200, body = Readiness, description = "Takes turns"),
    (status = 503, body = Readiness, description = "Store or bus unreachable, or draining"),
))]
pub async fn ready(State(state): State<AppState>) -> (StatusCode, Json<Readiness>) {
    let (store, bus) = tokio::join!(
        check("store", state.store.ping()),
        check("bus", state.bus.ping())
    );
    let draining = state.sessions.is_draining();
    let ready = store == Check::Ok && bus == Check::Ok && !draining;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let readiness = Readiness {
        status: if ready { "ready" } else { "not_ready" },
        store,
        bus,
        draining,
    };
    (status, Json(readiness))
}

/// The metrics in OpenMetrics text, or in Prometheus' older text format
/// (0.0.4) for a client that asks for `text/plain` and not OpenMetrics; a
/// key that does not administer sees only its own series of those
/// labelled by key.
#[utoipa::path(get, path = "/metrics", responses((status = 200,
    description = "OpenMetrics text (application/openmetrics-text; version=1.0.0), or with Accept: text/plain alone the Prometheus text format 0.0.4",
    content((String = "application/openmetrics-text"), (String = "text/plain")))))]
pub async fn metrics(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: axum::http::HeaderMap,
) -> impl IntoResponse {
    if let Some(sandboxes) = &state.sandboxes {
        state
            .metrics
            .sandboxes_live
            .set(sandboxes.live_count() as i64);
    }
    let text = state.metrics.render();
    // A key's usage is its own: another key sees only its own series.
    let text = if caller.admin {
        text
    } else {
        let name = state.quotas.table().name(caller.owner());
        own_series(&text, &name)
    };
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if accept.contains("text/plain") && !accept.contains("application/openmetrics-text") {
        return (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text_format(&text),
        );
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
}

/// OpenMetrics text as Prometheus' text format 0.0.4: a counter's family
/// is named as its samples (`_total`), and the `# UNIT` and `# EOF` lines,
/// which that format has not, are left out.
fn text_format(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut text = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let described = ["# HELP ", "# TYPE "].into_iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        text.push_str(described.as_deref().unwrap_or(line));
        text.push('\n');
    }
    text
}

/// `text` (Prometheus exposition) without the samples labelled with a key
/// other than `key` (by its configured name).
fn own_series(text: &str, key: &str) -> String {
    let own = format!("key=\"{}\"", escape_label(key));
    let mut kept = String::with_capacity(text.len());
    for line in text.lines() {
        let other_key = !line.starts_with('#')
            && line.split_once('{').is_some_and(|(_, labels)| {
                labels
                    .split(',')
                    .map(str::trim_start)
                    .any(|label| label.starts_with("key=\"") && !label.starts_with(&own))
            });
        if !other_key {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

/// A label value as the exposition writes it.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", responses((status = 200, description = "OpenAPI 3.1 document")))]
pub async fn openapi(State(state): State<AppState>) -> Json<serde_json::Value> {
    let kinds = state.sessions.tasks().kinds();
    let max_forks = state.config.agent.max_forks;
    Json(crate::api::constraints::document(
        ApiDoc::openapi(),
        &kinds,
        max_forks,
    ))
}

#[cfg(test)]
mod tests {
    use super::text_format;

    #[test]
    fn openmetrics_becomes_the_older_text_format() {
        let openmetrics = "# HELP turns Turns run.\n# TYPE turns counter\n# UNIT turns turns\nturns_total{kind=\"agent\"} 3\n\
                           # HELP live Live.\n# TYPE live gauge\nlive 1\n# EOF\n";
        assert_eq!(
            text_format(openmetrics),
            "# HELP turns_total Turns run.\n# TYPE turns_total counter\nturns_total{kind=\"agent\"} 3\n\
             # HELP live Live.\n# TYPE live gauge\nlive 1\n"
        );
    }
}
