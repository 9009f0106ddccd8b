//! A turn's tool calls, from a model reply to the messages that answer
//! them: bounded per reply, names matched to the offered tools, arguments
//! checked against the tool's schema, the harness asked before and after
//! each, output streamed as `tool_output` events and cut to size.

use std::sync::Arc;

use futures::StreamExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::approve::{self, Gate, Gated};
use super::coerce::coerce;
use super::deps::TurnDeps;
use super::harness::{Harness, Interventions, add_notes, emit_interventions};
use super::tools::{ToolChunk, ToolContext, ToolOutput};
use crate::model::{Message, ToolCall, ToolSpec};
use crate::protocol::EventKind;
use crate::session::Session;
use crate::store::StoreError;
use crate::telemetry::spans;

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

/// The tool part of `mcp__{server}__{tool}`.
fn without_server(name: &str) -> Option<&str> {
    let (_, tool) = name.strip_prefix("mcp__")?.split_once("__")?;
    Some(tool)
}

/// The offered tool a call names: its exact name, or the name with an
/// `mcp__{server}__` prefix added or dropped when that fits one tool.
fn offered_name<'a>(name: &str, tools: &'a [ToolSpec]) -> Option<&'a str> {
    let names = || tools.iter().map(|t| t.name.as_str());
    if let Some(exact) = names().find(|t| *t == name) {
        return Some(exact);
    }
    let mut fitting =
        names().filter(|t| Some(*t) == without_server(name) || without_server(t) == Some(name));
    match (fitting.next(), fitting.next()) {
        (Some(one), None) => Some(one),
        _ => None,
    }
}

/// The offered tool a call names, with its arguments checked against that
/// tool's schema; or why it cannot run.
fn prepare_call(call: &ToolCall, tools: &[ToolSpec]) -> Result<ToolCall, String> {
    let Some(spec) =
        offered_name(&call.name, tools).and_then(|name| tools.iter().find(|t| t.name == name))
    else {
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
    let checked = coerce(call.arguments.clone(), &spec.input_schema, false)
        .map_err(|e| format!("{}: {e}", spec.name))?;
    Ok(ToolCall {
        id: call.id.clone(),
        name: spec.name.clone(),
        arguments: checked.arguments,
    })
}

/// How a call of a batch will be answered.
enum Plan {
    /// It cannot run (unknown tool, arguments that do not fit).
    Refused(String),
    /// The harness answered it without running it.
    AnsweredCall(ToolOutput, Vec<String>),
    /// It runs now, with notes on what the harness changed.
    Run(ToolCall, Vec<String>),
}

/// Tool calls of one reply run at once, at most this many.
pub(super) const MAX_CONCURRENT_CALLS: usize = 8;

/// Runs a batch of a reply's tool calls: every `tool_use` first, in order;
/// then the harness sees each call (it may change it or answer it); then
/// the calls run, at most [`MAX_CONCURRENT_CALLS`] at once (one failing
/// cancels none of the others; their output streams as it comes, tagged
/// with the call's id); then each `tool_result`, in order, after the
/// harness saw it. A call's answer is the turn's answer when the harness
/// settles on one.
pub(super) async fn run_tools(
    deps: &TurnDeps,
    session: &Arc<Session>,
    ctx: &ToolContext,
    (tools, gate, output_limit): (&[ToolSpec], &Gate, usize),
    harness: &mut Harness,
    calls: &[ToolCall],
    cancel: &CancellationToken,
) -> Result<Vec<AnsweredCall>, StoreError> {
    for call in calls {
        session.emit(EventKind::ToolUse {
            id: call.id.clone(),
            tool: call.name.clone(),
            input: call.arguments.clone(),
        })?;
    }
    let mut said = Interventions::new();
    // `tools` holds only what the session allows.
    let plans: Vec<Plan> = calls
        .iter()
        .map(|asked| {
            let mut call = asked.clone();
            let mut notes = Vec::new();
            if let Some(output) = harness.on_call(&mut call, tools, &mut notes, &mut said) {
                return Plan::AnsweredCall(output, notes);
            }
            match prepare_call(&call, tools) {
                Ok(call) => Plan::Run(call, notes),
                Err(message) => Plan::Refused(message),
            }
        })
        .collect();
    emit_interventions(session, &mut said)?;
    // The permissions see each call as it will run, one after another: a
    // person decides one call at a time.
    let mut plans = plans;
    for plan in &mut plans {
        let Plan::Run(call, _) = plan else {
            continue;
        };
        match approve::gate(deps, session, gate, ctx, call.clone(), tools, cancel).await? {
            Gated::Run(checked) => *call = checked,
            Gated::Refused(why) => *plan = Plan::Refused(why),
        }
    }
    // Boxed with their type spelled out: the stream of borrowing futures
    // must stay `Send` for the session task.
    type Running<'a> = std::pin::Pin<
        Box<dyn std::future::Future<Output = Option<Result<ToolOutput, StoreError>>> + Send + 'a>,
    >;
    let running: Vec<Running<'_>> = plans
        .iter()
        .map(|plan| -> Running<'_> {
            match plan {
                Plan::Run(call, _) => Box::pin(async move {
                    let span = spans::tool(&call.name, &call.id, &call.arguments);
                    let output = span
                        .within(run_prepared(deps, session, ctx, call, cancel))
                        .await
                        .map(|mut output| {
                            approve::hide_denied(gate, call, &mut output);
                            output
                        });
                    if let Ok(output) = &output {
                        spans::tool_result(&span, &output.output);
                        if output.is_error {
                            span.fail("tool_error");
                        }
                    }
                    Some(output)
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
    for ((asked, plan), output) in calls.iter().zip(plans).zip(outputs) {
        let ran = !matches!(plan, Plan::AnsweredCall(..));
        let mut output = match (plan, output) {
            (Plan::Refused(message), _) => ToolOutput::error(message),
            (Plan::AnsweredCall(mut output, notes), _) => {
                add_notes(&mut output, &notes);
                output
            }
            (Plan::Run(_, notes), Some(output)) => {
                let mut output = output?;
                add_notes(&mut output, &notes);
                output
            }
            (Plan::Run(..), None) => unreachable!("every planned run has an output"),
        };
        let settled = harness.on_result(asked, ran, &mut output, &mut said);
        emit_interventions(session, &mut said)?;
        answered.push(AnsweredCall {
            message: finish_tool(deps, (session, ctx), asked, output, output_limit).await?,
            settled,
        });
    }
    Ok(answered)
}

/// A call of a reply, answered.
pub(super) struct AnsweredCall {
    /// The `tool` message that goes back to the model.
    pub message: Message,
    /// The turn's answer, when the harness settled on one.
    pub settled: Option<String>,
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

/// Sends a call's `tool_result` and makes the message that answers it. An
/// output past `agent.max_tool_output_bytes` is cut in the event at its
/// end; the model gets the head and tail of one past `limit` (that, or
/// less for a small window), and where the whole is kept.
async fn finish_tool(
    deps: &TurnDeps,
    (session, ctx): (&Arc<Session>, &ToolContext),
    call: &ToolCall,
    output: ToolOutput,
    limit: usize,
) -> Result<Message, StoreError> {
    let mut content = as_text(&output.output);
    if content.len() > limit {
        let kept = keep_output(deps, ctx, call, &content).await;
        content = head_and_tail(&content, limit, kept.as_deref());
    }
    let output = truncate(output, deps.config.max_tool_output_bytes);
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

/// Where the whole of a long output is kept in the sandbox.
pub const OUTPUTS_DIR: &str = "/workspace/.conclave/outputs";

/// Writes a long output whole into the session's sandbox, where `Read`
/// (with `offset` and `limit`) and `Grep` reach it: its path, or `None`
/// without a sandbox, for `Read`'s own output (the file it read is
/// there), or when the write failed.
async fn keep_output(
    deps: &TurnDeps,
    ctx: &ToolContext,
    call: &ToolCall,
    text: &str,
) -> Option<String> {
    if call.name == "Read" || !ctx.options.sandbox_enabled() {
        return None;
    }
    let name: String = call
        .id
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let path = format!("{OUTPUTS_DIR}/{name}.txt");
    let input = serde_json::json!({"file_path": path, "content": text});
    let written = deps
        .tools
        .call(ctx, "Write", input, CancellationToken::new())
        .await;
    if written.is_error {
        tracing::warn!(call = %call.id, output = %written.output, "a long output could not be kept in the sandbox");
        return None;
    }
    Some(path)
}

/// The head and the tail of `text` within about `limit` bytes, with a line
/// between them that says how much was left out and where the whole is.
fn head_and_tail(text: &str, limit: usize, kept: Option<&str>) -> String {
    let half = limit.saturating_sub(256) / 2;
    let mut head = half.min(text.len());
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len().saturating_sub(half).max(head);
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    let where_ = match kept {
        Some(path) => format!(
            "; the whole output ({} bytes) is in {path}: Read it with offset and limit (lines), \
             or Grep it",
            text.len()
        ),
        None => String::new(),
    };
    format!(
        "{}\n[... {} bytes left out{where_} ...]\n{}",
        &text[..head],
        tail - head,
        &text[tail..]
    )
}

/// A tool's output as the model reads it: a string as it is; an object
/// (an exec's `stdout`, `stderr`, `exit_code`…) as `key: value` lines, its
/// printed text last and verbatim under its own line, without the empty
/// fields and the flags that are off: printed text reads as it was
/// printed, not as escaped JSON (whose quotes and `\n`s a model may take
/// for its own and continue in its next call).
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
    // it; a success's output last, after the notes on stderr: a model
    // answers from what it read last.
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
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_long_output_keeps_its_head_and_tail_and_says_where_the_whole_is() {
        let text = format!(
            "{}{}{}",
            "a".repeat(5000),
            "b".repeat(90_000),
            "c".repeat(5000)
        );
        let path = "/workspace/.conclave/outputs/c1.txt";
        let cut = head_and_tail(&text, 4096, Some(path));
        assert!(cut.len() < 4096 + 300, "{}", cut.len());
        assert!(cut.starts_with(&"a".repeat(1920)));
        assert!(cut.ends_with(&"c".repeat(1920)));
        assert!(cut.contains("bytes left out; the whole output (100000 bytes) is in"));
        assert!(cut.contains(path));
        let plain = head_and_tail(&"é".repeat(5000), 1000, None);
        assert!(plain.contains("bytes left out ...]"));
    }

    fn spec(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            input_schema: Arc::new(serde_json::json!({"type": "object"})),
            read_only: false,
        }
    }

    /// A name matches exactly, or with an `mcp__server__` prefix added or
    /// dropped when that fits one tool; nothing else (no case, no guess).
    #[test]
    fn offered_names_match_exactly_up_to_an_mcp_prefix() {
        let tools = [
            spec("Bash"),
            spec("mcp__sandbox__execute_code"),
            spec("mcp__a__search"),
            spec("mcp__b__search"),
        ];
        let found = |name: &str| offered_name(name, &tools);
        assert_eq!(found("Bash"), Some("Bash"));
        assert_eq!(found("mcp__x__Bash"), Some("Bash"));
        assert_eq!(found("execute_code"), Some("mcp__sandbox__execute_code"));
        assert_eq!(found("bash"), None);
        assert_eq!(found("Python"), None);
        assert_eq!(found("search"), None, "two tools fit");
        assert_eq!(found("mcp__a__search"), Some("mcp__a__search"));
    }

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

    /// An exec result reads as lines, with the printed text verbatim, not
    /// as escaped JSON; what a success printed comes last, after its notes,
    /// and a failure's error after what it printed.
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
