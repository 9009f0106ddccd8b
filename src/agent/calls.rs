//! A turn's tool calls, from a model reply to the messages that answer
//! them: bounded per reply, names resolved against the offered tools,
//! arguments brought to the tool's schema, a repeated call answered from its
//! first run, output streamed as `tool_output` events and cut to size.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::coerce::coerce;
use super::tools::{ToolChunk, ToolContext, ToolOutput};
use super::turn::TurnDeps;
use crate::model::{Message, ToolCall, ToolSpec, lenient};
use crate::protocol::EventKind;
use crate::session::Session;
use crate::store::StoreError;

/// `tool_output` chunks that may wait for the turn to emit them; a tool
/// printing faster loses progress chunks, never its result.
const OUTPUT_BACKLOG: usize = 64;

/// Keeps the first of each set of identical calls, then the first `limit`;
/// a note says what went, if anything did.
pub(super) fn bound_calls(calls: &mut Vec<ToolCall>, limit: usize) -> Option<String> {
    let asked = calls.len();
    let mut seen = std::collections::HashSet::new();
    calls.retain(|call| seen.insert((call.name.clone(), call.arguments.to_string())));
    let repeats = asked - calls.len();
    let over = calls.len().saturating_sub(limit);
    calls.truncate(limit);
    let mut parts = Vec::new();
    if repeats > 0 {
        parts.push(format!("{repeats} repeated call(s) collapsed"));
    }
    if over > 0 {
        parts.push(format!(
            "{over} call(s) past agent.max_tool_calls_per_reply ({limit}) dropped"
        ));
    }
    (!parts.is_empty()).then(|| {
        format!(
            "The model asked for {asked} tool call(s) in one reply: {}.",
            parts.join(", ")
        )
    })
}

/// Whether text that made no call was meant as one: JSON, a JSON fence or
/// a tool-call tag.
pub(super) fn looks_like_a_call(text: &str) -> bool {
    let text = text.trim_start();
    text.starts_with('{')
        || text.starts_with('[')
        || text.contains("```json")
        || text.contains("<tool_call>")
        || (text.contains("\"arguments\"") && text.contains("\"name\""))
}

/// What a model whose call could not be read is told.
pub(super) fn unreadable_call_note(tools: &[ToolSpec]) -> String {
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    format!(
        "Your last reply could not be read as a tool call. To call a tool, reply with \
         only {{\"name\": \"<tool>\", \"arguments\": {{...}}}} using one of: {}. \
         To give your final answer, reply in plain text.",
        names.join(", ")
    )
}

/// The offered tool a call means and its arguments brought to that tool's
/// schema, with notes on what was assumed; or why it cannot run.
fn prepare_call(call: &ToolCall, tools: &[ToolSpec]) -> Result<(ToolCall, Vec<String>), String> {
    let Some(resolved) = lenient::resolve_tool_name(&call.name, &call.arguments, tools) else {
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        return Err(if names.is_empty() {
            format!(
                "tool '{}' is not available: this session has no tools",
                call.name
            )
        } else {
            format!(
                "there is no tool '{}' in this session; its tools are: {}",
                call.name,
                names.join(", ")
            )
        });
    };
    // A resolved name is one of `tools`; this only guards the invariant.
    let Some(spec) = tools.iter().find(|t| t.name == resolved.name) else {
        return Err(format!(
            "there is no tool '{}' in this session",
            resolved.name
        ));
    };
    let coerced = coerce(call.arguments.clone(), &spec.input_schema)
        .map_err(|e| format!("{}: {e}", spec.name))?;
    let mut notes: Vec<String> = resolved.note.into_iter().collect();
    notes.extend(coerced.notes);
    Ok((
        ToolCall {
            id: call.id.clone(),
            name: resolved.name,
            arguments: coerced.arguments,
        },
        notes,
    ))
}

/// Adds what was assumed about a call to its output, where the model
/// reads it.
fn with_notes(mut output: ToolOutput, notes: &[String]) -> ToolOutput {
    if notes.is_empty() {
        return output;
    }
    let note = format!("Note: {}.", notes.join("; "));
    match &mut output.output {
        Value::Object(fields) => {
            fields.insert("note".into(), Value::String(note));
        }
        Value::String(text) => {
            text.push('\n');
            text.push_str(&note);
        }
        other => {
            *other = serde_json::json!({"output": other.clone(), "note": note});
        }
    }
    output
}

/// How a call of a batch will be answered.
enum Plan {
    /// It cannot run (unknown tool, arguments that do not fit).
    Refused(String),
    /// It ran earlier in this turn: its result again.
    Repeated(ToolOutput, Vec<String>, Option<String>),
    /// It runs now, prepared, with notes on what was assumed.
    Run(ToolCall, Vec<String>),
}

/// Tool calls of one reply run at once, at most this many.
pub(super) const MAX_CONCURRENT_CALLS: usize = 8;

/// Runs a batch of a reply's tool calls: every `tool_use` first, in order;
/// then the calls, at most [`MAX_CONCURRENT_CALLS`] at once (one failing
/// cancels none of the others; their output streams as it comes, tagged
/// with the call's id); then each `tool_result`, in order.
pub(super) async fn run_tools(
    deps: &TurnDeps,
    session: &Arc<Session>,
    ctx: &ToolContext,
    tools: &[ToolSpec],
    ran: &mut TurnCalls,
    calls: &[ToolCall],
    cancel: &CancellationToken,
) -> Result<Vec<Answered>, StoreError> {
    for call in calls {
        session.emit(EventKind::ToolUse {
            id: call.id.clone(),
            tool: call.name.clone(),
            input: call.arguments.clone(),
        })?;
    }
    // `tools` holds only what the session allows.
    let plans: Vec<Plan> = calls
        .iter()
        .map(|call| match prepare_call(call, tools) {
            Err(message) => Plan::Refused(message),
            Ok((call, mut notes)) => match ran.by_call.get_mut(&key_of(&call)) {
                Some(earlier) => {
                    earlier.times += 1;
                    let settled =
                        (earlier.times >= REPEATS_TO_SETTLE).then(|| answer_of(&earlier.output));
                    notes.push(
                        "this exact call already ran in this turn and was not run again; \
                         its result is repeated here. If it answers the question, reply \
                         with the answer in plain text"
                            .into(),
                    );
                    Plan::Repeated(earlier.output.clone(), notes, settled)
                }
                None => Plan::Run(call, notes),
            },
        })
        .collect();
    // Boxed with their type spelled out: the stream of borrowing futures
    // must stay `Send` for the session task.
    type Running<'a> = std::pin::Pin<
        Box<dyn std::future::Future<Output = Option<Result<ToolOutput, StoreError>>> + Send + 'a>,
    >;
    let running: Vec<Running<'_>> =
        plans
            .iter()
            .map(|plan| -> Running<'_> {
                match plan {
                    Plan::Run(call, _) => Box::pin(async move {
                        Some(run_prepared(deps, session, ctx, call, cancel).await)
                    }),
                    _ => Box::pin(async { None }),
                }
            })
            .collect();
    let outputs: Vec<Option<Result<ToolOutput, StoreError>>> = futures::stream::iter(running)
        .buffered(MAX_CONCURRENT_CALLS)
        .collect()
        .await;
    let mut answered = Vec::with_capacity(calls.len());
    for ((call, plan), output) in calls.iter().zip(plans).zip(outputs) {
        let (output, settled) = match (plan, output) {
            (Plan::Refused(message), _) => (ToolOutput::error(message), None),
            (Plan::Repeated(output, notes, settled), _) => (with_notes(output, &notes), settled),
            (Plan::Run(prepared, mut notes), Some(output)) => {
                let output = output?;
                let settled = ran.record(&prepared, &output, &mut notes);
                (with_notes(output, &notes), settled)
            }
            (Plan::Run(..), None) => unreachable!("every planned run has an output"),
        };
        // A failing call asked for again, as it was, failed again (it ran:
        // what it depends on may have changed in between).
        let failed_again = output.is_error.then(|| ran.failed(call, &output)).flatten();
        let output = if failed_again.is_some() {
            with_notes(
                output,
                &["this exact call already failed in this turn; change it".into()],
            )
        } else {
            output
        };
        let printed = !output.is_error && printed(&output).is_some();
        answered.push(Answered {
            message: finish_tool(deps, session, call, output)?,
            settled,
            printed,
            failed_again,
        });
    }
    Ok(answered)
}

/// A call of a reply, answered.
pub(super) struct Answered {
    /// The `tool` message that goes back to the model.
    pub message: Message,
    /// The turn's answer, when the model's calls keep printing one.
    pub settled: Option<String>,
    /// It succeeded and printed something.
    pub printed: bool,
    /// It failed, as it had earlier in the turn, asked for as it was: the
    /// last line of its error.
    pub failed_again: Option<String>,
}

/// What makes two calls the same call.
fn key_of(call: &ToolCall) -> String {
    format!("{} {}", call.name, call.arguments)
}

impl TurnCalls {
    /// Counts a failure of `call`; its error line when it had failed before.
    fn failed(&mut self, call: &ToolCall, output: &ToolOutput) -> Option<String> {
        let (times, error) = self.failed.entry(key_of(call)).or_default();
        *times += 1;
        *error = last_error_line(output);
        (*times > 1).then(|| error.clone())
    }

    /// The error of a call that failed twice in this turn, asked for as it
    /// was: a third time it is not run, nor kept in the history (a small
    /// model copies the calls it sees; it is asked again instead).
    pub(super) fn failed_twice(&self, call: &ToolCall) -> Option<&str> {
        match self.failed.get(&key_of(call)) {
            Some((times, error)) if *times >= 2 => Some(error),
            _ => None,
        }
    }

    /// Keeps a call that ran; answers its printed output when different
    /// calls printed it often enough to be the answer (a note says so
    /// before that).
    fn record(
        &mut self,
        call: &ToolCall,
        output: &ToolOutput,
        notes: &mut Vec<String>,
    ) -> Option<String> {
        if output.is_error {
            return None;
        }
        let mut settled = None;
        // Different code printing what earlier code printed is the same
        // answer again.
        if let Some(printed) = printed(output) {
            let times = self.by_output.entry(printed.clone()).or_insert(0);
            *times += 1;
            if *times >= REPEATS_TO_SETTLE {
                settled = Some(printed);
            } else if *times > 1 {
                notes.push(
                    "this call printed the same as an earlier call of this \
                     turn. If that answers the question, reply with the \
                     answer in plain text"
                        .into(),
                );
            }
        }
        self.by_call.insert(
            key_of(call),
            Ran {
                output: output.clone(),
                times: 1,
            },
        );
        settled
    }
}

/// The successful calls of a turn: by name and arguments, and by what
/// they printed.
#[derive(Default)]
pub(super) struct TurnCalls {
    by_call: HashMap<String, Ran>,
    /// How many different calls printed each output.
    by_output: HashMap<String, u32>,
    /// Calls as the model asked for them that failed or were refused: how
    /// often, and the last line of the error.
    failed: HashMap<String, (u32, String)>,
}

/// A successful call of this turn and how often it was asked for.
struct Ran {
    output: ToolOutput,
    times: u32,
}

/// A model that asks this many times for a call that already succeeded
/// (when told its result answers) has its answer: that result. Tiny models
/// often cannot stop calling to write a reply.
pub(super) const REPEATS_TO_SETTLE: u32 = 3;

/// What a successful call printed, when it printed something: its text,
/// or an execution's stdout.
fn printed(output: &ToolOutput) -> Option<String> {
    let text = match &output.output {
        Value::String(text) => text.as_str(),
        Value::Object(fields) => fields.get("stdout").and_then(Value::as_str)?,
        _ => return None,
    };
    let text = text.trim_end();
    (!text.trim().is_empty()).then(|| text.to_string())
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

/// Runs a call whose name and arguments are settled, streaming what it
/// prints as `tool_output` events.
async fn run_prepared(
    deps: &TurnDeps,
    session: &Arc<Session>,
    ctx: &ToolContext,
    call: &ToolCall,
    cancel: &CancellationToken,
) -> Result<ToolOutput, StoreError> {
    let (sink, mut printed) = tokio::sync::mpsc::channel(OUTPUT_BACKLOG);
    let running = deps.tools.call_with_output(
        ctx,
        &call.name,
        call.arguments.clone(),
        cancel.child_token(),
        sink,
    );
    tokio::pin!(running);
    let show = |chunk: ToolChunk| {
        if chunk.stream == super::tools::STATUS_STREAM {
            return session.emit(EventKind::Status {
                message: chunk.content,
            });
        }
        session.emit(EventKind::ToolOutput {
            id: call.id.clone(),
            stream: chunk.stream,
            content: chunk.content,
        })
    };
    let output = loop {
        tokio::select! {
            output = &mut running => break output,
            Some(chunk) = printed.recv() => { show(chunk)?; }
        }
    };
    while let Ok(chunk) = printed.try_recv() {
        show(chunk)?;
    }
    Ok(output)
}

/// Sends a call's `tool_result` and makes the message that answers it.
fn finish_tool(
    deps: &TurnDeps,
    session: &Arc<Session>,
    call: &ToolCall,
    output: ToolOutput,
) -> Result<Message, StoreError> {
    let output = truncate(output, deps.config.max_tool_output_bytes);
    let content = as_text(&output.output);
    session.emit(EventKind::ToolResult {
        id: call.id.clone(),
        tool: call.name.clone(),
        output: output.output,
        is_error: output.is_error,
    })?;
    Ok(Message::Tool {
        tool_call_id: call.id.clone(),
        name: call.name.clone(),
        content,
        is_error: output.is_error,
    })
}

/// A tool's output as the model reads it: a string as it is; an object
/// (an exec's `stdout`, `stderr`, `exit_code`…) as `key: value` lines, its
/// printed text last and verbatim under its own line, without the empty
/// fields and the flags that are off. Shown as escaped JSON, a small model
/// reads the quotes and `\n`s of the output as its own and continues them
/// in its next call.
fn as_text(output: &Value) -> String {
    let fields = match output {
        Value::String(s) => return s.clone(),
        Value::Object(fields) => fields,
        other => return other.to_string(),
    };
    let mut lines = Vec::new();
    let mut texts = Vec::new();
    for (key, value) in fields {
        match value {
            Value::Null | Value::Bool(false) => {}
            Value::String(s) if s.is_empty() => {}
            Value::String(s) if s.contains('\n') => texts.push((key, s)),
            Value::String(s) => lines.push(format!("{key}: {s}")),
            other => lines.push(format!("{key}: {other}")),
        }
    }
    // A failure's error last, after what it printed, as a terminal shows
    // it; a success's output last, after the notes on stderr: the model
    // answers from what it read last (Qwen2.5-Coder-0.5B, shown `6765`
    // and then its repaired code, answered with a made-up number).
    let failed = fields.get("status").and_then(Value::as_str) == Some("error")
        || fields
            .get("exit_code")
            .and_then(Value::as_i64)
            .is_some_and(|c| c != 0);
    let last = if failed { "stderr" } else { "stdout" };
    texts.sort_by_key(|(key, _)| (key.as_str() == last, key.as_str() != "stdout"));
    for (key, text) in texts {
        lines.push(format!("{key}:\n{}", text.trim_end_matches('\n')));
    }
    lines.join("\n")
}

/// Keeps a string output under `max` bytes, marking the cut.
fn truncate(mut output: ToolOutput, max: usize) -> ToolOutput {
    cut_to_fit(&mut output.output, max);
    output
}

/// Cuts a value to about `max` bytes of JSON, marking each cut: a string
/// directly; an object's string fields (an exec's stdout and stderr) share
/// the budget, the longest cut first. Whether anything was cut.
pub fn cut_to_fit(value: &mut Value, max: usize) -> bool {
    match value {
        Value::String(s) => {
            let cut = s.len() > max;
            cut_string(s, max);
            cut
        }
        Value::Object(fields) => {
            let mut size = Value::Object(fields.clone()).to_string().len();
            let mut cut = false;
            while size > max {
                let longest = fields
                    .iter()
                    .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.len())))
                    .max_by_key(|(_, len)| *len);
                let Some((key, len)) = longest.filter(|(_, len)| *len > 64) else {
                    break;
                };
                let Some(Value::String(text)) = fields.get_mut(&key) else {
                    break;
                };
                // The marker adds a few bytes back: cut a little more.
                cut_string(text, len.saturating_sub(size - max + 48).max(32));
                cut = true;
                size = Value::Object(fields.clone()).to_string().len();
            }
            cut
        }
        _ => false,
    }
}

/// Cuts `s` to about `max` bytes on a character boundary, marking the cut.
fn cut_string(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    let dropped = s.len() - cut;
    s.truncate(cut);
    s.push_str(&format!("\n[... truncated {dropped} bytes]"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_marks_the_cut_on_a_char_boundary() {
        let out = truncate(
            ToolOutput {
                output: Value::String("héllo world".into()),
                is_error: false,
            },
            2,
        );
        assert_eq!(
            out.output,
            Value::String("h\n[... truncated 11 bytes]".into())
        );
    }

    #[test]
    fn structured_outputs_are_cut_to_fit_longest_field_first() {
        let out = truncate(
            ToolOutput {
                output: serde_json::json!({
                    "stdout": "x".repeat(10_000),
                    "stderr": "short",
                    "exit_code": 0,
                }),
                is_error: false,
            },
            1_000,
        );
        let text = out.output.to_string();
        assert!(text.len() <= 1_000, "{} bytes", text.len());
        assert_eq!(out.output["stderr"], "short");
        assert_eq!(out.output["exit_code"], 0);
        let stdout = out.output["stdout"].as_str().expect("stdout");
        assert!(stdout.contains("[... truncated"), "{stdout}");
    }

    /// The exact error of Qwen2.5-Coder-0.5B's task 14 cell: read as
    /// lines, with the printed text verbatim, not as escaped JSON; what
    /// a success printed comes last, after its notes, and a failure's
    /// error after what it printed.
    #[test]
    fn an_exec_result_reads_as_lines_for_the_model() {
        let output = serde_json::json!({
            "duration_ms": 51, "exit_code": 1, "status": "error", "truncated": false,
            "stdout": "", "stderr": "  File \"<cell>\", line 1\nSyntaxError: unterminated string literal\n",
            "note": "one line",
        });
        assert_eq!(
            as_text(&output),
            "duration_ms: 51\nexit_code: 1\nnote: one line\nstatus: error\n\
             stderr:\n  File \"<cell>\", line 1\nSyntaxError: unterminated string literal"
        );
        let printed =
            serde_json::json!({"stdout": "1\n2\n", "stderr": "warning\n", "exit_code": 0});
        assert_eq!(
            as_text(&printed),
            "exit_code: 0\nstderr:\nwarning\nstdout:\n1\n2"
        );
        let failed = serde_json::json!({"stdout": "1\n", "stderr": "Error\n", "exit_code": 2});
        assert_eq!(as_text(&failed), "exit_code: 2\nstdout:\n1\nstderr:\nError");
        assert_eq!(as_text(&Value::String("as is".into())), "as is");
    }
}
