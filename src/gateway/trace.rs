//! Traces of gateway calls, kept in memory under a count and a byte limit,
//! and the recorder that keeps a response as it streams past.
//!
//! A call's request and response are kept as the bytes that went by and
//! read (parsed into text, tool calls, usage and logprobs) only when the
//! trace is: most traces are never read, and parsing every response as it
//! passed was a good part of the gateway's CPU per call. What must be known
//! at once — when the first content came, whether the answer was complete —
//! is found while the response streams, from as little parsing as it takes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::responses::{self, ResponseRoutes, Route};
use super::trace_read::Reading;
use crate::sync::lock;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::{Serialize, Serializer};
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
    #[serde(serialize_with = "json_text")]
    pub request: Bytes,
    /// From here to `logprobs`: what the response said, filled in when the
    /// trace is read ([`Trace::read`]).
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
    /// The response as it came, until the trace is read.
    #[serde(skip)]
    response: Option<Arc<Kept>>,
}

/// A response as it came: SSE lines or one JSON body.
#[derive(Debug)]
struct Kept {
    streamed: bool,
    body: Vec<u8>,
}

/// JSON text as itself in the serialized trace (`null` if it is not JSON).
fn json_text<S: Serializer>(text: &Bytes, serializer: S) -> Result<S::Ok, S::Error> {
    let raw = std::str::from_utf8(text)
        .ok()
        .and_then(|text| serde_json::from_str::<&RawValue>(text).ok());
    match raw {
        Some(raw) => raw.serialize(serializer),
        None => serializer.serialize_unit(),
    }
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
    pub fn attempt(&self, replica: Option<(&str, &str)>, request: Bytes) -> Trace {
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
            request,
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
            response: None,
        }
    }
}

impl Trace {
    fn weight(&self) -> usize {
        let response = self.response.as_ref().map_or(0, |r| r.body.len());
        self.request.len() + response + self.response_text.len() + 512
    }

    /// The trace with what its response said filled in.
    pub fn read(&self) -> Trace {
        let mut trace = self.clone();
        if let Some(kept) = trace.response.take() {
            let mut reading = Reading::default();
            if kept.streamed {
                for line in kept.body.split(|b| *b == b'\n') {
                    reading.sse_line(&mut trace, line);
                }
            } else {
                reading.body(&mut trace, &kept.body);
            }
            reading.finish(&mut trace);
        }
        trace
    }
}

impl Trace {
    /// The tokens the replica reported (`usage.prompt_tokens` and
    /// `completion_tokens`, or the Responses API's `input_tokens` and
    /// `output_tokens`), from the last `"usage"` object of the kept
    /// response: read without parsing the rest of it.
    pub fn reported_tokens(&self) -> Option<(u64, u64)> {
        const KEY: &[u8] = b"\"usage\"";
        let body = &self.response.as_ref()?.body;
        let at = body.windows(KEY.len()).rposition(|w| w == KEY)? + KEY.len();
        let rest = body[at..]
            .iter()
            .position(|b| !b.is_ascii_whitespace() && *b != b':')
            .map(|start| &body[at + start..])?;
        let usage: Value = serde_json::Deserializer::from_slice(rest)
            .into_iter::<Value>()
            .next()?
            .ok()?;
        let tokens = |names: [&str; 2]| {
            names
                .iter()
                .find_map(|name| usage.get(*name).and_then(Value::as_u64))
                .unwrap_or(0)
        };
        let input = tokens(["prompt_tokens", "input_tokens"]);
        let output = tokens(["completion_tokens", "output_tokens"]);
        (input > 0 || output > 0).then_some((input, output))
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
    inner: Mutex<Traces>,
}

#[derive(Default)]
struct Traces {
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
    ) -> Vec<Trace> {
        let chosen: Vec<Arc<Trace>> = lock(&self.inner)
            .traces
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
            .collect();
        // Read outside the lock: parsing is the slow part.
        chosen.iter().map(|t| t.read()).collect()
    }
}

/// Keeps the response body for the trace as it passes to the client,
/// noting when the first content came and whether the answer ended.
pub struct Recorder {
    pub trace: Trace,
    started: Instant,
    streamed: bool,
    /// The body so far (up to [`MAX_KEPT_BODY`]).
    body: Vec<u8>,
    /// SSE: the line not yet ended.
    line: Vec<u8>,
    /// A `finish_reason` or `data: [DONE]` went past, or as many bytes as
    /// the replica announced: a reader that stops there got the whole
    /// answer.
    pub done: bool,
    /// The body's length as the replica announced it, and the bytes seen.
    length: Option<u64>,
    seen: u64,
    /// A Responses API call's: where the response's id is remembered,
    /// and whether it was.
    responses: Option<Arc<ResponseRoutes>>,
    remembered: bool,
}

/// A response larger than this is passed on whole but kept only up to it.
const MAX_KEPT_BODY: usize = 8 * 1024 * 1024;

impl Recorder {
    pub fn new(trace: Trace, started: Instant, streamed: bool) -> Recorder {
        Recorder {
            trace,
            started,
            streamed,
            body: Vec::new(),
            line: Vec::new(),
            done: false,
            length: None,
            seen: 0,
            responses: None,
            remembered: false,
        }
    }

    /// A Responses API call: its response's id is remembered in `routes`
    /// as soon as it passes, before the client can name it in a follow-up.
    pub fn remembering(mut self, routes: Arc<ResponseRoutes>) -> Recorder {
        self.responses = Some(routes);
        self
    }

    /// A Responses API call whose response id is not yet remembered.
    fn remembers(&self) -> bool {
        self.responses.is_some() && !self.remembered
    }

    fn remember(&mut self, id: Option<String>) {
        let ok = self
            .trace
            .http_status
            .is_some_and(|s| (200..300).contains(&s));
        if let (Some(id), Some(replica), true) = (id, &self.trace.replica, ok)
            && let Some(routes) = &self.responses
        {
            self.remembered = true;
            let owner = self.trace.owner.clone();
            routes.remember(
                id,
                Route {
                    owner,
                    replica: replica.clone(),
                },
            );
        }
    }

    /// Knows the body's length: once that many bytes passed, it is whole.
    pub fn with_length(mut self, length: Option<u64>) -> Recorder {
        self.length = length;
        self
    }

    fn elapsed_ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1000.0
    }

    pub fn feed(&mut self, chunk: &Bytes) {
        // Past the limit the trace keeps the body's start, without gaps.
        let room = MAX_KEPT_BODY.saturating_sub(self.body.len());
        self.body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        self.seen += chunk.len() as u64;
        if self.length.is_some_and(|length| self.seen >= length) {
            self.done = true;
        }
        if !self.streamed {
            if self.trace.ttft_ms.is_none() {
                self.trace.ttft_ms = Some(self.elapsed_ms());
            }
            if self.done && self.remembers() {
                self.remember(responses::body_id(&self.body));
            }
            return;
        }
        let mut rest: &[u8] = chunk;
        while let Some(end) = rest.iter().position(|b| *b == b'\n') {
            if self.line.is_empty() {
                self.scan_line(&rest[..end]);
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(&rest[..end]);
                self.scan_line(&line);
            }
            rest = &rest[end + 1..];
        }
        self.line.extend_from_slice(rest);
    }

    /// One SSE line as it passes: parsed only until the first content.
    fn scan_line(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            self.done = true;
            return;
        }
        if self.responses.is_some() {
            return self.scan_event(data);
        }
        if self.trace.ttft_ms.is_none() {
            let Ok(chunk) = serde_json::from_slice::<Value>(data) else {
                return;
            };
            let Some(choice) = chunk.pointer("/choices/0") else {
                return;
            };
            let delta = choice.get("delta").unwrap_or(choice);
            let text = delta.get("content").or_else(|| choice.get("text"));
            let content = text.and_then(Value::as_str).is_some_and(|t| !t.is_empty());
            if content || delta.get("tool_calls").is_some_and(Value::is_array) {
                self.trace.ttft_ms = Some(self.elapsed_ms());
            }
        }
        if finishes(data) {
            self.done = true;
        }
    }

    /// One event of a Responses stream: parsed whole (into the little
    /// it needs), as its type is what tells where the stream is.
    fn scan_event(&mut self, data: &[u8]) {
        let seen = responses::scan_event(data);
        if seen.content && self.trace.ttft_ms.is_none() {
            self.trace.ttft_ms = Some(self.elapsed_ms());
        }
        self.done |= seen.ends;
        if seen.id.is_some() && self.remembers() {
            self.remember(seen.id);
        }
    }

    /// Closes the trace: `status` is how the body ended.
    pub fn finish(mut self, status: &'static str, error: Option<String>) -> Trace {
        if !self.streamed && self.remembers() && status == "ok" {
            self.remember(responses::body_id(&self.body));
        }
        if !self.body.is_empty() {
            self.trace.response = Some(Arc::new(Kept {
                streamed: self.streamed,
                body: std::mem::take(&mut self.body),
            }));
        }
        self.trace.latency_ms = self.elapsed_ms();
        self.trace.status = status;
        self.trace.error = error;
        self.trace
    }
}

/// Whether an SSE chunk carries a `finish_reason` that is not null.
fn finishes(data: &[u8]) -> bool {
    const KEY: &[u8] = b"\"finish_reason\"";
    let Some(at) = data.windows(KEY.len()).position(|w| w == KEY) else {
        return false;
    };
    let value = data[at + KEY.len()..]
        .iter()
        .copied()
        .find(|b| !b.is_ascii_whitespace() && *b != b':');
    value.is_some_and(|b| b != b'n')
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
        let mut trace = start.attempt(Some(("r", "m")), Bytes::from_static(b"{}"));
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
        assert!(recorder.done);
        let finished = recorder.finish("ok", None);
        assert_eq!(finished.reported_tokens(), Some((3, 2)));
        let trace = finished.read();
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
    fn a_body_of_the_announced_length_is_whole() {
        let mut recorder = Recorder::new(blank(), Instant::now(), false).with_length(Some(10));
        recorder.feed(&Bytes::from_static(b"{\"a\":"));
        assert!(!recorder.done);
        recorder.feed(&Bytes::from_static(b"1234}"));
        assert!(recorder.done);
    }

    #[test]
    fn a_finish_reason_ends_the_answer_unless_null() {
        assert!(finishes(br#"{"choices":[{"finish_reason":"stop"}]}"#));
        assert!(finishes(br#"{"choices":[{"finish_reason" : "length"}]}"#));
        assert!(!finishes(br#"{"choices":[{"finish_reason":null}]}"#));
        assert!(!finishes(br#"{"choices":[{"delta":{"content":"x"}}]}"#));
    }

    #[test]
    fn a_plain_body_is_parsed_at_the_end() {
        let mut recorder = Recorder::new(blank(), Instant::now(), false);
        let body = json!({"choices":[{"message":{"content":"hi"}}],"usage":{"total_tokens":5}});
        recorder.feed(&Bytes::from(body.to_string()));
        let trace = recorder.finish("ok", None).read();
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
