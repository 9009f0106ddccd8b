//! `GET /usage`'s answer: the stored rows summed by key, model or day.

use std::collections::BTreeMap;

use chrono::NaiveDate;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::LOCAL;
use crate::quota::KeyTable;
use crate::store::{UsageCounts, UsageRow};

/// What the rows of a report are sums by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum GroupBy {
    /// By the key's configured name.
    Key,
    Model,
    #[default]
    Day,
}

impl GroupBy {
    pub fn parse(text: &str) -> Option<GroupBy> {
        match text {
            "key" => Some(GroupBy::Key),
            "model" => Some(GroupBy::Model),
            "day" => Some(GroupBy::Day),
            _ => None,
        }
    }
}

/// One group's sums.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct UsageGroup {
    /// The key's name, the model, or the day (`YYYY-MM-DD`).
    pub group: String,
    #[serde(flatten)]
    pub counts: UsageCounts,
}

/// Usage over days `from` through `to` (UTC), by `group_by`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct UsageReport {
    #[schema(value_type = String, format = Date)]
    pub from: NaiveDate,
    #[schema(value_type = String, format = Date)]
    pub to: NaiveDate,
    pub group_by: GroupBy,
    /// In group order: days by date, keys and models by name.
    pub groups: Vec<UsageGroup>,
    pub total: UsageCounts,
}

/// The name a row's owner is shown by: never the key or its hash.
fn key_name(keys: &KeyTable, owner: &str) -> String {
    if owner == LOCAL {
        return keys.name(None);
    }
    keys.name(Some(owner))
}

/// Sums `rows` by `group_by`.
pub fn report(
    rows: &[UsageRow],
    keys: &KeyTable,
    from: NaiveDate,
    to: NaiveDate,
    group_by: GroupBy,
) -> UsageReport {
    let mut groups: BTreeMap<String, UsageCounts> = BTreeMap::new();
    let mut total = UsageCounts::default();
    for row in rows {
        let group = match group_by {
            GroupBy::Key => key_name(keys, &row.owner),
            GroupBy::Model => row.model.clone(),
            GroupBy::Day => row.day.format("%Y-%m-%d").to_string(),
        };
        groups.entry(group).or_default().add(&row.counts);
        total.add(&row.counts);
    }
    UsageReport {
        from,
        to,
        group_by,
        groups: groups
            .into_iter()
            .map(|(group, counts)| UsageGroup { group, counts })
            .collect(),
        total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, NamedKey, key_owner};

    #[test]
    fn rows_sum_by_key_name_model_and_day() {
        let mut config = Config::default();
        config.keys.insert(
            "alice".into(),
            NamedKey {
                key: "alice-key-1".into(),
                admin: false,
                secrets: Default::default(),
                quota: Default::default(),
            },
        );
        let keys = KeyTable::new(&config);
        let day = |d: &str| NaiveDate::parse_from_str(d, "%Y-%m-%d").unwrap();
        let row = |owner: &str, d: &str, model: &str, tokens: u64| UsageRow {
            owner: owner.into(),
            day: day(d),
            model: model.into(),
            counts: UsageCounts {
                input_tokens: tokens,
                ..UsageCounts::default()
            },
        };
        let alice = key_owner("alice-key-1");
        let rows = [
            row(&alice, "2026-11-26", "demo", 1),
            row(&alice, "2026-11-27", "demo", 2),
            row(&alice, "2026-11-27", "big", 4),
            row("gone", "2026-11-27", "demo", 8),
        ];
        let (from, to) = (day("2026-11-26"), day("2026-11-27"));
        let by_key = report(&rows, &keys, from, to, GroupBy::Key);
        let groups: Vec<(&str, u64)> = by_key
            .groups
            .iter()
            .map(|g| (g.group.as_str(), g.counts.input_tokens))
            .collect();
        assert_eq!(groups, [("alice", 7), ("unknown", 8)]);
        assert_eq!(by_key.total.input_tokens, 15);
        let by_model = report(&rows, &keys, from, to, GroupBy::Model);
        assert_eq!(by_model.groups[0].group, "big");
        let by_day = report(&rows, &keys, from, to, GroupBy::Day);
        assert_eq!(by_day.groups[1].group, "2026-11-27");
        assert_eq!(by_day.groups[1].counts.input_tokens, 14);
        let text = serde_json::to_string(&by_key).unwrap();
        assert!(!text.contains(&alice), "a key's hash is never shown");
    }
}
