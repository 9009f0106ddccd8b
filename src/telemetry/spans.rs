//! The spans of a turn, named and attributed as the OpenTelemetry GenAI
//! semantic conventions say (`gen_ai.*`), and their content attributes,
//! set only under `telemetry.capture_content`.
//!
//! They are made with the OpenTelemetry SDK directly, as a gateway call's
//! are ([`super::call`]): while export is off a [`Span`] is `None` and
//! costs one load of a flag. A span is the current one for the work run
//! [`Span::within`] it, so a span made there (or a trace context sent on)
//! is its child; it ends when its last handle is dropped.

use std::future::Future;

use futures::future::Either;
use opentelemetry::context::FutureExt as _;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue, Value};

use super::otel::{self, capture_content};

/// A span of this server's traces, held as the OpenTelemetry context it is
/// the span of; inert while export is off.
#[derive(Clone, Debug, Default)]
pub struct Span(Option<Context>);

/// Where a new span hangs.
pub enum Parent<'a> {
    /// Under the current span (none: the root of a trace of its own).
    Current,
    /// Continuing the trace whose context `headers` carry, when they carry
    /// one; else under the current span.
    Headers(&'a http::HeaderMap),
    /// Continuing the trace whose context a request's `headers` carry,
    /// when they carry one; else the root of a trace of its own.
    Request(&'a http::HeaderMap),
    /// Continuing the trace whose context a JSON object carries (a job
    /// handed over by another replica, an MCP request's `_meta`), when it
    /// carries one; else under the current span.
    Json(&'a serde_json::Map<String, serde_json::Value>),
}

impl Parent<'_> {
    fn context(&self) -> Context {
        let carried = match self {
            Parent::Current => None,
            Parent::Headers(headers) => otel::extract_headers(headers),
            Parent::Request(headers) => {
                return otel::extract_headers(headers).unwrap_or_default();
            }
            Parent::Json(carrier) => otel::extract_json(carrier),
        };
        carried.unwrap_or_else(Context::current)
    }
}

fn kv(key: &'static str, value: impl Into<Value>) -> KeyValue {
    KeyValue::new(key, value)
}

impl Span {
    /// A span that records nothing.
    pub fn off() -> Span {
        Span(None)
    }

    /// Starts a span of `kind` under `parent`, its name and attributes
    /// made only while export is on.
    fn start(
        kind: SpanKind,
        parent: &Parent<'_>,
        named: impl FnOnce() -> (String, Vec<KeyValue>),
    ) -> Span {
        let Some(tracer) = otel::tracer() else {
            return Span::off();
        };
        let parent = parent.context();
        let (name, attributes) = named();
        let builder = tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes);
        let span = tracer.build_with_context(builder, &parent);
        Span(Some(parent.with_span(span)))
    }

    /// The span current where this is called (`off` outside any).
    pub fn current() -> Span {
        if !otel::exporting() {
            return Span(None);
        }
        let cx = Context::current();
        Span(cx.has_active_span().then_some(cx))
    }

    /// Runs `work` with this span current.
    pub fn within<F: Future>(&self, work: F) -> impl Future<Output = F::Output> + use<F> {
        match &self.0 {
            Some(cx) => Either::Left(work.with_context(cx.clone())),
            None => Either::Right(work),
        }
    }

    /// Whether the span is exported (export on and the sampler took it).
    pub fn recording(&self) -> bool {
        self.0.as_ref().is_some_and(|cx| cx.span().is_recording())
    }

    /// Sets an attribute.
    pub fn set(&self, key: &'static str, value: impl Into<Value>) {
        if let Some(cx) = &self.0 {
            cx.span().set_attribute(kv(key, value));
        }
    }

    /// Marks the span failed with an `error.type`.
    pub fn fail(&self, error_type: &str) {
        if let Some(cx) = &self.0 {
            let span = cx.span();
            span.set_attribute(kv("error.type", error_type.to_string()));
            span.set_status(Status::error(error_type.to_string()));
        }
    }
}

/// The request that may start a turn (`POST /sessions/{id}/messages`):
/// the root of its trace, or a child of the client's `traceparent`.
pub fn request(method: &str, route: &str, headers: &http::HeaderMap) -> Span {
    Span::start(SpanKind::Server, &Parent::Request(headers), || {
        let attributes = vec![
            kv("http.request.method", method.to_string()),
            kv("http.route", route.to_string()),
        ];
        (format!("{method} {route}"), attributes)
    })
}

/// An MCP `tools/call` that starts work (`run_agent`, `deliberate`): it
/// continues the trace in the call's `_meta`, else the one in the headers
/// of the HTTP request that carried it.
pub fn mcp_call(
    tool: &str,
    meta: &serde_json::Map<String, serde_json::Value>,
    headers: Option<&http::HeaderMap>,
) -> Span {
    let parent = match headers {
        Some(headers) if !meta.contains_key("traceparent") => Parent::Headers(headers),
        _ => Parent::Json(meta),
    };
    Span::start(SpanKind::Server, &parent, || {
        let attributes = vec![
            kv("mcp.method.name", "tools/call"),
            kv("gen_ai.tool.name", tool.to_string()),
            kv("gen_ai.operation.name", "execute_tool"),
        ];
        (format!("tools/call {tool}"), attributes)
    })
}

/// A turn of a session (`invoke_agent {agent}`), its conversation the
/// session.
pub fn turn(session_id: &str, agent: &str, kind: &str) -> Span {
    Span::start(SpanKind::Internal, &Parent::Current, || {
        let (name, mut attributes) = invoke_agent(agent, session_id);
        attributes.push(kv("conclave.session.kind", kind.to_string()));
        (name, attributes)
    })
}

/// A deliberation agent's work in one round, or a pipeline node.
pub fn agent(name: &str, session_id: &str) -> Span {
    Span::start(SpanKind::Internal, &Parent::Current, || {
        invoke_agent(name, session_id)
    })
}

fn invoke_agent(agent: &str, session_id: &str) -> (String, Vec<KeyValue>) {
    let attributes = vec![
        kv("gen_ai.operation.name", "invoke_agent"),
        kv("gen_ai.agent.name", agent.to_string()),
        kv("gen_ai.conversation.id", session_id.to_string()),
    ];
    (format!("invoke_agent {agent}"), attributes)
}

/// One model call (`chat {model}`).
pub fn chat(provider: &str, model: &str, session_id: Option<&str>, parent: &Parent<'_>) -> Span {
    Span::start(SpanKind::Client, parent, || {
        let mut attributes = vec![
            kv("gen_ai.operation.name", "chat"),
            kv("gen_ai.provider.name", provider.to_string()),
            kv("gen_ai.request.model", model.to_string()),
        ];
        if let Some(id) = session_id {
            attributes.push(kv("gen_ai.conversation.id", id.to_string()));
        }
        (format!("chat {model}"), attributes)
    })
}

/// Puts what a model call was asked in its span, under `capture_content`.
pub fn chat_input(span: &Span, system: Option<&str>, messages: &impl serde::Serialize) {
    if !capture_content() || !span.recording() {
        return;
    }
    if let Some(system) = system {
        let parts = serde_json::json!([{"type": "text", "content": system}]);
        span.set("gen_ai.system_instructions", parts.to_string());
    }
    if let Ok(text) = serde_json::to_string(messages) {
        span.set("gen_ai.input.messages", text);
    }
}

/// Puts what a model answered in its span, under `capture_content`.
pub fn chat_output(span: &Span, text: &str, calls: &impl serde::Serialize) {
    if !capture_content() || !span.recording() {
        return;
    }
    let mut parts = vec![serde_json::json!({"type": "text", "content": text})];
    if let Ok(serde_json::Value::Array(calls)) = serde_json::to_value(calls) {
        for call in calls {
            parts.push(serde_json::json!({"type": "tool_call", "call": call}));
        }
    }
    let message = serde_json::json!([{"role": "assistant", "parts": parts}]);
    span.set("gen_ai.output.messages", message.to_string());
}

/// The tokens a model call counted.
pub fn usage(span: &Span, input_tokens: u64, output_tokens: u64) {
    if span.recording() {
        span.set("gen_ai.usage.input_tokens", tokens(input_tokens));
        span.set("gen_ai.usage.output_tokens", tokens(output_tokens));
    }
}

fn tokens(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// One tool call (`execute_tool {name}`).
pub fn tool(name: &str, call_id: &str, arguments: &serde_json::Value) -> Span {
    Span::start(SpanKind::Internal, &Parent::Current, || {
        let mut attributes = vec![
            kv("gen_ai.operation.name", "execute_tool"),
            kv("gen_ai.tool.name", name.to_string()),
            kv("gen_ai.tool.call.id", call_id.to_string()),
        ];
        if capture_content() {
            attributes.push(kv("gen_ai.tool.call.arguments", arguments.to_string()));
        }
        (format!("execute_tool {name}"), attributes)
    })
}

/// A tool's result, under `capture_content`.
pub fn tool_result(span: &Span, output: &serde_json::Value) {
    if capture_content() && span.recording() {
        span.set("gen_ai.tool.call.result", output.to_string());
    }
}

/// A command run in a sandbox.
pub fn exec(
    backend: &str,
    sandbox_id: &str,
    session_id: Option<&str>,
    parent: &Parent<'_>,
) -> Span {
    Span::start(SpanKind::Internal, parent, || {
        let mut attributes = vec![
            kv("conclave.sandbox.backend", backend.to_string()),
            kv("container.id", sandbox_id.to_string()),
        ];
        if let Some(id) = session_id {
            attributes.push(kv("gen_ai.conversation.id", id.to_string()));
        }
        ("sandbox.exec".to_string(), attributes)
    })
}

/// How an exec ended: its exit code (none when killed) and whether it
/// timed out; `None` when the sandbox failed to run it.
pub fn exec_ended(span: &Span, ended: Option<(Option<i64>, bool)>) {
    match ended {
        Some((code, timed_out)) => {
            if let Some(code) = code {
                span.set("process.exit.code", code);
            }
            span.set("conclave.exec.timed_out", timed_out);
        }
        None => span.fail("sandbox_error"),
    }
}
