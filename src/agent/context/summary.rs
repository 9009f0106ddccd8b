//! The summary a compaction asks a model for: the part of the history to
//! summarise, as a transcript, with the summary before it; in pieces when
//! the transcript does not fit the summarising model's window.

use std::fmt::Write as _;

use super::estimate::text_tokens;
use crate::model::{ChatRequest, Message, ModelError, ResolvedModel};

/// What the summarising model is asked.
pub(crate) const PROMPT: &str = "You compact the history of an AI agent's working session so \
     that the agent can go on within its model's context window. Write the summary it will \
     continue from, with: the task as the user gave it (quote short requests word for word) and \
     how it changed; the decisions taken and why; the files created, changed or read that \
     matter, with their paths; the commands that worked, and those that failed with the reason; \
     the current state of the work; the open items and next steps. Be concrete and complete, \
     and answer with the summary alone.";

/// The most of one message's text the summariser is sent: a long tool
/// output's head and tail.
const ENTRY_LIMIT: usize = 4000;

/// A message as a transcript entry.
fn entry(message: &Message) -> Option<String> {
    Some(match message {
        // What the model thought is not what the summary keeps.
        Message::Reasoning { .. } => return None,
        Message::User { content } => format!("[user]\n{}", clip(content)),
        Message::Assistant {
            content,
            tool_calls,
        } => {
            let mut entry = format!("[assistant]\n{}", clip(content));
            for call in tool_calls {
                let arguments = call.arguments.to_string();
                let _ = write!(entry, "\n[calls {} {}]", call.name, clip(&arguments));
            }
            entry
        }
        Message::Tool {
            name,
            content,
            is_error,
            ..
        } => {
            let failed = if *is_error { " (failed)" } else { "" };
            format!("[{name} result{failed}]\n{}", clip(content))
        }
        Message::Compacted { .. } => return None,
    })
}

/// `text`, or its head and tail with what is left out between them said.
fn clip(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= ENTRY_LIMIT {
        return text.into();
    }
    let head = floor(text, ENTRY_LIMIT / 2);
    let tail = ceil(text, text.len() - ENTRY_LIMIT / 2);
    format!(
        "{}\n[… {} bytes left out …]\n{}",
        &text[..head],
        tail - head,
        &text[tail..]
    )
    .into()
}

fn floor(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn ceil(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

/// The transcript of `messages` in pieces of at most `piece_tokens`
/// (estimated) each; one entry over that is a piece of its own.
pub(crate) fn pieces<'a>(
    messages: impl IntoIterator<Item = &'a Message>,
    piece_tokens: u64,
) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut last = String::new();
    for entry in messages.into_iter().filter_map(entry) {
        if !last.is_empty() && text_tokens(last.len() + entry.len()) > piece_tokens {
            pieces.push(std::mem::replace(&mut last, entry));
        } else {
            if !last.is_empty() {
                last.push_str("\n\n");
            }
            last.push_str(&entry);
        }
    }
    pieces.push(last);
    pieces
}

/// The request for one piece: the summary so far (the last compaction's,
/// or the last piece's), then the piece.
pub(crate) fn request(
    model: &ResolvedModel,
    previous: Option<&str>,
    piece: String,
    max_tokens: u32,
) -> ChatRequest {
    let mut content = String::new();
    if let Some(previous) = previous {
        let _ = write!(
            content,
            "The summary of the session so far:\n<summary>\n{previous}\n</summary>\n\n\
             What happened after it, to add to it:\n"
        );
    } else {
        content.push_str("The part of the session to summarise:\n");
    }
    let _ = write!(content, "<history>\n{piece}\n</history>");
    ChatRequest {
        model: model.upstream_model.clone(),
        system: Some(PROMPT.to_owned()),
        messages: std::sync::Arc::new(vec![Message::User { content }]),
        max_tokens: Some(max_tokens),
        ..ChatRequest::default()
    }
}

/// The summary a reply gives, or why it gives none.
pub(crate) fn summary_of(text: String) -> Result<String, ModelError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(ModelError::Upstream(
            "the model gave an empty summary of the history".into(),
        ));
    }
    Ok(text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_output_keeps_its_head_and_tail() {
        let text = format!(
            "{}{}{}",
            "h".repeat(3000),
            "m".repeat(10_000),
            "t".repeat(3000)
        );
        let clipped = clip(&text);
        assert!(clipped.starts_with(&"h".repeat(2000)));
        assert!(clipped.ends_with(&"t".repeat(2000)));
        assert!(clipped.contains("[… 12000 bytes left out …]"));
        assert_eq!(clip("short"), "short");
        let wide = "é".repeat(3000);
        assert!(clip(&wide).contains("left out"));
    }

    #[test]
    fn a_transcript_comes_in_pieces_that_fit() {
        let messages: Vec<Message> = (0..10)
            .map(|i| Message::User {
                content: format!("{i}{}", "x".repeat(600)),
            })
            .collect();
        let pieces = pieces(&messages, 500);
        assert!(pieces.len() >= 5, "{}", pieces.len());
        assert!(pieces.iter().all(|p| text_tokens(p.len()) <= 500));
        assert!(pieces[0].starts_with("[user]\n0"));
        let marks = [Message::Compacted {
            summary: "s".into(),
            kept_from: 0,
        }];
        assert_eq!(super::pieces(&marks, 500), vec![String::new()]);
    }
}
