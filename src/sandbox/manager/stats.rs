//! A session sandbox's resource use for status calls, from a sample that
//! is refreshed in the background so a status call never waits on the
//! backend (docker's stats take tens of milliseconds).

use std::sync::atomic::Ordering;
use std::time::Duration;

use uuid::Uuid;

use super::{SandboxInfo, SandboxManager, lock};
use crate::sandbox::{Sandbox, SandboxError, SandboxStats};

#[derive(Clone)]
pub(super) struct Sample {
    /// Tokio's clock, which tests can pause.
    at: tokio::time::Instant,
    state: &'static str,
    stats: SandboxStats,
}

/// A sample older than this is refreshed in the background; the status
/// call answers with it meanwhile.
const SAMPLE_MAX_AGE: Duration = Duration::from_secs(1);

async fn sample(sandbox: &dyn Sandbox) -> Sample {
    let (state, stats) = match sandbox.stats().await {
        Ok(stats) => ("running", stats),
        Err(SandboxError::Gone(_)) => ("gone", SandboxStats::default()),
        Err(e) => {
            tracing::debug!(error = %e, "sandbox stats");
            ("running", SandboxStats::default())
        }
    };
    Sample {
        at: tokio::time::Instant::now(),
        state,
        stats,
    }
}

impl SandboxManager {
    /// The session's sandbox and its resource use, if it has one.
    pub async fn info(&self, session: Uuid) -> Option<SandboxInfo> {
        let slot = lock(&self.slots).get(&session).cloned()?;
        let sandbox = slot.sandbox.get()?.clone();
        let cached = lock(&slot.sampled).clone();
        let current = match cached {
            // The first sample is taken at once; later ones in the
            // background, while the last one answers.
            None => {
                let fresh = sample(sandbox.as_ref()).await;
                *lock(&slot.sampled) = Some(fresh.clone());
                fresh
            }
            Some(cached) => {
                if cached.at.elapsed() >= SAMPLE_MAX_AGE
                    && !slot.sampling.swap(true, Ordering::AcqRel)
                {
                    let (slot, sandbox) = (slot.clone(), sandbox.clone());
                    tokio::spawn(async move {
                        let fresh = sample(sandbox.as_ref()).await;
                        *lock(&slot.sampled) = Some(fresh);
                        slot.sampling.store(false, Ordering::Release);
                    });
                }
                cached
            }
        };
        let state = match current.state {
            "running" if slot.paused() => "paused",
            state => state,
        };
        Some(SandboxInfo {
            backend: self.backend.name().into(),
            id: sandbox.id().into(),
            state: state.into(),
            image: slot.spec.image.clone(),
            stats: current.stats,
        })
    }
}
