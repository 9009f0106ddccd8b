//! A session sandbox's CPU and wall time, read just before it is removed
//! and handed to whoever counts usage (the server: the session's key).

use std::sync::Arc;

use futures::future::BoxFuture;
use uuid::Uuid;

use super::{SandboxFor, SandboxManager, Slot};
use crate::sandbox::Result;

/// Told a removed sandbox's session, the key that owns the session, CPU
/// seconds (when the backend can tell) and wall seconds; its future runs
/// before the removal returns. A scratch sandbox is not told.
pub type OnRemoved =
    Arc<dyn Fn(Uuid, Option<String>, Option<f64>, f64) -> BoxFuture<'static, ()> + Send + Sync>;

impl SandboxManager {
    /// Counts every session sandbox removed with `removed`.
    pub fn with_on_removed(mut self, removed: OnRemoved) -> SandboxManager {
        self.removed = Some(removed);
        self
    }

    /// Destroys the slot's sandbox, if it was made, reading its CPU time
    /// first (the container's cgroup goes with it).
    pub(super) async fn destroy_counted(&self, session: Uuid, slot: &Slot) -> Result<()> {
        let Some(sandbox) = slot.sandbox.get() else {
            return Ok(());
        };
        let cpu = match self.removed.as_ref() {
            Some(_) => sandbox.cpu_seconds().await,
            None => None,
        };
        let destroyed = sandbox.destroy().await;
        if let Some(marks) = &self.marks {
            marks.clear(session);
        }
        if let (Some(removed), SandboxFor::Session { owner }) = (self.removed.as_ref(), &slot.whose)
        {
            let wall = slot.born.elapsed().as_secs_f64();
            removed(session, owner.clone(), cpu, wall).await;
        }
        destroyed
    }
}
