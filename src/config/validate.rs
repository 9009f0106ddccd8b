//! [`Config::validate`]: what types alone cannot check, each error naming
//! its field.

use super::{Config, ConfigError, HarnessKind, ProviderKind};

/// The smallest context window a model may be said to have: a summary, a
/// prompt and an answer must fit in it.
const MIN_CONTEXT_WINDOW: u64 = 1024;

impl Config {
    /// Checks what types alone cannot; every error names its field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_store()?;
        self.check_agent_names()?;
        self.cluster.validate().map_err(named)?;
        self.telemetry.validate().map_err(named)?;
        self.validate_keys().map_err(named)?;
        self.check_permissions()?;
        self.check_http()?;
        crate::egress::Rules::parse(&self.mcp.allowed_http_servers)
            .map_err(|e| field("mcp.allowed_http_servers", e))?;
        self.check_paths()?;
        self.check_limits()?;
        self.check_models()?;
        self.sandbox.validate().map_err(named)?;
        for (model, price) in &self.prices {
            let cached = [price.cache_read_per_mtok, price.cache_write_per_mtok];
            if price.input_per_mtok < 0.0
                || price.output_per_mtok < 0.0
                || cached.into_iter().flatten().any(|p| p < 0.0)
            {
                return Err(field(
                    &format!("prices.{model}"),
                    "prices cannot be negative".into(),
                ));
            }
        }
        self.gateway.validate().map_err(ConfigError::Invalid)?;
        self.bus.validate().map_err(named)?;
        self.pipelines.validate().map_err(named)?;
        self.mcp.validate().map_err(named)?;
        crate::egress::Rules::parse(&self.allowed_upstreams())
            .map_err(|e| field("gateway.allowed_upstreams", e))?;
        Ok(())
    }

    /// The store is a PostgreSQL URL.
    fn check_store(&self) -> Result<(), ConfigError> {
        if let Some(store) = &self.store {
            let scheme = store.split_once("://").map(|(scheme, _)| scheme);
            if !matches!(scheme, Some("postgres" | "postgresql")) {
                return Err(field(
                    "store",
                    format!(
                        "{store:?} is not a PostgreSQL URL (postgres://user@host/db); leave it unset for SQLite in data_dir"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Named agents' names and kinds.
    fn check_agent_names(&self) -> Result<(), ConfigError> {
        for (name, profile) in &self.agents {
            let named_well = (1..=64).contains(&name.len())
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                && name.starts_with(|c: char| c.is_ascii_alphanumeric());
            if !named_well {
                return Err(field(
                    &format!("agents.{name}"),
                    "an agent's name is 1 to 64 letters, digits, '-', '_' or '.', starting with a letter or digit".into(),
                ));
            }
            if matches!(name.as_str(), "agent" | "deliberation" | "pipeline") {
                return Err(field(
                    &format!("agents.{name}"),
                    format!("{name:?} is the name of a session kind; name the agent otherwise"),
                ));
            }
            if profile.kind.as_deref() == Some("") {
                return Err(field(&format!("agents.{name}.kind"), "empty".into()));
            }
        }
        Ok(())
    }

    /// The permission policies, and that each key's names a configured key.
    fn check_permissions(&self) -> Result<(), ConfigError> {
        let permissions = &self.agent.permissions;
        permissions
            .default_policy()
            .validate("agent.permissions")
            .map_err(|e| field(&e.field, e.message))?;
        for (i, (key, policy)) in permissions.keys.iter().enumerate() {
            // The key itself is a secret: errors name its place, not it.
            let at = format!("agent.permissions.keys[{i}]");
            if !self.key_entries().iter().any(|k| k.secret == key.trim()) {
                return Err(field(
                    &at,
                    "is not one of api_keys, admin_keys or [keys.NAME]".into(),
                ));
            }
            policy
                .validate(&at)
                .map_err(|e| field(&e.field, e.message))?;
        }
        Ok(())
    }

    /// Hosts, origins and the HTTP listener's timeouts.
    fn check_http(&self) -> Result<(), ConfigError> {
        if let Some(i) = self.allowed_hosts.iter().position(|h| h.trim().is_empty()) {
            return Err(field(
                &format!("allowed_hosts[{i}]"),
                "must not be empty".into(),
            ));
        }
        for (i, origin) in self.allowed_origins.iter().enumerate() {
            let parsed = reqwest::Url::parse(origin).ok().filter(|u| {
                matches!(u.scheme(), "http" | "https")
                    && u.host().is_some()
                    && u.path() == "/"
                    && u.query().is_none()
                    && !origin.ends_with('/')
            });
            if parsed.is_none() {
                return Err(field(
                    &format!("allowed_origins[{i}]"),
                    format!(
                        "{origin:?} is not an origin like https://app.example.com or http://localhost:3000"
                    ),
                ));
            }
        }
        if self.http.header_timeout_s == 0 || self.http.body_timeout_s == 0 {
            return Err(field(
                if self.http.header_timeout_s == 0 {
                    "http.header_timeout_s"
                } else {
                    "http.body_timeout_s"
                },
                "must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// Paths are absolute once loaded.
    fn check_paths(&self) -> Result<(), ConfigError> {
        for (name, path) in [
            ("data_dir", Some(&self.data_dir)),
            ("sandbox.local.root", self.sandbox.local.root.as_ref()),
        ] {
            if let Some(path) = path
                && !path.is_absolute()
            {
                return Err(field(
                    name,
                    format!("{} is not an absolute path", path.display()),
                ));
            }
        }
        Ok(())
    }

    /// Limits that must be at least something.
    fn check_limits(&self) -> Result<(), ConfigError> {
        if self.max_body_bytes < 1024 {
            return Err(field("max_body_bytes", "must be at least 1024".into()));
        }
        if self.agent.max_turns == 0 {
            return Err(field("agent.max_turns", "must be at least 1".into()));
        }
        for (name, value) in [
            ("agent.max_tokens", u64::from(self.agent.max_tokens)),
            ("agent.turn_timeout_s", self.agent.turn_timeout_s),
            ("agent.status_interval_ms", self.agent.status_interval_ms),
            (
                "agent.max_tool_calls_per_reply",
                u64::from(self.agent.max_tool_calls_per_reply),
            ),
            ("agent.max_forks", u64::from(self.agent.max_forks)),
        ] {
            if value == 0 {
                return Err(field(name, "must be at least 1".into()));
            }
        }
        if !(self.agent.compact_at > 0.0 && self.agent.compact_at <= 1.0) {
            return Err(field(
                "agent.compact_at",
                format!(
                    "{} is not a share of the window in (0, 1]",
                    self.agent.compact_at
                ),
            ));
        }
        let windows =
            std::iter::once(("agent.context_window".to_owned(), self.agent.context_window)).chain(
                self.models.iter().filter_map(|(alias, model)| {
                    model
                        .context_window
                        .map(|w| (format!("models.{alias}.context_window"), w))
                }),
            );
        for (name, window) in windows {
            if window < MIN_CONTEXT_WINDOW {
                return Err(field(
                    &name,
                    format!("{window} tokens is too small a window; at least {MIN_CONTEXT_WINDOW}"),
                ));
            }
        }
        Ok(())
    }

    /// Providers' URLs, and that each model alias's provider is configured.
    fn check_models(&self) -> Result<(), ConfigError> {
        for (name, provider) in [("openai", &self.openai), ("anthropic", &self.anthropic)] {
            if let Some(p) = provider {
                check_url(&format!("{name}.base_url"), &p.base_url)?;
            }
        }
        for (alias, model) in &self.models {
            let base = format!("models.{alias}");
            if let Some(url) = &model.base_url {
                check_url(&format!("{base}.base_url"), url)?;
            }
            let configured = match model.provider {
                ProviderKind::Openai => self.openai.is_some() || model.base_url.is_some(),
                // A server of its own speaking the Messages API
                // (llama-server's) may take no key.
                ProviderKind::Anthropic => {
                    self.anthropic.is_some() || model.api_key.is_some() || model.base_url.is_some()
                }
                ProviderKind::Demo => true,
            };
            if model.harness == Some(HarnessKind::Strict)
                && let Some(key) = model.deprecated_keys().first()
            {
                return Err(field(
                    &format!("{base}.harness"),
                    format!(
                        "\"strict\" runs no small-model aid, but {base} sets {key} (deprecated); \
                         use harness = \"small\", or drop that key"
                    ),
                ));
            }
            if !configured {
                return Err(field(
                    &format!("{base}.provider"),
                    format!(
                        "provider {:?} is not configured; give {base}.base_url or configure the provider",
                        model.provider
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Config {
    /// Where replicas added at run time may be: `gateway.allowed_upstreams`
    /// as configured; unset, public addresses, and loopback ones too when
    /// the server listens on loopback. There only processes of this host
    /// reach the admin routes (browser pages are refused by the Host and
    /// Origin checks, sandboxes have network namespaces of their own), and
    /// they reach the host's loopback services directly anyway.
    pub fn allowed_upstreams(&self) -> Vec<String> {
        match &self.gateway.allowed_upstreams {
            Some(list) => list.clone(),
            None if self.listen.ip().is_loopback() => {
                ["public", "127.0.0.0/8", "::1"].map(String::from).to_vec()
            }
            None => vec!["public".into()],
        }
    }
}

/// A section's `(field, message)` as a `ConfigError`.
fn named((field, message): (String, String)) -> ConfigError {
    ConfigError::Field { field, message }
}

/// A `ConfigError` naming `field`.
fn field(field: &str, message: String) -> ConfigError {
    ConfigError::Field {
        field: field.into(),
        message,
    }
}

fn check_url(field: &str, url: &str) -> Result<(), ConfigError> {
    match reqwest::Url::parse(url) {
        Ok(u) if u.scheme() == "http" || u.scheme() == "https" => Ok(()),
        Ok(u) => Err(ConfigError::Field {
            field: field.into(),
            message: format!("scheme {} is not http or https", u.scheme()),
        }),
        Err(e) => Err(ConfigError::Field {
            field: field.into(),
            message: format!("'{url}' is not a URL: {e}"),
        }),
    }
}
