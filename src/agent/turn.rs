//! One turn: model call → tool calls → model call … until the model stops,
//! `max_turns`, `max_budget_usd`, an interrupt or an error. Every turn ends
//! with exactly one `result` event.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::calls::{
    REPEATS_TO_SETTLE, Ran, bound_calls, looks_like_a_call, run_tool, unreadable_call_note,
};
use super::events::{Event, EventKind, ResultStatus, Usage};
use super::manager::status_after;
use super::session::Session;
use super::tools::{ToolContext, ToolRouter};
use crate::config::AgentConfig;
use crate::model::{
    ChatRequest, Message, ModelError, ModelRegistry, ResolvedModel, StreamEvent, ToolCall, ToolSpec,
};
use crate::store::{SessionStatus, Store, StoreError};
use crate::telemetry::{Metrics, ModelLabel, StatusLabel};

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
