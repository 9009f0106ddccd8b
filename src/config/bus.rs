//! The bus's configuration: which subjects are kept, and the limits.

use serde::{Deserialize, Serialize};

/// Subjects whose messages the store keeps, with their retention.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Durable {
    /// A subject pattern (`agent.>`, `sync/*`).
    pub pattern: String,
    /// Messages kept per subject at most; `0` is no limit.
    #[serde(default = "default_max_messages")]
    pub max_messages: u64,
    /// Seconds a message is kept at most; `0` is no limit.
    #[serde(default = "default_max_age_s")]
    pub max_age_s: u64,
}

fn default_max_messages() -> u64 {
    100_000
}

fn default_max_age_s() -> u64 {
    7 * 24 * 3600
}

impl Durable {
    pub fn new(pattern: &str) -> Durable {
        Durable {
            pattern: pattern.to_owned(),
            max_messages: default_max_messages(),
            max_age_s: default_max_age_s(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BusConfig {
    /// A shared bus for several replicas: `nats://host:port` (NATS with
    /// JetStream). None: the embedded in-process bus.
    pub url: Option<String>,
    /// Durable subjects, first match wins. By default those of the
    /// deliberations (`agent.>`, `deliberation.>`) and of the training
    /// loop (`sync.>`, `inference.>`, `rollout.>`).
    pub durable: Vec<Durable>,
    /// Largest message payload, in bytes.
    pub max_payload_bytes: usize,
    /// Messages queued per subscriber before it counts as lagging: it then
    /// catches up from the store on durable subjects, and is told what it
    /// missed on the others.
    pub subscriber_buffer: usize,
    /// Prompts of one rollout sent to the gateway at once.
    pub rollout_concurrency: usize,
    /// How long a rollout without `response_topic` waits for the KV key
    /// `inference_response_topic`.
    pub response_topic_wait_s: u64,
}

impl Default for BusConfig {
    fn default() -> Self {
        BusConfig {
            url: None,
            durable: [
                "agent.>",
                "deliberation.>",
                "sync.>",
                "inference.>",
                "rollout.>",
            ]
            .into_iter()
            .map(Durable::new)
            .collect(),
            max_payload_bytes: 1024 * 1024,
            subscriber_buffer: 1024,
            rollout_concurrency: 64,
            response_topic_wait_s: 300,
        }
    }
}

impl BusConfig {
    /// The first problem found, as `(field, message)`. The durable
    /// patterns are the bus's to parse: it checks them as it starts
    /// (`bus::check_durables`).
    pub fn validate(&self) -> Result<(), (String, String)> {
        if let Some(url) = &self.url {
            let scheme = url.split_once("://").map(|(scheme, _)| scheme);
            if !matches!(scheme, Some("nats" | "tls")) {
                return Err((
                    "bus.url".into(),
                    format!("{url:?} is not a NATS URL (nats://host:port)"),
                ));
            }
        }
        if self.max_payload_bytes == 0 {
            return Err(("bus.max_payload_bytes".into(), "must be at least 1".into()));
        }
        if self.rollout_concurrency == 0 {
            return Err((
                "bus.rollout_concurrency".into(),
                "must be at least 1".into(),
            ));
        }
        if self.subscriber_buffer == 0 {
            return Err(("bus.subscriber_buffer".into(), "must be at least 1".into()));
        }
        Ok(())
    }
}
