//! Model aliases, provider instances and the price table.
//!
//! A built-in price belongs to its provider: `gpt-4o-mini` costs what
//! OpenAI charges only at OpenAI's own API, and a local server serving a
//! model under that name (or any other) has no price unless the config's
//! `[prices]` gives one, which holds whatever provider serves the name.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::anthropic::AnthropicProvider;
use super::demo::DemoProvider;
use super::gateway::GatewayProvider;
use super::listing::Listing;
use super::openai::OpenAiProvider;
use super::window::{Window, WindowSource};
use super::{ModelError, ModelProvider, ToolCallMode};
pub use crate::config::Price;
use crate::config::{Config, HarnessKind, ModelAlias, ProviderConfig, ProviderKind};
use crate::gateway::Gateway;
use crate::sync::lock;

/// Whose price list a provider's names are read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tariff {
    Demo,
    /// OpenAI's own API (`api.openai.com`).
    OpenAi,
    /// Anthropic's own API (`api.anthropic.com`).
    Anthropic,
    /// Any other server: only `[prices]` prices its names.
    Own,
}

/// Built-in prices, each for its provider: input, output, cache read and
/// cache write (`None`: at the input price), USD per million tokens.
/// Anthropic's cache reads cost a tenth of its input and its (5-minute)
/// cache writes a quarter more; OpenAI writes its cache at no extra cost.
/// `prices` in the config extends and overrides them.
type BuiltinPrice = (Tariff, &'static str, f64, f64, Option<f64>, Option<f64>);
const BUILTIN_PRICES: &[BuiltinPrice] = &[
    (Tariff::Demo, "demo", 0.0, 0.0, None, None),
    (
        Tariff::Anthropic,
        "claude-opus-4-1",
        15.0,
        75.0,
        Some(1.5),
        Some(18.75),
    ),
    (
        Tariff::Anthropic,
        "claude-sonnet-4-5",
        3.0,
        15.0,
        Some(0.3),
        Some(3.75),
    ),
    (
        Tariff::Anthropic,
        "claude-haiku-4-5",
        1.0,
        5.0,
        Some(0.1),
        Some(1.25),
    ),
    (Tariff::OpenAi, "gpt-4o", 2.5, 10.0, Some(1.25), None),
    (Tariff::OpenAi, "gpt-4o-mini", 0.15, 0.6, Some(0.075), None),
    (Tariff::OpenAi, "gpt-4.1", 2.0, 8.0, Some(0.5), None),
    (Tariff::OpenAi, "gpt-4.1-mini", 0.4, 1.6, Some(0.1), None),
];

/// Built-in context windows, in tokens, of the models whose prices are
/// built in, each at its provider's own API.
const BUILTIN_WINDOWS: &[(Tariff, &str, u64)] = &[
    (Tariff::Demo, "demo", 131_072),
    (Tariff::Anthropic, "claude-opus-4-1", 200_000),
    (Tariff::Anthropic, "claude-sonnet-4-5", 200_000),
    (Tariff::Anthropic, "claude-haiku-4-5", 200_000),
    (Tariff::OpenAi, "gpt-4o", 128_000),
    (Tariff::OpenAi, "gpt-4o-mini", 128_000),
    (Tariff::OpenAi, "gpt-4.1", 1_047_576),
    (Tariff::OpenAi, "gpt-4.1-mini", 1_047_576),
];

/// The default model at OpenAI's own API when none is named.
const OPENAI_DEFAULT: &str = "gpt-4o-mini";

/// Aliases every server knows; config aliases of the same name win.
const BUILTIN_ALIASES: &[(&str, ProviderKind, &str)] = &[
    ("sonnet", ProviderKind::Anthropic, "claude-sonnet-4-5"),
    ("opus", ProviderKind::Anthropic, "claude-opus-4-1"),
    ("haiku", ProviderKind::Anthropic, "claude-haiku-4-5"),
];

impl Tariff {
    /// The tariff of a provider of `kind` at `base_url`: a provider's own
    /// prices hold only at its own API, not at a server that speaks its
    /// protocol (llama-server speaks both).
    fn of(kind: ProviderKind, base_url: &str) -> Tariff {
        let host = reqwest::Url::parse(base_url)
            .ok()
            .and_then(|url| url.host_str().map(str::to_ascii_lowercase));
        match (kind, host.as_deref()) {
            (ProviderKind::Demo, _) => Tariff::Demo,
            (ProviderKind::Openai, Some("api.openai.com")) => Tariff::OpenAi,
            (ProviderKind::Anthropic, Some("api.anthropic.com")) => Tariff::Anthropic,
            _ => Tariff::Own,
        }
    }

    fn builtin(self, model: &str) -> Option<Price> {
        BUILTIN_PRICES
            .iter()
            .find(|(tariff, name, ..)| *tariff == self && *name == model)
            .map(|&(_, _, input, output, read, write)| Price {
                cache_read_per_mtok: read,
                cache_write_per_mtok: write,
                ..Price::new(input, output)
            })
    }

    fn window(self, model: &str) -> Option<u64> {
        BUILTIN_WINDOWS
            .iter()
            .find(|(tariff, name, _)| *tariff == self && *name == model)
            .map(|(_, _, window)| *window)
    }
}

/// A provider, with the price list its names are read in.
#[derive(Clone)]
struct Served {
    provider: Arc<dyn ModelProvider>,
    tariff: Tariff,
    /// The provider's `harness`, for its models no alias gives one.
    harness: HarnessKind,
}

/// The model a session uses when it names none.
enum DefaultModel {
    Named(String),
    /// The first one the OpenAI-compatible provider lists.
    Listed(Listing),
}

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
    /// `models.NAME.context_window`.
    pub configured_window: Option<u64>,
    /// The built-in table's window for the model at its provider.
    pub builtin_window: Option<u64>,
}

/// Resolves model names to providers. Built once at start.
pub struct ModelRegistry {
    aliases: HashMap<String, ResolvedModel>,
    openai: Option<Served>,
    anthropic: Option<Served>,
    /// The config's `[prices]`, for every provider.
    prices: HashMap<String, Price>,
    default_model: DefaultModel,
    /// Pool names resolve to the gateway (checked at each resolve: pools
    /// can be added at run time).
    gateway: Option<(Arc<Gateway>, Arc<dyn ModelProvider>)>,
    /// Models whose window was taken from the default, warned about once.
    defaulted_windows: Mutex<HashSet<String>>,
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
        let prices = config.prices.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let openai = config.openai.as_ref().map(openai_provider).transpose()?;
        let anthropic = config
            .anthropic
            .as_ref()
            .map(anthropic_provider)
            .transpose()?;
        let demo = Served {
            provider: Arc::new(DemoProvider::new(Duration::from_millis(
                config.demo.chunk_delay_ms,
            ))),
            tariff: Tariff::Demo,
            harness: HarnessKind::Strict,
        };

        let mut registry = ModelRegistry {
            aliases: HashMap::new(),
            openai,
            anthropic,
            prices,
            default_model: DefaultModel::Named(String::new()),
            gateway: gateway.map(|gateway| {
                let provider: Arc<dyn ModelProvider> =
                    Arc::new(GatewayProvider::new(gateway.clone()));
                (gateway, provider)
            }),
            defaulted_windows: Mutex::default(),
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
        registry.default_model = registry.choose_default(config)?;
        if let DefaultModel::Named(name) = &registry.default_model {
            registry.resolve(name)?;
        }
        Ok(registry)
    }

    /// `default_model`, else `sonnet` with Anthropic, else the OpenAI
    /// provider's: the one it names, `gpt-4o-mini` at OpenAI's own API, or
    /// the first one a server elsewhere lists; else `demo`.
    fn choose_default(&self, config: &Config) -> Result<DefaultModel, ModelError> {
        if let Some(name) = &config.default_model {
            return Ok(DefaultModel::Named(name.clone()));
        }
        if self.anthropic.is_some() {
            return Ok(DefaultModel::Named("sonnet".into()));
        }
        let (Some(openai), Some(provider)) = (&self.openai, &config.openai) else {
            return Ok(DefaultModel::Named("demo".into()));
        };
        Ok(match (&provider.default_model, openai.tariff) {
            (Some(name), _) => DefaultModel::Named(name.clone()),
            (None, Tariff::OpenAi) => DefaultModel::Named(OPENAI_DEFAULT.into()),
            (None, _) => DefaultModel::Listed(Listing::new(provider)?),
        })
    }

    fn insert(&mut self, alias: &str, served: Served, model: &str, spec: Option<&ModelAlias>) {
        if let Some(spec) = spec {
            for key in spec.deprecated_keys() {
                tracing::warn!(
                    "models.{alias}: {key} is deprecated; it now selects harness = \"small\" \
                     (set that instead)"
                );
            }
        }
        let price = self
            .price(served.tariff, model)
            .or_else(|| self.price(served.tariff, alias));
        let tariff = served.tariff;
        self.aliases.insert(
            alias.to_string(),
            ResolvedModel {
                name: alias.to_string(),
                provider: served.provider,
                upstream_model: model.to_string(),
                price,
                tool_call_mode: spec.map_or(ToolCallMode::Native, |s| s.tool_call_mode),
                default_tools: spec.and_then(|s| s.tools.clone()),
                harness: spec.map_or(served.harness, |s| s.harness_or(served.harness)),
                configured_window: spec.and_then(|s| s.context_window),
                builtin_window: tariff.window(model),
            },
        );
    }

    /// `[prices]` first, then the built-in price of the provider's own API.
    fn price(&self, tariff: Tariff, model: &str) -> Option<Price> {
        self.prices
            .get(model)
            .copied()
            .or_else(|| tariff.builtin(model))
    }

    fn provider_of(&self, kind: ProviderKind) -> Option<Served> {
        match kind {
            ProviderKind::Openai => self.openai.clone(),
            ProviderKind::Anthropic => self.anthropic.clone(),
            ProviderKind::Demo => self.aliases.get("demo").map(|m| Served {
                provider: m.provider.clone(),
                tariff: Tariff::Demo,
                harness: HarnessKind::Strict,
            }),
        }
    }

    fn alias_provider(&self, config: &Config, spec: &ModelAlias) -> Result<Served, ModelError> {
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

    /// The model a session uses when it names none, as far as it is known
    /// now: `None` while the provider whose listing names it has not
    /// answered (see [`ModelRegistry::default_model_now`]).
    pub fn default_model(&self) -> Option<&str> {
        match &self.default_model {
            DefaultModel::Named(name) => Some(name),
            DefaultModel::Listed(listing) => listing.known(),
        }
    }

    /// The model a session uses when it names none, asking the provider
    /// for its listing when it has not answered yet.
    pub async fn default_model_now(&self) -> Result<String, ModelError> {
        match &self.default_model {
            DefaultModel::Named(name) => Ok(name.clone()),
            DefaultModel::Listed(listing) => listing.first().await,
        }
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
                price: self.price(Tariff::Own, name),
                tool_call_mode: ToolCallMode::Native,
                default_tools: None,
                harness: HarnessKind::Strict,
                configured_window: None,
                builtin_window: None,
            });
        }
        // `sonnet`, `opus`, `haiku` are Anthropic's names here, never an
        // OpenAI-compatible server's (a config alias of that name wins).
        if BUILTIN_ALIASES.iter().any(|(alias, _, _)| *alias == name) {
            return Err(self.unknown(name));
        }
        let provider = if name.starts_with("claude") && self.anthropic.is_some() {
            self.anthropic.clone()
        } else {
            self.openai.clone()
        };
        let served = provider.ok_or_else(|| self.unknown(name))?;
        Ok(ResolvedModel {
            name: name.to_string(),
            provider: served.provider,
            upstream_model: name.to_string(),
            price: self.price(served.tariff, name),
            tool_call_mode: ToolCallMode::Native,
            default_tools: None,
            harness: served.harness,
            configured_window: None,
            builtin_window: served.tariff.window(name),
        })
    }

    /// The model's context window: the config's, else what its server
    /// reports, else the built-in table's, else `default`, with a warning
    /// (once per model) that names the setting.
    pub async fn window(&self, model: &ResolvedModel, default: u64) -> Window {
        if let Some(tokens) = model.configured_window {
            return Window {
                tokens,
                source: WindowSource::Config,
            };
        }
        if let Some(tokens) = model.provider.context_window(&model.upstream_model).await {
            return Window {
                tokens,
                source: WindowSource::Provider,
            };
        }
        if let Some(tokens) = model.builtin_window {
            return Window {
                tokens,
                source: WindowSource::Builtin,
            };
        }
        if lock(&self.defaulted_windows).insert(model.name.clone()) {
            tracing::warn!(
                model = %model.name,
                window = default,
                "the model's context window is not known: assuming {default} tokens \
                 (agent.context_window); set models.{}.context_window",
                model.name
            );
        }
        Window {
            tokens: default,
            source: WindowSource::Default,
        }
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
        if let Some((alias, _, model)) = BUILTIN_ALIASES.iter().find(|(a, ..)| *a == name) {
            known.push_str(&format!(
                " ({alias} is Anthropic's {model}: set ANTHROPIC_API_KEY or [anthropic] to use it)"
            ));
        } else if name.starts_with("claude") && self.anthropic.is_none() {
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
        harness: base.and_then(|b| b.harness),
    }
}

fn openai_provider(p: &ProviderConfig) -> Result<Served, ModelError> {
    Ok(Served {
        provider: Arc::new(OpenAiProvider::new(
            &p.base_url,
            p.api_key.clone(),
            p.max_retries,
            Duration::from_secs(p.timeout_s),
        )?),
        tariff: Tariff::of(ProviderKind::Openai, &p.base_url),
        harness: p.harness.unwrap_or_default(),
    })
}

fn anthropic_provider(p: &ProviderConfig) -> Result<Served, ModelError> {
    Ok(Served {
        provider: Arc::new(AnthropicProvider::new(
            &p.base_url,
            p.api_key.clone(),
            p.max_retries,
            Duration::from_secs(p.timeout_s),
        )?),
        tariff: Tariff::of(ProviderKind::Anthropic, &p.base_url),
        harness: p.harness.unwrap_or_default(),
    })
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
