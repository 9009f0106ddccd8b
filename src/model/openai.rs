//! OpenAI-compatible chat completions (vLLM, llama.cpp, Ollama, OpenAI,
//! LiteLLM, the gateway): `POST {base_url}/chat/completions`, streamed as SSE.
//!
//! - Tool-call fragments are put together per `index` and emitted whole when
//!   the choice finishes; when tools were offered and the model wrote its
//!   calls into the text instead, [`lenient`] recovers them at the end.
//! - [`ToolCallMode::JsonSchema`] sends a `response_format` in place of the
//!   tools and reads the answer or call from the JSON the model wrote.
//! - The HTTP side — retries with backoff that honour `Retry-After`, error
//!   bodies, the task that pumps SSE events into a [`ModelStream`] — is
//!   [`Transport`] and [`spawn_sse`], shared with [`super::anthropic`].

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::error::Error;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use backon::{ExponentialBuilder, Retryable};
use bytes::Bytes;
use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::StreamExt;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{Response, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::lenient;
use super::{
    ChatRequest, Message, ModelError, ModelProvider, ModelStream, StopReason, StreamEvent,
    ToolCall, ToolCallMode, ToolSpec,
};

/// The longest `Retry-After` honoured; a server asking for more gets this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);
/// The first backoff; it doubles (with jitter) per retry up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// A dead host should fail fast even when generations may take minutes.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of an error body [`ModelError::Http`] keeps.
const ERROR_BODY_LIMIT: usize = 2000;
/// Events buffered between the task reading the upstream and the consumer.
const STREAM_BUFFER: usize = 64;

pub struct OpenAiProvider {
    /// `{base_url}/chat/completions`.
    url: String,
    transport: Transport,
}

impl OpenAiProvider {
    pub fn new(
        base_url: &str,
        api_key: Option<String>,
        max_retries: u32,
        timeout: Duration,
    ) -> Result<OpenAiProvider, ModelError> {
        let mut headers = HeaderMap::new();
        if let Some(key) = api_key.filter(|key| !key.is_empty()) {
            headers.insert(AUTHORIZATION, secret_header(&format!("Bearer {key}"))?);
        }
        Ok(OpenAiProvider {
            url: endpoint(base_url, "chat/completions")?,
            transport: Transport::new(headers, max_retries, timeout)?,
        })
    }
}

#[async_trait]
impl ModelProvider for OpenAiProvider {
    async fn stream(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        let body = serde_json::to_vec(&wire_request(&request))
            .map_err(|e| ModelError::Protocol(format!("cannot encode the request: {e}")))?;
        let mut headers = HeaderMap::new();
        if let Some(id) = request.session_id.as_deref()
            && let Ok(value) = HeaderValue::from_str(id)
        {
            headers.insert("x-session-id", value);
        }
        let response = self.transport.post(&self.url, headers, body).await?;
        Ok(spawn_sse(response, ChunkDecoder::new(request)))
    }
}

#[derive(Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    /// The session id, so a gateway can keep a session on one replica.
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "snake_case")]
enum WireMessage<'a> {
    System {
        content: Cow<'a, str>,
    },
    User {
        content: &'a str,
    },
    Assistant {
        /// `null` when the message is only tool calls.
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WireToolCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: Cow<'a, str>,
    },
}

#[derive(Serialize)]
struct WireToolCall<'a> {
    id: &'a str,
    r#type: &'static str,
    function: WireFunctionCall<'a>,
}

#[derive(Serialize)]
struct WireFunctionCall<'a> {
    name: &'a str,
    /// The API wants the arguments as a JSON string.
    arguments: String,
}

#[derive(Serialize)]
struct WireTool<'a> {
    r#type: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

fn wire_request(request: &ChatRequest) -> WireRequest<'_> {
    let json_mode = json_mode(request);
    let system = match (&request.system, json_mode) {
        (Some(system), false) => Some(Cow::Borrowed(system.as_str())),
        (None, false) => None,
        (system, true) => {
            let instructions = lenient::json_mode_instructions(&request.tools);
            Some(Cow::Owned(match system {
                Some(system) => format!("{system}\n\n{instructions}"),
                None => instructions,
            }))
        }
    };
    let mut messages: Vec<WireMessage> = system
        .map(|content| WireMessage::System { content })
        .into_iter()
        .collect();
    messages.extend(request.messages.iter().map(wire_message));
    let tools = if json_mode {
        Vec::new()
    } else {
        request
            .tools
            .iter()
            .map(|tool| WireTool {
                r#type: "function",
                function: WireFunction {
                    name: &tool.name,
                    description: &tool.description,
                    parameters: &tool.input_schema,
                },
            })
            .collect()
    };
    WireRequest {
        model: &request.model,
        messages,
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        tools,
        response_format: json_mode.then(|| lenient::answer_or_call_format(&request.tools)),
        temperature: request.temperature,
        max_tokens: request.max_tokens,
        user: request.session_id.as_deref(),
    }
}

/// The JSON-schema protocol needs tools to choose from; without any the
/// model simply writes text.
fn json_mode(request: &ChatRequest) -> bool {
    request.tool_call_mode == ToolCallMode::JsonSchema && !request.tools.is_empty()
}

fn wire_message(message: &Message) -> WireMessage<'_> {
    match message {
        Message::User { content } => WireMessage::User { content },
        Message::Assistant {
            content,
            tool_calls,
        } => WireMessage::Assistant {
            content: (!content.is_empty() || tool_calls.is_empty()).then_some(content.as_str()),
            tool_calls: tool_calls
                .iter()
                .map(|call| WireToolCall {
                    id: &call.id,
                    r#type: "function",
                    function: WireFunctionCall {
                        name: &call.name,
                        arguments: call.arguments.to_string(),
                    },
                })
                .collect(),
        },
        Message::Tool {
            tool_call_id,
            content,
            is_error,
            ..
        } => WireMessage::Tool {
            tool_call_id,
            // The API has no error flag; the model must still tell.
            content: if *is_error {
                Cow::Owned(format!("Error: {content}"))
            } else {
                Cow::Borrowed(content)
            },
        },
    }
}

#[derive(Deserialize)]
struct Chunk {
    choices: Option<Vec<Choice>>,
    usage: Option<Usage>,
    /// Servers report failures mid-stream as `{"error": …}`.
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    index: u32,
    delta: Option<Delta>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    content: Option<String>,
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    index: Option<u32>,
    id: Option<String>,
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    name: Option<String>,
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

/// A tool call whose fragments are still arriving.
#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// Turns chat-completion chunks into stream events.
struct ChunkDecoder {
    /// The tools offered, to recover calls written into the text.
    tools: Vec<ToolSpec>,
    json_mode: bool,
    /// The content so far, kept only when it may hold tool calls.
    text: String,
    /// Calls of the current choice by `index`, emitted in index order.
    pending: BTreeMap<u32, PartialCall>,
    called: bool,
    stop: Option<StopReason>,
    usage: Option<Usage>,
}

impl ChunkDecoder {
    fn new(request: ChatRequest) -> ChunkDecoder {
        ChunkDecoder {
            json_mode: json_mode(&request),
            tools: request.tools,
            text: String::new(),
            pending: BTreeMap::new(),
            called: false,
            stop: None,
            usage: None,
        }
    }

    fn flush_calls(&mut self, out: &mut Vec<StreamEvent>) {
        for (_, call) in std::mem::take(&mut self.pending) {
            let id = if call.id.is_empty() {
                lenient::new_call_id()
            } else {
                call.id
            };
            self.emit_call(
                ToolCall {
                    id,
                    name: call.name,
                    arguments: lenient::parse_arguments(&call.arguments),
                },
                out,
            );
        }
    }

    fn emit_call(&mut self, call: ToolCall, out: &mut Vec<StreamEvent>) {
        self.called = true;
        out.push(StreamEvent::ToolCall(call));
    }

    /// The end: pending and recovered calls, usage, and why it stopped.
    fn end(&mut self, out: &mut Vec<StreamEvent>) {
        self.flush_calls(out);
        if self.json_mode {
            let read = lenient::read_answer_or_call(&self.text, &self.tools);
            if !read.text.is_empty() {
                out.push(StreamEvent::TextDelta(read.text));
            }
            for call in read.calls {
                self.emit_call(call, out);
            }
        } else if !self.tools.is_empty()
            && !self.called
            && let Some(recovered) = lenient::recover_tool_calls(&self.text, &self.tools)
        {
            for call in recovered.calls {
                self.emit_call(call, out);
            }
        }
        if let Some(usage) = self.usage.take() {
            out.push(StreamEvent::Usage {
                input_tokens: usage.prompt_tokens,
                output_tokens: usage.completion_tokens,
            });
        }
        // Some servers say "stop" after tool calls; the calls decide.
        let stop = match self.stop.take() {
            None | Some(StopReason::EndTurn) if self.called => StopReason::ToolUse,
            None => StopReason::EndTurn,
            Some(stop) => stop,
        };
        out.push(StreamEvent::Done(stop));
    }
}

impl SseDecoder for ChunkDecoder {
    fn decode(&mut self, event: &Event, out: &mut Vec<StreamEvent>) -> Result<bool, ModelError> {
        if event.data.trim() == "[DONE]" {
            self.end(out);
            return Ok(true);
        }
        let chunk: Chunk =
            serde_json::from_str(&event.data).map_err(|e| malformed("chunk", &event.data, &e))?;
        if let Some(error) = chunk.error {
            return Err(ModelError::Upstream(upstream_message(&error)));
        }
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage);
        }
        // Only one choice is asked for; `n` > 1 is not something we send.
        for choice in chunk.choices.into_iter().flatten().filter(|c| c.index == 0) {
            let (content, tool_calls) = choice
                .delta
                .map(|delta| (delta.content, delta.tool_calls))
                .unwrap_or_default();
            if let Some(text) = content.filter(|text| !text.is_empty()) {
                if !self.tools.is_empty() {
                    self.text.push_str(&text);
                }
                if !self.json_mode {
                    out.push(StreamEvent::TextDelta(text));
                }
            }
            for (position, fragment) in tool_calls.into_iter().flatten().enumerate() {
                let call = self
                    .pending
                    .entry(fragment.index.unwrap_or(position as u32))
                    .or_default();
                if let Some(id) = fragment.id.filter(|_| call.id.is_empty()) {
                    call.id = id;
                }
                if let Some(function) = fragment.function {
                    if let Some(name) = function.name.filter(|_| call.name.is_empty()) {
                        call.name = name;
                    }
                    call.arguments
                        .push_str(function.arguments.as_deref().unwrap_or_default());
                }
            }
            if let Some(reason) = choice.finish_reason {
                self.flush_calls(out);
                self.stop = Some(match reason.as_str() {
                    "stop" => StopReason::EndTurn,
                    "tool_calls" | "function_call" => StopReason::ToolUse,
                    "length" => StopReason::MaxTokens,
                    _ => StopReason::Other(reason),
                });
            }
        }
        Ok(false)
    }

    fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        // Without `[DONE]` the answer counts only if the choice finished:
        // calls cut off mid-arguments must not run.
        if self.stop.is_none() {
            return Err(ModelError::Protocol(
                "the stream ended before the model finished".into(),
            ));
        }
        self.end(out);
        Ok(())
    }
}

/// The message of an `error` object, or the object itself.
fn upstream_message(error: &Value) -> String {
    match error.get("message").and_then(Value::as_str) {
        Some(message) => message.to_string(),
        None => error
            .as_str()
            .map_or_else(|| error.to_string(), str::to_string),
    }
}

// The transport, shared with the Anthropic provider.

/// POSTs requests to one model server, retrying what is worth retrying.
pub(super) struct Transport {
    client: reqwest::Client,
    backoff: ExponentialBuilder,
}

/// One failed attempt, and whether another may succeed.
struct Failure {
    error: ModelError,
    retryable: bool,
    retry_after: Option<Duration>,
}

impl Transport {
    /// `headers` go with every request (authentication, API version);
    /// `timeout` bounds the wait for each read, so long generations that
    /// keep streaming are never cut off.
    pub(super) fn new(
        headers: HeaderMap,
        max_retries: u32,
        timeout: Duration,
    ) -> Result<Transport, ModelError> {
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(timeout.min(MAX_CONNECT_TIMEOUT))
            .read_timeout(timeout)
            .build()
            .map_err(|e| ModelError::Upstream(format!("cannot build the HTTP client: {e}")))?;
        let backoff = ExponentialBuilder::default()
            .with_min_delay(MIN_BACKOFF)
            .with_max_delay(MAX_BACKOFF)
            .with_max_times(max_retries as usize)
            .with_jitter();
        Ok(Transport { client, backoff })
    }

    /// POSTs a JSON body and returns the response once its status is a
    /// success. Connection failures, 429 and 5xx are retried with backoff
    /// (or after `Retry-After`); a response that succeeded is never retried,
    /// so no part of a streamed answer is read twice.
    pub(super) async fn post(
        &self,
        url: &str,
        headers: HeaderMap,
        body: Vec<u8>,
    ) -> Result<Response, ModelError> {
        let body = Bytes::from(body);
        let attempt = || {
            let request = self
                .client
                .post(url)
                .headers(headers.clone())
                .header(CONTENT_TYPE, "application/json")
                .body(body.clone());
            async move { check(url, request.send().await).await }
        };
        attempt
            .retry(self.backoff)
            .when(|failure| failure.retryable)
            .adjust(|failure, backoff| backoff.map(|delay| failure.retry_after.unwrap_or(delay)))
            .notify(|failure, delay| {
                tracing::warn!(
                    url,
                    error = %failure.error,
                    delay_ms = delay.as_millis() as u64,
                    "retrying the model call"
                );
            })
            .await
            .map_err(|failure| failure.error)
    }
}

async fn check(url: &str, sent: reqwest::Result<Response>) -> Result<Response, Failure> {
    let response = sent.map_err(|e| Failure {
        retryable: e.is_connect(),
        retry_after: None,
        error: ModelError::Connect {
            url: url.to_string(),
            message: describe(&e),
        },
    })?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    Err(Failure {
        // 529 (Anthropic's "overloaded") is a 5xx too.
        retryable: status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error(),
        retry_after: retry_after(response.headers(), SystemTime::now()),
        error: ModelError::Http {
            status: status.as_u16(),
            body: error_body(response).await,
        },
    })
}

/// `Retry-After` in seconds or as an HTTP date, capped at [`MAX_RETRY_AFTER`].
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let wait = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => httpdate::parse_http_date(value)
            .ok()?
            .duration_since(now)
            .unwrap_or(Duration::ZERO),
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// The start of an error response's body, read no further than needed.
async fn error_body(mut response: Response) -> String {
    let mut bytes = Vec::new();
    while bytes.len() <= ERROR_BODY_LIMIT {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    let cut = bytes.len() > ERROR_BODY_LIMIT;
    bytes.truncate(ERROR_BODY_LIMIT);
    let mut body = String::from_utf8_lossy(&bytes).trim().to_string();
    if cut {
        body.push('…');
    }
    body
}

/// An error with its causes: reqwest's own message rarely says what failed.
fn describe(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// `{base_url}/{path}`, once the base URL is known to be one.
pub(super) fn endpoint(base_url: &str, path: &str) -> Result<String, ModelError> {
    let url = format!("{}/{path}", base_url.trim_end_matches('/'));
    reqwest::Url::parse(&url).map_err(|e| ModelError::Connect {
        url: base_url.to_string(),
        message: format!("not a valid URL: {e}"),
    })?;
    Ok(url)
}

/// A header holding a key, kept out of debug output.
pub(super) fn secret_header(value: &str) -> Result<HeaderValue, ModelError> {
    let mut header = HeaderValue::from_str(value).map_err(|_| {
        ModelError::Upstream("the API key holds characters a header cannot carry".into())
    })?;
    header.set_sensitive(true);
    Ok(header)
}

/// The error for an SSE event whose data does not parse.
pub(super) fn malformed(what: &str, data: &str, error: &serde_json::Error) -> ModelError {
    let excerpt: String = data.chars().take(200).collect();
    ModelError::Protocol(format!("cannot read a {what} ({error}): {excerpt}"))
}

/// Turns upstream SSE events into stream events.
pub(super) trait SseDecoder: Send + 'static {
    /// Decodes one event into `out`; `Ok(true)` when the event ended the
    /// stream. An error ends the stream too.
    fn decode(&mut self, event: &Event, out: &mut Vec<StreamEvent>) -> Result<bool, ModelError>;

    /// The body ended with no event that ends the stream.
    fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError>;
}

/// Reads `response` as SSE in a task that feeds the returned stream. When
/// the consumer drops the stream the task stops and the connection closes.
pub(super) fn spawn_sse(response: Response, mut decoder: impl SseDecoder) -> ModelStream {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(async move {
        let mut events = std::pin::pin!(response.bytes_stream().eventsource());
        loop {
            let next = tokio::select! {
                () = tx.closed() => return,
                next = events.next() => next,
            };
            let mut out = Vec::new();
            let (ended, failure) = match next {
                Some(Ok(event)) => match decoder.decode(&event, &mut out) {
                    Ok(ended) => (ended, None),
                    Err(error) => (true, Some(error)),
                },
                Some(Err(error)) => (true, Some(sse_error(error))),
                None => (true, decoder.finish(&mut out).err()),
            };
            for item in out.into_iter().map(Ok).chain(failure.map(Err)) {
                if tx.send(item).await.is_err() {
                    return;
                }
            }
            if ended {
                return;
            }
        }
    });
    Box::pin(ReceiverStream::new(rx))
}

fn sse_error(error: EventStreamError<reqwest::Error>) -> ModelError {
    match error {
        EventStreamError::Transport(error) => {
            ModelError::Upstream(format!("the stream broke off: {}", describe(&error)))
        }
        EventStreamError::Utf8(error) => ModelError::Protocol(format!("not UTF-8: {error}")),
        EventStreamError::Parser(error) => ModelError::Protocol(format!("not SSE: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(retry_after: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_str(retry_after).unwrap());
        headers
    }

    #[test]
    fn retry_after_in_seconds() {
        let now = SystemTime::now();
        assert_eq!(
            retry_after(&headers("3"), now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(retry_after(&headers("3600"), now), Some(MAX_RETRY_AFTER));
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
        assert_eq!(retry_after(&headers("soon"), now), None);
    }

    #[test]
    fn retry_after_as_a_date() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(
            retry_after(&headers("Sun, 06 Nov 1994 08:49:42 GMT"), now),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            retry_after(&headers("Sun, 06 Nov 1994 08:49:00 GMT"), now),
            Some(Duration::ZERO),
            "a date in the past"
        );
    }

    #[test]
    fn endpoint_joins_and_checks() {
        assert_eq!(
            endpoint("http://localhost:8000/v1/", "chat/completions").unwrap(),
            "http://localhost:8000/v1/chat/completions"
        );
        assert!(matches!(
            endpoint("not a url", "chat/completions"),
            Err(ModelError::Connect { .. })
        ));
    }

    #[test]
    fn history_maps_to_chat_messages() {
        let request = ChatRequest {
            model: "m".into(),
            messages: vec![
                Message::Assistant {
                    content: String::new(),
                    tool_calls: vec![ToolCall {
                        id: "c1".into(),
                        name: "Bash".into(),
                        arguments: serde_json::json!({"command": "false"}),
                    }],
                },
                Message::Tool {
                    tool_call_id: "c1".into(),
                    name: "Bash".into(),
                    content: "exit 1".into(),
                    is_error: true,
                },
                Message::Assistant {
                    content: String::new(),
                    tool_calls: vec![],
                },
            ],
            ..ChatRequest::default()
        };
        assert_eq!(
            serde_json::to_value(wire_request(&request)).unwrap(),
            serde_json::json!({
                "model": "m",
                "stream": true,
                "stream_options": {"include_usage": true},
                "messages": [
                    {"role": "assistant", "content": null, "tool_calls": [{
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "Bash", "arguments": "{\"command\":\"false\"}"}
                    }]},
                    {"role": "tool", "tool_call_id": "c1", "content": "Error: exit 1"},
                    {"role": "assistant", "content": ""}
                ]
            })
        );
    }
}
