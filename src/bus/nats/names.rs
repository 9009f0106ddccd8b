//! What the bus's namespaces, subjects and durable classes are called on
//! NATS.
//!
//! A message goes to `<prefix>.bus.<namespace>.<class>.<tokens>`, each
//! name token-encoded. `<class>` is `t` for subjects that are not kept and
//! `d<hash of the pattern>` for those of a durable pattern (the first that
//! matches, as on the embedded bus); each class has its own JetStream
//! stream, so the streams never overlap and each keeps its retention.

use std::fmt::Write as _;
use std::time::Duration;

use async_nats::jetstream::stream::{Config, DiscardPolicy, StorageType};
use sha2::{Digest, Sha256};

use crate::bus::{Pattern, Subject};
use crate::config::BusConfig;

/// How long an idle subject that is not kept remembers its last `seq`
/// (the transient stream keeps the last messages of each subject for it).
const TRANSIENT_MAX_AGE: Duration = Duration::from_secs(3600);

/// Escapes a name into one NATS token: ASCII letters, digits, `-` and `_`
/// stay, every other byte is `~` and two hex digits.
pub(super) fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_' {
            out.push(byte as char);
        } else {
            let _ = write!(out, "~{byte:02X}");
        }
    }
    out
}

/// Reverses [`encode`]; `None` for a text it did not make.
pub(super) fn decode(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        if first == b'~' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(first);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

/// A subject's or pattern's tokens (`*` and `>` kept as NATS wildcards).
fn tokens(text: &str) -> Vec<String> {
    text.split(['.', '/'])
        .map(|token| match token {
            "*" | ">" => token.to_owned(),
            literal => encode(literal),
        })
        .collect()
}

/// Whether some subject may match both patterns (given as tokens).
fn may_overlap(a: &[String], b: &[String]) -> bool {
    match (a.split_first(), b.split_first()) {
        (None, None) => true,
        (Some((x, _)), Some(_)) if x == ">" => true,
        (Some(_), Some((y, _))) if y == ">" => true,
        (Some((x, a_rest)), Some((y, b_rest))) => {
            (x == "*" || y == "*" || x == y) && may_overlap(a_rest, b_rest)
        }
        _ => false,
    }
}

/// Subjects kept with one retention, or those not kept.
pub(super) struct Class {
    /// The subject token of the class (`t`, `d…`).
    token: String,
    /// The durable pattern; `None` for the subjects that are not kept.
    pattern: Option<(Pattern, Vec<String>)>,
    /// The label in the metrics: the pattern, or `transient`.
    pub label: String,
    config: Config,
}

impl Class {
    pub fn durable(&self) -> bool {
        self.pattern.is_some()
    }

    /// The class's JetStream stream as it must exist on the server.
    pub fn stream_config(&self) -> &Config {
        &self.config
    }

    /// Whether a subscriber's pattern may select subjects of this class.
    pub fn may_hold(&self, pattern: &Pattern) -> bool {
        self.pattern
            .as_ref()
            .is_none_or(|(_, own)| may_overlap(own, &tokens(pattern.as_str())))
    }
}

/// Every class, durable ones first in the configured order.
pub(super) struct Names {
    prefix: String,
    classes: Vec<Class>,
}

impl Names {
    /// `prefix` starts every subject and stream name: `conclave`, or a
    /// test's own.
    pub fn new(prefix: &str, config: &BusConfig) -> Names {
        let subjects = |token: &str| vec![format!("{prefix}.bus.*.{token}.>")];
        let mut classes: Vec<Class> = config
            .durable
            .iter()
            .filter_map(|durable| {
                let pattern = Pattern::parse(&durable.pattern).ok()?;
                let hash = Sha256::digest(durable.pattern.as_bytes());
                let token = format!("d{}", hex_prefix(&hash));
                let config = Config {
                    name: format!("{prefix}_bus_{token}"),
                    subjects: subjects(&token),
                    max_messages_per_subject: limit(durable.max_messages),
                    max_age: Duration::from_secs(durable.max_age_s),
                    storage: StorageType::File,
                    discard: DiscardPolicy::Old,
                    ..Config::default()
                };
                let own = tokens(pattern.as_str());
                Some(Class {
                    token,
                    pattern: Some((pattern, own)),
                    label: durable.pattern.clone(),
                    config,
                })
            })
            .collect();
        classes.push(Class {
            token: "t".into(),
            config: Config {
                name: format!("{prefix}_bus_t"),
                subjects: subjects("t"),
                max_messages_per_subject: limit(config.subscriber_buffer as u64),
                max_age: TRANSIENT_MAX_AGE,
                storage: StorageType::Memory,
                discard: DiscardPolicy::Old,
                ..Config::default()
            },
            pattern: None,
            label: "transient".into(),
        });
        Names {
            prefix: prefix.to_owned(),
            classes,
        }
    }

    pub fn classes(&self) -> &[Class] {
        &self.classes
    }

    /// The index of the class a subject (its `.`-separated stream) is in.
    pub fn class_of(&self, stream: &str) -> usize {
        self.classes
            .iter()
            .position(|c| {
                c.pattern
                    .as_ref()
                    .is_none_or(|(pattern, _)| pattern.matches_stream(stream))
            })
            .unwrap_or(self.classes.len() - 1)
    }

    /// The NATS subject a message goes to.
    pub fn subject(&self, namespace: &str, class: &Class, subject: &Subject) -> String {
        format!(
            "{}.bus.{}.{}.{}",
            self.prefix,
            encode(namespace),
            class.token,
            tokens(subject.stream()).join(".")
        )
    }

    /// What a consumer of `class` filters on: one pattern, or every
    /// subject of the namespace in the class (a consumer takes one filter
    /// on NATS 2.9; the subscription then matches the patterns itself).
    pub fn filter(&self, namespace: &str, class: &Class, pattern: Option<&Pattern>) -> String {
        let tail = pattern.map_or_else(|| ">".to_owned(), |p| tokens(p.as_str()).join("."));
        format!(
            "{}.bus.{}.{}.{tail}",
            self.prefix,
            encode(namespace),
            class.token
        )
    }

    /// Where a namespace's KV writes are told to the other replicas.
    pub fn kv_subject(&self, namespace: &str) -> String {
        format!("{}.kv.{}", self.prefix, encode(namespace))
    }

    /// Every namespace's KV writes.
    pub fn kv_all(&self) -> String {
        format!("{}.kv.*", self.prefix)
    }

    /// The namespace of a KV subject.
    pub fn kv_namespace(&self, subject: &str) -> Option<String> {
        let token = subject.strip_prefix(&self.prefix)?.strip_prefix(".kv.")?;
        decode(token)
    }
}

/// 12 hex digits of a hash: enough to tell a few patterns apart.
fn hex_prefix(hash: &[u8]) -> String {
    hash.iter().take(6).fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// A JetStream limit: `0` (none) is `-1` there.
fn limit(value: u64) -> i64 {
    match value {
        0 => -1,
        v => i64::try_from(v).unwrap_or(i64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_nats_tokens_and_back() {
        for text in ["local", "a.b/c", "~x", "é*>", "hash_0-9"] {
            let token = encode(text);
            assert!(
                token
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_~".contains(&b)),
                "{token}"
            );
            assert_eq!(decode(&token).as_deref(), Some(text));
        }
        assert_eq!(encode("a.b"), "a~2Eb");
        assert_eq!(decode("~4"), None);
    }

    #[test]
    fn subjects_land_in_the_first_matching_class() {
        let names = Names::new("conclave", &BusConfig::default());
        let agent = names.class_of("agent.response.completed");
        let other = names.class_of("chatter.x");
        assert!(names.classes()[agent].durable());
        assert!(!names.classes()[other].durable());
        let subject = Subject::parse("agent/response.completed").unwrap();
        let nats = names.subject("k é", &names.classes()[agent], &subject);
        assert!(
            nats.starts_with("conclave.bus.k~20~C3~A9.d")
                && nats.ends_with(".agent.response.completed"),
            "{nats}"
        );
        let pattern = Pattern::parse("agent.*").unwrap();
        assert!(names.classes()[agent].may_hold(&pattern));
        assert!(!names.classes()[names.class_of("sync.x")].may_hold(&pattern));
        assert!(names.classes()[other].may_hold(&pattern));
        assert!(names.classes()[agent].may_hold(&Pattern::parse(">").unwrap()));
        assert!(!names.classes()[agent].may_hold(&Pattern::parse("agent").unwrap()));
    }
}
