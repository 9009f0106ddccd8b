//! A session's external MCP servers (`options.mcp_servers`): a command over
//! stdio or a streamable HTTP URL, their tools offered as
//! `mcp__{server}__{tool}`.
//!
//! A stdio server is a process on the server's host, outside any sandbox,
//! so only commands the operator allows (`mcp.stdio_commands`, a program
//! or a whole command line) start, in a session of their own, with a clean
//! environment: the variables `mcp.stdio_env` names from the server's, and
//! those `mcp.stdio_session_env` lets the session set. An
//! HTTP server is reached only where `mcp.allowed_http_servers` allows,
//! checked on every connection after DNS ([`crate::egress`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, Tool};
use rmcp::service::{RunningService, ServiceExt};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceError};
use serde_json::Value;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::agent::{McpServerSpec, RESERVED_SERVER_NAMES, ToolOutput};
use crate::config::McpConfig;
use crate::model::ToolSpec;
use crate::sync::lock;

/// How long a server may take to start and list its tools.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

struct Connected {
    client: RunningService<RoleClient, ()>,
    tools: Vec<Tool>,
}

/// One server of one session: connected at first use, or the reason it
/// could not be.
type Server = OnceCell<Result<Arc<Connected>, String>>;

pub struct ExternalServers {
    config: McpConfig,
    /// For HTTP servers: connects only where `mcp.allowed_http_servers`
    /// allows; `None` when the list is empty (URLs are off).
    http: Option<reqwest::Client>,
    sessions: Mutex<HashMap<Uuid, Arc<BTreeMap<String, Server>>>>,
}

impl Default for ExternalServers {
    fn default() -> Self {
        ExternalServers::new(McpConfig::default())
    }
}

impl ExternalServers {
    pub fn new(config: McpConfig) -> ExternalServers {
        let rules = config.http_rules();
        let http = (!config.allowed_http_servers.is_empty())
            .then(|| rules.client().build().ok())
            .flatten();
        ExternalServers {
            config,
            http,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    fn servers_of(
        &self,
        session: Uuid,
        specs: &BTreeMap<String, McpServerSpec>,
    ) -> Arc<BTreeMap<String, Server>> {
        lock(&self.sessions)
            .entry(session)
            .or_insert_with(|| {
                Arc::new(
                    specs
                        .keys()
                        .map(|name| (name.clone(), OnceCell::new()))
                        .collect(),
                )
            })
            .clone()
    }

    async fn connected(
        &self,
        session: Uuid,
        specs: &BTreeMap<String, McpServerSpec>,
        name: &str,
    ) -> Result<Arc<Connected>, String> {
        let servers = self.servers_of(session, specs);
        let (Some(cell), Some(spec)) = (servers.get(name), specs.get(name)) else {
            return Err(format!("no MCP server named '{name}' in this session"));
        };
        cell.get_or_init(|| async {
            match tokio::time::timeout(CONNECT_TIMEOUT, self.connect(spec)).await {
                Ok(Ok(connected)) => Ok(Arc::new(connected)),
                Ok(Err(e)) => Err(format!("MCP server '{name}': {e}")),
                Err(_) => Err(format!(
                    "MCP server '{name}' did not answer within {}s",
                    CONNECT_TIMEOUT.as_secs()
                )),
            }
        })
        .await
        .clone()
    }

    async fn connect(&self, spec: &McpServerSpec) -> Result<Connected, String> {
        let client = match spec {
            McpServerSpec::Stdio { command, args, env } => {
                self.config.check_stdio_command(command, args)?;
                self.config.check_stdio_env(env.keys())?;
                let mut cmd = tokio::process::Command::new(command);
                // A clean environment: the server's own (its API keys)
                // stays with the server.
                cmd.env_clear();
                for name in &self.config.stdio_env {
                    if let Some(value) = std::env::var_os(name) {
                        cmd.env(name, value);
                    }
                }
                cmd.args(args).envs(env).kill_on_drop(true);
                // A session of its own: the child never shares the
                // terminal the server was started from.
                // SAFETY: setsid(2) is async-signal-safe and takes no
                // arguments; nothing else runs between fork and exec.
                unsafe {
                    cmd.pre_exec(|| {
                        if libc::setsid() < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
                let transport = TokioChildProcess::new(cmd).map_err(|e| e.to_string())?;
                ().serve(transport).await.map_err(|e| e.to_string())?
            }
            McpServerSpec::Http { url, headers } => {
                let Some(http) = &self.http else {
                    return Err(
                        "HTTP MCP servers are turned off (mcp.allowed_http_servers is empty)"
                            .into(),
                    );
                };
                let mut custom = HashMap::new();
                for (name, value) in headers {
                    let name = http::HeaderName::try_from(name.as_str())
                        .map_err(|e| format!("header '{name}': {e}"))?;
                    let value = http::HeaderValue::try_from(value.as_str())
                        .map_err(|e| format!("header '{name}': {e}"))?;
                    custom.insert(name, value);
                }
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(custom);
                let client = super::traced_http::TracedHttp(http.clone());
                let transport = StreamableHttpClientTransport::with_client(client, config);
                ().serve(transport).await.map_err(|e| e.to_string())?
            }
        };
        let tools = client.list_all_tools().await.map_err(|e| e.to_string())?;
        Ok(Connected { client, tools })
    }

    /// The tools of every server of the session; a server that cannot be
    /// reached offers none (its calls say why).
    pub async fn specs(
        &self,
        session: Uuid,
        specs: &BTreeMap<String, McpServerSpec>,
    ) -> Vec<ToolSpec> {
        let mut offered = Vec::new();
        for name in specs.keys() {
            if RESERVED_SERVER_NAMES.contains(&name.to_ascii_lowercase().as_str()) {
                // Refused when options are given; one stored before that
                // was refused never offers a tool in a built-in's place.
                tracing::warn!(%session, server = %name, "an MCP server with a built-in server's name is ignored");
                continue;
            }
            match self.connected(session, specs, name).await {
                Ok(connected) => offered.extend(connected.tools.iter().map(|tool| {
                    ToolSpec {
                        name: format!("mcp__{name}__{}", tool.name),
                        description: tool.description.clone().unwrap_or_default().into(),
                        input_schema: Arc::new(Value::Object((*tool.input_schema).clone())),
                        read_only: tool
                            .annotations
                            .as_ref()
                            .and_then(|a| a.read_only_hint)
                            .unwrap_or(false),
                    }
                })),
                Err(e) => tracing::warn!(%session, error = %e, "external MCP server unavailable"),
            }
        }
        offered
    }

    /// Calls `mcp__{server}__{tool}`.
    pub async fn call(
        &self,
        session: Uuid,
        specs: &BTreeMap<String, McpServerSpec>,
        server: &str,
        tool: &str,
        input: Value,
        cancel: CancellationToken,
    ) -> ToolOutput {
        let connected = match self.connected(session, specs, server).await {
            Ok(connected) => connected,
            Err(e) => return ToolOutput::error(e),
        };
        let mut params = CallToolRequestParams::new(tool.to_string());
        if let Value::Object(arguments) = input {
            params = params.with_arguments(arguments);
        }
        // MCP's place for the trace context (SEP-414); over HTTP it goes
        // in the headers too (`traced_http`).
        if let Some(carrier) = crate::telemetry::otel::current_json() {
            params.meta = Some(rmcp::model::RequestMetaObject(carrier.into()));
        }
        let result = tokio::select! {
            result = connected.client.call_tool(params) => result,
            _ = cancel.cancelled() => return ToolOutput::error("interrupted"),
        };
        match result {
            Ok(result) => {
                let is_error = result.is_error == Some(true);
                let output = match result.structured_content {
                    Some(structured) if !is_error => structured,
                    _ => Value::String(
                        result
                            .content
                            .iter()
                            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                            .collect::<Vec<_>>()
                            .join("\n"),
                    ),
                };
                ToolOutput { output, is_error }
            }
            Err(ServiceError::McpError(e)) => ToolOutput::error(e.message.to_string()),
            Err(e) => ToolOutput::error(format!("MCP server '{server}': {e}")),
        }
    }

    /// Closes the session's servers (stdio ones are killed).
    pub async fn release(&self, session: Uuid) {
        let servers = lock(&self.sessions).remove(&session);
        let Some(servers) = servers.and_then(|s| Arc::try_unwrap(s).ok()) else {
            return;
        };
        for (_, cell) in servers {
            if let Some(Ok(connected)) = cell.into_inner()
                && let Ok(connected) = Arc::try_unwrap(connected)
            {
                let _ = connected.client.cancel().await;
            }
        }
    }
}
