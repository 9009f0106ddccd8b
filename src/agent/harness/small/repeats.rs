//! A small model asks again for calls that already ran instead of
//! answering. A read repeated with nothing in between that may have
//! changed the sandbox (a write, an edit, a shell or code call) is answered
//! from its earlier output; anything else runs again, against the
//! sandbox's current state. When different calls keep printing the same
//! output, a note says it may be the answer, and the third time the
//! harness takes it as the turn's answer (announced as the harness's, not
//! the model's).

use std::collections::HashMap;

use serde_json::Value;

use super::printed;
use crate::agent::harness::{Aid, Interventions, add_notes, key_of, may_change_state, say};
use crate::agent::tools::ToolOutput;
use crate::model::{ToolCall, ToolSpec};
use crate::protocol::InterventionKind;

/// Successful calls printing the same output this many times settle the
/// turn's answer: tiny models often cannot stop calling to write a reply.
pub const REPEATS_TO_SETTLE: u32 = 3;

#[derive(Default)]
pub struct Repeats {
    /// Reads that succeeded since the last call that may change state.
    reads: HashMap<String, ToolOutput>,
    /// How many successful calls printed each output.
    by_output: HashMap<String, u32>,
}

impl Aid for Repeats {
    fn on_call(
        &mut self,
        call: &mut ToolCall,
        _tools: &[ToolSpec],
        notes: &mut Vec<String>,
        out: &mut Interventions,
    ) -> Option<ToolOutput> {
        let earlier = self.reads.get(&key_of(call))?;
        say(
            out,
            InterventionKind::RepeatAnswered,
            format!(
                "{} asked again with the same arguments and nothing changed since; \
                 answered from its earlier output, not run",
                call.name
            ),
        );
        notes.push(
            "this exact call already ran in this turn and nothing changed since; its result \
             is repeated here. If it answers the question, reply with the answer in plain text"
                .into(),
        );
        Some(earlier.clone())
    }

    fn on_result(
        &mut self,
        asked: &ToolCall,
        _ran: bool,
        output: &mut ToolOutput,
        out: &mut Interventions,
    ) -> Option<String> {
        if may_change_state(asked) {
            self.reads.clear();
        }
        if output.is_error {
            return None;
        }
        if !may_change_state(asked) {
            self.reads.insert(key_of(asked), output.clone());
        }
        let printed = printed(output)?;
        let times = self.by_output.entry(printed.clone()).or_insert(0);
        *times += 1;
        if *times >= REPEATS_TO_SETTLE {
            say(
                out,
                InterventionKind::AnswerSettled,
                format!(
                    "the model's calls printed the same output {REPEATS_TO_SETTLE} times; \
                     the harness takes it as the turn's answer"
                ),
            );
            return Some(answer_of(output));
        }
        if *times > 1 {
            add_notes(
                output,
                &[
                    "this call printed the same as an earlier call of this turn. If that \
                   answers the question, reply with the answer in plain text"
                        .into(),
                ],
            );
        }
        None
    }
}

/// A call's output as an answer: an execution's stdout, else the output.
fn answer_of(output: &ToolOutput) -> String {
    match &output.output {
        Value::String(text) => text.trim_end().to_string(),
        Value::Object(fields) => match fields.get("stdout").and_then(Value::as_str) {
            Some(stdout) if !stdout.trim().is_empty() => stdout.trim_end().to_string(),
            _ => Value::Object(fields.clone()).to_string(),
        },
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use super::super::test_call as call;

    fn printed(text: &str) -> ToolOutput {
        ToolOutput {
            output: Value::String(text.into()),
            is_error: false,
        }
    }

    /// A read asked again is answered from its earlier output until a call
    /// that may change the sandbox runs; a shell call always runs again.
    #[test]
    fn reads_are_answered_again_only_while_nothing_changed() {
        let mut repeats = Repeats::default();
        let mut said = Interventions::new();
        let mut notes = Vec::new();
        let read = call("Read", json!({"file_path": "f"}));
        let shell = call("Bash", json!({"command": "cat f"}));
        let mut ask = |repeats: &mut Repeats, c: &ToolCall| {
            repeats.on_call(&mut c.clone(), &[], &mut notes, &mut said)
        };
        assert_eq!(ask(&mut repeats, &read), None);
        repeats.on_result(&read, true, &mut printed("one"), &mut Interventions::new());
        assert_eq!(ask(&mut repeats, &read), Some(printed("one")));
        assert_eq!(ask(&mut repeats, &shell), None);
        repeats.on_result(&shell, true, &mut printed("one"), &mut Interventions::new());
        assert_eq!(
            ask(&mut repeats, &read),
            None,
            "the shell call may have written f"
        );
        assert_eq!(ask(&mut repeats, &shell), None);
    }

    /// The third successful call printing one output settles the answer,
    /// and says the harness chose it.
    #[test]
    fn an_output_printed_three_times_is_the_harness_s_answer() {
        let mut repeats = Repeats::default();
        let mut said = Interventions::new();
        let shell = call("Bash", json!({"command": "echo 42"}));
        for _ in 0..2 {
            assert_eq!(
                repeats.on_result(&shell, true, &mut printed("42\n"), &mut said),
                None
            );
        }
        assert_eq!(
            repeats.on_result(&shell, true, &mut printed("42\n"), &mut said),
            Some("42".into())
        );
        assert_eq!(said.last().unwrap().kind, InterventionKind::AnswerSettled);
    }
}
