//! The permission hook: a program's HTTP endpoint asked before a call
//! would wait for a person (`options.permissions.hook_url`). It answers
//! `{decision: "allow" | "deny" | "ask", message?, input?}`; `ask`, a slow
//! answer, an unreachable hook or an answer that does not parse leave the
//! call to the mode (it waits for a person), with a `status` event that
//! says why. The hook is reached only where `mcp.allowed_http_servers`
//! allows, checked when the session is created and on every connection.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::egress::Rules;
use crate::protocol::Approval;
use crate::session::approvals::Decision;

/// How long the hook has to answer when the policy does not say.
pub const DEFAULT_HOOK_TIMEOUT_MS: u64 = 5_000;

/// The client the hooks are asked with.
pub struct Hooks {
    rules: Arc<Rules>,
    client: reqwest::Client,
}

#[derive(Serialize)]
struct Asked<'a> {
    session_id: Uuid,
    call_id: &'a str,
    tool: &'a str,
    input: &'a Value,
    reason: &'a str,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum HookDecision {
    Allow,
    Deny,
    Ask,
}

#[derive(Deserialize)]
struct HookReply {
    decision: HookDecision,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    input: Option<Value>,
}

/// A call as the hook is asked about it.
pub struct HookCall<'a> {
    pub session_id: Uuid,
    pub call_id: &'a str,
    pub tool: &'a str,
    pub input: &'a Value,
    pub reason: &'a str,
}

impl Hooks {
    /// Hooks reached only where `allowed` (the MCP servers' allow list)
    /// lets the server connect.
    pub fn new(allowed: &[String]) -> Hooks {
        let rules = Arc::new(Rules::parse(allowed).unwrap_or_default());
        let client = rules.client().build().unwrap_or_default();
        Hooks { rules, client }
    }

    /// The hook's decision; `Ok(None)` when it leaves the call to a
    /// person, `Err` with why it could not be asked.
    pub async fn consult(
        &self,
        url: &str,
        call: HookCall<'_>,
        timeout: Duration,
    ) -> Result<Option<Decision>, String> {
        self.rules
            .check_url(url)
            .await
            .map_err(|e| format!("{e} (mcp.allowed_http_servers)"))?;
        let asked = Asked {
            session_id: call.session_id,
            call_id: call.call_id,
            tool: call.tool,
            input: call.input,
            reason: call.reason,
        };
        let sent = self.client.post(url).timeout(timeout).json(&asked).send();
        let response = sent.await.map_err(|e| {
            if e.is_timeout() {
                format!("it did not answer within {} ms", timeout.as_millis())
            } else {
                format!("it could not be reached: {e}")
            }
        })?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("it answered {status}"));
        }
        let body = tokio::time::timeout(timeout, response.bytes())
            .await
            .map_err(|_| format!("it did not answer within {} ms", timeout.as_millis()))?
            .map_err(|e| format!("its answer was cut off: {e}"))?;
        let answered: HookReply = serde_json::from_slice(&body).map_err(|e| {
            format!("its answer is not {{\"decision\": \"allow\" | \"deny\" | \"ask\", …}}: {e}")
        })?;
        let decision = match answered.decision {
            HookDecision::Ask => return Ok(None),
            HookDecision::Allow => Approval::Allow,
            HookDecision::Deny => Approval::Deny,
        };
        Ok(Some(Decision {
            decision,
            message: answered.message,
            input: answered.input,
            remember: None,
            rule: None,
            agent_id: None,
        }))
    }
}

/// Refuses a policy whose `hook_url` the egress rules do not allow, naming
/// the field: a session, deliberation or pipeline run is checked when it
/// is submitted, as every connection is checked again.
pub async fn check_hook_url(
    rules: &Rules,
    permissions: Option<&crate::permission::Permissions>,
) -> Result<(), crate::session::OptionError> {
    if let Some(url) = permissions.and_then(|p| p.hook_url.as_ref()) {
        rules.check_url(url).await.map_err(|e| {
            crate::session::OptionError::new(
                "options.permissions.hook_url",
                format!("{e} (mcp.allowed_http_servers)"),
            )
        })?;
    }
    Ok(())
}
