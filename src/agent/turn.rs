//! One agent turn: model call → tool calls → model call … until the model
//! stops, `max_turns`, `max_budget_usd`, an interrupt or an error. The
//! session machinery ([`crate::session`]) writes the turn's `result`.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::calls::{bound_calls, run_tools};
use super::context::{Context, compact};
use super::deps::{LoopError, TurnDeps};
use super::harness::{
    Harness, Interventions, ModelReply, NextCall, OnReply, READ_ONLY_TOOLS, emit_interventions,
};
use super::model_call::{Watch, traced_call};
use super::options::AgentOptions;
use super::plan::{Plan, model_label};
use super::spend::{TurnSpend, over_budget};
use super::tools::ToolContext;
use crate::model::{Message, ToolCall};
use crate::protocol::{Approval, EventKind, ResultStatus};
use crate::session::{Outcome, Session, Turn};
use crate::store::StoreError;
use crate::telemetry::ModelLabel;

/// Runs one turn on `prompt`: its events up to (not including) the
/// `result`, which the machinery writes from the outcome.
pub(super) async fn run(
    deps: &TurnDeps,
    turn: &mut Turn,
    prompt: String,
) -> Result<Outcome, StoreError> {
    let session = turn.session.clone();
    let mut history = session.take_history().await?;
    if turn.options.compact {
        return compact_on_request(deps, turn, history).await;
    }
    // The first turn starts with what `options.workspace` names; one that
    // cannot get it ends here, and the next tries again.
    if history.is_empty() && !seed_workspace(deps, turn).await? {
        return Ok(Outcome::new(ResultStatus::Error, None));
    }
    let opening = opening_messages(&history, prompt, &turn.options.tool_answers);
    // Stored with the turn's first events, and kept: the loop starts from
    // the stored conversation without reading it again.
    session.store_messages(&opening)?;
    Arc::make_mut(&mut history).extend(opening);
    session.emit(EventKind::Status {
        message: "Starting agent...".into(),
    })?;
    let history = KeptHistory {
        history,
        session: &session,
    };
    let options = Arc::new(AgentOptions::stored(&session.options)?.for_turn(&turn.options));
    let mut spend = TurnSpend::new(session.owner.clone(), model_label(deps, &options));
    let outcome = agent_loop(deps, turn, &options, &mut spend, history).await;
    turn.files_changed = deps
        .tools
        .turn_changes(&ToolContext {
            session_id: session.id,
            options: options.clone(),
            owner: session.owner.clone(),
        })
        .await;
    // The turn itself and the tool calls since its last model call; a key
    // past its budget now is refused its next turn, not this one's result.
    spend.record_end(&deps.usage, &turn.usage, &session)?;
    // Every message the loop stored it also kept, so the history it gave
    // back is the stored one: a fork at this turn's end keeps this many.
    turn.history_len = Some(session.history_len() as u64);
    ended(deps, &session, &options, outcome)
}

/// A turn's outcome, or the error that ended it as an `error` event.
fn ended(
    deps: &TurnDeps,
    session: &Session,
    options: &AgentOptions,
    outcome: Result<Outcome, LoopError>,
) -> Result<Outcome, StoreError> {
    match outcome {
        Ok(outcome) => Ok(outcome),
        Err(LoopError::Store(e)) => Err(e),
        Err(LoopError::Model(e)) => {
            deps.metrics
                .model_errors
                .get_or_create(&ModelLabel {
                    model: model_label(deps, options),
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

/// A turn that only compacts the history (`POST …/compact`): a
/// `compacted` event, or a `status` saying there was nothing to compact.
async fn compact_on_request(
    deps: &TurnDeps,
    turn: &mut Turn,
    history: Arc<Vec<Message>>,
) -> Result<Outcome, StoreError> {
    let session = turn.session.clone();
    let options = Arc::new(AgentOptions::stored(&session.options)?.for_turn(&turn.options));
    let mut spend = TurnSpend::new(session.owner.clone(), model_label(deps, &options));
    let mut kept = KeptHistory {
        history,
        session: &session,
    };
    let compacted = async {
        let plan = Plan::new(deps, turn, &options, &mut spend).await?;
        let mut context = plan.context(deps, &options, &kept.history).await;
        let at = (&plan.model, &mut context);
        compact(deps, turn, at, &mut kept.history, "request").await
    }
    .await;
    drop(kept);
    let outcome = match compacted {
        Ok(true) => Ok(Outcome::new(ResultStatus::Success, None)),
        Ok(false) if turn.cancel.is_cancelled() => {
            Ok(Outcome::new(ResultStatus::Interrupted, None))
        }
        Ok(false) => {
            session.emit(EventKind::Status {
                message: "Nothing to compact: the history holds no more than the last turns, \
                          which are kept as they are."
                    .into(),
            })?;
            Ok(Outcome::new(ResultStatus::Success, None))
        }
        Err(e) => Err(e),
    };
    spend.record_end(&deps.usage, &turn.usage, &session)?;
    turn.history_len = Some(session.history_len() as u64);
    ended(deps, &session, &options, outcome)
}

/// Puts what `options.workspace` names into the workspace (a git clone),
/// logged as an upload and snapshotted like one; false when it failed (an
/// error event says why).
async fn seed_workspace(deps: &TurnDeps, turn: &Turn) -> Result<bool, StoreError> {
    let session = &turn.session;
    let options = Arc::new(AgentOptions::stored(&session.options)?);
    let Some(git) = options.workspace.as_ref().and_then(|w| w.git.as_ref()) else {
        return Ok(true);
    };
    session.emit(EventKind::Status {
        message: format!("Cloning {}...", git.url),
    })?;
    let ctx = ToolContext {
        session_id: session.id,
        options: options.clone(),
        owner: session.owner.clone(),
    };
    match deps.tools.seed_workspace(&ctx, turn.cancel.clone()).await {
        Ok(None) => Ok(true),
        Ok(Some(seeded)) => {
            let seq = session.emit(EventKind::WorkspaceUploaded {
                path: seeded.path,
                files: seeded.files,
                bytes: seeded.bytes,
                source: Some(seeded.source),
            })?;
            // As after an upload: the next `changes` shows this turn's
            // work, not the clone.
            deps.tools
                .turn_ended(session.id, session.owner.as_deref(), seq)
                .await;
            Ok(true)
        }
        Err(message) => {
            session.emit(EventKind::Error {
                message,
                code: "workspace_failed".into(),
            })?;
            Ok(false)
        }
    }
}

/// What a turn adds to `history` before its model call: an answer to each
/// call the last turn left for a client (the client's, else an error
/// saying it gave none, since a model must see every call answered), then
/// the prompt, unless the turn only carries answers.
fn opening_messages(
    history: &[Message],
    prompt: String,
    answers: &[crate::session::ToolAnswer],
) -> Vec<Message> {
    let mut opening = Vec::new();
    let last = history
        .iter()
        .rposition(|m| matches!(m, Message::Assistant { .. }));
    if let Some(at) = last
        && let Message::Assistant { tool_calls, .. } = &history[at]
    {
        let answered: Vec<&str> = history[at..]
            .iter()
            .filter_map(|m| match m {
                Message::Tool { tool_call_id, .. } => Some(tool_call_id.as_str()),
                _ => None,
            })
            .collect();
        for call in tool_calls
            .iter()
            .filter(|c| !answered.contains(&c.id.as_str()))
        {
            let answer = answers.iter().find(|a| a.call_id == call.id);
            opening.push(Message::Tool {
                tool_call_id: call.id.clone(),
                name: call.name.clone(),
                content: answer.map_or_else(
                    || "The client did not answer this call.".to_owned(),
                    |a| a.content.clone(),
                ),
                is_error: answer.is_none_or(|a| a.is_error),
            });
        }
    }
    if !prompt.is_empty() || opening.is_empty() {
        opening.push(Message::User { content: prompt });
    }
    opening
}

async fn agent_loop(
    deps: &TurnDeps,
    turn: &mut Turn,
    options: &Arc<AgentOptions>,
    spend: &mut TurnSpend,
    mut history: KeptHistory<'_>,
) -> Result<Outcome, LoopError> {
    let session = &turn.session.clone();
    let cancel = &turn.cancel.clone();
    let plan = Plan::new(deps, turn, options, spend).await?;
    let model = &plan.model;
    let history = &mut history.history;
    let mut context = plan.context(deps, options, history).await;
    // A call the provider refused as too long is asked again once, after
    // a compaction.
    let mut retried = false;
    let mut harness = Harness::new(model.harness, model.tool_call_mode);
    let mut said = Interventions::new();
    // Kept by the session between turns, and shared with each model call
    // rather than copied for it: a call costs the same at the 500th turn
    // of a session as at the first. A push after the call has returned
    // finds the history unshared again. After a compaction the model is
    // sent the context's view of it, shared the same way.
    let mut last_text = None;
    loop {
        if cancel.is_cancelled() {
            return Ok(Outcome::new(ResultStatus::Interrupted, last_text));
        }
        if turn.usage.turns >= u64::from(plan.max_calls) {
            return Ok(Outcome::new(ResultStatus::MaxTurns, last_text));
        }
        let at = (&plan, &mut context, &mut harness);
        let asked = ask(deps, turn, options, at, history, &mut retried, &mut said);
        let Some(mut reply) = asked.await? else {
            continue;
        };
        // For a key with a daily budget, one store write per model call,
        // which answers the key's totals for today across replicas: the
        // budget is checked on them. Without one, at most a write a second.
        let past_budget = spend.record(&deps.usage, &turn.usage).await;
        let next = if reply.interrupted {
            OnReply::Keep
        } else {
            harness.on_reply(&mut reply, &plan.tools, &mut said)
        };
        emit_interventions(session, &mut said)?;
        if next == OnReply::AskAgain {
            turn.save_usage()?;
            if let Some(past) = past_budget {
                return Ok(over_budget(session, &past, last_text)?);
            }
            continue;
        }
        let limit = deps.config.max_tool_calls_per_reply as usize;
        if let Some(note) = bound_calls(&mut reply.calls, limit) {
            session.emit(EventKind::Status { message: note })?;
        }
        if !reply.text.is_empty() {
            session.emit(EventKind::Thinking {
                content: reply.text.clone(),
                reasoning: false,
            })?;
            last_text = Some(reply.text.clone());
        }
        let mut kept = std::mem::take(&mut reply.reasoning_kept);
        kept.push(Message::Assistant {
            content: reply.text.clone(),
            tool_calls: reply.calls.clone(),
        });
        session.store_messages(&kept)?;
        Arc::make_mut(history).extend(kept);
        turn.save_usage()?;
        if reply.interrupted {
            close_calls(session, &reply.calls, Arc::make_mut(history), STOPPED)?;
            return Ok(Outcome::new(ResultStatus::Interrupted, last_text));
        }
        if let OnReply::Tell(content) = next {
            let told = Message::User { content };
            session.store_messages(std::slice::from_ref(&told))?;
            Arc::make_mut(history).push(told);
            continue;
        }
        if reply.calls.is_empty() {
            if let Some(message) = harness.strict_answer_hint(&reply.text, &plan.tools) {
                session.emit(EventKind::Status { message })?;
            }
            return Ok(Outcome::new(ResultStatus::Success, Some(reply.text)));
        }
        if let Some(budget) = options.max_budget_usd
            && turn.usage.cost_usd >= budget
        {
            close_calls(session, &reply.calls, Arc::make_mut(history), STOPPED)?;
            return Ok(Outcome::new(ResultStatus::BudgetExceeded, last_text));
        }
        if let Some(past) = past_budget {
            close_calls(session, &reply.calls, Arc::make_mut(history), STOPPED)?;
            return Ok(over_budget(session, &past, last_text)?);
        }
        let step = Step {
            deps,
            plan: &plan,
            options,
            cancel,
            output_limit: context.output_limit(deps.config.max_tool_output_bytes),
        };
        if let Some(outcome) = step
            .run_calls(turn, &mut harness, history, &reply.calls, &last_text)
            .await?
        {
            return Ok(outcome);
        }
    }
}

/// One model call on the history as it is: compacted first when it nears
/// the model's window, and compacted then asked again, once, when the
/// provider refuses it as too long. `None` when the loop should start
/// over (an interrupt during a compaction, or a call to ask again).
async fn ask(
    deps: &TurnDeps,
    turn: &mut Turn,
    options: &AgentOptions,
    (plan, context, harness): (&Plan, &mut Context, &mut Harness),
    history: &mut Arc<Vec<Message>>,
    retried: &mut bool,
    said: &mut Interventions,
) -> Result<Option<ModelReply>, LoopError> {
    let session = &turn.session.clone();
    let cancel = &turn.cancel.clone();
    let model = &plan.model;
    // Sized only where it may be compacted: with compaction off, the
    // provider's refusal is the only check.
    if context.auto() && context.over(context.estimate(session, &model.name, history)) {
        compact(deps, turn, (model, context), history, "auto").await?;
        if cancel.is_cancelled() {
            return Ok(None);
        }
    }
    let view = context.view.sync(history);
    let sent_len = history.len();
    let mut request = plan.request(deps, session, options, &view);
    harness.before_call(
        &mut NextCall {
            request: &mut request,
            history: &view,
            default_system: options.system_prompt.is_none(),
            calls_made: turn.usage.turns,
        },
        said,
    );
    emit_interventions(session, said)?;
    let watch = Watch {
        deltas: options.text_deltas.unwrap_or(false),
        cancel,
        harness,
        tools: &plan.tools,
    };
    let reply = match traced_call(deps, session, model, request, turn, watch).await {
        Err(LoopError::Model(e)) if e.is_context_exceeded() => {
            let size = context.estimate(session, &model.name, history);
            if !*retried && context.auto() {
                *retried = true;
                if compact(deps, turn, (model, context), history, "context_error").await? {
                    return Ok(None);
                }
            }
            return Err(LoopError::Model(context.exceeded(size, &e)));
        }
        reply => reply?,
    };
    *retried = false;
    // The provider's count where it gave one; an estimate only where not.
    let input_tokens = match reply.input_tokens {
        0 => context.estimate(session, &model.name, &history[..sent_len]),
        counted => counted,
    };
    turn.context = Some(context.measured(
        session,
        &model.name,
        sent_len,
        (reply.input_tokens, input_tokens),
    ));
    Ok(Some(reply))
}

/// What running a reply's calls needs besides the turn.
struct Step<'a> {
    deps: &'a TurnDeps,
    plan: &'a Plan,
    options: &'a AgentOptions,
    cancel: &'a CancellationToken,
    /// The most of a tool's output the model is sent.
    output_limit: usize,
}

impl Step<'_> {
    /// Runs the server's calls of a reply in batches, each answer stored
    /// and added to the history; hands the client's calls to the client.
    /// The turn's outcome when it ends here; `None` to ask the model again.
    async fn run_calls(
        &self,
        turn: &mut Turn,
        harness: &mut Harness,
        history: &mut Arc<Vec<Message>>,
        calls: &[ToolCall],
        last_text: &Option<String>,
    ) -> Result<Option<Outcome>, LoopError> {
        let session = &turn.session.clone();
        let plan = self.plan;
        // A client's calls are its own to run: the turn ends once the
        // server's have run, and the client's answers start the next one.
        let (for_client, calls): (Vec<ToolCall>, Vec<ToolCall>) = calls
            .iter()
            .cloned()
            .partition(|call| plan.client.contains(&call.name));
        let mut i = 0;
        while i < calls.len() {
            if self.cancel.is_cancelled() {
                close_calls(session, &calls[i..], Arc::make_mut(history), STOPPED)?;
                return Ok(Some(Outcome::new(
                    ResultStatus::Interrupted,
                    last_text.clone(),
                )));
            }
            let batch = &calls[i..i + batch_len(&calls[i..], self.options)];
            i += batch.len();
            let answered = run_tools(
                self.deps,
                session,
                &plan.ctx,
                (&plan.tools, &plan.gate, self.output_limit),
                harness,
                batch,
                self.cancel,
            )
            .await?;
            let mut answer = None;
            for call in answered {
                turn.usage.tool_calls += 1;
                session.store_messages(std::slice::from_ref(&call.message))?;
                Arc::make_mut(history).push(call.message);
                answer = answer.or(call.settled);
            }
            if let Some(answer) = answer {
                close_calls(session, &calls[i..], Arc::make_mut(history), STOPPED)?;
                return Ok(Some(Outcome::new(ResultStatus::Success, Some(answer))));
            }
        }
        if for_client.is_empty() {
            return Ok(None);
        }
        for call in &for_client {
            session.emit(EventKind::ToolUse {
                id: call.id.clone(),
                tool: call.name.clone(),
                input: call.arguments.clone(),
            })?;
        }
        Ok(Some(Outcome::new(ResultStatus::Success, last_text.clone())))
    }
}

/// The session's history, lent to a turn and given back when it ends,
/// however it ends.
struct KeptHistory<'a> {
    history: Arc<Vec<Message>>,
    session: &'a Arc<Session>,
}

impl Drop for KeptHistory<'_> {
    fn drop(&mut self) {
        self.session.keep_history(std::mem::take(&mut self.history));
    }
}

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

/// Answers tool calls that will not run, so the history stays valid for the
/// next model call (every call needs its result).
fn close_calls(
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
    session.store_messages(&closing)?;
    history.extend(closing);
    Ok(())
}

/// Answers the tool calls a crash left without results, so the history
/// stays valid for the next turn. A call that was waiting for a decision
/// is denied by the restart, and a `status` event lists it: the turn is
/// not resumed (what the model was told and had run before the crash is
/// in the history; a new message starts from there).
pub(super) async fn close_cut_off(
    deps: &TurnDeps,
    session: &Arc<Session>,
) -> Result<(), StoreError> {
    let owner = session.owner.as_deref();
    let waiting = deps.approvals.of_session(owner, session.id).await?;
    for pending in &waiting {
        session.emit(EventKind::ApprovalDecided {
            call_id: pending.call_id.clone(),
            decision: Approval::Deny,
            by: "restart".into(),
            message: Some("the server restarted while the call waited".into()),
            input: None,
            remembered: None,
        })?;
    }
    if !waiting.is_empty() {
        let listed: Vec<String> = waiting
            .iter()
            .map(|p| format!("{} ({} {})", p.call_id, p.tool, p.input))
            .collect();
        session.emit(EventKind::Status {
            message: format!(
                "The server restarted while {} call(s) waited for approval: {}. They did not run; \
                 send a message to go on.",
                waiting.len(),
                listed.join(", ")
            ),
        })?;
    }
    deps.approvals.clear(owner, session.id).await?;
    let mut history = deps.store.messages(session.id).await?;
    let pending: Vec<ToolCall> = match history.last() {
        Some(Message::Assistant { tool_calls, .. }) => tool_calls.clone(),
        _ => Vec::new(),
    };
    let (asked, others): (Vec<ToolCall>, Vec<ToolCall>) = pending
        .into_iter()
        .partition(|call| waiting.iter().any(|p| p.call_id == call.id));
    close_calls(session, &others, &mut history, STOPPED)?;
    close_calls(session, &asked, &mut history, RESTARTED_WAITING)
}

/// The result of a call that waited for approval when the server stopped.
const RESTARTED_WAITING: &str = "not run: the server restarted while the call waited for approval";
