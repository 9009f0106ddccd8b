//! Agent profiles: named agents of the server's configuration
//! (`[agents.NAME]`), each a session kind and the options its sessions
//! start with. Protocol adapters and clients that address an agent by name
//! (AG-UI's `/ag-ui/{agent}`, the LangGraph API's assistants) resolve it
//! here; a session kind's own name (`agent`, `deliberation`, `pipeline`)
//! is an agent too, with no options of its own.

use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::config::{AgentProfile, Config};
use crate::protocol::SessionKind;
use crate::session::{SessionError, Tasks};

/// An agent resolved by name: what a new session of it is made with.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Agent {
    pub name: String,
    pub description: Option<String>,
    pub kind: String,
    /// The options its sessions start with, before a caller's own.
    #[serde(skip)]
    pub options: Map<String, Value>,
    /// The model its sessions use, where its options name one.
    pub model: Option<String>,
}

impl Agent {
    /// The session options for a new session of this agent: its own with
    /// `overrides` merged on top (a JSON merge patch: objects merge key by
    /// key, `null` removes).
    pub fn options_with(&self, overrides: Option<&Map<String, Value>>) -> Map<String, Value> {
        let mut options = Value::Object(self.options.clone());
        if let Some(overrides) = overrides {
            merge_patch(&mut options, Value::Object(overrides.clone()));
        }
        match options {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }
}

/// The agent named `name`: a configured profile, else a session kind this
/// server runs.
pub fn resolve(config: &Config, tasks: &Tasks, name: &str) -> Option<Agent> {
    if let Some(profile) = config.agents.get(name) {
        return Some(agent(name, profile));
    }
    tasks.get(name)?;
    Some(Agent {
        name: name.to_owned(),
        description: Some(format!("a plain {name} session")),
        kind: name.to_owned(),
        options: Map::new(),
        model: None,
    })
}

/// Every agent: the configured profiles, then the session kinds.
pub fn list(config: &Config, tasks: &Tasks) -> Vec<Agent> {
    let mut agents: Vec<Agent> = config
        .agents
        .iter()
        .map(|(name, profile)| agent(name, profile))
        .collect();
    let mut kinds = tasks.kinds();
    kinds.sort_unstable();
    agents.extend(
        kinds
            .into_iter()
            .filter_map(|kind| resolve(config, tasks, kind)),
    );
    agents
}

fn agent(name: &str, profile: &AgentProfile) -> Agent {
    Agent {
        name: name.to_owned(),
        description: profile.description.clone(),
        kind: profile
            .kind
            .clone()
            .unwrap_or_else(|| SessionKind::AGENT.as_str().to_owned()),
        options: profile.options.clone(),
        model: profile
            .options
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_owned),
    }
}

/// Checks each profile's options as a new session of its kind would, so
/// that a wrong one stops the server at start rather than its first use.
pub async fn check(config: &Config, tasks: &Tasks) -> Result<(), String> {
    for (name, profile) in &config.agents {
        let agent = agent(name, profile);
        let body = Map::from_iter([("options".to_owned(), Value::Object(agent.options.clone()))]);
        let wrong = |e: SessionError| format!("agents.{name}: {e}");
        let task = tasks.require(&agent.kind, "kind").map_err(wrong)?;
        task.options(&body, &[]).await.map_err(wrong)?;
    }
    Ok(())
}

/// RFC 7396 merge patch: objects merge key by key, `null` removes a key,
/// anything else replaces.
pub fn merge_patch(target: &mut Value, patch: Value) {
    match patch {
        Value::Object(patch) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Some(map) = target.as_object_mut() {
                for (key, value) in patch {
                    if value.is_null() {
                        map.remove(&key);
                    } else {
                        merge_patch(map.entry(key).or_insert(Value::Null), value);
                    }
                }
            }
        }
        other => *target = other,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merge_patch_merges_objects_and_removes_nulls() {
        let mut options =
            json!({"model": "a", "sandbox": {"cpus": 1.0, "image": "x"}, "max_turns": 3});
        merge_patch(
            &mut options,
            json!({"model": "b", "sandbox": {"cpus": 2.0, "image": null}, "max_turns": null}),
        );
        assert_eq!(options, json!({"model": "b", "sandbox": {"cpus": 2.0}}));
    }

    #[test]
    fn a_profile_s_options_take_the_caller_s_on_top() {
        let agent = agent(
            "coder",
            &AgentProfile {
                description: None,
                kind: None,
                options: json!({"model": "demo", "permissions": {"mode": "ask"}})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            },
        );
        assert_eq!(agent.kind, "agent");
        assert_eq!(agent.model.as_deref(), Some("demo"));
        let overrides = json!({"permissions": {"mode": null}, "max_turns": 2});
        let options = agent.options_with(overrides.as_object());
        assert_eq!(
            Value::Object(options),
            json!({"model": "demo", "permissions": {}, "max_turns": 2})
        );
    }
}
