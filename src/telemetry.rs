//! Logging set-up and the Prometheus metrics of the server.
//!
//! [`Metrics`] owns its own registry (no global recorder), so every server
//! in a process, tests included, counts on its own.

use std::sync::Mutex;

use crate::sync::lock;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub mod call;
pub mod otel;
pub mod spans;

/// Logs to stderr; `RUST_LOG` filters (default `info`, rmcp's at `warn`).
pub fn init_logging() {
    // With export off there is no exporter to fail.
    let _ = init(&crate::config::TelemetryConfig::default());
}

/// Logs to stderr as [`init_logging`] does and, when `telemetry` names an
/// OTLP endpoint, exports the spans of turns and gateway calls there. The exporter returned
/// must be shut down at exit to send the spans still buffered.
pub fn init(telemetry: &crate::config::TelemetryConfig) -> Result<Option<otel::Exporter>, String> {
    use tracing_subscriber::filter::{FilterExt, filter_fn};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};

    let filter = EnvFilter::try_from_default_env()
        // rmcp logs every MCP handshake's whole parameters at INFO.
        .unwrap_or_else(|_| EnvFilter::new("info,rmcp=warn"));
    // The log is events; spans go to the traces (`otel`).
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter.and(filter_fn(|meta| !meta.is_span())));
    let exporter = otel::exporter(telemetry)?;
    // A second call (tests) keeps the first subscriber.
    let _ = tracing_subscriber::registry().with(log).try_init();
    Ok(exporter)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabel {
    pub model: String,
}

/// A gateway replica and how its call ended (`ok`, `error`, `retried`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaLabel {
    pub pool: String,
    pub replica: String,
    pub outcome: &'static str,
}

/// A class of bus subjects: the durable pattern that keeps them, or
/// `transient`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BusLabel {
    pub class: String,
}

/// A kind of job.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabel {
    pub kind: String,
}

/// A kind of job and how it ended here (`ok`, `failed`, `cancelled`,
/// `handed_back`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobDoneLabel {
    pub kind: String,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabel {
    pub r#type: &'static str,
}

pub struct Metrics {
    registry: Mutex<Registry>,
    /// Sessions loaded in memory.
    pub sessions_live: Gauge,
    pub sessions_created: Counter,
    /// Turns running now.
    pub turns_running: Gauge,
    /// Turns finished, by result status.
    pub turns_finished: Family<StatusLabel, Counter>,
    pub events: Family<EventLabel, Counter>,
    /// Seconds from a model call's start to its end of stream.
    pub model_latency: Family<ModelLabel, Histogram>,
    pub model_errors: Family<ModelLabel, Counter>,
    pub websocket_connections: Gauge,
    /// Sandboxes this server holds (sessions' and the warm pool's), read at
    /// each scrape.
    pub sandboxes_live: Gauge,
    /// Gateway calls by pool, replica and outcome.
    pub gateway_calls: Family<ReplicaLabel, Counter>,
    /// Seconds from a gateway call's start to the end of its response, by
    /// pool and replica (outcome `ok` or `error`).
    pub gateway_latency: Family<ReplicaLabel, Histogram>,
    /// Bus messages published, delivered to subscribers, lost to lagging
    /// subscribers, and kept in the store, by subject class.
    pub bus_published: Family<BusLabel, Counter>,
    pub bus_delivered: Family<BusLabel, Counter>,
    pub bus_lagged: Family<BusLabel, Counter>,
    pub bus_retained: Family<BusLabel, Gauge>,
    /// Rollouts running now.
    pub rollouts_running: Gauge,
    /// Jobs this process is doing now, by kind, and those it did, by kind
    /// and outcome (whichever replica asked for them).
    pub jobs_running: Family<JobLabel, Gauge>,
    pub jobs_done: Family<JobDoneLabel, Counter>,
    /// Jobs this process took after another replica did not finish them.
    pub jobs_taken_over: Family<JobLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("conclave");
        let metrics = Metrics {
            registry: Mutex::new(Registry::default()),
            sessions_live: Gauge::default(),
            sessions_created: Counter::default(),
            turns_running: Gauge::default(),
            turns_finished: Family::default(),
            events: Family::default(),
            model_latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 18))
            }),
            model_errors: Family::default(),
            websocket_connections: Gauge::default(),
            sandboxes_live: Gauge::default(),
            gateway_calls: Family::default(),
            gateway_latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0005, 2.0, 20))
            }),
            bus_published: Family::default(),
            bus_delivered: Family::default(),
            bus_lagged: Family::default(),
            bus_retained: Family::default(),
            rollouts_running: Gauge::default(),
            jobs_running: Family::default(),
            jobs_done: Family::default(),
            jobs_taken_over: Family::default(),
        };
        registry.register(
            "sessions_live",
            "Sessions loaded in memory",
            metrics.sessions_live.clone(),
        );
        registry.register(
            "sandboxes_live",
            "Sandboxes this server holds: sessions' and the warm pool's",
            metrics.sandboxes_live.clone(),
        );
        registry.register(
            "sessions_created",
            "Sessions created",
            metrics.sessions_created.clone(),
        );
        registry.register(
            "turns_running",
            "Turns running now",
            metrics.turns_running.clone(),
        );
        registry.register(
            "turns",
            "Turns finished, by result status",
            metrics.turns_finished.clone(),
        );
        registry.register("events", "Events appended, by type", metrics.events.clone());
        registry.register(
            "model_latency_seconds",
            "Duration of model calls, by model",
            metrics.model_latency.clone(),
        );
        registry.register(
            "model_errors",
            "Failed model calls, by model",
            metrics.model_errors.clone(),
        );
        registry.register(
            "websocket_connections",
            "Open WebSocket connections",
            metrics.websocket_connections.clone(),
        );
        registry.register(
            "gateway_calls",
            "Gateway calls by pool, replica and outcome (ok, error, retried)",
            metrics.gateway_calls.clone(),
        );
        registry.register(
            "gateway_latency_seconds",
            "Gateway call duration to the end of the response, by pool and replica",
            metrics.gateway_latency.clone(),
        );
        registry.register(
            "bus_published",
            "Bus messages published, by subject class",
            metrics.bus_published.clone(),
        );
        registry.register(
            "bus_delivered",
            "Bus messages handed to subscribers, by subject class",
            metrics.bus_delivered.clone(),
        );
        registry.register(
            "bus_lagged",
            "Bus messages a lagging subscriber missed on subjects that are not kept, by subject class",
            metrics.bus_lagged.clone(),
        );
        registry.register(
            "bus_retained",
            "Bus messages kept in the store, by subject class",
            metrics.bus_retained.clone(),
        );
        registry.register(
            "rollouts_running",
            "Rollouts running now",
            metrics.rollouts_running.clone(),
        );
        registry.register(
            "jobs_running",
            "Jobs this replica is doing now, by kind",
            metrics.jobs_running.clone(),
        );
        registry.register(
            "jobs_done",
            "Jobs this replica did, by kind and outcome",
            metrics.jobs_done.clone(),
        );
        registry.register(
            "jobs_taken_over",
            "Jobs this replica took after another did not finish them, by kind",
            metrics.jobs_taken_over.clone(),
        );
        *lock(&metrics.registry) = registry;
        metrics
    }

    /// Lets another part register its own metrics (usage per key).
    pub fn register_with(&self, register: impl FnOnce(&mut Registry)) {
        register(&mut lock(&self.registry));
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = lock(&self.registry);
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &registry);
        out
    }
}
