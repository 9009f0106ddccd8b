//! `options.reasoning`: how much a model reasons before it answers, as
//! each provider takes it (OpenAI-compatible servers' `reasoning_effort`,
//! Anthropic's extended thinking with a token budget).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The least thinking budget Anthropic's API takes.
pub const MIN_BUDGET_TOKENS: u32 = 1024;

/// How much the model may reason; either field may be left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReasoningOptions {
    /// Sent as `reasoning_effort` to OpenAI-compatible servers; gives
    /// Anthropic's budget where `budget_tokens` is not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effort: Option<Effort>,
    /// Anthropic's thinking budget (at least 1024); OpenAI-compatible
    /// servers have no such setting and are sent `effort` alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_tokens: Option<u32>,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Effort {
    Minimal,
    Low,
    Medium,
    High,
}

impl Effort {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl ReasoningOptions {
    /// A budget below the API's least is refused (the message says why).
    pub fn check(&self) -> Result<(), String> {
        match self.budget_tokens {
            Some(budget) if budget < MIN_BUDGET_TOKENS => Err(format!(
                "must be at least {MIN_BUDGET_TOKENS}, not {budget}"
            )),
            _ => Ok(()),
        }
    }

    /// The thinking budget for Anthropic: `budget_tokens`, else one for
    /// the effort (`minimal` asks for none); `None`: no thinking.
    pub fn budget(&self) -> Option<u32> {
        if self.budget_tokens.is_some() {
            return self.budget_tokens;
        }
        match self.effort? {
            Effort::Minimal => None,
            Effort::Low => Some(MIN_BUDGET_TOKENS * 2),
            Effort::Medium => Some(MIN_BUDGET_TOKENS * 8),
            Effort::High => Some(MIN_BUDGET_TOKENS * 24),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_comes_from_the_effort_unless_given() {
        let effort = |effort| ReasoningOptions {
            effort: Some(effort),
            budget_tokens: None,
        };
        assert_eq!(effort(Effort::Minimal).budget(), None);
        assert_eq!(effort(Effort::Low).budget(), Some(2048));
        assert_eq!(effort(Effort::High).budget(), Some(24_576));
        let given = ReasoningOptions {
            effort: Some(Effort::Low),
            budget_tokens: Some(5000),
        };
        assert_eq!(given.budget(), Some(5000));
        let alone = ReasoningOptions {
            effort: None,
            budget_tokens: Some(3000),
        };
        assert_eq!(alone.budget(), Some(3000));
        assert_eq!(ReasoningOptions::default().budget(), None);
        assert!(
            ReasoningOptions {
                budget_tokens: Some(100),
                effort: None
            }
            .check()
            .is_err()
        );
    }
}
