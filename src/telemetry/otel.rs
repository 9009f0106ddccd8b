//! OpenTelemetry traces: the OTLP exporter, the spans of a turn and the
//! W3C trace context carried in and out.
//!
//! One trace per turn: the request that starts it (`POST …`) → the turn
//! (`invoke_agent`) → each model call (`chat {model}`; through the gateway
//! its request and each attempt on a replica) → each tool call
//! (`execute_tool {name}`) → the sandbox exec. Attributes follow the
//! OpenTelemetry GenAI semantic conventions.
//!
//! The spans are `tracing` spans of target `conclave…`, turned into
//! OpenTelemetry spans by `tracing-opentelemetry` only while export is on;
//! off, the layer's filter refuses them, so each costs one filter call.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::config::TelemetryConfig;

/// Set once export starts: spans and propagation do nothing before.
static EXPORTING: AtomicBool = AtomicBool::new(false);
/// The tracer of the export, for the spans made without `tracing` (the
/// gateway's calls).
static TRACER: OnceLock<opentelemetry_sdk::trace::Tracer> = OnceLock::new();
/// `telemetry.capture_content`.
static CAPTURE_CONTENT: AtomicBool = AtomicBool::new(false);

/// Whether spans go anywhere.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// Whether spans may carry prompts, answers and tool arguments.
pub fn capture_content() -> bool {
    CAPTURE_CONTENT.load(Ordering::Relaxed)
}

/// The tracer provider of a running export; [`Exporter::shutdown`] sends
/// the spans still buffered.
pub struct Exporter {
    provider: SdkTracerProvider,
}

impl Exporter {
    /// Sends what is buffered and stops. It blocks while it sends: call it
    /// off the async workers.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "flushing the last spans");
        }
    }
}

/// Builds the OTLP/HTTP exporter of `config`, or `None` when export is off.
pub(super) fn exporter(
    config: &TelemetryConfig,
) -> Result<Option<(Exporter, opentelemetry_sdk::trace::Tracer)>, String> {
    let Some(url) = config.traces_url() else {
        return Ok(None);
    };
    let headers: HashMap<String, String> = config
        .otlp_headers
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(url.clone())
        .with_headers(headers)
        .build()
        .map_err(|e| format!("OTLP exporter to {url}: {e}"))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(config.service_name().to_string())
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("conclave");
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    // A second export in one process (tests) keeps the first, as the
    // subscriber does.
    let _ = TRACER.set(tracer.clone());
    CAPTURE_CONTENT.store(config.capture_content, Ordering::Relaxed);
    EXPORTING.store(true, Ordering::Relaxed);
    Ok(Some((Exporter { provider }, tracer)))
}

/// The tracer of a running export.
pub(super) fn tracer() -> Option<&'static opentelemetry_sdk::trace::Tracer> {
    if !exporting() {
        return None;
    }
    TRACER.get()
}

/// Where a span made without `tracing` hangs.
#[derive(Clone, Debug)]
pub enum Parent {
    /// Under the current `tracing` span (work done in-process).
    Current,
    /// At the root of an HTTP request: the client's trace when it sent a
    /// `traceparent`, else a trace of its own.
    Request(Option<opentelemetry::Context>),
}

impl Parent {
    /// The parent of the span of a request with these headers.
    pub fn of_request(headers: &http::HeaderMap) -> Parent {
        if !exporting() || !headers.contains_key("traceparent") {
            return Parent::Request(None);
        }
        Parent::Request(Some(
            TraceContextPropagator::new().extract(&Headers(headers)),
        ))
    }
}

/// The OpenTelemetry context of the current `tracing` span.
pub(super) fn current_context() -> opentelemetry::Context {
    Span::current().context()
}

/// Adds the trace context `cx` to outgoing headers.
pub fn inject_context(cx: &opentelemetry::Context, headers: &mut http::HeaderMap) {
    TraceContextPropagator::new().inject_context(cx, &mut HeadersMut(headers));
}

/// Whether the OpenTelemetry layer takes this callsite: the spans of this
/// crate, while exporting (events stay in the log).
pub(super) fn takes(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_span() && meta.target().starts_with("conclave") && exporting()
}

/// `http::HeaderMap` as a carrier of the W3C trace context.
struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct HeadersMut<'a>(&'a mut http::HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// A JSON object (an MCP request's `_meta`, a job) as a carrier.
struct Json<'a>(&'a serde_json::Map<String, serde_json::Value>);

impl Extractor for Json<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.as_str())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

struct JsonMut<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl Injector for JsonMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0
            .insert(key.to_string(), serde_json::Value::String(value));
    }
}

/// Makes `span` continue the trace of the `traceparent` (and
/// `tracestate`) in `headers`, when there is one.
pub fn continue_from_headers(span: &Span, headers: &http::HeaderMap) {
    if !exporting() || !headers.contains_key("traceparent") {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&Headers(headers));
    let _ = span.set_parent(parent);
}

/// Makes `span` continue the trace carried in a JSON object.
pub fn continue_from_json(span: &Span, carrier: &serde_json::Map<String, serde_json::Value>) {
    if !exporting() || !carrier.contains_key("traceparent") {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&Json(carrier));
    let _ = span.set_parent(parent);
}

/// Adds the current span's `traceparent` (and `tracestate`) to outgoing
/// headers, so a replica's or provider's own traces join this one.
pub fn inject_headers(headers: &mut http::HeaderMap) {
    if !exporting() {
        return;
    }
    let context = Span::current().context();
    TraceContextPropagator::new().inject_context(&context, &mut HeadersMut(headers));
}

/// Adds the current span's trace context to a JSON object.
pub fn inject_json(carrier: &mut serde_json::Map<String, serde_json::Value>) {
    if !exporting() {
        return;
    }
    let context = Span::current().context();
    TraceContextPropagator::new().inject_context(&context, &mut JsonMut(carrier));
}

/// The current trace context as a JSON object, for work handed to another
/// task or replica (`None` when not exporting).
pub fn current_json() -> Option<serde_json::Map<String, serde_json::Value>> {
    if !exporting() {
        return None;
    }
    let mut carrier = serde_json::Map::new();
    inject_json(&mut carrier);
    Some(carrier)
}

/// Copies the trace context carried in a JSON object to HTTP headers.
pub fn copy_json_to_headers(
    carrier: &serde_json::Map<String, serde_json::Value>,
    headers: &mut http::HeaderMap,
) {
    if !carrier.contains_key("traceparent") {
        return;
    }
    let propagator = TraceContextPropagator::new();
    let context = propagator.extract(&Json(carrier));
    propagator.inject_context(&context, &mut HeadersMut(headers));
}

/// Marks `span` failed with an `error.type`.
pub fn fail(span: &Span, error_type: &str) {
    span.record("error.type", error_type);
    span.record("otel.status_code", "error");
}
