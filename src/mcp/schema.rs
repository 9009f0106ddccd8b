//! The MCP server's wire types beyond the sandbox tools' own
//! ([`crate::tools::schema`]): [`Json`], the result wrapper that sends a
//! structured result once, [`ToolFailure`], and the parameters of the tools
//! that start sessions.

use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{CallToolResult, ContentBlock, ErrorData};
use schemars::JsonSchema;
use schemars::transform::RestrictFormats;
use serde::{Deserialize, Serialize};

/// A result this small is also put in a text block, for clients that read
/// only text.
const TEXT_COPY_BYTES: usize = 16 * 1024;

/// A structured tool result, sent once. rmcp's own `Json` also copies the
/// whole result into a text block, which doubles every output on the wire.
/// Named `Json` so that rmcp's `#[tool]` still derives the output schema
/// from it.
pub struct Json<T>(pub T);

impl<T: Serialize + JsonSchema + 'static> IntoCallToolResult for Json<T> {
    fn into_call_tool_result(self) -> Result<rmcp::model::CallToolResponse, ErrorData> {
        let value = crate::tools::schema::structured(&self.0)
            .map_err(|e| ErrorData::internal_error(e, None))?;
        let text = value.to_string();
        let note = if text.len() <= TEXT_COPY_BYTES {
            text
        } else {
            format!(
                "{} bytes of structured result (structuredContent)",
                text.len()
            )
        };
        let mut result = CallToolResult::success(vec![ContentBlock::text(note)]);
        result.structured_content = Some(value);
        Ok(result.into())
    }
}

/// A tool's own failure (a path that escapes, an edit that does not match,
/// an unknown session, a sandbox that cannot start): sent as a result with
/// `isError: true`, which the model reads and can act on. The MCP spec
/// keeps JSON-RPC errors for protocol errors (a malformed call), which rmcp
/// answers before a tool runs.
#[derive(Debug)]
pub struct ToolFailure(pub String);

impl IntoCallToolResult for ToolFailure {
    fn into_call_tool_result(self) -> Result<rmcp::model::CallToolResponse, ErrorData> {
        Ok(CallToolResult::error(vec![ContentBlock::text(self.0)]).into())
    }
}

impl From<crate::tools::ToolError> for ToolFailure {
    fn from(error: crate::tools::ToolError) -> Self {
        ToolFailure(error.0)
    }
}

impl From<ErrorData> for ToolFailure {
    fn from(error: ErrorData) -> Self {
        ToolFailure(error.message.into_owned())
    }
}

/// A deliberation to run (the options of `POST /deliberations`).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = RestrictFormats::default())]
pub struct Deliberate {
    /// The task every agent works on.
    pub task_description: String,
    /// The agents' role (`dev`, `qa`, …); their ids are `agent-{role}-001`, ….
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// How many agents (3 by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_agents: Option<u32>,
    /// `rubric`, `requirements` (a list), `max_iterations`, or any other key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraints: Option<serde_json::Map<String, serde_json::Value>>,
    /// Critique rounds after the first proposals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounds: Option<u32>,
    /// `none`, `judge` or `vote`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate: Option<String>,
    /// Models the agents are spread over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// Each agent runs with tools in a sandbox of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<bool>,
    /// The whole deliberation's deadline in seconds (300 by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_budget_usd: Option<f64>,
}

/// A pipeline run to start (the body of `POST /orchestrator/pipeline/start`).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = RestrictFormats::default())]
pub struct StartPipeline {
    /// The pipeline (`connector` by default; see GET /orchestrator/pipelines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<String>,
    /// The service the connector is for (`stripe`); required by the
    /// `connector` pipeline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connector_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connector_type: Option<String>,
    /// Initial values of the pipeline's state fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<serde_json::Map<String, serde_json::Value>>,
    /// The model of the nodes' agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// A fork of an agent session (`fork_session`).
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = RestrictFormats::default())]
pub struct ForkSession {
    /// The agent session of the caller to fork.
    pub session_id: String,
    /// Fork at the last turn that ended at or before this event seq;
    /// omitted, at the session's last turn end.
    #[serde(default)]
    pub at_seq: Option<u64>,
    /// How many forks to make (default 1).
    #[serde(default)]
    pub count: Option<u32>,
    /// The forks' name, numbered when there are several.
    #[serde(default)]
    pub session_name: Option<String>,
    /// Options changed from the source's (merged on top of them), as
    /// `POST /agent/session` takes them.
    #[serde(default)]
    pub options: Option<serde_json::Map<String, serde_json::Value>>,
}

/// A turn for an agent session (`run_agent`).
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(transform = RestrictFormats::default())]
pub struct RunAgent {
    /// What the agent is asked to do.
    pub prompt: String,
    /// An agent session of the caller to continue; omitted, a new one is
    /// made and its id returned.
    #[serde(default)]
    pub session_id: Option<String>,
    /// The new session's options, as `POST /agent/session` takes them
    /// (`model`, `system_prompt`, `allowed_tools`, `sandbox`, …); only
    /// without `session_id`.
    #[serde(default)]
    pub options: Option<serde_json::Map<String, serde_json::Value>>,
}
