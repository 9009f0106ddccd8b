//! The configuration's smaller sections: `[http]`, `[cluster]`, `[agent]`,
//! `[demo]`, the providers, model aliases and prices, and named agents.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::protocol::events::Tokens;

/// The HTTP listener's defences against clients that hold connections.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Open connections at most; `0` takes the open-file limit less a
    /// reserve for the store, sandboxes and upstream calls.
    pub max_connections: usize,
    /// Open connections one client address may hold; `0` is half of
    /// `max_connections`. Behind a reverse proxy every client shares the
    /// proxy's address: raise it there.
    pub max_connections_per_client: usize,
    /// Seconds a client has to send a request's headers.
    pub header_timeout_s: u64,
    /// Seconds a client has to send a request's whole body.
    pub body_timeout_s: u64,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_connections: 0,
            max_connections_per_client: 0,
            header_timeout_s: 10,
            body_timeout_s: 30,
        }
    }
}

/// Replicas sharing a store and a bus (`store = "postgres://…"`,
/// `bus.url = "nats://…"`): how they hand work to each other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Seconds a replica's hold on a running turn lasts unless renewed
    /// (it renews at a third of that). When a replica dies mid-turn, the
    /// turn is closed as `interrupted` this long after its last renewal,
    /// and the session takes messages again on any replica.
    pub turn_lease_s: u64,
    /// Seconds a replica told to stop (SIGTERM) lets running turns finish
    /// before it interrupts them; `/ready` answers 503 from the start.
    pub drain_s: u64,
    /// Seconds a job (a deliberation agent's model call, a test-mode
    /// pipeline node) may go without word from the replica doing it (it
    /// tells the queue every third of that) before the queue hands it to
    /// another replica: how long a replica's death delays its jobs.
    pub job_ack_wait_s: u64,
    /// Jobs one replica does at once, for whichever replica asked.
    pub max_jobs: usize,
    /// PostgreSQL connections one replica holds at most (`--store`); by
    /// default twice the replica's cores, from 4 to 16 (see
    /// [`ClusterConfig::store_connections`]). Every replica's count, added
    /// up, must fit the server's `max_connections`.
    pub store_connections: Option<u32>,
    /// The URL the other replicas reach this one at (`http://10.0.0.5:8080`),
    /// for requests only this replica can answer: the live workspace of a
    /// session whose sandbox is here, which another replica passes on.
    /// Default: the listen address when it names one host (not `0.0.0.0`
    /// or `::`); without either, such a request on another replica is a
    /// 409 naming this one.
    pub advertise_url: Option<String>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            turn_lease_s: 15,
            drain_s: 30,
            job_ack_wait_s: 10,
            max_jobs: 64,
            store_connections: None,
            advertise_url: None,
        }
    }
}

impl ClusterConfig {
    /// The PostgreSQL connections one replica holds at most: as set, or
    /// twice the cores this process may use, from 4 to 16. A connection
    /// is busy only for a statement, and a database server runs about two
    /// statements a core at once (one on the CPU while the other waits for
    /// its commit to reach the disk); connections past that only queue
    /// inside PostgreSQL, where every backend more costs each statement
    /// CPU (benches/notes/scale-out-pool-and-wakeups.md, "Sixth round": three replicas of 16 each on
    /// two cores spent 1.7 times the backend CPU per turn that one did).
    pub fn store_connections(&self) -> u32 {
        self.store_connections.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            u32::try_from(cores * 2).unwrap_or(u32::MAX).clamp(4, 16)
        })
    }

    /// The first problem found, as `(field, message)`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if !(3..=3600).contains(&self.turn_lease_s) {
            return Err((
                "cluster.turn_lease_s".into(),
                format!("must be 3 to 3600 seconds, not {}", self.turn_lease_s),
            ));
        }
        if self.drain_s > 3600 {
            return Err((
                "cluster.drain_s".into(),
                format!("must be at most 3600 seconds, not {}", self.drain_s),
            ));
        }
        if !(1..=600).contains(&self.job_ack_wait_s) {
            return Err((
                "cluster.job_ack_wait_s".into(),
                format!("must be 1 to 600 seconds, not {}", self.job_ack_wait_s),
            ));
        }
        if let Some(url) = &self.advertise_url {
            let parsed = url::Url::parse(url).ok();
            let fits = parsed.as_ref().is_some_and(|u| {
                matches!(u.scheme(), "http" | "https")
                    && u.host().is_some()
                    && u.path() == "/"
                    && u.query().is_none()
            });
            if !fits {
                return Err((
                    "cluster.advertise_url".into(),
                    format!("must be an http(s) URL of a host and port with no path, not '{url}'"),
                ));
            }
        }
        if !(1..=4096).contains(&self.max_jobs) {
            return Err((
                "cluster.max_jobs".into(),
                format!("must be 1 to 4096, not {}", self.max_jobs),
            ));
        }
        if let Some(n) = self.store_connections
            && !(1..=1000).contains(&n)
        {
            return Err((
                "cluster.store_connections".into(),
                format!("must be 1 to 1000, not {n}"),
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// Model calls per turn when a session sets no `max_turns`.
    pub max_turns: u32,
    /// Bytes of a tool result kept in the conversation and in events.
    pub max_tool_output_bytes: usize,
    /// Cap on tokens per model call when a session sets no `max_tokens`:
    /// a weak model that repeats itself stops here, not at its context end.
    pub max_tokens: u32,
    /// Wall-clock limit of one turn; past it the turn ends `timed_out`.
    pub turn_timeout_s: u64,
    /// How often a `status` event tells a client that a model call is still
    /// streaming when it does not receive `text_delta` events.
    pub status_interval_ms: u64,
    /// How long a finished `/agent/run` session stays listed and readable
    /// before it is deleted; 0 keeps them forever.
    pub ephemeral_retention_s: u64,
    /// Tool calls run from one model reply; exact repeats count once, the
    /// rest are dropped with a note (a weak model may repeat one call until
    /// its tokens run out).
    pub max_tool_calls_per_reply: u32,
    /// Which tool calls wait for a decision: the default policy of
    /// sessions that set no `permissions`, and per API key a policy its
    /// sessions cannot loosen.
    pub permissions: crate::permission::ServerPermissions,
    /// The most sessions one fork request may make (`count`).
    pub max_forks: u32,
    /// The share of a model's context window (less `max_tokens`) past
    /// which the older part of a session's history is summarised before
    /// the next model call; sessions may turn it off
    /// (`options.compaction = "off"`).
    pub compact_at: f64,
    /// The model that writes those summaries; the session's own when
    /// unset.
    pub compaction_model: Option<String>,
    /// The context window, in tokens, of a model whose window is known
    /// neither from `models.NAME.context_window`, nor from its server,
    /// nor from the built-in table (a warning names the setting).
    pub context_window: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DemoConfig {
    /// Pause between streamed chunks, so tests and benchmarks can hold a
    /// turn open.
    pub chunk_delay_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    pub base_url: String,
    #[serde(default)]
    pub api_key: Option<String>,
    /// Model used for a session that names none, when this provider is the
    /// default one.
    #[serde(default)]
    pub default_model: Option<String>,
    #[serde(default = "default_retries")]
    pub max_retries: u32,
    #[serde(default = "default_timeout_s")]
    pub timeout_s: u64,
    /// The harness of the models this provider serves that no
    /// `[models.NAME]` gives one (`OPENAI_HARNESS` for `[openai]`): `small`
    /// for a small local model behind `OPENAI_BASE_URL`. Unset: `strict`.
    #[serde(default)]
    pub harness: Option<HarnessKind>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    #[default]
    Openai,
    Anthropic,
    Demo,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelAlias {
    pub provider: ProviderKind,
    /// The upstream model name.
    pub model: String,
    /// Overrides the provider's base URL for this alias.
    #[serde(default)]
    pub base_url: Option<String>,
    #[serde(default)]
    pub api_key: Option<String>,
    /// How the agent loop treats this model's replies: `strict` (unset)
    /// runs what the model asked for and nothing else; `small` adds the
    /// aids a weak model needs, each one reported as it acts.
    #[serde(default)]
    pub harness: Option<HarnessKind>,
    /// Deprecated: `json_schema` now means `harness = "small"` with every
    /// reply constrained to an answer or one call.
    #[serde(default)]
    pub tool_call_mode: ToolCallMode,
    /// The tools offered to a session of this model that sets no
    /// `allowed_tools` (all of them when unset). Small models do better
    /// with two tools than with ten.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Deprecated: `true` now means `harness = "small"`, which asks for
    /// the answer after a call that printed.
    #[serde(default)]
    pub answer_after_output: bool,
    /// The model's context window in tokens, when its server does not
    /// report it (vLLM and llama-server do) and the built-in table does
    /// not know it.
    #[serde(default)]
    pub context_window: Option<u64>,
}

impl ModelAlias {
    /// The harness this alias runs under: `harness`, else `small` when a
    /// deprecated small-model key asks for one of its aids.
    pub fn harness(&self) -> HarnessKind {
        self.harness_or(HarnessKind::Strict)
    }

    /// As [`ModelAlias::harness`], with `provider`'s (its `harness`) where
    /// the alias sets neither.
    pub fn harness_or(&self, provider: HarnessKind) -> HarnessKind {
        self.harness
            .unwrap_or(if self.deprecated_keys().is_empty() {
                provider
            } else {
                HarnessKind::Small
            })
    }

    /// The deprecated keys this alias sets to something other than their
    /// default, as `key = value`.
    pub fn deprecated_keys(&self) -> Vec<&'static str> {
        let mut keys = Vec::new();
        if self.tool_call_mode == ToolCallMode::JsonSchema {
            keys.push("tool_call_mode = \"json_schema\"");
        }
        if self.answer_after_output {
            keys.push("answer_after_output = true");
        }
        keys
    }
}

/// The agent loop's treatment of a model (`models.NAME.harness`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum HarnessKind {
    /// Every call the model makes runs; calls come only from the
    /// provider's tool-call channel; the turn's result is the model's own
    /// text.
    #[default]
    Strict,
    /// The strict loop plus the aids a small model needs (calls read from
    /// text, fuzzy names, loop cuts, the answer asked for, repairs of
    /// Python cells ...), each reported as an `intervention` event.
    Small,
}

pub(super) fn default_retries() -> u32 {
    3
}

pub(super) fn default_timeout_s() -> u64 {
    600
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            max_turns: 20,
            max_tool_output_bytes: 64 * 1024,
            max_tokens: 4096,
            turn_timeout_s: 600,
            status_interval_ms: 5000,
            ephemeral_retention_s: 24 * 3600,
            max_tool_calls_per_reply: 8,
            permissions: crate::permission::ServerPermissions::default(),
            max_forks: 64,
            compact_at: 0.8,
            compaction_model: None,
            context_window: 8192,
        }
    }
}

/// How a request asks for tool calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallMode {
    /// The API's native tool calling.
    #[default]
    Native,
    /// Constrain the whole output with a JSON schema (`response_format`) that
    /// is either a final answer or one tool call.
    JsonSchema,
}

/// USD per million tokens. Input read from or written to a prompt cache
/// costs `input_per_mtok` where its own price is not given.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_per_mtok: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_per_mtok: Option<f64>,
}

impl Price {
    /// Input and output alone, cache reads and writes at the input price.
    pub fn new(input_per_mtok: f64, output_per_mtok: f64) -> Price {
        Price {
            input_per_mtok,
            output_per_mtok,
            cache_read_per_mtok: None,
            cache_write_per_mtok: None,
        }
    }

    /// What one call's tokens cost: the cached part of the input at the
    /// cache's prices, the rest at the input price.
    pub fn cost(&self, tokens: &Tokens) -> f64 {
        let cached = tokens.cache_read + tokens.cache_write;
        let plain = tokens.input.saturating_sub(cached);
        let read = self.cache_read_per_mtok.unwrap_or(self.input_per_mtok);
        let write = self.cache_write_per_mtok.unwrap_or(self.input_per_mtok);
        (plain as f64 * self.input_per_mtok
            + tokens.cache_read as f64 * read
            + tokens.cache_write as f64 * write
            + tokens.output as f64 * self.output_per_mtok)
            / 1_000_000.0
    }
}

/// One configured agent (`[agents.NAME]`), resolved by name in the
/// agent module's `profiles`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentProfile {
    /// What the agent is for, shown to clients that list agents.
    pub description: Option<String>,
    /// The kind of its sessions (default `agent`).
    pub kind: Option<String>,
    /// Session options, as `POST /agent/session` takes them (`model`,
    /// `system_prompt`, `allowed_tools`, `permissions`, `sandbox`, …).
    pub options: Map<String, Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_input_costs_the_cache_prices_and_the_input_price_without_them() {
        let tokens = Tokens {
            input: 1_000_000,
            output: 1_000_000,
            cache_read: 600_000,
            cache_write: 100_000,
        };
        let plain = Price::new(3.0, 15.0);
        assert!((plain.cost(&tokens) - 18.0).abs() < 1e-9);
        let cached = Price {
            cache_read_per_mtok: Some(0.3),
            cache_write_per_mtok: Some(3.75),
            ..plain
        };
        let expected = 0.3 * 3.0 + 0.6 * 0.3 + 0.1 * 3.75 + 15.0;
        assert!((cached.cost(&tokens) - expected).abs() < 1e-9);
    }
}
