//! The harness for small local models (`models.NAME.harness = "small"`):
//! the strict loop plus the aids below, each one file, asked in the order
//! [`aids`] lists them. Each reports what it does as an `intervention`.
//!
//! - [`prompt`]: the default system prompt lists the tools and writes out
//!   one worked call.
//! - [`text_calls`]: calls read out of the reply's text (or, with
//!   `tool_call_mode = "json_schema"`, out of the one JSON object every
//!   reply is constrained to); arguments that are not a JSON object read
//!   as one; a reply that meant a call and cannot be read is told the
//!   format once.
//! - [`loops`]: a reply that loops is cut while it streams.
//! - [`resample`]: an empty reply is not kept; the model is asked again.
//! - [`fix`]: a call that failed the same way twice is not repeated; the
//!   model is asked for a fix, quoting the error.
//! - [`answer`]: after a call that printed, the reply's later calls do not
//!   run and the model is asked for its answer without tools.
//! - [`repeats`]: a repeated read is answered from its earlier output when
//!   nothing since may have changed what it reads; an output printed three
//!   times is taken as the answer.
//! - [`names`]: a tool name that is not offered is taken as the tool it
//!   most plausibly means.
//! - [`arguments`]: arguments brought to the tool's schema.
//! - [`cells`]: Python cells run with repairs.

pub mod answer;
pub mod arguments;
pub mod cells;
pub mod fix;
pub mod loops;
pub mod names;
pub mod prompt;
pub mod repeats;
pub mod resample;
pub mod text_calls;

use std::sync::Arc;

use serde_json::Value;

use super::Aid;
use crate::agent::tools::ToolOutput;
use crate::config::ToolCallMode;
use crate::model::Message;

/// The small harness's aids, in the order the loop asks them.
pub fn aids(tool_call_mode: ToolCallMode) -> Vec<Box<dyn Aid>> {
    vec![
        Box::new(prompt::WorkedExample),
        Box::new(text_calls::TextCalls::new(tool_call_mode)),
        Box::new(loops::Loops::default()),
        Box::new(resample::Resample::default()),
        Box::new(fix::Fix::default()),
        Box::new(answer::AnswerAfterOutput::default()),
        Box::new(repeats::Repeats::default()),
        Box::new(names::Names),
        Box::new(arguments::Arguments),
        Box::new(cells::Cells::default()),
    ]
}

/// The temperature of a model call asked again (an empty reply, a repeated
/// failure), when the session sets none: at the upstream's default (often
/// 0) a small model writes the same reply again.
pub(crate) const VARIED_TEMPERATURE: f32 = 0.7;

/// Samples the next call anew: a varied temperature unless the session set
/// one, and a new seed (a server started with a fixed seed, such as
/// llama-server's `--seed`, otherwise samples the same reply again).
fn sample_anew(next: &mut super::NextCall<'_>) {
    next.request.temperature.get_or_insert(VARIED_TEMPERATURE);
    next.request.seed = Some(next.calls_made);
}

/// The history with one more user message; sent, not stored.
fn with_last_word(history: &Arc<Vec<Message>>, content: String) -> Arc<Vec<Message>> {
    let mut messages = Vec::with_capacity(history.len() + 1);
    messages.extend(history.iter().cloned());
    messages.push(Message::User { content });
    Arc::new(messages)
}

/// What a successful call printed, when it printed something: its text,
/// or an execution's stdout.
fn printed(output: &ToolOutput) -> Option<String> {
    if output.is_error {
        return None;
    }
    let text = match &output.output {
        Value::String(text) => text.as_str(),
        Value::Object(fields) => fields.get("stdout").and_then(Value::as_str)?,
        _ => return None,
    };
    let text = text.trim_end();
    (!text.trim().is_empty()).then(|| text.to_string())
}

#[cfg(test)]
pub(crate) fn test_call(name: &str, arguments: Value) -> crate::model::ToolCall {
    crate::model::ToolCall {
        id: "c".into(),
        name: name.into(),
        arguments,
    }
}
