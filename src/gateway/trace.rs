//! Traces of gateway calls, kept in memory under a count and a byte limit,
//! and the recorder that builds one from a response as it streams past.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::sync::lock;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// One call through the gateway.
#[derive(Debug, Clone, Serialize)]
pub struct Trace {
    pub id: String,
    pub ts: DateTime<Utc>,
    /// The key hash of the caller; never shown.
    #[serde(skip)]
    pub owner: Option<String>,
    pub session_id: Option<String>,
    pub metadata: Map<String, Value>,
    /// The pool (the model name the client asked for).
    pub model: String,
    /// The replica that answered, `None` when none did.
    pub replica: Option<String>,
    pub upstream_model: Option<String>,
    pub endpoint: &'static str,
    /// The request as sent to the replica (kept as its JSON text).
    pub request: Box<RawValue>,
    pub response_text: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<Value>,
    pub usage: Option<Value>,
    /// Per-token logprobs, when the replica returned them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Value>,
    pub latency_ms: f64,
    /// Time to the first content (first byte for non-streamed calls).
    pub ttft_ms: Option<f64>,
    /// `ok`, `error` or `cancelled` (the client went away).
    pub status: &'static str,
    pub http_status: Option<u16>,
    /// Replicas tried before the one that answered.
    pub retries: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The weights version the pool ran under (after a weight-sync
    /// commit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weights_version: Option<Value>,
}

/// What every trace of one gateway call shares; [`TraceStart::attempt`]
/// makes a trace of it, which the caller completes.
pub struct TraceStart {
    pub owner: Option<String>,
    pub session_id: Option<String>,
    pub metadata: Map<String, Value>,
    /// The pool (the model name the client asked for).
    pub model: String,
    pub endpoint: &'static str,
    /// The weights version the call was admitted under.
    pub weights_version: Option<Value>,
}

impl TraceStart {
    /// A trace of an attempt on `replica` (`None`: none answered) with the
    /// request as sent: status `ok`, nothing received yet.
    pub fn attempt(&self, replica: Option<(&str, &str)>, request: String) -> Trace {
        Trace {
            id: uuid::Uuid::new_v4().to_string(),
            ts: Utc::now(),
            owner: self.owner.clone(),
            session_id: self.session_id.clone(),
            metadata: self.metadata.clone(),
            model: self.model.clone(),
            replica: replica.map(|(id, _)| id.to_owned()),
            upstream_model: replica.map(|(_, model)| model.to_owned()),
            endpoint: self.endpoint,
            request: raw(request),
            response_text: String::new(),
            tool_calls: Vec::new(),
            usage: None,
            logprobs: None,
            latency_ms: 0.0,
            ttft_ms: None,
            status: "ok",
            http_status: None,
            retries: 0,
            error: None,
            weights_version: self.weights_version.clone(),
        }
    }
}

/// JSON text as a trace's raw value (it came from `serde_json`, so it is
/// valid; `null` otherwise).
fn raw(json: String) -> Box<RawValue> {
    RawValue::from_string(json)
        .unwrap_or_else(|_| RawValue::from_string("null".into()).unwrap_or_default())
}

impl Trace {
    fn weight(&self) -> usize {
        self.request.get().len() + self.response_text.len() + 512
    }
}

/// Whose traces a query returns.
#[derive(Debug, Clone, Copy)]
pub enum OwnerFilter<'a> {
    /// Every key's (an admin asked).
    Any,
    /// Those of one key hash; `None` is the one user when auth is off.
    Only(Option<&'a str>),
}

/// The kept traces, oldest first.
pub struct TraceLog {
    limit: usize,
    max_bytes: usize,
    inner: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    traces: VecDeque<(usize, Arc<Trace>)>,
    bytes: usize,
}

impl TraceLog {
    pub fn new(limit: usize, max_bytes: usize) -> TraceLog {
        TraceLog {
            limit,
            max_bytes,
            inner: Mutex::default(),
        }
    }

    pub fn push(&self, trace: Trace) {
        let weight = trace.weight();
        let mut kept = lock(&self.inner);
        kept.traces.push_back((weight, Arc::new(trace)));
        kept.bytes += weight;
        while kept.traces.len() > self.limit
            || (kept.bytes > self.max_bytes && kept.traces.len() > 1)
        {
            if let Some((weight, _)) = kept.traces.pop_front() {
                kept.bytes -= weight;
            }
        }
    }

    /// Newest first, at most `limit`, only the owner's, and only the
    /// session's when given.
    pub fn query(
        &self,
        owner: OwnerFilter<'_>,
        session_id: Option<&str>,
        model: Option<&str>,
        limit: usize,
    ) -> Vec<Arc<Trace>> {
        let kept = lock(&self.inner);
        kept.traces
            .iter()
            .rev()
            .map(|(_, trace)| trace)
            .filter(|t| match owner {
                OwnerFilter::Any => true,
                OwnerFilter::Only(owner) => t.owner.as_deref() == owner,
            })
            .filter(|t| session_id.is_none_or(|s| t.session_id.as_deref() == Some(s)))
            .filter(|t| model.is_none_or(|m| t.model == m))
            .take(limit)
            .cloned()
            .collect()
    }
}

/// Builds a trace from the response body as it passes to the client.
pub struct Recorder {
    pub trace: Trace,
    started: Instant,
    streamed: bool,
    /// SSE: the unfinished line; otherwise the whole body so far.
    pending: Vec<u8>,
    /// Tool call fragments of a streamed response, by index.
    tool_parts: Vec<(String, String, String)>,
    logprobs: Vec<Value>,
    /// A `finish_reason` or `data: [DONE]` went past: a reader that stops
    /// there got the whole answer.
    pub done: bool,
}

/// A non-streamed body larger than this is passed on but not parsed.
const MAX_PARSED_BODY: usize = 8 * 1024 * 1024;

impl Recorder {
    pub fn new(trace: Trace, started: Instant, streamed: bool) -> Recorder {
        Recorder {
            trace,
            started,
            streamed,
            pending: Vec::new(),
            tool_parts: Vec::new(),
            logprobs: Vec::new(),
            done: false,
        }
    }

    fn elapsed_ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1000.0
    }

    pub fn feed(&mut self, chunk: &Bytes) {
        if !self.streamed {
            if self.trace.ttft_ms.is_none() {
                self.trace.ttft_ms = Some(self.elapsed_ms());
            }
            if self.pending.len() + chunk.len() <= MAX_PARSED_BODY {
                self.pending.extend_from_slice(chunk);
            }
            return;
        }
        self.pending.extend_from_slice(chunk);
        let mut start = 0;
        while let Some(end) = self.pending[start..].iter().position(|b| *b == b'\n') {
            let line = self.pending[start..start + end].to_vec();
            start += end + 1;
            self.sse_line(&line);
        }
        self.pending.drain(..start);
    }

    fn sse_line(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            self.done = true;
            return;
        }
        let Ok(chunk) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
            self.trace.usage = Some(usage.clone());
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            return;
        };
        if choice.get("finish_reason").is_some_and(|r| !r.is_null()) {
            self.done = true;
        }
        let delta = choice.get("delta").unwrap_or(choice);
        let text = delta
            .get("content")
            .or_else(|| choice.get("text"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let calls = delta.get("tool_calls").and_then(Value::as_array);
        if (!text.is_empty() || calls.is_some()) && self.trace.ttft_ms.is_none() {
            self.trace.ttft_ms = Some(self.elapsed_ms());
        }
        self.trace.response_text.push_str(text);
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

    /// Closes the trace: `status` is how the body ended.
    pub fn finish(mut self, status: &'static str, error: Option<String>) -> Trace {
        if !self.streamed && !self.pending.is_empty() {
            let body = std::mem::take(&mut self.pending);
            if let Ok(response) = serde_json::from_slice::<Value>(&body) {
                self.trace.usage = response.get("usage").cloned().filter(|u| !u.is_null());
                if let Some(choice) = response.pointer("/choices/0") {
                    let message = choice.get("message");
                    self.trace.response_text = message
                        .and_then(|m| m.get("content"))
                        .or_else(|| choice.get("text"))
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    if let Some(calls) = message
                        .and_then(|m| m.get("tool_calls"))
                        .and_then(Value::as_array)
                    {
                        self.trace.tool_calls = calls.clone();
                    }
                    self.collect_logprobs(choice);
                }
            } else {
                self.trace.response_text = String::from_utf8_lossy(&body).into_owned();
            }
        }
        if !self.tool_parts.is_empty() {
            self.trace.tool_calls = self
                .tool_parts
                .drain(..)
                .map(|(id, name, arguments)| {
                    serde_json::json!({"id": id, "type": "function",
                                       "function": {"name": name, "arguments": arguments}})
                })
                .collect();
        }
        if !self.logprobs.is_empty() {
            self.trace.logprobs = Some(Value::Array(std::mem::take(&mut self.logprobs)));
        }
        self.trace.latency_ms = self.elapsed_ms();
        self.trace.status = status;
        self.trace.error = error;
        self.trace
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn blank() -> Trace {
        let start = TraceStart {
            owner: None,
            session_id: Some("s".into()),
            metadata: Map::new(),
            model: "m".into(),
            endpoint: "chat/completions",
            weights_version: None,
        };
        let mut trace = start.attempt(Some(("r", "m")), "{}".into());
        trace.id = "t".into();
        trace.http_status = Some(200);
        trace
    }

    #[test]
    fn a_stream_split_anywhere_gives_text_tools_usage_and_logprobs() {
        let body = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"logprobs\":{\"content\":[{\"token\":\"Hel\",\"logprob\":-0.1}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"Bash\",\"arguments\":\"{\\\"command\\\":\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"ls\\\"}\"}}]}}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n"
        );
        let mut recorder = Recorder::new(blank(), Instant::now(), true);
        for piece in body.as_bytes().chunks(7) {
            recorder.feed(&Bytes::copy_from_slice(piece));
        }
        let trace = recorder.finish("ok", None);
        assert_eq!(trace.response_text, "Hello");
        assert_eq!(trace.usage.unwrap()["completion_tokens"], 2);
        assert_eq!(
            trace.tool_calls[0]["function"]["arguments"],
            "{\"command\":\"ls\"}"
        );
        assert_eq!(trace.logprobs.unwrap()[0]["logprob"], -0.1);
        assert!(trace.ttft_ms.is_some());
    }

    #[test]
    fn a_plain_body_is_parsed_at_the_end() {
        let mut recorder = Recorder::new(blank(), Instant::now(), false);
        let body = json!({"choices":[{"message":{"content":"hi"}}],"usage":{"total_tokens":5}});
        recorder.feed(&Bytes::from(body.to_string()));
        let trace = recorder.finish("ok", None);
        assert_eq!(trace.response_text, "hi");
        assert_eq!(trace.usage.unwrap()["total_tokens"], 5);
    }

    #[test]
    fn the_log_keeps_its_limits_and_filters() {
        let log = TraceLog::new(3, 1 << 20);
        for i in 0..5 {
            let mut trace = blank();
            trace.id = i.to_string();
            trace.session_id = Some(if i % 2 == 0 { "even" } else { "odd" }.into());
            log.push(trace);
        }
        let all: Vec<String> = log
            .query(OwnerFilter::Any, None, None, 10)
            .iter()
            .map(|t| t.id.clone())
            .collect();
        assert_eq!(all, ["4", "3", "2"]);
        let even: Vec<String> = log
            .query(OwnerFilter::Any, Some("even"), None, 10)
            .iter()
            .map(|t| t.id.clone())
            .collect();
        assert_eq!(even, ["4", "2"]);
        let small = TraceLog::new(100, 2000);
        for _ in 0..10 {
            small.push(blank());
        }
        assert!(small.query(OwnerFilter::Any, None, None, 100).len() < 10);
    }
}
