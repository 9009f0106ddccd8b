//! `[secrets]` and `[keys.NAME.secrets]`: named values a session's sandbox
//! can be given in its environment (`options.sandbox.env`), never shown.
//!
//! Names are matched without regard to case, because the environment's
//! `CONCLAVE_SECRETS__GIT_TOKEN` arrives lower-cased; they are kept upper
//! case. `Debug` prints the names only.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// The shortest value a secret may have: a shorter one would be scrubbed
/// out of ordinary output wherever its few characters appear.
pub const MIN_SECRET_CHARS: usize = 8;

/// Named secrets, their names upper case.
#[derive(Clone, Default, PartialEq, Serialize)]
pub struct SecretMap(BTreeMap<String, String>);

impl SecretMap {
    /// The value of `name` (any case).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(&name.to_ascii_uppercase()).map(String::as_str)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The first secret named badly or too short, as `(name, message)`.
    pub fn invalid(&self) -> Option<(String, String)> {
        self.0.iter().find_map(|(name, value)| {
            let named_well = (1..=64).contains(&name.len())
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            if !named_well {
                Some((
                    name.clone(),
                    "a secret's name is 1 to 64 letters, digits, '_', '-' or '.'".into(),
                ))
            } else if value.chars().count() < MIN_SECRET_CHARS {
                Some((
                    name.clone(),
                    format!("a secret must have at least {MIN_SECRET_CHARS} characters"),
                ))
            } else {
                None
            }
        })
    }
}

impl FromIterator<(String, String)> for SecretMap {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(pairs: I) -> Self {
        SecretMap(
            pairs
                .into_iter()
                .map(|(k, v)| (k.to_ascii_uppercase(), v))
                .collect(),
        )
    }
}

impl std::fmt::Debug for SecretMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// A value may arrive as a number or a boolean from the environment
/// (`CONCLAVE_SECRETS__PIN=12345678`); it is taken as its text. A name
/// given twice in different cases is refused.
impl<'de> Deserialize<'de> for SecretMap {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<SecretMap, D::Error> {
        use serde::de::Error;
        let raw = BTreeMap::<String, Value>::deserialize(deserializer)?;
        let mut secrets = BTreeMap::new();
        for (name, value) in raw {
            let value = match value {
                Value::String(s) => s,
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => return Err(D::Error::custom(format!("secret {name}: must be a string"))),
            };
            let upper = name.to_ascii_uppercase();
            if secrets.insert(upper, value).is_some() {
                return Err(D::Error::custom(format!(
                    "secret {name} is given twice (names are matched without case)"
                )));
            }
        }
        Ok(SecretMap(secrets))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_matched_without_case_and_debug_shows_no_value() {
        let map: SecretMap =
            serde_json::from_value(serde_json::json!({"git_token": "abcdefgh12", "PIN": 12345678}))
                .unwrap();
        assert_eq!(map.get("GIT_TOKEN"), Some("abcdefgh12"));
        assert_eq!(map.get("Git_Token"), Some("abcdefgh12"));
        assert_eq!(map.get("pin"), Some("12345678"));
        let shown = format!("{map:?}");
        assert!(
            shown.contains("GIT_TOKEN") && !shown.contains("abcdefgh12"),
            "{shown}"
        );
        assert!(map.invalid().is_none());
        let short: SecretMap = [("x".to_string(), "short".to_string())]
            .into_iter()
            .collect();
        assert!(short.invalid().unwrap().1.contains("at least 8"));
        let twice = serde_json::from_value::<SecretMap>(
            serde_json::json!({"a_b": "abcdefgh12", "A_B": "abcdefgh34"}),
        );
        assert!(twice.unwrap_err().to_string().contains("twice"));
    }
}
