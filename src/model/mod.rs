//! Model providers.
//!
//! - [`ModelProvider`]: the trait; its required method streams
//!   ([`ModelProvider::stream`]) and [`ModelProvider::complete`] is derived.
//! - [`openai`]: OpenAI-compatible chat completions (vLLM, llama.cpp, Ollama,
//!   OpenAI, LiteLLM) with tools, SSE and retries.
//! - [`anthropic`]: the Anthropic Messages API with tools and streaming.
//! - [`demo`]: a deterministic offline model that still drives real tools.
//! - [`gateway`]: the provider of a model that names a gateway pool, in
//!   process.
//! - `http`: the shared transport: retries honouring `Retry-After`, SSE.
//! - [`lenient`]: reads tool calls and JSON that small models write loosely
//!   (used by the small harness, and to read deliberation and pipeline
//!   answers).
//! - `listing`: the models an OpenAI-compatible server lists, whose first
//!   is the default at a base URL other than OpenAI's.
//! - [`registry`]: model aliases → provider + upstream model name, prices
//!   and context windows.
//! - [`window`]: a model's context window, and what its server reports.

pub mod anthropic;
pub mod demo;
pub mod gateway;
pub(crate) mod http;
pub mod lenient;
mod listing;
pub mod openai;
pub mod reasoning;
pub mod registry;
pub mod window;

use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use reasoning::{Effort, ReasoningOptions};
pub use registry::{ModelRegistry, Price, ResolvedModel};

pub use crate::protocol::{Message, Tokens, ToolCall};

/// A tool as offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object: shared, as a turn offers the
    /// same tools to each of its model calls and a schema is a tree of
    /// maps that costs an allocation a node to copy.
    pub input_schema: Arc<Value>,
    /// The tool only reads (an MCP server's `readOnlyHint`); permission
    /// modes that ask before writes let it run.
    #[serde(default, skip)]
    pub read_only: bool,
}

pub use crate::config::ToolCallMode;

/// One request to a model.
#[derive(Debug, Clone, Default)]
pub struct ChatRequest {
    /// The upstream model name (an alias is already resolved).
    pub model: String,
    pub system: Option<String>,
    /// Shared with the turn that asks, so a call does not copy a history
    /// that grows with the session.
    pub messages: Arc<Vec<Message>>,
    pub tools: Vec<ToolSpec>,
    /// `tools` are not offered: the model is asked for its answer
    /// (OpenAI-compatible providers; Anthropic's API wants the tools of a
    /// history that used them, so it is offered them).
    pub answer_only: bool,
    pub temperature: Option<f32>,
    /// The sampling seed, sent to OpenAI-compatible servers: a request
    /// asked again as it was gets a new sample only with a new seed from a
    /// server started with a fixed one (llama-server's `--seed`).
    pub seed: Option<u64>,
    pub max_tokens: Option<u32>,
    pub tool_call_mode: ToolCallMode,
    /// Carried so gateways and traces can route and group per session.
    pub session_id: Option<String>,
    /// The key hash owning the session, so that only it reads the
    /// gateway's traces of the call.
    pub owner: Option<String>,
    /// How much the model may reason first, for providers that take it.
    pub reasoning: Option<ReasoningOptions>,
}

/// A native tool call's arguments as the model sent them: the JSON value,
/// `{}` for none, or the text itself when it is not JSON (the call is then
/// refused, or read by a harness that repairs arguments).
pub fn native_arguments(raw: &str) -> Value {
    if raw.trim().is_empty() {
        return Value::Object(Default::default());
    }
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    EndTurn,
    ToolUse,
    MaxTokens,
    Other(String),
}

/// One item of a model's stream.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    TextDelta(String),
    /// A piece of the model's reasoning, before its answer.
    ReasoningDelta(String),
    /// A whole block of reasoning to send back with the answer (a
    /// [`Message::Reasoning`]: Anthropic's signed or redacted thinking).
    Reasoning(Message),
    ToolCall(ToolCall),
    Usage(Tokens),
    Done(StopReason),
}

/// A complete answer, as [`ModelProvider::complete`] collects it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatResponse {
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub tokens: Tokens,
    pub stop_reason: Option<StopReason>,
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot reach the model at {url}: {message}")]
    Connect { url: String, message: String },
    #[error("the model answered HTTP {status}: {body}")]
    Http { status: u16, body: String },
    #[error("the model's stream is malformed: {0}")]
    Protocol(String),
    #[error("unknown model '{model}'; known models: {known}")]
    UnknownModel { model: String, known: String },
    #[error(
        "no model was named, and the default one is the first that {url} lists, which cannot \
         be read ({message}); name a model, or set OPENAI_MODEL (or default_model)"
    )]
    NoDefaultModel { url: String, message: String },
    #[error("model error: {0}")]
    Upstream(String),
    #[error(
        "the request (about {tokens} tokens) does not fit the model's context window of {window} \
         tokens, and {hint}: {message}"
    )]
    ContextExceeded {
        window: u64,
        tokens: u64,
        hint: &'static str,
        message: String,
    },
}

impl ModelError {
    /// Whether the provider refused the request as longer than the
    /// model's context window: OpenAI's `context_length_exceeded`,
    /// Anthropic's "prompt is too long", vLLM's "maximum context length",
    /// llama-server's "exceeds the available context size" (also when the
    /// gateway passes such an answer on).
    pub fn is_context_exceeded(&self) -> bool {
        let text = match self {
            ModelError::Http {
                status: 400 | 413 | 422,
                body,
            } => body,
            ModelError::Upstream(text) | ModelError::Protocol(text) => text,
            _ => return false,
        };
        let text = text.to_ascii_lowercase();
        CONTEXT_ERRORS.iter().any(|marker| text.contains(marker))
    }

    /// A short machine-readable code for `error` events.
    pub fn code(&self) -> &'static str {
        match self {
            ModelError::Connect { .. } => "model_unreachable",
            ModelError::Http { .. } => "model_http_error",
            ModelError::Protocol(_) => "model_protocol_error",
            ModelError::UnknownModel { .. } => "unknown_model",
            ModelError::NoDefaultModel { .. } => "no_default_model",
            ModelError::Upstream(_) => "model_error",
            ModelError::ContextExceeded { .. } => "context_exceeded",
        }
    }
}

/// What providers say when a request does not fit the model's window.
const CONTEXT_ERRORS: &[&str] = &[
    "context_length_exceeded",
    "maximum context length",
    "prompt is too long",
    "exceeds the available context size",
    "exceed_context_size",
    "longer than the maximum model length",
    "context window",
];

pub type ModelStream = Pin<Box<dyn Stream<Item = Result<StreamEvent, ModelError>> + Send>>;

#[async_trait]
pub trait ModelProvider: Send + Sync {
    /// `gen_ai.provider.name` of its calls' spans (`openai`, `anthropic`,
    /// or Conclave's own `conclave.demo`, `conclave.gateway`).
    fn provider_name(&self) -> &'static str;

    /// Starts one model call and streams its output. Errors before the first
    /// byte (after retries) are returned here; errors mid-stream are items.
    async fn stream(&self, request: ChatRequest) -> Result<ModelStream, ModelError>;

    /// The context window the model's server reports for `model`, when it
    /// reports one (vLLM, llama-server).
    async fn context_window(&self, _model: &str) -> Option<u64> {
        None
    }

    /// The whole answer at once, collected from [`ModelProvider::stream`].
    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        let mut stream = self.stream(request).await?;
        let mut response = ChatResponse::default();
        while let Some(event) = stream.next().await {
            match event? {
                StreamEvent::TextDelta(text) => response.text.push_str(&text),
                StreamEvent::ReasoningDelta(_) | StreamEvent::Reasoning(_) => {}
                StreamEvent::ToolCall(call) => response.tool_calls.push(call),
                StreamEvent::Usage(tokens) => response.tokens = tokens,
                StreamEvent::Done(reason) => response.stop_reason = Some(reason),
            }
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::ModelError;

    fn http(status: u16, body: &str) -> ModelError {
        ModelError::Http {
            status,
            body: body.into(),
        }
    }

    /// Each provider's words for a request longer than the window, and
    /// none of the errors that look like them.
    #[test]
    fn a_providers_context_error_is_told_from_the_others() {
        let openai = r#"{"error": {"message": "This model's maximum context length is 16384 tokens.", "code": "context_length_exceeded"}}"#;
        let anthropic = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
        let vllm = r#"{"object":"error","message":"This model's maximum context length is 2048 tokens. However, you requested 2100 tokens","code":400}"#;
        let llama = r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error"}}"#;
        for body in [openai, anthropic, vllm, llama] {
            assert!(http(400, body).is_context_exceeded(), "{body}");
        }
        assert!(ModelError::Upstream(format!("HTTP 400: {llama}")).is_context_exceeded());
        // A rate limit or a server error is not one, whatever it says.
        assert!(!http(429, openai).is_context_exceeded());
        assert!(!http(500, anthropic).is_context_exceeded());
        assert!(
            !http(400, r#"{"error": {"message": "invalid tool schema"}}"#).is_context_exceeded()
        );
        let refused = ModelError::ContextExceeded {
            window: 2048,
            tokens: 2300,
            hint: "compaction is off (options.compaction)",
            message: "HTTP 400".into(),
        };
        assert_eq!(refused.code(), "context_exceeded");
        assert!(
            refused
                .to_string()
                .contains("context window of 2048 tokens")
        );
    }
}
