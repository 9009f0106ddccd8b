//! Pausing idle sandboxes (`sandbox.pause_after_s`) and resuming them at
//! their session's next lease, so that an idle session holds memory but no
//! CPU, and its processes (background runs included) carry on where they
//! stopped.
//!
//! A background run holds a lease for as long as it runs, which keeps the
//! idle reaper away; it does not keep the sandbox from being paused, since
//! surviving a pause is the point. A paused sandbox is destroyed after the
//! idle TTL like any other, background runs or not.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use uuid::Uuid;

use super::{Lease, SandboxManager, Slot, lock};
use crate::sandbox::{Result, Sandbox};

/// Where a slot's sandbox stands with pausing.
#[derive(Default)]
pub(super) struct PauseState {
    /// Serialises pausing and resuming, so two leases that arrive together
    /// resume once, and a lease never gets a sandbox being paused.
    gate: tokio::sync::Mutex<()>,
    paused: AtomicBool,
    /// The backend cannot pause this sandbox: it is not asked again.
    unpausable: AtomicBool,
    /// Leases held by background runs.
    background: AtomicUsize,
}

/// Pauses and resumes, for `/metrics`.
#[derive(Clone)]
pub struct PauseMetrics {
    pub pauses: Counter,
    pub resumes: Counter,
    /// Seconds a lease waited for its sandbox to resume.
    pub resume_seconds: Histogram,
}

impl PauseMetrics {
    /// Adds the counts to the server's `/metrics` (the manager keeps them
    /// itself, as it pauses and resumes with no view of the server).
    pub fn register(&self, metrics: &crate::telemetry::Metrics) {
        metrics.register_with(|registry| {
            registry.register(
                "sandbox_pauses",
                "Idle sandboxes paused (sandbox.pause_after_s)",
                self.pauses.clone(),
            );
            registry.register(
                "sandbox_resumes",
                "Paused sandboxes resumed at their session's next tool call",
                self.resumes.clone(),
            );
            registry.register(
                "sandbox_resume_seconds",
                "Time a tool call waited for its paused sandbox to resume",
                self.resume_seconds.clone(),
            );
        });
    }
}

impl Default for PauseMetrics {
    fn default() -> Self {
        PauseMetrics {
            pauses: Counter::default(),
            resumes: Counter::default(),
            // 0.25 ms to about 4 s.
            resume_seconds: Histogram::new(exponential_buckets(0.00025, 2.0, 15)),
        }
    }
}

/// Marks a lease as a background run's while it is held.
pub(super) struct Background(Arc<Slot>);

impl Drop for Background {
    fn drop(&mut self) {
        self.0.pause.background.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Lease {
    /// This lease as a background run's: it still keeps the sandbox from
    /// the idle reaper, but no longer from being paused.
    pub fn into_background(mut self) -> Lease {
        if self._background.is_none() {
            let slot = self._hold.0.clone();
            slot.pause.background.fetch_add(1, Ordering::AcqRel);
            self._background = Some(Background(slot));
        }
        self
    }
}

impl Slot {
    /// Leases held by calls, as opposed to background runs.
    fn in_use(&self) -> bool {
        let leases = self.leases.load(Ordering::Acquire);
        leases > self.pause.background.load(Ordering::Acquire)
    }

    /// Whether the idle reaper may take it: no lease, or paused with only
    /// background runs' leases (they make no progress while it is paused).
    pub(super) fn unused(&self) -> bool {
        self.leases.load(Ordering::Acquire) == 0
            || (self.pause.paused.load(Ordering::Acquire) && !self.in_use())
    }

    pub(super) fn paused(&self) -> bool {
        self.pause.paused.load(Ordering::Acquire)
    }

    fn idle_for(&self, after: Duration) -> bool {
        self.sandbox.initialized() && !self.in_use() && lock(&self.last_used).elapsed() >= after
    }
}

impl SandboxManager {
    /// Pauses the sessions' sandboxes no call has used for
    /// `sandbox.pause_after_s` (never one being made or used). Returns how
    /// many were paused.
    pub async fn pause_idle(&self) -> usize {
        if self.config.pause_after_s == 0 {
            return 0;
        }
        let after = Duration::from_secs(self.config.pause_after_s);
        let idle: Vec<(Uuid, Arc<Slot>)> = lock(&self.slots)
            .iter()
            .filter(|(_, slot)| !slot.paused() && !slot.pause.unpausable.load(Ordering::Acquire))
            .filter(|(_, slot)| slot.idle_for(after))
            .map(|(session, slot)| (*session, slot.clone()))
            .collect();
        let mut paused = 0;
        for (session, slot) in idle {
            let Some(sandbox) = slot.sandbox.get() else {
                continue;
            };
            let _gate = slot.pause.gate.lock().await;
            // A lease taken meanwhile counts before it waits for the gate,
            // so this sees it, or it finds the sandbox paused and resumes it.
            if slot.paused() || !slot.idle_for(after) {
                continue;
            }
            match sandbox.pause().await {
                Ok(true) => {
                    slot.pause.paused.store(true, Ordering::Release);
                    self.pause_metrics.pauses.inc();
                    paused += 1;
                    tracing::info!(%session, sandbox = sandbox.id(), "idle sandbox paused");
                }
                Ok(false) => slot.pause.unpausable.store(true, Ordering::Release),
                Err(e) => {
                    tracing::warn!(%session, sandbox = sandbox.id(), error = %e, "pausing an idle sandbox failed");
                }
            }
        }
        paused
    }

    /// Resumes the slot's sandbox if it is paused, before a lease hands it
    /// out.
    pub(super) async fn resume_paused(&self, slot: &Slot, sandbox: &dyn Sandbox) -> Result<()> {
        // Taken even when the sandbox is not paused: a pause may be under
        // way, begun before this lease counted.
        let _gate = slot.pause.gate.lock().await;
        if !slot.paused() {
            return Ok(());
        }
        let started = Instant::now();
        sandbox.resume().await?;
        slot.pause.paused.store(false, Ordering::Release);
        self.pause_metrics.resumes.inc();
        self.pause_metrics
            .resume_seconds
            .observe(started.elapsed().as_secs_f64());
        tracing::debug!(
            sandbox = sandbox.id(),
            took_ms = started.elapsed().as_millis() as u64,
            "sandbox resumed"
        );
        Ok(())
    }

    /// Whether the session's sandbox is paused now.
    pub fn is_paused(&self, session: Uuid) -> bool {
        lock(&self.slots)
            .get(&session)
            .is_some_and(|slot| slot.paused())
    }

    /// The counters of pauses and resumes, to register with `/metrics`.
    pub fn pause_metrics(&self) -> &PauseMetrics {
        &self.pause_metrics
    }

    /// How often the server looks for sandboxes to pause: often enough
    /// that one is paused within a quarter of `sandbox.pause_after_s` of
    /// becoming due; `None` when pausing is off.
    pub fn pause_every(&self) -> Option<Duration> {
        match self.config.pause_after_s {
            0 => None,
            after => Some(Duration::from_millis((after * 250).clamp(250, 30_000))),
        }
    }
}
