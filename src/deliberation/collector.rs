//! The collector of one round: every agent of the round starts at once,
//! publishes its answer on the caller's bus, and the collector takes the
//! answers from the bus until every agent has answered, the deadline
//! passes or the turn is interrupted. An answer the bus refused, or lost
//! (a subscriber that lagged), is taken from the agent instead.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use serde::Deserialize;
use serde_json::json;
use uuid::Uuid;

use super::DeliberationOptions;
use super::agents::{AgentAnswer, AgentWork};
use super::engine::{COMPLETED, Deps, FAILED, Run};
use super::prompts::Prompt;
use crate::bus::{Bus, Delivery, Pattern, Since, Subject};
use crate::protocol::EventKind;
use crate::protocol::deliberation::{Aggregate, Proposal};
use crate::session::Turn;
use crate::store::StoreError;
use std::sync::Arc;

/// How long the collector waits for the bus to bring an answer whose
/// agent has already returned before it takes the answer from the agent.
const BUS_GRACE: Duration = Duration::from_secs(5);

/// An answer as it comes off the bus.
#[derive(Deserialize)]
struct Published {
    task_id: Uuid,
    agent_id: String,
    round: u32,
    status: String,
    proposal: Option<Proposal>,
    error: Option<String>,
    #[serde(default)]
    duration_ms: u64,
}

impl Run<'_> {
    /// One round: every agent in `inputs` at once, answers collected from
    /// the bus. `Some(reason)` when the deadline or an interrupt cut it.
    pub(super) async fn round(
        &mut self,
        round: u32,
        inputs: Vec<(usize, Prompt)>,
        turn: &mut Turn,
    ) -> Result<Option<&'static str>, StoreError> {
        let namespace = Deps::namespace(&self.session).to_owned();
        let patterns = [COMPLETED, FAILED]
            .iter()
            .filter_map(|p| Pattern::parse(p).ok())
            .collect();
        // Subscribed before the first agent starts, so no answer is missed.
        let mut answers = match self
            .deps
            .bus
            .subscribe(&namespace, patterns, Since::New)
            .await
        {
            Ok(stream) => Some(stream),
            Err(e) => {
                tracing::warn!(error = %e, "the collector cannot subscribe; answers come from the agents");
                None
            }
        };
        let by_id: HashMap<String, usize> = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, slot)| (slot.agent_id.clone(), i))
            .collect();
        let calls_left = inputs.len() as u64 * u64::from(self.options.rounds + 1 - round)
            + u64::from(self.options.aggregate != Aggregate::None);
        let max_tokens = self.max_tokens(calls_left);
        let agent_timeout = Duration::from_secs(
            self.options
                .agent_timeout_s
                .unwrap_or(self.options.timeout_s),
        );
        let mut running: FuturesUnordered<BoxFuture<'static, (usize, AgentAnswer, bool)>> =
            FuturesUnordered::new();
        let mut pending: Vec<bool> = vec![false; self.slots.len()];
        for (index, prompt) in inputs {
            let slot = &self.slots[index];
            let Ok(worker) = slot.worker.clone() else {
                continue;
            };
            pending[index] = true;
            self.session.emit_as(
                &slot.agent_id,
                EventKind::AgentStarted {
                    role: self.options.role.clone(),
                    round,
                    model: slot.model.clone(),
                },
            )?;
            let call = AgentWork {
                agent_id: slot.agent_id.clone(),
                prompt,
                temperature: DeliberationOptions::temperature_of(index),
                max_tokens: Some(max_tokens),
                timeout: agent_timeout,
                budget: self.budget.clone(),
                permits: self.deps.permits.clone(),
                parent: self.session.clone(),
            };
            let publish = self.publisher(&namespace, index, round);
            running.push(Box::pin(async move {
                let mut answer = worker.answer(call).await;
                // What is kept of an answer, on the bus as in the record.
                if let Ok(content) = &mut answer.result {
                    *content = super::running::kept(content);
                }
                let published = publish.answer(&answer.result, answer.duration_ms).await;
                (index, answer, published)
            }));
        }
        let mut returned: HashMap<usize, AgentAnswer> = HashMap::new();
        let mut bus_ok = answers.is_some();
        let cancel = turn.cancel.clone();
        let reason = loop {
            if !pending.contains(&true) {
                break None;
            }
            let grace = tokio::time::sleep(BUS_GRACE);
            tokio::select! {
                biased;
                _ = cancel.cancelled() => break Some("interrupted"),
                _ = tokio::time::sleep_until(self.deadline) => break Some(super::agents::TIMEOUT),
                Some((index, answer, published)) = running.next(), if !running.is_empty() => {
                    turn.usage.add(&answer.usage);
                    if !pending[index] {
                        // The bus brought it first.
                    } else if !published || !bus_ok {
                        self.record(round, index, &answer.result, answer.duration_ms, &mut pending)?;
                    } else {
                        returned.insert(index, answer);
                    }
                }
                delivery = next(&mut answers), if bus_ok => match delivery {
                    Some(Delivery::Message(message)) => {
                        let Ok(published) = serde_json::from_slice::<Published>(&message.payload) else {
                            continue;
                        };
                        let Some(&index) = by_id.get(&published.agent_id) else { continue };
                        if published.task_id != self.task_id || published.round != round || !pending[index] {
                            continue;
                        }
                        let result = match (published.status.as_str(), published.proposal) {
                            ("completed", Some(proposal)) => Ok(proposal.content),
                            _ => Err(published.error.unwrap_or_else(|| "failed".into())),
                        };
                        self.record(round, index, &result, published.duration_ms, &mut pending)?;
                        returned.remove(&index);
                    }
                    Some(Delivery::Lagged { .. }) | None => {
                        // The bus can no longer be trusted to bring every
                        // answer: take them from the agents from now on.
                        bus_ok = false;
                        for (index, answer) in returned.drain() {
                            self.record(round, index, &answer.result, answer.duration_ms, &mut pending)?;
                        }
                    }
                },
                _ = grace, if running.is_empty() && !returned.is_empty() => {
                    tracing::warn!(task = %self.task_id, "answers published but not delivered; taking them from the agents");
                    for (index, answer) in returned.drain() {
                        self.record(round, index, &answer.result, answer.duration_ms, &mut pending)?;
                    }
                }
            }
        };
        if let Some(reason) = reason {
            drop(running);
            for index in 0..pending.len() {
                if pending[index] {
                    let publish = self.publisher(&namespace, index, round);
                    let error = Err(reason.to_owned());
                    publish.answer(&error, 0).await;
                    self.record(round, index, &error, 0, &mut pending)?;
                }
            }
        }
        turn.save_usage()?;
        Ok(reason)
    }

    /// Publishes the answers of the agent at `index` in `round`.
    fn publisher(&self, namespace: &str, index: usize, round: u32) -> Publisher {
        Publisher {
            bus: self.deps.bus.clone(),
            namespace: namespace.to_owned(),
            task_id: self.task_id,
            agent_id: self.slots[index].agent_id.clone(),
            role: self.options.role.clone(),
            model: self.slots[index].model.clone(),
            round,
            num_agents: self.options.num_agents,
        }
    }

    /// Takes an agent's answer for the round and says so in the log.
    fn record(
        &mut self,
        round: u32,
        index: usize,
        result: &Result<String, String>,
        duration_ms: u64,
        pending: &mut [bool],
    ) -> Result<(), StoreError> {
        pending[index] = false;
        let role = self.options.role.clone();
        let slot = &mut self.slots[index];
        slot.duration_ms = duration_ms;
        match result {
            Ok(content) => {
                let content = super::running::kept(content);
                slot.proposal = Some(content.as_str().into());
                slot.error = None;
                self.session.emit_as(
                    &slot.agent_id,
                    EventKind::AgentCompleted {
                        role: role.clone(),
                        round,
                        proposal: Proposal {
                            content,
                            author_id: slot.agent_id.clone(),
                            author_role: role,
                        },
                        duration_ms,
                    },
                )?;
            }
            Err(error) => {
                // A failed revision keeps the earlier proposal.
                if slot.proposal.is_none() {
                    slot.error = Some(error.clone());
                }
                self.session.emit_as(
                    &slot.agent_id,
                    EventKind::AgentFailed {
                        role,
                        round,
                        error: error.clone(),
                        duration_ms,
                    },
                )?;
            }
        }
        Ok(())
    }
}

async fn next(
    stream: &mut Option<futures::stream::BoxStream<'static, Delivery>>,
) -> Option<Delivery> {
    match stream {
        Some(stream) => stream.next().await,
        None => None,
    }
}

/// Publishes one agent's answer on `agent.response.completed` (or
/// `agent.response.failed`): task and agent ids, role, the proposal or
/// the error, round, model, duration and time. The collector reads it
/// back; any subscriber of the caller's namespace may read it too.
struct Publisher {
    bus: Arc<dyn Bus>,
    namespace: String,
    task_id: Uuid,
    agent_id: String,
    role: String,
    model: String,
    round: u32,
    num_agents: u32,
}

impl Publisher {
    /// True once published; false when the bus refused it.
    async fn answer(&self, result: &Result<String, String>, duration_ms: u64) -> bool {
        let (subject, proposal, error, status) = match result {
            Ok(content) => (
                COMPLETED,
                json!({"content": content, "author_id": self.agent_id, "author_role": self.role}),
                None,
                "completed",
            ),
            Err(error) => (FAILED, json!(null), Some(error.as_str()), "failed"),
        };
        let payload = json!({
            "task_id": self.task_id,
            "agent_id": self.agent_id,
            "role": self.role,
            "proposal": proposal,
            "status": status,
            "error": error,
            "round": self.round,
            "num_agents": self.num_agents,
            "model": self.model,
            "duration_ms": duration_ms,
            "timestamp": chrono::Utc::now(),
        });
        let Ok(subject) = Subject::parse(subject) else {
            return false;
        };
        match self
            .bus
            .publish(&self.namespace, &subject, Bytes::from(payload.to_string()))
            .await
        {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(agent = %self.agent_id, error = %e, "publishing an agent's answer");
                false
            }
        }
    }
}
