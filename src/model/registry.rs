//! Model aliases, provider instances and the price table.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::anthropic::AnthropicProvider;
use super::demo::DemoProvider;
use super::gateway::GatewayProvider;
use super::openai::OpenAiProvider;
use super::{ModelError, ModelProvider, ToolCallMode};
pub use crate::config::Price;
use crate::config::{Config, HarnessKind, ModelAlias, ProviderConfig, ProviderKind};
use crate::gateway::Gateway;

/// Built-in prices; `prices` in the config extends and overrides them.
const BUILTIN_PRICES: &[(&str, f64, f64)] = &[
    ("demo", 0.0, 0.0),
    ("claude-opus-4-1", 15.0, 75.0),
    ("claude-sonnet-4-5", 3.0, 15.0),
    ("claude-haiku-4-5", 1.0, 5.0),
    ("gpt-4o", 2.5, 10.0),
    ("gpt-4o-mini", 0.15, 0.6),
    ("gpt-4.1", 2.0, 8.0),
    ("gpt-4.1-mini", 0.4, 1.6),
];

/// Aliases every server knows; config aliases of the same name win.
const BUILTIN_ALIASES: &[(&str, ProviderKind, &str)] = &[
    ("sonnet", ProviderKind::Anthropic, "claude-sonnet-4-5"),
    ("opus", ProviderKind::Anthropic, "claude-opus-4-1"),
    ("haiku", ProviderKind::Anthropic, "claude-haiku-4-5"),
];

/// What a session's model name resolves to.
#[derive(Clone)]
pub struct ResolvedModel {
    /// The name the session used (an alias or an upstream name).
    pub name: String,
    pub provider: Arc<dyn ModelProvider>,
    pub upstream_model: String,
    /// `None` when the model has no price: its cost is unknown.
    pub price: Option<Price>,
    /// How the small harness asks for calls (`json_schema`: every reply
    /// constrained to an answer or one call); the strict one asks natively.
    pub tool_call_mode: ToolCallMode,
    /// Tools offered when a session names none (`models.NAME.tools`).
    pub default_tools: Option<Vec<String>>,
    /// `models.NAME.harness`: the turn loop's treatment of the model.
    pub harness: HarnessKind,
}

/// Resolves model names to providers. Built once at start.
pub struct ModelRegistry {
    aliases: HashMap<String, ResolvedModel>,
    openai: Option<Arc<dyn ModelProvider>>,
    anthropic: Option<Arc<dyn ModelProvider>>,
    prices: HashMap<String, Price>,
    default_model: String,
    /// Pool names resolve to the gateway (checked at each resolve: pools
    /// can be added at run time).
    gateway: Option<(Arc<Gateway>, Arc<dyn ModelProvider>)>,
}

impl ModelRegistry {
    pub fn from_config(config: &Config) -> Result<ModelRegistry, ModelError> {
        ModelRegistry::with_gateway(config, None)
    }

    /// As [`ModelRegistry::from_config`], with the gateway's pools as models.
    pub fn with_gateway(
        config: &Config,
        gateway: Option<Arc<Gateway>>,
    ) -> Result<ModelRegistry, ModelError> {
        let mut prices: HashMap<String, Price> = BUILTIN_PRICES
            .iter()
            .map(|(name, input, output)| {
                (
                    name.to_string(),
                    Price {
                        input_per_mtok: *input,
                        output_per_mtok: *output,
                    },
                )
            })
            .collect();
        prices.extend(config.prices.iter().map(|(k, v)| (k.clone(), *v)));

        let openai = config
            .openai
            .as_ref()
            .map(|p| openai_provider(p))
            .transpose()?;
        let anthropic = config
            .anthropic
            .as_ref()
            .map(|p| anthropic_provider(p))
            .transpose()?;
        let demo: Arc<dyn ModelProvider> = Arc::new(DemoProvider::new(Duration::from_millis(
            config.demo.chunk_delay_ms,
        )));

        let mut registry = ModelRegistry {
            aliases: HashMap::new(),
            openai,
            anthropic,
            prices,
            default_model: String::new(),
            gateway: gateway.map(|gateway| {
                let provider: Arc<dyn ModelProvider> =
                    Arc::new(GatewayProvider::new(gateway.clone()));
                (gateway, provider)
            }),
        };
        registry.insert("demo", demo, "demo", None);
        for (alias, kind, model) in BUILTIN_ALIASES {
            if let Some(provider) = registry.provider_of(*kind) {
                registry.insert(alias, provider, model, None);
            }
        }
        for (alias, spec) in &config.models {
            let provider = registry.alias_provider(config, spec)?;
            registry.insert(alias, provider, &spec.model, Some(spec));
        }
        registry.default_model = config
            .default_model
            .clone()
            .or_else(|| {
                if registry.anthropic.is_some() {
                    Some("sonnet".into())
                } else {
                    config.openai.as_ref().map(|p| {
                        p.default_model
                            .clone()
                            .unwrap_or_else(|| "gpt-4o-mini".into())
                    })
                }
            })
            .unwrap_or_else(|| "demo".into());
        registry.resolve(&registry.default_model.clone())?;
        Ok(registry)
    }

    fn insert(
        &mut self,
        alias: &str,
        provider: Arc<dyn ModelProvider>,
        model: &str,
        spec: Option<&ModelAlias>,
    ) {
        if let Some(spec) = spec {
            for key in spec.deprecated_keys() {
                tracing::warn!(
                    "models.{alias}: {key} is deprecated; it now selects harness = \"small\" \
                     (set that instead)"
                );
            }
        }
        let price = self
            .prices
            .get(model)
            .or_else(|| self.prices.get(alias))
            .copied();
        self.aliases.insert(
            alias.to_string(),
            ResolvedModel {
                name: alias.to_string(),
                provider,
                upstream_model: model.to_string(),
                price,
                tool_call_mode: spec.map_or(ToolCallMode::Native, |s| s.tool_call_mode),
                default_tools: spec.and_then(|s| s.tools.clone()),
                harness: spec.map_or(HarnessKind::Strict, ModelAlias::harness),
            },
        );
    }

    fn provider_of(&self, kind: ProviderKind) -> Option<Arc<dyn ModelProvider>> {
        match kind {
            ProviderKind::Openai => self.openai.clone(),
            ProviderKind::Anthropic => self.anthropic.clone(),
            ProviderKind::Demo => self.aliases.get("demo").map(|m| m.provider.clone()),
        }
    }

    fn alias_provider(
        &self,
        config: &Config,
        spec: &ModelAlias,
    ) -> Result<Arc<dyn ModelProvider>, ModelError> {
        let overridden = spec.base_url.is_some() || spec.api_key.is_some();
        match (spec.provider, overridden) {
            (ProviderKind::Openai, true) => openai_provider(&merged(config.openai.as_ref(), spec)),
            (ProviderKind::Anthropic, true) => {
                anthropic_provider(&merged(config.anthropic.as_ref(), spec))
            }
            (kind, _) => self
                .provider_of(kind)
                .ok_or_else(|| self.unknown(&spec.model)),
        }
    }

    /// The model a session uses when it names none.
    pub fn default_model(&self) -> &str {
        &self.default_model
    }

    /// An alias, else an upstream name: `claude-*` goes to Anthropic when it
    /// is configured, anything else to the OpenAI-compatible provider.
    pub fn resolve(&self, name: &str) -> Result<ResolvedModel, ModelError> {
        if let Some(model) = self.aliases.get(name) {
            return Ok(model.clone());
        }
        if let Some((gateway, provider)) = &self.gateway
            && gateway.pool(name).is_some()
        {
            return Ok(ResolvedModel {
                name: name.to_string(),
                provider: provider.clone(),
                upstream_model: name.to_string(),
                price: self.prices.get(name).copied(),
                tool_call_mode: ToolCallMode::Native,
                default_tools: None,
                harness: HarnessKind::Strict,
            });
        }
        let provider = if name.starts_with("claude") && self.anthropic.is_some() {
            self.anthropic.clone()
        } else {
            self.openai.clone()
        };
        let provider = provider.ok_or_else(|| self.unknown(name))?;
        Ok(ResolvedModel {
            name: name.to_string(),
            provider,
            upstream_model: name.to_string(),
            price: self.prices.get(name).copied(),
            tool_call_mode: ToolCallMode::Native,
            default_tools: None,
            harness: HarnessKind::Strict,
        })
    }

    /// A name nothing serves, with the names that are served.
    fn unknown(&self, name: &str) -> ModelError {
        let mut known = self.aliases();
        if let Some((gateway, _)) = &self.gateway {
            known.extend(gateway.pools().iter().map(|p| p.name.clone()));
        }
        known.sort();
        known.dedup();
        let mut known = known.join(", ");
        if name.starts_with("claude") && self.anthropic.is_none() {
            known.push_str(
                " (claude-* names go to Anthropic: set ANTHROPIC_API_KEY or [anthropic] to use \
                 them)",
            );
        } else if self.openai.is_none() {
            known.push_str(
                " (other names pass through to an OpenAI-compatible provider: \
                 set OPENAI_BASE_URL or [openai] to use one)",
            );
        }
        ModelError::UnknownModel {
            model: name.to_string(),
            known,
        }
    }

    /// Every name [`ModelRegistry::resolve`] knows without passing through.
    pub fn aliases(&self) -> Vec<String> {
        let mut names: Vec<String> = self.aliases.keys().cloned().collect();
        names.sort();
        names
    }
}

fn merged(base: Option<&ProviderConfig>, spec: &ModelAlias) -> ProviderConfig {
    ProviderConfig {
        base_url: spec
            .base_url
            .clone()
            .or_else(|| base.map(|b| b.base_url.clone()))
            .unwrap_or_default(),
        api_key: spec
            .api_key
            .clone()
            .or_else(|| base.and_then(|b| b.api_key.clone())),
        default_model: None,
        max_retries: base.map_or(3, |b| b.max_retries),
        timeout_s: base.map_or(600, |b| b.timeout_s),
    }
}

fn openai_provider(p: &ProviderConfig) -> Result<Arc<dyn ModelProvider>, ModelError> {
    Ok(Arc::new(OpenAiProvider::new(
        &p.base_url,
        p.api_key.clone(),
        p.max_retries,
        Duration::from_secs(p.timeout_s),
    )?))
}

fn anthropic_provider(p: &ProviderConfig) -> Result<Arc<dyn ModelProvider>, ModelError> {
    Ok(Arc::new(AnthropicProvider::new(
        &p.base_url,
        p.api_key.clone(),
        p.max_retries,
        Duration::from_secs(p.timeout_s),
    )?))
}
