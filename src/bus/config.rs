//! The bus's configuration: which subjects are kept, and the limits.

use serde::{Deserialize, Serialize};

use super::subject::Pattern;

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
    fn new(pattern: &str) -> Durable {
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
    /// The first problem found, as `(field, message)`.
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
        for (i, durable) in self.durable.iter().enumerate() {
            Pattern::parse(&durable.pattern)
                .map_err(|err| (format!("bus.durable[{i}].pattern"), err.to_string()))?;
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

/// A durable subject's retention, resolved.
#[derive(Debug, Clone)]
pub(super) struct Retention {
    /// The configured pattern: the subject's class in the metrics.
    pub class: String,
    pub max_messages: u64,
    pub max_age: Option<chrono::Duration>,
}

/// The durable patterns, parsed once.
#[derive(Debug, Clone)]
pub(crate) struct Retentions(Vec<(Pattern, Retention)>);

impl Retentions {
    pub fn new(config: &BusConfig) -> Retentions {
        Retentions(
            config
                .durable
                .iter()
                .filter_map(|d| {
                    let pattern = Pattern::parse(&d.pattern).ok()?;
                    let max_age = (d.max_age_s > 0)
                        .then(|| chrono::Duration::try_seconds(d.max_age_s as i64))
                        .flatten();
                    Some((
                        pattern,
                        Retention {
                            class: d.pattern.clone(),
                            max_messages: d.max_messages,
                            max_age,
                        },
                    ))
                })
                .collect(),
        )
    }

    /// Whether a stream's messages are kept.
    pub(crate) fn keeps(&self, stream: &str) -> bool {
        self.of(stream).is_some()
    }

    /// The retention of a stream; `None` when it is not durable.
    pub(super) fn of(&self, stream: &str) -> Option<&Retention> {
        self.0
            .iter()
            .find(|(pattern, _)| pattern.matches_stream(stream))
            .map(|(_, retention)| retention)
    }
}
