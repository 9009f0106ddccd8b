//! AG-UI at `POST /ag-ui/{agent}`, driven by the official clients: the
//! Python SDK (`ag-ui-protocol`, tests/ag_ui/client.py), whose event models
//! every event must pass, and the JavaScript client's `HttpAgent`
//! (`@ag-ui/client`, tests/ag_ui/http_agent.mjs). Plain, streamed and
//! reconnecting runs, an approval interrupt and its resume, a front-end
//! tool's round trip, a deliberation
//! and a pipeline with their state, bad input, another key's thread, a
//! page of another origin, and a tool that runs in a docker sandbox.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{TestServer, python_json};
use serde_json::{Value, json};

const KEY: &str = "agui-key-a";
const OTHER: &str = "agui-key-b";
const NEEDS: &str = "the ag-ui-protocol package";

async fn server() -> TestServer {
    TestServer::start_with(|c| {
        c.api_keys = vec![KEY.into(), OTHER.into()];
        c.max_body_bytes = 1 << 20;
    })
    .await
}

fn of<'a>(seen: &'a Value, case: &str) -> Vec<&'a str> {
    seen[case]["types"]
        .as_array()
        .unwrap_or_else(|| panic!("{case}: {seen}"))
        .iter()
        .filter_map(Value::as_str)
        .collect()
}

fn code(answer: &Value) -> &str {
    answer["body"]["error"]["code"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_passes_the_python_sdk_in_each_case() {
    let server = server().await;
    let url = server.url("");
    let seen = python_json(
        "tests/ag_ui/client.py",
        &["core", "--url", &url, "--key", KEY, "--other-key", OTHER],
        NEEDS,
    )
    .await;

    // A plain run streams its text between the run's start and end.
    let plain = of(&seen, "plain");
    assert_eq!(plain.first(), Some(&"RUN_STARTED"), "{seen}");
    assert_eq!(plain.last(), Some(&"RUN_FINISHED"));
    let at = |name: &str| plain.iter().position(|t| *t == name).unwrap();
    assert!(at("TEXT_MESSAGE_START") < at("TEXT_MESSAGE_CONTENT"));
    assert!(at("TEXT_MESSAGE_CONTENT") < at("TEXT_MESSAGE_END"));
    assert!(
        plain
            .iter()
            .filter(|t| **t == "TEXT_MESSAGE_CONTENT")
            .count()
            > 1,
        "text_deltas stream the text: {plain:?}"
    );
    assert!(
        seen["plain"]["text"]
            .as_str()
            .unwrap()
            .contains("hello there"),
        "{seen}"
    );
    assert_eq!(seen["plain"]["finished"]["outcome"]["type"], "success");
    // Token usage is a list of one entry: the Python SDK (ag-ui-protocol)
    // types RUN_FINISHED.usage as a list and refuses an object.
    let usage = &seen["plain"]["finished"]["usage"][0];
    assert!(
        usage["inputTokens"].is_u64() && usage["totalTokens"].is_u64(),
        "{seen}"
    );

    // A second run on the thread opens with the thread's messages.
    let again = of(&seen, "reconnect");
    assert_eq!(again[..2], ["RUN_STARTED", "MESSAGES_SNAPSHOT"], "{seen}");
    let snapshot = seen["reconnect"]["snapshot"].as_array().unwrap();
    let roles: Vec<&str> = snapshot.iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "user"]);
    assert_eq!(snapshot[0]["content"], "hello there");
    assert_eq!(snapshot[2]["content"], "and again");

    // A call waiting for approval ends the run with an interrupt; the next
    // run's resume allows it and streams the rest of the turn.
    let interrupt = &seen["interrupt"]["outcome"];
    assert_eq!(interrupt["type"], "interrupt", "{seen}");
    assert_eq!(interrupt["interrupts"][0]["reason"], "tool_approval");
    let call = interrupt["interrupts"][0]["toolCallId"].as_str().unwrap();
    let asked = of(&seen, "interrupt");
    assert!(asked.contains(&"TOOL_CALL_START"), "{asked:?}");
    assert!(!asked.contains(&"TOOL_CALL_RESULT"), "{asked:?}");
    assert_eq!(interrupt["interrupts"][0]["id"], call);
    assert_eq!(
        seen["resumed"]["results"],
        json!(["ran: echo approved"]),
        "{seen}"
    );
    assert_eq!(seen["resumed"]["last"]["outcome"]["type"], "success");

    // A front-end tool's call ends the run with the call pending; the next
    // run's tool message answers it and the turn goes on from it.
    let page = &seen["client_tool"];
    let first = page["first"]["types"].as_array().unwrap();
    assert!(first.contains(&json!("TOOL_CALL_END")), "{page}");
    assert!(!first.contains(&json!("TOOL_CALL_RESULT")), "{page}");
    let pending = &page["first"]["last"]["outcome"]["pendingToolCallIds"];
    assert_eq!(pending.as_array().map(Vec::len), Some(1), "{page}");
    let args: Value = serde_json::from_str(page["first"]["args"].as_str().unwrap()).unwrap();
    assert_eq!(args["command"], "echo on-the-page");
    assert_eq!(
        page["second"]["last"]["outcome"],
        json!({"type": "success"})
    );
    assert!(
        page["second"]["text"]
            .as_str()
            .unwrap()
            .contains("Bash returned: page says hi"),
        "{page}"
    );

    // A deliberation and a pipeline show their state as it changes.
    let panel = &seen["deliberation"];
    assert_eq!(of(&seen, "deliberation")[1], "STATE_SNAPSHOT", "{seen}");
    assert_eq!(panel["state"]["kind"], "deliberation");
    assert_eq!(panel["state"]["numAgents"], 2);
    assert_eq!(panel["state"]["status"], "COMPLETED");
    assert_eq!(panel["state"]["agents"].as_object().unwrap().len(), 2);
    for agent in panel["state"]["agents"].as_object().unwrap().values() {
        assert_eq!(agent["status"], "completed", "{panel}");
        assert!(agent["proposal"].is_object(), "{panel}");
    }
    let pipeline = &seen["pipeline"];
    assert_eq!(pipeline["state"]["kind"], "pipeline", "{seen}");
    assert_eq!(pipeline["state"]["status"], "completed");
    assert!(
        pipeline["steps"].as_array().unwrap().len() > 1,
        "{pipeline}"
    );
    assert!(
        of(&seen, "pipeline").contains(&"STEP_FINISHED"),
        "{pipeline}"
    );

    // Input the run cannot use is a RUN_ERROR that says why.
    for case in ["not_user", "bad_option", "other_kind"] {
        let events = seen["bad_input"][case].as_array().unwrap();
        let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
        assert_eq!(types, ["RUN_STARTED", "RUN_ERROR"], "{case}: {events:?}");
    }
    let message = seen["bad_input"]["bad_option"][1]["message"]
        .as_str()
        .unwrap();
    assert!(message.contains("max_turns"), "{message}");
    let message = seen["bad_input"]["other_kind"][1]["message"]
        .as_str()
        .unwrap();
    assert!(message.contains("agent session"), "{message}");

    // A request that is no run at all is a JSON error.
    assert_eq!(seen["not_uuid"]["status"], 422, "{seen}");
    assert!(
        seen["not_uuid"]["body"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("threadId")
    );
    assert_eq!(seen["not_json"]["status"], 400, "{seen}");
    assert_eq!(seen["unknown_agent"]["status"], 404, "{seen}");
    assert_eq!(seen["oversized"]["status"], 413, "{seen}");
    assert_eq!(code(&seen["oversized"]), "body_too_large");

    // Another key's thread is not found, and its session is untouched.
    assert_eq!(seen["other_key"]["status"], 404, "{seen}");
    assert_eq!(code(&seen["other_key"]), "not_found");
    let thread = seen["thread"].as_str().unwrap();
    let status = server
        .send_as(
            KEY,
            reqwest::Method::GET,
            &format!("/agent/session/{thread}/status"),
            None,
        )
        .await;
    let status: Value = status.json().await.unwrap();
    let prompts: Vec<&Value> = status["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| &m["content"])
        .collect();
    assert_eq!(prompts, [&json!("hello there"), &json!("and again")]);
    // Made by the adapter: the sessions list can tell it from the key's own.
    assert_eq!(status["origin"], "agui", "{status}");
    server.stop().await;
}

/// The official JavaScript client runs two turns of a thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_javascript_http_agent_runs_a_thread() {
    let client = std::env::var("CONCLAVE_TEST_AGUI_CLIENT").expect(
        "CONCLAVE_TEST_AGUI_CLIENT must name the npm prefix of @ag-ui/client (scripts/test.sh installs it)",
    );
    let server = server().await;
    let output = tokio::process::Command::new("node")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/ag_ui/http_agent.mjs"
        ))
        .args([&client, &server.url(""), KEY])
        .output()
        .await
        .expect("node starts");
    assert!(
        output.status.success(),
        "http_agent.mjs failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    let runs = seen["runs"].as_array().unwrap();
    assert_eq!(runs[0]["types"][0], "RUN_STARTED", "{seen}");
    // The agent holds the thread's messages: no snapshot on its next run.
    assert!(
        !runs[1]["types"]
            .as_array()
            .unwrap()
            .contains(&json!("MESSAGES_SNAPSHOT")),
        "{seen}"
    );
    let roles = |messages: &Value| -> Vec<String> {
        messages
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        roles(&seen["messages"]),
        ["user", "assistant", "user", "assistant"],
        "{seen}"
    );
    // A new agent on the thread (a page opened again) runs with no message
    // and gets the thread's messages.
    assert_eq!(
        seen["reconnect"]["types"],
        json!(["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]),
        "{seen}"
    );
    let messages = &seen["reconnect"]["messages"];
    assert_eq!(roles(messages), ["user", "assistant", "user", "assistant"]);
    assert!(
        messages[3]["content"]
            .as_str()
            .unwrap()
            .contains("once more"),
        "{seen}"
    );
    server.stop().await;
}

/// A page of another origin cannot start a run, even with a JSON body.
#[tokio::test]
async fn a_page_of_another_origin_cannot_post_a_run() {
    let server = server().await;
    let thread = uuid::Uuid::new_v4();
    let body = json!({"threadId": thread, "runId": "r1", "state": {}, "tools": [],
        "context": [], "messages": [{"id": "m1", "role": "user", "content": "$ touch x"}]});
    let response = server
        .http
        .post(server.url("/ag-ui/agent"))
        .bearer_auth(KEY)
        .header("origin", "http://evil.example")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["error"]["code"], "origin_not_allowed");
    let sessions = server
        .send_as(KEY, reqwest::Method::GET, "/agent/sessions", None)
        .await;
    let sessions: Value = sessions.json().await.unwrap();
    assert_eq!(sessions["sessions"], json!([]), "nothing ran");
    server.stop().await;
}

/// A tool the model calls runs in a docker sandbox (a shell works out
/// the `$((…))`); its call streams as
/// TOOL_CALL_START/ARGS/END and its output as TOOL_CALL_RESULT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_runs_in_a_docker_sandbox() {
    let server = TestServer::start_sandboxed(|c| c.api_keys = vec![KEY.into()]).await;
    let url = server.url("");
    let seen = python_json(
        "tests/ag_ui/client.py",
        &["tools", "--url", &url, "--key", KEY],
        NEEDS,
    )
    .await;
    let calls: Vec<&str> = seen["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["type"].as_str())
        .collect();
    assert_eq!(
        calls,
        [
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "TOOL_CALL_RESULT"
        ],
        "{seen}"
    );
    assert_eq!(seen["calls"][0]["toolCallName"], "Bash");
    let args: Value = serde_json::from_str(seen["calls"][1]["delta"].as_str().unwrap()).unwrap();
    assert_eq!(args["command"], "echo from-the-$((40 + 2))");
    assert!(
        seen["calls"][3]["content"]
            .as_str()
            .unwrap()
            .contains("from-the-42"),
        "{seen}"
    );
    assert_eq!(seen["last"]["outcome"]["type"], "success", "{seen}");
    server.stop_and_remove_sandboxes().await;
}
