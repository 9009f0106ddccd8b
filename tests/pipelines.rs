//! Pipelines in test mode against a real server: the built-in
//! connector's routing on every branch, every retry limit, the coverage rule, node
//! errors retried, cancel and resume, the concurrency cap, the timeout,
//! the session kind, owners and bad input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::sim::{Sim, pools};
use common::{Lines, TestServer, types};
use serde_json::{Value, json};

async fn test_mode(configure: impl FnOnce(&mut conclave::config::Config)) -> TestServer {
    TestServer::start_with(|c| {
        c.pipelines.test_mode = true;
        configure(c);
    })
    .await
}

async fn start(server: &TestServer, body: Value) -> (String, String) {
    let response = server.post("/orchestrator/pipeline/start", body).await;
    assert_eq!(response.status(), 202, "{:?}", response.text().await);
    let started: Value = response.json().await.unwrap();
    (
        started["thread_id"].as_str().unwrap().to_string(),
        started["session_id"].as_str().unwrap().to_string(),
    )
}

/// The run's events from the start until its turn's `result`.
async fn until_result(server: &TestServer, session: &str) -> Vec<Value> {
    Lines::new(
        server
            .get(&format!(
                "/agent/session/{session}/events?since=0&follow=true"
            ))
            .await,
    )
    .until("result")
    .await
}

async fn get(server: &TestServer, path: &str) -> Value {
    let response = server.get(path).await;
    assert_eq!(response.status(), 200, "{path}");
    response.json().await.unwrap()
}

/// The message of `validate`'s `422` for a definition it refuses.
async fn invalid(server: &TestServer, yaml: &str) -> String {
    let refused = server
        .post("/orchestrator/pipelines/validate", json!({"yaml": yaml}))
        .await;
    assert_eq!(refused.status(), 422);
    let error: Value = refused.json().await.unwrap();
    error["error"]["message"].as_str().unwrap().to_owned()
}

/// A run's status.
async fn status_of(server: &TestServer, thread: &str) -> Value {
    get(server, &format!("/orchestrator/pipeline/status/{thread}")).await
}

/// Starts a run, waits for its turn's `result` and answers its status.
async fn finished(server: &TestServer, body: Value) -> Value {
    let (thread, session) = start(server, body).await;
    until_result(server, &session).await;
    status_of(server, &thread).await
}

/// The nodes of a run's history, in order.
async fn nodes(server: &TestServer, thread: &str) -> Vec<String> {
    get(server, &format!("/orchestrator/pipeline/history/{thread}")).await["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["node"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn the_connector_runs_through_every_node_with_a_checkpoint_each() {
    let server = test_mode(|_| {}).await;
    let (thread, session) = start(
        &server,
        json!({"connector_name": "Google Sheets", "input": {"original_request": "rows"}}),
    )
    .await;
    assert!(thread.starts_with("pipeline-google-sheets-"), "{thread}");
    assert_eq!(thread.len(), "pipeline-google-sheets-".len() + 8);
    let events = until_result(&server, &session).await;
    let kinds = types(&events);
    assert_eq!(kinds.iter().filter(|k| **k == "node_started").count(), 6);
    assert_eq!(kinds.iter().filter(|k| **k == "checkpoint").count(), 6);
    assert_eq!(kinds.iter().filter(|k| **k == "route").count(), 5);
    let done = events
        .iter()
        .find(|e| e["type"] == "pipeline_completed")
        .unwrap();
    assert_eq!(done["status"], "completed");
    assert_eq!(done["thread_id"], thread.as_str());
    assert_eq!(events.last().unwrap()["status"], "success");
    assert_eq!(
        nodes(&server, &thread).await,
        [
            "research",
            "generator",
            "tester",
            "test_reviewer",
            "reviewer",
            "publisher"
        ]
    );
    let status = status_of(&server, &thread).await;
    assert_eq!(status["status"], "completed");
    assert_eq!(status["steps"], 6);
    assert_eq!(status["state"]["connector_name"], "Google Sheets");
    assert_eq!(status["state"]["original_request"], "rows");
    assert_eq!(status["state"]["connector_type"], "source");
    assert_eq!(status["state"]["degraded"], false);
    assert_eq!(status["state"]["logs"].as_array().unwrap().len(), 6);
    let health = get(&server, "/orchestrator/health").await;
    assert_eq!(health["test_mode"], true);
    assert_eq!(health["pipelines"], json!(["connector"]));
    let listed = get(&server, "/orchestrator/pipelines").await;
    assert_eq!(listed["pipelines"][0]["start"], "research");
    // A run that is over neither resumes nor cancels.
    let again = server
        .post(
            &format!("/orchestrator/pipeline/resume/{thread}"),
            json!({}),
        )
        .await;
    assert_eq!(again.status(), 409);
    let cancel = server
        .post(
            &format!("/orchestrator/pipeline/cancel/{thread}"),
            json!({}),
        )
        .await;
    assert_eq!(cancel.status(), 409);
    server.stop().await;
}

#[tokio::test]
async fn every_branch_routes_and_counts_as_the_seed() {
    let server = test_mode(|_| {}).await;
    let script = json!({"decisions": {
        "test_reviewer": ["INVALID", "VALID_FAIL", "VALID_PASS", "VALID_PASS"],
        "reviewer": ["REJECT_CODE", "REJECT_CONTEXT", "APPROVE"]}});
    let (thread, session) = start(&server, json!({"connector_name": "x", "mock": script})).await;
    let events = until_result(&server, &session).await;
    let routes: Vec<(String, String)> = events
        .iter()
        .filter(|e| e["type"] == "route")
        .map(|e| {
            (
                e["from"].as_str().unwrap().into(),
                e["to"].as_str().unwrap().into(),
            )
        })
        .collect();
    let expected = [
        ("research", "generator"),
        ("generator", "tester"),
        ("tester", "test_reviewer"),
        ("test_reviewer", "tester"), // INVALID
        ("tester", "test_reviewer"),
        ("test_reviewer", "generator"), // VALID_FAIL
        ("generator", "tester"),
        ("tester", "test_reviewer"),
        ("test_reviewer", "reviewer"), // VALID_PASS
        ("reviewer", "generator"),     // REJECT_CODE
        ("generator", "tester"),
        ("tester", "test_reviewer"),
        ("test_reviewer", "reviewer"),
        ("reviewer", "research"), // REJECT_CONTEXT
        ("research", "generator"),
        ("generator", "tester"),
        ("tester", "test_reviewer"),
        ("test_reviewer", "reviewer"),
        ("reviewer", "publisher"), // APPROVE
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(routes, expected);
    let status = status_of(&server, &thread).await;
    assert_eq!(status["status"], "completed");
    assert_eq!(
        status["counters"],
        json!({"test_retries": 1, "gen_fix_retries": 1, "review_retries": 1, "research_retries": 1})
    );
    server.stop().await;
}

#[tokio::test]
async fn each_limit_ends_the_run_failed_with_its_reason() {
    let server = test_mode(|c| {
        c.pipelines.limits.insert("max_review_retries".into(), 1);
    })
    .await;
    for (script, reason) in [
        (
            json!({"test_reviewer": ["INVALID", "INVALID", "INVALID", "INVALID"]}),
            "test_retries reached its limit of 3",
        ),
        (
            json!({"test_reviewer": ["VALID_FAIL", "VALID_FAIL", "VALID_FAIL", "VALID_FAIL"]}),
            "gen_fix_retries reached its limit of 3",
        ),
        // Configured down to 1 (pipelines.limits.max_review_retries).
        (
            json!({"reviewer": ["REJECT_CODE", "REJECT_CODE"]}),
            "review_retries reached its limit of 1",
        ),
        // `<=`: one return to research is allowed and a second, not a third.
        (
            json!({"reviewer": ["REJECT_CONTEXT", "REJECT_CONTEXT", "REJECT_CONTEXT"]}),
            "research_retries reached its limit of 1",
        ),
    ] {
        let (thread, session) = start(
            &server,
            json!({"connector_name": "crm", "mock": {"decisions": script}}),
        )
        .await;
        let events = until_result(&server, &session).await;
        assert_eq!(events.last().unwrap()["status"], "error");
        let status = status_of(&server, &thread).await;
        assert_eq!(status["status"], "failed", "{status}");
        let why = status["reason"].as_str().unwrap();
        assert!(why.starts_with(reason), "{why}");
    }
    // Approved at 90 %: published as degraded; at 50 %: not published.
    let status = finished(
        &server,
        json!({"connector_name": "crm", "mock": {"coverage": 0.9}}),
    )
    .await;
    assert_eq!(status["status"], "completed");
    assert_eq!(status["state"]["degraded"], true);
    let status = finished(
        &server,
        json!({"connector_name": "crm", "mock": {"coverage": 0.5}}),
    )
    .await;
    assert_eq!(status["status"], "failed");
    assert!(
        status["reason"]
            .as_str()
            .unwrap()
            .contains("coverage_ratio")
    );
    server.stop().await;
}

#[tokio::test]
async fn a_node_error_is_retried_within_its_limit_and_noted_in_errors() {
    let server = test_mode(|_| {}).await;
    let (thread, session) = start(
        &server,
        json!({"connector_name": "crm", "mock": {"fail": {"tester": 2}}}),
    )
    .await;
    let events = until_result(&server, &session).await;
    assert_eq!(
        types(&events)
            .iter()
            .filter(|k| **k == "node_failed")
            .count(),
        2
    );
    let status = status_of(&server, &thread).await;
    assert_eq!(status["status"], "completed");
    assert_eq!(status["state"]["errors"].as_array().unwrap().len(), 2);
    // Past pipelines.node_retries (2): the run fails, resumable at the node.
    let status = finished(
        &server,
        json!({"connector_name": "crm", "mock": {"fail": {"tester": 9}}}),
    )
    .await;
    assert_eq!(status["status"], "failed");
    assert!(
        status["reason"]
            .as_str()
            .unwrap()
            .contains("tester failed 3 times")
    );
    server.stop().await;
}

#[tokio::test]
async fn cancel_stops_the_node_and_resume_never_reruns_a_completed_one() {
    let server = test_mode(|_| {}).await;
    let (thread, session) = start(
        &server,
        json!({"connector_name": "crm", "mock": {"delay_ms": 1000}}),
    )
    .await;
    let mut events = Lines::new(
        server
            .get(&format!(
                "/agent/session/{session}/events?since=0&follow=true"
            ))
            .await,
    );
    // The second node has started: the first is checkpointed.
    let mut started = 0;
    while started < 2 {
        if events.next().await.unwrap()["type"] == "node_started" {
            started += 1;
        }
    }
    let cancel = server
        .post(
            &format!("/orchestrator/pipeline/cancel/{thread}"),
            json!({}),
        )
        .await;
    assert_eq!(cancel.status(), 202);
    // Answered once the run stopped: a status read next says so.
    let answer: Value = cancel.json().await.unwrap();
    assert_eq!(answer["status"], "cancelled", "{answer}");
    let status = status_of(&server, &thread).await;
    assert_eq!(status["status"], "cancelled", "{status}");
    let rest = events.until("result").await;
    assert_eq!(rest.last().unwrap()["status"], "interrupted");
    let active = get(&server, "/orchestrator/runs/active").await;
    assert_eq!(active["runs"], json!([]));
    let resumed = server
        .post(
            &format!("/orchestrator/pipeline/resume/{thread}"),
            json!({}),
        )
        .await;
    assert_eq!(resumed.status(), 202);
    let resumed: Value = resumed.json().await.unwrap();
    assert_eq!(resumed["from_step"], 1);
    let active = get(&server, "/orchestrator/runs/active").await;
    assert_eq!(active["runs"][0]["thread_id"], thread.as_str());
    // The resumed turn's events, after the cancelled turn's result.
    let since = rest.last().unwrap()["seq"].as_u64().unwrap();
    let resumed = Lines::new(
        server
            .get(&format!(
                "/agent/session/{session}/events?since={since}&follow=true"
            ))
            .await,
    )
    .until("result")
    .await;
    assert_eq!(resumed.last().unwrap()["status"], "success");
    assert!(
        resumed[0]["message"]
            .as_str()
            .unwrap()
            .starts_with("Resuming"),
        "{:?}",
        resumed[0]
    );
    let status = status_of(&server, &thread).await;
    assert_eq!(status["status"], "completed");
    let ran: Vec<String> = nodes(&server, &thread)
        .await
        .into_iter()
        .filter(|n| n != "(end)")
        .collect();
    assert_eq!(
        ran,
        [
            "research",
            "generator",
            "tester",
            "test_reviewer",
            "reviewer",
            "publisher"
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn runs_past_the_cap_queue_and_a_run_past_its_timeout_fails() {
    let server = test_mode(|c| {
        c.pipelines.max_concurrent_pipelines = 1;
    })
    .await;
    let (first, first_session) = start(
        &server,
        json!({"connector_name": "crm", "mock": {"delay_ms": 300}}),
    )
    .await;
    // The first run holds the one place once its first node started.
    let mut first_events = Lines::new(
        server
            .get(&format!(
                "/agent/session/{first_session}/events?since=0&follow=true"
            ))
            .await,
    );
    first_events.until("node_started").await;
    let (second, second_session) = start(&server, json!({"connector_name": "crm"})).await;
    let mut events = Lines::new(
        server
            .get(&format!(
                "/agent/session/{second_session}/events?since=0&follow=true"
            ))
            .await,
    );
    let queued = events.next().await.unwrap();
    assert!(
        queued["message"].as_str().unwrap().starts_with("Queued"),
        "{queued}"
    );
    let status = get(&server, &format!("/orchestrator/pipeline/status/{second}")).await;
    assert!(["queued", "running", "completed"].contains(&status["status"].as_str().unwrap()));
    first_events.until("result").await;
    events.until("result").await;
    for thread in [&first, &second] {
        let status = status_of(&server, thread).await;
        assert_eq!(status["status"], "completed");
    }
    server.stop().await;

    let server = test_mode(|c| c.pipelines.pipeline_timeout_s = 1).await;
    let status = finished(
        &server,
        json!({"connector_name": "crm", "mock": {"delay_ms": 5000}}),
    )
    .await;
    assert_eq!(status["status"], "failed");
    assert!(status["reason"].as_str().unwrap().starts_with("timeout"));
    server.stop().await;
}

#[tokio::test]
async fn a_pipeline_session_streams_its_run_and_only_its_owner_sees_it() {
    let server = TestServer::start_with(|c| {
        c.pipelines.test_mode = true;
        c.api_keys = vec!["owner-key-1".into(), "other-key-2".into()];
    })
    .await;
    let created: Value = server
        .send_as(
            "owner-key-1",
            reqwest::Method::POST,
            "/agent/session",
            Some(json!({"kind": "pipeline", "options": {"connector_name": "stripe"}})),
        )
        .await
        .json()
        .await
        .unwrap();
    let id = created["session_id"].as_str().unwrap();
    let response = server
        .send_as(
            "owner-key-1",
            reqwest::Method::POST,
            &format!("/agent/session/{id}/message"),
            Some(json!({"prompt": "a Stripe source"})),
        )
        .await;
    let events = common::ndjson(response).await;
    let done = events
        .iter()
        .find(|e| e["type"] == "pipeline_completed")
        .unwrap();
    let thread = done["thread_id"].as_str().unwrap();
    assert!(thread.starts_with("pipeline-stripe-"));
    let status: Value = server
        .send_as(
            "owner-key-1",
            reqwest::Method::GET,
            &format!("/orchestrator/pipeline/status/{thread}"),
            None,
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(status["state"]["original_request"], "a Stripe source");
    let other = server
        .send_as(
            "other-key-2",
            reqwest::Method::GET,
            &format!("/orchestrator/pipeline/status/{thread}"),
            None,
        )
        .await;
    assert_eq!(other.status(), 404);
    let other = server
        .send_as(
            "other-key-2",
            reqwest::Method::POST,
            &format!("/orchestrator/pipeline/cancel/{thread}"),
            Some(json!({})),
        )
        .await;
    assert_eq!(other.status(), 404);
    // The list of runs: the owner's only, newest first.
    let runs = |key: &'static str| {
        let list = server.send_as(key, reqwest::Method::GET, "/orchestrator/runs", None);
        async move { list.await.json::<Value>().await.unwrap()["runs"].clone() }
    };
    let mine = runs("owner-key-1").await;
    assert_eq!(mine[0]["thread_id"], thread, "{mine}");
    assert_eq!(mine[0]["pipeline"], "connector");
    assert_eq!(runs("other-key-2").await, json!([]));
    let bad = server
        .send_as(
            "owner-key-1",
            reqwest::Method::GET,
            "/orchestrator/runs?limit=0",
            None,
        )
        .await;
    assert_eq!(bad.status(), 422);
    server.stop().await;
}

#[tokio::test]
async fn a_run_with_mock_agents_completes_on_a_server_outside_test_mode() {
    // The default server, whose model is the demo: `mock` makes this run's
    // nodes mock agents, and every node_started says so.
    let server = TestServer::start().await;
    let (thread, session) = start(
        &server,
        json!({"connector_name": "google-sheets", "mock": {}}),
    )
    .await;
    let events = until_result(&server, &session).await;
    let started: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "node_started")
        .collect();
    assert_eq!(started.len(), 6, "{events:?}");
    assert!(started.iter().all(|e| e["mock"] == true), "{started:?}");
    let status = status_of(&server, &thread).await;
    assert_eq!(status["status"], "completed", "{status}");
    server.stop().await;
}

#[tokio::test]
async fn bad_input_is_refused_with_the_field_named() {
    let server = TestServer::start().await;
    for (body, field) in [
        (json!({"pipeline": "nope"}), "pipeline"),
        (json!({"input": {"secret": 1}}), "input.secret"),
        (
            json!({"connector_name": "crm", "mock": {"delay_ms": 3_600_000}}),
            "mock.delay_ms",
        ),
        (json!({"what": 1}), "what: unknown field"),
        (
            json!({"conector_name": "stripe"}),
            "conector_name: unknown field; did you mean connector_name?",
        ),
        (
            json!({"input": {"original_request": "rows"}}),
            "connector_name: is required by the connector pipeline",
        ),
        (
            json!({"connector_name": " "}),
            "connector_name: must not be empty",
        ),
    ] {
        let response = server
            .post("/orchestrator/pipeline/start", body.clone())
            .await;
        assert_eq!(response.status(), 422, "{body}");
        let error: Value = response.json().await.unwrap();
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{body}: {message}");
    }
    let missing = server
        .get("/orchestrator/pipeline/status/pipeline-x-00000000")
        .await;
    assert_eq!(missing.status(), 404);
    server.stop().await;
}

const THREE: &str = "name: triage
description: three nodes of a user's own
start: read
terminal: [answer]
counters:
  rereads: 1
state:
  notes: {reducer: append}
  logs: {reducer: keep_last, keep: 10}
nodes:
  read:
    role: Reader
    prompt: read the ticket
    decisions: [CLEAR, UNCLEAR]
    writes: [notes, logs]
  think:
    prompt: 'think about {notes}'
    writes: [notes]
  answer:
    prompt: answer
edges:
  - {from: read, when: CLEAR, to: think}
  - {from: read, when: UNCLEAR, to: read, counter: rereads}
  - {from: think, to: answer}
";

#[tokio::test]
async fn a_users_pipeline_from_a_directory_runs_and_validate_checks_one() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("triage.yaml"), THREE).unwrap();
    let path = dir.path().to_path_buf();
    let server = test_mode(move |c| c.pipelines.dir = Some(path)).await;
    let listed = get(&server, "/orchestrator/pipelines").await;
    let names: Vec<&str> = listed["pipelines"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(names, ["connector", "triage"]);
    let (thread, session) = start(
        &server,
        json!({"pipeline": "triage", "mock": {"decisions": {"read": ["UNCLEAR", "CLEAR"]}}}),
    )
    .await;
    assert!(thread.starts_with("pipeline-triage-"));
    until_result(&server, &session).await;
    assert_eq!(
        nodes(&server, &thread).await,
        ["read", "read", "think", "answer"]
    );
    let status = status_of(&server, &thread).await;
    assert_eq!(status["status"], "completed");
    assert_eq!(status["counters"]["rereads"], 1);
    assert_eq!(status["state"]["notes"].as_array().unwrap().len(), 3);

    let valid = server
        .post("/orchestrator/pipelines/validate", json!({"yaml": THREE}))
        .await;
    assert_eq!(valid.status(), 200);
    let valid: Value = valid.json().await.unwrap();
    assert_eq!(
        valid["pipeline"]["nodes"],
        json!(["answer", "read", "think"])
    );
    let broken = THREE.replace("{from: think, to: answer}", "{from: think, to: nowhere}");
    let message = invalid(&server, &broken).await;
    assert!(
        message.starts_with("request:24: edges[2].to: unknown node"),
        "{message}"
    );
    let typo = THREE.replace("prompt: read the ticket", "promt: read the ticket");
    let message = invalid(&server, &typo).await;
    assert!(
        message.contains("unknown field `promt`") && message.ends_with("did you mean `prompt`?"),
        "{message}"
    );
    server.stop().await;

    // A broken file stops the start, naming the file and the line.
    std::fs::write(dir.path().join("broken.yaml"), broken).unwrap();
    let config = conclave::pipeline::PipelineConfig {
        dir: Some(dir.path().to_path_buf()),
        ..Default::default()
    };
    let error = conclave::pipeline::definitions(&config, &|_| Ok(())).unwrap_err();
    assert!(error.file.ends_with("broken.yaml"), "{error}");
    assert_eq!(error.line, 24);
    assert_eq!(error.place, "edges[2].to");
}

/// An IDE calls `start_pipeline` on `/mcp` with the official Python SDK:
/// a progress notification per node, then the run's status.
#[tokio::test]
async fn an_ide_starts_a_pipeline_over_mcp_with_progress() {
    let server = TestServer::start_sandboxed(|c| {
        c.api_keys = vec!["ide-key-456".into()];
        c.sandbox.warm_pool = 0;
        c.pipelines.test_mode = true;
    })
    .await;
    let url = server.url("/mcp");
    let seen = common::python_json(
        "tests/pipeline/mcp_client.py",
        &[&url, "ide-key-456"],
        "the mcp package",
    )
    .await;
    assert_eq!(seen["is_error"], false, "{seen}");
    assert_eq!(seen["result"]["status"], "completed", "{seen}");
    assert_eq!(seen["result"]["state"]["connector_name"], "jira");
    let progress = seen["progress"].as_array().unwrap();
    assert_eq!(progress.len(), 6, "{progress:?}");
    assert!(
        progress[0]["message"]
            .as_str()
            .unwrap()
            .starts_with("research: DONE")
    );
    assert!(
        progress[5]["message"]
            .as_str()
            .unwrap()
            .starts_with("publisher: PUBLISHED")
    );
    server.stop_and_remove_sandboxes().await;
}

/// The connector pipeline end to end with the demo model and real docker
/// sandboxes: the Generator writes a file, the Tester (a later node, the
/// same run's sandbox) imports and runs it.
#[tokio::test]
async fn the_connector_runs_end_to_end_with_real_tools_in_one_sandbox() {
    let server = TestServer::start_sandboxed(|c| c.sandbox.warm_pool = 0).await;
    let write = "```python\nopen('/workspace/connector.py', 'w').write('def fetch():\\n    return [1, 2, 3]\\n')\nprint('wrote connector.py')\n```";
    let test = "```python\nimport sys\nsys.path.insert(0, '/workspace')\nimport connector\nprint('sum', sum(connector.fetch()))\n```";
    let (thread, session) = start(
        &server,
        json!({"connector_name": "numbers",
               "input": {"research": write, "tests": test, "coverage_ratio": 1.0}}),
    )
    .await;
    let events = until_result(&server, &session).await;
    assert_eq!(events.last().unwrap()["status"], "success", "{events:?}");
    let status = status_of(&server, &thread).await;
    assert_eq!(status["status"], "completed", "{status}");
    assert_eq!(
        nodes(&server, &thread).await,
        [
            "research",
            "generator",
            "tester",
            "test_reviewer",
            "reviewer",
            "publisher"
        ]
    );
    let output_of = |node: &str| -> String {
        events
            .iter()
            .filter(|e| e["type"] == "tool_result" && e["agent_id"] == node)
            .map(|e| e["output"].to_string())
            .collect()
    };
    assert!(
        output_of("generator").contains("wrote connector.py"),
        "{events:?}"
    );
    // The Tester found the Generator's file: one sandbox for the run.
    assert!(
        output_of("tester").contains("sum 6"),
        "{}",
        output_of("tester")
    );
    // The TestReviewer's prompt holds the tests' code too, but it may only
    // read the sandbox: it ran nothing.
    assert_eq!(output_of("test_reviewer"), "", "{events:?}");
    server.stop_and_remove_sandboxes().await;
}

const PER_NODE: &str = "name: per_node
start: run
terminal: [judge]
state:
  code: {reducer: replace}
  verdict: {reducer: replace}
nodes:
  run:
    prompt: '{code}'
    tools: [mcp__sandbox__execute_code]
  look:
    prompt: '{code}'
    tools: [Read]
  judge:
    model: s
    prompt: judge the run
    decisions: [DONE]
    writes: [verdict]
edges:
  - {from: run, to: look}
  - {from: look, to: judge}
";

/// A node's own tools and model apply to its turn only, in the run's one
/// agent session: the same code block runs where the node may run code
/// and not where it may only read, and the judge is answered by its model
/// (a `conclave sim`), not the session's demo model.
#[tokio::test]
async fn each_node_works_with_its_own_tools_and_model() {
    let sim = Sim::start(
        "s",
        &[
            "--reply",
            r#"{"decision": "DONE", "verdict": "from the sim"}"#,
        ],
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("per_node.yaml"), PER_NODE).unwrap();
    let path = dir.path().to_path_buf();
    let server = TestServer::start_sandboxed(|c| {
        c.sandbox.warm_pool = 0;
        pools(c, &[("s", &sim)]);
        c.pipelines.dir = Some(path);
    })
    .await;
    let (thread, session) = start(
        &server,
        json!({"pipeline": "per_node",
               "input": {"code": "```python\nprint('ran by', 6 * 7)\n```"}}),
    )
    .await;
    let events = until_result(&server, &session).await;
    assert_eq!(events.last().unwrap()["status"], "success", "{events:?}");
    let results = |node: &str| -> Vec<String> {
        events
            .iter()
            .filter(|e| e["type"] == "tool_result" && e["agent_id"] == node)
            .map(|e| e["output"].to_string())
            .collect()
    };
    assert_eq!(results("run").len(), 1, "{events:?}");
    assert!(
        results("run")[0].contains("ran by 42"),
        "{:?}",
        results("run")
    );
    assert!(results("look").is_empty(), "{events:?}");
    let status = status_of(&server, &thread).await;
    assert_eq!(status["status"], "completed", "{status}");
    assert_eq!(status["state"]["verdict"], "from the sim", "{status}");

    // A node naming a model or a tool the server does not have is refused
    // before any run, with the line.
    for (from, to, place) in [
        ("model: s", "model: nope", "request:15: nodes.judge.model"),
        ("[Read]", "[Read, Teleport]", "request:13: nodes.look.tools"),
    ] {
        let message = invalid(&server, &PER_NODE.replace(from, to)).await;
        assert!(message.starts_with(place), "{message}");
    }
    server.stop_and_remove_sandboxes().await;
}
