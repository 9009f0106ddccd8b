//! One agent turn: model call → tool calls → model call … until the model
//! stops, `max_turns`, `max_budget_usd`, an interrupt or an error. The
//! session machinery ([`crate::session`]) writes the turn's `result`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::calls::{
    REPEATS_TO_SETTLE, TurnCalls, bound_calls, looks_like_a_call, run_tools, unreadable_call_note,
};
use super::options::AgentOptions;
use super::prompts::{
    VARIED_TEMPERATURE, asking_for_a_fix, asking_for_the_answer, default_system_prompt,
};
use super::tools::{ToolContext, ToolRouter};
use crate::config::AgentConfig;
use crate::model::{
    ChatRequest, Message, ModelError, ModelRegistry, ResolvedModel, StreamEvent, ToolCall, ToolSpec,
};
use crate::protocol::{EventKind, ResultStatus};
use crate::session::{Outcome, Session, Turn};
use crate::store::{Store, StoreError};
use crate::telemetry::{Metrics, ModelLabel};

/// What every turn uses, shared by all sessions.
pub struct TurnDeps {
    pub store: Arc<dyn Store>,
    pub models: Arc<ModelRegistry>,
    pub tools: Arc<dyn ToolRouter>,
    pub config: AgentConfig,
    pub metrics: Arc<Metrics>,
}

/// Runs one turn on `prompt`: its events up to (not including) the
/// `result`, which the machinery writes from the outcome.
pub(super) async fn run(
    deps: &TurnDeps,
    turn: &mut Turn,
    prompt: String,
) -> Result<Outcome, StoreError> {
    let session = turn.session.clone();
    session.emit(EventKind::Status {
        message: "Starting agent...".into(),
    })?;
    deps.store
        .append_messages(session.id, &[Message::User { content: prompt }])
        .await?;
    let options = Arc::new(AgentOptions::stored(&session.options)?.for_turn(&turn.options));
    match agent_loop(deps, turn, &options).await {
        Ok(outcome) => Ok(outcome),
        Err(LoopError::Store(e)) => Err(e),
        Err(LoopError::Model(e)) => {
            deps.metrics
                .model_errors
                .get_or_create(&ModelLabel {
                    model: model_name(deps, &options),
                })
                .inc();
            session.emit(EventKind::Error {
                message: e.to_string(),
                code: e.code().into(),
            })?;
            Ok(Outcome::new(ResultStatus::Error, None))
        }
    }
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

fn model_name(deps: &TurnDeps, options: &AgentOptions) -> String {
    options
        .model
        .clone()
        .unwrap_or_else(|| deps.models.default_model().to_string())
}

async fn agent_loop(
    deps: &TurnDeps,
    tally: &mut Turn,
    options: &Arc<AgentOptions>,
) -> Result<Outcome, LoopError> {
    let session = &tally.session.clone();
    let cancel = &tally.cancel.clone();
    let name = model_name(deps, options);
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
    // Kept by the session between turns, and shared with each model call
    // rather than copied for it: a call costs the same at the 500th turn
    // of a session as at the first. A push after the call has returned
    // finds the history unshared again.
    let mut history = Lent {
        history: session.take_history().await?,
        session,
    };
    let history = &mut history.history;
    let mut last_text = None;
    let mut retried = false;
    // Successful calls of this turn by name and arguments: a weak model
    // asks for the same call again instead of answering.
    let mut ran = TurnCalls::default();
    // Off for the call after one that printed, with `answer_after_output`.
    let mut offer_tools = true;
    // The error of a failing call repeated as it was, for the next call:
    // at the upstream's default temperature (often 0) a small model writes
    // the same failing call until the turn runs out.
    let mut failed_again: Option<String> = None;
    // The last reply was empty: the same request goes again, sampled anew.
    let mut resample = false;
    loop {
        if cancel.is_cancelled() {
            return Ok(Outcome::new(ResultStatus::Interrupted, last_text));
        }
        if tally.usage.turns >= u64::from(max_calls) {
            return Ok(Outcome::new(ResultStatus::MaxTurns, last_text));
        }
        let request = ChatRequest {
            model: model.upstream_model.clone(),
            system: system.clone(),
            messages: match (offer_tools, &failed_again) {
                (false, _) => asking_for_the_answer(history),
                (true, Some(error)) => asking_for_a_fix(history, error),
                (true, None) => Arc::clone(history),
            },
            tools: tools.clone(),
            answer_only: !offer_tools,
            temperature: match options.temperature {
                None if resample || failed_again.is_some() => Some(VARIED_TEMPERATURE),
                set => set,
            },
            // A new seed for each ask for a fix: the same request with the
            // server's own fixed seed would sample the same call again.
            seed: (resample || failed_again.is_some()).then_some(tally.usage.turns),
            max_tokens: Some(options.max_tokens.unwrap_or(deps.config.max_tokens)),
            tool_call_mode: model.tool_call_mode,
            session_id: Some(session.id.to_string()),
            owner: session.owner.clone(),
        };
        let deltas = options.text_deltas.unwrap_or(false);
        let mut reply = call_model(deps, session, &model, request, deltas, cancel, tally).await?;
        // An empty reply answers nothing (a small model's is often a
        // sample that ended at once): not kept; the request goes again.
        resample = !tools.is_empty()
            && !reply.interrupted
            && reply.calls.is_empty()
            && reply.text.trim().is_empty();
        if resample {
            session.emit(EventKind::Status {
                message: "The model's reply was empty; asking again.".into(),
            })?;
            tally.save_usage().await?;
            continue;
        }
        offer_tools = true;
        failed_again = None;
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
        if let Some(error) = only_calls_failed_twice(&reply.calls, &ran) {
            session.emit(EventKind::Status {
                message: "The model asked again for a call that failed twice; \
                          it is not run again, and the model is asked for a fix."
                    .into(),
            })?;
            tally.save_usage().await?;
            failed_again = Some(error);
            continue;
        }
        let assistant = Message::Assistant {
            content: text_beside_calls(&reply, &tools),
            tool_calls: reply.calls.clone(),
        };
        deps.store
            .append_messages(session.id, std::slice::from_ref(&assistant))
            .await?;
        Arc::make_mut(history).push(assistant);
        tally.save_usage().await?;
        if reply.interrupted {
            close_calls(deps, session, &reply.calls, Arc::make_mut(history), STOPPED).await?;
            return Ok(Outcome::new(ResultStatus::Interrupted, last_text));
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
                Arc::make_mut(history).push(nudge);
                continue;
            }
            return Ok(Outcome::new(ResultStatus::Success, Some(reply.text)));
        }
        if let Some(budget) = options.max_budget_usd
            && tally.usage.cost_usd >= budget
        {
            close_calls(deps, session, &reply.calls, Arc::make_mut(history), STOPPED).await?;
            return Ok(Outcome::new(ResultStatus::BudgetExceeded, last_text));
        }
        let calls = &reply.calls;
        let mut i = 0;
        while i < calls.len() {
            // The answer is asked for from the first output: a small
            // model's later calls in one reply are variations that print
            // something else (`print(word)` after `print(word[::-1])`).
            if !offer_tools {
                let rest = &calls[i..];
                close_calls(deps, session, rest, Arc::make_mut(history), AFTER_OUTPUT).await?;
                session.emit(EventKind::Status {
                    message: format!(
                        "{} more call(s) of the reply not run: the answer is asked for \
                         from the output of the call before them.",
                        rest.len()
                    ),
                })?;
                break;
            }
            if cancel.is_cancelled() {
                close_calls(deps, session, &calls[i..], Arc::make_mut(history), STOPPED).await?;
                return Ok(Outcome::new(ResultStatus::Interrupted, last_text));
            }
            let batch = &calls[i..i + batch_len(&calls[i..], options)];
            i += batch.len();
            let answered = run_tools(deps, session, &ctx, &tools, &mut ran, batch, cancel).await?;
            let mut answer = None;
            for call in answered {
                tally.usage.tool_calls += 1;
                deps.store
                    .append_messages(session.id, std::slice::from_ref(&call.message))
                    .await?;
                failed_again = call.failed_again.or(failed_again);
                Arc::make_mut(history).push(call.message);
                answer = answer.or(call.settled);
                offer_tools &= !(call.printed && model.answer_after_output);
            }
            if let Some(answer) = answer {
                close_calls(deps, session, &calls[i..], Arc::make_mut(history), STOPPED).await?;
                session.emit(EventKind::Status {
                    message: format!(
                        "The model's calls printed the same output {REPEATS_TO_SETTLE} times; it is taken as the answer."
                    ),
                })?;
                return Ok(Outcome::new(ResultStatus::Success, Some(answer)));
            }
        }
    }
}

/// The error of a reply's calls when every one is a call that already
/// failed twice in this turn, asked for as it was.
fn only_calls_failed_twice(calls: &[ToolCall], ran: &TurnCalls) -> Option<String> {
    let mut errors = calls.iter().map(|call| ran.failed_twice(call));
    let first = errors.next()??;
    errors.all(|e| e.is_some()).then(|| first.to_string())
}

/// A turn's history, given back to its session however the turn ends:
/// every message in it is stored, so it stays a prefix of the stored one.
struct Lent<'a> {
    history: Arc<Vec<Message>>,
    session: &'a Arc<Session>,
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        self.session.keep_history(std::mem::take(&mut self.history));
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
    deltas: bool,
    cancel: &CancellationToken,
    tally: &mut Turn,
) -> Result<Reply, LoopError> {
    let started = Instant::now();
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

/// The text a reply's history message keeps: all of it, unless its calls
/// were read out of it (a model that writes calls as text), when only what
/// stands beside them. The calls are in the message once, in the format the
/// model's template gives them; a weak model shown its own call twice, or
/// twenty times when its reply looped, copies that again.
fn text_beside_calls(reply: &Reply, tools: &[ToolSpec]) -> String {
    if reply.calls.is_empty() {
        return reply.text.clone();
    }
    match crate::model::lenient::recover_tool_calls(&reply.text, tools) {
        // A looping reply cut mid-call leaves the start of one more.
        Some(rest) if looks_like_a_call(&rest.text) => String::new(),
        Some(rest) => rest.text.trim().to_string(),
        None => reply.text.clone(),
    }
}

/// Tools that only read: consecutive calls of them run at once.
const READ_ONLY_TOOLS: [&str; 3] = ["Read", "Glob", "Grep"];

/// How many of `calls`, from the first, run together: every one when the
/// session allows parallel calls (`parallel_tool_calls`), else a run of
/// read-only calls, else one (a reply that writes a file and then runs it
/// needs them in order).
fn batch_len(calls: &[ToolCall], options: &AgentOptions) -> usize {
    if options.parallel_tool_calls == Some(true) {
        return calls.len();
    }
    let read_only = calls
        .iter()
        .take_while(|c| READ_ONLY_TOOLS.contains(&c.name.as_str()))
        .count();
    read_only.max(1)
}

/// The result of a call the turn's end left unrun.
const STOPPED: &str = "not run: the turn was stopped";

/// The result of a call after one of the same reply that printed, with
/// `answer_after_output`.
const AFTER_OUTPUT: &str = "not run: an earlier call of this reply printed its output";

/// Answers tool calls that will not run, so the history stays valid for the
/// next model call (every call needs its result).
async fn close_calls(
    deps: &TurnDeps,
    session: &Arc<Session>,
    calls: &[ToolCall],
    history: &mut Vec<Message>,
    why: &str,
) -> Result<(), StoreError> {
    if calls.is_empty() {
        return Ok(());
    }
    let closing: Vec<Message> = calls
        .iter()
        .map(|call| Message::Tool {
            tool_call_id: call.id.clone(),
            name: call.name.clone(),
            content: why.into(),
            is_error: true,
        })
        .collect();
    deps.store.append_messages(session.id, &closing).await?;
    history.extend(closing);
    Ok(())
}

/// Answers the tool calls a crash left without results, so the history
/// stays valid for the next turn.
pub(super) async fn close_cut_off(
    deps: &TurnDeps,
    session: &Arc<Session>,
) -> Result<(), StoreError> {
    let mut history = deps.store.messages(session.id).await?;
    let pending: Vec<ToolCall> = match history.last() {
        Some(Message::Assistant { tool_calls, .. }) => tool_calls.clone(),
        _ => Vec::new(),
    };
    close_calls(deps, session, &pending, &mut history, STOPPED).await
}
