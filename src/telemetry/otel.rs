//! OpenTelemetry traces: the OTLP exporter, the spans of a turn and the
//! W3C trace context carried in and out.
//!
//! One trace per turn: the request that starts it (`POST …`) → the turn
//! (`invoke_agent`) → each model call (`chat {model}`; through the gateway
//! its request and each attempt on a replica) → each tool call
//! (`execute_tool {name}`) → the sandbox exec. Attributes follow the
//! OpenTelemetry GenAI semantic conventions.
//!
//! The spans are made with the OpenTelemetry SDK directly
//! ([`super::spans`], [`super::call`]), only while export is on; off, each
//! costs one load of a flag. They are not `tracing` spans: the log is for
//! events, the traces for spans.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;

use crate::config::TelemetryConfig;

/// Set once export starts: spans and propagation do nothing before.
static EXPORTING: AtomicBool = AtomicBool::new(false);
/// The tracer of the export.
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

/// Starts the OTLP/HTTP export of `config`, or `None` when export is off.
pub(super) fn exporter(config: &TelemetryConfig) -> Result<Option<Exporter>, String> {
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
    let _ = TRACER.set(tracer);
    CAPTURE_CONTENT.store(config.capture_content, Ordering::Relaxed);
    EXPORTING.store(true, Ordering::Relaxed);
    Ok(Some(Exporter { provider }))
}

/// The tracer of a running export.
pub(super) fn tracer() -> Option<&'static opentelemetry_sdk::trace::Tracer> {
    if !exporting() {
        return None;
    }
    TRACER.get()
}

/// Where a gateway call's span hangs.
#[derive(Clone, Debug)]
pub enum Parent {
    /// Under the current span (work done in-process).
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

/// Adds the trace context `cx` to outgoing headers.
pub fn inject_context(cx: &opentelemetry::Context, headers: &mut http::HeaderMap) {
    TraceContextPropagator::new().inject_context(cx, &mut HeadersMut(headers));
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

/// The trace context of the `traceparent` (and `tracestate`) in
/// `headers`, when export is on and there is one.
pub(super) fn extract_headers(headers: &http::HeaderMap) -> Option<Context> {
    if !exporting() || !headers.contains_key("traceparent") {
        return None;
    }
    Some(TraceContextPropagator::new().extract(&Headers(headers)))
}

/// The trace context carried in a JSON object, when export is on and it
/// carries one.
pub(super) fn extract_json(
    carrier: &serde_json::Map<String, serde_json::Value>,
) -> Option<Context> {
    if !exporting() || !carrier.contains_key("traceparent") {
        return None;
    }
    Some(TraceContextPropagator::new().extract(&Json(carrier)))
}

/// Adds the current span's `traceparent` (and `tracestate`) to outgoing
/// headers, so a replica's or provider's own traces join this one.
pub fn inject_headers(headers: &mut http::HeaderMap) {
    if !exporting() {
        return;
    }
    TraceContextPropagator::new().inject_context(&Context::current(), &mut HeadersMut(headers));
}

/// Adds the current span's trace context to a JSON object.
pub fn inject_json(carrier: &mut serde_json::Map<String, serde_json::Value>) {
    if !exporting() {
        return;
    }
    TraceContextPropagator::new().inject_context(&Context::current(), &mut JsonMut(carrier));
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
