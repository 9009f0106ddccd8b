//! The wire format of deliberations: what each agent proposes,
//! how it ended, the decision, and the whole result clients poll.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

/// One agent's answer: the `proposal` of its `agent.response.completed`
/// message on the bus, and of its entry in the result clients poll.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Proposal {
    pub content: String,
    pub author_id: String,
    pub author_role: String,
}

/// Where a deliberation stands; sent in upper case (`PENDING`,
/// `COMPLETED`, `FAILED`), as in `proto/orchestrator.proto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DeliberationStatus {
    Pending,
    /// At least one agent succeeded.
    Completed,
    /// No agent succeeded.
    Failed,
}

impl DeliberationStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliberationStatus::Pending => "PENDING",
            DeliberationStatus::Completed => "COMPLETED",
            DeliberationStatus::Failed => "FAILED",
        }
    }
}

/// How the proposals become one decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Aggregate {
    /// No decision: the proposals are the result.
    #[default]
    None,
    /// A judge agent picks one and says why.
    Judge,
    /// The agents vote on each other's proposals; the tally decides.
    Vote,
}

impl Aggregate {
    pub fn as_str(self) -> &'static str {
        match self {
            Aggregate::None => "none",
            Aggregate::Judge => "judge",
            Aggregate::Vote => "vote",
        }
    }
}

/// One agent's outcome in a deliberation's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AgentResult {
    pub agent_id: String,
    pub role: String,
    /// The agent's last proposal; none when it never succeeded.
    pub proposal: Option<Proposal>,
    /// `completed` or `failed`.
    pub status: String,
    /// Why it failed (`timeout`, `budget_exceeded`, the model's error …).
    pub error: Option<String>,
    pub duration_ms: u64,
    /// The model it ran on.
    #[serde(default)]
    pub model: String,
}

/// What aggregation decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Decision {
    /// `judge` or `vote`.
    pub method: Aggregate,
    /// The chosen proposal's author (`agent-dev-002`).
    pub choice: String,
    /// The chosen proposal's content.
    pub content: String,
    pub reasoning: String,
    /// For a vote: the votes each proposal got, by author.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub votes: Option<Value>,
}

/// A deliberation as `GET /deliberations/{task_id}` answers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DeliberationResult {
    pub task_id: Uuid,
    pub status: DeliberationStatus,
    /// The session that runs it (its events stream there).
    pub session_id: Uuid,
    pub task_description: String,
    pub role: String,
    pub results: Vec<AgentResult>,
    pub total_agents: u32,
    pub successful_responses: u32,
    pub decision: Option<Decision>,
    /// Why it ended early: `timeout`, `budget_exceeded`, `interrupted`,
    /// `restarted`; none when every agent answered.
    #[serde(default)]
    pub reason: Option<String>,
    /// Set once it is over.
    pub duration_ms: Option<u64>,
    pub created_at: chrono::DateTime<chrono::Utc>,
}
