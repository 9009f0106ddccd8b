//! The default system prompt, for a small model: many small models do not
//! read the request's `tools` (their chat template drops it), and copy the
//! shape of an example far more reliably than they follow a description.

use crate::agent::harness::{Aid, Interventions, NextCall};
use crate::model::ToolSpec;

/// Lists the tools and writes out one call and its answer, in a system
/// prompt the server wrote (never in the session's own).
pub struct WorkedExample;

impl Aid for WorkedExample {
    fn before_call(&mut self, next: &mut NextCall<'_>, _say: &mut Interventions) {
        if !next.default_system || next.request.tools.is_empty() {
            return;
        }
        let addition = tools_and_example(&next.request.tools);
        let system = next.request.system.get_or_insert_with(String::new);
        system.push_str(&addition);
    }
}

fn tools_and_example(tools: &[ToolSpec]) -> String {
    let mut text = String::from(
        "\n\nTo act, call a tool with JSON arguments that match its schema; when you have \
         the answer, reply with it in plain text and call no tool.\n\nYour tools:\n",
    );
    for tool in tools {
        let summary = tool.description.lines().next().unwrap_or("").trim();
        text.push_str(&format!("- {}: {summary}\n", tool.name));
    }
    if let Some(example) = worked_example(tools) {
        text.push_str(&example);
    }
    text
}

/// One call and its answer written out, for the code or shell tool when
/// the session has one.
fn worked_example(tools: &[ToolSpec]) -> Option<String> {
    let (tool, task, arguments, output) = if let Some(code) =
        tools.iter().find(|t| t.name.ends_with("execute_code"))
    {
        (
            code,
            "Use Python to find the average of 4, 8 and 15.",
            serde_json::json!({"code": "numbers = [4, 8, 15]\nprint(sum(numbers) / len(numbers))"}),
            "9.0",
        )
    } else if let Some(shell) = tools.iter().find(|t| t.name == "Bash") {
        (
            shell,
            "How many lines does notes.txt have?",
            serde_json::json!({"command": "wc -l < notes.txt"}),
            "3",
        )
    } else {
        return None;
    };
    // Written by hand: the name first, as models write their calls.
    let call = format!(
        "{{\"name\": \"{}\", \"arguments\": {arguments}}}",
        tool.name
    );
    Some(format!(
        "\nExample:\nUser: {task}\nYou call: {call}\nThe tool returns: {output}\nYou reply: {output}\n"
    ))
}
