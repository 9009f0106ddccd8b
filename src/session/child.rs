//! A turn of another session run on behalf of this one (a deliberation's
//! tool-using agent, a pipeline's node): its events are forwarded into the
//! parent's log tagged with who ran it, and dropping the call interrupts
//! the child's turn.
//!
//! The turn is a job ([`CHILD_TURN`]): on one server it runs here, among
//! replicas on whichever replica takes it (its tool calls go to the
//! replica holding the child's sandbox). The replica that asked follows
//! the child's log, which any replica can stream, and forwards its events;
//! the job's answer says at which `seq` the turn's `result` is, so the
//! forwarding stops exactly there, even when a first attempt died and a
//! second replica ran the turn again.

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{OnBehalfOf, Session, SessionManager, TurnOptions};
use crate::jobs::{self, Handler, Jobs};
use crate::protocol::{EventKind, ResultStatus, Usage};

/// The kind of job of a child session's turn.
pub const CHILD_TURN: &str = "session.child_turn";

/// How the child's turn ended: its result's status and text, and what it
/// spent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildResult {
    pub status: ResultStatus,
    pub text: Option<String>,
    pub usage: Usage,
    /// The last `error` event of the turn, if any.
    pub error: Option<String>,
}

/// A child's turn as a job.
#[derive(Debug, Serialize, Deserialize)]
struct ChildTurn {
    child: Uuid,
    prompt: String,
    options: TurnOptions,
}

/// The job's answer: the result and where it is in the child's log.
#[derive(Debug, Serialize, Deserialize)]
struct ChildDone {
    result: ChildResult,
    result_seq: u64,
}

/// Interrupts a child's turn unless it ended on its own.
struct InterruptOnDrop(Option<Arc<Session>>);

impl Drop for InterruptOnDrop {
    fn drop(&mut self) {
        if let Some(session) = self.0.take() {
            session.interrupt();
        }
    }
}

/// Runs a turn of `child` on `prompt` with `options` (after any turn it
/// is running) wherever `jobs` runs it, and forwards its events, but its
/// `result`, into `parent` with `tag` as their `agent_id`. The turn's
/// calls that wait for a decision name `parent` and `tag`, so the parent's
/// owner decides them there. An error says why no result came.
pub async fn run_turn(
    manager: &SessionManager,
    jobs: &dyn Jobs,
    child: &Arc<Session>,
    prompt: String,
    options: TurnOptions,
    parent: &Session,
    tag: &str,
) -> Result<ChildResult, String> {
    let since = manager
        .stored_last_seq(child.id)
        .await
        .map_err(|e| e.to_string())?;
    let mut events = child.subscribe(since, false);
    let options = TurnOptions {
        on_behalf_of: Some(OnBehalfOf {
            parent: parent.id,
            agent_id: tag.to_owned(),
        }),
        ..options
    };
    let job = ChildTurn {
        child: child.id,
        prompt,
        options,
    };
    let done = jobs::run_json::<_, ChildDone>(jobs, CHILD_TURN, &job);
    tokio::pin!(done);
    let mut answer: Option<ChildDone> = None;
    let mut seen = since;
    loop {
        if let Some(done) = answer.take_if(|a| seen >= a.result_seq) {
            return Ok(done.result);
        }
        tokio::select! {
            done = &mut done, if answer.is_none() => {
                answer = Some(done.map_err(|e| e.to_string())?);
            }
            event = events.next() => {
                let Some(event) = event else {
                    return Err("the session closed during its turn".into());
                };
                seen = event.seq;
                // Results are the child's own (one per attempt, when a
                // replica died mid-turn); the rest is the parent's to show.
                if !matches!(event.kind, EventKind::Result { .. }) {
                    parent
                        .emit_as(tag, event.kind.clone())
                        .map_err(|e| e.to_string())?;
                }
            }
        }
    }
}

/// Runs child turns, whichever replica asked, on the manager it is made
/// with (while that is being made: [`std::sync::Arc::new_cyclic`]).
pub struct ChildTurns {
    pub sessions: Weak<SessionManager>,
}

#[async_trait]
impl Handler for ChildTurns {
    async fn run(&self, job: Bytes) -> Result<Bytes, String> {
        let job: ChildTurn = jobs::read(&job)?;
        let manager = self.sessions.upgrade().ok_or("the server is stopping")?;
        let child = manager
            .get(job.child, None)
            .await
            .map_err(|e| e.to_string())?;
        let started = manager
            .start_turn_with(child, job.prompt, true, job.options)
            .await
            .map_err(|e| e.to_string())?;
        let mut guard = InterruptOnDrop(Some(started.session.clone()));
        let mut events = started.session.subscribe(started.since, true);
        let mut error = None;
        while let Some(event) = events.next().await {
            match &event.kind {
                EventKind::Result {
                    status,
                    result,
                    usage,
                    ..
                } => {
                    guard.0 = None;
                    return jobs::answer(&ChildDone {
                        result: ChildResult {
                            status: *status,
                            text: result.clone(),
                            usage: usage.clone(),
                            error,
                        },
                        result_seq: event.seq,
                    });
                }
                EventKind::Error { message, .. } => error = Some(message.clone()),
                _ => {}
            }
        }
        Err("the session closed during its turn".into())
    }
}
