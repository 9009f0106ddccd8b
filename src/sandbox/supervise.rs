//! Exec supervision, the same for every backend: a run is driven to its
//! end unless its deadline passes or it is cancelled; then its process
//! tree is killed once, and the run gets a grace period to end (delivering
//! the output it still has) before it is given up as stuck.

use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long a killed run may take to end before it is given up.
pub const KILL_GRACE: Duration = Duration::from_secs(5);

/// How a supervised run ended.
#[derive(Debug)]
pub struct Supervised<T> {
    /// What the run returned; `None` when it was given up after a kill.
    pub ended: Option<T>,
    pub timed_out: bool,
    pub cancelled: bool,
    pub duration: Duration,
}

impl<T> Supervised<T> {
    /// Whether the tree was killed (timeout or cancel): an exit code it
    /// reported after the kill is the kill's, not the command's.
    pub fn killed(&self) -> bool {
        self.timed_out || self.cancelled
    }
}

/// Drives `run` until it ends. Past `timeout`, or once `cancel` fires,
/// `kill` runs once and `run` has `grace` more to end.
pub async fn supervise<'k, T>(
    run: impl Future<Output = T>,
    timeout: Duration,
    cancel: &CancellationToken,
    grace: Duration,
    mut kill: impl FnMut() -> BoxFuture<'k, ()>,
) -> Supervised<T> {
    let started = Instant::now();
    tokio::pin!(run);
    let deadline = tokio::time::sleep(timeout);
    // Armed by the kill: how long the run may take to end after it.
    let given_up = tokio::time::sleep(Duration::MAX);
    tokio::pin!(deadline, given_up);
    let (mut timed_out, mut cancelled) = (false, false);
    let ended = loop {
        let killed = timed_out || cancelled;
        tokio::select! {
            biased;
            value = &mut run => break Some(value),
            () = &mut deadline, if !killed => {
                timed_out = true;
                kill().await;
                given_up.as_mut().reset(Instant::now() + grace);
            }
            () = cancel.cancelled(), if !killed => {
                cancelled = true;
                kill().await;
                given_up.as_mut().reset(Instant::now() + grace);
            }
            () = &mut given_up, if killed => break None,
        }
    };
    Supervised {
        ended,
        timed_out,
        cancelled,
        duration: started.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn counting(kills: &Arc<AtomicUsize>) -> impl FnMut() -> BoxFuture<'static, ()> + use<> {
        let kills = kills.clone();
        move || {
            let kills = kills.clone();
            Box::pin(async move {
                kills.fetch_add(1, Ordering::SeqCst);
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_that_ends_in_time_is_left_alone() {
        let kills = Arc::new(AtomicUsize::new(0));
        let done = supervise(
            async { 7 },
            Duration::from_secs(1),
            &CancellationToken::new(),
            KILL_GRACE,
            counting(&kills),
        )
        .await;
        assert_eq!((done.ended, done.killed()), (Some(7), false));
        assert_eq!(kills.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_past_its_deadline_is_killed_once_and_may_still_end() {
        let kills = Arc::new(AtomicUsize::new(0));
        // Ends 1 s after the deadline, within the grace.
        let done = supervise(
            tokio::time::sleep(Duration::from_secs(3)),
            Duration::from_secs(2),
            &CancellationToken::new(),
            KILL_GRACE,
            counting(&kills),
        )
        .await;
        assert!(done.timed_out && !done.cancelled && done.ended.is_some());
        assert_eq!(kills.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_run_that_does_not_end_is_given_up_after_the_grace() {
        let kills = Arc::new(AtomicUsize::new(0));
        let cancel = CancellationToken::new();
        cancel.cancel();
        let done = supervise(
            std::future::pending::<()>(),
            Duration::from_secs(60),
            &cancel,
            KILL_GRACE,
            counting(&kills),
        )
        .await;
        assert!(done.cancelled && !done.timed_out && done.ended.is_none());
        assert_eq!(done.duration, KILL_GRACE);
        assert_eq!(kills.load(Ordering::SeqCst), 1);
    }
}
