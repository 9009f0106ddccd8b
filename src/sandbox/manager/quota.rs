//! `max_sandboxes`: each session's sandbox, and each MCP connection's
//! scratch sandbox, holds a slot of its key's in the store, so one key never takes every one of `sandbox.max_live` and the
//! count holds across replicas.

use std::sync::Arc;

use crate::quota::{HeldSlot, QuotaError, Quotas};
use crate::sandbox::{Result, SandboxError};

pub(crate) struct SandboxQuotas {
    pub quotas: Arc<Quotas>,
}

impl SandboxQuotas {
    /// A slot for a new sandbox of `whose` (a session's, or an MCP
    /// connection's scratch one: the key's either way); none while auth
    /// is off, for a key without the limit, and for a scratch sandbox of
    /// no key (`conclave mcp` on stdio, bounded by `max_live` alone).
    pub async fn take_sandbox(&self, whose: &super::SandboxFor) -> Result<Option<HeldSlot>> {
        let (super::SandboxFor::Session { owner: Some(owner) }
        | super::SandboxFor::Scratch { owner: Some(owner) }) = whose
        else {
            return Ok(None);
        };
        if self
            .quotas
            .table()
            .quota(Some(owner))
            .max_sandboxes
            .is_none()
        {
            return Ok(None);
        }
        match self.quotas.take_sandbox(Some(owner)).await {
            Ok(held) => Ok(held),
            Err(QuotaError::Exceeded(e)) => Err(SandboxError::Quota(e)),
            Err(QuotaError::Store(e)) => Err(SandboxError::Unavailable(format!("the store: {e}"))),
        }
    }
}
