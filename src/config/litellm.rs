//! LiteLLM proxy configs: `model_list` (+ `litellm_settings`,
//! `router_settings`) read as gateway pools, and pools written back in that
//! format. Entries with the same `model_name` are one pool; the settings
//! LiteLLM applies globally apply to every pool. Keys Conclave has no use
//! for are ignored (and logged), so a full LiteLLM config loads as is.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::gateway::{GatewayConfig, PoolConfig, ReplicaConfig, Strategy};

/// Provider prefixes of `litellm_params.model` that name an
/// OpenAI-compatible server; the rest of the name is the served model.
const OPENAI_COMPATIBLE: &[&str] = &[
    "hosted_vllm/",
    "openai/",
    "vllm/",
    "ollama/",
    "ollama_chat/",
    "text-completion-openai/",
    "llamafile/",
    "lm_studio/",
];

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct LiteLlmConfig {
    #[serde(default)]
    pub model_list: Vec<ModelEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub litellm_settings: Option<Settings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router_settings: Option<Settings>,
    /// Everything else (general_settings, environment_variables, …).
    #[serde(flatten, skip_serializing)]
    pub other: BTreeMap<String, Value>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ModelEntry {
    pub model_name: String,
    pub litellm_params: Params,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_info: Option<Map<String, Value>>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Params {
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_base: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_params: Option<bool>,
    #[serde(flatten, skip_serializing)]
    pub other: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Settings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_params: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_retries: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_strategy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooldown_time: Option<f64>,
    #[serde(flatten, skip_serializing)]
    pub other: BTreeMap<String, Value>,
}

/// The largest LiteLLM config read.
const MAX_CONFIG_BYTES: usize = 4 * 1024 * 1024;

/// Reads a LiteLLM config file's text into pools.
pub fn import(yaml: &str) -> Result<GatewayConfig, String> {
    crate::yaml::check(yaml, MAX_CONFIG_BYTES).map_err(|e| format!("not a LiteLLM config: {e}"))?;
    let config: LiteLlmConfig =
        yaml_serde::from_str(yaml).map_err(|e| format!("not a LiteLLM config: {e}"))?;
    if config.model_list.is_empty() {
        return Err("the LiteLLM config has an empty or missing model_list".into());
    }
    let mut settings = Settings::default();
    // router_settings first, litellm_settings win (a file may have either
    // or both; `export` writes only the latter).
    for source in [&config.router_settings, &config.litellm_settings]
        .into_iter()
        .flatten()
    {
        settings.drop_params = source.drop_params.or(settings.drop_params);
        settings.num_retries = source.num_retries.or(settings.num_retries);
        settings.routing_strategy = source
            .routing_strategy
            .clone()
            .or(settings.routing_strategy);
        settings.request_timeout = source.request_timeout.or(settings.request_timeout);
        settings.cooldown_time = source.cooldown_time.or(settings.cooldown_time);
        if !source.other.is_empty() {
            tracing::info!(keys = ?source.other.keys().collect::<Vec<_>>(), "LiteLLM settings Conclave does not use");
        }
    }
    let strategy = match settings.routing_strategy.as_deref() {
        None => Strategy::Shuffle,
        Some(name) => strategy_from_litellm(name)?,
    };
    let mut pools: BTreeMap<String, PoolConfig> = BTreeMap::new();
    for (index, entry) in config.model_list.iter().enumerate() {
        let field = format!("model_list[{index}]");
        let params = &entry.litellm_params;
        let url = params.api_base.clone().ok_or_else(|| {
            format!("{field}.litellm_params.api_base is missing: Conclave calls replicas over HTTP")
        })?;
        let model = OPENAI_COMPATIBLE
            .iter()
            .find_map(|prefix| params.model.strip_prefix(prefix))
            .unwrap_or(&params.model)
            .to_string();
        let id = entry
            .model_info
            .as_ref()
            .and_then(|info| info.get("id"))
            .map(|id| match id {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            });
        let api_key = match params.api_key.as_deref() {
            Some(key) => Some(match key.strip_prefix("os.environ/") {
                Some(var) => std::env::var(var).map_err(|_| {
                    format!("{field}.litellm_params.api_key names ${var}, which is not set")
                })?,
                None => key.to_string(),
            }),
            None => None,
        };
        let pool = pools
            .entry(entry.model_name.clone())
            .or_insert_with(|| PoolConfig {
                strategy,
                num_retries: settings.num_retries.unwrap_or(3),
                drop_params: settings.drop_params.unwrap_or(false),
                ..PoolConfig::default()
            });
        if let Some(timeout) = settings.request_timeout {
            pool.timeout_s = timeout.ceil().max(1.0) as u64;
        }
        if let Some(cooldown) = settings.cooldown_time {
            pool.cooldown_s = cooldown.ceil().max(0.0) as u64;
        }
        pool.drop_params |= params.drop_params.unwrap_or(false);
        pool.replicas.push(ReplicaConfig {
            id,
            url,
            model: Some(model),
            api_key,
        });
    }
    let gateway = GatewayConfig {
        pools,
        ..GatewayConfig::default()
    };
    gateway.validate()?;
    Ok(gateway)
}

fn strategy_from_litellm(name: &str) -> Result<Strategy, String> {
    Ok(match name {
        "simple-shuffle" | "shuffle" => Strategy::Shuffle,
        "least-busy" | "least_outstanding" => Strategy::LeastOutstanding,
        "round_robin" | "round-robin" => Strategy::RoundRobin,
        "session_affinity" => Strategy::SessionAffinity,
        "power_of_two" => Strategy::PowerOfTwo,
        "prefix_cache" => Strategy::PrefixCache,
        "usage-based-routing"
        | "usage-based-routing-v2"
        | "latency-based-routing"
        | "cost-based-routing" => {
            tracing::warn!(
                strategy = name,
                "no such LiteLLM strategy here; using least_outstanding"
            );
            Strategy::LeastOutstanding
        }
        other => return Err(format!("unknown routing_strategy {other:?}")),
    })
}

/// LiteLLM's closest strategy: it has no round robin, session affinity,
/// power of two or prefix cache, and one strategy for all models (the
/// first pool's is written).
fn strategy_to_litellm(strategy: Strategy) -> &'static str {
    match strategy {
        Strategy::LeastOutstanding | Strategy::PowerOfTwo => "least-busy",
        Strategy::Shuffle
        | Strategy::RoundRobin
        | Strategy::SessionAffinity
        | Strategy::PrefixCache => "simple-shuffle",
    }
}

/// Writes pools as a LiteLLM config, in the shape LiteLLM's proxy reads:
/// one `model_list` entry per replica, settings under `litellm_settings`.
pub fn export(gateway: &GatewayConfig) -> Result<String, String> {
    let mut model_list = Vec::new();
    for (name, pool) in &gateway.pools {
        for (rank, replica) in pool.replicas.iter().enumerate() {
            let mut info = Map::new();
            info.insert(
                "id".into(),
                Value::String(super::gateway::replica_id(name, rank, replica)),
            );
            info.insert("replica_rank".into(), Value::from(rank));
            model_list.push(ModelEntry {
                model_name: name.clone(),
                litellm_params: Params {
                    model: format!("hosted_vllm/{}", replica.model.as_deref().unwrap_or(name)),
                    api_base: Some(replica.url.clone()),
                    api_key: replica.api_key.clone(),
                    drop_params: Some(pool.drop_params),
                    other: BTreeMap::new(),
                },
                model_info: Some(info),
            });
        }
    }
    let first = gateway.pools.values().next();
    let config = LiteLlmConfig {
        model_list,
        litellm_settings: Some(Settings {
            drop_params: Some(gateway.pools.values().any(|p| p.drop_params)),
            num_retries: Some(first.map_or(3, |p| p.num_retries)),
            routing_strategy: Some(
                strategy_to_litellm(first.map_or(Strategy::Shuffle, |p| p.strategy)).into(),
            ),
            request_timeout: None,
            cooldown_time: None,
            other: BTreeMap::new(),
        }),
        router_settings: None,
        other: BTreeMap::new(),
    };
    yaml_serde::to_string(&config).map_err(|e| format!("cannot write YAML: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A LiteLLM config as a training setup writes one for its vLLM
    /// replicas, comments and all: it must load unchanged.
    const SEED: &str = r#"
model_list:
  # One entry per vLLM replica
  - model_name: Qwen/Qwen2.5-7B-Instruct
    litellm_params:
      model: hosted_vllm/Qwen/Qwen2.5-7B-Instruct
      api_base: http://192.168.1.100:8000/v1
      drop_params: true
    model_info:
      id: verl-replica-0
      replica_rank: 0

  - model_name: Qwen/Qwen2.5-7B-Instruct
    litellm_params:
      model: hosted_vllm/Qwen/Qwen2.5-7B-Instruct
      api_base: http://192.168.1.101:8001/v1
      drop_params: true
    model_info:
      id: verl-replica-1
      replica_rank: 1

litellm_settings:
  drop_params: true
  num_retries: 3
  routing_strategy: simple-shuffle  # LiteLLM round-robins across entries
"#;

    #[test]
    fn the_seeds_config_loads_as_is_and_round_trips() {
        let gateway = import(SEED).unwrap();
        let pool = &gateway.pools["Qwen/Qwen2.5-7B-Instruct"];
        assert_eq!(pool.strategy, Strategy::Shuffle);
        assert_eq!(pool.num_retries, 3);
        assert!(pool.drop_params);
        assert_eq!(pool.replicas.len(), 2);
        assert_eq!(pool.replicas[1].id.as_deref(), Some("verl-replica-1"));
        assert_eq!(pool.replicas[1].url, "http://192.168.1.101:8001/v1");
        assert_eq!(
            pool.replicas[0].model.as_deref(),
            Some("Qwen/Qwen2.5-7B-Instruct")
        );
        let again = import(&export(&gateway).unwrap()).unwrap();
        assert_eq!(again, gateway);
    }

    #[test]
    fn bad_configs_say_what_is_wrong() {
        assert!(import("model_list: []").unwrap_err().contains("empty"));
        assert!(
            import(": : :")
                .unwrap_err()
                .contains("not a LiteLLM config")
        );
        let no_base =
            "model_list:\n  - model_name: m\n    litellm_params:\n      model: openai/m\n";
        assert!(
            import(no_base)
                .unwrap_err()
                .contains("model_list[0].litellm_params.api_base")
        );
        let strategy = format!("{SEED}\nrouter_settings:\n  routing_strategy: fastest\n");
        assert!(
            import(&strategy).is_ok(),
            "litellm_settings wins over router_settings"
        );
        let bad = SEED.replace("simple-shuffle", "fastest");
        assert!(import(&bad).unwrap_err().contains("fastest"));
        let twice = SEED.replace("verl-replica-1", "verl-replica-0");
        assert!(import(&twice).unwrap_err().contains("used twice"));
    }
}
