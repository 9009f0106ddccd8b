//! An agent turn's usage, recorded as it goes: after each model call what
//! the call spent (and the tool calls run since the last one), at the
//! turn's end the rest and the turn itself.

use std::time::{Duration, Instant};

use crate::protocol::{EventKind, ResultStatus, Usage};
use crate::quota::QuotaExceeded;
use crate::session::{Outcome, Session};
use crate::store::{StoreError, UsageCounts};

use crate::usage::Recorder;

/// For a key without a daily budget, how often a running turn writes what
/// it spent; the rest is written at its end. A key with one has every
/// model call written, since the budget is checked on the totals that
/// write answers.
const WRITE_EVERY: Duration = Duration::from_secs(1);

/// What one turn has recorded so far.
pub struct TurnSpend {
    owner: Option<String>,
    /// The model the turn calls: what its tokens are kept under.
    pub model: String,
    recorded: Usage,
    /// When the turn started or last wrote its usage.
    written: Instant,
    /// [`WRITE_EVERY`], but for tests.
    every: Duration,
}

impl TurnSpend {
    pub fn new(owner: Option<String>, model: String) -> TurnSpend {
        TurnSpend {
            owner,
            model,
            recorded: Usage::default(),
            written: Instant::now(),
            every: WRITE_EVERY,
        }
    }

    /// Records what the turn's tally `now` has beyond what was recorded,
    /// in one store write; answers the daily budget the key has now
    /// reached, if any. A key without a budget writes at most every
    /// [`WRITE_EVERY`]: a quick turn writes only at its end.
    pub async fn record(&mut self, recorder: &Recorder, now: &Usage) -> Option<QuotaExceeded> {
        if self.written.elapsed() < self.every && !recorder.has_budget(self.owner.as_deref()) {
            return None;
        }
        let add = self.take(now, false);
        let owner = self.owner.as_deref();
        let totals = recorder.add(owner, &self.model, add).await?;
        recorder.past_budget(owner, &totals)
    }

    /// Records the rest of the turn's usage and the turn itself with the
    /// session's next write, its `result`'s. What the key reached is not
    /// asked: a key past its budget now is refused its next turn, not
    /// this one's result.
    pub fn record_end(
        &mut self,
        recorder: &Recorder,
        now: &Usage,
        session: &Session,
    ) -> Result<(), StoreError> {
        let add = self.take(now, true);
        match recorder.row(self.owner.as_deref(), &self.model, add) {
            Some(row) => session.store_usage(row),
            None => Ok(()),
        }
    }

    /// What `now` has beyond what was recorded, plus the turn itself when
    /// it has `ended`; from now on it counts as recorded.
    fn take(&mut self, now: &Usage, ended: bool) -> UsageCounts {
        self.written = Instant::now();
        let add = UsageCounts {
            input_tokens: now.input_tokens.saturating_sub(self.recorded.input_tokens),
            output_tokens: now
                .output_tokens
                .saturating_sub(self.recorded.output_tokens),
            cost_usd: (now.cost_usd - self.recorded.cost_usd).max(0.0),
            turns: u64::from(ended),
            tool_calls: now.tool_calls.saturating_sub(self.recorded.tool_calls),
            ..UsageCounts::default()
        };
        self.recorded = now.clone();
        add
    }
}

/// Ends a turn whose key reached a daily budget with its last model call,
/// saying which budget in a `status` event before the `result`.
pub fn over_budget(
    session: &Session,
    past: &QuotaExceeded,
    last_text: Option<String>,
) -> Result<Outcome, StoreError> {
    session.emit(EventKind::Status {
        message: format!("The turn stopped: {past}."),
    })?;
    Ok(Outcome::new(ResultStatus::BudgetExceeded, last_text))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::quota::KeyTable;
    use crate::store::{SqliteStore, Store};
    use crate::usage::{LOCAL, today};

    #[tokio::test]
    async fn a_quick_turn_without_a_budget_writes_nothing_before_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("c.db")).unwrap());
        let recorder = Recorder::new(
            store.clone(),
            Arc::new(KeyTable::default()),
            &crate::telemetry::Metrics::new(),
        );
        let mut spend = TurnSpend::new(None, "m".into());
        // However slow the machine, the calls come within it.
        spend.every = Duration::from_secs(24 * 3600);
        let mut tally = Usage::default();
        for _ in 0..2 {
            tally.input_tokens += 10;
            tally.output_tokens += 3;
            tally.tool_calls += 1;
            assert!(spend.record(&recorder, &tally).await.is_none());
        }
        let written = store.usage_day(LOCAL, today()).await.unwrap();
        assert_eq!(written, UsageCounts::default(), "nothing before the end");
        // The end adds all of it, and the turn.
        let rest = spend.take(&tally, true);
        assert_eq!(
            (
                rest.input_tokens,
                rest.output_tokens,
                rest.tool_calls,
                rest.turns
            ),
            (20, 6, 2, 1)
        );
        assert!(spend.take(&tally, false).is_empty());
    }
}
