//! An agent's card: where it is, which of its interfaces the client
//! speaks, and the tool the model is offered for it.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::json;

use super::TOOL_PREFIX;
use super::rpc::{self, Endpoint};
use super::wire::{AgentCard, AgentInterface};
use crate::agent::A2aAgentSpec;
use crate::egress::Rules;
use crate::model::ToolSpec;

/// Where the card of an agent is, by A2A's well-known path.
const CARD_PATH: &str = "/.well-known/agent-card.json";
/// The binding the client speaks.
const JSONRPC: &str = "JSONRPC";
/// The longest description a card gives its tool: the model reads it on
/// every call.
const MAX_DESCRIPTION: usize = 2000;

/// An agent as its card describes it.
#[derive(Debug)]
pub struct Remote {
    pub endpoint: Endpoint,
    /// Whether to use `SendStreamingMessage` (the card may say no).
    pub streaming: bool,
    pub tool: ToolSpec,
}

/// The card's URL: the configured one when it names a card (a `.json`
/// file), else the well-known path under it.
fn card_url(url: &str) -> String {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    if path.ends_with(".json") {
        url.to_string()
    } else {
        format!("{}{CARD_PATH}", url.trim_end_matches('/'))
    }
}

fn headers(spec: &A2aAgentSpec) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::new();
    for (name, value) in spec.headers().into_iter().flatten() {
        let name =
            HeaderName::try_from(name.as_str()).map_err(|e| format!("header '{name}': {e}"))?;
        let mut value =
            HeaderValue::try_from(value.as_str()).map_err(|e| format!("header '{name}': {e}"))?;
        value.set_sensitive(true);
        map.insert(name, value);
    }
    Ok(map)
}

/// The card's JSON-RPC interface for protocol 1.x (one that names no
/// version is taken as current), its URL made absolute against the card's.
fn interface(card: &AgentCard, card_url: &str) -> Result<(String, AgentInterface), String> {
    let fits = |i: &&AgentInterface| {
        i.protocol_binding.eq_ignore_ascii_case(JSONRPC)
            && (i.protocol_version.is_empty() || i.protocol_version.starts_with("1."))
    };
    let Some(chosen) = card.supported_interfaces.iter().find(fits) else {
        let offered: Vec<String> = card
            .supported_interfaces
            .iter()
            .map(|i| {
                format!("{} {}", i.protocol_binding, i.protocol_version)
                    .trim()
                    .to_string()
            })
            .collect();
        return Err(format!(
            "its card offers no JSONRPC interface of A2A 1.x (it offers: {})",
            if offered.is_empty() {
                "none".to_string()
            } else {
                offered.join(", ")
            }
        ));
    };
    let url = url::Url::parse(card_url)
        .and_then(|base| base.join(&chosen.url))
        .map_err(|e| format!("its card's interface URL {:?}: {e}", chosen.url))?;
    Ok((url.to_string(), chosen.clone()))
}

fn describe(card: &AgentCard) -> String {
    let mut text = format!(
        "Ask the remote agent {} (over A2A) to do something; follow-up calls continue the same conversation.",
        card.name
    );
    if !card.description.is_empty() {
        text.push_str(&format!(" {}", card.description.trim()));
    }
    for skill in &card.skills {
        text.push_str(&format!("\n- {}: {}", skill.name, skill.description.trim()));
    }
    if text.len() > MAX_DESCRIPTION {
        let mut cut = MAX_DESCRIPTION;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

fn tool(name: &str, description: String) -> ToolSpec {
    ToolSpec {
        name: format!("{TOOL_PREFIX}{name}"),
        description,
        input_schema: std::sync::Arc::new(json!({
            "type": "object",
            "properties": {"message": {"type": "string", "description": "What to ask or tell the agent"}},
            "required": ["message"],
        })),
        read_only: false,
    }
}

/// The tool of an agent whose card could not be read: calling it says why.
pub fn unread_tool(name: &str, url: &str, error: &str) -> ToolSpec {
    tool(
        name,
        format!("A remote agent (over A2A) at {url}; it cannot be reached now: {error}"),
    )
}

/// Reads the card of `spec` and checks that its interface is somewhere
/// the rules allow: a card must not point the server at an address the
/// operator did not allow.
pub async fn read(
    http: &reqwest::Client,
    rules: &Rules,
    name: &str,
    spec: &A2aAgentSpec,
    timeout: Duration,
) -> Result<Remote, String> {
    let headers = headers(spec)?;
    let card_url = card_url(spec.url());
    let card = rpc::card(http, &card_url, &headers, timeout).await?;
    let (url, interface) = interface(&card, &card_url)?;
    rules
        .check_url(&url)
        .await
        .map_err(|e| format!("its card's interface {url}: {e} (mcp.allowed_http_servers)"))?;
    Ok(Remote {
        endpoint: Endpoint {
            url,
            tenant: Some(interface.tenant).filter(|t| !t.is_empty()),
            headers,
        },
        streaming: card.capabilities.streaming != Some(false),
        tool: tool(name, describe(&card)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// The tool's description as the model reads it, for a card as JSON.
    fn described(card: Value) -> String {
        describe(&serde_json::from_value(card).unwrap())
    }

    #[test]
    fn the_card_is_under_the_base_unless_the_url_names_it() {
        assert_eq!(
            card_url("https://a.example/agents/echo/"),
            "https://a.example/agents/echo/.well-known/agent-card.json"
        );
        assert_eq!(
            card_url("https://a.example/cards/echo.json?v=1"),
            "https://a.example/cards/echo.json?v=1"
        );
    }

    #[test]
    fn the_jsonrpc_interface_of_version_1_is_chosen_and_made_absolute() {
        let card: AgentCard = serde_json::from_value(json!({"supportedInterfaces": [
            {"url": "https://a.example/grpc", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
            {"url": "/v03", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
            {"url": "rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0", "tenant": "t1"},
        ]}))
        .unwrap();
        let (url, chosen) =
            interface(&card, "https://a.example/echo/.well-known/agent-card.json").unwrap();
        assert_eq!(url, "https://a.example/echo/.well-known/rpc");
        assert_eq!(chosen.tenant, "t1");
        let rest_only: AgentCard = serde_json::from_value(json!({"supportedInterfaces": [
            {"url": "https://a.example/", "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
        ]}))
        .unwrap();
        assert_eq!(
            interface(&rest_only, "https://a.example/card.json").unwrap_err(),
            "its card offers no JSONRPC interface of A2A 1.x (it offers: HTTP+JSON 1.0)"
        );
    }

    #[test]
    fn the_description_names_the_agent_and_its_skills_within_a_bound() {
        assert_eq!(
            described(json!({"name": "echo", "description": "Echoes.",
                "skills": [{"name": "shout", "description": "Upper-cases"}]})),
            "Ask the remote agent echo (over A2A) to do something; follow-up calls continue the same conversation. Echoes.\n- shout: Upper-cases"
        );
        let long = described(json!({"name": "x", "description": "é".repeat(5000)}));
        assert!(long.len() <= MAX_DESCRIPTION + '…'.len_utf8());
    }

    #[tokio::test]
    async fn a_card_pointing_at_a_forbidden_address_is_refused() {
        use axum::{Json, Router, routing::get};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route(
            CARD_PATH,
            get(|| async {
                Json(json!({"name": "sneaky", "supportedInterfaces": [
                    {"url": "http://169.254.169.254/latest", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}]}))
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        let rules = std::sync::Arc::new(Rules::parse(&["127.0.0.1".to_string()]).unwrap());
        let http = rules.client().build().unwrap();
        let spec = A2aAgentSpec::Url(format!("http://{addr}"));
        let err = read(&http, &rules, "sneaky", &spec, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            err.starts_with("its card's interface http://169.254.169.254/latest: ")
                && err.ends_with("(mcp.allowed_http_servers)"),
            "{err}"
        );
    }
}
