//! Makes the tool calls of small local models usable.
//!
//! - [`recover_tool_calls`]: calls a model wrote into its text instead of
//!   calling natively: `{"name": …, "arguments": {…}}` (or `parameters` /
//!   `input`), bare, in a ```` ```json ```` fence or in Qwen/Hermes
//!   `<tool_call>` tags, alone or as a list.
//! - [`parse_arguments`]: arguments that are not quite JSON, repaired where
//!   the fix is obvious, else kept as `{"_raw": …}`.
//! - [`answer_or_call_format`], [`json_mode_instructions`] and
//!   [`read_answer_or_call`]: the protocol of
//!   [`ToolCallMode::JsonSchema`](super::ToolCallMode::JsonSchema), where the
//!   whole output is one JSON object: a final answer or one tool call.

use std::borrow::Cow;

use serde_json::{Map, Value, json};

use super::{ToolCall, ToolSpec};

const TAG_OPEN: &str = "<tool_call>";
const TAG_CLOSE: &str = "</tool_call>";
const FENCE: &str = "```";
/// Keys an object may carry beside the name and arguments and still be a
/// tool call; any other key means it is data that merely looks like one.
const CALL_EXTRA_KEYS: [&str; 2] = ["type", "id"];
const ARGUMENT_KEYS: [&str; 3] = ["arguments", "parameters", "input"];
/// The repairing parser recurses once per bracket, so text with more
/// brackets than this is not repaired: deep nesting would overflow the stack
/// of the task that parses it.
const MAX_REPAIR_BRACKETS: usize = 1000;
/// Calls a reply may write before its stream is cut: twice the default
/// `agent.max_tool_calls_per_reply`, so a real batch is never cut.
const MAX_CALLS_WRITTEN: usize = 16;

/// Tool calls found in a text, and the text without them.
#[derive(Debug, Clone, PartialEq)]
pub struct Recovered {
    /// The text with the passages the calls came from removed.
    pub text: String,
    pub calls: Vec<ToolCall>,
}

/// Finds tool calls written into `text`, accepting only names in `tools`.
/// `None` when there are none.
pub fn recover_tool_calls(text: &str, tools: &[ToolSpec]) -> Option<Recovered> {
    let mut calls = Vec::new();
    let mut kept = String::new();
    // `text[..copied]` is dealt with: copied into `kept`, or a call's source.
    let mut copied = 0;
    let mut pos = 0;
    while let Some((start, opener)) = next_opener(text, pos) {
        let (end, found) = match opener {
            Opener::Tag => {
                let body = start + TAG_OPEN.len();
                match text[body..].find(TAG_CLOSE) {
                    Some(len) => (
                        body + len + TAG_CLOSE.len(),
                        calls_in(&text[body..body + len], tools),
                    ),
                    // A model that stops right after its call often leaves
                    // the tag open.
                    None => (text.len(), calls_in(&text[body..], tools)),
                }
            }
            Opener::Fence => {
                let after = start + FENCE.len();
                let body = text[after..]
                    .find('\n')
                    .map_or(text.len(), |line| after + line + 1);
                match text[body..].find(FENCE) {
                    Some(len) => (
                        body + len + FENCE.len(),
                        calls_in(&text[body..body + len], tools),
                    ),
                    None => (text.len(), calls_in(&text[body..], tools)),
                }
            }
            Opener::Json => {
                let mut values =
                    serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
                match values.next() {
                    Some(Ok(value)) => (start + values.byte_offset(), interpret(value, tools)),
                    // Broken JSON: a stray closing bracket is dropped; a
                    // value left open repairs and takes the rest of the text.
                    _ => match without_strays(&text[start..]) {
                        Some((value, len)) => (start + len, interpret(value, tools)),
                        None => match repair(&text[start..]).and_then(|v| interpret(v, tools)) {
                            Some(calls) => (text.len(), Some(calls)),
                            None => (start + 1, None),
                        },
                    },
                }
            }
        };
        if let Some(found) = found {
            kept.push_str(&text[copied..start]);
            copied = end;
            calls.extend(found);
        }
        pos = end;
    }
    if calls.is_empty() {
        return None;
    }
    kept.push_str(&text[copied..]);
    Some(Recovered {
        text: tidy(&kept),
        calls,
    })
}

/// Parses a tool call's arguments: JSON, JSON encoded twice, or JSON with
/// an obvious defect (a missing closing brace, a trailing comma, single
/// quotes). Anything else is kept whole under `_raw` so nothing is lost.
pub fn parse_arguments(raw: &str) -> Value {
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return json!({});
    }
    let value = serde_json::from_str::<Value>(trimmed)
        .ok()
        .or_else(|| repair(trimmed));
    match value {
        Some(Value::Object(arguments)) => Value::Object(arguments),
        Some(Value::String(inner)) => match serde_json::from_str::<Value>(&inner) {
            Ok(Value::Object(arguments)) => Value::Object(arguments),
            _ => json!({ "_raw": raw }),
        },
        _ => json!({ "_raw": raw }),
    }
}

/// The `response_format` that makes the output either `{"answer": …}` or
/// `{"tool": …, "arguments": {…}}`. The arguments stay a free object: tool
/// schemas often use features that guided-decoding backends reject.
pub fn answer_or_call_format(tools: &[ToolSpec]) -> Value {
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    json!({
        "type": "json_schema",
        "json_schema": {
            "name": "answer_or_tool_call",
            "strict": true,
            "schema": {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {"answer": {"type": "string"}},
                        "required": ["answer"],
                        "additionalProperties": false
                    },
                    {
                        "type": "object",
                        "properties": {
                            "tool": {"type": "string", "enum": names},
                            "arguments": {"type": "object"}
                        },
                        "required": ["tool", "arguments"],
                        "additionalProperties": false
                    }
                ]
            }
        }
    })
}

/// The system-prompt part that explains the protocol and lists the tools,
/// since a request in this mode carries no `tools` of its own.
pub fn json_mode_instructions(tools: &[ToolSpec]) -> String {
    let mut text = String::from(
        "Reply with exactly one JSON object and nothing else: \
         {\"answer\": \"...\"} to give your final answer, or \
         {\"tool\": \"<tool name>\", \"arguments\": {...}} to call one tool. \
         After a tool call you will get its result. The tools:\n",
    );
    for tool in tools {
        text.push_str(&format!(
            "- {}: {}\n  arguments schema: {}\n",
            tool.name, tool.description, tool.input_schema
        ));
    }
    text
}

/// Reads the output of the JSON-schema protocol. A server that ignored the
/// schema may have written a call some other way, or plain text: the first
/// is recovered, the second kept as the answer.
pub fn read_answer_or_call(text: &str, tools: &[ToolSpec]) -> Recovered {
    let trimmed = text.trim();
    let object = serde_json::from_str::<Value>(trimmed)
        .ok()
        .or_else(|| repair(trimmed));
    if let Some(Value::Object(mut object)) = object {
        if let Some(Value::String(answer)) = object.remove("answer") {
            return Recovered {
                text: answer,
                calls: Vec::new(),
            };
        }
        if let Some(Value::String(name)) = object.remove("tool")
            && let Some(arguments) = arguments_of(object.remove("arguments"))
            && let Some(resolved) = resolve_tool_name(&name, &arguments, tools)
        {
            return Recovered {
                text: String::new(),
                calls: vec![new_call(resolved.name, arguments)],
            };
        }
    }
    recover_tool_calls(text, tools).unwrap_or_else(|| Recovered {
        text: text.to_string(),
        calls: Vec::new(),
    })
}

#[derive(Clone, Copy)]
enum Opener {
    Tag,
    Fence,
    Json,
}

/// The first place at or after `pos` where a tool call may start.
fn next_opener(text: &str, pos: usize) -> Option<(usize, Opener)> {
    let rest = text.get(pos..)?;
    [
        rest.find(TAG_OPEN).map(|i| (i, Opener::Tag)),
        rest.find(FENCE).map(|i| (i, Opener::Fence)),
        rest.find(['{', '[']).map(|i| (i, Opener::Json)),
    ]
    .into_iter()
    .flatten()
    .min_by_key(|(i, _)| *i)
    .map(|(i, opener)| (pos + i, opener))
}

/// The calls in a tagged or fenced passage: one JSON value, several in a
/// row (one per line, as some models write them), or one needing repair.
fn calls_in(passage: &str, tools: &[ToolSpec]) -> Option<Vec<ToolCall>> {
    let passage = passage.trim();
    let values: Vec<Value> = match serde_json::Deserializer::from_str(passage)
        .into_iter::<Value>()
        .collect::<Result<Vec<Value>, _>>()
    {
        Ok(values) if !values.is_empty() => values,
        _ => vec![repair(passage)?],
    };
    let mut calls = Vec::new();
    for value in values {
        calls.extend(interpret(value, tools)?);
    }
    Some(calls)
}

/// A call or a non-empty list of calls; anything else is not a call.
fn interpret(value: Value, tools: &[ToolSpec]) -> Option<Vec<ToolCall>> {
    match value {
        Value::Object(object) => Some(vec![one_call(object, tools)?]),
        Value::Array(items) if !items.is_empty() => items
            .into_iter()
            .map(|item| match item {
                Value::Object(object) => one_call(object, tools),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

fn one_call(mut object: Map<String, Value>, tools: &[ToolSpec]) -> Option<ToolCall> {
    // The OpenAI shape: {"type": "function", "function": {"name", "arguments"}}.
    if let Some(Value::Object(function)) = object.remove("function") {
        return only_extra_keys(&object)
            .then(|| one_call(function, tools))
            .flatten();
    }
    let Some(Value::String(name)) = object.remove("name") else {
        return None;
    };
    let arguments = ARGUMENT_KEYS.iter().find_map(|key| object.remove(*key));
    if !only_extra_keys(&object) {
        return None;
    }
    let arguments = arguments_of(arguments)?;
    let resolved = resolve_tool_name(&name, &arguments, tools)?;
    Some(new_call(resolved.name, arguments))
}

fn only_extra_keys(object: &Map<String, Value>) -> bool {
    object
        .keys()
        .all(|key| CALL_EXTRA_KEYS.contains(&key.as_str()))
}

/// Arguments as an object: missing means none, a string is parsed.
fn arguments_of(arguments: Option<Value>) -> Option<Value> {
    match arguments {
        None => Some(json!({})),
        Some(Value::Object(arguments)) => Some(Value::Object(arguments)),
        Some(Value::String(raw)) => Some(parse_arguments(&raw)),
        Some(_) => None,
    }
}

fn offered(name: &str, tools: &[ToolSpec]) -> bool {
    tools.iter().any(|tool| tool.name == name)
}

/// Whether `text` ends in one fragment (8 to 200 bytes, with at least three
/// different characters, so rules and padding do not count) repeated four
/// times or more in a row, or in one character repeated 256 times: a model
/// that loops.
pub fn repeats_itself(text: &str) -> bool {
    const TIMES: usize = 4;
    let bytes = text.as_bytes();
    // Or in one character written 256 times: `1000…0` for ever.
    const RUN: usize = 256;
    if bytes.len() >= RUN
        && bytes[bytes.len() - RUN..]
            .iter()
            .all(|b| *b == bytes[bytes.len() - 1])
    {
        return true;
    }
    (8..=200).any(|unit| {
        let span = unit * TIMES;
        if bytes.len() < span {
            return false;
        }
        let tail = &bytes[bytes.len() - span..];
        let first = &tail[..unit];
        let mut distinct = first.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        distinct.len() >= 3 && tail.chunks(unit).all(|chunk| chunk == first)
    })
}

/// How a call's name was matched to an offered tool.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub name: String,
    /// What was assumed, for the tool result; `None` for an exact name.
    pub note: Option<String>,
}

/// The offered tool a call means. Small models shorten names
/// (`execute_code` for `mcp__sandbox__execute_code`), change their case,
/// or invent one (`Python`) while passing the right arguments: the exact
/// name wins, then a unique tool with that short name (case aside), then
/// the one tool whose required arguments the call gives (with at least one
/// required, and no other tool's). `None` when nothing fits.
pub fn resolve_tool_name(name: &str, arguments: &Value, tools: &[ToolSpec]) -> Option<Resolved> {
    if offered(name, tools) {
        return Some(Resolved {
            name: name.to_string(),
            note: None,
        });
    }
    let short = |tool: &str| {
        tool.rsplit("__")
            .next()
            .unwrap_or(tool)
            .to_ascii_lowercase()
    };
    let wanted = short(name);
    let by_short: Vec<&ToolSpec> = tools.iter().filter(|t| short(&t.name) == wanted).collect();
    if let [tool] = by_short.as_slice() {
        return Some(Resolved {
            name: tool.name.clone(),
            note: Some(format!("'{name}' was taken to mean {}", tool.name)),
        });
    }
    // A name the tool's name or description mentions (`Python` for the
    // tool that runs python code).
    let word = name.to_ascii_lowercase();
    let mentions = |tool: &ToolSpec| {
        let text = format!("{} {}", tool.name, tool.description).to_ascii_lowercase();
        text.split(|c: char| !c.is_ascii_alphanumeric())
            .any(|w| w == word)
    };
    let mentioning: Vec<&ToolSpec> = tools.iter().filter(|t| mentions(t)).collect();
    if word.len() >= 3
        && let [tool] = mentioning.as_slice()
    {
        return Some(Resolved {
            name: tool.name.clone(),
            note: Some(format!(
                "there is no tool '{name}'; {} was called",
                tool.name
            )),
        });
    }
    let given: Vec<&str> = arguments
        .as_object()
        .map(|a| a.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let fitting: Vec<&ToolSpec> = tools
        .iter()
        .filter(|tool| {
            let required = required_of(&tool.input_schema);
            !required.is_empty() && required.iter().all(|r| given.contains(r))
        })
        .collect();
    match fitting.as_slice() {
        [tool] => Some(Resolved {
            name: tool.name.clone(),
            note: Some(format!(
                "there is no tool '{name}'; its arguments fit {}, which was called",
                tool.name
            )),
        }),
        _ => None,
    }
}

/// The `required` names of a JSON schema.
fn required_of(schema: &Value) -> Vec<&str> {
    schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn new_call(name: String, arguments: Value) -> ToolCall {
    ToolCall {
        id: new_call_id(),
        name,
        arguments,
    }
}

/// An id for a call the model gave none, in the shape OpenAI's ids have.
pub(super) fn new_call_id() -> String {
    format!("call_{}", uuid::Uuid::new_v4().simple())
}

/// Repairs text that is meant to be a JSON object or array. Prose is left
/// alone: the repairing parser would turn any text into some JSON.
fn repair(text: &str) -> Option<Value> {
    let brackets = text.chars().filter(|c| matches!(c, '{' | '[')).count();
    if !text.starts_with(['{', '[']) || brackets > MAX_REPAIR_BRACKETS {
        return None;
    }
    llm_json::loads(&valid_escapes(text), &llm_json::RepairOptions::default()).ok()
}

/// `text` with the escapes JSON does not know fixed inside its strings:
/// `\'` (which small models write for a quote inside Python code) loses
/// its backslash, and any other stray backslash is doubled.
fn valid_escapes(text: &str) -> Cow<'_, str> {
    if !text.contains('\\') {
        return Cow::Borrowed(text);
    }
    let mut fixed = String::with_capacity(text.len() + 8);
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        match c {
            '"' => in_string = !in_string,
            '\\' if in_string => match chars.peek() {
                Some('\'') => continue,
                Some('"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't' | 'u') => {
                    fixed.push(c);
                    if let Some(next) = chars.next() {
                        fixed.push(next);
                    }
                    continue;
                }
                _ => fixed.push('\\'),
            },
            _ => {}
        }
        fixed.push(c);
    }
    Cow::Owned(fixed)
}

/// Whether a reply has written more calls than any reply runs: a weak
/// model that alternates between calls never repeats one span exactly,
/// so [`repeats_itself`] misses it. Counted by the `"name"` keys.
pub fn writes_too_many_calls(text: &str) -> bool {
    text.matches("\"name\"").count() > MAX_CALLS_WRITTEN
}

/// The JSON value at the start of `text` with closing brackets that match
/// no opener dropped (`{"a": {"b": 1}]}`), and the length of text it
/// spans. `None` when it does not close or still does not parse.
fn without_strays(text: &str) -> Option<(Value, usize)> {
    let mut open = Vec::new();
    let mut kept = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    for (i, c) in text.char_indices() {
        if in_string {
            kept.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' | '[' => open.push(c),
            '}' | ']' => {
                let expected = if c == '}' { '{' } else { '[' };
                if open.last() != Some(&expected) {
                    continue;
                }
                open.pop();
            }
            _ => {}
        }
        kept.push(c);
        if open.is_empty() {
            let value = serde_json::from_str(&kept)
                .or_else(|_| serde_json::from_str(&valid_escapes(&kept)))
                .ok()?;
            return Some((value, i + c.len_utf8()));
        }
    }
    None
}

/// Trims the text left after removing calls, and closes the gaps they left.
fn tidy(text: &str) -> String {
    let mut text = text.trim().to_string();
    while text.contains("\n\n\n") {
        text = text.replace("\n\n\n", "\n\n");
    }
    text
}

/// The JSON object an answer holds, from its first `{` to its last `}`.
pub fn object_in(answer: &str) -> Option<serde_json::Map<String, Value>> {
    let start = answer.find('{')?;
    let end = answer.rfind('}')?;
    let slice = answer.get(start..=end)?;
    let value = serde_json::from_str::<Value>(slice)
        .ok()
        .or_else(|| llm_json::loads(slice, &llm_json::RepairOptions::default()).ok())?;
    match value {
        Value::Object(map) => Some(map),
        _ => None,
    }
}

#[cfg(test)]
#[path = "lenient_tests.rs"]
mod tests;
