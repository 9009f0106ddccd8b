//! The gateway's configuration: `[gateway]` in the TOML file, or a LiteLLM
//! `model_list` loaded with `--litellm-config` (see [`super::litellm`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `[gateway]`: model pools and the trace log.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// A model name clients ask for → the replicas that serve it.
    pub pools: BTreeMap<String, PoolConfig>,
    /// Traces kept in memory, oldest dropped first.
    pub trace_limit: usize,
    /// Bytes of request and response text the kept traces may hold.
    pub trace_max_bytes: usize,
    /// Where replicas added at run time (`POST /gateway/replicas`) may
    /// be: `"public"` (any public address), host names, addresses and
    /// CIDRs. Loopback, private and link-local addresses need an entry;
    /// replicas in this file are the operator's and always allowed. Unset,
    /// public addresses, and loopback ones when the server listens on
    /// loopback (`Config::allowed_upstreams` in the config module).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_upstreams: Option<Vec<String>>,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            pools: BTreeMap::new(),
            trace_limit: 10_000,
            trace_max_bytes: 64 * 1024 * 1024,
            allowed_upstreams: None,
        }
    }
}

/// How a pool picks the replica for a call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Each replica in turn.
    #[default]
    RoundRobin,
    /// A uniformly random replica (LiteLLM's `simple-shuffle`).
    Shuffle,
    /// The replica with the fewest calls in flight.
    LeastOutstanding,
    /// Consistent hashing of the session id with bounded load: a session
    /// stays on one replica, a replica that leaves moves only its own
    /// sessions, and no replica takes more than `affinity_load_factor`
    /// times the mean load. Calls without a session go to the least loaded.
    SessionAffinity,
    /// The less loaded of two replicas drawn at random.
    PowerOfTwo,
    /// The replica last sent the longest prefix of the call's prompt (its
    /// prompt cache likely holds it), unless the pool is out of balance
    /// (`cache_balance_abs`, `cache_balance_rel`).
    PrefixCache,
}

impl Strategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::RoundRobin => "round_robin",
            Strategy::Shuffle => "shuffle",
            Strategy::LeastOutstanding => "least_outstanding",
            Strategy::SessionAffinity => "session_affinity",
            Strategy::PowerOfTwo => "power_of_two",
            Strategy::PrefixCache => "prefix_cache",
        }
    }
}

/// `[gateway.pools.NAME]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    #[serde(default)]
    pub strategy: Strategy,
    /// Further replicas tried after a connect error, a 5xx or a 429, as
    /// long as nothing reached the client yet.
    #[serde(default = "default_retries")]
    pub num_retries: u32,
    /// How long a replica may take to send its response headers.
    #[serde(default = "default_timeout_s")]
    pub timeout_s: u64,
    /// How long a replica that failed a call gets no new calls (a 429's
    /// `Retry-After` wins when longer).
    #[serde(default = "default_cooldown_s")]
    pub cooldown_s: u64,
    #[serde(default)]
    pub health: HealthConfig,
    /// Sampling parameters set on every call (e.g. `logprobs = true`,
    /// `return_token_ids = true` for vLLM); they replace the client's.
    #[serde(default)]
    pub inject: Map<String, Value>,
    /// Drop request fields that are not OpenAI parameters (LiteLLM's
    /// `drop_params`); injected ones are kept.
    #[serde(default)]
    pub drop_params: bool,
    /// Request fields always dropped.
    #[serde(default)]
    pub additional_drop_params: Vec<String>,
    /// `session_affinity` only: how far above the mean load a replica may
    /// go before a session spills to the next one on the ring.
    #[serde(default = "default_load_factor")]
    pub affinity_load_factor: f64,
    /// `prefix_cache` only: the pool is out of balance, and a call goes to
    /// the least loaded replica rather than the one with its prefix, when
    /// the busiest candidate has more than this many calls in flight above
    /// the idlest…
    #[serde(default = "default_balance_abs")]
    pub cache_balance_abs: u64,
    /// …and more than this many times as many.
    #[serde(default = "default_balance_rel")]
    pub cache_balance_rel: f64,
    /// `prefix_cache` only: prompt words remembered per pool (as blocks
    /// of 16, the least recently sent forgotten first).
    #[serde(default = "default_tree_tokens")]
    pub cache_tree_tokens: u64,
    /// How long a call waits while the pool is paused for a weight update
    /// before it fails (`503`).
    #[serde(default = "default_weights_wait_s")]
    pub weights_wait_s: u64,
    #[serde(default)]
    pub replicas: Vec<ReplicaConfig>,
}

fn default_weights_wait_s() -> u64 {
    300
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            strategy: Strategy::default(),
            num_retries: default_retries(),
            timeout_s: default_timeout_s(),
            cooldown_s: default_cooldown_s(),
            health: HealthConfig::default(),
            inject: Map::new(),
            drop_params: false,
            additional_drop_params: Vec::new(),
            affinity_load_factor: default_load_factor(),
            cache_balance_abs: default_balance_abs(),
            cache_balance_rel: default_balance_rel(),
            cache_tree_tokens: default_tree_tokens(),
            weights_wait_s: default_weights_wait_s(),
            replicas: Vec::new(),
        }
    }
}

/// One inference server of a pool.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReplicaConfig {
    /// Unique across the gateway; `{pool}-{index}` when not given.
    #[serde(default)]
    pub id: Option<String>,
    /// The OpenAI-compatible base URL, `http://host:port/v1`.
    pub url: String,
    /// The model name the replica serves; the pool's name when not given.
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub api_key: Option<String>,
}

/// Active health checks: `GET {url}{path}` every interval.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    pub enabled: bool,
    /// Appended to the replica's URL.
    pub path: String,
    pub interval_ms: u64,
    pub timeout_ms: u64,
    /// Consecutive failed checks that take a replica out.
    pub failure_threshold: u32,
    /// Consecutive passed checks that bring it back.
    pub success_threshold: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            enabled: true,
            path: "/models".into(),
            interval_ms: 5_000,
            timeout_ms: 2_000,
            failure_threshold: 3,
            success_threshold: 2,
        }
    }
}

fn default_retries() -> u32 {
    3
}

fn default_timeout_s() -> u64 {
    600
}

fn default_cooldown_s() -> u64 {
    30
}

fn default_load_factor() -> f64 {
    1.25
}

fn default_balance_abs() -> u64 {
    32
}

fn default_balance_rel() -> f64 {
    1.5
}

fn default_tree_tokens() -> u64 {
    1 << 20
}

impl GatewayConfig {
    /// Checks what serde cannot: URLs, unique ids, thresholds. Messages
    /// name the field.
    pub fn validate(&self) -> Result<(), String> {
        let mut ids = std::collections::HashSet::new();
        for (name, pool) in &self.pools {
            let field = format!("gateway.pools.{name}");
            if pool.affinity_load_factor < 1.0 || !pool.affinity_load_factor.is_finite() {
                return Err(format!("{field}.affinity_load_factor must be at least 1.0"));
            }
            if pool.cache_balance_rel < 1.0 || !pool.cache_balance_rel.is_finite() {
                return Err(format!("{field}.cache_balance_rel must be at least 1.0"));
            }
            if pool.cache_tree_tokens < 16 {
                return Err(format!("{field}.cache_tree_tokens must be at least 16"));
            }
            if pool.health.failure_threshold == 0 || pool.health.success_threshold == 0 {
                return Err(format!("{field}.health thresholds must be at least 1"));
            }
            if pool.health.interval_ms == 0 || pool.health.timeout_ms == 0 {
                return Err(format!(
                    "{field}.health.interval_ms and timeout_ms must be above 0"
                ));
            }
            for (index, replica) in pool.replicas.iter().enumerate() {
                let field = format!("{field}.replicas[{index}]");
                check_url(&replica.url).map_err(|e| format!("{field}.url: {e}"))?;
                let id = replica_id(name, index, replica);
                if !ids.insert(id.clone()) {
                    return Err(format!("{field}.id: {id:?} is used twice"));
                }
            }
        }
        Ok(())
    }
}

/// A replica's id: its own, else `{pool}-{index}`.
pub fn replica_id(pool: &str, index: usize, replica: &ReplicaConfig) -> String {
    replica
        .id
        .clone()
        .unwrap_or_else(|| format!("{pool}-{index}"))
}

/// An http(s) URL with a host.
pub fn check_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(format!("{url:?} must be an http(s) URL with a host"));
    }
    Ok(())
}
