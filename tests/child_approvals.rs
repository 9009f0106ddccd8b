//! Approvals (issue 37) of the agents that work for another session: a
//! pipeline's nodes and a deliberation's tool-using agents follow the
//! permissions of their run, their waiting calls show in the run's stream
//! (tagged with the agent) and in a pipeline's status, and the run's owner,
//! no one else, decides them through the run's session. Against a real
//! server with the demo model, whose `$ ` lines are `Bash` calls.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Lines, TestServer};
use reqwest::Method;
use serde_json::{Value, json};

const GATED: &str = "name: gated
start: run
terminal: [run]
state:
  code: {reducer: replace}
nodes:
  run:
    prompt: '{code}'
    tools: [Bash]
";

/// A session's events from the start, as they come.
async fn follow(server: &TestServer, key: Option<&str>, session: &str) -> Lines {
    let path = format!("/agent/session/{session}/events?since=0&follow=true");
    let response = match key {
        Some(key) => server.send_as(key, Method::GET, &path, None).await,
        None => server.get(&path).await,
    };
    assert_eq!(response.status(), 200);
    Lines::new(response)
}

/// Reads until `count` events of `kind`; returns those.
async fn next_of(lines: &mut Lines, kind: &str, count: usize) -> Vec<Value> {
    let mut found = Vec::new();
    while found.len() < count {
        let event = lines.next().await.expect("the stream goes on");
        if event["type"] == kind {
            found.push(event);
        }
    }
    found
}

async fn json_of(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// A `422` whose message names `field`.
async fn refused(response: reqwest::Response, field: &str) {
    let (status, body) = json_of(response).await;
    assert_eq!(status, 422, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(field), "{body}");
}

#[tokio::test]
async fn a_node_waiting_for_approval_shows_in_the_status_and_a_decision_lets_it_finish() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gated.yaml"), GATED).unwrap();
    let path = dir.path().to_path_buf();
    let server = TestServer::start_with(|c| c.pipelines.dir = Some(path)).await;

    // A policy that does not parse is refused before any run.
    refused(
        server
            .post(
                "/orchestrator/pipeline/start",
                json!({"pipeline": "gated", "permissions": {"deny": ["Bash("]}}),
            )
            .await,
        "permissions.deny[0]",
    )
    .await;

    let (status, started) = json_of(
        server
            .post(
                "/orchestrator/pipeline/start",
                json!({"pipeline": "gated", "input": {"code": "$ echo gated"},
                       "permissions": {"mode": "ask"}}),
            )
            .await,
    )
    .await;
    assert_eq!(status, 202, "{started}");
    let thread = started["thread_id"].as_str().unwrap().to_string();
    let session = started["session_id"].as_str().unwrap().to_string();
    let mut events = follow(&server, None, &session).await;
    let asked = next_of(&mut events, "approval_requested", 1)
        .await
        .remove(0);
    assert_eq!(asked["agent_id"], "run", "{asked}");
    assert_eq!(asked["tool"], "Bash", "{asked}");
    assert_eq!(asked["input"]["command"], "echo gated", "{asked}");
    let call = asked["call_id"].as_str().unwrap().to_string();

    // The run is running; its node waits, with the call.
    let (_, status) = json_of(
        server
            .get(&format!("/orchestrator/pipeline/status/{thread}"))
            .await,
    )
    .await;
    assert_eq!(status["status"], "running", "{status}");
    assert_eq!(status["node"], "run", "{status}");
    assert_eq!(status["node_status"], "waiting_approval", "{status}");
    let waiting = status["waiting"].as_array().unwrap();
    assert_eq!(waiting.len(), 1, "{status}");
    assert_eq!(waiting[0]["call_id"], call.as_str());
    assert_eq!(waiting[0]["node"], "run");
    assert_eq!(waiting[0]["tool"], "Bash");
    // The node's agent session has the call; the listing names the run.
    let worker = waiting[0]["session_id"].as_str().unwrap().to_string();
    assert_ne!(worker, session);
    let (_, listed) = json_of(server.get("/agent/approvals").await).await;
    let listed = &listed["approvals"].as_array().unwrap()[0];
    assert_eq!(listed["parent_id"], session.as_str(), "{listed}");
    assert_eq!(listed["agent_id"], "run", "{listed}");

    // Decided through the run's session: the node's call runs.
    let (code, taken) = json_of(
        server
            .post(
                &format!("/agent/session/{session}/approvals/{call}"),
                json!({"decision": "allow"}),
            )
            .await,
    )
    .await;
    assert_eq!(code, 200, "{taken}");
    assert_eq!(taken["session_id"], worker.as_str(), "{taken}");
    assert_eq!(taken["agent_id"], "run", "{taken}");
    let rest = events.until("result").await;
    let decided = rest
        .iter()
        .find(|e| e["type"] == "approval_decided")
        .unwrap();
    assert_eq!(decided["agent_id"], "run", "{decided}");
    assert_eq!(decided["decision"], "allow", "{decided}");
    assert_eq!(decided["by"], "user", "{decided}");
    let ran = rest.iter().find(|e| e["type"] == "tool_result").unwrap();
    assert_eq!(ran["output"], "ran: echo gated", "{ran}");
    assert_eq!(rest.last().unwrap()["status"], "success", "{rest:?}");
    let (_, status) = json_of(
        server
            .get(&format!("/orchestrator/pipeline/status/{thread}"))
            .await,
    )
    .await;
    assert_eq!(status["status"], "completed", "{status}");
    assert_eq!(status["node_status"], Value::Null, "{status}");
    assert_eq!(status["waiting"], json!([]), "{status}");
    // A second decision finds nothing waiting.
    let again = server
        .post(
            &format!("/agent/session/{session}/approvals/{call}"),
            json!({"decision": "deny"}),
        )
        .await;
    assert_eq!(again.status(), 409);
    server.stop().await;
}

#[tokio::test]
async fn deliberation_agents_ask_under_its_policy_and_only_its_owner_decides() {
    let server = TestServer::start_with(|c| {
        c.api_keys = vec!["key-aaaaaaaa".into(), "key-bbbbbbbb".into()];
    })
    .await;
    let a = |method, path: &str, body| server.send_as("key-aaaaaaaa", method, path, body);
    let b = |method, path: &str, body| server.send_as("key-bbbbbbbb", method, path, body);
    refused(
        a(
            Method::POST,
            "/deliberations",
            Some(json!({"task_description": "x", "permissions": {"mode": "sometimes"}})),
        )
        .await,
        "permissions",
    )
    .await;

    let (status, submitted) = json_of(
        a(
            Method::POST,
            "/deliberations",
            Some(
                json!({"task_description": "Look around:\n$ echo hi", "num_agents": 2,
                        "role": "dev", "tools": true, "permissions": {"mode": "ask"}}),
            ),
        )
        .await,
    )
    .await;
    assert_eq!(status, 202, "{submitted}");
    let task = submitted["task_id"].as_str().unwrap().to_string();
    let mut events = follow(&server, Some("key-aaaaaaaa"), &task).await;
    let asked = next_of(&mut events, "approval_requested", 2).await;
    let mut agents: Vec<&str> = asked
        .iter()
        .map(|e| e["agent_id"].as_str().unwrap())
        .collect();
    agents.sort();
    assert_eq!(agents, ["agent-dev-001", "agent-dev-002"], "{asked:?}");
    // The demo model numbers its calls alike in each agent's session.
    let call = asked[0]["call_id"].as_str().unwrap().to_string();
    assert_eq!(asked[1]["call_id"], call.as_str());
    let decide = |agent: Option<&str>, decision: &str| {
        let mut body = json!({"decision": decision});
        if let Some(agent) = agent {
            body["agent_id"] = json!(agent);
        }
        (format!("/agent/session/{task}/approvals/{call}"), body)
    };

    // Another key finds neither the deliberation nor its agents' calls.
    let (path, body) = decide(Some("agent-dev-001"), "allow");
    assert_eq!(b(Method::POST, &path, Some(body)).await.status(), 404);
    let (_, theirs) = json_of(b(Method::GET, "/agent/approvals", None).await).await;
    assert_eq!(theirs["approvals"], json!([]));
    // Two agents wait on a call of that id: the decision names one.
    let (path, body) = decide(None, "allow");
    refused(a(Method::POST, &path, Some(body)).await, "agent_id").await;
    for (agent, decision) in [("agent-dev-001", "allow"), ("agent-dev-002", "deny")] {
        let (path, body) = decide(Some(agent), decision);
        let (status, taken) = json_of(a(Method::POST, &path, Some(body)).await).await;
        assert_eq!(status, 200, "{taken}");
        assert_eq!(taken["agent_id"], agent, "{taken}");
        assert_ne!(taken["session_id"], task.as_str(), "{taken}");
    }
    let rest = events.until("result").await;
    for (agent, decision) in [("agent-dev-001", "allow"), ("agent-dev-002", "deny")] {
        let decided = rest
            .iter()
            .find(|e| e["type"] == "approval_decided" && e["agent_id"] == agent)
            .unwrap();
        assert_eq!(decided["decision"], decision, "{decided}");
    }
    let (_, done) = json_of(a(Method::GET, &format!("/deliberations/{task}"), None).await).await;
    let proposal = |agent: &str| -> String {
        done["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["agent_id"] == agent)
            .map(|r| r["proposal"]["content"].to_string())
            .unwrap()
    };
    assert!(proposal("agent-dev-001").contains("ran: echo hi"), "{done}");
    assert!(
        proposal("agent-dev-002").contains("not run: the call was denied by the user"),
        "{done}"
    );
    server.stop().await;
}

#[tokio::test]
async fn deliberation_agents_in_plan_mode_run_no_call_that_changes_state() {
    let server = TestServer::start().await;
    let (status, submitted) = json_of(
        server
            .post(
                "/deliberations",
                json!({"task_description": "Change it:\n$ rm -rf build", "num_agents": 2,
                       "role": "dev", "tools": true, "permissions": {"mode": "plan"}}),
            )
            .await,
    )
    .await;
    assert_eq!(status, 202, "{submitted}");
    let task = submitted["task_id"].as_str().unwrap().to_string();
    let events = follow(&server, None, &task).await.until("result").await;
    for agent in ["agent-dev-001", "agent-dev-002"] {
        let results: Vec<&Value> = events
            .iter()
            .filter(|e| e["type"] == "tool_result" && e["agent_id"] == agent)
            .collect();
        assert_eq!(results.len(), 1, "{agent}: {events:?}");
        assert_eq!(results[0]["is_error"], true);
        let output = results[0]["output"].to_string();
        assert!(
            output.contains("not run: the session's permission mode is `plan`"),
            "{output}"
        );
        assert!(!output.contains("ran: rm"), "{output}");
    }
    assert!(
        !events.iter().any(|e| e["type"] == "approval_requested"),
        "{events:?}"
    );
    server.stop().await;
}
