//! Which sandbox a call acts in: a session's, made from its options within
//! the configured bounds, or a caller's scratch one.

use std::collections::BTreeMap;

use uuid::Uuid;

use super::ToolError;
use crate::agent::{AgentOptions, EnvValue, NetworkOption};
use crate::config::AllowList;
use crate::sandbox::manager::SandboxFor;
use crate::sandbox::secrets::Scrubber;
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
    /// The environment of every command (`options.sandbox.env`, secrets
    /// resolved).
    env: BTreeMap<String, String>,
    /// Takes the secrets of `env` out of what the tools return.
    scrubber: Scrubber,
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
        let (env, scrubber) = sandbox_env(sandboxes, options, owner.as_deref())
            .map_err(|e| ToolError(e.to_string()))?;
        Ok(Place {
            id,
            spec: spec_for(sandboxes, options).map_err(|e| ToolError(e.to_string()))?,
            whose: SandboxFor::Session { owner },
            seed: sandbox.and_then(|s| s.from_snapshot.clone()),
            timeout_s: sandbox.and_then(|s| s.timeout_s),
            env,
            scrubber,
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
            env: BTreeMap::new(),
            scrubber: Scrubber::default(),
        }
    }

    /// The environment every command of the call's sandbox runs with.
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.env
    }

    /// What takes the session's secrets out of a tool's result.
    pub fn scrubber(&self) -> &Scrubber {
        &self.scrubber
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
    match &asked.network {
        Some(NetworkOption::Switch(true)) => {
            if !config.allow_network {
                return Err(bad(
                    "network",
                    "this server gives sandboxes no network".into(),
                ));
            }
            spec.network = true;
        }
        Some(NetworkOption::Allow(asked)) => {
            spec.egress = Some(allow_list(sandboxes, &asked.allow)?);
            spec.env.extend(crate::sandbox::proxy::proxy_env());
        }
        Some(NetworkOption::Switch(false)) | None => {}
    }
    Ok(spec)
}

/// A session's allow-list, which may only narrow `sandbox.network.allow`,
/// on a backend that can hold a sandbox to the egress proxy.
fn allow_list(
    sandboxes: &SandboxManager,
    entries: &[String],
) -> std::result::Result<AllowList, OptionError> {
    let refuse = |message: &str| Err(OptionError::new("options.sandbox.network", message));
    match sandboxes.backend_name() {
        "kubernetes" => {
            return refuse(
                "the kubernetes backend has no egress proxy: hold sandbox Pods with a NetworkPolicy (deploy/kubernetes/)",
            );
        }
        "local" if !crate::sandbox::local::is_root() => {
            return refuse("the local backend runs the egress proxy only as root");
        }
        _ => {}
    }
    let list = AllowList::parse(entries)
        .map_err(|(i, e)| OptionError::new(format!("options.sandbox.network.allow[{i}]"), e))?;
    let none = AllowList::default();
    let ceiling = sandboxes.proxy().map_or(&none, |proxy| proxy.ceiling());
    if let Some(i) = ceiling.uncovered(&list) {
        return Err(OptionError::new(
            format!("options.sandbox.network.allow[{i}]"),
            format!(
                "{:?} is wider than this server allows (sandbox.network.allow: {:?})",
                entries[i],
                ceiling.to_strings()
            ),
        ));
    }
    Ok(list)
}

/// The environment `options.sandbox.env` gives every command, its secrets
/// read as `owner`'s sessions see them, and the scrubber of those secrets.
/// A name that is not a variable's, or a secret the key does not have, is
/// an error naming it.
pub fn sandbox_env(
    sandboxes: &SandboxManager,
    options: &AgentOptions,
    owner: Option<&str>,
) -> std::result::Result<(BTreeMap<String, String>, Scrubber), OptionError> {
    let Some(asked) = options.sandbox.as_ref().and_then(|s| s.env.as_ref()) else {
        return Ok((BTreeMap::new(), Scrubber::default()));
    };
    let mut env = BTreeMap::new();
    let mut secrets = Vec::new();
    for (name, value) in asked {
        let field = format!("options.sandbox.env.{name}");
        let named_well = (1..=128).contains(&name.len())
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !named_well {
            return Err(OptionError::new(
                field,
                "a variable's name is letters, digits and '_', not starting with a digit",
            ));
        }
        let value = match value {
            EnvValue::Literal(text) => text.clone(),
            EnvValue::Secret(reference) => {
                let secret = reference.secret.to_ascii_uppercase();
                let value = sandboxes.secrets().get(owner, &secret).ok_or_else(|| {
                    OptionError::new(
                        &field,
                        format!(
                            "no secret {} for this key ([secrets] or [keys.NAME.secrets] of the server's config)",
                            reference.secret
                        ),
                    )
                })?;
                secrets.push((secret, value));
                value.to_string()
            }
        };
        if value.contains('\0') {
            return Err(OptionError::new(field, "a value cannot hold a NUL byte"));
        }
        env.insert(name.clone(), value);
    }
    let scrubber = Scrubber::new(secrets.iter().map(|(n, v)| (n.as_str(), *v))).map_err(|e| {
        OptionError::new(
            "options.sandbox.env",
            format!("too many secrets to scrub: {e}"),
        )
    })?;
    Ok((env, scrubber))
}
