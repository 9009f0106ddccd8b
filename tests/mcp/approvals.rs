//! A `run_agent` turn whose tool call waits for approval
//! (`options.permissions.mode: ask`), through the official Python SDK
//! (`tests/mcp/approve.py`): a client that declared elicitation is asked
//! and its answer decides; one that did not is told how to decide over
//! HTTP; a call decided over HTTP while the client is asked keeps that
//! decision.

use serde_json::{Value, json};

use super::{agent_server, common};

/// Runs `approve.py MODE` against a sandboxed server with keys.
async fn approve(mode: &str) -> Value {
    let server = agent_server().await;
    let seen = common::python_json(
        "tests/mcp/approve.py",
        &[mode, &server.url("/mcp"), &server.url(""), "ide-key-1"],
        "the mcp package",
    )
    .await;
    server.stop_and_remove_sandboxes().await;
    seen
}

/// The turn ran the call and answered with its output.
fn ran(seen: &Value) {
    let result = &seen["result"];
    assert_eq!(result["is_error"], false, "{seen:#}");
    assert_eq!(result["structured"]["status"], "success", "{seen:#}");
    let text = result["text"].as_str().unwrap();
    assert!(
        text.contains("mcp__sandbox__execute_code returned") && text.contains("approved 42"),
        "{text}"
    );
}

/// The call's approval events: asked once, then decided as `decided`.
fn decided(seen: &Value, decided: Value) {
    let events = seen["approval_events"].as_array().unwrap();
    assert_eq!(events.len(), 2, "{seen:#}");
    assert_eq!(events[0]["type"], "approval_requested");
    assert_eq!(events[0]["tool"], "mcp__sandbox__execute_code");
    let call_id = &events[0]["call_id"];
    let mut wanted = json!({"type": "approval_decided", "call_id": call_id});
    wanted
        .as_object_mut()
        .unwrap()
        .extend(decided.as_object().unwrap().clone());
    let got: serde_json::Map<String, Value> = events[1]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| wanted.get(k.as_str()).is_some())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(Value::Object(got), wanted, "{seen:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_agent_asks_an_eliciting_client_and_its_answer_decides() {
    let seen = approve("elicit").await;
    let asked = seen["elicitations"].as_array().unwrap();
    assert_eq!(asked.len(), 1, "{seen:#}");
    let message = asked[0]["message"].as_str().unwrap();
    for part in [
        "mcp__sandbox__execute_code",
        "print('approved', 6 * 7)",
        "permission mode is `ask`",
    ] {
        assert!(message.contains(part), "{part} not in {message}");
    }
    let schema = &asked[0]["schema"];
    assert_eq!(
        schema["properties"]["decision"]["enum"],
        json!(["allow", "deny"])
    );
    assert_eq!(schema["properties"]["remember"]["type"], "boolean");
    assert_eq!(schema["required"], json!(["decision"]));
    decided(
        &seen,
        json!({"decision": "allow", "by": "user", "message": "go ahead"}),
    );
    ran(&seen);
    let progress: Vec<&str> = seen["progress"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        progress
            .iter()
            .any(|l| l.contains("waits for approval") && l.ends_with("you are asked")),
        "{progress:#?}"
    );
    assert!(
        progress
            .iter()
            .any(|l| l.ends_with("allowed by user: go ahead")),
        "{progress:#?}"
    );
    assert!(
        !progress.iter().any(|l| l.contains("POST ")),
        "{progress:#?}"
    );
    // Decided already: a decision over HTTP finds nothing pending.
    let late = &seen["http"];
    assert_eq!(late.as_array().unwrap().len(), 1, "{late}");
    assert_eq!(late[0]["status"], 409, "{late}");
    assert_eq!(late[0]["body"]["error"]["code"], "not_pending", "{late}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_agent_tells_a_client_without_elicitation_how_to_decide_over_http() {
    let seen = approve("http").await;
    assert_eq!(seen["elicitations"], json!([]));
    let events = seen["approval_events"].as_array().unwrap();
    let (session, call) = (
        seen["result"]["structured"]["session_id"].as_str().unwrap(),
        events[0]["call_id"].as_str().unwrap(),
    );
    let told = format!(
        "waits for approval (the session's permission mode is `ask`: every call waits for a \
         decision): POST /agent/session/{session}/approvals/{call} with {{\"decision\":\"allow\"}} \
         or {{\"decision\":\"deny\"}} (the session's API key) before "
    );
    let progress = seen["progress"].as_array().unwrap();
    assert!(
        progress
            .iter()
            .filter_map(Value::as_str)
            .any(|l| l.contains(&told) && l.ends_with(", or it is denied")),
        "{told} not in {progress:#?}"
    );
    assert_eq!(
        seen["http"],
        json!([{"status": 200, "body": {"session_id": session, "call_id": call, "decision": "allow"}}])
    );
    decided(&seen, json!({"decision": "allow", "by": "user"}));
    ran(&seen);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elicitation_answered_after_an_http_decision_is_ignored() {
    let seen = approve("race").await;
    assert_eq!(seen["elicitations"].as_array().unwrap().len(), 1);
    assert_eq!(seen["http"][0]["status"], 200, "{seen:#}");
    decided(
        &seen,
        json!({"decision": "allow", "by": "user", "message": "allowed over HTTP"}),
    );
    ran(&seen);
}
