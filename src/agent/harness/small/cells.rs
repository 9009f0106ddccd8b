//! Python cells of a small model often do not parse or fail in ways whose
//! intent is plain (brackets left open, a block written on one line,
//! `print(x).upper()`, a module used without its import). The harness asks
//! `execute_code` for its repairs (`repair: true`), which run only on code
//! that does not parse or fails in the way a repair names; each repair that
//! ran is reported.

use std::collections::HashSet;

use serde_json::Value;

use crate::agent::harness::{Aid, Interventions, say};
use crate::agent::tools::ToolOutput;
use crate::model::{ToolCall, ToolSpec};
use crate::protocol::InterventionKind;

/// The tool whose Python cells are repaired.
const CODE_TOOL: &str = "mcp__sandbox__execute_code";

/// How the cell runner starts each line saying what it repaired.
const REPAIR_LINE: &str = "repair: ";

#[derive(Default)]
pub struct Cells {
    /// Calls run with repairs, by id.
    asked: HashSet<String>,
}

impl Aid for Cells {
    fn on_call(
        &mut self,
        call: &mut ToolCall,
        _tools: &[ToolSpec],
        _notes: &mut Vec<String>,
        _say: &mut Interventions,
    ) -> Option<ToolOutput> {
        let python = matches!(
            call.arguments.get("language").and_then(Value::as_str),
            None | Some("python" | "python3" | "py")
        );
        if call.name == CODE_TOOL
            && python
            && let Some(arguments) = call.arguments.as_object_mut()
        {
            arguments.entry("repair").or_insert(Value::Bool(true));
            self.asked.insert(call.id.clone());
        }
        None
    }

    fn on_result(
        &mut self,
        asked: &ToolCall,
        _ran: bool,
        output: &mut ToolOutput,
        out: &mut Interventions,
    ) -> Option<String> {
        if !self.asked.remove(&asked.id) {
            return None;
        }
        let stderr = output.output.get("stderr").and_then(Value::as_str)?;
        for line in stderr.lines().filter_map(|l| l.strip_prefix(REPAIR_LINE)) {
            say(out, InterventionKind::CellRepaired, line);
        }
        None
    }
}
