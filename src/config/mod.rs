//! Typed configuration, read once at start.
//!
//! Sources, later ones winning: built-in defaults, a TOML file
//! (`--config FILE`), `CONCLAVE_*` environment variables (nested keys joined
//! by `__`, e.g. `CONCLAVE_DEMO__CHUNK_DELAY_MS`), the providers' conventional
//! variables (`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `ANTHROPIC_API_KEY`), and
//! last the command-line flags. [`Config::validate`] refuses bad values with a
//! message that names the field.
//!
//! Paths are made absolute here, once, so nothing downstream depends on the
//! working directory: a relative path in the config file is taken from that
//! file's directory; one from the environment, a flag or a default from the
//! working directory at start.
//!
//! This module is data only: it imports no feature module, and features
//! import it. This file holds the top level and loading; each section's
//! type lives beside it: [`gateway`] (`[gateway]` and its pools),
//! [`litellm`] (LiteLLM configs read as pools and written back),
//! [`pipelines`], `bus`, `sandbox`, `keys` (named keys and quotas),
//! `outbound` (MCP servers and A2A agents sessions may use), `telemetry`
//! (OpenTelemetry export), and `sections` (the smaller ones). `validate`
//! holds the checks types cannot make; a check that needs a feature's
//! code (a bus subject pattern) lives with that feature and runs when the
//! server starts (`bus::check_durables`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::magic::RelativePathBuf;
use serde::{Deserialize, Deserializer, Serialize};

mod bus;
pub mod gateway;
mod keys;
pub mod litellm;
mod network;
mod outbound;
pub mod pipelines;
mod sandbox;
mod secrets;
mod sections;
mod telemetry;
mod validate;
pub use bus::{BusConfig, Durable};
pub use gateway::{GatewayConfig, HealthConfig, PoolConfig, ReplicaConfig, Strategy, replica_id};
pub use keys::*;
pub use network::{AllowList, NetworkConfig};
pub use outbound::*;
pub use pipelines::PipelineConfig;
pub use sandbox::*;
pub use secrets::{MIN_SECRET_CHARS, SecretMap};
pub use sections::*;
pub use telemetry::TelemetryConfig;

/// Who a key is to the server: its SHA-256, hex; sessions, traces and
/// approvals belong to it.
pub fn key_owner(key: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(key.trim().as_bytes()))
}
use sections::{default_retries, default_timeout_s};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address the HTTP server binds.
    pub listen: SocketAddr,
    /// A shared store for several replicas: `postgres://user@host/db`
    /// (PostgreSQL). None: SQLite in `data_dir`.
    pub store: Option<String>,
    /// How replicas sharing a store and a bus hand work to each other.
    pub cluster: ClusterConfig,
    /// Where the SQLite store, the instance id and local sandboxes live.
    /// Always absolute once [`Config::load`] has run.
    pub data_dir: PathBuf,
    /// Bearer keys; empty (with no `admin_keys`) means loopback-only and
    /// no auth, the one local user being an admin.
    #[serde(deserialize_with = "string_or_list")]
    pub api_keys: Vec<String>,
    /// Keys that may also administer the gateway's pools (add, remove,
    /// drain, pause, resume replicas; read every key's traces). They are
    /// valid API keys too.
    #[serde(deserialize_with = "string_or_list")]
    pub admin_keys: Vec<String>,
    /// Named keys (`[keys.NAME]`), each with its quota; the name labels
    /// its metrics and usage.
    pub keys: BTreeMap<String, NamedKey>,
    /// The quota of every key that sets none (and of each field a
    /// `[keys.NAME]` leaves out); none applies while auth is off.
    pub default_quota: Quota,
    /// Named secrets (`[secrets]`, `CONCLAVE_SECRETS__NAME`) every key's
    /// sessions may put in their sandbox's environment; `[keys.NAME.secrets]`
    /// adds a key's own.
    pub secrets: SecretMap,
    /// `Host` values the server answers (a name matches any port), against
    /// DNS rebinding; `"*"` answers any. The `listen` address is added when
    /// it is a specific one.
    #[serde(deserialize_with = "string_or_list")]
    pub allowed_hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`) whose pages may make state-changing
    /// requests and open WebSockets, beyond the server's own origin.
    #[serde(deserialize_with = "string_or_list")]
    pub allowed_origins: Vec<String>,
    /// Connection limits and timeouts of the HTTP listener.
    pub http: HttpConfig,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Model used when a session names none; `None` picks `demo` unless a
    /// provider is configured.
    pub default_model: Option<String>,
    pub agent: AgentConfig,
    pub demo: DemoConfig,
    pub openai: Option<ProviderConfig>,
    pub anthropic: Option<ProviderConfig>,
    /// Model aliases (`sonnet`, `qwen`, …) → provider + upstream model.
    pub models: BTreeMap<String, ModelAlias>,
    /// Prices per upstream model name, in USD per million tokens; they
    /// extend and override the built-in table.
    pub prices: BTreeMap<String, Price>,
    pub sandbox: SandboxConfig,
    pub mcp: McpConfig,
    pub a2a: A2aConfig,
    /// Model pools of the OpenAI-compatible gateway.
    pub gateway: GatewayConfig,
    /// Durable bus subjects and the bus's limits.
    pub bus: BusConfig,
    /// Pipelines: test mode, the concurrency cap, the timeout, limits.
    pub pipelines: PipelineConfig,
    /// Named agents (`[agents.NAME]`): a session kind and its options,
    /// which AG-UI, the LangGraph API and `GET /agents` address by name.
    pub agents: BTreeMap<String, AgentProfile>,
    /// OpenTelemetry trace export (`[telemetry]`).
    pub telemetry: TelemetryConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            store: None,
            cluster: ClusterConfig::default(),
            data_dir: PathBuf::from("data"),
            api_keys: Vec::new(),
            admin_keys: Vec::new(),
            keys: BTreeMap::new(),
            default_quota: Quota::builtin_default(),
            secrets: SecretMap::default(),
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            allowed_origins: Vec::new(),
            http: HttpConfig::default(),
            max_body_bytes: 1024 * 1024,
            default_model: None,
            agent: AgentConfig::default(),
            demo: DemoConfig::default(),
            openai: None,
            anthropic: None,
            models: BTreeMap::new(),
            prices: BTreeMap::new(),
            sandbox: SandboxConfig::default(),
            mcp: McpConfig::default(),
            a2a: A2aConfig::default(),
            gateway: GatewayConfig::default(),
            bus: BusConfig::default(),
            pipelines: PipelineConfig::default(),
            agents: BTreeMap::new(),
            telemetry: TelemetryConfig::default(),
        }
    }
}

/// Values given on the command line; each one set overrides every other source.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<SocketAddr>,
    /// `--store`: a PostgreSQL URL.
    pub store: Option<String>,
    /// `--bus`: a NATS URL.
    pub bus: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub sandbox: Option<SandboxBackendKind>,
    /// A LiteLLM config whose `model_list` becomes gateway pools (a pool
    /// of the same name in the config file is replaced).
    pub litellm_config: Option<PathBuf>,
    /// Replaces the built-in default data directory; the file, the
    /// environment and `data_dir` above still win over it.
    pub default_data_dir: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration file {path}: {message}")]
    File { path: String, message: String },
    #[error("invalid configuration: {0}")]
    Invalid(String),
    #[error("invalid configuration: {field}: {message}")]
    Field { field: String, message: String },
    #[error("cannot read the working directory to resolve relative paths: {0}")]
    WorkingDir(std::io::Error),
}

impl Config {
    /// Reads every source in order and validates the result.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
        let cwd = std::env::current_dir().map_err(ConfigError::WorkingDir)?;
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(dir) = &overrides.default_data_dir {
            figment = figment.merge(Serialized::default("data_dir", dir));
        }
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError::File {
                    path: path.display().to_string(),
                    message: "no such file".into(),
                });
            }
            // Absolute, so that paths declared in it resolve against its
            // directory whatever the working directory.
            figment = figment.merge(Toml::file_exact(cwd.join(path)));
        }
        figment = figment.merge(
            Env::prefixed("CONCLAVE_")
                // CONCLAVE_TEST_* and CONCLAVE_BENCH_* belong to the test
                // suite and the benchmarks, not to the server.
                .filter(|key| {
                    let key = key.as_str().to_ascii_lowercase();
                    !key.starts_with("test_") && !key.starts_with("bench_")
                })
                // CONCLAVE_CACHE is the scripts' download and build cache.
                .filter(|key| !key.as_str().eq_ignore_ascii_case("cache"))
                // CONCLAVE_SANDBOX names the backend; the section is `sandbox`.
                .filter(|key| !key.as_str().eq_ignore_ascii_case("sandbox"))
                // CONCLAVE_API_KEY and CONCLAVE_SERVER are what `conclave
                // mcp` relays with (a client's key and its server), not
                // settings of this process.
                .filter(|key| {
                    !key.as_str().eq_ignore_ascii_case("api_key")
                        && !key.as_str().eq_ignore_ascii_case("server")
                })
                .split("__"),
        );
        if let Ok(backend) = std::env::var("CONCLAVE_SANDBOX") {
            figment = figment.merge(Serialized::default(
                "sandbox.backend",
                backend.to_ascii_lowercase(),
            ));
        }
        let mut config: Config = figment.extract().map_err(describe)?;
        config.resolve_declared_paths(&figment)?;
        config.apply_provider_env(|name| std::env::var(name).ok())?;
        config.telemetry.apply_env(|name| std::env::var(name).ok());
        if let Some(listen) = overrides.listen {
            config.listen = listen;
        }
        if let Some(dir) = &overrides.data_dir {
            config.data_dir = dir.clone();
        }
        if let Some(store) = &overrides.store {
            config.store = Some(store.clone());
        }
        if let Some(bus) = &overrides.bus {
            config.bus.url = Some(bus.clone());
        }
        if let Some(backend) = overrides.sandbox {
            config.sandbox.backend = backend;
        }
        if let Some(path) = &overrides.litellm_config {
            let file = |message: String| ConfigError::File {
                path: path.display().to_string(),
                message,
            };
            let text = std::fs::read_to_string(path).map_err(|e| file(e.to_string()))?;
            let imported = litellm::import(&text).map_err(file)?;
            config.gateway.pools.extend(imported.pools);
        }
        config.make_paths_absolute(&cwd)?;
        config.validate()?;
        Ok(config)
    }

    /// Replaces each path the config file declared relative with the same
    /// path under that file's directory; paths from other sources stay as
    /// they are, for [`Config::make_paths_absolute`].
    fn resolve_declared_paths(&mut self, figment: &Figment) -> Result<(), ConfigError> {
        let declared = |key: &str| {
            figment
                .extract_inner::<RelativePathBuf>(key)
                .map(|path| path.relative())
                .map_err(describe)
        };
        self.data_dir = declared("data_dir")?;
        if self.sandbox.local.root.is_some() {
            self.sandbox.local.root = Some(declared("sandbox.local.root")?);
        }
        if self.pipelines.dir.is_some() {
            self.pipelines.dir = Some(declared("pipelines.dir")?);
        }
        Ok(())
    }

    /// Takes every path still relative from `cwd`, the working directory at
    /// start, so that the store, every sandbox backend and `conclave mcp`
    /// see one absolute path whatever directory they later work in.
    fn make_paths_absolute(&mut self, cwd: &Path) -> Result<(), ConfigError> {
        let mut paths = vec![("data_dir", &mut self.data_dir)];
        if let Some(root) = self.sandbox.local.root.as_mut() {
            paths.push(("sandbox.local.root", root));
        }
        if let Some(dir) = self.pipelines.dir.as_mut() {
            paths.push(("pipelines.dir", dir));
        }
        for (field, path) in paths {
            if path.as_os_str().is_empty() {
                return Err(ConfigError::Field {
                    field: field.into(),
                    message: "must not be empty".into(),
                });
            }
            *path = cwd.join(&*path);
        }
        Ok(())
    }

    /// Applies the providers' conventional variables: they make a
    /// provider the config does not name, and override the fields of one it
    /// does (the environment wins over the file, as everywhere else).
    fn apply_provider_env(
        &mut self,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        let openai_url = var("OPENAI_BASE_URL");
        let openai_key = var("OPENAI_API_KEY");
        let openai_model = var("OPENAI_MODEL");
        let openai_harness = var("OPENAI_HARNESS");
        match &mut self.openai {
            Some(openai) => {
                if let Some(url) = openai_url {
                    openai.base_url = url;
                }
                if openai_key.is_some() {
                    openai.api_key = openai_key;
                }
                if openai_model.is_some() {
                    openai.default_model = openai_model;
                }
                if let Some(harness) = openai_harness {
                    openai.harness = Some(parse_harness(&harness)?);
                }
            }
            None if openai_url.is_some() || openai_key.is_some() => {
                self.openai = Some(ProviderConfig {
                    base_url: openai_url.unwrap_or_else(|| "https://api.openai.com/v1".into()),
                    api_key: openai_key,
                    default_model: openai_model,
                    max_retries: default_retries(),
                    timeout_s: default_timeout_s(),
                    harness: openai_harness.as_deref().map(parse_harness).transpose()?,
                });
            }
            None if openai_harness.is_some() => {
                return Err(ConfigError::Field {
                    field: "OPENAI_HARNESS".into(),
                    message: "is set but no OpenAI-compatible provider is (set OPENAI_BASE_URL \
                              or OPENAI_API_KEY, or [openai] in the config)"
                        .into(),
                });
            }
            None => {}
        }
        let anthropic_url = var("ANTHROPIC_BASE_URL");
        match (&mut self.anthropic, var("ANTHROPIC_API_KEY")) {
            (Some(anthropic), key) => {
                if let Some(url) = anthropic_url {
                    anthropic.base_url = url;
                }
                if key.is_some() {
                    anthropic.api_key = key;
                }
            }
            (None, Some(key)) => {
                self.anthropic = Some(ProviderConfig {
                    base_url: anthropic_url.unwrap_or_else(|| "https://api.anthropic.com".into()),
                    api_key: Some(key),
                    default_model: None,
                    max_retries: default_retries(),
                    timeout_s: default_timeout_s(),
                    harness: None,
                });
            }
            (None, None) => {}
        }
        Ok(())
    }
}

/// `OPENAI_HARNESS`'s value.
fn parse_harness(value: &str) -> Result<HarnessKind, ConfigError> {
    match value.trim() {
        "strict" => Ok(HarnessKind::Strict),
        "small" => Ok(HarnessKind::Small),
        other => Err(ConfigError::Field {
            field: "OPENAI_HARNESS".into(),
            message: format!("must be \"strict\" or \"small\", not {other:?}"),
        }),
    }
}

/// Names the field (as a config key) and where its value came from.
fn describe(errors: figment::Error) -> ConfigError {
    let messages: Vec<String> = errors
        .into_iter()
        .map(|e| {
            let field = e.path.join(".").to_lowercase();
            let origin = e
                .metadata
                .as_ref()
                .map(|m| match &m.source {
                    Some(source) => format!(" (from {} {source})", m.name),
                    None => format!(" (from {})", m.name),
                })
                .unwrap_or_default();
            let kind = match &e.kind {
                figment::error::Kind::UnknownField(name, known) => {
                    match crate::words::closest(name, known.iter().copied()) {
                        Some(near) => format!("unknown field `{name}`; did you mean `{near}`?"),
                        None => e.kind.to_string(),
                    }
                }
                kind => crate::words::plain_types(&kind.to_string()),
            };
            if field.is_empty() {
                format!("{kind}{origin}")
            } else {
                format!("{field}: {kind}{origin}")
            }
        })
        .collect();
    ConfigError::Invalid(messages.join("; "))
}

/// Accepts `["a", "b"]` or `"a,b"` (the form an environment variable has).
fn string_or_list<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Keys {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Keys::deserialize(deserializer)? {
        Keys::One(s) => s
            .split(',')
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(String::from)
            .collect(),
        Keys::Many(v) => v,
    })
}

#[cfg(test)]
mod tests;
