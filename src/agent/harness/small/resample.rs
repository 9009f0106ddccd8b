//! An empty reply answers nothing (a small model's is often a sample that
//! ended at once): it is not kept, and the same request goes again,
//! sampled anew, within `max_turns`.

use crate::agent::harness::{Aid, Interventions, ModelReply, NextCall, OnReply, say};
use crate::model::ToolSpec;
use crate::protocol::InterventionKind;

#[derive(Default)]
pub struct Resample {
    again: bool,
}

impl Aid for Resample {
    fn before_call(&mut self, next: &mut NextCall<'_>, _say: &mut Interventions) {
        if std::mem::take(&mut self.again) {
            super::sample_anew(next);
        }
    }

    fn on_reply(
        &mut self,
        reply: &mut ModelReply,
        tools: &[ToolSpec],
        out: &mut Interventions,
    ) -> OnReply {
        if tools.is_empty() || !reply.calls.is_empty() || !reply.text.trim().is_empty() {
            return OnReply::Keep;
        }
        self.again = true;
        say(
            out,
            InterventionKind::ReplyDiscarded,
            "the reply was empty; the model is asked again",
        );
        OnReply::AskAgain
    }
}
