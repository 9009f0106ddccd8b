//! A session's own MCP servers (`options.mcp_servers`): a stdio server made
//! with the Python SDK is started for the session and its tool offered and
//! called as `mcp__{server}__{tool}`; a command the operator did not allow
//! never starts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "providers/upstream.rs"]
#[allow(dead_code)]
mod upstream;

use common::{TestServer, ndjson};
use conclave::config::{ModelAlias, ProviderKind};
use serde_json::{Value, json};
use upstream::{Reply, Upstream, chunk_usage, content, delta, end, finish};

fn python() -> String {
    std::env::var("CONCLAVE_TEST_PYTHON").expect(
        "CONCLAVE_TEST_PYTHON must name a python with the mcp package (scripts/test.sh sets it)",
    )
}

fn tool_call(name: &str, arguments: &str) -> Reply {
    Reply::sse(vec![
        delta(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                       "function": {"name": name, "arguments": arguments}}]}),
        ),
        finish("tool_calls"),
        chunk_usage(10, 5),
        end(),
    ])
}

fn done() -> Reply {
    Reply::sse(vec![
        content("Done."),
        finish("stop"),
        chunk_usage(5, 1),
        end(),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_stdio_mcp_server_is_offered_and_called() {
    let upstream = Upstream::start(vec![
        tool_call("mcp__shouty__shout", "{\"text\": \"hello\"}"),
        done(),
        tool_call(
            "mcp__self__execute_shell",
            "{\"command\": \"echo via-http\"}",
        ),
        done(),
    ])
    .await;
    let base_url = format!("{}/v1", upstream.url);
    let interpreter = python();
    let allowed = interpreter.clone();
    let server = TestServer::start_sandboxed(move |c| {
        c.mcp.stdio_commands = vec![allowed];
        // The HTTP server below is this server's own /mcp, on loopback.
        c.mcp.allowed_http_servers = vec!["127.0.0.1".into()];
        c.models.insert(
            "scripted".into(),
            ModelAlias {
                provider: ProviderKind::Openai,
                model: "small-model".into(),
                base_url: Some(base_url),
                api_key: None,
                ..Default::default()
            },
        );
    })
    .await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/shout_server.py");
    let events = ndjson(
        server
            .post(
                "/agent/run",
                json!({
                    "prompt": "shout hello",
                    "model": "scripted",
                    "sandbox_enabled": false,
                    "mcp_servers": {"shouty": {"command": interpreter, "args": [script]}},
                }),
            )
            .await,
    )
    .await;
    let result = events
        .iter()
        .find(|e| e["type"] == "tool_result")
        .expect("a tool result");
    assert_eq!(result["tool"], "mcp__shouty__shout");
    assert_eq!(result["is_error"], false, "{result}");
    let text = match &result["output"] {
        Value::String(s) => s.clone(),
        other => other["result"].as_str().unwrap_or_default().to_string(),
    };
    assert_eq!(text, "HELLO", "{result}");
    let requests = upstream.requests();
    let offered: Vec<&str> = requests[0].body["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert_eq!(offered, ["mcp__shouty__shout"]);

    // A command the operator did not list never starts: the session is
    // refused when it is created, naming the field.
    let refused = server
        .post(
            "/agent/run",
            json!({
                "prompt": "go",
                "model": "scripted",
                "sandbox_enabled": false,
                "mcp_servers": {"rogue": {"command": "/bin/sh", "args": ["-c", "touch /tmp/pwned"]}},
            }),
        )
        .await;
    assert_eq!(refused.status(), 422);
    let body: Value = refused.json().await.expect("json");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("mcp_servers.rogue.command: ")
            && message.contains("mcp.stdio_commands"),
        "{message}"
    );

    // An HTTP server: this server's own /mcp, reached as an external one.
    let events = ndjson(
        server
            .post(
                "/agent/run",
                json!({
                    "prompt": "go",
                    "model": "scripted",
                    "sandbox_enabled": false,
                    "mcp_servers": {"self": {"url": server.url("/mcp")}},
                }),
            )
            .await,
    )
    .await;
    let result = events
        .iter()
        .find(|e| e["type"] == "tool_result")
        .expect("a tool result");
    assert_eq!(result["tool"], "mcp__self__execute_shell");
    assert_eq!(result["output"]["stdout"], "via-http\n", "{result}");
    server.stop_and_remove_sandboxes().await;
}
