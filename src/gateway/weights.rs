//! Weight sync around a pool: the trainer's side of a weight update.
//!
//! `begin` pauses the pool — calls already admitted finish, new ones wait
//! at the gate (they do not fail) — and returns once none is in flight;
//! `commit` records the new version, reopens the gate and wakes the
//! waiting calls. Every call admitted after a commit runs under that
//! version, which its trace and a rollout's results carry.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Notify;

use crate::sync::lock;

#[derive(Debug, Default)]
struct State {
    paused: bool,
    /// Calls admitted and not yet ended (their response fully passed on).
    in_flight: u64,
    /// Calls waiting at the paused gate.
    waiting: u64,
    version: Option<Value>,
}

/// The gate of one pool.
#[derive(Debug, Default)]
pub struct WeightGate {
    state: Mutex<State>,
    changed: Notify,
}

/// A call admitted through the gate; it counts as in flight until dropped.
#[derive(Debug)]
pub struct Admission {
    gate: Arc<WeightGate>,
    /// The weights version the call runs under.
    pub version: Option<Value>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        let quiet = {
            let mut state = lock(&self.gate.state);
            state.in_flight = state.in_flight.saturating_sub(1);
            state.in_flight == 0
        };
        if quiet {
            self.gate.changed.notify_waiters();
        }
    }
}

/// `begin` gave up: calls were still in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StillBusy {
    pub in_flight: u64,
}

impl WeightGate {
    /// Waits (at most `wait`) until the pool is not paused, then admits
    /// the call; `None` when the wait ran out.
    pub async fn admit(self: &Arc<Self>, wait: Duration) -> Option<Admission> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut counted = false;
        loop {
            // Registered before the check, so a commit in between wakes it.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut state = lock(&self.state);
                if !state.paused {
                    state.in_flight += 1;
                    if counted {
                        state.waiting -= 1;
                    }
                    return Some(Admission {
                        gate: self.clone(),
                        version: state.version.clone(),
                    });
                }
                if !counted {
                    state.waiting += 1;
                    counted = true;
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                lock(&self.state).waiting -= 1;
                return None;
            }
        }
    }

    /// Pauses the gate and waits (at most `timeout`) until no admitted
    /// call is in flight. The gate stays paused either way, until a commit.
    pub async fn begin(&self, timeout: Duration) -> Result<(), StillBusy> {
        let deadline = tokio::time::Instant::now() + timeout;
        lock(&self.state).paused = true;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let in_flight = lock(&self.state).in_flight;
            if in_flight == 0 {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                let in_flight = lock(&self.state).in_flight;
                return if in_flight == 0 {
                    Ok(())
                } else {
                    Err(StillBusy { in_flight })
                };
            }
        }
    }

    /// Records `version` and reopens the gate.
    pub fn commit(&self, version: Value) {
        {
            let mut state = lock(&self.state);
            state.paused = false;
            state.version = Some(version);
        }
        self.changed.notify_waiters();
    }

    pub fn paused(&self) -> bool {
        lock(&self.state).paused
    }

    pub fn version(&self) -> Option<Value> {
        lock(&self.state).version.clone()
    }

    pub fn in_flight(&self) -> u64 {
        lock(&self.state).in_flight
    }

    /// `{paused, in_flight, waiting, version}` for `GET /gateway/replicas`.
    pub fn view(&self) -> Value {
        let state = lock(&self.state);
        serde_json::json!({
            "paused": state.paused,
            "in_flight": state.in_flight,
            "waiting": state.waiting,
            "version": state.version,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test(start_paused = true)]
    async fn begin_waits_for_calls_in_flight_and_new_calls_wait_for_the_commit() {
        let gate = Arc::new(WeightGate::default());
        let first = gate.admit(Duration::from_secs(1)).await.unwrap();
        assert_eq!(first.version, None);
        let began = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.begin(Duration::from_secs(60)).await })
        };
        tokio::task::yield_now().await;
        assert!(gate.paused() && !began.is_finished());
        // A new call waits at the gate instead of failing.
        let waiting = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.admit(Duration::from_secs(600)).await })
        };
        tokio::task::yield_now().await;
        drop(first);
        assert_eq!(began.await.unwrap(), Ok(()));
        assert!(!waiting.is_finished());
        gate.commit(json!(7));
        let admitted = waiting.await.unwrap().unwrap();
        assert_eq!(admitted.version, Some(json!(7)));
        assert_eq!(gate.in_flight(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn waits_end_at_their_deadlines() {
        let gate = Arc::new(WeightGate::default());
        let held = gate.admit(Duration::ZERO).await.unwrap();
        let busy = gate.begin(Duration::from_secs(5)).await;
        assert_eq!(busy, Err(StillBusy { in_flight: 1 }));
        assert!(gate.admit(Duration::from_secs(5)).await.is_none());
        drop(held);
        assert_eq!(gate.begin(Duration::from_secs(5)).await, Ok(()));
    }
}
