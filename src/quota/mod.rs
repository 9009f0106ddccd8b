//! Who each key is to the server (its name, whether it administers, its
//! quota) and the error a caller gets past a quota.
//!
//! Quotas apply only with auth on: without keys there is one local user
//! and nobody to share with. A key is known by its hash (its owner id);
//! an owner the config no longer names (a key removed since its sessions
//! were made) has no quota.

mod enforce;

pub use enforce::{HeldSlot, QuotaError, Quotas};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::config::{Config, Quota, key_owner};

/// A configured key, without its secret.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyInfo {
    /// What metrics and `/usage` call it: `[keys.NAME]`'s name, or `key-`
    /// and the start of its hash.
    pub name: String,
    pub admin: bool,
    /// With `[default_quota]` filled in.
    pub quota: Quota,
}

/// Every accepted key by its owner id.
#[derive(Debug, Default)]
pub struct KeyTable {
    by_owner: HashMap<String, Arc<KeyInfo>>,
}

impl KeyTable {
    pub fn new(config: &Config) -> KeyTable {
        // Later entries win: a key in both lists is an admin key.
        let by_owner = config
            .key_entries()
            .into_iter()
            .map(|entry| {
                let info = KeyInfo {
                    name: entry.name,
                    admin: entry.admin,
                    quota: entry.quota,
                };
                (key_owner(entry.secret), Arc::new(info))
            })
            .collect();
        KeyTable { by_owner }
    }

    pub fn is_empty(&self) -> bool {
        self.by_owner.is_empty()
    }

    pub fn get(&self, owner: &str) -> Option<&Arc<KeyInfo>> {
        self.by_owner.get(owner)
    }

    /// The quota that binds `owner`: none while auth is off.
    pub fn quota(&self, owner: Option<&str>) -> Quota {
        owner
            .and_then(|owner| self.get(owner))
            .map(|info| info.quota)
            .unwrap_or_default()
    }

    /// The name `owner` is shown by: `local` while auth is off, `unknown`
    /// for a key the config no longer has. Never the key or its whole
    /// hash.
    pub fn name(&self, owner: Option<&str>) -> String {
        match owner {
            None => "local".into(),
            Some(owner) => self
                .get(owner)
                .map(|info| info.name.clone())
                .unwrap_or_else(|| "unknown".into()),
        }
    }
}

/// A request refused, or a turn ended, because its key is past a quota.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("key {key:?} is past its quota {quota} = {limit}: {why}")]
pub struct QuotaExceeded {
    /// The key's name.
    pub key: String,
    /// The quota's field name in `[keys.NAME]`.
    pub quota: &'static str,
    pub limit: String,
    /// What frees it, in words.
    pub why: String,
    /// When it frees, when that is known (a day's or a minute's end).
    pub reset: Option<DateTime<Utc>>,
    /// How long a client should wait before trying again.
    pub retry_after: Duration,
}

impl QuotaExceeded {
    /// The JSON the error's body carries beside its message.
    pub fn detail(&self) -> serde_json::Value {
        serde_json::json!({
            "quota": self.quota,
            "key": self.key,
            "limit": self.limit,
            "reset": self.reset.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
            "retry_after_s": self.retry_after.as_secs(),
        })
    }
}

/// The start of the next UTC day, when daily quotas reset.
pub fn next_day(now: DateTime<Utc>) -> DateTime<Utc> {
    let tomorrow = now.date_naive().succ_opt().unwrap_or(now.date_naive());
    tomorrow.and_time(chrono::NaiveTime::MIN).and_utc()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NamedKey;

    #[test]
    fn keys_are_known_by_hash_with_their_name_and_resolved_quota() {
        let mut config = Config {
            api_keys: vec!["plain-key-1".into()],
            admin_keys: vec!["plain-key-1".into()],
            ..Config::default()
        };
        config.keys.insert(
            "alice".into(),
            NamedKey {
                key: "alice-key-1".into(),
                admin: false,
                secrets: Default::default(),
                quota: Quota {
                    max_sandboxes: Some(2),
                    ..Quota::default()
                },
            },
        );
        let table = KeyTable::new(&config);
        let alice = table.get(&key_owner("alice-key-1")).unwrap();
        assert_eq!(alice.name, "alice");
        assert_eq!(alice.quota.max_sandboxes, Some(2));
        assert_eq!(alice.quota.storage_mb, Some(1024));
        let plain = table.get(&key_owner("plain-key-1")).unwrap();
        assert!(plain.admin, "a key in both lists administers");
        assert!(plain.name.starts_with("key-"));
        assert!(!plain.name.contains("plain"));
        assert_eq!(table.quota(None), Quota::default());
        assert_eq!(table.name(None), "local");
        assert_eq!(table.name(Some("nobody")), "unknown");
    }

    #[test]
    fn daily_quotas_reset_at_midnight_utc() {
        let now = DateTime::parse_from_rfc3339("2026-11-27T23:59:30Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(next_day(now).to_rfc3339(), "2026-11-28T00:00:00+00:00");
    }
}
