//! An agent turn's usage, recorded as it goes: after each model call what
//! the call spent (and the tool calls run since the last one), at the
//! turn's end the rest and the turn itself.

use crate::protocol::{EventKind, ResultStatus, Usage};
use crate::quota::QuotaExceeded;
use crate::session::{Outcome, Session};
use crate::store::{StoreError, UsageCounts};

use crate::usage::Recorder;

/// What one turn has recorded so far.
pub struct TurnSpend {
    owner: Option<String>,
    /// The model the turn calls: what its tokens are kept under.
    pub model: String,
    recorded: Usage,
}

impl TurnSpend {
    pub fn new(owner: Option<String>, model: String) -> TurnSpend {
        TurnSpend {
            owner,
            model,
            recorded: Usage::default(),
        }
    }

    /// Records what the turn's tally `now` has beyond what was recorded,
    /// plus the turn itself when it has `ended`, in one store write; answers
    /// the daily budget the key has now reached, if any.
    pub async fn record(
        &mut self,
        recorder: &Recorder,
        now: &Usage,
        ended: bool,
    ) -> Option<QuotaExceeded> {
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
        let owner = self.owner.as_deref();
        let totals = recorder.add(owner, &self.model, add).await?;
        recorder.past_budget(owner, &totals)
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
