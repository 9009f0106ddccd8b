//! `[keys.NAME]`: named API keys with their quotas, and `[default_quota]`
//! for the keys that set none.
//!
//! A name is what operators see (metrics labels, `/usage`); the key itself
//! is a secret and never leaves the config.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// What one key may hold or spend. A field left out of `[keys.NAME]`
/// takes `[default_quota]`'s value; `0` means no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Quota {
    /// Sessions the key has loaded and not closed, across replicas.
    pub max_concurrent_sessions: Option<u64>,
    /// Live sandboxes of the key's sessions, across replicas.
    pub max_sandboxes: Option<u64>,
    /// Turns of the key's sessions running at once, across replicas.
    pub max_concurrent_turns: Option<u64>,
    /// Model tokens (input + output) per UTC day, agent turns and gateway
    /// calls together.
    pub tokens_per_day: Option<u64>,
    /// Model spend per UTC day, in USD, at the configured prices.
    pub usd_per_day: Option<f64>,
    /// Gateway requests (`/v1/…`, `/meta/…`) per minute.
    pub requests_per_minute: Option<u64>,
    /// Bus messages kept and KV values, in MiB.
    pub storage_mb: Option<u64>,
    /// Agent calls of the key's deliberations running at once (a
    /// deliberation of N agents and R critique rounds makes N x (R + 1)).
    pub max_deliberation_calls: Option<u64>,
    /// Named workspace snapshots the key keeps (their bytes count in
    /// `storage_mb`).
    pub max_named_snapshots: Option<u64>,
}

impl Quota {
    /// The built-in `[default_quota]`: a key can never take every sandbox
    /// slot, all the disk nor every deliberation place; the rest is
    /// unlimited.
    pub fn builtin_default() -> Quota {
        Quota {
            max_sandboxes: Some(16),
            storage_mb: Some(1024),
            // Two of the largest deliberations.
            max_deliberation_calls: Some(4096),
            max_named_snapshots: Some(100),
            ..Quota::default()
        }
    }

    /// Each field this quota leaves unset taken from `default`, and `0`
    /// turned into "no limit" (`None`).
    pub fn resolve(&self, default: &Quota) -> Quota {
        fn pick<T: Copy + PartialOrd + Default>(own: Option<T>, default: Option<T>) -> Option<T> {
            own.or(default).filter(|v| *v > T::default())
        }
        Quota {
            max_concurrent_sessions: pick(
                self.max_concurrent_sessions,
                default.max_concurrent_sessions,
            ),
            max_sandboxes: pick(self.max_sandboxes, default.max_sandboxes),
            max_concurrent_turns: pick(self.max_concurrent_turns, default.max_concurrent_turns),
            tokens_per_day: pick(self.tokens_per_day, default.tokens_per_day),
            usd_per_day: pick(self.usd_per_day, default.usd_per_day),
            requests_per_minute: pick(self.requests_per_minute, default.requests_per_minute),
            storage_mb: pick(self.storage_mb, default.storage_mb),
            max_deliberation_calls: pick(
                self.max_deliberation_calls,
                default.max_deliberation_calls,
            ),
            max_named_snapshots: pick(self.max_named_snapshots, default.max_named_snapshots),
        }
    }

    /// The first field that is negative or not finite, by name.
    pub fn invalid_field(&self) -> Option<&'static str> {
        self.usd_per_day
            .filter(|usd| !usd.is_finite() || *usd < 0.0)
            .map(|_| "usd_per_day")
    }
}

/// `[keys.NAME]`: the secret, whether it administers, and its quota's
/// fields beside them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NamedKey {
    /// The bearer token clients send.
    pub key: String,
    /// May administer the gateway's pools and read every key's traces and
    /// usage.
    pub admin: bool,
    /// Secrets only this key's sessions may use (`[keys.NAME.secrets]`).
    #[serde(skip_serializing_if = "super::SecretMap::is_empty")]
    pub secrets: super::SecretMap,
    #[serde(flatten)]
    pub quota: Quota,
}

/// By hand, because serde cannot refuse unknown fields of a struct with a
/// flattened one: `key` and `admin` are taken out and the rest must be a
/// [`Quota`], whose unknown fields are refused.
impl<'de> Deserialize<'de> for NamedKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<NamedKey, D::Error> {
        use serde::de::Error;
        let mut fields = Map::<String, Value>::deserialize(deserializer)?;
        let key = match fields.remove("key") {
            Some(Value::String(key)) => key,
            // The environment's `CONCLAVE_KEYS__NAME__KEY=12345678` reads
            // as a number.
            Some(Value::Number(key)) => key.to_string(),
            Some(_) => return Err(D::Error::custom("`key` must be a string")),
            None => return Err(D::Error::missing_field("key")),
        };
        let admin = match fields.remove("admin") {
            Some(Value::Bool(admin)) => admin,
            Some(_) => return Err(D::Error::custom("`admin` must be true or false")),
            None => false,
        };
        let secrets = match fields.remove("secrets") {
            Some(secrets) => serde_json::from_value(secrets).map_err(D::Error::custom)?,
            None => super::SecretMap::default(),
        };
        let quota = serde_json::from_value(Value::Object(fields)).map_err(D::Error::custom)?;
        Ok(NamedKey {
            key,
            admin,
            secrets,
            quota,
        })
    }
}

/// One accepted key as the server sees it: from `api_keys`, `admin_keys`
/// or `[keys.NAME]`.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyEntry<'a> {
    pub secret: &'a str,
    pub admin: bool,
    /// `[keys.NAME]`'s name, or `key-` and the start of the key's hash for
    /// a key of the lists (never the key itself).
    pub name: String,
    /// With `[default_quota]` filled in.
    pub quota: Quota,
}

impl super::Config {
    /// Every accepted key: the lists' first, then the named ones.
    pub fn key_entries(&self) -> Vec<KeyEntry<'_>> {
        let default = self.default_quota.resolve(&Quota::default());
        let listed = self
            .api_keys
            .iter()
            .map(|k| (k, false))
            .chain(self.admin_keys.iter().map(|k| (k, true)));
        let mut entries: Vec<KeyEntry> = listed
            .map(|(secret, admin)| KeyEntry {
                secret: secret.trim(),
                admin,
                name: format!("key-{}", &super::key_owner(secret)[..12]),
                quota: default,
            })
            .collect();
        entries.extend(self.keys.iter().map(|(name, key)| KeyEntry {
            secret: key.key.trim(),
            admin: key.admin,
            name: name.clone(),
            quota: key.quota.resolve(&self.default_quota),
        }));
        entries
    }

    /// The keys' checks, as `(field, message)`: none while listening
    /// beyond loopback; each long enough, named well, found once, with a
    /// quota that makes sense.
    pub(super) fn validate_keys(&self) -> Result<(), (String, String)> {
        let entries = self.key_entries();
        if entries.is_empty() && !self.listen.ip().is_loopback() {
            return Err((
                "listen".into(),
                format!(
                    "{} is not a loopback address and no api_keys are configured; \
                     set CONCLAVE_API_KEYS (or api_keys in the config file) to listen there",
                    self.listen
                ),
            ));
        }
        for (list, keys) in [
            ("api_keys", &self.api_keys),
            ("admin_keys", &self.admin_keys),
        ] {
            if let Some(i) = keys.iter().position(|k| k.trim().len() < 8) {
                return Err((
                    format!("{list}[{i}]"),
                    "a key must have at least 8 characters".into(),
                ));
            }
        }
        for (name, key) in &self.keys {
            let at = format!("keys.{name}");
            let named_well = (1..=64).contains(&name.len())
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !named_well {
                return Err((
                    at,
                    "a key's name is 1 to 64 letters, digits, '-', '_' or '.'".into(),
                ));
            }
            if key.key.trim().len() < 8 {
                return Err((
                    format!("{at}.key"),
                    "a key must have at least 8 characters".into(),
                ));
            }
            if let Some((secret, message)) = key.secrets.invalid() {
                return Err((format!("{at}.secrets.{secret}"), message));
            }
            if let Some(bad) = key.quota.invalid_field() {
                return Err((format!("{at}.{bad}"), "must be a number ≥ 0".into()));
            }
        }
        if let Some((secret, message)) = self.secrets.invalid() {
            return Err((format!("secrets.{secret}"), message));
        }
        if let Some(bad) = self.default_quota.invalid_field() {
            return Err((
                format!("default_quota.{bad}"),
                "must be a number ≥ 0".into(),
            ));
        }
        // A named key also listed, or named twice, would give one caller
        // two names and quotas. (A key in both lists is an admin key, as
        // it always was.)
        let listed = self.api_keys.len() + self.admin_keys.len();
        for (i, entry) in entries.iter().enumerate().skip(listed) {
            if entries[..i].iter().any(|e| e.secret == entry.secret) {
                return Err((
                    format!("keys ({})", entry.name),
                    "the same key is configured twice".into(),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use figment::Figment;
    use figment::providers::{Format, Toml};

    fn parse(text: &str) -> Result<NamedKey, String> {
        Figment::from(Toml::string(text))
            .extract()
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_named_key_takes_its_quota_beside_it_and_refuses_unknown_fields() {
        let key: NamedKey =
            parse("key = \"secret-1234\"\nadmin = true\nmax_sandboxes = 2\nusd_per_day = 1.5")
                .unwrap();
        assert_eq!(key.key, "secret-1234");
        assert!(key.admin);
        assert_eq!(key.quota.max_sandboxes, Some(2));
        assert_eq!(key.quota.usd_per_day, Some(1.5));
        let wrong = parse("key = \"secret-1234\"\nmax_sandbox = 2");
        assert!(wrong.unwrap_err().contains("max_sandbox"));
        assert!(parse("admin = true").is_err());
    }

    #[test]
    fn unset_fields_fall_back_to_the_default_and_zero_means_unlimited() {
        let own = Quota {
            max_sandboxes: Some(0),
            tokens_per_day: Some(1000),
            ..Quota::default()
        };
        let resolved = own.resolve(&Quota::builtin_default());
        assert_eq!(resolved.max_sandboxes, None);
        assert_eq!(resolved.tokens_per_day, Some(1000));
        assert_eq!(resolved.storage_mb, Some(1024));
        assert_eq!(resolved.max_concurrent_turns, None);
    }
}
