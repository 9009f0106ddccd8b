//! The `deliberation` session kind: each message is a task; the turn runs
//! a deliberation on it and streams its events.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value};
use uuid::Uuid;

use super::engine::{self, Deps};
use super::records;
use super::{DeliberationOptions, KIND};
use crate::protocol::SessionKind;
use crate::session::{OptionError, Outcome, Session, SessionError, SessionTask, Turn};
use crate::store::StoreError;

pub struct DeliberationTask {
    deps: Deps,
}

impl DeliberationTask {
    pub fn new(deps: Deps) -> DeliberationTask {
        DeliberationTask { deps }
    }
}

#[async_trait]
impl SessionTask for DeliberationTask {
    fn kind(&self) -> SessionKind {
        KIND
    }

    async fn options(
        &self,
        body: &Map<String, Value>,
        fields: &[&str],
    ) -> Result<Value, SessionError> {
        let options = DeliberationOptions::from_body(body, fields)?;
        let models = options.models.iter().chain(options.judge_model.iter());
        for (i, model) in models.enumerate() {
            self.deps.models.resolve(model).map_err(|e| {
                let field = if i < options.models.len() {
                    format!("options.models[{i}]")
                } else {
                    "options.judge_model".to_owned()
                };
                OptionError::new(field, e.to_string())
            })?;
        }
        // Agents that name no model use the default, which may have to be
        // read from a provider's listing: a deliberation without one is
        // refused here rather than failing in each of its agents.
        if options.models.is_empty() {
            self.deps
                .models
                .default_model_now()
                .await
                .map_err(|e| OptionError::new("options.models", e.to_string()))?;
        }
        crate::agent::check_hook_url(&self.deps.hook_rules, options.permissions.as_ref()).await?;
        serde_json::to_value(&options)
            .map_err(|e| SessionError::Internal(format!("storing options: {e}")))
    }

    fn describe(&self, options: &Value) -> Map<String, Value> {
        let mut shown = Map::new();
        for key in [
            "role",
            "num_agents",
            "rounds",
            "aggregate",
            "models",
            "tools",
        ] {
            if let Some(value) = options.get(key) {
                shown.insert(key.to_owned(), value.clone());
            }
        }
        shown
    }

    async fn run(&self, turn: &mut Turn, input: String) -> Result<Outcome, StoreError> {
        engine::run(&self.deps, turn, input).await
    }

    /// Finishes the deliberation a crash cut off with the answers its log
    /// holds: COMPLETED or FAILED, never pending for ever.
    async fn close_cut_off(&self, session: &Arc<Session>) -> Result<(), StoreError> {
        let store = self.deps.store.as_ref();
        for (task_id, owner, pending) in records::of_session(store, session.id).await? {
            if !pending {
                continue;
            }
            let Some(mut stored) = records::get(store, owner.as_deref(), task_id).await? else {
                continue;
            };
            let events = store
                .events_since(session.id, stored.since, usize::MAX)
                .await?;
            stored.fold(&events);
            stored.finish(Some("restarted"));
            tracing::warn!(task = %task_id, answered = stored.result.successful_responses,
                "finished a deliberation the last stop cut off");
            engine::finish(&self.deps, session, &stored).await?;
        }
        Ok(())
    }

    async fn delete(&self, session: Uuid) {
        let store = self.deps.store.as_ref();
        let Ok(tasks) = records::of_session(store, session).await else {
            return;
        };
        for (task_id, owner, _) in tasks {
            if let Ok(Some(stored)) = records::get(store, owner.as_deref(), task_id).await {
                engine::delete_children(&self.deps, &stored).await;
            }
            if let Err(e) = records::remove(store, owner.as_deref(), task_id, session).await {
                tracing::warn!(task = %task_id, error = %e, "removing a deliberation's record");
            }
        }
    }
}
