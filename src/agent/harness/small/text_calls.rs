//! Calls a small model writes into its text instead of the provider's
//! tool-call channel (`{"name": …, "arguments": {…}}`, bare, fenced or in
//! `<tool_call>` tags), and arguments that are not quite a JSON object.
//! With `tool_call_mode = "json_schema"` every reply is constrained to one
//! JSON object, an answer or one call, which the provider reads.

use serde_json::Value;

use crate::agent::harness::{Aid, Interventions, ModelReply, NextCall, OnReply, say};
use crate::config::ToolCallMode;
use crate::model::{ToolSpec, lenient};
use crate::protocol::InterventionKind;

pub struct TextCalls {
    tool_call_mode: ToolCallMode,
    /// The format was explained once this turn; a second unreadable reply
    /// is the answer.
    told: bool,
}

impl TextCalls {
    pub fn new(tool_call_mode: ToolCallMode) -> TextCalls {
        TextCalls {
            tool_call_mode,
            told: false,
        }
    }
}

impl Aid for TextCalls {
    fn before_call(&mut self, next: &mut NextCall<'_>, _say: &mut Interventions) {
        next.request.tool_call_mode = self.tool_call_mode;
    }

    fn on_reply(
        &mut self,
        reply: &mut ModelReply,
        tools: &[ToolSpec],
        out: &mut Interventions,
    ) -> OnReply {
        if reply.calls.is_empty() && !tools.is_empty() {
            match lenient::recover_tool_calls(&reply.text, tools) {
                Some(recovered) => {
                    let names: Vec<&str> =
                        recovered.calls.iter().map(|c| c.name.as_str()).collect();
                    say(
                        out,
                        InterventionKind::CallRecovered,
                        format!(
                            "{} call(s) read from the reply's text: {}",
                            recovered.calls.len(),
                            names.join(", ")
                        ),
                    );
                    // The calls are kept once, as calls: a small model
                    // shown its call twice (or twenty times, when its reply
                    // looped) copies it again. A looping reply cut mid-call
                    // leaves the start of one more.
                    reply.text = if looks_like_a_call(&recovered.text) {
                        String::new()
                    } else {
                        recovered.text.trim().to_string()
                    };
                    reply.calls = recovered.calls;
                }
                None if !self.told && looks_like_a_call(&reply.text) => {
                    self.told = true;
                    say(
                        out,
                        InterventionKind::FormatExplained,
                        "the reply looked like a tool call but could not be read; the model \
                         is told the format and asked once more",
                    );
                    return OnReply::Tell(unreadable_call_note(tools));
                }
                None => {}
            }
        }
        for call in &mut reply.calls {
            if let Value::String(raw) = &call.arguments {
                let read = lenient::parse_arguments(raw);
                if read.is_object() && read.get("_raw").is_none() {
                    say(
                        out,
                        InterventionKind::ArgumentsRepaired,
                        format!("the arguments of {} were read as a JSON object", call.name),
                    );
                    call.arguments = read;
                }
            }
        }
        OnReply::Keep
    }
}

/// Whether text that made no call was meant as one: JSON, a JSON fence or
/// a tool-call tag.
fn looks_like_a_call(text: &str) -> bool {
    let text = text.trim_start();
    text.starts_with('{')
        || text.starts_with('[')
        || text.contains("```json")
        || text.contains("<tool_call>")
        || (text.contains("\"arguments\"") && text.contains("\"name\""))
}

/// What a model whose call could not be read is told.
fn unreadable_call_note(tools: &[ToolSpec]) -> String {
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    format!(
        "Your last reply could not be read as a tool call. To call a tool, reply with \
         only {{\"name\": \"<tool>\", \"arguments\": {{...}}}} using one of: {}. \
         To give your final answer, reply in plain text.",
        names.join(", ")
    )
}
