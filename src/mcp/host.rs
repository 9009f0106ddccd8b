//! What the MCP server needs from the server: the tools, the store (to
//! find the session a call names, and check that the caller owns it), and,
//! in `conclave serve`, the sessions that `run_agent`, `deliberate`,
//! `start_pipeline`, `fork_session` and the resources use.

use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::model::ErrorData;
use rmcp::service::RequestContext;
use serde::Deserialize;
use uuid::Uuid;

use super::scratch::Found;
use crate::agent::AgentOptions;
use crate::protocol::SessionStatus;
use crate::store::Store;
use crate::tools::{Place, Toolbox};

/// The API key hash of an HTTP caller, put into the request's extensions by
/// the API layer; `None` when auth is off.
#[derive(Debug, Clone, PartialEq)]
pub struct McpOwner(pub Option<String>);

/// Who a server instance answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Caller {
    /// The agent's own client, and `conclave mcp` run by the operator:
    /// any session.
    Trusted,
    /// An HTTP client: only sessions of the key in the request's
    /// [`McpOwner`].
    Http,
}

pub struct McpHost {
    pub tools: Arc<Toolbox>,
    pub store: Arc<dyn Store>,
    /// The most sessions one `fork_session` call makes (`agent.max_forks`).
    pub max_forks: u32,
    /// The server's sessions; `None` for the stdio server of `conclave
    /// mcp`, which runs none.
    pub live: Option<Live>,
    /// The scratch sandboxes handed to stateless (2026-07-28) calls.
    pub scratch: super::scratch::ScratchHandles,
}

/// The parts of a running server the session-starting tools use.
pub struct Live {
    /// For `run_agent`, `fork_session` and the session resources.
    pub sessions: Arc<crate::session::SessionManager>,
    /// For `deliberate`.
    pub deliberations: Arc<crate::deliberation::Deliberations>,
    /// For `start_pipeline`.
    pub pipelines: Arc<crate::pipeline::runs::Runs>,
    /// Decides the calls of `run_agent` turns that wait for approval, from
    /// the client's answer to an elicitation.
    pub decider: crate::agent::decide::Decider,
    /// The sessions' tools among replicas: an HTTP client's call naming a
    /// session runs only where its sandbox is.
    pub router: Arc<dyn crate::agent::ToolRouter>,
}

fn invalid(message: impl Into<String>) -> ErrorData {
    ErrorData::invalid_params(message.into(), None)
}

impl McpHost {
    /// The server's sessions, when it runs any.
    pub fn sessions(&self) -> Option<&Arc<crate::session::SessionManager>> {
        self.live.as_ref().map(|live| &live.sessions)
    }

    /// Which sandbox a call acts in: the named session's (checked against
    /// the caller; one read of its record, none while its turn runs on
    /// this replica), the scratch sandbox of a handle the caller was
    /// given, or the connection's scratch one when it names none.
    pub async fn place(
        &self,
        caller: &Caller,
        session_id: Option<&str>,
        scratch: Uuid,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Place, ErrorData> {
        let sandboxes = &self.tools.sandboxes;
        let Some(text) = session_id else {
            // The key that opened the connection: its `max_sandboxes`
            // counts the scratch sandbox.
            let owner = super::follow::http_owner(caller, ctx).flatten();
            return Ok(Place::scratch(sandboxes, scratch, owner));
        };
        let id = Uuid::parse_str(text)
            .map_err(|_| invalid(format!("session_id '{text}' is not a UUID")))?;
        let owner = super::follow::http_owner(caller, ctx);
        match self.scratch.find(id, owner.as_ref(), sandboxes.holds(id)) {
            Found::Live => return Ok(Place::scratch(sandboxes, id, owner.flatten())),
            Found::Expired => {
                return Err(invalid(format!(
                    "scratch sandbox '{text}' was removed after {} s unused: call without \
                     session_id for a new one",
                    sandboxes.config().idle_ttl_s
                )));
            }
            Found::NotOne => {}
        }
        let unknown = || invalid(format!("unknown session '{text}'"));
        let place = self.session_place(id, owner, unknown).await?;
        self.held_here(caller, id).await?;
        Ok(place)
    }

    /// An IDE's use of a session's live sandbox (the agent's own calls
    /// are carried to the sandbox's replica before they get here) takes
    /// the sandbox as a first call would, and is refused where another
    /// replica holds it rather than making a second one here.
    pub async fn held_here(&self, caller: &Caller, id: Uuid) -> Result<(), ErrorData> {
        let Some(live) = self.live.as_ref().filter(|_| *caller == Caller::Http) else {
            return Ok(());
        };
        live.router.hold_workspace(id).await.map_err(|why| {
            ErrorData::invalid_request(
                format!(
                    "session {id}: {why}: connect to that replica's /mcp, or use the HTTP \
                     API's workspace routes, which any replica passes on"
                ),
                None,
            )
        })
    }

    /// The place of session `id`, checked against `owner`.
    async fn session_place(
        &self,
        id: Uuid,
        owner: Option<Option<String>>,
        unknown: impl Fn() -> ErrorData,
    ) -> Result<Place, ErrorData> {
        let sandboxes = &self.tools.sandboxes;
        let text = id.to_string();
        if let Some(session) = self.sessions().and_then(|s| s.running_here(id)) {
            if owner.as_ref().is_some_and(|o| *o != session.owner) {
                return Err(unknown());
            }
            let options = AgentOptions::deserialize(session.options.as_ref())
                .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
            return Place::session(sandboxes, id, &options, session.owner.clone())
                .map_err(|e| invalid(e.0));
        }
        let record = self
            .store
            .get_session(id)
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?
            .filter(|r| owner.as_ref().is_none_or(|o| *o == r.owner))
            .ok_or_else(unknown)?;
        if record.status == SessionStatus::Closed {
            return Err(invalid(format!("session '{text}' is closed")));
        }
        let options: AgentOptions = serde_json::from_value(record.options)
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Place::session(sandboxes, id, &options, record.owner).map_err(|e| invalid(e.0))
    }
}
