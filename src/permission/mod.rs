//! Who decides whether a tool call runs: a session's permission mode, its
//! ordered `allow` and `deny` rules, and its API key's policy, which a
//! session can only tighten. A call is allowed, denied, or asked about (a
//! person or a hook decides; [`crate::session::approvals`] holds the wait).
//!
//! - [`rules`]: `Tool`, `Tool(pattern)` and `mcp__server__*` rules, matched
//!   on a call's tool and its main input (a command, a path).
//! - [`shell`]: every simple command a shell command line can run.

pub mod rules;
pub mod shell;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

pub use rules::Rule;

/// What runs without asking.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Every call runs (no rule denies it).
    #[default]
    Auto,
    /// Every call waits for a decision.
    Ask,
    /// Calls that only read run; any other waits.
    AskWrites,
    /// Calls that only read run; no other runs, and the model is told so.
    Plan,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Auto => "auto",
            Mode::Ask => "ask",
            Mode::AskWrites => "ask_writes",
            Mode::Plan => "plan",
        }
    }
}

/// A policy as a session, the server or an API key sets it
/// (`options.permissions`, `[agent.permissions]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Permissions {
    /// `auto` (the default), `ask`, `ask_writes` or `plan`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Calls that run without asking (`Bash(git status*)`,
    /// `Write(/workspace/src/**)`, `mcp__github__*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Calls that never run; checked first: deny wins over allow.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
    /// An HTTP endpoint asked before a call would wait for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook_url: Option<String>,
    /// How long a call waits for a decision before it is denied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_timeout_s: Option<u64>,
    /// How long the hook has to answer before the call waits for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook_timeout_ms: Option<u64>,
    /// Whether an external MCP server's `readOnlyHint` lets its tool run
    /// where only calls that read run (`ask_writes`, `plan`). `true` by
    /// default; `false` in either the session's or the key's policy makes
    /// every external tool count as one that writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_read_only_hints: Option<bool>,
}

/// The longest a call may wait for a decision.
pub const MAX_APPROVAL_TIMEOUT_S: u64 = 24 * 3600;
/// How long a call waits for a decision when no policy says.
pub const DEFAULT_APPROVAL_TIMEOUT_S: u64 = 300;

/// A rule or value of a policy that does not parse, with where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct PolicyError {
    pub field: String,
    pub message: String,
}

impl Permissions {
    /// Checks every rule and value; errors name the field under `prefix`
    /// (`options.permissions`).
    pub fn validate(&self, prefix: &str) -> Result<(), PolicyError> {
        Policy::compile(self, prefix).map(drop)?;
        if let Some(timeout) = self.approval_timeout_s
            && !(1..=MAX_APPROVAL_TIMEOUT_S).contains(&timeout)
        {
            return Err(PolicyError {
                field: format!("{prefix}.approval_timeout_s"),
                message: format!("must be between 1 and {MAX_APPROVAL_TIMEOUT_S}"),
            });
        }
        if let Some(timeout) = self.hook_timeout_ms
            && !(1..=60_000).contains(&timeout)
        {
            return Err(PolicyError {
                field: format!("{prefix}.hook_timeout_ms"),
                message: "must be between 1 and 60000".into(),
            });
        }
        if let Some(url) = &self.hook_url {
            let parsed = url::Url::parse(url).map_err(|e| PolicyError {
                field: format!("{prefix}.hook_url"),
                message: format!("not a URL: {e}"),
            })?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(PolicyError {
                    field: format!("{prefix}.hook_url"),
                    message: "must be an http or https URL".into(),
                });
            }
        }
        Ok(())
    }
}

/// What the server's configuration says (`[agent.permissions]`): a
/// default policy for sessions that set none, and per API key a policy
/// every call of its sessions is also checked against.
///
/// The fields of [`Permissions`] are spelled out rather than flattened:
/// serde does not refuse unknown keys of a struct with a flattened field,
/// and a misspelt key here must be an error at start-up.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerPermissions {
    pub mode: Option<Mode>,
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    pub hook_url: Option<String>,
    pub approval_timeout_s: Option<u64>,
    pub hook_timeout_ms: Option<u64>,
    pub trust_read_only_hints: Option<bool>,
    /// By API key (the key itself, as in `api_keys`).
    pub keys: BTreeMap<String, Permissions>,
}

impl ServerPermissions {
    /// The policy of a session that sets none.
    pub fn default_policy(&self) -> Permissions {
        Permissions {
            mode: self.mode,
            allow: self.allow.clone(),
            deny: self.deny.clone(),
            hook_url: self.hook_url.clone(),
            approval_timeout_s: self.approval_timeout_s,
            hook_timeout_ms: self.hook_timeout_ms,
            trust_read_only_hints: self.trust_read_only_hints,
        }
    }
}

/// A call as the policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct PolicyCall<'a> {
    pub tool: &'a str,
    pub input: &'a Value,
    /// The tool only reads (`Read`, `Glob`, `Grep`, an MCP tool marked
    /// read-only).
    pub read_only: bool,
    /// Where relative paths start.
    pub working_dir: &'a str,
    /// Where the call's path leads once links are followed (as the
    /// sandbox resolved it), when it was asked: path rules deny a call
    /// whose path or resolved path they cover, and allow one only when
    /// they cover both.
    pub resolved: Option<&'a str>,
}

/// What a policy says about a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// A person (or the hook) decides; the reason says why it waits.
    Ask(String),
    /// It does not run; the reason goes to the model.
    Deny(String),
}

impl Verdict {
    fn weight(&self) -> u8 {
        match self {
            Verdict::Allow => 0,
            Verdict::Ask(_) => 1,
            Verdict::Deny(_) => 2,
        }
    }

    /// The stricter of two verdicts (the first on a tie).
    pub fn stricter(self, other: Verdict) -> Verdict {
        if other.weight() > self.weight() {
            other
        } else {
            self
        }
    }
}

/// A policy with its rules parsed.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub mode: Mode,
    allow: Vec<Rule>,
    deny: Vec<Rule>,
    /// Where the verdict's reasons say it came from ("the session's",
    /// "the API key's").
    whose: &'static str,
}

impl Policy {
    /// Parses a policy's rules; errors name the rule under `prefix`.
    pub fn compile(permissions: &Permissions, prefix: &str) -> Result<Policy, PolicyError> {
        let parse = |list: &[String], name: &str| {
            list.iter()
                .enumerate()
                .map(|(i, text)| {
                    Rule::parse(text).map_err(|message| PolicyError {
                        field: format!("{prefix}.{name}[{i}]"),
                        message,
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Policy {
            mode: permissions.mode.unwrap_or_default(),
            allow: parse(&permissions.allow, "allow")?,
            deny: parse(&permissions.deny, "deny")?,
            whose: "the session's",
        })
    }

    /// The same policy, its reasons naming whose it is.
    pub fn of(mut self, whose: &'static str) -> Policy {
        self.whose = whose;
        self
    }

    /// Deny rules first, then allow rules, then the mode. A command the
    /// shell parser cannot see into is refused where a deny rule names
    /// its tool: no rule could tell what it runs.
    pub fn verdict(&self, call: &PolicyCall<'_>) -> Verdict {
        let whose = self.whose;
        if !self.deny.is_empty() || !self.allow.is_empty() {
            let subject = rules::subject(call);
            if let Some(rule) = self.deny.iter().find(|r| r.denies(call, &subject)) {
                return Verdict::Deny(format!("{whose} permissions deny it (rule `{rule}`)"));
            }
            if let rules::Subject::Command(_, analysis) = &subject
                && let Some(why) = &analysis.opaque
                && let Some(rule) = self.deny.iter().find(|r| r.names(call.tool))
            {
                return Verdict::Deny(format!(
                    "the command cannot be checked against {whose} deny rule `{rule}`: {why}"
                ));
            }
            if self.allow.iter().any(|r| r.allows(call, &subject)) {
                return Verdict::Allow;
            }
        }
        let tool = call.tool;
        match self.mode {
            Mode::Auto => Verdict::Allow,
            Mode::Ask => Verdict::Ask(format!(
                "{whose} permission mode is `ask`: every call waits for a decision"
            )),
            Mode::AskWrites | Mode::Plan if call.read_only => Verdict::Allow,
            Mode::AskWrites => Verdict::Ask(format!(
                "`{tool}` can change state and {whose} permission mode is `ask_writes`"
            )),
            Mode::Plan => Verdict::Deny(format!(
                "{whose} permission mode is `plan`: only calls that read run; \
                 propose the change instead of making it"
            )),
        }
    }

    /// Whether a rule of this policy reads `tool`'s input (not only its
    /// name): what makes a file tool's path worth resolving.
    pub fn reads_input_of(&self, tool: &str) -> bool {
        self.allow
            .iter()
            .chain(&self.deny)
            .any(|r| r.has_pattern() && r.names(tool))
    }

    /// The deny rule that covers the call, whatever the mode says.
    pub fn denying_rule(&self, call: &PolicyCall<'_>) -> Option<&Rule> {
        if self.deny.is_empty() {
            return None;
        }
        let subject = rules::subject(call);
        self.deny.iter().find(|r| r.denies(call, &subject))
    }

    /// Whether an allow rule of this policy matches (for rules a decision
    /// remembered).
    pub fn allows(&self, call: &PolicyCall<'_>) -> bool {
        let subject = rules::subject(call);
        self.allow.iter().any(|r| r.allows(call, &subject))
    }

    /// A policy of allow rules only (rules a decision remembered).
    pub fn allowing(rules: Vec<Rule>) -> Policy {
        Policy {
            allow: rules,
            ..Policy::default()
        }
    }
}

/// What the system prompt adds in `plan` mode.
pub const PLAN_NOTE: &str = "This session is in plan mode: only tools that read run. \
Do not try to change files or run commands that change state; read what you need, \
then answer with the plan of changes you propose.";

#[cfg(test)]
mod tests;
