//! Usage per key: one row per (owner, UTC day, model) of what the key
//! spent, added to atomically by every replica at once.

use async_trait::async_trait;
use chrono::NaiveDate;
use serde::Serialize;
use utoipa::ToSchema;

use super::StoreError;

/// What a key spent: tokens, cost, turns, tool calls and sandbox time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, ToSchema)]
pub struct UsageCounts {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Of the calls to priced models only.
    pub cost_usd: f64,
    /// Turns finished.
    pub turns: u64,
    pub tool_calls: u64,
    /// CPU time of the key's sandboxes, counted when each is removed.
    pub sandbox_cpu_s: f64,
    /// How long the key's sandboxes lived, counted when each is removed.
    pub sandbox_wall_s: f64,
}

impl UsageCounts {
    pub fn add(&mut self, other: &UsageCounts) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cost_usd += other.cost_usd;
        self.turns += other.turns;
        self.tool_calls += other.tool_calls;
        self.sandbox_cpu_s += other.sandbox_cpu_s;
        self.sandbox_wall_s += other.sandbox_wall_s;
    }

    /// Tokens in and out: what `tokens_per_day` bounds.
    pub fn tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    pub fn is_empty(&self) -> bool {
        *self == UsageCounts::default()
    }
}

/// One key's usage of one model on one UTC day.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageRow {
    /// The key's owner id (its hash), `local` while auth is off.
    pub owner: String,
    pub day: NaiveDate,
    /// The model called; `-` for what no model did (sandbox time).
    pub model: String,
    pub counts: UsageCounts,
}

#[async_trait]
pub trait UsageStore: Send + Sync {
    /// Adds `counts` to the row of (`owner`, `day`, `model`), made when
    /// missing, in one atomic statement, and answers `owner`'s totals on
    /// `day` over every model after the add: what a daily budget is
    /// checked against, without a second round trip. The totals count
    /// every add that committed before this one began, and this one;
    /// adds under way at the same moment elsewhere may count only once
    /// they commit (each PostgreSQL connection adds to the row of its
    /// stripe, one of 64, so that connections do not wait for each
    /// other).
    async fn usage_add(
        &self,
        owner: &str,
        day: NaiveDate,
        model: &str,
        counts: &UsageCounts,
    ) -> Result<UsageCounts, StoreError>;

    /// The rows of days `from` through `to`, of `owner` only when given,
    /// by owner, day and model.
    async fn usage_rows(
        &self,
        from: NaiveDate,
        to: NaiveDate,
        owner: Option<&str>,
    ) -> Result<Vec<UsageRow>, StoreError>;

    /// `owner`'s totals on `day` over every model.
    async fn usage_day(&self, owner: &str, day: NaiveDate) -> Result<UsageCounts, StoreError>;
}

/// A day as both backends keep it: `YYYY-MM-DD`, which sorts by date.
pub(crate) fn encode_day(day: NaiveDate) -> String {
    day.format("%Y-%m-%d").to_string()
}

pub(crate) fn decode_day(text: &str) -> Result<NaiveDate, StoreError> {
    NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .map_err(|e| StoreError::Corrupt(format!("usage day {text:?}: {e}")))
}

/// A count as both backends keep it (a signed 64-bit integer).
pub(crate) fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A count read back; a negative one (never written) reads as 0.
pub(crate) fn count(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}
