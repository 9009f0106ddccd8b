//! Small models shorten tool names (`execute_code` for
//! `mcp__sandbox__execute_code`), change their case, or invent one
//! (`Python`) while passing the right arguments. A name that is not
//! offered is taken as the one tool it most plausibly means
//! ([`lenient::resolve_tool_name`]), with a note in the result.

use crate::agent::harness::{Aid, Interventions, say};
use crate::agent::tools::ToolOutput;
use crate::model::{ToolCall, ToolSpec, lenient};
use crate::protocol::InterventionKind;

pub struct Names;

impl Aid for Names {
    fn on_call(
        &mut self,
        call: &mut ToolCall,
        tools: &[ToolSpec],
        notes: &mut Vec<String>,
        out: &mut Interventions,
    ) -> Option<ToolOutput> {
        let resolved = lenient::resolve_tool_name(&call.name, &call.arguments, tools)?;
        if let Some(note) = resolved.note {
            say(out, InterventionKind::NameResolved, note.clone());
            notes.push(note);
            call.name = resolved.name;
        }
        None
    }
}
