//! Deciding a call that waits for approval, the same way for every door a
//! decision comes through: `POST …/approvals/{call_id}` and the session
//! WebSocket (the API module), and an MCP client's answer to an
//! elicitation (the MCP module, which must not depend on the API).

use std::sync::Arc;

use super::approve::check_edited;
use super::options::AgentOptions;
use crate::config::AgentConfig;
use crate::session::Session;
use crate::session::approvals::{Approvals, DecideError, Decided, Decision, Pending};
use crate::store::StoreError;

/// Why a decision did not reach its call.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// Decided already, timed out, or never asked (a 409).
    #[error(transparent)]
    NotPending(DecideError),
    /// The edited input does not fit the tool or is denied (a 422 on
    /// `input`).
    #[error("{0}")]
    Input(String),
    /// The turn's replica did not take it; the call is pending again (a
    /// 409 when nothing took it, a 503 when the bus refused it).
    #[error(transparent)]
    Undelivered(DecideError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Decides a waiting call of `session`: the edited input, if any, must fit
/// the tool and the rules before the decision claims the call. `by` is who
/// decided (`user`, `admin`), as the `approval_decided` event says.
pub async fn decide(
    approvals: &Approvals,
    config: &AgentConfig,
    session: &Session,
    call_id: &str,
    decision: Decision,
    by: &str,
) -> Result<(), Refused> {
    let not_pending = || Refused::NotPending(DecideError::NotPending(call_id.to_string()));
    let waiting = approvals
        .pending(session.owner.as_deref(), session.id, call_id)
        .await?
        .ok_or_else(not_pending)?;
    decide_read(approvals, config, session, waiting, decision, by).await
}

/// [`decide`] for a waiting call already read (`pending` at `revision`).
pub async fn decide_read(
    approvals: &Approvals,
    config: &AgentConfig,
    session: &Session,
    (pending, revision): (Pending, u64),
    decision: Decision,
    by: &str,
) -> Result<(), Refused> {
    let owner = session.owner.as_deref();
    if let Some(input) = &decision.input {
        let options = AgentOptions::stored(&session.options)?;
        check_edited(config, &options, owner, &pending, input).map_err(Refused::Input)?;
    }
    let decided = Decided {
        decision,
        by: by.into(),
    };
    match approvals.decide(owner, &pending, revision, decided).await {
        Ok(()) => Ok(()),
        Err(DecideError::NotPending(_)) => Err(Refused::NotPending(DecideError::NotPending(
            pending.call_id.clone(),
        ))),
        Err(DecideError::Store(e)) => Err(Refused::Store(e)),
        Err(e) => Err(Refused::Undelivered(e)),
    }
}

/// What a server that is not the API (the MCP tools) needs to decide.
#[derive(Clone)]
pub struct Decider {
    pub approvals: Arc<Approvals>,
    pub config: Arc<AgentConfig>,
}

impl Decider {
    pub async fn decide(
        &self,
        session: &Session,
        call_id: &str,
        decision: Decision,
        by: &str,
    ) -> Result<(), Refused> {
        decide(
            &self.approvals,
            &self.config,
            session,
            call_id,
            decision,
            by,
        )
        .await
    }
}
