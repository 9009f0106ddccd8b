//! A turn's context: the model's window, the size of what the turn is
//! about to send, and compaction, which replaces the older part of what
//! is sent with a summary once a request nears the window.
//!
//! - `view`: what the model is sent of the history: the history, or after
//!   a compaction the summary and the messages kept after it.
//! - `estimate`: a request's size where the provider has not counted it.
//! - `split`: where a compaction cuts the history.
//! - `summary`: the summarising model's request, in pieces when needed.
//!
//! A compaction appends a [`Message::Compacted`] mark to the stored
//! history and removes nothing: a fork or a rewind to a turn end before it
//! gets the history as it was, and the LangGraph thread history still
//! lists every message.

mod estimate;
mod split;
mod summary;
mod view;

use std::sync::Arc;

use super::deps::{LoopError, TurnDeps};
use super::options::{AgentOptions, Compaction};
use crate::model::window::Window;
use crate::model::{Message, ModelError, ModelProvider, ResolvedModel, StreamEvent, ToolSpec};
use crate::protocol::{ContextUse, EventKind, Tokens};
use crate::session::{Measured, Session, Turn};
pub(crate) use view::View;

/// The most a summary may take, in tokens.
const SUMMARY_MAX_TOKENS: u64 = 2048;
/// What a summarising request takes besides its piece of transcript: the
/// prompt, the summary so far and the answer.
const SUMMARY_OVERHEAD_TOKENS: u64 = 300;
/// The smallest piece of transcript a summarising request carries.
const MIN_PIECE_TOKENS: u64 = 256;

/// What a turn knows of its model's window and of the size of what it
/// sends.
pub(super) struct Context {
    pub window: Window,
    /// The tokens a request may take: the window less what its answer may
    /// take (`max_tokens`, at most a quarter of the window).
    room: u64,
    compact_at: f64,
    auto: bool,
    /// What every request of the turn carries besides its messages.
    fixed: u64,
    pub view: View,
}

impl Context {
    pub(super) async fn new(
        deps: &TurnDeps,
        model: &ResolvedModel,
        options: &AgentOptions,
        (system, tools): (Option<&str>, &[ToolSpec]),
        history: &[Message],
    ) -> Context {
        let window = deps.models.window(model, deps.config.context_window).await;
        let answer = u64::from(options.max_tokens.unwrap_or(deps.config.max_tokens));
        Context {
            window,
            room: window.tokens - answer.min(window.tokens / 4),
            compact_at: deps.config.compact_at,
            auto: options.compaction.unwrap_or_default() == Compaction::Auto,
            fixed: estimate::fixed_tokens(system, tools),
            view: View::of(history),
        }
    }

    /// The most bytes of one tool output the model is sent: `configured`
    /// (`agent.max_tool_output_bytes`), or a quarter of the room when
    /// that is less, so that one output never fills a small window.
    pub(super) fn output_limit(&self, configured: usize) -> usize {
        let quarter = estimate::bytes_of(self.room / 4);
        configured.min(quarter).max(1024)
    }

    /// Whether compaction may run on its own (`options.compaction`).
    pub(super) fn auto(&self) -> bool {
        self.auto
    }

    /// Whether a request of `tokens` is past `agent.compact_at` of the room.
    pub(super) fn over(&self, tokens: u64) -> bool {
        tokens as f64 > self.compact_at * self.room as f64
    }

    /// The size of the next request on `history`: the last request's as
    /// its provider counted it, and an estimate of what was added since;
    /// an estimate of all of it when that count is not at hand (the
    /// first call here, another model, a compaction or a rewind since).
    pub(super) fn estimate(&self, session: &Session, model: &str, history: &[Message]) -> u64 {
        let mark = self.view.mark();
        if let Some(measured) = session.measured()
            && measured.model == model
            && measured.input_tokens > 0
            && measured.history_len <= history.len()
            && mark.is_none_or(|mark| mark.at < measured.history_len)
        {
            let added = view::visible(&history[measured.history_len..]);
            return measured.input_tokens + estimate::messages_tokens(added);
        }
        let sent = match mark {
            None => estimate::messages_tokens(history),
            Some(mark) => {
                estimate::message_tokens(&history[mark.at])
                    + estimate::messages_tokens(view::visible(&history[mark.kept_from..]))
            }
        };
        self.fixed + sent
    }

    /// Keeps what the provider counted of a request built on
    /// `history_len` messages (0: it said nothing; the next estimate
    /// starts from a count), and answers how full the window was with
    /// `input_tokens` (the count, else an estimate).
    pub(super) fn measured(
        &self,
        session: &Session,
        model: &str,
        history_len: usize,
        (counted, input_tokens): (u64, u64),
    ) -> ContextUse {
        let context = ContextUse {
            window: self.window.tokens,
            window_source: self.window.source.as_str().to_owned(),
            input_tokens,
            fill: input_tokens as f64 / self.window.tokens as f64,
        };
        session.set_measured(Some(Measured {
            model: model.to_owned(),
            history_len,
            input_tokens: counted,
            context: context.clone(),
        }));
        context
    }

    /// The error of a request the provider refused as too long, once
    /// compaction could not make it fit (or is off).
    pub(super) fn exceeded(&self, tokens: u64, error: &ModelError) -> ModelError {
        ModelError::ContextExceeded {
            window: self.window.tokens,
            tokens,
            hint: if self.auto {
                "a compaction could not make it fit"
            } else {
                "compaction is off (options.compaction)"
            },
            message: error.to_string(),
        }
    }
}

/// Summarises the older part of what the turn sends, appends the mark
/// that says so to the history (stored), and logs `compacted` with
/// `reason`. False when there was nothing to summarise, or the turn was
/// interrupted while the summary was written.
pub(super) async fn compact(
    deps: &TurnDeps,
    turn: &mut Turn,
    (model, context): (&ResolvedModel, &mut Context),
    history: &mut Arc<Vec<Message>>,
    reason: &str,
) -> Result<bool, LoopError> {
    let session = turn.session.clone();
    let before_tokens = context.estimate(&session, &model.name, history);
    let writer = match &deps.config.compaction_model {
        Some(name) => deps.models.resolve(name).map_err(LoopError::Model)?,
        None => model.clone(),
    };
    let window = deps
        .models
        .window(&writer, deps.config.context_window)
        .await
        .tokens;
    let summary_max = SUMMARY_MAX_TOKENS.min(window / 8);
    // The summary and the kept part together take at most half of what
    // sets a compaction off, so the next one is turns away.
    let target = (context.compact_at * context.room as f64) as u64 / 2;
    let keep = target
        .saturating_sub(context.fixed + summary_max)
        .max(context.room / 10);
    let Some(cut) = split::choose(history, context.view.mark(), keep) else {
        return Ok(false);
    };
    let previous = context
        .view
        .mark()
        .and_then(|mark| match &history[mark.at] {
            Message::Compacted { summary, .. } => Some(summary.clone()),
            _ => None,
        });
    let part = view::visible(&history[cut.from..cut.to]);
    let messages_summarised = part.clone().count() as u64;
    // The estimate is high, but a window can be smaller than the writer's
    // server says: a piece refused as too long is cut in two.
    let mut piece_tokens = window
        .saturating_sub(2 * summary_max + SUMMARY_OVERHEAD_TOKENS)
        .max(MIN_PIECE_TOKENS);
    let summary = loop {
        let pieces = summary::pieces(part.clone(), piece_tokens);
        let writing = Writing {
            writer: &writer,
            session: &session,
            max_tokens: summary_max as u32,
        };
        match writing.summarise(turn, previous.clone(), pieces).await {
            Err(e) if e.is_context_exceeded() && piece_tokens > MIN_PIECE_TOKENS => {
                piece_tokens = (piece_tokens / 2).max(MIN_PIECE_TOKENS);
            }
            Err(e) => return Err(LoopError::Model(e)),
            Ok(summary) => break summary,
        }
    };
    drop(part);
    let Some(summary) = summary else {
        return Ok(false);
    };
    let mark = Message::Compacted {
        summary,
        kept_from: cut.to as u64,
    };
    session.store_messages(std::slice::from_ref(&mark))?;
    Arc::make_mut(history).push(mark);
    context.view = View::of(history);
    session.set_measured(None);
    let after_tokens = context.estimate(&session, &model.name, history);
    session.emit(EventKind::Compacted {
        reason: reason.to_owned(),
        before_tokens,
        after_tokens,
        messages_summarised,
    })?;
    Ok(true)
}

/// The model that writes a summary, and for whom.
struct Writing<'a> {
    writer: &'a ResolvedModel,
    session: &'a Session,
    max_tokens: u32,
}

impl Writing<'_> {
    /// The summary of `pieces` after `previous`, each piece's summary the
    /// next one's previous; `None` when the turn was interrupted.
    async fn summarise(
        &self,
        turn: &mut Turn,
        mut previous: Option<String>,
        pieces: Vec<String>,
    ) -> Result<Option<String>, ModelError> {
        for piece in pieces {
            let mut request =
                summary::request(self.writer, previous.as_deref(), piece, self.max_tokens);
            request.session_id = Some(self.session.id.to_string());
            request.owner = self.session.owner.clone();
            let answered = tokio::select! {
                answered = complete(self.writer.provider.as_ref(), request) => answered,
                _ = turn.cancel.cancelled() => return Ok(None),
            };
            let (text, tokens) = answered?;
            turn.usage.count(&tokens);
            match self.writer.price {
                Some(price) => turn.usage.cost_usd += price.cost(&tokens),
                None => turn.cost_known = false,
            }
            previous = Some(summary::summary_of(text)?);
        }
        Ok(previous)
    }
}

/// A whole answer and its usage.
async fn complete(
    provider: &dyn ModelProvider,
    request: crate::model::ChatRequest,
) -> Result<(String, Tokens), ModelError> {
    use futures::StreamExt;
    let mut stream = provider.stream(request).await?;
    let (mut text, mut tokens) = (String::new(), Tokens::default());
    while let Some(event) = stream.next().await {
        match event? {
            StreamEvent::TextDelta(delta) => text.push_str(&delta),
            StreamEvent::Usage(counted) => tokens = counted,
            StreamEvent::ToolCall(_)
            | StreamEvent::ReasoningDelta(_)
            | StreamEvent::Reasoning(_)
            | StreamEvent::Done(_) => {}
        }
    }
    Ok((text, tokens))
}
