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
use crate::session::{Preset, SessionError, Tasks};

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
/// server runs, else one of a kind's presets (`pipeline:triage`).
pub fn resolve(config: &Config, tasks: &Tasks, name: &str) -> Option<Agent> {
    if let Some(profile) = config.agents.get(name) {
        return Some(agent(name, profile));
    }
    if tasks.get(name).is_some() {
        return Some(plain(name));
    }
    let (kind, preset) = name.split_once(':')?;
    let preset = tasks
        .get(kind)?
        .presets()
        .into_iter()
        .find(|p| p.name == preset)?;
    Some(from_preset(kind, preset))
}

/// Every agent: the configured profiles, then each session kind followed
/// by its presets.
pub fn list(config: &Config, tasks: &Tasks) -> Vec<Agent> {
    let mut agents: Vec<Agent> = config
        .agents
        .iter()
        .map(|(name, profile)| agent(name, profile))
        .collect();
    let mut kinds = tasks.kinds();
    kinds.sort_unstable();
    // A profile's name is never a kind's (config validation) nor has a
    // ':', so nothing here hides anything else.
    for kind in kinds {
        agents.push(plain(kind));
        let presets = tasks.get(kind).map(|t| t.presets()).unwrap_or_default();
        agents.extend(presets.into_iter().map(|p| from_preset(kind, p)));
    }
    agents
}

/// A session kind as an agent: no options of its own.
fn plain(kind: &str) -> Agent {
    Agent {
        name: kind.to_owned(),
        description: Some(format!("a plain {kind} session")),
        kind: kind.to_owned(),
        options: Map::new(),
        model: None,
    }
}

fn from_preset(kind: &str, preset: Preset) -> Agent {
    Agent {
        name: format!("{kind}:{}", preset.name),
        description: Some(preset.description),
        kind: kind.to_owned(),
        model: preset
            .options
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_owned),
        options: preset.options,
    }
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

    /// A kind with two ready-made agents.
    struct Kinded;

    #[async_trait::async_trait]
    impl crate::session::SessionTask for Kinded {
        fn kind(&self) -> SessionKind {
            SessionKind::new("flow".to_owned())
        }

        async fn options(
            &self,
            _body: &Map<String, Value>,
            _fields: &[&str],
        ) -> Result<Value, SessionError> {
            Ok(json!({}))
        }

        fn presets(&self) -> Vec<Preset> {
            ["b", "a"]
                .map(|name| Preset {
                    name: name.to_owned(),
                    description: format!("flow {name}"),
                    options: json!({"flow": name})
                        .as_object()
                        .cloned()
                        .unwrap_or_default(),
                })
                .into()
        }

        async fn run(
            &self,
            _turn: &mut crate::session::Turn,
            _input: String,
        ) -> Result<crate::session::Outcome, crate::store::StoreError> {
            Ok(crate::session::Outcome::new(
                crate::protocol::ResultStatus::Success,
                None,
            ))
        }
    }

    #[test]
    fn a_kind_s_presets_are_agents_named_kind_colon_name() {
        let config = Config::default();
        let tasks = Tasks::new().with(std::sync::Arc::new(Kinded));
        let names: Vec<String> = list(&config, &tasks).into_iter().map(|a| a.name).collect();
        assert_eq!(names, ["flow", "flow:b", "flow:a"]);
        let preset = resolve(&config, &tasks, "flow:a").expect("a preset");
        assert_eq!(preset.kind, "flow");
        assert_eq!(preset.description.as_deref(), Some("flow a"));
        assert_eq!(Value::Object(preset.options), json!({"flow": "a"}));
        assert_eq!(resolve(&config, &tasks, "flow:c"), None);
        assert_eq!(resolve(&config, &tasks, "other:a"), None);
    }
}
