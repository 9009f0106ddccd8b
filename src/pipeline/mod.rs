//! Pipelines: graphs of agent nodes with conditional routing,
//! retry counters with limits, state reducers and a durable checkpoint
//! after every node; start, status, history, resume, fork and cancel.
//!
//! - [`definition`]: a pipeline read from YAML and checked (errors name
//!   the file, line and place), its routing, and the built-in `connector`
//!   pipeline.
//! - [`state`]: the run's state fields and their reducers.
//! - [`engine`]: a run as the turns of its session: node, reducers, route,
//!   checkpoint; resume after the last checkpoint; the concurrency cap and
//!   the timeout.
//! - [`agents`]: who answers a node: test mode's mock agents, or an agent
//!   turn with real tools in the run's sandbox.
//! - [`runs`]: `thread_id`s and the REST paths' start, status, history,
//!   resume, cancel and active runs.
//! - [`fork`]: a new run from one of another run's checkpoints, its state
//!   patched and its routing decided again.
//! - [`task`]: the `pipeline` session kind.

pub mod agents;
pub mod definition;
pub mod engine;
pub mod fork;
pub mod runs;
pub mod state;
pub mod task;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use crate::config::PipelineConfig;
pub use definition::{CONNECTOR_YAML, Definition, DefinitionError, Route};
pub use state::{FieldSpec, Reducer};
pub use task::PipelineTask;

use crate::protocol::SessionKind;

pub const KIND: SessionKind = SessionKind::named("pipeline");

/// A run's options (a `pipeline` session's, or the body of
/// `POST /orchestrator/pipeline/start`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineOptions {
    #[serde(default = "default_pipeline")]
    pub pipeline: String,
    #[serde(default)]
    pub connector_name: Option<String>,
    #[serde(default)]
    pub connector_type: Option<String>,
    /// Initial values of state fields.
    #[serde(default)]
    pub input: Map<String, Value>,
    /// The model of the nodes' agent.
    #[serde(default)]
    pub model: Option<String>,
    /// Mock agents answer this run's nodes, as this script says (`{}`:
    /// the happy path), whether or not the server is in test mode.
    #[serde(default)]
    pub mock: Option<agents::MockScript>,
    /// The nodes' tool calls: what runs, what waits for a decision, what
    /// never runs (as an agent session's `permissions`); a node that
    /// waits shows so in the run's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<crate::permission::Permissions>,
}

fn default_pipeline() -> String {
    "connector".into()
}

/// The pipelines a server runs: the built-in connector (its limits as
/// the config sets them) and every definition in `pipelines.dir`, their
/// nodes' models checked by `models`; the first error stops the start and
/// names the file.
pub fn definitions(
    config: &PipelineConfig,
    models: &dyn Fn(&str) -> Result<(), String>,
) -> Result<BTreeMap<String, Arc<Definition>>, DefinitionError> {
    let mut connector = Definition::parse(CONNECTOR_YAML, "connector.yaml (built in)")?;
    for (setting, limit) in &config.limits {
        if let Some(counter) = crate::config::pipelines::counter_of(setting) {
            connector.counters.insert(counter.to_owned(), *limit);
        }
    }
    let mut all = BTreeMap::from([(connector.name.clone(), Arc::new(connector))]);
    let Some(dir) = &config.dir else {
        return Ok(all);
    };
    let unreadable = |file: String, message: String| DefinitionError {
        file,
        line: 0,
        place: "file".into(),
        message,
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        // An optional directory that is not there yet holds no pipelines:
        // the server starts, and says where it looked.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!(
                dir = %dir.display(),
                "pipelines.dir does not exist; only the built-in pipelines are loaded"
            );
            return Ok(all);
        }
        Err(e) => {
            return Err(unreadable(
                dir.display().to_string(),
                format!("cannot read the directory: {e}"),
            ));
        }
    };
    let mut files: Vec<std::path::PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            )
        })
        .collect();
    files.sort();
    for path in files {
        let file = path.display().to_string();
        let text =
            std::fs::read_to_string(&path).map_err(|e| unreadable(file.clone(), e.to_string()))?;
        let definition = Definition::parse(&text, &file)?;
        definition.check_models(&text, &file, models)?;
        if all.contains_key(&definition.name) {
            return Err(DefinitionError {
                file,
                line: 1,
                place: "name".into(),
                message: format!("a pipeline named {:?} is already defined", definition.name),
            });
        }
        all.insert(definition.name.clone(), Arc::new(definition));
    }
    Ok(all)
}
