//! A fork: a new run that goes on from one of another run's checkpoints
//! (LangGraph's fork after `update_state`). The new run's history is the
//! source's up to that step; its state there is the checkpoint's with the
//! caller's patch on top, and the routing after the step is decided again
//! on the patched state, so a changed state can take another branch. The
//! source is only read: a running source can be forked from what it has
//! stored.

use std::collections::BTreeMap;

use chrono::Utc;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::definition::{Definition, Route};
use super::engine::{END, Step, step_of};
use super::runs::{self, RunError, Runs};
use super::{KIND, PipelineOptions};
use crate::protocol::EventKind;
use crate::session::{NewSession, OptionError, Session};
use crate::store::{Checkpoint, StoreError};

/// What a fork asks for (the body of `POST
/// /orchestrator/pipeline/fork/{thread_id}`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// The checkpoint to go on from; the source's last when not given.
    #[serde(default)]
    pub step: Option<u64>,
    /// State fields that replace the checkpoint's before the routing is
    /// decided again: a JSON object of the pipeline's state fields.
    #[serde(default)]
    pub state: Option<Value>,
    /// The new run's session name.
    #[serde(default)]
    pub session_name: Option<String>,
}

/// A fork that has started.
#[derive(Debug, Clone, Serialize)]
pub struct Forked {
    pub thread_id: String,
    pub session_id: Uuid,
    pub pipeline: String,
    pub status: &'static str,
    pub from_thread: String,
    pub from_step: u64,
}

/// How many events one read of the source's log takes while the fork
/// looks for the event of its checkpoint.
const EVENT_PAGE: usize = 500;

impl Runs {
    /// Starts a new run of `owner`'s from a checkpoint of their run
    /// `thread_id`; another owner's run is "not found".
    pub async fn fork(
        &self,
        owner: Option<String>,
        thread_id: &str,
        request: ForkRequest,
    ) -> Result<Forked, RunError> {
        let (source, session) = self.find(owner.as_deref(), thread_id).await?;
        let Some(definition) = self.definitions.get(&source.pipeline).cloned() else {
            return Err(RunError::Conflict(
                thread_id.to_owned(),
                format!(
                    "a run of {:?}, a pipeline this server no longer has",
                    source.pipeline
                ),
            ));
        };
        let patch = patch_of(&definition, request.state)?;
        let checkpoints = self.store.checkpoints(session.id).await?;
        let index = at(thread_id, &checkpoints, request.step)?;
        let from_step = checkpoints[index].step;
        let before = match index.checked_sub(1) {
            Some(i) => step_of(&checkpoints[i])?.counters,
            None => BTreeMap::new(),
        };
        let mut point = step_of(&checkpoints[index])?;
        point.state.extend(patch);
        reroute(&definition, thread_id, from_step, &mut point, before)?;
        let at_seq = checkpoint_seq(self, &session, from_step, &point.node).await?;

        let options: PipelineOptions = serde_json::from_value((*session.options).clone())
            .map_err(|e| StoreError::Corrupt(format!("pipeline options: {e}")))?;
        // A fork is a copy of the session: the adapter that made it and
        // its labels come with it.
        let metadata = self.sessions.metadata(session.id).await?;
        let fork = self
            .sessions
            .create(NewSession {
                name: request.session_name,
                kind: KIND,
                owner,
                options: (*session.options).clone(),
                ephemeral: false,
                origin: session.origin.clone(),
                metadata,
            })
            .await?;
        let started = self
            .start_fork(&fork, &options, &checkpoints[..index], (from_step, point))
            .await;
        let record = match started {
            Ok(record) => record,
            Err(e) => {
                // A fork that could not start leaves no half-copied run.
                let _ = self.sessions.delete(fork.id, None).await;
                return Err(e);
            }
        };
        fork.emit(EventKind::Forked {
            from_session: session.id,
            at_seq,
            history_len: None,
        })?;
        self.sessions.start_turn(fork, String::new(), false).await?;
        Ok(Forked {
            thread_id: record.thread_id,
            session_id: record.session_id,
            pipeline: record.pipeline,
            status: "started",
            from_thread: source.thread_id,
            from_step,
        })
    }

    /// The fork's run and its history: the source's checkpoints before
    /// the step as they are, then the step with the patched state.
    async fn start_fork(
        &self,
        fork: &Session,
        options: &PipelineOptions,
        earlier: &[Checkpoint],
        (step, point): (u64, Step),
    ) -> Result<runs::RunRecord, RunError> {
        let record = runs::record_of(self.store.as_ref(), fork, options).await?;
        for checkpoint in earlier {
            let mut step = step_of(checkpoint)?;
            step.thread_id = record.thread_id.clone();
            self.put_step(fork.id, checkpoint.step, &step, checkpoint.created_at)
                .await?;
        }
        let point = Step {
            thread_id: record.thread_id.clone(),
            ..point
        };
        // The patched step is new state, written now.
        self.put_step(fork.id, step, &point, Utc::now()).await?;
        Ok(record)
    }

    async fn put_step(
        &self,
        session: Uuid,
        step: u64,
        data: &Step,
        created_at: chrono::DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let state = serde_json::to_value(data)
            .map_err(|e| StoreError::Corrupt(format!("encoding step {step}: {e}")))?;
        self.store
            .put_checkpoint(&Checkpoint {
                session_id: session,
                step,
                name: data.node.clone(),
                state,
                created_at,
            })
            .await
    }
}

/// The caller's state patch: an object of the pipeline's state fields.
fn patch_of(definition: &Definition, state: Option<Value>) -> Result<Map<String, Value>, RunError> {
    let patch = match state {
        None => return Ok(Map::new()),
        Some(Value::Object(patch)) => patch,
        Some(_) => {
            return Err(OptionError::new(
                "state",
                "must be a JSON object of state fields and their values",
            )
            .into());
        }
    };
    if let Some(field) = patch.keys().find(|f| !definition.state.contains_key(*f)) {
        let fields: Vec<&str> = definition.state.keys().map(String::as_str).collect();
        return Err(OptionError::new(
            format!("state.{field}"),
            format!(
                "not a state field of the {} pipeline; its fields: {}",
                definition.name,
                if fields.is_empty() {
                    "none".to_owned()
                } else {
                    fields.join(", ")
                }
            ),
        )
        .into());
    }
    Ok(patch)
}

/// The index of the checkpoint to fork at: `step`, or the last.
fn at(thread_id: &str, checkpoints: &[Checkpoint], step: Option<u64>) -> Result<usize, RunError> {
    let found = match step {
        Some(step) => checkpoints.iter().position(|c| c.step == step),
        None => checkpoints.len().checked_sub(1),
    };
    found.ok_or_else(|| {
        let steps: Vec<String> = checkpoints
            .iter()
            .map(|c| format!("{} ({})", c.step, c.name))
            .collect();
        RunError::UnknownStep {
            thread_id: thread_id.to_owned(),
            step: step.unwrap_or(0),
            steps: if steps.is_empty() {
                "none yet".to_owned()
            } else {
                steps.join(", ")
            },
        }
    })
}

/// Decides again where the run goes after the step's node, on the
/// patched state and the counters as they were before the step; a step
/// that only records how a run stopped keeps its next node. A fork whose
/// run would end there is refused: it would have nothing to run.
fn reroute(
    definition: &Definition,
    thread_id: &str,
    step: u64,
    point: &mut Step,
    mut counters: BTreeMap<String, u32>,
) -> Result<(), RunError> {
    if point.node == END {
        return Ok(());
    }
    let decision = point.decision.clone().unwrap_or_default();
    let ends = |how: String| {
        RunError::Conflict(
            thread_id.to_owned(),
            format!(
                "ended at step {step} ({}): {how}; fork at an earlier step, or with a state \
                 that routes on",
                point.node
            ),
        )
    };
    match definition.route(&point.node, &decision, &counters, &point.state) {
        Route::Next { to, counter, .. } => {
            if let Some(counter) = counter {
                *counters.entry(counter).or_default() += 1;
            }
            point.next = Some(to);
            point.status = "running".into();
            point.reason = None;
            point.counters = counters;
            Ok(())
        }
        Route::Done => Err(ends(format!("{} is terminal", point.node))),
        Route::Fail(reason) => Err(ends(reason)),
    }
}

/// The seq of the source's event for the step: its `checkpoint` event,
/// or for a step that records how the run stopped, its
/// `pipeline_completed`; 0 when the log has none (a run cut off between
/// storing the checkpoint and its event). It reads the source's log up to
/// that event.
async fn checkpoint_seq(
    runs: &Runs,
    source: &Session,
    step: u64,
    node: &str,
) -> Result<u64, RunError> {
    // A running source may hold events not stored yet.
    source.flush().await?;
    let mut since = 0;
    loop {
        let page = runs
            .store
            .events_since(source.id, since, EVENT_PAGE)
            .await?;
        let Some(last) = page.last() else {
            return Ok(0);
        };
        since = last.seq;
        let found = page.iter().find(|event| match &event.kind {
            EventKind::Checkpoint { step: at, .. } => *at == step,
            EventKind::PipelineCompleted { steps, .. } => node == END && *steps == step,
            _ => false,
        });
        if let Some(event) = found {
            return Ok(event.seq);
        }
    }
}
