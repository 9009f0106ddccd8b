//! The spans of a turn, named and attributed as the OpenTelemetry GenAI
//! semantic conventions say (`gen_ai.*`), and their content attributes,
//! set only under `telemetry.capture_content`.

use tracing::Span;
use tracing::field::Empty;

use super::otel::capture_content;

/// The request that may start a turn (`POST /sessions/{id}/messages`):
/// the root of its trace, or a child of the client's `traceparent`.
pub fn request(method: &str, route: &str, headers: &http::HeaderMap) -> Span {
    let span = tracing::info_span!(
        "request",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        http.response.status_code = Empty,
        error.type = Empty,
        otel.status_code = Empty,
    );
    super::otel::continue_from_headers(&span, headers);
    span
}

/// An MCP `tools/call` that starts work (`run_agent`, `deliberate`): it
/// continues the trace in the call's `_meta`, else the one in the headers
/// of the HTTP request that carried it.
pub fn mcp_call(
    tool: &str,
    meta: &serde_json::Map<String, serde_json::Value>,
    headers: Option<&http::HeaderMap>,
) -> Span {
    let span = tracing::info_span!(
        "mcp",
        otel.name = %format_args!("tools/call {tool}"),
        otel.kind = "server",
        mcp.method.name = "tools/call",
        gen_ai.tool.name = %tool,
        gen_ai.operation.name = "execute_tool",
    );
    if meta.contains_key("traceparent") {
        super::otel::continue_from_json(&span, meta);
    } else if let Some(headers) = headers {
        super::otel::continue_from_headers(&span, headers);
    }
    span
}

/// A turn of a session (`invoke_agent {agent}`), its conversation the
/// session.
pub fn turn(session_id: &str, agent: &str, kind: &str) -> Span {
    tracing::info_span!(
        "invoke_agent",
        otel.name = %format_args!("invoke_agent {agent}"),
        otel.kind = "internal",
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = %agent,
        gen_ai.conversation.id = %session_id,
        conclave.session.kind = %kind,
        conclave.result.status = Empty,
        error.type = Empty,
        otel.status_code = Empty,
    )
}

/// One model call (`chat {model}`).
pub fn chat(provider: &str, model: &str, session_id: Option<&str>) -> Span {
    tracing::info_span!(
        "chat",
        otel.name = %format_args!("chat {model}"),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = %provider,
        gen_ai.request.model = %model,
        gen_ai.response.model = Empty,
        gen_ai.conversation.id = session_id,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.response.finish_reasons = Empty,
        gen_ai.system_instructions = Empty,
        gen_ai.input.messages = Empty,
        gen_ai.output.messages = Empty,
        error.type = Empty,
        otel.status_code = Empty,
    )
}

/// Puts what a model call was asked in its span, under `capture_content`.
pub fn chat_input(span: &Span, system: Option<&str>, messages: &impl serde::Serialize) {
    if !capture_content() || span.is_disabled() {
        return;
    }
    if let Some(system) = system {
        let parts = serde_json::json!([{"type": "text", "content": system}]);
        span.record("gen_ai.system_instructions", parts.to_string());
    }
    if let Ok(text) = serde_json::to_string(messages) {
        span.record("gen_ai.input.messages", text);
    }
}

/// Puts what a model answered in its span, under `capture_content`.
pub fn chat_output(span: &Span, text: &str, calls: &impl serde::Serialize) {
    if !capture_content() || span.is_disabled() {
        return;
    }
    let mut parts = vec![serde_json::json!({"type": "text", "content": text})];
    if let Ok(serde_json::Value::Array(calls)) = serde_json::to_value(calls) {
        for call in calls {
            parts.push(serde_json::json!({"type": "tool_call", "call": call}));
        }
    }
    let message = serde_json::json!([{"role": "assistant", "parts": parts}]);
    span.record("gen_ai.output.messages", message.to_string());
}

/// The tokens a model call counted.
pub fn usage(span: &Span, input_tokens: u64, output_tokens: u64) {
    span.record("gen_ai.usage.input_tokens", input_tokens);
    span.record("gen_ai.usage.output_tokens", output_tokens);
}

/// One tool call (`execute_tool {name}`).
pub fn tool(name: &str, call_id: &str, arguments: &serde_json::Value) -> Span {
    let span = tracing::info_span!(
        "execute_tool",
        otel.name = %format_args!("execute_tool {name}"),
        otel.kind = "internal",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %name,
        gen_ai.tool.call.id = %call_id,
        gen_ai.tool.call.arguments = Empty,
        gen_ai.tool.call.result = Empty,
        error.type = Empty,
        otel.status_code = Empty,
    );
    if capture_content() && !span.is_disabled() {
        span.record("gen_ai.tool.call.arguments", arguments.to_string());
    }
    span
}

/// A tool's result, under `capture_content`.
pub fn tool_result(span: &Span, output: &serde_json::Value) {
    if capture_content() && !span.is_disabled() {
        span.record("gen_ai.tool.call.result", output.to_string());
    }
}

/// A command run in a sandbox.
pub fn exec(backend: &str, sandbox_id: &str, session_id: Option<&str>) -> Span {
    tracing::info_span!(
        "sandbox.exec",
        otel.name = "sandbox.exec",
        otel.kind = "internal",
        conclave.sandbox.backend = %backend,
        container.id = %sandbox_id,
        gen_ai.conversation.id = session_id,
        process.exit.code = Empty,
        conclave.exec.timed_out = Empty,
        error.type = Empty,
        otel.status_code = Empty,
    )
}

/// How an exec ended: its exit code (none when killed) and whether it
/// timed out; `None` when the sandbox failed to run it.
pub fn exec_ended(span: &Span, ended: Option<(Option<i64>, bool)>) {
    match ended {
        Some((code, timed_out)) => {
            if let Some(code) = code {
                span.record("process.exit.code", code);
            }
            span.record("conclave.exec.timed_out", timed_out);
        }
        None => super::otel::fail(span, "sandbox_error"),
    }
}

/// A deliberation agent's work in one round, or a pipeline node.
pub fn agent(name: &str, session_id: &str) -> Span {
    tracing::info_span!(
        "invoke_agent",
        otel.name = %format_args!("invoke_agent {name}"),
        otel.kind = "internal",
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = %name,
        gen_ai.conversation.id = %session_id,
        error.type = Empty,
        otel.status_code = Empty,
    )
}
