//! One turn of a task with the machinery around it: the wall-clock limit,
//! the closing `result`, status and usage, and the turns a crash cut off.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::protocol::{EventKind, ResultStatus, SessionStatus};
use crate::session::lease::HeldTurn;
use crate::session::live::Session;
use crate::session::task::{Outcome, SessionTask, Turn, TurnOptions};
use crate::store::StoreError;
use crate::sync::lock;
use crate::telemetry::{Metrics, StatusLabel};

/// The span of a turn of `session` (`invoke_agent {name}`), its parent the
/// current span.
pub(super) fn turn_span(session: &Session) -> crate::telemetry::spans::Span {
    let kind = session.kind.to_string();
    let agent = session.name.as_deref().unwrap_or(&kind);
    crate::telemetry::spans::turn(&session.id.to_string(), agent, &kind)
}

/// Runs a turn of one task with the machinery around it.
pub(super) struct Runner {
    pub(super) task: Arc<dyn SessionTask>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) turn_timeout: Duration,
    /// The key's `max_concurrent_turns` slot this turn holds: given back
    /// just before the `result`, so a client that starts its next turn as
    /// soon as it reads one finds the slot free.
    pub(super) turn_slot: std::sync::Mutex<Option<crate::quota::HeldSlot>>,
    /// With replicas: the turn's lease, given up in its result's write.
    pub(super) lease: Option<HeldTurn>,
    /// The key's `storage_mb`, measured again for the key's next turn
    /// once this one has written its events.
    pub(super) storage: Option<Arc<crate::bus::StorageMeter>>,
}

impl Runner {
    /// Runs one turn to its `result`. Store failures end the turn early;
    /// they are logged, since the log itself is what failed.
    pub(super) async fn run(
        &self,
        session: &Arc<Session>,
        input: String,
        options: TurnOptions,
        cancel: CancellationToken,
    ) {
        self.metrics.turns_running.inc();
        if let Err(e) = self.run_inner(session, input, options, cancel).await {
            tracing::error!(session = %session.id, error = %e, "turn aborted by a store failure");
            session.forget_history();
            let _ = session
                .set_state(status_after(session, ResultStatus::Error), None)
                .await;
            if session.ephemeral {
                self.task.release_made_here(session.id).await;
            }
        }
        self.metrics.turns_running.dec();
    }

    async fn run_inner(
        &self,
        session: &Arc<Session>,
        input: String,
        options: TurnOptions,
        cancel: CancellationToken,
    ) -> Result<(), StoreError> {
        let started = Instant::now();
        // `running` is stored in the write of the turn's first event (a
        // crash after the first event always leaves a turn to close at
        // restart), or alone as soon as the task first waits without
        // having emitted one, so other replicas see the turn (and forward
        // interrupts) even while the task is silent.
        if session.status() != SessionStatus::Running {
            session.stage_state(SessionStatus::Running, None)?;
        }
        // The turn's own token: cancelled by an interrupt (its parent) or
        // when the wall-clock limit passes, which only this timer does.
        let limit = self.turn_timeout;
        let turn_cancel = cancel.child_token();
        let mut turn = Turn::starting(session, turn_cancel.clone(), options);
        let running = cancelled_after(self.task.run(&mut turn, input), limit, &turn_cancel);
        let mut outcome = until_first_wait(running, || session.write_soon()).await?;
        let timed_out = turn_cancel.is_cancelled() && !cancel.is_cancelled();
        if timed_out && outcome.status == ResultStatus::Interrupted {
            session.emit(EventKind::Status {
                message: format!(
                    "The turn ran past its {} s limit (agent.turn_timeout_s) and was stopped.",
                    limit.as_secs()
                ),
            })?;
            outcome.status = ResultStatus::TimedOut;
        }
        self.finish(&turn, outcome, started, true).await
    }

    /// Settles a turn that a crash cut off: one whose `result` was stored
    /// only needs its status; any other gets an `interrupted` result.
    pub(super) async fn close_cut_off(
        &self,
        session: &Arc<Session>,
        message: &str,
    ) -> Result<(), StoreError> {
        if let Some(status) = session.last_result().await? {
            return session.set_state(status_after(session, status), None).await;
        }
        self.task.close_cut_off(session).await?;
        session.emit(EventKind::Status {
            message: message.to_owned(),
        })?;
        let turn = Turn::starting(session, CancellationToken::new(), TurnOptions::default());
        let outcome = Outcome::new(ResultStatus::Interrupted, None);
        self.finish(&turn, outcome, Instant::now(), false).await
    }

    async fn finish(
        &self,
        turn: &Turn,
        outcome: Outcome,
        started: Instant,
        ran_here: bool,
    ) -> Result<(), StoreError> {
        let session = &turn.session;
        let slot = lock(&self.turn_slot).take();
        if let Some(slot) = slot {
            slot.release().await;
        }
        if let (Some(storage), Some(owner)) = (&self.storage, session.owner.as_deref()) {
            storage.turn_ended(owner);
        }
        // An ephemeral session's one turn is over and nothing will use what
        // it held: it is gone by the time the client reads the result. The
        // session was made by that turn (`/agent/run`): run here, what it
        // held is here; closed here after its replica died, it may be
        // anywhere.
        if session.ephemeral {
            if ran_here {
                self.task.release_made_here(session.id).await;
            } else {
                self.task.release(session.id).await;
            }
        }
        // The status the turn leaves is stored with its `result`, in one
        // write (a client that reads the result finds the session idle),
        // and so is the lease given up.
        let release = self.lease.as_ref().map(HeldTurn::release_with_result);
        let seq = session.emit_last(
            EventKind::Result {
                status: outcome.status,
                result: outcome.text,
                cost_usd: turn.usage.cost_usd,
                cost_known: turn.cost_known,
                turns: turn.usage.turns as u32,
                usage: turn.usage.clone(),
                duration_ms: started.elapsed().as_millis() as u64,
                history_len: turn.history_len,
                files_changed: turn.files_changed,
                context: turn.context.clone(),
            },
            (status_after(session, outcome.status), &turn.session_total()),
            release,
        )?;
        // Before that write starts, since it lets the next turn start on
        // any replica: its first tool call finds the workspace's snapshot
        // under way.
        if !session.ephemeral {
            self.task.turn_ended(session, seq).await;
        }
        // Past its result the turn can no longer be interrupted, and a
        // message that comes now waits for it instead of being refused.
        *lock(&session.running) = None;
        session.flush().await?;
        if let Some(lease) = &self.lease {
            lease.released_with_result();
        }
        let status = outcome.status.as_str();
        let span = crate::telemetry::spans::Span::current();
        span.set("conclave.result.status", status);
        if outcome.status == ResultStatus::Error {
            span.fail(status);
        }
        tracing::info!(
            session = %session.id,
            kind = %session.kind,
            %status,
            model_calls = turn.usage.turns,
            tool_calls = turn.usage.tool_calls,
            ms = started.elapsed().as_millis() as u64,
            "turn finished"
        );
        self.metrics
            .turns_finished
            .get_or_create(&StatusLabel {
                status: status.to_string(),
            })
            .inc();
        Ok(())
    }
}

/// Runs `future`, calling `waits` the first time it waits (returns
/// pending).
async fn until_first_wait<F: Future>(future: F, waits: impl FnOnce()) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut waits = Some(waits);
    std::future::poll_fn(|cx| {
        let polled = future.as_mut().poll(cx);
        if polled.is_pending()
            && let Some(waits) = waits.take()
        {
            waits();
        }
        polled
    })
    .await
}

/// Runs `future`, cancelling `token` once `limit` has passed; the future
/// then winds up on its own. The timer is polled in the turn's own task,
/// so a turn starts no task for it.
async fn cancelled_after<F: Future>(
    future: F,
    limit: Duration,
    token: &CancellationToken,
) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut timer = std::pin::pin!(tokio::time::sleep(limit));
    std::future::poll_fn(|cx| {
        // A token already cancelled (the limit passed, or an interrupt)
        // needs the timer no more.
        if !token.is_cancelled() && timer.as_mut().poll(cx).is_ready() {
            token.cancel();
        }
        future.as_mut().poll(cx)
    })
    .await
}

/// Result status → session status once a turn is over.
fn status_after(session: &Session, result: ResultStatus) -> SessionStatus {
    if session.ephemeral {
        SessionStatus::Closed
    } else if result == ResultStatus::Interrupted {
        SessionStatus::Interrupted
    } else {
        SessionStatus::Idle
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use super::{cancelled_after, until_first_wait};

    #[tokio::test]
    async fn the_first_wait_is_told_once_and_a_ready_future_never() {
        let told = AtomicUsize::new(0);
        let ready = until_first_wait(async { 1 }, || {
            told.fetch_add(1, Ordering::SeqCst);
        })
        .await;
        assert_eq!((ready, told.load(Ordering::SeqCst)), (1, 0));
        let waiting = until_first_wait(
            async {
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
                2
            },
            || {
                told.fetch_add(1, Ordering::SeqCst);
            },
        )
        .await;
        assert_eq!((waiting, told.load(Ordering::SeqCst)), (2, 1));
    }

    /// The limit cancels the token of a turn still running and leaves it
    /// to wind up; a turn over in time leaves the token alone.
    #[tokio::test(start_paused = true)]
    async fn a_turn_past_its_limit_is_cancelled_and_winds_up() {
        let limit = Duration::from_secs(30);
        let token = CancellationToken::new();
        let started = tokio::time::Instant::now();
        let wound_up = cancelled_after(
            async {
                token.cancelled().await;
                "wound up"
            },
            limit,
            &token,
        )
        .await;
        assert_eq!(wound_up, "wound up");
        assert!(started.elapsed() >= limit);

        let token = CancellationToken::new();
        let quick = cancelled_after(tokio::time::sleep(limit / 2), limit, &token).await;
        assert_eq!(quick, ());
        tokio::time::sleep(limit).await;
        assert!(!token.is_cancelled());
    }
}
