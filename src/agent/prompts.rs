//! What a turn says to the model beyond its session's messages: the
//! default system prompt with its worked example, and the two asks sent
//! without being stored (for the answer after a printed output, for a fix
//! after a repeated failure).

use std::sync::Arc;

use crate::model::{Message, ToolSpec};

/// The temperature of the model call after a failing call was repeated as
/// it was, when the session sets none.
pub(super) const VARIED_TEMPERATURE: f32 = 0.7;

/// The history with a last message asking for the answer to the turn's
/// prompt from the output above; sent, not stored (a small model otherwise
/// writes the call it just made again).
pub(super) fn asking_for_the_answer(history: &Arc<Vec<Message>>) -> Arc<Vec<Message>> {
    let prompt = history.iter().rev().find_map(|m| match m {
        Message::User { content } => Some(content.as_str()),
        _ => None,
    });
    with_last_word(
        history,
        format!(
            "The question was: {}\n\nReply with the answer to it in plain text, \
             taken from the tool output above. Do not call a tool.",
            prompt.unwrap_or("(see above)")
        ),
    )
}

/// The history with a last message saying that the last call failed as it
/// had before, and how; sent, not stored.
pub(super) fn asking_for_a_fix(history: &Arc<Vec<Message>>, error: &str) -> Arc<Vec<Message>> {
    with_last_word(
        history,
        format!(
            "That call failed again, the same way: {error}\nDo not repeat it: call a tool \
             with code that fixes this error."
        ),
    )
}

fn with_last_word(history: &Arc<Vec<Message>>, content: String) -> Arc<Vec<Message>> {
    let mut messages = Vec::with_capacity(history.len() + 1);
    messages.extend(history.iter().cloned());
    messages.push(Message::User { content });
    Arc::new(messages)
}

/// Tells a model that does not read the `tools` field (many small ones do
/// not: their chat template drops it) what it can call and where it works.
/// Only sent when the session gives no system prompt and has tools.
pub(super) fn default_system_prompt(
    tools: &[ToolSpec],
    working_dir: Option<&str>,
) -> Option<String> {
    if tools.is_empty() {
        return None;
    }
    let mut prompt = format!(
        "You are an agent with tools that run in a sandbox. Your workspace is {}. \
         To act, call a tool with JSON arguments that match its schema; when you have \
         the answer, reply with it in plain text and call no tool.\n\nYour tools:\n",
        working_dir.unwrap_or(crate::sandbox::WORKSPACE)
    );
    for tool in tools {
        let summary = tool.description.lines().next().unwrap_or("").trim();
        prompt.push_str(&format!("- {}: {summary}\n", tool.name));
    }
    if let Some(example) = worked_example(tools) {
        prompt.push_str(&example);
    }
    Some(prompt)
}

/// One call and its answer written out, for the code or shell tool when
/// the session has one: a small model copies the shape of an example far
/// more reliably than it follows a description of it.
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
