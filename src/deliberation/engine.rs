//! One deliberation, as the turn of its session: the agents of each round
//! start at once; each publishes its answer on the caller's bus and the
//! collector takes the answers from there (`agent.response.completed` /
//! `agent.response.failed`) until every agent has answered, the deadline
//! passes, or the turn is interrupted. Critique rounds follow, then the
//! aggregation, then `deliberation.completed`.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use uuid::Uuid;

use super::agents::{Budget, Worker};
use super::prompts::{self, PEERS_SHOWN, Prompt};
use super::records::{self, Stored};
use super::{DeliberationOptions, aggregate};
use crate::bus::{Bus, Subject};
use crate::jobs::Jobs;
use crate::model::ModelRegistry;
use crate::protocol::deliberation::{AgentResult, DeliberationStatus, Proposal};
use crate::protocol::{EventKind, ResultStatus, SessionKind};
use crate::session::{NewSession, Outcome, Session, SessionManager, Turn};
use crate::store::{Store, StoreError};

pub const COMPLETED: &str = "agent.response.completed";
pub const FAILED: &str = "agent.response.failed";
pub const DONE: &str = "deliberation.completed";

/// What every deliberation uses.
pub struct Deps {
    pub models: Arc<ModelRegistry>,
    pub bus: Arc<dyn Bus>,
    pub store: Arc<dyn Store>,
    /// Cap on tokens per model call when the options give none.
    pub max_tokens: u32,
    /// Runs the sessions of tool-using agents.
    pub sessions: Weak<SessionManager>,
    /// Agent calls running at once, across every deliberation
    /// ([`super::MAX_CONCURRENT_AGENTS`]).
    pub permits: Arc<tokio::sync::Semaphore>,
    /// Where agents' model calls are made (any replica's).
    pub jobs: Arc<dyn Jobs>,
    /// The agent calls running deliberations hold, by key.
    pub running: Arc<super::running::Running>,
    /// Where a run's permission hook may be reached
    /// (`mcp.allowed_http_servers`), checked when it is submitted.
    pub hook_rules: Arc<crate::egress::Rules>,
}

impl Deps {
    pub fn namespace(session: &Session) -> &str {
        session.owner.as_deref().unwrap_or("local")
    }
}

/// One agent as the run tracks it.
pub(super) struct Slot {
    pub agent_id: String,
    pub model: String,
    pub worker: Result<Worker, String>,
    pub proposal: Option<Arc<str>>,
    pub error: Option<String>,
    pub duration_ms: u64,
}

pub(super) struct Run<'a> {
    pub deps: &'a Deps,
    pub session: Arc<Session>,
    pub options: DeliberationOptions,
    /// The task, shared by every prompt.
    pub task: Arc<str>,
    /// The role and the rendered constraints, shared by every system
    /// prompt.
    pub role: Arc<str>,
    pub constraints: Arc<str>,
    pub task_id: Uuid,
    pub slots: Vec<Slot>,
    pub budget: Arc<Budget>,
    pub deadline: tokio::time::Instant,
}

/// Runs the deliberation on `task` to its end.
pub(super) async fn run(deps: &Deps, turn: &mut Turn, task: String) -> Result<Outcome, StoreError> {
    let session = turn.session.clone();
    let options: DeliberationOptions = serde_json::from_value((*session.options).clone())
        .map_err(|e| StoreError::Corrupt(format!("deliberation options: {e}")))?;
    // `POST /deliberations` checked its task already; a message to a
    // session of the kind is checked here.
    if let Err(e) = options.check_prompt_bytes("message", task.len()) {
        return Ok(Outcome::new(ResultStatus::Error, Some(e.to_string())));
    }
    let store = deps.store.as_ref();
    let owner = session.owner.clone();
    // A submitted deliberation's place was taken when it was accepted.
    let _place = match deps.running.claim(session.id) {
        Some(place) => place,
        None => match deps.running.take(owner.as_deref(), options.calls()) {
            Ok(place) => place,
            Err(refused) => {
                session.emit(EventKind::Error {
                    message: refused.to_string(),
                    code: "quota_exceeded".into(),
                })?;
                return Ok(Outcome::new(ResultStatus::Error, Some(refused.to_string())));
            }
        },
    };
    // `POST /deliberations` runs one in an ephemeral session of its own,
    // whose id is the task's; a session of the kind runs one per message.
    let task_id = if session.ephemeral {
        session.id
    } else {
        Uuid::now_v7()
    };
    let mut stored = match records::get(store, owner.as_deref(), task_id).await? {
        Some(stored) => stored,
        None => Stored::pending(
            task_id,
            session.id,
            owner.clone(),
            session.last_seq(),
            &task,
            &options,
            // Known whenever an agent uses it: the options were checked.
            deps.models.default_model().unwrap_or_default(),
        ),
    };
    session.emit(EventKind::DeliberationStarted {
        task_id,
        role: options.role.clone(),
        num_agents: options.num_agents,
        rounds: options.rounds,
        aggregate: options.aggregate,
    })?;
    let budget = Arc::new(Budget::new(
        options.max_budget_usd,
        options.max_budget_tokens,
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(options.timeout_s);
    let mut run = Run {
        deps,
        session: session.clone(),
        role: options.role.as_str().into(),
        constraints: prompts::render_constraints(&options.constraints).into(),
        options,
        task: task.into(),
        task_id,
        slots: Vec::new(),
        budget,
        deadline,
    };
    run.slots = run.workers(&mut stored).await;
    records::put(store, &stored).await?;
    let reason = run.rounds(turn).await?;
    let decision = if reason.is_none() {
        aggregate::decide(&run, turn).await?
    } else {
        None
    };
    let reason = reason.or_else(|| {
        run.budget
            .is_exceeded()
            .then_some(super::agents::BUDGET_EXCEEDED)
    });
    stored.result.results = run.results();
    stored.result.decision = decision.clone();
    stored.finish(reason);
    finish(deps, &session, &stored).await?;
    let status = match (reason, stored.result.status) {
        (Some("interrupted"), _) => ResultStatus::Interrupted,
        (Some(super::agents::BUDGET_EXCEEDED), _) => ResultStatus::BudgetExceeded,
        (_, DeliberationStatus::Failed) => ResultStatus::Error,
        _ => ResultStatus::Success,
    };
    let text = match &decision {
        Some(decision) => decision.content.clone(),
        None => summary(&stored.result.results),
    };
    Ok(Outcome::new(status, Some(text)))
}

/// Publishes and stores the end of a deliberation, and deletes the
/// sessions of its tool-using agents.
pub(super) async fn finish(
    deps: &Deps,
    session: &Arc<Session>,
    stored: &Stored,
) -> Result<(), StoreError> {
    let result = &stored.result;
    session.emit(EventKind::DeliberationCompleted {
        task_id: result.task_id,
        status: result.status,
        total_agents: result.total_agents,
        successful_responses: result.successful_responses,
        reason: result.reason.clone(),
        duration_ms: result.duration_ms.unwrap_or(0),
    })?;
    let namespace = Deps::namespace(session);
    let subject = Subject::parse(DONE).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let mut payload = serde_json::to_value(result).unwrap_or_default();
    payload["timestamp"] = json!(chrono::Utc::now());
    if let Err(e) = deps
        .bus
        .publish(namespace, &subject, Bytes::from(payload.to_string()))
        .await
    {
        // Too large for the bus: the summary goes, the record has it all.
        if let Some(results) = payload.get_mut("results") {
            *results = json!([]);
        }
        payload["results_omitted"] = json!(e.to_string());
        if let Err(e) = deps
            .bus
            .publish(namespace, &subject, Bytes::from(payload.to_string()))
            .await
        {
            tracing::warn!(task = %result.task_id, error = %e, "publishing deliberation.completed");
        }
    }
    records::put(deps.store.as_ref(), stored).await?;
    delete_children(deps, stored).await;
    Ok(())
}

/// Deletes the sessions (and sandboxes) of a deliberation's tool-using agents.
pub(super) async fn delete_children(deps: &Deps, stored: &Stored) {
    if let Some(manager) = deps.sessions.upgrade() {
        for child in &stored.children {
            if let Err(e) = manager.delete(*child, None).await {
                tracing::debug!(session = %child, error = %e, "deleting an agent's session");
            }
        }
    }
}

/// The result text of a deliberation without a decision.
fn summary(results: &[AgentResult]) -> String {
    let answered = results.iter().filter(|r| r.proposal.is_some()).count();
    let mut text = format!("{answered} of {} agents proposed.", results.len());
    let mut shown = 0;
    for result in results {
        if let Some(proposal) = &result.proposal {
            if text.len() + proposal.content.len() > MAX_SUMMARY_BYTES {
                text.push_str(&format!(
                    "\n\n[{} more proposals are in the deliberation's record]",
                    answered - shown
                ));
                break;
            }
            text.push_str(&format!("\n\n{}:\n{}", result.agent_id, proposal.content));
            shown += 1;
        }
    }
    text
}

/// The most of the proposals a deliberation's `result` text shows; the
/// record (`GET /deliberations/{task_id}`) has them all.
const MAX_SUMMARY_BYTES: usize = 64 * 1024;

impl Run<'_> {
    /// Each agent's worker: a model, or its own agent session when the
    /// agents use tools.
    async fn workers(&self, stored: &mut Stored) -> Vec<Slot> {
        let options = &self.options;
        let default = self
            .deps
            .models
            .default_model()
            .unwrap_or_default()
            .to_owned();
        let calls = u64::from(options.num_agents) * u64::from(options.rounds + 1);
        let mut slots = Vec::with_capacity(options.num_agents as usize);
        for index in 0..options.num_agents as usize {
            let agent_id = options.agent_id(index);
            let model = options.model_of(index, &default);
            let worker = if options.tools {
                self.agent_session(index, &agent_id, &model, calls)
                    .await
                    .inspect(|w| {
                        if let Worker::Session { session, .. } = w {
                            stored.children.push(session.id);
                        }
                    })
            } else {
                self.deps
                    .models
                    .resolve(&model)
                    .map(|model| Worker::Model {
                        model: Box::new(model),
                        system: self.system_prompt(&agent_id),
                        jobs: self.deps.jobs.clone(),
                    })
                    .map_err(|e| e.to_string())
            };
            slots.push(Slot {
                agent_id,
                model,
                worker,
                proposal: None,
                error: None,
                duration_ms: 0,
            });
        }
        slots
    }

    async fn agent_session(
        &self,
        index: usize,
        agent_id: &str,
        model: &str,
        calls: u64,
    ) -> Result<Worker, String> {
        let manager = self
            .deps
            .sessions
            .upgrade()
            .ok_or("the server is shutting down")?;
        let mut options = json!({
            "model": model,
            "temperature": DeliberationOptions::temperature_of(index),
            "max_tokens": self.max_tokens(calls),
        });
        if let Some(share) = self.budget.usd_share(u64::from(self.options.num_agents)) {
            options["max_budget_usd"] = json!(share);
        }
        // The agent's calls follow the deliberation's policy; the agent's
        // session has the deliberation's owner, so that owner's key policy
        // applies as well.
        if let Some(permissions) = &self.options.permissions {
            options["permissions"] = json!(permissions);
        }
        let session = manager
            .create(NewSession {
                name: Some(format!("{agent_id} of deliberation {}", self.task_id)),
                kind: SessionKind::AGENT,
                owner: self.session.owner.clone(),
                options,
                ephemeral: false,
                origin: None,
                metadata: Default::default(),
            })
            .await
            .map_err(|e| e.to_string())?;
        Ok(Worker::Session {
            manager,
            session,
            jobs: self.deps.jobs.clone(),
        })
    }

    /// A call's cap on tokens: the option (or the server's), within its
    /// share of a token budget over `calls` calls to come.
    pub(super) fn max_tokens(&self, calls: u64) -> u32 {
        let cap = self.options.max_tokens.unwrap_or(self.deps.max_tokens);
        self.budget
            .token_share(calls)
            .map_or(cap, |share| share.min(cap))
    }

    /// Runs the first round and the critique rounds; `Some(reason)` when
    /// the deliberation ended early.
    async fn rounds(&mut self, turn: &mut Turn) -> Result<Option<&'static str>, StoreError> {
        for round in 0..=self.options.rounds {
            let inputs: Vec<(usize, Prompt)> = if round == 0 {
                (0..self.slots.len())
                    .filter(|&i| self.slots[i].worker.is_ok())
                    .map(|i| (i, self.first_prompt(i)))
                    .collect()
            } else {
                let alive: Vec<usize> = (0..self.slots.len())
                    .filter(|&i| self.slots[i].proposal.is_some())
                    .collect();
                if alive.len() < 2 {
                    self.session.emit(EventKind::Status {
                        message: format!(
                            "{} proposal(s) after round {}: nothing to critique.",
                            alive.len(),
                            round - 1
                        ),
                    })?;
                    return Ok(None);
                }
                alive
                    .iter()
                    .map(|&i| (i, self.critique_prompt(i)))
                    .collect()
            };
            for slot in &mut self.slots {
                if let Err(error) = &slot.worker
                    && round == 0
                {
                    slot.error = Some(error.clone());
                }
            }
            self.session.emit(EventKind::RoundStarted {
                task_id: self.task_id,
                round,
            })?;
            if let Some(reason) = self.round(round, inputs, turn).await? {
                return Ok(Some(reason));
            }
            if self.budget.is_exceeded() {
                return Ok(Some(super::agents::BUDGET_EXCEEDED));
            }
        }
        Ok(None)
    }

    /// An agent's system prompt.
    pub(super) fn system_prompt(&self, agent_id: &str) -> Prompt {
        Prompt::System {
            agent_id: agent_id.to_owned(),
            role: self.role.clone(),
            num_agents: self.options.num_agents,
            constraints: self.constraints.clone(),
        }
    }

    fn first_prompt(&self, index: usize) -> Prompt {
        // A tool-using agent keeps the tools' system prompt; its role and
        // constraints lead its message instead.
        let lead = matches!(self.slots[index].worker, Ok(Worker::Session { .. }))
            .then(|| Box::new(self.system_prompt(&self.slots[index].agent_id)));
        Prompt::Task {
            lead,
            task: self.task.clone(),
        }
    }

    fn critique_prompt(&self, index: usize) -> Prompt {
        let own = self.proposal_of(index);
        let others = self
            .peers_of(index)
            .into_iter()
            .map(|i| self.proposal_of(i))
            .collect();
        Prompt::Critique {
            task: self.task.clone(),
            own,
            others,
        }
    }

    /// The proposal of agent `index` (empty if it has none).
    pub(super) fn proposal_of(&self, index: usize) -> Arc<str> {
        self.slots[index].proposal.clone().unwrap_or_default()
    }

    /// The agents with a proposal whose work agent `index` reads: those
    /// after it, in turn, at most [`PEERS_SHOWN`], in agent order (with
    /// fewer agents than that, every other one).
    pub(super) fn peers_of(&self, index: usize) -> Vec<usize> {
        let count = self.slots.len();
        let mut peers: Vec<usize> = (1..count)
            .map(|step| (index + step) % count)
            .filter(|&i| self.slots[i].proposal.is_some())
            .take(PEERS_SHOWN)
            .collect();
        peers.sort_unstable();
        peers
    }

    /// The agents' outcomes, in agent order.
    fn results(&self) -> Vec<AgentResult> {
        self.slots
            .iter()
            .map(|slot| AgentResult {
                agent_id: slot.agent_id.clone(),
                role: self.options.role.clone(),
                proposal: slot.proposal.as_ref().map(|content| Proposal {
                    content: content.to_string(),
                    author_id: slot.agent_id.clone(),
                    author_role: self.options.role.clone(),
                }),
                status: if slot.proposal.is_some() {
                    "completed"
                } else {
                    "failed"
                }
                .into(),
                error: slot.error.clone(),
                duration_ms: slot.duration_ms,
                model: slot.model.clone(),
            })
            .collect()
    }
}
