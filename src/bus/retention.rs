//! The durable subjects' retentions, parsed from `[bus] durable` once.

use crate::config::BusConfig;

use super::subject::Pattern;

/// Checks `[bus] durable`'s patterns, which the config cannot parse
/// itself; the first bad one as `(field, message)`.
pub fn check_durables(config: &BusConfig) -> Result<(), (String, String)> {
    for (i, durable) in config.durable.iter().enumerate() {
        Pattern::parse(&durable.pattern)
            .map_err(|err| (format!("bus.durable[{i}].pattern"), err.to_string()))?;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Durable;

    #[test]
    fn a_bad_durable_pattern_is_named_by_its_place() {
        let mut config = BusConfig::default();
        assert_eq!(check_durables(&config), Ok(()));
        config.durable.push(Durable::new("agent.>.more"));
        let (field, message) = check_durables(&config).unwrap_err();
        assert_eq!(
            field,
            format!("bus.durable[{}].pattern", config.durable.len() - 1)
        );
        assert!(!message.is_empty());
    }
}
