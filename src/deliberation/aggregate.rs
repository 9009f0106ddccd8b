//! The decision after the last round: a judge agent picks one proposal and
//! says why, or the agents vote on each other's proposals and the tally
//! decides (a tie goes to the earliest agent, and the reasoning says so).

use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde_json::json;

use super::agents::{AgentWork, Worker};
use super::engine::Run;
use super::prompts::{self, Prompt};
use crate::protocol::EventKind;
use crate::protocol::deliberation::{Aggregate, Decision};
use crate::session::Turn;
use crate::store::StoreError;

/// The decision, if the options ask for one and an agent proposed.
pub(super) async fn decide(run: &Run<'_>, turn: &mut Turn) -> Result<Option<Decision>, StoreError> {
    let method = run.options.aggregate;
    if method == Aggregate::None {
        return Ok(None);
    }
    // The proposals in agent order: (slot index, content).
    let proposals: Vec<(usize, &str)> = run
        .slots
        .iter()
        .enumerate()
        .filter_map(|(i, slot)| slot.proposal.as_deref().map(|p| (i, p)))
        .collect();
    let decision = match proposals.as_slice() {
        [] => return Ok(None),
        [(only, content)] => Decision {
            method,
            choice: run.slots[*only].agent_id.clone(),
            content: (*content).to_owned(),
            reasoning: "the only proposal".into(),
            votes: None,
        },
        _ if method == Aggregate::Judge => judge(run, turn, &proposals).await?,
        _ => vote(run, turn, &proposals).await?,
    };
    run.session.emit(EventKind::Decision {
        decision: decision.clone(),
    })?;
    Ok(Some(decision))
}

fn time_left(run: &Run<'_>) -> Duration {
    run.deadline
        .saturating_duration_since(tokio::time::Instant::now())
        .max(Duration::from_millis(1))
}

/// A plain model worker on `model` with `system`.
fn model_worker(run: &Run<'_>, model: &str, system: Prompt) -> Result<Worker, String> {
    run.deps
        .models
        .resolve(model)
        .map(|model| Worker::Model {
            model: Box::new(model),
            system,
            jobs: run.deps.jobs.clone(),
        })
        .map_err(|e| e.to_string())
}

async fn judge(
    run: &Run<'_>,
    turn: &mut Turn,
    proposals: &[(usize, &str)],
) -> Result<Decision, StoreError> {
    let default = run
        .deps
        .models
        .default_model()
        .unwrap_or_default()
        .to_owned();
    let model = run
        .options
        .judge_model
        .clone()
        .unwrap_or_else(|| run.options.model_of(0, &default));
    run.session.emit(EventKind::Status {
        message: format!(
            "The judge ({model}) is reading {} proposals.",
            proposals.len()
        ),
    })?;
    let first = |why: String| Decision {
        method: Aggregate::Judge,
        choice: run.slots[proposals[0].0].agent_id.clone(),
        content: proposals[0].1.to_owned(),
        reasoning: format!("{why}; the first proposal is kept"),
        votes: None,
    };
    let system = Prompt::Text(prompts::judge_system(&run.options.role).into());
    let worker = match model_worker(run, &model, system) {
        Ok(worker) => worker,
        Err(e) => return Ok(first(format!("the judge could not start: {e}"))),
    };
    let answer = worker
        .answer(AgentWork {
            agent_id: format!("judge-{}", run.options.role.to_lowercase()),
            prompt: Prompt::Choose {
                task: run.task.clone(),
                proposals: proposals.iter().map(|&(i, _)| run.proposal_of(i)).collect(),
                voter: false,
            },
            temperature: 0.0,
            max_tokens: Some(run.max_tokens(1)),
            timeout: time_left(run),
            budget: run.budget.clone(),
            permits: run.deps.permits.clone(),
            parent: run.session.clone(),
        })
        .await;
    turn.usage.add(&answer.usage);
    Ok(match answer.result {
        Err(e) => first(format!("the judge failed ({e})")),
        Ok(text) => match prompts::read_choice(&text, proposals.len()) {
            Some(choice) => {
                let (index, content) = proposals[choice.number - 1];
                Decision {
                    method: Aggregate::Judge,
                    choice: run.slots[index].agent_id.clone(),
                    content: content.to_owned(),
                    reasoning: choice.reasoning.unwrap_or_else(|| {
                        format!(
                            "the judge named proposal {} without a reason",
                            choice.number
                        )
                    }),
                    votes: None,
                }
            }
            None => first(format!(
                "the judge's answer named no proposal ({:?})",
                text.chars().take(200).collect::<String>()
            )),
        },
    })
}

async fn vote(
    run: &Run<'_>,
    turn: &mut Turn,
    proposals: &[(usize, &str)],
) -> Result<Decision, StoreError> {
    run.session.emit(EventKind::Status {
        message: format!("{} agents vote on each other's proposals.", proposals.len()),
    })?;
    let mut ballots = FuturesUnordered::new();
    for &(voter, _) in proposals {
        // What this voter sees: the proposals of the agents after it, in
        // turn (at most `PEERS_SHOWN`), in agent order, never its own.
        let candidates = run.peers_of(voter);
        let slot = &run.slots[voter];
        let worker = model_worker(run, &slot.model, run.system_prompt(&slot.agent_id));
        let call = AgentWork {
            agent_id: slot.agent_id.clone(),
            prompt: Prompt::Choose {
                task: run.task.clone(),
                proposals: candidates.iter().map(|&i| run.proposal_of(i)).collect(),
                voter: true,
            },
            temperature: 0.0,
            max_tokens: Some(run.max_tokens(proposals.len() as u64)),
            timeout: time_left(run),
            budget: run.budget.clone(),
            permits: run.deps.permits.clone(),
            parent: run.session.clone(),
        };
        ballots.push(async move {
            let answer = match worker {
                Ok(worker) => Some(worker.answer(call).await),
                Err(_) => None,
            };
            (voter, candidates, answer)
        });
    }
    let mut chosen: Vec<(usize, Option<usize>)> = Vec::new();
    while let Some((voter, candidates, answer)) = ballots.next().await {
        let mut pick = None;
        if let Some(answer) = answer {
            turn.usage.add(&answer.usage);
            if let Ok(text) = answer.result {
                pick = prompts::read_choice(&text, candidates.len())
                    .map(|choice| candidates[choice.number - 1]);
            }
        }
        chosen.push((voter, pick));
    }
    chosen.sort();
    Ok(tally(run, proposals, &chosen))
}

/// Counts the ballots `(voter, choice)`; the most votes win, a tie goes to
/// the earliest agent.
fn tally(
    run: &Run<'_>,
    proposals: &[(usize, &str)],
    ballots: &[(usize, Option<usize>)],
) -> Decision {
    let name = |i: usize| run.slots[i].agent_id.clone();
    let count = |candidate: usize| {
        ballots
            .iter()
            .filter(|(_, c)| *c == Some(candidate))
            .count()
    };
    let most = proposals.iter().map(|(i, _)| count(*i)).max().unwrap_or(0);
    let tied: Vec<usize> = proposals
        .iter()
        .map(|(i, _)| *i)
        .filter(|i| count(*i) == most)
        .collect();
    let winner = tied[0];
    let cast = ballots.iter().filter(|(_, c)| c.is_some()).count();
    let mut reasoning = format!("{} got {most} of {cast} votes", name(winner));
    if tied.len() > 1 {
        let others: Vec<String> = tied[1..].iter().map(|&i| name(i)).collect();
        reasoning.push_str(&format!(
            "; tied with {}, the tie went to the earliest agent",
            others.join(", ")
        ));
    }
    let abstained = ballots.len() - cast;
    if abstained > 0 {
        reasoning.push_str(&format!("; {abstained} ballot(s) named no proposal"));
    }
    let votes: serde_json::Map<String, serde_json::Value> = proposals
        .iter()
        .map(|(i, _)| (name(*i), json!(count(*i))))
        .collect();
    let ballots: serde_json::Map<String, serde_json::Value> = ballots
        .iter()
        .map(|(voter, choice)| (name(*voter), json!(choice.map(name))))
        .collect();
    let content = proposals
        .iter()
        .find(|(i, _)| *i == winner)
        .map(|(_, p)| (*p).to_owned())
        .unwrap_or_default();
    Decision {
        method: Aggregate::Vote,
        choice: name(winner),
        content,
        reasoning,
        votes: Some(json!({"tally": votes, "ballots": ballots})),
    }
}
