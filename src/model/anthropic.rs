//! The Anthropic Messages API: `POST {base_url}/v1/messages`, streamed as
//! SSE.
//!
//! Text arrives as `text_delta`s and is passed on at once; a `tool_use`
//! block's input arrives as `input_json_delta` fragments and is emitted as
//! one [`ToolCall`] when the block stops. Retries, error bodies and the SSE
//! pump are the ones of [`super::openai`].

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use eventsource_stream::Event;
use reqwest::header::{HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::http::{SseDecoder, Transport, endpoint, malformed, secret_header, spawn_sse};
use super::{
    ChatRequest, Message, ModelError, ModelProvider, ModelStream, StopReason, StreamEvent, Tokens,
    ToolCall,
};

const API_VERSION: &str = "2023-06-01";
/// The API requires `max_tokens`; this is used when the request has none.
const DEFAULT_MAX_TOKENS: u32 = 4096;

pub struct AnthropicProvider {
    /// `{base_url}/v1/messages`.
    url: String,
    transport: Transport,
}

impl AnthropicProvider {
    pub fn new(
        base_url: &str,
        api_key: Option<String>,
        max_retries: u32,
        timeout: Duration,
    ) -> Result<AnthropicProvider, ModelError> {
        let mut headers = HeaderMap::new();
        headers.insert("anthropic-version", HeaderValue::from_static(API_VERSION));
        if let Some(key) = api_key.filter(|key| !key.is_empty()) {
            headers.insert("x-api-key", secret_header(&key)?);
        }
        Ok(AnthropicProvider {
            url: endpoint(base_url, "v1/messages")?,
            transport: Transport::new(headers, max_retries, timeout)?,
        })
    }
}

#[async_trait]
impl ModelProvider for AnthropicProvider {
    fn provider_name(&self) -> &'static str {
        "anthropic"
    }

    async fn stream(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        let body = serde_json::to_vec(&wire_request(&request))
            .map_err(|e| ModelError::Protocol(format!("cannot encode the request: {e}")))?;
        let response = self
            .transport
            .post(&self.url, HeaderMap::new(), body)
            .await?;
        Ok(spawn_sse(response, EventDecoder::default()))
    }
}

#[derive(Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    max_tokens: u32,
    stream: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    system: Vec<Marked<'a>>,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<Metadata<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<Thinking>,
}

/// Extended thinking, with the most tokens it may take.
#[derive(Serialize)]
struct Thinking {
    r#type: &'static str,
    budget_tokens: u32,
}

#[derive(Serialize)]
struct Metadata<'a> {
    /// The session id: the API's handle for telling callers apart.
    user_id: &'a str,
}

#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    content: Vec<Marked<'a>>,
}

/// A block, with a prompt cache breakpoint after it when `cache_control`
/// is set: the provider caches the request up to and including it.
#[derive(Serialize)]
struct Marked<'a> {
    #[serde(flatten)]
    block: Block<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

impl<'a> From<Block<'a>> for Marked<'a> {
    fn from(block: Block<'a>) -> Marked<'a> {
        Marked {
            block,
            cache_control: None,
        }
    }
}

/// Anthropic's only kind of cache entry (kept five minutes).
#[derive(Serialize, Clone, Copy)]
struct CacheControl {
    r#type: &'static str,
}

const EPHEMERAL: Option<CacheControl> = Some(CacheControl {
    r#type: "ephemeral",
});

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Text {
        text: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: &'a Value,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: &'a str,
        is_error: bool,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    RedactedThinking {
        data: &'a str,
    },
}

#[derive(Serialize)]
struct WireTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

/// The request, with prompt cache breakpoints after the tools, after the
/// system prompt and after the last message's last block: three of the
/// API's four. The tools and the system prompt are the same on every call
/// of a session, and each call's history starts with the last one's, so
/// the next call reads what this one wrote (the API looks back for an
/// earlier breakpoint's entry).
fn wire_request(request: &ChatRequest) -> WireRequest<'_> {
    let mut tools: Vec<WireTool> = request
        .tools
        .iter()
        .map(|tool| WireTool {
            name: &tool.name,
            description: &tool.description,
            input_schema: &tool.input_schema,
            cache_control: None,
        })
        .collect();
    if let Some(last) = tools.last_mut() {
        last.cache_control = EPHEMERAL;
    }
    let system = request
        .system
        .as_deref()
        .and_then(text_block)
        .map(|text| Marked {
            block: text,
            cache_control: EPHEMERAL,
        });
    let mut messages = wire_messages(&request.messages);
    if let Some(last) = messages.last_mut().and_then(|m| m.content.last_mut())
        && !matches!(
            last.block,
            Block::Thinking { .. } | Block::RedactedThinking { .. }
        )
    {
        last.cache_control = EPHEMERAL;
    }
    let mut max_tokens = request.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    let mut temperature = request.temperature;
    let thinking = request.reasoning.and_then(|r| r.budget()).map(|budget| {
        // The API wants room for an answer after the budget, and no
        // temperature but its own with thinking on.
        max_tokens = max_tokens.max(budget + DEFAULT_MAX_TOKENS);
        temperature = None;
        Thinking {
            r#type: "enabled",
            budget_tokens: budget,
        }
    });
    WireRequest {
        model: &request.model,
        max_tokens,
        stream: true,
        system: system.into_iter().collect(),
        messages,
        tools,
        temperature,
        thinking,
        metadata: request
            .session_id
            .as_deref()
            .map(|user_id| Metadata { user_id }),
    }
}

/// Messages as content blocks. Tool results are user content, and blocks
/// of consecutive messages of one role share a message, so the results of
/// parallel calls arrive together as the API wants. Empty text is dropped:
/// the API rejects empty text blocks.
fn wire_messages(messages: &[Message]) -> Vec<WireMessage<'_>> {
    let mut wire: Vec<WireMessage> = Vec::new();
    for message in messages {
        let (role, blocks): (&'static str, Vec<Block>) = match message {
            Message::User { content }
            | Message::Compacted {
                summary: content, ..
            } => ("user", text_block(content).into_iter().collect()),
            Message::Assistant {
                content,
                tool_calls,
            } => (
                "assistant",
                text_block(content)
                    .into_iter()
                    .chain(tool_calls.iter().map(|call| Block::ToolUse {
                        id: &call.id,
                        name: &call.name,
                        input: &call.arguments,
                    }))
                    .collect(),
            ),
            Message::Reasoning {
                text,
                signature,
                redacted,
            } => (
                "assistant",
                match (signature, redacted) {
                    (_, Some(data)) => vec![Block::RedactedThinking { data }],
                    (Some(signature), None) => vec![Block::Thinking {
                        thinking: text,
                        signature,
                    }],
                    // Unsigned reasoning is not sent back.
                    (None, None) => Vec::new(),
                },
            ),
            Message::Tool {
                tool_call_id,
                content,
                is_error,
                ..
            } => (
                "user",
                vec![Block::ToolResult {
                    tool_use_id: tool_call_id,
                    content,
                    is_error: *is_error,
                }],
            ),
        };
        if blocks.is_empty() {
            continue;
        }
        match wire.last_mut() {
            Some(last) if last.role == role => {
                last.content.extend(blocks.into_iter().map(Marked::from));
            }
            _ => wire.push(WireMessage {
                role,
                content: blocks.into_iter().map(Marked::from).collect(),
            }),
        }
    }
    wire
}

fn text_block(text: &str) -> Option<Block<'_>> {
    (!text.is_empty()).then_some(Block::Text { text })
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireEvent {
    MessageStart {
        message: StartedMessage,
    },
    ContentBlockStart {
        index: u32,
        content_block: StartedBlock,
    },
    ContentBlockDelta {
        index: u32,
        delta: BlockDelta,
    },
    ContentBlockStop {
        index: u32,
    },
    MessageDelta {
        delta: MessageDelta,
        usage: Option<WireUsage>,
    },
    MessageStop,
    Error {
        error: WireError,
    },
    /// `ping` and whatever later API versions add.
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct StartedMessage {
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StartedBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
        #[serde(default)]
        signature: Option<String>,
    },
    RedactedThinking {
        data: String,
    },
    /// Blocks we do not pass on.
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockDelta {
    TextDelta {
        text: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    ThinkingDelta {
        thinking: String,
    },
    SignatureDelta {
        signature: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct MessageDelta {
    stop_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
}

impl WireUsage {
    /// Every input token, cached or not; `None` when the event has no count.
    fn input(&self) -> Option<u64> {
        let parts = [
            self.input_tokens,
            self.cache_creation_input_tokens,
            self.cache_read_input_tokens,
        ];
        parts
            .iter()
            .any(Option::is_some)
            .then(|| parts.iter().flatten().sum())
    }
}

#[derive(Deserialize)]
struct WireError {
    r#type: String,
    message: String,
}

/// A `tool_use` block whose input is still arriving.
struct PartialToolUse {
    id: String,
    name: String,
    /// The input given at the block's start, used when no fragment follows.
    input: Value,
    json: String,
}

/// Turns Messages API events into stream events.
#[derive(Default)]
struct EventDecoder {
    tool_uses: HashMap<u32, PartialToolUse>,
    /// Thinking blocks still arriving: their text and signature.
    thinking: HashMap<u32, (String, Option<String>)>,
    tokens: Tokens,
    stop: Option<StopReason>,
}

impl SseDecoder for EventDecoder {
    fn decode(&mut self, event: &Event, out: &mut Vec<StreamEvent>) -> Result<bool, ModelError> {
        let wire: WireEvent = serde_json::from_str(&event.data)
            .map_err(|e| malformed("Messages event", &event.data, &e))?;
        match wire {
            WireEvent::MessageStart { message } => {
                if let Some(usage) = message.usage {
                    self.count(&usage);
                }
            }
            WireEvent::ContentBlockStart {
                index,
                content_block,
            } => match content_block {
                StartedBlock::Text { text } if !text.is_empty() => {
                    out.push(StreamEvent::TextDelta(text));
                }
                StartedBlock::ToolUse { id, name, input } => {
                    self.tool_uses.insert(
                        index,
                        PartialToolUse {
                            id,
                            name,
                            input,
                            json: String::new(),
                        },
                    );
                }
                StartedBlock::Thinking {
                    thinking,
                    signature,
                } => {
                    if !thinking.is_empty() {
                        out.push(StreamEvent::ReasoningDelta(thinking.clone()));
                    }
                    self.thinking.insert(index, (thinking, signature));
                }
                StartedBlock::RedactedThinking { data } => {
                    out.push(StreamEvent::Reasoning(Message::Reasoning {
                        text: String::new(),
                        signature: None,
                        redacted: Some(data),
                    }));
                }
                StartedBlock::Text { .. } | StartedBlock::Other => {}
            },
            WireEvent::ContentBlockDelta { index, delta } => match delta {
                BlockDelta::TextDelta { text } if !text.is_empty() => {
                    out.push(StreamEvent::TextDelta(text));
                }
                BlockDelta::InputJsonDelta { partial_json } => {
                    let tool_use = self.tool_uses.get_mut(&index).ok_or_else(|| {
                        ModelError::Protocol(format!("input for block {index}, not a tool_use"))
                    })?;
                    tool_use.json.push_str(&partial_json);
                }
                BlockDelta::ThinkingDelta { thinking } => {
                    if let Some((text, _)) = self.thinking.get_mut(&index) {
                        text.push_str(&thinking);
                    }
                    out.push(StreamEvent::ReasoningDelta(thinking));
                }
                BlockDelta::SignatureDelta { signature } => {
                    if let Some((_, signed)) = self.thinking.get_mut(&index) {
                        *signed = Some(signature);
                    }
                }
                BlockDelta::TextDelta { .. } | BlockDelta::Other => {}
            },
            WireEvent::ContentBlockStop { index } => {
                if let Some((text, signature)) = self.thinking.remove(&index) {
                    out.push(StreamEvent::Reasoning(Message::Reasoning {
                        text,
                        signature,
                        redacted: None,
                    }));
                }
                if let Some(tool_use) = self.tool_uses.remove(&index) {
                    let arguments = if tool_use.json.trim().is_empty() {
                        tool_use.input
                    } else {
                        super::native_arguments(&tool_use.json)
                    };
                    out.push(StreamEvent::ToolCall(ToolCall {
                        id: tool_use.id,
                        name: tool_use.name,
                        arguments,
                    }));
                }
            }
            WireEvent::MessageDelta { delta, usage } => {
                if let Some(usage) = usage {
                    self.count(&usage);
                }
                if let Some(reason) = delta.stop_reason {
                    self.stop = Some(match reason.as_str() {
                        "end_turn" | "stop_sequence" => StopReason::EndTurn,
                        "tool_use" => StopReason::ToolUse,
                        "max_tokens" => StopReason::MaxTokens,
                        _ => StopReason::Other(reason),
                    });
                }
            }
            WireEvent::MessageStop => {
                out.push(StreamEvent::Usage(self.tokens));
                out.push(StreamEvent::Done(
                    self.stop.take().unwrap_or(StopReason::EndTurn),
                ));
                return Ok(true);
            }
            WireEvent::Error { error } => {
                return Err(ModelError::Upstream(format!(
                    "{}: {}",
                    error.r#type, error.message
                )));
            }
            WireEvent::Other => {}
        }
        Ok(false)
    }

    fn finish(&mut self, _out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        Err(ModelError::Protocol(
            "the stream ended before message_stop".into(),
        ))
    }
}

impl EventDecoder {
    /// Counts are cumulative: later events replace earlier ones.
    fn count(&mut self, usage: &WireUsage) {
        if let Some(input) = usage.input() {
            self.tokens.input = input;
            self.tokens.cache_read = usage.cache_read_input_tokens.unwrap_or(0);
            self.tokens.cache_write = usage.cache_creation_input_tokens.unwrap_or(0);
        }
        if let Some(output) = usage.output_tokens {
            self.tokens.output = output;
        }
    }
}
