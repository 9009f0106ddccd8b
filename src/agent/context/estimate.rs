//! A request's size in tokens where the provider has not counted it: a
//! high estimate from its bytes, so that a request is compacted early
//! rather than refused. English prose runs about four bytes a token in
//! the tokenizers of today's models, code and JSON closer to three.

use crate::model::{Message, ToolSpec};

const BYTES_PER_TOKEN: u64 = 3;
/// What a message costs beyond its text: its role and separators.
const PER_MESSAGE: u64 = 4;

pub(crate) fn text_tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(BYTES_PER_TOKEN)
}

/// The bytes of text `tokens` hold, by the same count.
pub(crate) fn bytes_of(tokens: u64) -> usize {
    usize::try_from(tokens.saturating_mul(BYTES_PER_TOKEN)).unwrap_or(usize::MAX)
}

pub(crate) fn message_tokens(message: &Message) -> u64 {
    let bytes = match message {
        Message::User { content } => content.len(),
        Message::Assistant {
            content,
            tool_calls,
        } => {
            content.len()
                + tool_calls
                    .iter()
                    .map(|call| call.id.len() + call.name.len() + json_len(&call.arguments))
                    .sum::<usize>()
        }
        Message::Tool {
            tool_call_id,
            name,
            content,
            ..
        } => tool_call_id.len() + name.len() + content.len(),
        Message::Compacted { summary, .. } => summary.len(),
        Message::Reasoning {
            text,
            signature,
            redacted,
        } => {
            text.len()
                + signature.as_ref().map_or(0, String::len)
                + redacted.as_ref().map_or(0, String::len)
        }
    };
    PER_MESSAGE + text_tokens(bytes)
}

pub(crate) fn messages_tokens<'a>(messages: impl IntoIterator<Item = &'a Message>) -> u64 {
    messages.into_iter().map(message_tokens).sum()
}

/// What every request of a turn carries besides its messages: the system
/// prompt and the tools' names, descriptions and schemas.
pub(crate) fn fixed_tokens(system: Option<&str>, tools: &[ToolSpec]) -> u64 {
    let tools: usize = tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + json_len(&t.input_schema))
        .sum();
    text_tokens(system.map_or(0, str::len) + tools)
}

fn json_len(value: &serde_json::Value) -> usize {
    serde_json::to_vec(value).map_or(0, |bytes| bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_estimate_counts_every_part_of_a_message() {
        let call = Message::Assistant {
            content: "abc".into(),
            tool_calls: vec![crate::model::ToolCall {
                id: "c1".into(),
                name: "Bash".into(),
                arguments: serde_json::json!({"command": "ls"}),
            }],
        };
        // 3 + 2 + 4 + 16 bytes, a token per 3 started, and the message's 4.
        assert_eq!(message_tokens(&call), 4 + 9);
        let output = Message::Tool {
            tool_call_id: "c1".into(),
            name: "Bash".into(),
            content: "x".repeat(3000),
            is_error: false,
        };
        assert_eq!(message_tokens(&output), 4 + 1002);
        assert_eq!(messages_tokens([&call, &output]), 13 + 1006);
    }
}
