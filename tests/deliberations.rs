//! Deliberations against the demo model and real `conclave sim`
//! replicas: submit and poll, the agents' subjects on the bus, agents that
//! fail or time out, critique rounds, a judge and a vote, the budget, a
//! session of the kind over the WebSocket, interrupts, owners, bad input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::sim::{Sim, pools};
use common::{Lines, TestServer, types, ws_until};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

async fn next(lines: &mut Lines) -> Value {
    tokio::time::timeout(Duration::from_secs(60), lines.next())
        .await
        .expect("a line within 60 s")
        .expect("the stream goes on")
}

/// A subscription to `agent.response.*` and `deliberation.completed`, open
/// before anything is submitted.
async fn watch(server: &TestServer) -> Lines {
    let response = server
        .get("/bus/subscribe?subjects=agent.response.*,deliberation.completed")
        .await;
    assert_eq!(response.status(), 200);
    Lines::new(response)
}

/// Reads the bus until `deliberation.completed` of `task_id`; returns
/// the agents' messages before it and the completion.
async fn until_done(lines: &mut Lines, task_id: &str) -> (Vec<Value>, Value) {
    let mut agents = Vec::new();
    loop {
        let line = next(lines).await;
        let data = &line["data"];
        if data["task_id"] != task_id {
            continue;
        }
        if line["subject"] == "deliberation.completed" {
            return (agents, data.clone());
        }
        agents.push(line);
    }
}

async fn submit(server: &TestServer, body: Value) -> String {
    let response = server.post("/deliberations", body).await;
    assert_eq!(response.status(), 202, "{:?}", response.text().await);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], "SUBMITTED");
    body["task_id"].as_str().unwrap().to_string()
}

async fn result(server: &TestServer, task_id: &str) -> Value {
    let response = server.get(&format!("/deliberations/{task_id}")).await;
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

#[tokio::test]
async fn every_agent_answers_on_the_bus_and_the_result_is_polled() {
    let server = TestServer::start().await;
    let mut bus = watch(&server).await;
    let task_id = submit(
        &server,
        json!({"task_description": "Write factorial in Python", "role": "DEV",
               "constraints": {"rubric": "correct", "requirements": ["iterative"]}}),
    )
    .await;
    // Polling at once finds it, pending or done.
    let early = result(&server, &task_id).await;
    assert!(["PENDING", "COMPLETED"].contains(&early["status"].as_str().unwrap()));
    assert_eq!(early["total_agents"], 3);
    let (agents, done) = until_done(&mut bus, &task_id).await;
    assert_eq!(agents.len(), 3);
    let mut ids: Vec<&str> = agents
        .iter()
        .map(|m| m["data"]["agent_id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["agent-dev-001", "agent-dev-002", "agent-dev-003"]);
    for message in &agents {
        assert_eq!(message["subject"], "agent.response.completed");
        let data = &message["data"];
        assert_eq!(data["status"], "completed");
        assert_eq!(data["role"], "DEV");
        assert_eq!(data["num_agents"], 3);
        assert_eq!(data["proposal"]["author_id"], data["agent_id"]);
        assert_eq!(data["proposal"]["author_role"], "DEV");
        assert!(
            data["proposal"]["content"]
                .as_str()
                .unwrap()
                .contains("Write factorial in Python")
        );
    }
    assert_eq!(done["status"], "COMPLETED");
    assert_eq!(done["successful_responses"], 3);
    let polled = result(&server, &task_id).await;
    assert_eq!(polled["status"], "COMPLETED");
    assert_eq!(polled["successful_responses"], 3);
    assert_eq!(polled["results"].as_array().unwrap().len(), 3);
    assert_eq!(polled["results"][0]["agent_id"], "agent-dev-001");
    assert_eq!(polled["results"][0]["status"], "completed");
    assert!(polled["duration_ms"].as_u64().is_some());
    assert!(polled["decision"].is_null());
    // The system prompt carried the role and the constraints: the demo
    // model only echoes the task, so look at the session's events instead.
    let session = polled["session_id"].as_str().unwrap();
    // Followed: the session's `result` comes after the bus's completion.
    let events = Lines::new(
        server
            .get(&format!(
                "/agent/session/{session}/events?since=0&follow=true"
            ))
            .await,
    )
    .until("result")
    .await;
    let kinds = types(&events);
    assert_eq!(kinds[0], "deliberation_started");
    assert_eq!(kinds.iter().filter(|k| **k == "agent_started").count(), 3);
    assert_eq!(kinds.iter().filter(|k| **k == "agent_completed").count(), 3);
    assert!(kinds.contains(&"deliberation_completed"));
    assert_eq!(*kinds.last().unwrap(), "result");
    // The listing has it, without the proposals.
    let listed: Value = server.get("/deliberations").await.json().await.unwrap();
    let entry = &listed["deliberations"][0];
    assert_eq!(entry["task_id"], task_id.as_str());
    assert_eq!(entry["results"], json!([]));
    server.stop().await;
}

#[tokio::test]
async fn agents_that_fail_or_time_out_are_counted_and_all_failing_is_failed() {
    let ok = Sim::start("ok", &[]).await;
    let bad = Sim::start("bad", &[]).await;
    bad.configure(json!({"failure_rate": 1.0, "failure_status": 500}))
        .await;
    let slow = Sim::start("slow", &[]).await;
    slow.configure(json!({"ttft_ms": 30000})).await;
    let server =
        TestServer::start_with(|c| pools(c, &[("ok", &ok), ("bad", &bad), ("slow", &slow)])).await;
    let mut bus = watch(&server).await;
    let task_id = submit(
        &server,
        json!({"task_description": "t", "num_agents": 3, "models": ["ok", "bad", "slow"],
               "agent_timeout_s": 1}),
    )
    .await;
    let (agents, done) = until_done(&mut bus, &task_id).await;
    assert_eq!(done["status"], "COMPLETED");
    assert_eq!(done["successful_responses"], 1);
    let failed: Vec<&Value> = agents
        .iter()
        .filter(|m| m["subject"] == "agent.response.failed")
        .collect();
    assert_eq!(failed.len(), 2);
    let polled = result(&server, &task_id).await;
    let results = polled["results"].as_array().unwrap();
    assert_eq!(results[0]["status"], "completed");
    assert_eq!(results[0]["model"], "ok");
    assert_eq!(results[1]["status"], "failed");
    assert!(
        results[1]["error"].as_str().unwrap().contains("500"),
        "{}",
        results[1]
    );
    assert_eq!(results[2]["error"], "timeout");
    assert!(results[2]["proposal"].is_null());

    // The deadline passes with an agent still running: it is recorded as
    // failed with `timeout`, and the deliberation says why it ended.
    let task_id = submit(
        &server,
        json!({"task_description": "t", "num_agents": 2, "models": ["ok", "slow"], "timeout_s": 1}),
    )
    .await;
    let (agents, done) = until_done(&mut bus, &task_id).await;
    assert_eq!(done["reason"], "timeout");
    assert_eq!(done["successful_responses"], 1);
    assert!(agents.iter().any(|m| m["data"]["error"] == "timeout"));

    // Nobody succeeds: FAILED.
    let task_id = submit(
        &server,
        json!({"task_description": "t", "num_agents": 2, "models": ["bad"]}),
    )
    .await;
    let (_, done) = until_done(&mut bus, &task_id).await;
    assert_eq!(done["status"], "FAILED");
    assert_eq!(result(&server, &task_id).await["status"], "FAILED");
    server.stop().await;
}

#[tokio::test]
async fn critique_rounds_revise_and_a_judge_decides() {
    let judge = Sim::start("judge", &[]).await;
    judge
        .configure(json!({"reply": "{\"choice\": 2, \"reasoning\": \"it handles n = 0\"}"}))
        .await;
    let server = TestServer::start_with(|c| pools(c, &[("judge", &judge)])).await;
    let mut bus = watch(&server).await;
    let task_id = submit(
        &server,
        json!({"task_description": "Write factorial", "role": "dev", "rounds": 1,
               "aggregate": "judge", "judge_model": "judge"}),
    )
    .await;
    let (agents, done) = until_done(&mut bus, &task_id).await;
    assert_eq!(done["status"], "COMPLETED");
    // Three first proposals, three revisions.
    assert_eq!(agents.len(), 6);
    assert_eq!(agents.iter().filter(|m| m["data"]["round"] == 1).count(), 3);
    let revision = agents.iter().find(|m| m["data"]["round"] == 1).unwrap();
    let content = revision["data"]["proposal"]["content"].as_str().unwrap();
    // The demo model echoes what it was asked: the others' proposals,
    // anonymised, were in front of it.
    assert!(
        content.contains("Proposal A:") && content.contains("Proposal B:"),
        "{content}"
    );
    assert!(!content.contains("agent-dev-"), "{content}");
    assert_eq!(done["decision"]["method"], "judge");
    assert_eq!(done["decision"]["choice"], "agent-dev-002");
    assert_eq!(done["decision"]["reasoning"], "it handles n = 0");
    let polled = result(&server, &task_id).await;
    assert_eq!(polled["decision"], done["decision"]);
    assert_eq!(
        polled["decision"]["content"],
        polled["results"][1]["proposal"]["content"]
    );
    server.stop().await;
}

#[tokio::test]
async fn the_agents_vote_and_a_tie_goes_to_the_earliest() {
    let voter = Sim::start("voter", &[]).await;
    voter.configure(json!({"reply": "{\"choice\": 1}"})).await;
    let server = TestServer::start_with(|c| pools(c, &[("voter", &voter)])).await;
    let mut bus = watch(&server).await;
    // Each voter sees the others' proposals in agent order and picks the
    // first: agent 1 gets the votes of 2 and 3, agent 2 the vote of 1.
    let task_id = submit(
        &server,
        json!({"task_description": "t", "num_agents": 3, "models": ["voter"], "aggregate": "vote"}),
    )
    .await;
    let (_, done) = until_done(&mut bus, &task_id).await;
    let decision = &done["decision"];
    assert_eq!(decision["method"], "vote");
    assert_eq!(decision["choice"], "agent-general-001");
    assert_eq!(decision["votes"]["tally"]["agent-general-001"], 2);
    assert_eq!(decision["votes"]["tally"]["agent-general-002"], 1);
    assert_eq!(
        decision["votes"]["ballots"]["agent-general-001"],
        "agent-general-002"
    );
    assert!(!decision["reasoning"].as_str().unwrap().contains("tie"));
    // The agents' calls, as the gateway traced them: their temperatures
    // (the first agent at 0.7, the others at 0.9) and a system prompt with
    // the agent's id and role.
    let traces: Value = server
        .get(&format!("/gateway/traces?session_id={task_id}&limit=100"))
        .await
        .json()
        .await
        .unwrap();
    let mut proposals: Vec<(String, f64)> = traces["traces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["request"])
        .filter(|r| r["messages"][1]["content"] == "Task:\nt")
        .map(|r| {
            let system = r["messages"][0]["content"].as_str().unwrap();
            let id = system
                .split_whitespace()
                .nth(2)
                .unwrap()
                .trim_end_matches(',');
            let temperature = (r["temperature"].as_f64().unwrap() * 10.0).round() / 10.0;
            (id.to_string(), temperature)
        })
        .collect();
    proposals.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        proposals,
        [
            ("agent-general-001".to_string(), 0.7),
            ("agent-general-002".to_string(), 0.9),
            ("agent-general-003".to_string(), 0.9)
        ],
        "{traces}"
    );
    // Two agents vote for each other: a tie, broken by agent order, and
    // the reasoning says so.
    let task_id = submit(
        &server,
        json!({"task_description": "t", "num_agents": 2, "models": ["voter"], "aggregate": "vote"}),
    )
    .await;
    let (_, done) = until_done(&mut bus, &task_id).await;
    assert_eq!(done["decision"]["choice"], "agent-general-001");
    let reasoning = done["decision"]["reasoning"].as_str().unwrap();
    assert!(
        reasoning.contains("tie went to the earliest agent"),
        "{reasoning}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_spent_budget_ends_the_deliberation() {
    let sim = Sim::start("s", &[]).await;
    let server = TestServer::start_with(|c| pools(c, &[("s", &sim)])).await;
    let mut bus = watch(&server).await;
    // Every call reports more tokens than the whole budget: the first
    // round spends it, and the critique rounds never start.
    let task_id = submit(
        &server,
        json!({"task_description": "a task of several words", "num_agents": 2,
               "models": ["s"], "rounds": 2, "max_budget_tokens": 10}),
    )
    .await;
    let (agents, done) = until_done(&mut bus, &task_id).await;
    assert_eq!(done["reason"], "budget_exceeded");
    assert!(agents.iter().all(|m| m["data"]["round"] == 0), "{agents:?}");
    let polled = result(&server, &task_id).await;
    // The session's `result` follows `deliberation.completed` on the bus:
    // followed, its log gets there.
    let events = Lines::new(
        server
            .get(&format!(
                "/agent/session/{}/events?since=0&follow=true",
                polled["session_id"].as_str().unwrap()
            ))
            .await,
    )
    .until("result")
    .await;
    let last = events.last().unwrap();
    assert_eq!(last["type"], "result");
    assert_eq!(last["status"], "budget_exceeded");
    assert!(last["usage"]["input_tokens"].as_u64().unwrap() >= 10);
    server.stop().await;
}

#[tokio::test]
async fn a_deliberation_session_streams_over_the_websocket_and_stops_on_interrupt() {
    let slow = Sim::start("slow", &[]).await;
    slow.configure(json!({"ttft_ms": 30000})).await;
    let server = TestServer::start_with(|c| pools(c, &[("slow", &slow)])).await;
    let session = server
        .create_session(json!({"kind": "deliberation", "options": {"num_agents": 2, "role": "qa", "rounds": 1}}))
        .await;
    let (mut ws, _) =
        tokio_tungstenite::connect_async(server.ws_url(&format!("/agent/ws?session_id={session}")))
            .await
            .unwrap();
    ws.send(Message::Text(
        json!({"type": "message", "prompt": "Review this"})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    let events = ws_until(&mut ws, "result").await;
    let kinds = types(&events);
    // Every agent of a round starts before the collector takes an answer.
    let without_status: Vec<&str> = kinds.iter().copied().filter(|k| *k != "status").collect();
    assert_eq!(
        without_status,
        [
            "deliberation_started",
            "round_started",
            "agent_started",
            "agent_started",
            "agent_completed",
            "agent_completed",
            "round_started",
            "agent_started",
            "agent_started",
            "agent_completed",
            "agent_completed",
            "deliberation_completed",
            "result"
        ]
    );
    let completed = events
        .iter()
        .find(|e| e["type"] == "agent_completed")
        .unwrap();
    assert!(
        completed["agent_id"]
            .as_str()
            .unwrap()
            .starts_with("agent-qa-00")
    );
    assert_eq!(completed["proposal"]["author_role"], "qa");
    assert_eq!(events.last().unwrap()["status"], "success");

    // A slow deliberation, interrupted: every agent stops.
    let slow_session = server
        .create_session(json!({"kind": "deliberation", "num_agents": 3, "models": ["slow"]}))
        .await;
    let mut lines = Lines::new(
        server
            .message(&slow_session, json!({"prompt": "take your time"}))
            .await,
    );
    let started = lines.until("agent_started").await;
    assert!(!started.is_empty());
    let response = server
        .post(
            &format!("/agent/session/{slow_session}/interrupt"),
            json!({}),
        )
        .await;
    assert!(response.status().is_success());
    let rest = lines.until("result").await;
    let done = rest
        .iter()
        .find(|e| e["type"] == "deliberation_completed")
        .unwrap();
    assert_eq!(done["reason"], "interrupted");
    assert_eq!(done["status"], "FAILED");
    assert_eq!(rest.last().unwrap()["status"], "interrupted");
    assert_eq!(
        rest.iter()
            .filter(|e| e["type"] == "agent_failed" && e["error"] == "interrupted")
            .count(),
        3
    );
    // Replay by seq gives the same events again.
    let replayed = common::ndjson(
        server
            .get(&format!("/agent/session/{session}/events?since=0"))
            .await,
    )
    .await;
    assert_eq!(types(&replayed), kinds);
    ws.close(None).await.ok();
    while ws.next().await.is_some() {}
    server.stop().await;
}

#[tokio::test]
async fn another_key_sees_nothing_and_forged_answers_are_ignored() {
    let server = TestServer::start_with(|c| {
        c.api_keys = vec!["key-aaaaaaaa".into(), "key-bbbbbbbb".into()];
    })
    .await;
    let a = |method, path: &str, body| server.send_as("key-aaaaaaaa", method, path, body);
    let response = a(
        reqwest::Method::POST,
        "/deliberations",
        Some(json!({"task_description": "mine", "num_agents": 2})),
    )
    .await;
    assert_eq!(response.status(), 202);
    let task_id = response.json::<Value>().await.unwrap()["task_id"]
        .as_str()
        .unwrap()
        .to_string();
    let b = server
        .send_as(
            "key-bbbbbbbb",
            reqwest::Method::GET,
            &format!("/deliberations/{task_id}"),
            None,
        )
        .await;
    assert_eq!(b.status(), 404);
    let listed: Value = server
        .send_as("key-bbbbbbbb", reqwest::Method::GET, "/deliberations", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["deliberations"], json!([]));
    let anonymous = server.get(&format!("/deliberations/{task_id}")).await;
    assert_eq!(anonymous.status(), 401);
    // Key A forges an answer for an agent the deliberation does not have,
    // and one for another task: neither counts.
    for forged in [
        json!({"task_id": task_id, "agent_id": "agent-general-009", "round": 0, "status": "completed",
               "proposal": {"content": "x", "author_id": "agent-general-009", "author_role": "agent"}}),
        json!({"task_id": uuid::Uuid::new_v4(), "agent_id": "agent-general-001", "round": 0,
               "status": "failed", "error": "forged"}),
    ] {
        let response = a(
            reqwest::Method::POST,
            "/bus/publish/agent.response.completed",
            Some(forged),
        )
        .await;
        assert_eq!(response.status(), 202);
    }
    let done = loop {
        let polled: Value = a(
            reqwest::Method::GET,
            &format!("/deliberations/{task_id}"),
            None,
        )
        .await
        .json()
        .await
        .unwrap();
        if polled["status"] != "PENDING" {
            break polled;
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(done["successful_responses"], 2);
    assert_eq!(done["results"].as_array().unwrap().len(), 2);
    server.stop().await;
}

#[tokio::test]
async fn bad_input_is_refused_with_the_field_named() {
    let server = TestServer::start().await;
    for (body, field) in [
        (json!({"role": "dev"}), "task_description"),
        (json!({"task_description": ""}), "task_description"),
        (
            json!({"task_description": "t", "num_agents": 0}),
            "num_agents",
        ),
        (
            json!({"task_description": "t", "models": ["nope"]}),
            "models[0]",
        ),
        (
            json!({"task_description": "t", "judge_model": "nope"}),
            "judge_model",
        ),
        (
            json!({"task_description": "t", "aggregate": "coin"}),
            "aggregate",
        ),
        (
            json!({"task_description": "t", "what": 1}),
            "what: unknown field",
        ),
        (
            json!({"task_description": "t", "num_agent": 2}),
            "num_agent: unknown field; did you mean num_agents?",
        ),
    ] {
        let response = server.post("/deliberations", body.clone()).await;
        assert_eq!(response.status(), 422, "{body}");
        let error: Value = response.json().await.unwrap();
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{body}: {message}");
    }
    let missing = server
        .get(&format!("/deliberations/{}", uuid::Uuid::new_v4()))
        .await;
    assert_eq!(missing.status(), 404);
    assert_eq!(server.get("/deliberations/not-a-uuid").await.status(), 404);
    let listed: Value = server.get("/deliberations").await.json().await.unwrap();
    assert_eq!(listed["deliberations"], json!([]), "nothing was created");
    server.stop().await;
}

/// A Python client on grpcio from PyPI: `Deliberate`, the bus
/// subscription and `GetDeliberationResult` on the same listener.
#[tokio::test]
async fn a_grpcio_client_deliberates_and_reads_the_bus() {
    let server = TestServer::start_with(|c| {
        c.api_keys = vec!["grpc-key-1".into(), "someone-elses-key".into()];
    })
    .await;
    let address = server.addr.to_string();
    let summary = common::python_json(
        "tests/deliberation/grpc_client.py",
        &[&address, "grpc-key-1"],
        "grpcio and grpcio-tools",
    )
    .await;
    assert_eq!(summary["status"], "COMPLETED");
    assert_eq!(summary["successful_responses"], 3);
    assert_eq!(
        summary["agents"],
        json!(["agent-dev-001", "agent-dev-002", "agent-dev-003"])
    );
    assert_eq!(summary["authors"], summary["agents"]);
    assert_eq!(summary["decision_method"], "judge");
    let task_id = summary["task_id"].as_str().unwrap();
    let bus = summary["bus"].as_array().unwrap();
    let completed = bus
        .iter()
        .filter(|m| m["subject"] == "agent.response.completed" && m["task_id"] == task_id)
        .count();
    assert_eq!(completed, 3, "{bus:?}");
    assert_eq!(bus.last().unwrap()["subject"], "deliberation.completed");
    assert_eq!(summary["other_key"], "NOT_FOUND");
    assert_eq!(summary["invalid"], "INVALID_ARGUMENT");
    server.stop().await;
}

/// An IDE calls `deliberate` on `/mcp` with the official Python SDK: a
/// progress notification per agent, then the proposals and the vote.
#[tokio::test]
async fn an_ide_deliberates_over_mcp_with_progress() {
    let server = TestServer::start_sandboxed(|c| {
        c.api_keys = vec!["ide-key-123".into()];
        c.sandbox.warm_pool = 0;
    })
    .await;
    let url = server.url("/mcp");
    let seen = common::python_json(
        "tests/deliberation/mcp_client.py",
        &[&url, "ide-key-123"],
        "the mcp package",
    )
    .await;
    assert!(
        seen["tools"]
            .as_array()
            .unwrap()
            .contains(&json!("deliberate"))
    );
    assert_eq!(seen["is_error"], false, "{seen}");
    let result = &seen["result"];
    assert_eq!(result["status"], "COMPLETED");
    assert_eq!(result["successful_responses"], 3);
    assert_eq!(result["decision"]["method"], "vote");
    let progress = seen["progress"].as_array().unwrap();
    assert_eq!(progress.len(), 3, "{progress:?}");
    assert_eq!(progress[2]["progress"], 3.0);
    assert_eq!(progress[2]["total"], 3.0);
    assert!(
        progress[0]["message"]
            .as_str()
            .unwrap()
            .starts_with("agent-dev-00")
    );
    assert_eq!(seen["bad_is_error"], true);
    assert!(
        seen["bad_text"].as_str().unwrap().contains("num_agents"),
        "{seen}"
    );
    // The deliberation is the key's: its listing over HTTP has it.
    let listed: Value = server
        .send_as("ide-key-123", reqwest::Method::GET, "/deliberations", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["deliberations"][0]["task_id"], result["task_id"]);
    server.stop_and_remove_sandboxes().await;
}

/// `tools: true`: every agent is an agent session with its own docker
/// sandbox; the proposals are Python functions the agents ran there, their
/// tool events reach the deliberation tagged by agent, and the agents'
/// sessions and sandboxes are gone once it is over.
#[tokio::test]
async fn tool_using_agents_run_their_proposals_in_their_own_sandboxes() {
    let server = TestServer::start_sandboxed(|c| c.sandbox.warm_pool = 0).await;
    let mut bus = watch(&server).await;
    let task = "Write add(a, b) and test it:\n```python\nimport os\ndef add(a, b):\n    return a + b\n\
                print(add(2, 3), os.uname().nodename)\n```";
    let task_id = submit(
        &server,
        json!({"task_description": task, "num_agents": 2, "role": "dev", "tools": true}),
    )
    .await;
    let (_, done) = until_done(&mut bus, &task_id).await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let polled = result(&server, &task_id).await;
    let mut hosts = Vec::new();
    for agent in polled["results"].as_array().unwrap() {
        let content = agent["proposal"]["content"].as_str().unwrap();
        assert!(content.contains("execute_code returned"), "{content}");
        assert!(content.contains("5 "), "{content}");
        // The sandbox's hostname follows `5 `: each agent had its own.
        let host = content
            .split("5 ")
            .nth(1)
            .unwrap()
            .split(['\\', '"', '\n'])
            .next()
            .unwrap();
        hosts.push(host.to_string());
    }
    assert_ne!(hosts[0], hosts[1], "{hosts:?}");
    // The turn ends once the agents' sessions are deleted.
    let session = polled["session_id"].as_str().unwrap();
    let events = Lines::new(
        server
            .get(&format!(
                "/agent/session/{session}/events?since=0&follow=true"
            ))
            .await,
    )
    .until("result")
    .await;
    for agent in ["agent-dev-001", "agent-dev-002"] {
        let tagged: Vec<&str> = events
            .iter()
            .filter(|e| e["agent_id"] == agent)
            .filter_map(|e| e["type"].as_str())
            .collect();
        assert!(tagged.contains(&"tool_use"), "{agent}: {tagged:?}");
        assert!(tagged.contains(&"tool_result"), "{agent}: {tagged:?}");
        assert!(!tagged.contains(&"result"), "{agent}: {tagged:?}");
    }
    // The agents' sessions went with their sandboxes.
    let sessions: Value = server.get("/agent/sessions").await.json().await.unwrap();
    let agents = sessions["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["kind"] == "agent")
        .count();
    assert_eq!(agents, 0, "{sessions}");
    let left = common::docker_sandboxes_of(&server.data_dir).await;
    assert!(
        left.iter().all(|s| s.session.is_none() || s.pool.is_some()),
        "{left:?}"
    );
    server.stop_and_remove_sandboxes().await;
}
