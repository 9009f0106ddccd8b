//! How a kept response is read into its trace (only when the trace is
//! read): chat and completions chunks or bodies, and Responses API events
//! or bodies.

use serde_json::Value;

use super::responses;
use super::trace::Trace;

/// A kept response being read into its trace.
#[derive(Default)]
pub(super) struct Reading {
    /// Tool call fragments of a streamed response, by index.
    tool_parts: Vec<(String, String, String)>,
    logprobs: Vec<Value>,
}

impl Reading {
    pub(super) fn sse_line(&mut self, trace: &mut Trace, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let Ok(chunk) = serde_json::from_slice::<Value>(data.trim_ascii()) else {
            return;
        };
        if let Some(kind) = chunk.get("type").and_then(Value::as_str) {
            return responses::read_event(trace, kind, &chunk);
        }
        if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
            trace.usage = Some(usage.clone());
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            return;
        };
        let delta = choice.get("delta").unwrap_or(choice);
        let text = delta
            .get("content")
            .or_else(|| choice.get("text"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        trace.response_text.push_str(text);
        let calls = delta.get("tool_calls").and_then(Value::as_array);
        for call in calls.into_iter().flatten() {
            let index = call.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
            if self.tool_parts.len() <= index {
                self.tool_parts.resize(index + 1, Default::default());
            }
            let part = &mut self.tool_parts[index];
            if let Some(id) = call.get("id").and_then(Value::as_str) {
                part.0 = id.to_string();
            }
            if let Some(name) = call.pointer("/function/name").and_then(Value::as_str) {
                part.1.push_str(name);
            }
            if let Some(args) = call.pointer("/function/arguments").and_then(Value::as_str) {
                part.2.push_str(args);
            }
        }
        self.collect_logprobs(choice);
    }

    /// A whole JSON body.
    pub(super) fn body(&mut self, trace: &mut Trace, body: &[u8]) {
        let Ok(response) = serde_json::from_slice::<Value>(body) else {
            trace.response_text = String::from_utf8_lossy(body).into_owned();
            return;
        };
        trace.usage = response.get("usage").cloned().filter(|u| !u.is_null());
        if let Some(output) = response.get("output").and_then(Value::as_array) {
            return responses::read_body(trace, output);
        }
        let Some(choice) = response.pointer("/choices/0") else {
            return;
        };
        let message = choice.get("message");
        trace.response_text = message
            .and_then(|m| m.get("content"))
            .or_else(|| choice.get("text"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if let Some(calls) = message
            .and_then(|m| m.get("tool_calls"))
            .and_then(Value::as_array)
        {
            trace.tool_calls = calls.clone();
        }
        self.collect_logprobs(choice);
    }

    fn collect_logprobs(&mut self, choice: &Value) {
        match choice.get("logprobs") {
            Some(Value::Object(lp)) => {
                if let Some(Value::Array(tokens)) = lp.get("content") {
                    self.logprobs.extend(tokens.iter().cloned());
                } else if !lp.is_empty() {
                    self.logprobs.push(Value::Object(lp.clone()));
                }
            }
            Some(other) if !other.is_null() => self.logprobs.push(other.clone()),
            _ => {}
        }
        if let Some(ids) = choice.get("token_ids").filter(|v| !v.is_null()) {
            self.logprobs.push(serde_json::json!({"token_ids": ids}));
        }
    }

    pub(super) fn finish(mut self, trace: &mut Trace) {
        if !self.tool_parts.is_empty() {
            trace.tool_calls = self
                .tool_parts
                .drain(..)
                .map(|(id, name, arguments)| {
                    serde_json::json!({"id": id, "type": "function",
                                       "function": {"name": name, "arguments": arguments}})
                })
                .collect();
        }
        if !self.logprobs.is_empty() {
            trace.logprobs = Some(Value::Array(self.logprobs));
        }
    }
}
