//! A small model that printed what was asked often calls again instead of
//! answering, and its later calls of the same reply are variations that
//! print something else (`print(word)` after `print(word[::-1])`). After a
//! call that succeeded and printed, the reply's later calls do not run, and
//! the next model call is offered no tools and asked for the answer from
//! that output (a call it still writes as text is read and runs).

use super::{printed, with_last_word};
use crate::agent::harness::{Aid, Interventions, ModelReply, NextCall, OnReply, say};
use crate::agent::tools::ToolOutput;
use crate::model::{Message, ToolCall, ToolSpec};
use crate::protocol::InterventionKind;

/// The result of a call after one of the same reply that printed.
const AFTER_OUTPUT: &str = "not run: an earlier call of this reply printed its output";

#[derive(Default)]
pub struct AnswerAfterOutput {
    /// A call of the current reply printed.
    printed: bool,
}

impl Aid for AnswerAfterOutput {
    fn before_call(&mut self, next: &mut NextCall<'_>, out: &mut Interventions) {
        if !self.printed {
            return;
        }
        say(
            out,
            InterventionKind::AnswerAsked,
            "a call printed its output; the model is asked for its answer, offered no tools",
        );
        let prompt = next.history.iter().rev().find_map(|m| match m {
            Message::User { content } => Some(content.as_str()),
            _ => None,
        });
        next.request.answer_only = true;
        next.request.messages = with_last_word(
            next.history,
            format!(
                "The question was: {}\n\nReply with the answer to it in plain text, \
                 taken from the tool output above. Do not call a tool.",
                prompt.unwrap_or("(see above)")
            ),
        );
    }

    /// A reply kept is the model's answer to the ask (a reply asked again
    /// is asked for the answer again).
    fn on_reply(
        &mut self,
        _reply: &mut ModelReply,
        _tools: &[ToolSpec],
        _say: &mut Interventions,
    ) -> OnReply {
        self.printed = false;
        OnReply::Keep
    }

    fn on_call(
        &mut self,
        call: &mut ToolCall,
        _tools: &[ToolSpec],
        _notes: &mut Vec<String>,
        out: &mut Interventions,
    ) -> Option<ToolOutput> {
        if !self.printed {
            return None;
        }
        say(
            out,
            InterventionKind::CallsSkipped,
            format!(
                "{} ({}) not run: an earlier call of this reply printed its output",
                call.name, call.id
            ),
        );
        Some(ToolOutput::error(AFTER_OUTPUT))
    }

    fn on_result(
        &mut self,
        _asked: &ToolCall,
        _ran: bool,
        output: &mut ToolOutput,
        _say: &mut Interventions,
    ) -> Option<String> {
        self.printed |= printed(output).is_some();
        None
    }
}
