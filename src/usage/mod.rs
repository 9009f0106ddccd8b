//! Usage per key: what each key's turns, tool calls, gateway calls and
//! sandboxes spent, kept in the store per UTC day and model
//! ([`crate::store::UsageStore`]), counted in Prometheus by the key's
//! name, and checked against the key's daily budgets (`tokens_per_day`,
//! `usd_per_day`).
//!
//! - [`Recorder`]: adds what was spent (a turn's with its last write, a
//!   removed sandbox's at once; a failure is logged, never the caller's)
//!   and refuses a key past its budget for today. Gateway calls of a key
//!   without a daily budget are summed and written behind, at most once a
//!   second per key, day and model ([`Recorder::add_later`]), and at
//!   shutdown; those of a key with a budget are written at once.
//! - [`report`]: `GET /usage`'s grouping of the stored rows.
//!
//! Budgets are read from the store, which every replica writes, so two
//! replicas overspend a budget by at most the calls under way when it was
//! reached.

pub mod report;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{NaiveDate, Utc};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::quota::{KeyTable, QuotaExceeded, next_day};
use crate::store::{Store, UsageCounts, UsageRow};
use crate::sync::lock;

/// The owner usage is kept under while auth is off.
pub const LOCAL: &str = "local";
/// The model of what no model did (a sandbox's time).
pub const NO_MODEL: &str = "-";

/// A key by its configured name (never the key or its hash).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeyLabel {
    pub key: String,
}

/// A key by name and a token direction (`input`, `output`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabel {
    pub key: String,
    pub direction: &'static str,
}

/// The Prometheus counters of usage, registered with the server's
/// metrics with [`crate::telemetry::Metrics::register_with`].
#[derive(Default)]
pub struct UsageMetrics {
    pub tokens: Family<TokenLabel, Counter>,
    pub cost_usd: Family<KeyLabel, Counter<f64, AtomicU64>>,
    pub turns: Family<KeyLabel, Counter>,
    pub tool_calls: Family<KeyLabel, Counter>,
    pub sandbox_cpu_seconds: Family<KeyLabel, Counter<f64, AtomicU64>>,
}

impl UsageMetrics {
    /// Registers the counters, labelled by the key's configured name,
    /// never the key.
    fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "usage_tokens",
            "Model tokens, by key name and direction (input, output)",
            self.tokens.clone(),
        );
        registry.register(
            "usage_cost_usd",
            "Cost of priced model calls in USD, by key name",
            self.cost_usd.clone(),
        );
        registry.register(
            "usage_turns",
            "Turns finished, by key name",
            self.turns.clone(),
        );
        registry.register(
            "usage_tool_calls",
            "Tool calls run, by key name",
            self.tool_calls.clone(),
        );
        registry.register(
            "usage_sandbox_cpu_seconds",
            "CPU time of removed sandboxes, by key name",
            self.sandbox_cpu_seconds.clone(),
        );
    }

    fn count(&self, key: &str, add: &UsageCounts) {
        let label = KeyLabel { key: key.into() };
        for (direction, tokens) in [("input", add.input_tokens), ("output", add.output_tokens)] {
            if tokens > 0 {
                self.tokens
                    .get_or_create(&TokenLabel {
                        key: key.into(),
                        direction,
                    })
                    .inc_by(tokens);
            }
        }
        if add.cost_usd > 0.0 {
            self.cost_usd.get_or_create(&label).inc_by(add.cost_usd);
        }
        if add.turns > 0 {
            self.turns.get_or_create(&label).inc_by(add.turns);
        }
        if add.tool_calls > 0 {
            self.tool_calls.get_or_create(&label).inc_by(add.tool_calls);
        }
        if add.sandbox_cpu_s > 0.0 {
            self.sandbox_cpu_seconds
                .get_or_create(&label)
                .inc_by(add.sandbox_cpu_s);
        }
    }
}

/// The owner usage is kept under: the key's hash, or [`LOCAL`].
pub fn owner_id(owner: Option<&str>) -> &str {
    owner.unwrap_or(LOCAL)
}

/// Today, UTC: the day usage is added to and budgets are checked on.
pub fn today() -> NaiveDate {
    Utc::now().date_naive()
}

/// How long usage written behind waits, summed, before it is written.
pub const WRITE_BEHIND: Duration = Duration::from_secs(1);

/// Usage summed and not yet written, by owner, day and model.
type Pending = HashMap<(String, NaiveDate, String), UsageCounts>;

/// Records usage and checks the daily budgets; one per server.
pub struct Recorder {
    store: Arc<dyn Store>,
    keys: Arc<KeyTable>,
    metrics: Arc<UsageMetrics>,
    /// What [`Recorder::add_later`] took and [`Recorder::flush`] writes.
    pending: Mutex<Pending>,
    /// Wakes the writer when something is pending.
    wake: tokio::sync::Notify,
}

impl Recorder {
    pub fn new(
        store: Arc<dyn Store>,
        keys: Arc<KeyTable>,
        metrics: &crate::telemetry::Metrics,
    ) -> Recorder {
        let counters = Arc::new(UsageMetrics::default());
        metrics.register_with(|registry| counters.register(registry));
        Recorder {
            store,
            keys,
            metrics: counters,
            pending: Mutex::default(),
            wake: tokio::sync::Notify::new(),
        }
    }

    /// Adds `add` as [`Recorder::add`] does, without waiting for the
    /// store: written behind, summed with the owner's other usage of
    /// `model` today, within [`WRITE_BEHIND`]; at once when the owner has
    /// a daily budget, which the next call is checked against.
    pub fn add_later(self: &Arc<Self>, owner: Option<&str>, model: &str, add: UsageCounts) {
        if self.has_budget(owner) {
            let (recorder, owner, model) =
                (self.clone(), owner.map(str::to_owned), model.to_owned());
            tokio::spawn(async move { recorder.add(owner.as_deref(), &model, add).await });
            return;
        }
        let Some(row) = self.row(owner, model, add) else {
            return;
        };
        lock(&self.pending)
            .entry((row.owner, row.day, row.model))
            .or_default()
            .add(&row.counts);
        self.wake.notify_one();
    }

    /// Writes what [`Recorder::add_later`] holds.
    pub async fn flush(&self) {
        let pending = std::mem::take(&mut *lock(&self.pending));
        for ((owner, day, model), counts) in pending {
            if let Err(e) = self.store.usage_add(&owner, day, &model, &counts).await {
                let key = self.keys.name((owner != LOCAL).then_some(owner.as_str()));
                tracing::warn!(%key, model, error = %e, "usage not recorded");
            }
        }
    }

    /// Writes what is added later, [`WRITE_BEHIND`] after the first of a
    /// batch, until `stop`; then the rest.
    pub async fn write_behind(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        loop {
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = stop.cancelled() => break,
            }
            tokio::select! {
                _ = tokio::time::sleep(WRITE_BEHIND) => {}
                _ = stop.cancelled() => break,
            }
            self.flush().await;
        }
        self.flush().await;
    }

    pub fn keys(&self) -> &Arc<KeyTable> {
        &self.keys
    }

    /// Adds `add` to `owner`'s usage of `model` today and answers the
    /// owner's totals for today; `None` when the store failed (logged:
    /// usage is never a reason to fail the work it counts).
    pub async fn add(
        &self,
        owner: Option<&str>,
        model: &str,
        add: UsageCounts,
    ) -> Option<UsageCounts> {
        let row = self.row(owner, model, add)?;
        match self
            .store
            .usage_add(&row.owner, row.day, model, &row.counts)
            .await
        {
            Ok(totals) => Some(totals),
            Err(e) => {
                tracing::warn!(key = %self.keys.name(owner), model, error = %e, "usage not recorded");
                None
            }
        }
    }

    /// `add` as the row of `owner`'s usage of `model` today, counted in
    /// the metrics, for a write that carries it (a turn's last); `None`
    /// when there is nothing to add.
    pub fn row(&self, owner: Option<&str>, model: &str, add: UsageCounts) -> Option<UsageRow> {
        if add.is_empty() {
            return None;
        }
        self.metrics.count(&self.keys.name(owner), &add);
        Some(UsageRow {
            owner: owner_id(owner).to_owned(),
            day: today(),
            model: model.to_owned(),
            counts: add,
        })
    }

    /// Counts a removed sandbox's CPU and wall time under its session's
    /// key.
    pub fn sandbox_hook(self: &Arc<Self>) -> crate::sandbox::manager::OnRemoved {
        let recorder = self.clone();
        Arc::new(move |_session, owner, cpu, wall| {
            let recorder = recorder.clone();
            Box::pin(async move {
                let add = UsageCounts {
                    sandbox_cpu_s: cpu.unwrap_or(0.0),
                    sandbox_wall_s: wall,
                    ..UsageCounts::default()
                };
                recorder.add(owner.as_deref(), NO_MODEL, add).await;
            })
        })
    }

    /// Whether `owner` has a daily budget at all: only then is the store
    /// read before its work.
    pub fn has_budget(&self, owner: Option<&str>) -> bool {
        let quota = self.keys.quota(owner);
        quota.tokens_per_day.is_some() || quota.usd_per_day.is_some()
    }

    /// Refuses `owner` when it is at or past a daily budget today, by the
    /// store's totals (every replica's). A store that does not answer
    /// refuses nothing: it is logged.
    pub async fn check_budget(&self, owner: Option<&str>) -> Result<(), QuotaExceeded> {
        if !self.has_budget(owner) {
            return Ok(());
        }
        match self.store.usage_day(owner_id(owner), today()).await {
            Ok(totals) => self.past_budget(owner, &totals).map_or(Ok(()), Err),
            Err(e) => {
                tracing::warn!(key = %self.keys.name(owner), error = %e, "daily budget not checked");
                Ok(())
            }
        }
    }

    /// The budget `totals` (today's) has reached, if any.
    pub fn past_budget(&self, owner: Option<&str>, totals: &UsageCounts) -> Option<QuotaExceeded> {
        let quota = self.keys.quota(owner);
        let past = |quota: &'static str, limit: String, spent: String| {
            let now = Utc::now();
            let reset = next_day(now);
            Some(QuotaExceeded {
                key: self.keys.name(owner),
                quota,
                limit,
                why: format!("{spent} spent today (UTC); the budget resets at midnight UTC"),
                reset: Some(reset),
                retry_after: (reset - now).to_std().unwrap_or_default(),
            })
        };
        if let Some(limit) = quota.tokens_per_day
            && totals.tokens() >= limit
        {
            return past(
                "tokens_per_day",
                limit.to_string(),
                format!("{} tokens", totals.tokens()),
            );
        }
        if let Some(limit) = quota.usd_per_day
            && totals.cost_usd >= limit
        {
            return past(
                "usd_per_day",
                limit.to_string(),
                format!("${:.4}", totals.cost_usd),
            );
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::store::SqliteStore;

    #[tokio::test]
    async fn usage_added_later_is_summed_and_written_by_a_flush_or_at_stop() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open(&dir.path().join("conclave.db")).unwrap());
        let keys = Arc::new(KeyTable::new(&Config::default()));
        let metrics = crate::telemetry::Metrics::new();
        let recorder = Arc::new(Recorder::new(store.clone(), keys, &metrics));
        let tokens = |input_tokens| UsageCounts {
            input_tokens,
            ..UsageCounts::default()
        };
        recorder.add_later(None, "pool", tokens(3));
        recorder.add_later(None, "pool", tokens(4));
        // Nothing is written until the flush, then the sum once.
        assert_eq!(
            store.usage_day(LOCAL, today()).await.unwrap().input_tokens,
            0
        );
        recorder.flush().await;
        assert_eq!(
            store.usage_day(LOCAL, today()).await.unwrap().input_tokens,
            7
        );
        recorder.flush().await;
        assert_eq!(
            store.usage_day(LOCAL, today()).await.unwrap().input_tokens,
            7
        );
        // The writer writes what is left when it stops.
        let stop = tokio_util::sync::CancellationToken::new();
        let writer = tokio::spawn(recorder.clone().write_behind(stop.clone()));
        recorder.add_later(None, "pool", tokens(5));
        stop.cancel();
        writer.await.unwrap();
        assert_eq!(
            store.usage_day(LOCAL, today()).await.unwrap().input_tokens,
            12
        );
    }
}
