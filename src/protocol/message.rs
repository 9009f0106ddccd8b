//! The conversation history a session keeps: messages and tool calls, in
//! a provider-neutral shape (each provider maps them to its own API).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// One message of a conversation, in a provider-neutral shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    User {
        content: String,
    },
    Assistant {
        content: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    Tool {
        tool_call_id: String,
        name: String,
        content: String,
        #[serde(default)]
        is_error: bool,
    },
    /// The history before this point was compacted: from here on the
    /// model is sent `summary` (as a user message), then the messages from
    /// index `kept_from` on, this one and earlier marks left out. The
    /// messages it summarises stay stored, so a fork or a rewind to before
    /// it gets the history as it was.
    Compacted {
        summary: String,
        kept_from: u64,
    },
    /// The model's reasoning before the assistant message that follows,
    /// kept because its provider wants it sent back with that message:
    /// Anthropic's thinking blocks, each `signature`d, or `redacted` (the
    /// reasoning encrypted). Other providers are sent none of it.
    Reasoning {
        #[serde(default, skip_serializing_if = "String::is_empty")]
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        redacted: Option<String>,
    },
}

/// A complete tool call: the arguments are whole, never a fragment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}
