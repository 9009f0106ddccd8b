//! What the MCP tools need from the server: the sandbox manager, the store
//! (to find the session a call names, and check that the caller owns it),
//! and the limits.

use std::sync::Arc;
use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::ErrorData;
use rmcp::service::RequestContext;
use serde::Deserialize;
use uuid::Uuid;

use crate::agent::AgentOptions;
use crate::config::SandboxConfig;
use crate::protocol::SessionStatus;
use crate::sandbox::manager::SandboxFor;
use crate::sandbox::{Lease, SandboxManager, SandboxSpec};
use crate::session::OptionError;
use crate::store::Store;

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
    pub sandboxes: Arc<SandboxManager>,
    pub store: Arc<dyn Store>,
    /// Bytes of each output stream an execution returns.
    pub max_output_bytes: usize,
    /// Entries a listing, glob or grep returns.
    pub max_entries: usize,
    /// Commands started with `background: true`.
    pub background: super::background::BackgroundRuns,
    /// The `deliberate` tool's; set once the server's sessions exist (the
    /// stdio server of `conclave mcp` has none).
    pub deliberations: std::sync::OnceLock<Arc<crate::deliberation::Deliberations>>,
    /// The `start_pipeline` tool's; set with `deliberations`.
    pub pipelines: std::sync::OnceLock<Arc<crate::pipeline::runs::Runs>>,
    /// The most sessions one `fork_session` call makes (`agent.max_forks`).
    pub max_forks: u32,
    /// The server's sessions, for `run_agent` and the session resources;
    /// set with `deliberations`.
    pub sessions: std::sync::OnceLock<Arc<crate::session::SessionManager>>,
    /// Decides the calls of `run_agent` turns that wait for approval, from
    /// the client's answer to an elicitation; set with `sessions`.
    pub decider: std::sync::OnceLock<crate::agent::decide::Decider>,
}

/// The sandbox a call acts in, as its session's stored record says.
pub struct Target {
    session: Uuid,
    spec: SandboxSpec,
    /// A session's sandbox, with the session's owner, or a scratch one.
    whose: SandboxFor,
    /// The snapshot a new sandbox starts from.
    seed: Option<String>,
    /// The per-exec timeout the session set in `options.sandbox.timeout_s`.
    pub timeout_s: Option<u64>,
}

fn invalid(message: impl Into<String>) -> ErrorData {
    ErrorData::invalid_params(message.into(), None)
}

impl McpHost {
    fn config(&self) -> &SandboxConfig {
        self.sandboxes.config()
    }

    /// The longest exec timeout a call may ask for.
    pub fn max_timeout_s(&self) -> u64 {
        self.config().max_exec_timeout_s
    }

    /// The exec timeout a call asked for, within the configured bounds.
    pub fn timeout(&self, asked: Option<u64>) -> Result<Duration, ErrorData> {
        let config = self.config();
        match asked {
            None => Ok(Duration::from_secs(config.exec_timeout_s)),
            Some(0) => Err(invalid("timeout must be at least 1 second")),
            Some(s) if s > config.max_exec_timeout_s => Err(invalid(format!(
                "timeout must be at most {} seconds",
                config.max_exec_timeout_s
            ))),
            Some(s) => Ok(Duration::from_secs(s)),
        }
    }

    /// The sandbox of the session a call names (checked against the
    /// caller), or the connection's scratch sandbox when it names none.
    pub async fn lease(
        &self,
        caller: &Caller,
        session_id: Option<&str>,
        scratch: Uuid,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Lease, ErrorData> {
        let target = self.target(caller, session_id, scratch, ctx).await?;
        self.lease_target(target).await
    }

    /// Which sandbox a call acts in: the named session's (checked against
    /// the caller; one read of its record, none while its turn runs on
    /// this replica), or the connection's scratch one when it names none.
    pub async fn target(
        &self,
        caller: &Caller,
        session_id: Option<&str>,
        scratch: Uuid,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Target, ErrorData> {
        let Some(text) = session_id else {
            // The key that opened the connection: its `max_sandboxes`
            // counts the scratch sandbox.
            let owner = super::follow::http_owner(caller, ctx).flatten();
            return Ok(Target {
                session: scratch,
                spec: self.sandboxes.default_spec(),
                whose: SandboxFor::Scratch { owner },
                seed: None,
                timeout_s: None,
            });
        };
        let id = Uuid::parse_str(text)
            .map_err(|_| invalid(format!("session_id '{text}' is not a UUID")))?;
        let owner = super::follow::http_owner(caller, ctx);
        let unknown = || invalid(format!("unknown session '{text}'"));
        // A call from a turn running here (the agent's own tools) needs
        // no read: the turn holds the session.
        if let Some(session) = self.sessions.get().and_then(|s| s.running_here(id)) {
            if owner.as_ref().is_some_and(|o| *o != session.owner) {
                return Err(unknown());
            }
            let options = AgentOptions::deserialize(session.options.as_ref())
                .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
            return self.target_of(text, id, options, session.owner.clone());
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
        self.target_of(text, id, options, record.owner)
    }

    /// The sandbox a session's options ask for, or why it has none.
    fn target_of(
        &self,
        text: &str,
        id: Uuid,
        options: AgentOptions,
        owner: Option<String>,
    ) -> Result<Target, ErrorData> {
        if options.sandbox_enabled == Some(false) {
            return Err(invalid(format!(
                "session '{text}' was created with sandbox_enabled: false"
            )));
        }
        let seed = options
            .sandbox
            .as_ref()
            .and_then(|s| s.from_snapshot.clone());
        Ok(Target {
            session: id,
            spec: spec_for(&self.sandboxes, &options).map_err(|e| invalid(e.to_string()))?,
            whose: SandboxFor::Session { owner },
            seed,
            timeout_s: options.sandbox.and_then(|s| s.timeout_s),
        })
    }

    /// Takes the sandbox a [`Target`] names, making it when it is not there.
    pub async fn lease_target(&self, target: Target) -> Result<Lease, ErrorData> {
        let Target {
            session,
            spec,
            whose,
            seed,
            ..
        } = target;
        self.sandboxes
            .lease_from(session, spec, whose, seed.as_deref())
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))
    }
}

/// The sandbox a session's options ask for, within the configured maxima;
/// the error names the option.
pub fn spec_for(
    sandboxes: &SandboxManager,
    options: &AgentOptions,
) -> Result<SandboxSpec, OptionError> {
    let config = sandboxes.config();
    let mut spec = sandboxes.default_spec();
    let Some(asked) = &options.sandbox else {
        return Ok(spec);
    };
    let bad = |field: &str, message: String| {
        OptionError::new(format!("options.sandbox.{field}"), message)
    };
    if let Some(backend) = &asked.backend
        && backend != sandboxes.backend_name()
    {
        return Err(bad(
            "backend",
            format!("this server runs sandboxes on {}", sandboxes.backend_name()),
        ));
    }
    if let Some(image) = &asked.image {
        if image.trim().is_empty() {
            return Err(bad("image", "must not be empty".into()));
        }
        spec.image = image.clone();
    }
    // Floors as well as ceilings: a limit too small to apply (0 CPUs
    // reaches docker as "no limit") must not switch the limit off.
    if let Some(cpus) = asked.cpus {
        if !(cpus >= config.min_cpus && cpus <= config.max_cpus) {
            return Err(bad(
                "cpus",
                format!(
                    "must be {} to {} (sandbox.min_cpus, sandbox.max_cpus)",
                    config.min_cpus, config.max_cpus
                ),
            ));
        }
        spec.cpus = cpus;
    }
    if let Some(memory) = asked.memory_mb {
        if memory < config.min_memory_mb || memory > config.max_memory_mb {
            return Err(bad(
                "memory_mb",
                format!(
                    "must be {} to {} (sandbox.min_memory_mb, sandbox.max_memory_mb)",
                    config.min_memory_mb, config.max_memory_mb
                ),
            ));
        }
        spec.memory_mb = memory;
    }
    if let Some(timeout) = asked.timeout_s
        && (timeout == 0 || timeout > config.max_exec_timeout_s)
    {
        return Err(bad(
            "timeout_s",
            format!("must be 1 to {}", config.max_exec_timeout_s),
        ));
    }
    if asked.network == Some(true) {
        if !config.allow_network {
            return Err(bad(
                "network",
                "this server gives sandboxes no network".into(),
            ));
        }
        spec.network = true;
    }
    Ok(spec)
}
