//! Session options: accepted nested under `options` or flat at the top level
//! of a request, validated once, with errors that name the option.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use crate::session::OptionError;
use crate::session::TurnOptions;
use utoipa::ToSchema;

/// What a client may set on an agent session: model, limits, tools,
/// sandbox and permissions; an unknown option is refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentOptions {
    /// A model alias (`demo`, `sonnet`, a configured alias) or an upstream name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Model calls allowed in one turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    /// The turn stops once its cost reaches this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_budget_usd: Option<f64>,
    /// Only these tools are offered and allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_tools: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// `false` leaves the agent without tools that execute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Cap on tokens per model call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Stream `text_delta` events token by token as well as `thinking`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_deltas: Option<bool>,
    /// Run the tool calls of one model reply at once (at most 8), not one
    /// after another: for models whose calls in a reply do not depend on
    /// each other. Calls of the read-only tools (`Read`, `Glob`, `Grep`)
    /// run at once either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxOptions>,
    /// External MCP servers by name; their tools become `mcp__{name}__{tool}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_servers: Option<BTreeMap<String, McpServerSpec>>,
    /// Remote A2A agents by name; each becomes the tool `a2a__{name}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a2a_agents: Option<BTreeMap<String, A2aAgentSpec>>,
    /// Which tool calls wait for a person's decision (`mode`, `allow`,
    /// `deny`, `hook_url`, `approval_timeout_s`); the server's
    /// `[agent.permissions]` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<crate::permission::Permissions>,
    /// What the workspace starts with: `{git: {url, ref?, depth?,
    /// credential?}}`, cloned by the server before the first turn's model
    /// call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceOptions>,
    /// `auto` (the default): the older part of the history is summarised
    /// once a request nears the model's context window; `off`: never, and
    /// a request past the window ends its turn with `context_exceeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<Compaction>,
    /// How much the model may reason before it answers (see
    /// [`crate::model::ReasoningOptions`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<crate::model::ReasoningOptions>,
}

/// `options.compaction`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Compaction {
    #[default]
    Auto,
    Off,
}

/// `options.workspace`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<GitSource>,
}

/// A git repository the server clones into `/workspace` (smart or dumb
/// HTTP(S), under `mcp.allowed_http_servers`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GitSource {
    /// `http(s)://host/path`, with no user or password in it.
    pub url: String,
    /// A branch, a tag, or a commit (40 hex digits); the remote's default
    /// branch when unset.
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// Commits of history to fetch; all when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    /// A secret (`[secrets]`, `[keys.NAME.secrets]`) sent as HTTP basic
    /// auth: `user:password`, or a token (user `x-access-token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// `true`: the internet (when the server allows it); `{allow: [...]}`:
    /// only those names, through the server's egress proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkOption>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u64>,
    /// A snapshot (`snapshot_id`) whose workspace the session's sandbox
    /// starts with; a fork sets it to the source's snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<String>,
    /// Environment variables of every command the sandbox runs: a literal
    /// value, or `{secret: NAME}`, a configured secret whose value is
    /// scrubbed out of everything the tools return.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, EnvValue>>,
}

/// `options.sandbox.network`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum NetworkOption {
    /// `true`: the internet; `false`: nothing but loopback.
    Switch(bool),
    /// Only these names (and address entries) through the server's egress
    /// proxy, a narrowing of `sandbox.network.allow`.
    Allow(NetworkAllow),
}

impl<'de> Deserialize<'de> for NetworkOption {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Given {
            Switch(bool),
            Allow(NetworkAllow),
        }
        match Given::deserialize(deserializer) {
            Ok(Given::Switch(on)) => Ok(NetworkOption::Switch(on)),
            Ok(Given::Allow(allow)) => Ok(NetworkOption::Allow(allow)),
            Err(_) => Err(serde::de::Error::custom(
                "expected true, false or {\"allow\": [\"name\", \"*.name\", \"CIDR\", ...]}",
            )),
        }
    }
}

/// `{allow: ["pypi.org", "*.pythonhosted.org"]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkAllow {
    pub allow: Vec<String>,
}

/// One variable of `options.sandbox.env`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum EnvValue {
    Literal(String),
    Secret(SecretRef),
}

/// `{secret: NAME}`: the value of a configured secret (`[secrets]`, or the
/// caller's key's `[keys.NAME.secrets]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    pub secret: String,
}

impl GitSource {
    /// What can be checked without the network: the URL's shape (no
    /// credential in it), the ref and the depth.
    fn validate(&self) -> Result<(), OptionError> {
        let field = |name: &str| format!("options.workspace.git.{name}");
        let url = url::Url::parse(&self.url)
            .map_err(|e| OptionError::new(field("url"), format!("not a URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err(OptionError::new(
                field("url"),
                "must be an http or https URL with a host",
            ));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(OptionError::new(
                field("url"),
                "must not hold a user or password; name a secret in credential",
            ));
        }
        if let Some(reference) = &self.reference {
            let fine = !reference.is_empty()
                && !reference.starts_with('-')
                && reference.len() <= 255
                && !reference.contains("..")
                && reference
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '-' | '.'));
            if !fine {
                return Err(OptionError::new(
                    field("ref"),
                    "a branch, tag or commit: letters, digits, '/', '_', '-', '.'",
                ));
            }
        }
        if self.depth == Some(0) {
            return Err(OptionError::new(field("depth"), "must be at least 1"));
        }
        Ok(())
    }

    /// Whether the ref names a commit rather than a branch or tag.
    pub fn ref_is_commit(&self) -> bool {
        self.reference
            .as_deref()
            .is_some_and(|r| r.len() == 40 && r.chars().all(|c| c.is_ascii_hexdigit()))
    }
}

/// An external MCP server: a command over stdio, or a URL.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged, deny_unknown_fields)]
pub enum McpServerSpec {
    Stdio {
        command: String,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
    },
    Http {
        url: String,
        #[serde(default)]
        headers: BTreeMap<String, String>,
    },
}

/// Server names a session's MCP server cannot take: the built-in servers'
/// namespaces (`mcp__sandbox__*` runs in the session's sandbox).
pub const RESERVED_SERVER_NAMES: [&str; 2] = ["sandbox", "conclave"];

impl McpServerSpec {
    /// The server's name must make tool names that name it alone: not a
    /// built-in server's, and without the `__` that separates a tool's
    /// server from its name.
    fn validate_name(name: &str) -> Result<(), OptionError> {
        let field = format!("options.mcp_servers.{name}");
        if RESERVED_SERVER_NAMES.contains(&name.to_ascii_lowercase().as_str()) {
            return Err(OptionError::new(
                field,
                format!(
                    "'{name}' is a built-in server's name (its tools are mcp__{name}__*); name the server otherwise"
                ),
            ));
        }
        if !names_a_tool(name) || name.contains("__") {
            return Err(OptionError::new(
                field,
                format!(
                    "a server's name is 1 to {MAX_AGENT_NAME} letters, digits, `_` or `-`, without `__` (it names the tools mcp__NAME__TOOL)"
                ),
            ));
        }
        Ok(())
    }
}

/// A remote A2A agent: the URL of its card (or of the base its card is
/// under, at `/.well-known/agent-card.json`), with headers sent on every
/// request to it (a bearer token) when given as an object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged, deny_unknown_fields)]
pub enum A2aAgentSpec {
    Url(String),
    WithHeaders {
        url: String,
        #[serde(default)]
        headers: BTreeMap<String, String>,
    },
}

/// The longest agent or MCP server name: `a2a__{name}` stays within the
/// 64 characters model APIs allow a tool name.
const MAX_AGENT_NAME: usize = 48;

/// Whether `name` can be part of a tool's name: 1 to [`MAX_AGENT_NAME`]
/// letters, digits, `_` or `-`.
fn names_a_tool(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_AGENT_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
}

impl A2aAgentSpec {
    pub fn url(&self) -> &str {
        match self {
            A2aAgentSpec::Url(url) | A2aAgentSpec::WithHeaders { url, .. } => url,
        }
    }

    pub fn headers(&self) -> Option<&BTreeMap<String, String>> {
        match self {
            A2aAgentSpec::Url(_) => None,
            A2aAgentSpec::WithHeaders { headers, .. } => Some(headers),
        }
    }

    /// The agent's name must make a tool name, and its headers must be
    /// ones HTTP can send.
    fn validate(&self, name: &str) -> Result<(), OptionError> {
        let field = format!("options.a2a_agents.{name}");
        if !names_a_tool(name) {
            return Err(OptionError::new(
                field,
                format!(
                    "an agent's name is 1 to {MAX_AGENT_NAME} letters, digits, `_` or `-` (it names the tool a2a__NAME)"
                ),
            ));
        }
        for (header, value) in self.headers().into_iter().flatten() {
            let valid = http::HeaderName::try_from(header.as_str()).is_ok()
                && http::HeaderValue::try_from(value.as_str()).is_ok();
            if !valid {
                return Err(OptionError::new(
                    format!("{field}.headers"),
                    format!("'{header}' is not a valid HTTP header name and value"),
                ));
            }
        }
        Ok(())
    }
}

impl AgentOptions {
    /// Builds options from a request body: `options` nested, and every
    /// top-level key not in `reserved` taken as a flat option. A key given
    /// both ways must agree.
    pub fn from_body(
        body: &Map<String, Value>,
        reserved: &[&str],
    ) -> Result<AgentOptions, OptionError> {
        let options: AgentOptions = crate::session::options::from_body(body, reserved)?;
        options.validate()?;
        Ok(options)
    }

    /// Options as a session stored them (validated when it was created).
    pub fn stored(options: &Value) -> Result<AgentOptions, crate::store::StoreError> {
        serde_json::from_value(options.clone())
            .map_err(|e| crate::store::StoreError::Corrupt(format!("agent options: {e}")))
    }

    fn validate(&self) -> Result<(), OptionError> {
        if let Some(git) = self.workspace.as_ref().and_then(|w| w.git.as_ref()) {
            git.validate()?;
            if self.sandbox_enabled == Some(false) {
                return Err(OptionError::new(
                    "options.workspace.git",
                    "needs a sandbox to clone into (sandbox_enabled is false)",
                ));
            }
        }
        if self.max_turns == Some(0) {
            return Err(OptionError::new("options.max_turns", "must be at least 1"));
        }
        if let Some(budget) = self.max_budget_usd
            && !(budget.is_finite() && budget > 0.0)
        {
            return Err(OptionError::new(
                "options.max_budget_usd",
                "must be a positive number",
            ));
        }
        if let Some(t) = self.temperature
            && !(0.0..=2.0).contains(&t)
        {
            return Err(OptionError::new(
                "options.temperature",
                "must be between 0 and 2",
            ));
        }
        if let Some(tools) = &self.allowed_tools
            && let Some(i) = tools.iter().position(|t| t.trim().is_empty())
        {
            return Err(OptionError::new(
                format!("options.allowed_tools[{i}]"),
                "must not be empty",
            ));
        }
        if let Some(dir) = &self.working_dir
            && !dir.starts_with('/')
        {
            return Err(OptionError::new(
                "options.working_dir",
                "must be an absolute path",
            ));
        }
        if self.max_tokens == Some(0) {
            return Err(OptionError::new("options.max_tokens", "must be at least 1"));
        }
        if let Some(Err(e)) = self.reasoning.map(|r| r.check()) {
            return Err(OptionError::new("options.reasoning.budget_tokens", e));
        }
        if let Some(model) = &self.model
            && model.trim().is_empty()
        {
            return Err(OptionError::new("options.model", "must not be empty"));
        }
        for name in self.mcp_servers.iter().flatten().map(|(name, _)| name) {
            McpServerSpec::validate_name(name)?;
        }
        for (name, agent) in self.a2a_agents.iter().flatten() {
            agent.validate(name)?;
        }
        if let Some(permissions) = &self.permissions {
            permissions
                .validate("options.permissions")
                .map_err(|e| OptionError::new(e.field, e.message))?;
        }
        Ok(())
    }

    pub fn sandbox_enabled(&self) -> bool {
        self.sandbox_enabled.unwrap_or(true)
    }

    /// Whether a tool may run in this session.
    pub fn allows(&self, tool: &str) -> bool {
        self.allowed_tools
            .as_ref()
            .is_none_or(|tools| tools.iter().any(|t| t == tool))
    }

    /// The options of one turn: its model instead of the session's, and
    /// only the tools both the session and the turn allow (a turn never
    /// widens what its session may run).
    pub fn for_turn(mut self, turn: &TurnOptions) -> AgentOptions {
        if let Some(model) = &turn.model {
            self.model = Some(model.clone());
        }
        if let Some(only) = &turn.allowed_tools {
            let narrowed = only.iter().filter(|t| self.allows(t)).cloned().collect();
            self.allowed_tools = Some(narrowed);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn a_turn_changes_the_model_and_only_narrows_the_tools() {
        let session = AgentOptions {
            model: Some("demo".into()),
            allowed_tools: Some(vec!["Read".into(), "Bash".into()]),
            ..AgentOptions::default()
        };
        let turn = TurnOptions {
            model: Some("sonnet".into()),
            allowed_tools: Some(vec!["Bash".into(), "Write".into()]),
            ..TurnOptions::default()
        };
        let options = session.clone().for_turn(&turn);
        assert_eq!(options.model.as_deref(), Some("sonnet"));
        assert_eq!(options.allowed_tools, Some(vec!["Bash".to_owned()]));
        assert_eq!(session.clone().for_turn(&TurnOptions::default()), session);
        let open = AgentOptions::default().for_turn(&turn);
        assert_eq!(open.allowed_tools, turn.allowed_tools);
        assert!(!open.allows("Read"));
    }

    #[test]
    fn flat_and_nested_options_merge() {
        let options = AgentOptions::from_body(
            &body(json!({"prompt": "x", "max_turns": 3, "options": {"model": "demo"}})),
            &["prompt"],
        )
        .unwrap();
        assert_eq!(
            options,
            AgentOptions {
                model: Some("demo".into()),
                max_turns: Some(3),
                ..AgentOptions::default()
            }
        );
    }

    #[test]
    fn wrong_type_names_the_option() {
        let err = AgentOptions::from_body(&body(json!({"options": {"max_turns": "ten"}})), &[])
            .unwrap_err();
        assert_eq!(err.field, "options.max_turns");
    }

    #[test]
    fn unknown_option_is_named() {
        let err =
            AgentOptions::from_body(&body(json!({"prompt": "x", "max_turnz": 3})), &["prompt"])
                .unwrap_err();
        assert_eq!(
            err.to_string(),
            "max_turnz: unknown field; did you mean max_turns?"
        );
    }

    #[test]
    fn nested_sandbox_field_is_named() {
        let err =
            AgentOptions::from_body(&body(json!({"options": {"sandbox": {"cpus": "two"}}})), &[])
                .unwrap_err();
        assert_eq!(err.field, "options.sandbox.cpus");
    }

    #[test]
    fn conflicting_flat_and_nested_is_refused() {
        let err = AgentOptions::from_body(
            &body(json!({"max_turns": 2, "options": {"max_turns": 3}})),
            &[],
        )
        .unwrap_err();
        assert_eq!(err.field, "max_turns");
    }

    #[test]
    fn a2a_agents_take_a_url_or_a_url_with_headers() {
        let options = AgentOptions::from_body(
            &body(json!({"a2a_agents": {
                "plain": "https://agents.example/echo",
                "keyed": {"url": "https://agents.example/x", "headers": {"authorization": "Bearer t"}},
            }})),
            &[],
        )
        .unwrap();
        let agents = options.a2a_agents.unwrap();
        assert_eq!(
            agents["plain"],
            A2aAgentSpec::Url("https://agents.example/echo".into())
        );
        assert_eq!(agents["keyed"].url(), "https://agents.example/x");
        assert_eq!(
            agents["keyed"].headers().unwrap()["authorization"],
            "Bearer t"
        );
        let err = AgentOptions::from_body(
            &body(json!({"a2a_agents": {"no spaces": "https://agents.example"}})),
            &[],
        )
        .unwrap_err();
        assert_eq!(err.field, "options.a2a_agents.no spaces");
        let err = AgentOptions::from_body(
            &body(json!({"a2a_agents": {"x": {"url": "https://a.example", "headers": {"bad header": "v"}}}})),
            &[],
        )
        .unwrap_err();
        assert_eq!(err.field, "options.a2a_agents.x.headers");
    }

    #[test]
    fn zero_turns_is_refused() {
        let err = AgentOptions::from_body(&body(json!({"max_turns": 0})), &[]).unwrap_err();
        assert_eq!(err.field, "options.max_turns");
    }
}
