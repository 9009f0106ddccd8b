//! `max_sandboxes`: each session's sandbox holds a slot of its key's in the
//! store, so one key never takes every one of `sandbox.max_live` and the
//! count holds across replicas.

use std::sync::Arc;

use uuid::Uuid;

use crate::quota::{HeldSlot, QuotaError, Quotas};
use crate::sandbox::{Result, SandboxError};
use crate::store::Store;

pub(crate) struct SandboxQuotas {
    pub quotas: Arc<Quotas>,
    /// Where a session's owner is found.
    pub store: Arc<dyn Store>,
}

impl SandboxQuotas {
    /// A slot for the session's new sandbox; none while auth is off, for a
    /// key without the limit, and for a sandbox of no stored session (an
    /// MCP connection's scratch sandbox, bounded by `max_live` alone).
    pub async fn take_sandbox(&self, session: Uuid) -> Result<Option<HeldSlot>> {
        if self.quotas.table().is_empty() {
            return Ok(None);
        }
        let record = self
            .store
            .get_session(session)
            .await
            .map_err(|e| SandboxError::Unavailable(format!("the store: {e}")))?;
        let Some(owner) = record.and_then(|r| r.owner) else {
            return Ok(None);
        };
        if self
            .quotas
            .table()
            .quota(Some(&owner))
            .max_sandboxes
            .is_none()
        {
            return Ok(None);
        }
        match self.quotas.take_sandbox(Some(&owner)).await {
            Ok(held) => Ok(held),
            Err(QuotaError::Exceeded(e)) => Err(SandboxError::Quota(e)),
            Err(QuotaError::Store(e)) => Err(SandboxError::Unavailable(format!("the store: {e}"))),
        }
    }
}
