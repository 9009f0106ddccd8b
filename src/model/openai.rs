//! OpenAI-compatible chat completions (vLLM, llama.cpp, Ollama, OpenAI,
//! LiteLLM, the gateway): `POST {base_url}/chat/completions`, streamed as SSE.
//!
//! - Tool-call fragments are put together per `index` and emitted whole when
//!   the choice finishes. Calls come only from that channel: text is text
//!   (a harness may read calls out of it; see `agent::harness`).
//! - [`ToolCallMode::JsonSchema`] sends a `response_format` in place of the
//!   tools and reads the answer or call from the JSON the model wrote.
//! - The HTTP side — retries with backoff that honour `Retry-After`, error
//!   bodies, the task that pumps SSE events into a [`ModelStream`] — is
//!   [`super::http`], shared with [`super::anthropic`].

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use eventsource_stream::Event;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::http::{SseDecoder, Transport, endpoint, malformed, secret_header, spawn_sse};
use super::lenient;
use super::window::ReportedWindows;
use super::{
    ChatRequest, Message, ModelError, ModelProvider, ModelStream, StopReason, StreamEvent, Tokens,
    ToolCall, ToolCallMode, ToolSpec,
};

pub struct OpenAiProvider {
    /// `{base_url}/chat/completions`.
    url: String,
    transport: Transport,
    windows: ReportedWindows,
}

impl OpenAiProvider {
    pub fn new(
        base_url: &str,
        api_key: Option<String>,
        max_retries: u32,
        timeout: Duration,
    ) -> Result<OpenAiProvider, ModelError> {
        let mut headers = HeaderMap::new();
        if let Some(key) = api_key.as_deref().filter(|key| !key.is_empty()) {
            headers.insert(AUTHORIZATION, secret_header(&format!("Bearer {key}"))?);
        }
        Ok(OpenAiProvider {
            url: endpoint(base_url, "chat/completions")?,
            windows: ReportedWindows::new(base_url, api_key.as_deref())?,
            transport: Transport::new(headers, max_retries, timeout)?,
        })
    }
}

#[async_trait]
impl ModelProvider for OpenAiProvider {
    fn provider_name(&self) -> &'static str {
        "openai"
    }

    async fn context_window(&self, model: &str) -> Option<u64> {
        self.windows.of(model).await
    }

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
pub(crate) struct WireRequest<'a> {
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
    seed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_effort: Option<&'static str>,
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

pub(crate) fn wire_request(request: &ChatRequest) -> WireRequest<'_> {
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
    // Reasoning is not sent back: OpenAI-compatible servers take none.
    messages.extend(request.messages.iter().filter_map(wire_message));
    let tools = if json_mode || request.answer_only {
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
        seed: request.seed,
        max_tokens: request.max_tokens,
        reasoning_effort: request
            .reasoning
            .and_then(|r| r.effort)
            .map(super::Effort::as_str),
        user: request.session_id.as_deref(),
    }
}

/// The JSON-schema protocol needs tools to choose from; without any the
/// model simply writes text.
fn json_mode(request: &ChatRequest) -> bool {
    request.tool_call_mode == ToolCallMode::JsonSchema
        && !request.tools.is_empty()
        && !request.answer_only
}

fn wire_message(message: &Message) -> Option<WireMessage<'_>> {
    Some(match message {
        Message::Reasoning { .. } => return None,
        // A turn sends the summary as a user message (see
        // `agent::context`); a mark reaching a provider reads the same.
        Message::User { content }
        | Message::Compacted {
            summary: content, ..
        } => WireMessage::User { content },
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
    })
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
    /// The reasoning before the answer: `reasoning_content` (vLLM,
    /// llama-server, DeepSeek) or `reasoning` (newer vLLM, OpenRouter;
    /// a server sending both sends the same text twice).
    reasoning_content: Option<String>,
    reasoning: Option<String>,
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
    /// `cached_tokens`: the part of the prompt read from the cache.
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: u64,
}

/// A tool call whose fragments are still arriving.
#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// Turns chat-completion chunks into stream events.
pub(crate) struct ChunkDecoder {
    /// The tools offered, to read the JSON-schema protocol's calls.
    tools: Vec<ToolSpec>,
    json_mode: bool,
    /// The content so far, kept only in the JSON-schema protocol.
    text: String,
    /// Calls of the current choice by `index`, emitted in index order.
    pending: BTreeMap<u32, PartialCall>,
    called: bool,
    stop: Option<StopReason>,
    usage: Option<Usage>,
}

impl ChunkDecoder {
    pub(crate) fn new(request: ChatRequest) -> ChunkDecoder {
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
                    arguments: super::native_arguments(&call.arguments),
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
        }
        if let Some(usage) = self.usage.take() {
            out.push(StreamEvent::Usage(Tokens {
                input: usage.prompt_tokens,
                output: usage.completion_tokens,
                cache_read: usage.prompt_tokens_details.map_or(0, |d| d.cached_tokens),
                cache_write: 0,
            }));
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
            let (content, reasoning, tool_calls) = choice
                .delta
                .map(|delta| {
                    let reasoning = delta.reasoning_content.or(delta.reasoning);
                    (delta.content, reasoning, delta.tool_calls)
                })
                .unwrap_or_default();
            if let Some(thought) = reasoning.filter(|text| !text.is_empty()) {
                out.push(StreamEvent::ReasoningDelta(thought));
            }
            if let Some(text) = content.filter(|text| !text.is_empty()) {
                if self.json_mode {
                    self.text.push_str(&text);
                } else {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_maps_to_chat_messages() {
        let request = ChatRequest {
            model: "m".into(),
            messages: std::sync::Arc::new(vec![
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
            ]),
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
