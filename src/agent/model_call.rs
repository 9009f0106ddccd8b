//! One model call of an agent turn: streamed, watched (deltas, the
//! heartbeat, the harness's early stop, an interrupt), counted, and traced
//! as a GenAI `chat` span.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::deps::{LoopError, TurnDeps};
use super::harness::{Harness, Interventions, ModelReply, emit_interventions};
use crate::model::{ChatRequest, ResolvedModel, StreamEvent, ToolSpec};
use crate::protocol::{EventKind, Tokens};
use crate::session::{Session, Turn};
use crate::store::StoreError;
use crate::telemetry::{ModelLabel, spans};

/// [`call_model`] in its `chat` span, which records the outcome.
pub(super) async fn traced_call(
    deps: &TurnDeps,
    session: &Arc<Session>,
    model: &ResolvedModel,
    request: ChatRequest,
    turn: &mut Turn,
    watch: Watch<'_>,
) -> Result<ModelReply, LoopError> {
    let span = spans::chat(
        model.provider.provider_name(),
        &model.upstream_model,
        Some(&session.id.to_string()),
        &spans::Parent::Current,
    );
    spans::chat_input(&span, request.system.as_deref(), &*request.messages);
    let reply = span
        .within(call_model(deps, session, model, request, turn, watch))
        .await;
    match &reply {
        Ok(reply) => spans::chat_output(&span, &reply.text, &reply.calls),
        Err(LoopError::Model(e)) => span.fail(e.code()),
        Err(LoopError::Store(_)) => span.fail("store"),
    }
    reply
}

/// What a model call watches as it streams.
pub(super) struct Watch<'a> {
    /// Send each token chunk as a `text_delta` event.
    pub(super) deltas: bool,
    pub(super) cancel: &'a CancellationToken,
    /// Asked after each chunk whether to stop reading.
    pub(super) harness: &'a mut Harness,
    pub(super) tools: &'a [ToolSpec],
}

async fn call_model(
    deps: &TurnDeps,
    session: &Arc<Session>,
    model: &ResolvedModel,
    request: ChatRequest,
    turn: &mut Turn,
    watch: Watch<'_>,
) -> Result<ModelReply, LoopError> {
    let Watch {
        deltas,
        cancel,
        harness,
        tools,
    } = watch;
    let started = Instant::now();
    let mut reply = ModelReply::default();
    let mut said = Interventions::new();
    let mut tokens = Tokens::default();
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
            Some(Ok(StreamEvent::ReasoningDelta(text))) => {
                streamed(session, deltas, &text, true)?;
                reply.reasoning.push_str(&text);
            }
            Some(Ok(StreamEvent::Reasoning(block))) => reply.reasoning_kept.push(block),
            Some(Ok(StreamEvent::TextDelta(text))) => {
                said_reasoning(session, &mut reply)?;
                streamed(session, deltas, &text, false)?;
                reply.text.push_str(&text);
                // Ending the stream here closes the connection and frees
                // the model server.
                if harness.cut(&reply.text, tools, &mut said) {
                    emit_interventions(session, &mut said)?;
                    break;
                }
            }
            Some(Ok(StreamEvent::ToolCall(call))) => {
                said_reasoning(session, &mut reply)?;
                reply.calls.push(call);
            }
            Some(Ok(StreamEvent::Usage(counted))) => tokens = counted,
            Some(Ok(StreamEvent::Done(_))) => {}
        }
    }
    said_reasoning(session, &mut reply)?;
    deps.metrics
        .model_latency
        .get_or_create(&ModelLabel {
            model: model.name.clone(),
        })
        .observe(started.elapsed().as_secs_f64());
    spans::usage(&spans::Span::current(), tokens.input, tokens.output);
    turn.usage.turns += 1;
    reply.input_tokens = tokens.input;
    turn.usage.count(&tokens);
    if let Some(price) = model.price {
        turn.usage.cost_usd += price.cost(&tokens);
    }
    // Calls a cut-off stream had not finished are dropped with it.
    if reply.interrupted {
        reply.calls.clear();
    }
    Ok(reply)
}

/// A streamed piece of the text or the reasoning, as a `text_delta` where
/// the session asked for them.
fn streamed(
    session: &Session,
    deltas: bool,
    text: &str,
    reasoning: bool,
) -> Result<(), StoreError> {
    if deltas {
        session.emit(EventKind::TextDelta {
            content: text.to_owned(),
            reasoning,
        })?;
    }
    Ok(())
}

/// The reasoning streamed so far as one `thinking {reasoning: true}`
/// event, said before the answer that follows it.
fn said_reasoning(session: &Arc<Session>, reply: &mut ModelReply) -> Result<(), StoreError> {
    if reply.reasoning.is_empty() {
        return Ok(());
    }
    session.emit(EventKind::Thinking {
        content: std::mem::take(&mut reply.reasoning),
        reasoning: true,
    })?;
    Ok(())
}

/// The heartbeat of a model call that streams without `text_delta` events.
fn still_writing(
    session: &Arc<Session>,
    reply: &ModelReply,
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
