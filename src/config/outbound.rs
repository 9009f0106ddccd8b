//! Where sessions' options may make the server connect or run things:
//! MCP servers (stdio commands on this host, HTTP URLs) and A2A agents,
//! and the A2A server's own settings.

use serde::{Deserialize, Serialize};

use super::string_or_list;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    /// Commands a session may start as a stdio MCP server
    /// (`options.mcp_servers`). They run on this host, outside any
    /// sandbox, so none is allowed unless listed. An entry is either a
    /// whole command line (`"npx -y @modelcontextprotocol/server-memory"`),
    /// which allows exactly those arguments, or a bare program (`"npx"`),
    /// which allows it with any arguments: a bare `npx`, `python3` or `sh`
    /// lets a session run anything on the host.
    pub stdio_commands: Vec<String>,
    /// Variables of the server's own environment a stdio MCP server gets;
    /// nothing else of it (API keys included) reaches the child.
    pub stdio_env: Vec<String>,
    /// Variables a session may set for its stdio MCP servers
    /// (`options.mcp_servers.NAME.env`); any other is refused. None by
    /// default: a variable such as `NODE_OPTIONS` or `LD_PRELOAD` runs code
    /// of the caller's choosing.
    pub stdio_session_env: Vec<String>,
    /// Where a session's HTTP MCP servers and A2A agents (their cards and
    /// the interfaces the cards name) may be: `"public"` (any public
    /// address), host names, addresses and CIDRs; empty turns URLs off.
    /// Loopback, private and link-local addresses need an entry.
    #[serde(deserialize_with = "string_or_list")]
    pub allowed_http_servers: Vec<String>,
}

/// The A2A server (`/a2a/{agent}`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct A2aConfig {
    /// Agent cards are served without a key, as A2A clients discover them:
    /// a card shows an agent's name, description and built-in tool names,
    /// and the bearer scheme that every call needs. `false` asks a key for
    /// cards too.
    pub public_cards: bool,
}

impl Default for A2aConfig {
    fn default() -> Self {
        A2aConfig { public_cards: true }
    }
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            stdio_commands: Vec::new(),
            stdio_env: vec!["PATH".into(), "HOME".into(), "LANG".into()],
            stdio_session_env: Vec::new(),
            allowed_http_servers: vec!["public".into()],
        }
    }
}

impl McpConfig {
    /// The allow list of `allowed_http_servers`: where a session's options
    /// may make the server connect (HTTP MCP servers, A2A agents, the
    /// approval hook). The config was validated at load; a list that does
    /// not parse allows nothing.
    pub fn http_rules(&self) -> std::sync::Arc<crate::egress::Rules> {
        std::sync::Arc::new(
            crate::egress::Rules::parse(&self.allowed_http_servers).unwrap_or_default(),
        )
    }

    /// Whether `mcp.stdio_commands` lets a session start `command` with
    /// `args`, and if not, why.
    pub fn check_stdio_command(&self, command: &str, args: &[String]) -> Result<(), String> {
        let allowed = self.stdio_commands.iter().any(|entry| {
            match shlex::split(entry).as_deref() {
                // A bare program: any arguments.
                Some([program]) => program == command,
                Some([program, pinned @ ..]) => program == command && pinned == args,
                _ => false,
            }
        });
        if allowed {
            return Ok(());
        }
        let listed = self.stdio_commands.iter().any(|entry| {
            shlex::split(entry).is_some_and(|words| words.first().is_some_and(|p| p == command))
        });
        Err(if listed {
            format!(
                "{command:?} is in mcp.stdio_commands only with other arguments; \
                 stdio MCP servers run on the server's host, so the operator allows each command line"
            )
        } else {
            format!(
                "{command:?} is not in mcp.stdio_commands; stdio MCP servers run \
                 on the server's host, so the operator allows each command"
            )
        })
    }

    /// Whether a session may set each of `env` for a stdio MCP server
    /// (`mcp.stdio_session_env`); the error names the first it may not.
    pub fn check_stdio_env<'a>(
        &self,
        mut env: impl Iterator<Item = &'a String>,
    ) -> Result<(), String> {
        match env.find(|name| !self.stdio_session_env.contains(name)) {
            None => Ok(()),
            Some(name) => Err(format!(
                "{name:?} is not in mcp.stdio_session_env; a stdio MCP server gets only \
                 the variables the operator allows"
            )),
        }
    }

    /// Checks the entries of `mcp.stdio_commands` read as command lines.
    pub fn validate(&self) -> Result<(), (String, String)> {
        for (i, entry) in self.stdio_commands.iter().enumerate() {
            if shlex::split(entry).is_none_or(|words| words.is_empty()) {
                return Err((
                    format!("mcp.stdio_commands[{i}]"),
                    format!("{entry:?} is not a command line (empty, or an unclosed quote)"),
                ));
            }
        }
        Ok(())
    }
}
