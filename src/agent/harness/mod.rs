//! A model's harness: what the turn loop does beyond model → tools →
//! model, chosen per model (`models.NAME.harness`).
//!
//! The loop asks the harness at fixed points: before each model call
//! ([`Aid::before_call`]), while a reply streams ([`Aid::cut`]), when the
//! reply is complete ([`Aid::on_reply`]), before each of its calls runs
//! ([`Aid::on_call`]) and on each result ([`Aid::on_result`]). A harness
//! is a list of aids, each one file implementing the points it needs; the
//! loop asks them in order. Everything an aid does is reported as an
//! `intervention` event.
//!
//! - `strict` (the default) has no aids: every call the model makes runs,
//!   calls come only from the provider's tool-call channel, and the turn's
//!   result is the model's own text.
//! - [`small`]: the aids a small local model needs.

pub mod small;

use std::sync::Arc;

use serde_json::Value;

use super::tools::ToolOutput;
use crate::config::{HarnessKind, ToolCallMode};
use crate::model::{ChatRequest, Message, ToolCall, ToolSpec};
use crate::protocol::EventKind;
use crate::protocol::InterventionKind;
use crate::session::Session;
use crate::store::StoreError;

/// What an aid did, for an `intervention` event.
#[derive(Debug, Clone, PartialEq)]
pub struct Intervention {
    pub kind: InterventionKind,
    pub detail: String,
}

/// Where aids report what they did; the loop sends each as an event.
pub type Interventions = Vec<Intervention>;

pub(crate) fn say(out: &mut Interventions, kind: InterventionKind, detail: impl Into<String>) {
    out.push(Intervention {
        kind,
        detail: detail.into(),
    });
}

/// A model call about to be made.
pub struct NextCall<'a> {
    pub request: &'a mut ChatRequest,
    /// The turn's history as stored (the request's messages start as it).
    pub history: &'a Arc<Vec<Message>>,
    /// The request's system prompt is the server's default, not the
    /// session's own.
    pub default_system: bool,
    /// Model calls made in this turn so far.
    pub calls_made: u64,
}

/// A model's reply, as the loop collected it.
#[derive(Debug, Default)]
pub struct ModelReply {
    pub text: String,
    pub calls: Vec<ToolCall>,
    pub interrupted: bool,
    /// The request's input tokens as the provider counted them (0 when
    /// it did not say).
    pub input_tokens: u64,
    /// The model's reasoning streamed since the last `thinking` said it.
    pub reasoning: String,
    /// The reasoning blocks its provider wants sent back before the reply
    /// ([`crate::protocol::Message::Reasoning`]).
    pub reasoning_kept: Vec<crate::protocol::Message>,
}

/// What happens to a reply after [`Aid::on_reply`].
#[derive(Debug, PartialEq)]
pub enum OnReply {
    /// Kept, and its calls run (none: it is the answer).
    Keep,
    /// Not kept: the model is asked again.
    AskAgain,
    /// Kept, then this message is added and the model asked again.
    Tell(String),
}

/// One aid of a harness; every point is optional.
pub trait Aid: Send {
    /// Before a model call: the request may change (its messages, tools,
    /// sampling).
    fn before_call(&mut self, _next: &mut NextCall<'_>, _say: &mut Interventions) {}

    /// While the reply streams (`text` so far): true stops reading it.
    fn cut(&mut self, _text: &str, _tools: &[ToolSpec], _say: &mut Interventions) -> bool {
        false
    }

    /// On the whole reply, before it is kept: it may change, or not be kept.
    fn on_reply(
        &mut self,
        _reply: &mut ModelReply,
        _tools: &[ToolSpec],
        _say: &mut Interventions,
    ) -> OnReply {
        OnReply::Keep
    }

    /// Before a call of the reply runs: the call may change (notes for its
    /// result say how), or be answered here instead of running.
    fn on_call(
        &mut self,
        _call: &mut ToolCall,
        _tools: &[ToolSpec],
        _notes: &mut Vec<String>,
        _say: &mut Interventions,
    ) -> Option<ToolOutput> {
        None
    }

    /// On the result of a call (`asked`: the call as the model wrote it;
    /// `ran`: false when an aid answered it without running it): the output
    /// may change; an answer returned ends the turn with it.
    fn on_result(
        &mut self,
        _asked: &ToolCall,
        _ran: bool,
        _output: &mut ToolOutput,
        _say: &mut Interventions,
    ) -> Option<String> {
        None
    }
}

/// The aids of one turn, in the order they are asked.
pub struct Harness {
    aids: Vec<Box<dyn Aid>>,
}

impl Harness {
    /// The harness of a turn of a model of `kind`.
    pub fn new(kind: HarnessKind, tool_call_mode: ToolCallMode) -> Harness {
        Harness {
            aids: match kind {
                HarnessKind::Strict => Vec::new(),
                HarnessKind::Small => small::aids(tool_call_mode),
            },
        }
    }

    /// Under the strict harness (no aids), an answer that is itself
    /// nothing but calls of offered tools written as text: what to tell the
    /// user, since the calls do not run. A capable model's answer is text
    /// and gets nothing; a small model that writes its calls as text gets
    /// this hint once per turn end.
    pub fn strict_answer_hint(&self, text: &str, tools: &[ToolSpec]) -> Option<String> {
        if !self.aids.is_empty() || tools.is_empty() {
            return None;
        }
        let recovered = crate::model::lenient::recover_tool_calls(text, tools)?;
        let leftover = recovered.text.trim();
        if recovered.calls.is_empty() || !(leftover.is_empty() || leftover == "```") {
            return None;
        }
        let names: Vec<&str> = recovered.calls.iter().map(|c| c.name.as_str()).collect();
        Some(format!(
            "the answer is a call of {} written as text, which the strict harness does not \
             run (it runs only calls sent through the provider's tool-call channel); a small \
             model that writes its calls as text needs the small harness: OPENAI_HARNESS=small, \
             or harness = \"small\" in [openai] or [models.NAME] (docs/models.md)",
            names.join(", ")
        ))
    }

    pub fn before_call(&mut self, next: &mut NextCall<'_>, say: &mut Interventions) {
        for aid in &mut self.aids {
            aid.before_call(next, say);
        }
    }

    pub fn cut(&mut self, text: &str, tools: &[ToolSpec], say: &mut Interventions) -> bool {
        self.aids.iter_mut().any(|aid| aid.cut(text, tools, say))
    }

    /// The first aid that does not keep the reply decides.
    pub fn on_reply(
        &mut self,
        reply: &mut ModelReply,
        tools: &[ToolSpec],
        say: &mut Interventions,
    ) -> OnReply {
        for aid in &mut self.aids {
            match aid.on_reply(reply, tools, say) {
                OnReply::Keep => {}
                other => return other,
            }
        }
        OnReply::Keep
    }

    pub fn on_call(
        &mut self,
        call: &mut ToolCall,
        tools: &[ToolSpec],
        notes: &mut Vec<String>,
        say: &mut Interventions,
    ) -> Option<ToolOutput> {
        self.aids
            .iter_mut()
            .find_map(|aid| aid.on_call(call, tools, notes, say))
    }

    /// Every aid sees the result; the first answer wins.
    pub fn on_result(
        &mut self,
        asked: &ToolCall,
        ran: bool,
        output: &mut ToolOutput,
        say: &mut Interventions,
    ) -> Option<String> {
        let mut answer = None;
        for aid in &mut self.aids {
            let settled = aid.on_result(asked, ran, output, say);
            answer = answer.or(settled);
        }
        answer
    }
}

/// Tools that only read: a repeat of one with nothing in between that may
/// have changed the sandbox reads the same; consecutive calls of them run
/// at once.
pub const READ_ONLY_TOOLS: [&str; 3] = ["Read", "Glob", "Grep"];

/// Whether a call may change what later calls see (any write, edit, shell
/// or code call; any tool of an external server).
pub fn may_change_state(call: &ToolCall) -> bool {
    !READ_ONLY_TOOLS.contains(&call.name.as_str())
}

/// What makes two calls the same call.
pub fn key_of(call: &ToolCall) -> String {
    format!("{} {}", call.name, call.arguments)
}

/// Adds what was assumed about a call to its output, where the model
/// reads it.
pub fn add_notes(output: &mut ToolOutput, notes: &[String]) {
    if notes.is_empty() {
        return;
    }
    let note = format!("Note: {}.", notes.join("; "));
    match &mut output.output {
        Value::Object(fields) => {
            fields.insert("note".into(), Value::String(note));
        }
        Value::String(text) => {
            text.push('\n');
            text.push_str(&note);
        }
        other => {
            *other = serde_json::json!({"output": other.clone(), "note": note});
        }
    }
}

/// Sends what the harness did as `intervention` events.
pub(crate) fn emit_interventions(
    session: &Session,
    said: &mut Interventions,
) -> Result<(), StoreError> {
    for intervention in said.drain(..) {
        session.emit(EventKind::Intervention {
            kind: intervention.kind,
            detail: intervention.detail,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<ToolSpec> {
        ["Bash", "Read"]
            .iter()
            .map(|name| ToolSpec {
                name: name.to_string(),
                description: String::new(),
                input_schema: Arc::new(serde_json::json!({"type": "object"})),
                read_only: false,
            })
            .collect()
    }

    #[test]
    fn a_strict_answer_that_is_only_a_call_as_text_gets_a_hint() {
        let strict = Harness::new(HarnessKind::Strict, ToolCallMode::Native);
        let hint = |text: &str| strict.strict_answer_hint(text, &tools());
        let call = r#"{"name": "Bash", "arguments": {"command": "ls"}}"#;
        let said = hint(call).expect("a hint");
        assert!(
            said.contains("call of Bash") && said.contains("OPENAI_HARNESS=small"),
            "{said}"
        );
        assert!(hint(&format!("```json\n{call}\n```")).is_some());
        assert!(hint(&format!("<tool_call>{call}</tool_call>")).is_some());
        // Prose, prose around a call, a tool not offered, no tools: none.
        assert_eq!(hint("The files are a and b."), None);
        assert_eq!(
            hint(&format!(
                "To list them I would run {call}, which shows a and b."
            )),
            None
        );
        assert_eq!(hint(r#"{"name": "Delete", "arguments": {}}"#), None);
        assert_eq!(strict.strict_answer_hint(call, &[]), None);
        // The small harness runs such calls itself: no hint.
        let small = Harness::new(HarnessKind::Small, ToolCallMode::Native);
        assert_eq!(small.strict_answer_hint(call, &tools()), None);
    }
}
