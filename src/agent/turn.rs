//! One turn: model call → tool calls → model call … until the model stops,
//! `max_turns`, `max_budget_usd`, an interrupt or an error. Every turn ends
//! with exactly one `result` event.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::coerce::coerce;
use super::events::{Event, EventKind, ResultStatus, Usage};
use super::manager::status_after;
use super::session::Session;
use super::tools::{ToolChunk, ToolContext, ToolOutput, ToolRouter};
use crate::config::AgentConfig;
use crate::model::{
    ChatRequest, Message, ModelError, ModelRegistry, ResolvedModel, StreamEvent, ToolCall,
    ToolSpec, lenient,
};
use crate::store::{SessionStatus, Store, StoreError};
use crate::telemetry::{Metrics, ModelLabel, StatusLabel};

/// `tool_output` chunks that may wait for the turn to emit them; a tool
/// printing faster loses progress chunks, never its result.
const OUTPUT_BACKLOG: usize = 64;

/// What every turn uses, shared by all sessions.
pub struct TurnDeps {
    pub store: Arc<dyn Store>,
    pub models: Arc<ModelRegistry>,
    pub tools: Arc<dyn ToolRouter>,
    pub config: AgentConfig,
    pub metrics: Arc<Metrics>,
}

/// How the loop ended, before it becomes a `result` event.
struct Outcome {
    status: ResultStatus,
    text: Option<String>,
}

/// The turn's running totals.
struct Tally {
    /// The session's usage before this turn.
    before: Usage,
    usage: Usage,
    cost_known: bool,
}

impl Tally {
    fn starting(session: &Session) -> Tally {
        Tally {
            before: session.usage(),
            usage: Usage::default(),
            cost_known: true,
        }
    }

    /// The session's usage with this turn's so far added.
    fn session_total(&self) -> Usage {
        let mut total = self.before.clone();
        total.add(&self.usage);
        total
    }
}

/// Runs one turn to its `result`. Store failures end the turn early; they
/// are logged, since the log itself is what failed.
pub async fn run(
    deps: &TurnDeps,
    session: &Arc<Session>,
    prompt: String,
    cancel: CancellationToken,
) {
    deps.metrics.turns_running.inc();
    if let Err(e) = run_inner(deps, session, prompt, cancel).await {
        tracing::error!(session = %session.id, error = %e, "turn aborted by a store failure");
        let _ = session
            .set_state(status_after(session, ResultStatus::Error), None)
            .await;
        if session.ephemeral {
            deps.tools.release(session.id).await;
        }
    }
    deps.metrics.turns_running.dec();
}

async fn run_inner(
    deps: &TurnDeps,
    session: &Arc<Session>,
    prompt: String,
    cancel: CancellationToken,
) -> Result<(), StoreError> {
    let started = Instant::now();
    // `running` is stored before any event of the turn: a crash after the
    // first event always leaves a turn to close at restart.
    if session.status() != SessionStatus::Running {
        session.set_state(SessionStatus::Running, None).await?;
    }
    session.emit(EventKind::Status {
        message: "Starting agent...".into(),
    })?;
    deps.store
        .append_messages(session.id, &[Message::User { content: prompt }])
        .await?;
    let mut tally = Tally::starting(session);
    // The turn's own token: cancelled by an interrupt (its parent) or when
    // the wall-clock limit passes, which only this timer does.
    let limit = Duration::from_secs(deps.config.turn_timeout_s);
    let turn_cancel = cancel.child_token();
    let timer = tokio::spawn({
        let turn_cancel = turn_cancel.clone();
        async move {
            tokio::time::sleep(limit).await;
            turn_cancel.cancel();
        }
    });
    let result = agent_loop(deps, session, &turn_cancel, &mut tally).await;
    timer.abort();
    let timed_out = turn_cancel.is_cancelled() && !cancel.is_cancelled();
    let outcome = match result {
        Ok(outcome) if timed_out && outcome.status == ResultStatus::Interrupted => {
            session.emit(EventKind::Status {
                message: format!(
                    "The turn ran past its {} s limit (agent.turn_timeout_s) and was stopped.",
                    limit.as_secs()
                ),
            })?;
            Outcome {
                status: ResultStatus::TimedOut,
                text: outcome.text,
            }
        }
        Ok(outcome) => outcome,
        Err(LoopError::Store(e)) => return Err(e),
        Err(LoopError::Model(e)) => {
            deps.metrics
                .model_errors
                .get_or_create(&ModelLabel {
                    model: model_name(deps, session),
                })
                .inc();
            session.emit(EventKind::Error {
                message: e.to_string(),
                code: e.code().into(),
            })?;
            Outcome {
                status: ResultStatus::Error,
                text: None,
            }
        }
    };
    finish(deps, session, outcome, tally, started).await
}

async fn finish(
    deps: &TurnDeps,
    session: &Arc<Session>,
    outcome: Outcome,
    tally: Tally,
    started: Instant,
) -> Result<(), StoreError> {
    // An ephemeral session's one turn is over and nothing will use its
    // sandbox again: it is gone by the time the client reads the result.
    if session.ephemeral {
        deps.tools.release(session.id).await;
    }
    session.emit(EventKind::Result {
        status: outcome.status,
        result: outcome.text,
        cost_usd: tally.usage.cost_usd,
        cost_known: tally.cost_known,
        turns: tally.usage.turns as u32,
        usage: tally.usage.clone(),
        duration_ms: started.elapsed().as_millis() as u64,
    })?;
    // Past its result the turn can no longer be interrupted, and a message
    // that comes now waits for it instead of being refused.
    *session.running.lock().unwrap_or_else(|e| e.into_inner()) = None;
    session.flush().await?;
    // A crash before this line leaves `running` with a `result` stored, which
    // the restart only has to mark as settled.
    session
        .set_state(
            status_after(session, outcome.status),
            Some(&tally.session_total()),
        )
        .await?;
    let status = serde_json::to_value(outcome.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    tracing::info!(
        session = %session.id,
        %status,
        model_calls = tally.usage.turns,
        tool_calls = tally.usage.tool_calls,
        ms = started.elapsed().as_millis() as u64,
        "turn finished"
    );
    deps.metrics
        .turns_finished
        .get_or_create(&StatusLabel { status })
        .inc();
    Ok(())
}

enum LoopError {
    Store(StoreError),
    Model(ModelError),
}

impl From<StoreError> for LoopError {
    fn from(e: StoreError) -> Self {
        LoopError::Store(e)
    }
}

fn model_name(deps: &TurnDeps, session: &Session) -> String {
    session
        .options
        .model
        .clone()
        .unwrap_or_else(|| deps.models.default_model().to_string())
}

async fn agent_loop(
    deps: &TurnDeps,
    session: &Arc<Session>,
    cancel: &CancellationToken,
    tally: &mut Tally,
) -> Result<Outcome, LoopError> {
    let options = &session.options;
    let name = model_name(deps, session);
    let model = deps.models.resolve(&name).map_err(LoopError::Model)?;
    tally.cost_known = model.price.is_some();
    let ctx = ToolContext {
        session_id: session.id,
        options: options.clone(),
    };
    let tools: Vec<_> = deps
        .tools
        .specs(&ctx)
        .await
        .into_iter()
        .filter(
            |spec| match (&options.allowed_tools, &model.default_tools) {
                (None, Some(defaults)) => defaults.contains(&spec.name),
                _ => options.allows(&spec.name),
            },
        )
        .collect();
    let max_calls = options.max_turns.unwrap_or(deps.config.max_turns);
    let system = options
        .system_prompt
        .clone()
        .or_else(|| default_system_prompt(&tools, options.working_dir.as_deref()));
    let mut history = deps.store.messages(session.id).await?;
    let mut last_text = None;
    let mut retried = false;
    // Successful calls of this turn by name and arguments: a weak model
    // asks for the same call again instead of answering.
    let mut ran: HashMap<String, Ran> = HashMap::new();
    loop {
        if cancel.is_cancelled() {
            return Ok(Outcome {
                status: ResultStatus::Interrupted,
                text: last_text,
            });
        }
        if tally.usage.turns >= u64::from(max_calls) {
            return Ok(Outcome {
                status: ResultStatus::MaxTurns,
                text: last_text,
            });
        }
        let request = ChatRequest {
            model: model.upstream_model.clone(),
            system: system.clone(),
            messages: history.clone(),
            tools: tools.clone(),
            temperature: options.temperature,
            max_tokens: Some(options.max_tokens.unwrap_or(deps.config.max_tokens)),
            tool_call_mode: model.tool_call_mode,
            session_id: Some(session.id.to_string()),
            owner: session.owner.clone(),
        };
        let mut reply = call_model(deps, session, &model, request, cancel, tally).await?;
        let limit = deps.config.max_tool_calls_per_reply as usize;
        if let Some(note) = bound_calls(&mut reply.calls, limit) {
            session.emit(EventKind::Status { message: note })?;
        }
        if !reply.text.is_empty() {
            session.emit(EventKind::Thinking {
                content: reply.text.clone(),
            })?;
            last_text = Some(reply.text.clone());
        }
        let assistant = Message::Assistant {
            content: reply.text.clone(),
            tool_calls: reply.calls.clone(),
        };
        deps.store
            .append_messages(session.id, std::slice::from_ref(&assistant))
            .await?;
        history.push(assistant);
        session
            .set_state(SessionStatus::Running, Some(&tally.session_total()))
            .await?;
        if reply.interrupted {
            close_calls(deps, session, &reply.calls, &mut history).await?;
            return Ok(Outcome {
                status: ResultStatus::Interrupted,
                text: last_text,
            });
        }
        if reply.calls.is_empty() {
            // A reply that tried to call a tool and could not be read gets
            // one more chance, with the format in front of the model.
            if !retried && !tools.is_empty() && looks_like_a_call(&reply.text) {
                retried = true;
                session.emit(EventKind::Status {
                    message: "The model's reply looked like a tool call but could not be read; \
                              asking it once more."
                        .into(),
                })?;
                let nudge = Message::User {
                    content: unreadable_call_note(&tools),
                };
                deps.store
                    .append_messages(session.id, std::slice::from_ref(&nudge))
                    .await?;
                history.push(nudge);
                continue;
            }
            return Ok(Outcome {
                status: ResultStatus::Success,
                text: Some(reply.text),
            });
        }
        if let Some(budget) = options.max_budget_usd
            && tally.usage.cost_usd >= budget
        {
            close_calls(deps, session, &reply.calls, &mut history).await?;
            return Ok(Outcome {
                status: ResultStatus::BudgetExceeded,
                text: last_text,
            });
        }
        for (i, call) in reply.calls.iter().enumerate() {
            if cancel.is_cancelled() {
                close_calls(deps, session, &reply.calls[i..], &mut history).await?;
                return Ok(Outcome {
                    status: ResultStatus::Interrupted,
                    text: last_text,
                });
            }
            let (message, settled) =
                run_tool(deps, session, &ctx, &tools, &mut ran, call, cancel).await?;
            tally.usage.tool_calls += 1;
            deps.store
                .append_messages(session.id, std::slice::from_ref(&message))
                .await?;
            history.push(message);
            if let Some(answer) = settled {
                close_calls(deps, session, &reply.calls[i + 1..], &mut history).await?;
                session.emit(EventKind::Status {
                    message: format!(
                        "The model asked for the same call {REPEATS_TO_SETTLE} times; its output is taken as the answer."
                    ),
                })?;
                return Ok(Outcome {
                    status: ResultStatus::Success,
                    text: Some(answer),
                });
            }
        }
    }
}

/// What one model call produced.
struct Reply {
    text: String,
    calls: Vec<ToolCall>,
    interrupted: bool,
}

async fn call_model(
    deps: &TurnDeps,
    session: &Arc<Session>,
    model: &ResolvedModel,
    request: ChatRequest,
    cancel: &CancellationToken,
    tally: &mut Tally,
) -> Result<Reply, LoopError> {
    let started = Instant::now();
    let deltas = session.options.text_deltas.unwrap_or(false);
    let mut reply = Reply {
        text: String::new(),
        calls: Vec::new(),
        interrupted: false,
    };
    let (mut input_tokens, mut output_tokens) = (0, 0);
    // A client without `text_delta` events would see nothing for the whole
    // call: a `status` event every interval says the model is still at it.
    let every = Duration::from_millis(deps.config.status_interval_ms);
    let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let opening = model.provider.stream(request);
    tokio::pin!(opening);
    let stream = loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                reply.interrupted = true;
                return Ok(reply);
            }
            stream = &mut opening => break stream.map_err(LoopError::Model)?,
            _ = heartbeat.tick(), if !deltas => still_writing(session, &reply, started)?,
        }
    };
    tokio::pin!(stream);
    loop {
        let item = tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                reply.interrupted = true;
                break;
            }
            item = stream.next() => item,
            _ = heartbeat.tick(), if !deltas => {
                still_writing(session, &reply, started)?;
                continue;
            }
        };
        match item {
            None => break,
            Some(Err(e)) => return Err(LoopError::Model(e)),
            Some(Ok(StreamEvent::TextDelta(text))) => {
                if deltas {
                    session.emit(EventKind::TextDelta {
                        content: text.clone(),
                    })?;
                }
                reply.text.push_str(&text);
            }
            Some(Ok(StreamEvent::ToolCall(call))) => reply.calls.push(call),
            Some(Ok(StreamEvent::Usage {
                input_tokens: input,
                output_tokens: output,
            })) => {
                input_tokens = input;
                output_tokens = output;
            }
            Some(Ok(StreamEvent::Done(_))) => {}
        }
    }
    deps.metrics
        .model_latency
        .get_or_create(&ModelLabel {
            model: model.name.clone(),
        })
        .observe(started.elapsed().as_secs_f64());
    tally.usage.turns += 1;
    tally.usage.input_tokens += input_tokens;
    tally.usage.output_tokens += output_tokens;
    if let Some(price) = model.price {
        tally.usage.cost_usd += price.cost(input_tokens, output_tokens);
    }
    // Calls a cut-off stream had not finished are dropped with it.
    if reply.interrupted {
        reply.calls.clear();
    }
    Ok(reply)
}

/// The heartbeat of a model call that streams without `text_delta` events.
fn still_writing(
    session: &Arc<Session>,
    reply: &Reply,
    started: Instant,
) -> Result<(), StoreError> {
    session.emit(EventKind::Status {
        message: format!(
            "The model is still writing ({} characters, {} tool call(s) so far, {} s).",
            reply.text.chars().count(),
            reply.calls.len(),
            started.elapsed().as_secs()
        ),
    })?;
    Ok(())
}

/// Tells a model that does not read the `tools` field (many small ones do
/// not: their chat template drops it) what it can call and where it works.
/// Only sent when the session gives no system prompt and has tools.
fn default_system_prompt(tools: &[ToolSpec], working_dir: Option<&str>) -> Option<String> {
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
    Some(prompt)
}

/// Keeps the first of each set of identical calls, then the first `limit`;
/// a note says what went, if anything did.
fn bound_calls(calls: &mut Vec<ToolCall>, limit: usize) -> Option<String> {
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
fn looks_like_a_call(text: &str) -> bool {
    let text = text.trim_start();
    text.starts_with('{')
        || text.starts_with('[')
        || text.contains("```json")
        || text.contains("<tool_call>")
        || (text.contains("\"arguments\"") && text.contains("\"name\""))
}

/// What a model whose call could not be read is told.
fn unreadable_call_note(tools: &[ToolSpec]) -> String {
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
    let spec = tools
        .iter()
        .find(|t| t.name == resolved.name)
        .expect("a resolved name is offered");
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

async fn run_tool(
    deps: &TurnDeps,
    session: &Arc<Session>,
    ctx: &ToolContext,
    tools: &[ToolSpec],
    ran: &mut HashMap<String, Ran>,
    call: &ToolCall,
    cancel: &CancellationToken,
) -> Result<(Message, Option<String>), StoreError> {
    session.emit(EventKind::ToolUse {
        id: call.id.clone(),
        tool: call.name.clone(),
        input: call.arguments.clone(),
    })?;
    let mut settled = None;
    // `tools` holds only what the session allows.
    let output = match prepare_call(call, tools) {
        Err(message) => ToolOutput::error(message),
        Ok((call, mut notes)) if session.options.allows(&call.name) => {
            let key = format!("{} {}", call.name, call.arguments);
            let output = match ran.get_mut(&key) {
                Some(earlier) => {
                    earlier.times += 1;
                    if earlier.times >= REPEATS_TO_SETTLE {
                        settled = Some(answer_of(&earlier.output));
                    }
                    notes.push(
                        "this exact call already ran in this turn and was not run again; \
                         its result is repeated here. If it answers the question, reply \
                         with the answer in plain text"
                            .into(),
                    );
                    earlier.output.clone()
                }
                None => {
                    let output = run_prepared(deps, session, ctx, &call, cancel).await?;
                    if !output.is_error {
                        ran.insert(
                            key,
                            Ran {
                                output: output.clone(),
                                times: 1,
                            },
                        );
                    }
                    output
                }
            };
            with_notes(output, &notes)
        }
        Ok((call, _)) => ToolOutput::error(format!(
            "tool '{}' is not allowed in this session",
            call.name
        )),
    };
    Ok((finish_tool(deps, session, call, output)?, settled))
}

/// A successful call of this turn and how often it was asked for.
struct Ran {
    output: ToolOutput,
    times: u32,
}

/// A model that asks this many times for a call that already succeeded
/// (when told its result answers) has its answer: that result. Tiny models
/// often cannot stop calling to write a reply.
const REPEATS_TO_SETTLE: u32 = 3;

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
    let content = match &output.output {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
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

/// Answers tool calls that will not run, so the history stays valid for the
/// next model call (every call needs its result).
async fn close_calls(
    deps: &TurnDeps,
    session: &Arc<Session>,
    calls: &[ToolCall],
    history: &mut Vec<Message>,
) -> Result<(), StoreError> {
    if calls.is_empty() {
        return Ok(());
    }
    let closing: Vec<Message> = calls
        .iter()
        .map(|call| Message::Tool {
            tool_call_id: call.id.clone(),
            name: call.name.clone(),
            content: "not run: the turn was stopped".into(),
            is_error: true,
        })
        .collect();
    deps.store.append_messages(session.id, &closing).await?;
    history.extend(closing);
    Ok(())
}

/// Settles a turn that a crash cut off: one whose `result` was stored only
/// needs its status; any other gets an `interrupted` result.
pub(super) async fn close_cut_off(
    deps: &TurnDeps,
    session: &Arc<Session>,
) -> Result<(), StoreError> {
    let last = session.last_seq();
    let tail = deps
        .store
        .events_since(session.id, last.saturating_sub(1), 1)
        .await?;
    if let Some(Event {
        kind: EventKind::Result { status, .. },
        ..
    }) = tail.last()
    {
        return session
            .set_state(status_after(session, *status), None)
            .await;
    }
    let mut history = deps.store.messages(session.id).await?;
    let pending: Vec<ToolCall> = match history.last() {
        Some(Message::Assistant { tool_calls, .. }) => tool_calls.clone(),
        _ => Vec::new(),
    };
    close_calls(deps, session, &pending, &mut history).await?;
    session.emit(EventKind::Status {
        message: "The server restarted during this turn; it was interrupted.".into(),
    })?;
    let outcome = Outcome {
        status: ResultStatus::Interrupted,
        text: None,
    };
    finish(
        deps,
        session,
        outcome,
        Tally::starting(session),
        Instant::now(),
    )
    .await
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
}
