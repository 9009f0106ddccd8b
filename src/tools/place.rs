//! Which sandbox a call acts in: a session's, made from its options within
//! the configured bounds, or a caller's scratch one.

use uuid::Uuid;

use super::ToolError;
use crate::agent::AgentOptions;
use crate::sandbox::manager::SandboxFor;
use crate::sandbox::{Lease, Result, SandboxManager, SandboxSpec};
use crate::session::OptionError;

/// The sandbox a call acts in.
#[derive(Clone, Debug)]
pub struct Place {
    /// The sandbox's key: the session's id, or the scratch sandbox's.
    id: Uuid,
    /// A session's sandbox, with the session's owner, or a scratch one.
    whose: SandboxFor,
    spec: SandboxSpec,
    /// The snapshot a new sandbox starts from.
    seed: Option<String>,
    /// The per-exec timeout the session set in `options.sandbox.timeout_s`.
    pub timeout_s: Option<u64>,
}

impl Place {
    /// Session `id`'s sandbox, as its options ask for it; `owner` is the
    /// key whose `max_sandboxes` it counts in.
    pub fn session(
        sandboxes: &SandboxManager,
        id: Uuid,
        options: &AgentOptions,
        owner: Option<String>,
    ) -> std::result::Result<Place, ToolError> {
        if options.sandbox_enabled == Some(false) {
            return Err(ToolError(format!(
                "session '{id}' was created with sandbox_enabled: false"
            )));
        }
        let sandbox = options.sandbox.as_ref();
        Ok(Place {
            id,
            whose: SandboxFor::Session { owner },
            spec: spec_for(sandboxes, options).map_err(|e| ToolError(e.to_string()))?,
            seed: sandbox.and_then(|s| s.from_snapshot.clone()),
            timeout_s: sandbox.and_then(|s| s.timeout_s),
        })
    }

    /// A scratch sandbox of the default spec, keyed `id` (an MCP
    /// connection's), counted against `owner`'s `max_sandboxes`.
    pub fn scratch(sandboxes: &SandboxManager, id: Uuid, owner: Option<String>) -> Place {
        Place {
            id,
            whose: SandboxFor::Scratch { owner },
            spec: sandboxes.default_spec(),
            seed: None,
            timeout_s: None,
        }
    }

    /// What the sandbox is made with (its image and limits).
    pub fn spec(&self) -> &SandboxSpec {
        &self.spec
    }

    /// The session whose sandbox this is; `None` for a scratch one.
    pub fn session_id(&self) -> Option<Uuid> {
        match self.whose {
            SandboxFor::Session { .. } => Some(self.id),
            SandboxFor::Scratch { .. } => None,
        }
    }

    /// Whose background runs a call sees: the sandbox's.
    pub fn runs_key(&self) -> String {
        match self.whose {
            SandboxFor::Session { .. } => format!("session:{}", self.id),
            SandboxFor::Scratch { .. } => format!("scratch:{}", self.id),
        }
    }

    /// Takes the sandbox, making it when it is not there.
    pub async fn lease(&self, sandboxes: &SandboxManager) -> Result<Lease> {
        sandboxes
            .lease_from(
                self.id,
                self.spec.clone(),
                self.whose.clone(),
                self.seed.as_deref(),
            )
            .await
    }
}

/// The sandbox a session's options ask for, within the configured maxima;
/// the error names the option.
pub fn spec_for(
    sandboxes: &SandboxManager,
    options: &AgentOptions,
) -> std::result::Result<SandboxSpec, OptionError> {
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
