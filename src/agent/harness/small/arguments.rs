//! Arguments brought to the tool's schema where the intent is unambiguous
//! ([`coerce`]): a numeric string for a number, one value where a list is
//! expected, an unknown field dropped, a number brought into range. The
//! strict loop refuses such calls with what does not fit.

use crate::agent::coerce::coerce;
use crate::agent::harness::{Aid, Interventions, say};
use crate::agent::tools::ToolOutput;
use crate::model::{ToolCall, ToolSpec};
use crate::protocol::InterventionKind;

pub struct Arguments;

impl Aid for Arguments {
    fn on_call(
        &mut self,
        call: &mut ToolCall,
        tools: &[ToolSpec],
        notes: &mut Vec<String>,
        out: &mut Interventions,
    ) -> Option<ToolOutput> {
        let spec = tools.iter().find(|t| t.name == call.name)?;
        // What cannot be read is left for the strict check to refuse.
        let coerced = coerce(call.arguments.clone(), &spec.input_schema, true).ok()?;
        if !coerced.notes.is_empty() {
            say(
                out,
                InterventionKind::ArgumentsCoerced,
                format!("{}: {}", call.name, coerced.notes.join("; ")),
            );
            notes.extend(coerced.notes);
            call.arguments = coerced.arguments;
        }
        None
    }
}
