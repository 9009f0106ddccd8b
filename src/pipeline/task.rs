//! The `pipeline` session kind: a message starts the session's run (or
//! resumes it after a crash, a cancel or the timeout); the turn streams
//! `node_started`, `node_completed`, `route`, `checkpoint` and
//! `pipeline_completed`, with the node agents' own events tagged by node.

use async_trait::async_trait;
use serde_json::{Map, Value};
use uuid::Uuid;

use super::engine::{self, Deps};
use super::{Definition, KIND, PipelineOptions, agents, runs};
use crate::protocol::SessionKind;
use crate::session::{OptionError, Outcome, Preset, SessionError, SessionTask, Turn};
use crate::store::StoreError;

pub struct PipelineTask {
    deps: Deps,
}

impl PipelineTask {
    pub fn new(deps: Deps) -> PipelineTask {
        PipelineTask { deps }
    }
}

#[async_trait]
impl SessionTask for PipelineTask {
    fn kind(&self) -> SessionKind {
        KIND
    }

    async fn options(
        &self,
        body: &Map<String, Value>,
        fields: &[&str],
    ) -> Result<Value, SessionError> {
        let options: PipelineOptions = crate::session::options::from_body(body, fields)?;
        let Some(definition) = self.deps.definitions.get(&options.pipeline) else {
            let known: Vec<&str> = self.deps.definitions.keys().map(String::as_str).collect();
            return Err(OptionError::new(
                "options.pipeline",
                format!(
                    "unknown pipeline {:?}; this server has {}",
                    options.pipeline,
                    known.join(", ")
                ),
            )
            .into());
        };
        if let Some(field) = options
            .input
            .keys()
            .find(|f| !definition.state.contains_key(*f))
        {
            return Err(OptionError::new(
                format!("options.input.{field}"),
                format!("not a state field of the {} pipeline", definition.name),
            )
            .into());
        }
        if let Some(mock) = &options.mock
            && mock.delay_ms > agents::MAX_MOCK_DELAY_MS
        {
            return Err(OptionError::new(
                "options.mock.delay_ms",
                format!("at most {} ms", agents::MAX_MOCK_DELAY_MS),
            )
            .into());
        }
        if let Some(permissions) = &options.permissions {
            permissions
                .validate("options.permissions")
                .map_err(|e| OptionError::new(e.field, e.message))?;
        }
        crate::agent::check_hook_url(&self.deps.hook_rules, options.permissions.as_ref()).await?;
        check_connector_name(definition, &options)?;
        serde_json::to_value(&options)
            .map_err(|e| SessionError::Internal(format!("storing options: {e}")))
    }

    fn describe(&self, options: &Value) -> Map<String, Value> {
        let mut shown = Map::new();
        if let Some(pipeline) = options.get("pipeline") {
            shown.insert("pipeline".into(), pipeline.clone());
        }
        shown
    }

    fn presets(&self) -> Vec<Preset> {
        self.deps
            .definitions
            .values()
            .map(|definition| Preset {
                name: definition.name.clone(),
                description: if definition.description.is_empty() {
                    format!("the {} pipeline", definition.name)
                } else {
                    definition.description.clone()
                },
                options: Map::from_iter([("pipeline".to_owned(), definition.name.clone().into())]),
            })
            .collect()
    }

    async fn run(&self, turn: &mut Turn, input: String) -> Result<Outcome, StoreError> {
        engine::run(&self.deps, turn, input).await
    }

    fn resumes_when_cut_off(&self) -> bool {
        true
    }

    async fn delete(&self, session: Uuid) {
        match runs::remove(self.deps.store.as_ref(), session).await {
            Ok(Some(worker)) => {
                if let Some(manager) = self.deps.sessions.upgrade() {
                    let _ = manager.delete(worker, None).await;
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(%session, error = %e, "removing a pipeline run"),
        }
    }
}

/// A definition whose state has a `connector_name` with no default (the
/// built-in connector's does) writes it into its agents' prompts, which
/// would otherwise ask for a connector to `null`; one without that field
/// (a triage pipeline of the user's own) needs none.
fn check_connector_name(
    definition: &Definition,
    options: &PipelineOptions,
) -> Result<(), OptionError> {
    let needed = definition
        .state
        .get("connector_name")
        .is_some_and(|spec| spec.default.is_none());
    let given = options
        .connector_name
        .as_deref()
        .or_else(|| options.input.get("connector_name").and_then(Value::as_str));
    match given {
        Some(name) if name.trim().is_empty() => {
            Err(OptionError::new("connector_name", "must not be empty"))
        }
        None if needed => Err(OptionError::new(
            "connector_name",
            format!(
                "is required by the {} pipeline (the name of the service to connect, \
                 e.g. \"stripe\")",
                definition.name
            ),
        )),
        _ => Ok(()),
    }
}
