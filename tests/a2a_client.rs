//! A session's remote A2A agents (`options.a2a_agents`): real agents made
//! with the official a2a-sdk (tests/a2a/remote_agents.py) offered to the
//! model as `a2a__{name}`, called with their updates streamed as the
//! call's live output, their context kept from call to call, their task
//! cancelled when the turn is interrupted; an agent where the operator
//! allows no connection is refused when the session is created.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "approvals/script.rs"]
#[allow(dead_code)]
mod script;
#[path = "providers/upstream.rs"]
#[allow(dead_code)]
mod upstream;

use std::process::Stdio;
use std::time::Duration;

use common::TestServer;
use conclave::config::SandboxBackendKind;
use script::{calls, capable, says, start_turn};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout};
use upstream::Upstream;

/// The Python agents, and the lines they print.
struct Agents {
    url: String,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
    _child: Child,
}

impl Agents {
    async fn start() -> Agents {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/a2a/remote_agents.py");
        let mut child = tokio::process::Command::new(common::python("a2a-sdk[http-server]"))
            .arg(script)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python starts");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut agents = Agents {
            url: String::new(),
            lines,
            _child: child,
        };
        agents.url = agents.line("listening ").await;
        agents
    }

    /// The rest of the next line that starts with `prefix`.
    async fn line(&mut self, prefix: &str) -> String {
        let wait = async {
            loop {
                let line = self.lines.next_line().await.expect("read").expect("a line");
                if let Some(rest) = line.strip_prefix(prefix) {
                    return rest.to_string();
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .unwrap_or_else(|_| panic!("the agents printed no `{prefix}` line"))
    }
}

/// A server whose model is the scripted `upstream`, reaching loopback
/// only (where the agents are).
async fn server(upstream: &Upstream) -> TestServer {
    let url = upstream.url.clone();
    TestServer::start_sandboxed(move |c| {
        c.sandbox.backend = SandboxBackendKind::Local;
        c.sandbox.warm_pool = 0;
        c.mcp.allowed_http_servers = vec!["127.0.0.1".into()];
        capable(c, &url);
    })
    .await
}

fn session_body(agents: Value) -> Value {
    json!({"model": "capable", "sandbox_enabled": false, "a2a_agents": agents})
}

async fn session(server: &TestServer, agents: Value) -> String {
    server.create_session(session_body(agents)).await
}

/// The `tool_output` events of a turn, as (stream, content).
fn shown(events: &[Value]) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| e["type"] == "tool_output")
        .map(|e| {
            (
                e["stream"].as_str().unwrap().to_string(),
                e["content"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn result_of(events: &[Value]) -> (Value, Value) {
    let result = events
        .iter()
        .find(|e| e["type"] == "tool_result")
        .expect("a tool result");
    (result["output"].clone(), result["is_error"].clone())
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_agent_streams_its_answer_and_keeps_its_context() {
    let mut agents = Agents::start().await;
    let upstream = Upstream::start(vec![
        calls("call_1", "a2a__echo", json!({"message": "hello"})),
        says("Done."),
        calls("call_2", "a2a__echo", json!({"message": "again"})),
        says("Done."),
        calls("call_3", "a2a__plain", json!({"message": "quietly"})),
        says("Done."),
    ])
    .await;
    let server = server(&upstream).await;
    let id = session(
        &server,
        json!({
            "echo": format!("{}/echo", agents.url),
            // The card's own URL, and headers, work as well.
            "plain": {"url": format!("{}/plain/.well-known/agent-card.json", agents.url),
                      "headers": {"authorization": "Bearer test-token"}},
        }),
    )
    .await;

    let first = server.turn(&id, "ask echo").await;
    assert_eq!(
        result_of(&first),
        (json!("echo #1: HELLO"), json!(false)),
        "{first:?}"
    );
    assert_eq!(
        shown(&first),
        pairs(&[
            ("info", "[submitted]\n"),
            ("info", "[working] echoing 'hello'\n"),
            ("stdout", "echo #1: "),
            ("stdout", "HELLO"),
            ("info", "[completed]\n"),
        ])
    );
    let context = agents.line("context ").await;

    // The second call continues the remote conversation.
    let second = server.turn(&id, "ask echo again").await;
    assert_eq!(result_of(&second), (json!("echo #2: AGAIN"), json!(false)));
    assert_eq!(agents.line("context ").await, context);

    // An agent whose card says it does not stream is sent SendMessage.
    let third = server.turn(&id, "ask plain").await;
    assert_eq!(result_of(&third), (json!("echo #1: QUIETLY"), json!(false)));
    assert_eq!(shown(&third), pairs(&[("info", "[completed]\n")]));
    assert_ne!(agents.line("context ").await, context);
    assert_eq!(agents.line("authorization ").await, "Bearer test-token");

    let requests = upstream.requests();
    let tools = requests[0].body["tools"].as_array().expect("tools");
    let offered: Vec<&str> = tools
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert_eq!(offered, ["a2a__echo", "a2a__plain"]);
    assert_eq!(
        tools[0]["function"]["description"],
        "Ask the remote agent echo (over A2A) to do something; follow-up calls continue the same conversation. The echo agent of the tests.\n- echo skill: What echo does best"
    );
    assert_eq!(
        tools[0]["function"]["parameters"],
        json!({"type": "object", "properties": {"message": {"type": "string",
            "description": "What to ask or tell the agent"}}, "required": ["message"]})
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_turn_cancels_the_remote_task() {
    let mut agents = Agents::start().await;
    let upstream = Upstream::start(vec![calls(
        "call_1",
        "a2a__slow",
        json!({"message": "take your time"}),
    )])
    .await;
    let server = server(&upstream).await;
    let id = session(&server, json!({"slow": format!("{}/slow", agents.url)})).await;
    let mut lines = start_turn(&server, &id, "start the slow work").await;
    loop {
        let event = lines.next().await.expect("the turn goes on");
        if event["type"] == "tool_output" && event["content"] == "[working] slow work started\n" {
            break;
        }
    }
    server
        .post(&format!("/agent/session/{id}/interrupt"), json!({}))
        .await;
    let rest = lines.until("result").await;
    let cancelled = agents.line("cancelled ").await;
    assert_eq!(
        result_of(&rest),
        (
            json!(format!(
                "interrupted: the remote agent 'slow' was asked to cancel its task {cancelled} (now TASK_STATE_CANCELED)"
            )),
            json!(true)
        )
    );
    assert_eq!(rest.last().unwrap()["status"], "interrupted");
    server.stop().await;
}

/// The status and error message of a session created with `agents`.
async fn refusal(server: &TestServer, agents: Value) -> (u16, Value) {
    let refused = server.post("/agent/session", session_body(agents)).await;
    let status = refused.status().as_u16();
    let body: Value = refused.json().await.unwrap();
    (status, body["error"]["message"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_where_no_connection_is_allowed_is_refused() {
    let upstream = Upstream::start(Vec::new()).await;
    let server = server(&upstream).await;
    // A cloud metadata address: link-local, which the allow list (only
    // 127.0.0.1) does not include.
    assert_eq!(
        refusal(
            &server,
            json!({"metadata": "http://169.254.169.254/latest"})
        )
        .await,
        (
            422,
            json!(
                "a2a_agents.metadata: 169.254.169.254 resolves to 169.254.169.254, a link-local address, which the allow list does not include (mcp.allowed_http_servers)"
            )
        )
    );
    assert_eq!(
        refusal(&server, json!({"a": "ftp://127.0.0.1/"})).await,
        (
            422,
            json!(
                "a2a_agents.a: \"ftp://127.0.0.1/\" is not an http or https URL with a host (mcp.allowed_http_servers)"
            )
        )
    );
    // A name that makes no tool name.
    assert_eq!(
        refusal(&server, json!({"two words": "http://127.0.0.1:1"})).await,
        (
            422,
            json!(
                "a2a_agents.two words: an agent's name is 1 to 48 letters, digits, `_` or `-` (it names the tool a2a__NAME)"
            )
        )
    );
    server.stop().await;
}

const PEER_KEY: &str = "a2a-peer-key-0123456789";

/// A second Conclave, started as the README does, whose agents are served
/// over A2A; its demo model paced so that a long prompt runs for seconds.
async fn peer() -> (tempfile::TempDir, Child, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = format!("api_keys = [\"{PEER_KEY}\"]\n[demo]\nchunk_delay_ms = 40\n");
    std::fs::write(dir.path().join("conclave.toml"), config).unwrap();
    let mut command =
        common::binary::serve_command(&["--sandbox", "local", "--config", "conclave.toml"]);
    command.current_dir(dir.path());
    let (child, url) = common::binary::spawn_server(&mut command).await;
    (dir, child, url)
}

/// A task of the peer, read over A2A with the peer's key.
async fn peer_task(url: &str, id: &str) -> Value {
    let answer: Value = reqwest::Client::new()
        .post(format!("{url}/a2a/agent"))
        .bearer_auth(PEER_KEY)
        .header("A2A-Version", "1.0")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": id}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    answer["result"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conclave_agent_calls_another_conclave_over_a2a_and_cancels_it() {
    let (_dir, mut peer_child, peer_url) = peer().await;
    let upstream = Upstream::start(vec![
        calls("call_1", "a2a__peer", json!({"message": "hello peer"})),
        says("Done."),
        calls(
            "call_2",
            "a2a__peer",
            json!({"message": "count ".repeat(300)}),
        ),
    ])
    .await;
    let server = server(&upstream).await;
    let agents = json!({"peer": {"url": format!("{peer_url}/a2a/agent"),
        "headers": {"authorization": format!("Bearer {PEER_KEY}")}}});
    let id = session(&server, agents).await;

    // Streamed: the peer's progress is the call's live output, its result
    // artifact the call's result.
    let first = server.turn(&id, "ask the peer").await;
    assert_eq!(
        result_of(&first),
        (json!("You said: hello peer"), json!(false)),
        "{first:?}"
    );
    let live = shown(&first);
    assert!(live.len() > 2, "{live:?}");
    assert_eq!(live.last().unwrap().1, "[completed] You said: hello peer\n");
    assert!(live.contains(&("stdout".into(), "You said: hello peer".into())));

    // Interrupting the turn cancels the peer's task.
    let mut lines = start_turn(&server, &id, "ask the peer to count").await;
    loop {
        let event = lines.next().await.expect("the turn goes on");
        let content = event["content"].as_str().unwrap_or_default();
        if event["type"] == "tool_output" && content.starts_with("[working]") {
            break;
        }
    }
    server
        .post(&format!("/agent/session/{id}/interrupt"), json!({}))
        .await;
    let rest = lines.until("result").await;
    let (said, is_error) = result_of(&rest);
    assert_eq!(is_error, json!(true));
    let said = said.as_str().unwrap().to_string();
    let task = said
        .split("cancel its task ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("{said}"));
    assert_eq!(
        peer_task(&peer_url, task).await["status"]["state"],
        "TASK_STATE_CANCELED",
        "{said}"
    );
    server.stop().await;
    common::binary::stop(&mut peer_child).await;
}
