//! A small model that loops (one call, one fragment or one character
//! written again and again until its tokens run out) is cut while it
//! streams: reading on would only buy more copies, and ending the stream
//! frees the model server. The calls written so far still run, each once.

use crate::agent::harness::{Aid, Interventions, NextCall, say};
use crate::model::{ToolSpec, lenient};
use crate::protocol::InterventionKind;

/// Text is checked every this many bytes.
const CHECK_EVERY: usize = 32;

#[derive(Default)]
pub struct Loops {
    /// The text's length at the last check.
    checked: usize,
}

impl Aid for Loops {
    fn before_call(&mut self, _next: &mut NextCall<'_>, _say: &mut Interventions) {
        self.checked = 0;
    }

    fn cut(&mut self, text: &str, tools: &[ToolSpec], out: &mut Interventions) -> bool {
        if tools.is_empty() || text.len() < self.checked + CHECK_EVERY {
            return false;
        }
        self.checked = text.len();
        let looping = lenient::repeats_itself(text) || lenient::writes_too_many_calls(text);
        if looping {
            say(
                out,
                InterventionKind::ReplyCut,
                format!(
                    "the reply repeats itself; cut after {} characters",
                    text.chars().count()
                ),
            );
        }
        looping
    }
}
