//! A small model that gets an error often writes the same failing call
//! until the turn runs out. A call that failed twice as it was gets a note
//! to change it, and the next model call asks for a fix, quoting the error,
//! sampled anew; a reply made only of such calls is not kept. A call that
//! may have changed the sandbox and succeeded in between forgets the
//! failures: after the fix the same call runs again.

use std::collections::HashMap;

use serde_json::Value;

use super::with_last_word;
use crate::agent::harness::{
    Aid, Interventions, ModelReply, NextCall, OnReply, add_notes, key_of, may_change_state, say,
};
use crate::agent::tools::ToolOutput;
use crate::model::{ToolCall, ToolSpec};
use crate::protocol::InterventionKind;

#[derive(Default)]
pub struct Fix {
    /// Failed calls as the model wrote them: how often, and the last line
    /// of the error.
    failed: HashMap<String, (u32, String)>,
    /// The error to quote in the next model call.
    ask: Option<String>,
}

impl Aid for Fix {
    fn before_call(&mut self, next: &mut NextCall<'_>, out: &mut Interventions) {
        let Some(error) = self.ask.take() else {
            return;
        };
        say(
            out,
            InterventionKind::FixAsked,
            format!("a call failed the same way twice; the model is asked for a fix: {error}"),
        );
        next.request.messages = with_last_word(
            next.history,
            format!(
                "That call failed again, the same way: {error}\nDo not repeat it: call a tool \
                 with code that fixes this error."
            ),
        );
        super::sample_anew(next);
    }

    fn on_reply(
        &mut self,
        reply: &mut ModelReply,
        _tools: &[ToolSpec],
        out: &mut Interventions,
    ) -> OnReply {
        let mut errors = reply.calls.iter().map(|call| self.failed_twice(call));
        let Some(Some(first)) = errors.next() else {
            return OnReply::Keep;
        };
        if !errors.all(|e| e.is_some()) {
            return OnReply::Keep;
        }
        self.ask = Some(first.to_string());
        say(
            out,
            InterventionKind::ReplyDiscarded,
            "the reply asked again for calls that failed twice; not run nor kept",
        );
        OnReply::AskAgain
    }

    fn on_result(
        &mut self,
        asked: &ToolCall,
        ran: bool,
        output: &mut ToolOutput,
        _say: &mut Interventions,
    ) -> Option<String> {
        if !ran {
            return None;
        }
        if !output.is_error {
            if may_change_state(asked) {
                self.failed.clear();
            }
            return None;
        }
        let (times, error) = self.failed.entry(key_of(asked)).or_default();
        *times += 1;
        *error = last_error_line(output);
        if *times > 1 {
            self.ask = Some(error.clone());
            add_notes(
                output,
                &["this exact call already failed in this turn; change it".into()],
            );
        }
        None
    }
}

impl Fix {
    fn failed_twice(&self, call: &ToolCall) -> Option<&str> {
        match self.failed.get(&key_of(call)) {
            Some((times, error)) if *times >= 2 => Some(error),
            _ => None,
        }
    }
}

/// The last line of a failed call's error (an execution's stderr, else its
/// stdout; a refusal's text), at most 300 characters.
fn last_error_line(output: &ToolOutput) -> String {
    let text = match &output.output {
        Value::String(text) => text.as_str(),
        Value::Object(fields) => ["stderr", "stdout"]
            .iter()
            .filter_map(|key| fields.get(*key).and_then(Value::as_str))
            .find(|text| !text.trim().is_empty())
            .unwrap_or_default(),
        _ => "",
    };
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    line.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use super::super::test_call as call;

    fn reply_of(call: &ToolCall) -> ModelReply {
        ModelReply {
            calls: vec![call.clone()],
            ..ModelReply::default()
        }
    }

    /// A call that failed twice is not asked again as it was, until a call
    /// that may change the sandbox succeeds; a call the harness answered
    /// counts as no failure.
    #[test]
    fn failures_are_forgotten_after_a_change() {
        let mut fix = Fix::default();
        let mut said = Interventions::new();
        let cat = call("Bash", json!({"command": "cat missing"}));
        let failed = || ToolOutput::error("cat: missing: No such file");
        fix.on_result(&cat, false, &mut failed(), &mut said);
        fix.on_result(&cat, true, &mut failed(), &mut said);
        assert_eq!(
            fix.on_reply(&mut reply_of(&cat), &[], &mut said),
            OnReply::Keep
        );
        let mut second = failed();
        fix.on_result(&cat, true, &mut second, &mut said);
        assert!(second.output.as_str().unwrap().contains("already failed"));
        assert_eq!(
            fix.on_reply(&mut reply_of(&cat), &[], &mut said),
            OnReply::AskAgain
        );
        let write = call("Write", json!({"file_path": "missing", "content": "x"}));
        let mut wrote = ToolOutput {
            output: Value::String("ok".into()),
            is_error: false,
        };
        fix.on_result(&write, true, &mut wrote, &mut said);
        assert_eq!(
            fix.on_reply(&mut reply_of(&cat), &[], &mut said),
            OnReply::Keep
        );
    }
}
