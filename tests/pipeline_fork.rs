//! Forking a pipeline run (`POST /orchestrator/pipeline/fork/{thread_id}`)
//! against a real server in test mode: a fork from an earlier checkpoint
//! with a patched state takes the branch the source could not, the source
//! stays as it was, the fork's log starts with `forked`, only the run's
//! key may fork it, bad steps and states are refused, and a running
//! source can be forked from what it has stored.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Lines, TestServer};
use reqwest::Method;
use serde_json::{Value, json};

const OWNER: &str = "owner-key-1";
const OTHER: &str = "other-key-2";

/// A request as `key`: its status and JSON body.
async fn call(
    server: &TestServer,
    key: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let response = server.send_as(key, method, path, body).await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

async fn fork(server: &TestServer, key: &str, thread: &str, body: Value) -> (u16, Value) {
    let path = format!("/orchestrator/pipeline/fork/{thread}");
    call(server, key, Method::POST, &path, Some(body)).await
}

/// A session's events from the start, as `key`, until the turn's `result`.
async fn until_result(server: &TestServer, key: &str, session: &str) -> Vec<Value> {
    let path = format!("/agent/session/{session}/events?since=0&follow=true");
    Lines::new(server.send_as(key, Method::GET, &path, None).await)
        .until("result")
        .await
}

async fn history(server: &TestServer, thread: &str) -> Value {
    let path = format!("/orchestrator/pipeline/history/{thread}");
    let (status, history) = call(server, OWNER, Method::GET, &path, None).await;
    assert_eq!(status, 200, "{history}");
    history
}

fn nodes(history: &Value) -> Vec<&str> {
    history["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|step| step["node"].as_str().unwrap())
        .collect()
}

async fn status_of(server: &TestServer, thread: &str) -> Value {
    let path = format!("/orchestrator/pipeline/status/{thread}");
    call(server, OWNER, Method::GET, &path, None).await.1
}

#[tokio::test]
async fn a_fork_with_a_patched_state_takes_the_branch_its_source_could_not() {
    let server = TestServer::start_with(|c| {
        c.pipelines.test_mode = true;
        c.api_keys = vec![OWNER.into(), OTHER.into()];
    })
    .await;
    // At 50 % coverage the reviewer's APPROVE routes nowhere: the run
    // fails at step 5 without reaching the publisher.
    let (status, started) = call(
        &server,
        OWNER,
        Method::POST,
        "/orchestrator/pipeline/start",
        Some(json!({"connector_name": "crm", "mock": {"coverage": 0.5}})),
    )
    .await;
    assert_eq!(status, 202, "{started}");
    let source = started["thread_id"].as_str().unwrap();
    let source_session = started["session_id"].as_str().unwrap();
    let source_events = until_result(&server, OWNER, source_session).await;
    assert_eq!(status_of(&server, source).await["status"], "failed");
    let before = history(&server, source).await;
    let ran = [
        "research",
        "generator",
        "tester",
        "test_reviewer",
        "reviewer",
    ];
    assert_eq!(nodes(&before), ran);

    // From step 4 (test_reviewer, before the reviewer ran) at 90 %: the
    // reviewer runs again and the run is published.
    let (status, forked) = fork(
        &server,
        OWNER,
        source,
        json!({"step": 4, "state": {"coverage_ratio": 0.9}, "session_name": "at 90 %"}),
    )
    .await;
    assert_eq!(status, 202, "{forked}");
    assert_eq!(forked["status"], "started");
    assert_eq!(forked["pipeline"], "connector");
    assert_eq!(forked["from_thread"], source);
    assert_eq!(forked["from_step"], 4);
    let thread = forked["thread_id"].as_str().unwrap();
    assert_ne!(thread, source);
    assert!(thread.starts_with("pipeline-crm-"), "{thread}");
    let session = forked["session_id"].as_str().unwrap();
    assert_ne!(session, source_session);
    let events = until_result(&server, OWNER, session).await;
    // The fork's log starts with where it came from: the seq of the
    // source's checkpoint event of step 4.
    let at_seq = source_events
        .iter()
        .find(|e| e["type"] == "checkpoint" && e["step"] == 4)
        .unwrap()["seq"]
        .clone();
    assert_eq!(events[0]["type"], "forked", "{:?}", events[0]);
    assert_eq!(events[0]["seq"], 1);
    assert_eq!(events[0]["from_session"], source_session);
    assert_eq!(events[0]["at_seq"], at_seq);
    assert_eq!(events.last().unwrap()["status"], "success");
    // Only the nodes after step 4 ran in the fork.
    let started: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "node_started")
        .map(|e| &e["node"])
        .collect();
    assert_eq!(started, [&json!("reviewer"), &json!("publisher")]);
    let status = status_of(&server, thread).await;
    assert_eq!(status["status"], "completed", "{status}");
    assert_eq!(status["state"]["coverage_ratio"], 0.9);
    let after = history(&server, thread).await;
    assert_eq!(
        nodes(&after),
        [ran.as_slice(), &["publisher"]].concat(),
        "{after}"
    );
    // The copied steps are the source's; step 4 carries the patch.
    assert_eq!(after["history"][2]["state"], before["history"][2]["state"]);
    assert_eq!(before["history"][3]["state"]["coverage_ratio"], 0.5);
    assert_eq!(after["history"][3]["state"]["coverage_ratio"], 0.9);
    let (_, named) = call(
        &server,
        OWNER,
        Method::GET,
        &format!("/agent/session/{session}/status"),
        None,
    )
    .await;
    assert_eq!(named["session_name"], "at 90 %", "{named}");

    // At step 5 itself the routing is decided again: unpatched it still
    // ends there (nothing to run), patched it goes on to the publisher
    // without running the reviewer again.
    let (status, refused) = fork(&server, OWNER, source, json!({"step": 5})).await;
    assert_eq!(status, 409, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("coverage_ratio"), "{message}");
    let (status, forked) = fork(
        &server,
        OWNER,
        source,
        json!({"state": {"coverage_ratio": 1.0}}),
    )
    .await;
    assert_eq!(status, 202, "{forked}");
    assert_eq!(forked["from_step"], 5);
    let thread = forked["thread_id"].as_str().unwrap();
    until_result(&server, OWNER, forked["session_id"].as_str().unwrap()).await;
    let after = history(&server, thread).await;
    assert_eq!(nodes(&after), [ran.as_slice(), &["publisher"]].concat());
    assert_eq!(after["history"][4]["next"], "publisher");
    assert_eq!(after["history"][4]["status"], "running");

    // The source is as it was.
    assert_eq!(history(&server, source).await, before);
    assert_eq!(status_of(&server, source).await["status"], "failed");

    // Another key's fork finds no such run, as its status does; the
    // owner's list of runs has the source and both forks.
    let (status, _) = fork(&server, OTHER, source, json!({})).await;
    assert_eq!(status, 404);
    let (_, runs) = call(&server, OTHER, Method::GET, "/orchestrator/runs", None).await;
    assert_eq!(runs["runs"], json!([]));
    let (_, runs) = call(&server, OWNER, Method::GET, "/orchestrator/runs", None).await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 3, "{runs}");
    server.stop().await;
}

#[tokio::test]
async fn bad_forks_are_refused_with_the_steps_or_the_field_named() {
    let server = TestServer::start_with(|c| {
        c.pipelines.test_mode = true;
        c.api_keys = vec![OWNER.into()];
    })
    .await;
    let (_, started) = call(
        &server,
        OWNER,
        Method::POST,
        "/orchestrator/pipeline/start",
        Some(json!({"connector_name": "crm"})),
    )
    .await;
    let source = started["thread_id"].as_str().unwrap();
    until_result(&server, OWNER, started["session_id"].as_str().unwrap()).await;
    let (status, refused) = fork(&server, OWNER, source, json!({"step": 9})).await;
    assert_eq!(status, 404, "{refused}");
    assert_eq!(refused["error"]["code"], "unknown_step");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("1 (research)") && message.contains("6 (publisher)"),
        "{message}"
    );
    // A completed run's last step is its terminal node: nothing to run.
    let (status, refused) = fork(&server, OWNER, source, json!({})).await;
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("publisher is terminal"),
        "{refused}"
    );
    let refusals = [
        (json!({"step": 2, "state": [1]}), "state"),
        (json!({"step": 2, "state": {"nope": 1}}), "state.nope"),
        (json!({"step": "two"}), "step"),
        (json!({"step": 2, "branch": "b"}), "branch"),
    ];
    for (body, field) in refusals {
        let (status, refused) = fork(&server, OWNER, source, body.clone()).await;
        assert_eq!(status, 422, "{body}: {refused}");
        let message = refused["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(&format!("{field}:")), "{message}");
    }
    let (status, _) = fork(&server, OWNER, "pipeline-crm-00000000", json!({})).await;
    assert_eq!(status, 404);
    // Nothing was made by the refused forks.
    let (_, runs) = call(&server, OWNER, Method::GET, "/orchestrator/runs", None).await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 1, "{runs}");
    server.stop().await;
}

#[tokio::test]
async fn a_running_run_forks_from_what_it_has_stored_and_runs_on() {
    let server = TestServer::start_with(|c| c.pipelines.test_mode = true).await;
    let started: Value = server
        .post(
            "/orchestrator/pipeline/start",
            json!({"connector_name": "crm", "mock": {"delay_ms": 1000}}),
        )
        .await
        .json()
        .await
        .unwrap();
    let source = started["thread_id"].as_str().unwrap();
    let session = started["session_id"].as_str().unwrap();
    let mut events = Lines::new(
        server
            .get(&format!(
                "/agent/session/{session}/events?since=0&follow=true"
            ))
            .await,
    );
    // The first checkpoint is stored; the second node takes a second.
    events.until("checkpoint").await;
    let path = format!("/orchestrator/pipeline/fork/{source}");
    let beyond = server.post(&path, json!({"step": 3})).await;
    assert_eq!(beyond.status(), 404);
    let beyond: Value = beyond.json().await.unwrap();
    assert!(
        beyond["error"]["message"]
            .as_str()
            .unwrap()
            .ends_with("its steps: 1 (research)"),
        "{beyond}"
    );
    let forked = server.post(&path, json!({"step": 1})).await;
    assert_eq!(forked.status(), 202);
    let forked: Value = forked.json().await.unwrap();
    let status: Value = server
        .get_json(&format!("/orchestrator/pipeline/status/{source}"))
        .await;
    assert_eq!(status["status"], "running", "{status}");
    // The source is cancelled; the fork runs on from its own step 1.
    let cancel = server
        .post(
            &format!("/orchestrator/pipeline/cancel/{source}"),
            json!({}),
        )
        .await;
    assert_eq!(cancel.status(), 202);
    let rest = events.until("result").await;
    assert_eq!(rest.last().unwrap()["status"], "interrupted");
    // A stopped run forks from the step that records how it stopped (by
    // default its last): the node it stopped before runs first, and the
    // fork's `at_seq` is the source's `pipeline_completed`.
    let stopped = server.post(&path, json!({})).await;
    assert_eq!(stopped.status(), 202);
    let stopped: Value = stopped.json().await.unwrap();
    assert_eq!(stopped["from_step"], 2);
    let ended = rest
        .iter()
        .find(|e| e["type"] == "pipeline_completed")
        .unwrap();
    let all = [
        "research",
        "generator",
        "tester",
        "test_reviewer",
        "reviewer",
        "publisher",
    ];
    for (run, at_seq, ran) in [
        (&forked, None, all.to_vec()),
        (
            &stopped,
            Some(&ended["seq"]),
            [&all[..1], &["(end)"], &all[1..]].concat(),
        ),
    ] {
        let fork_events = Lines::new(
            server
                .get(&format!(
                    "/agent/session/{}/events?since=0&follow=true",
                    run["session_id"].as_str().unwrap()
                ))
                .await,
        )
        .until("result")
        .await;
        assert_eq!(fork_events[0]["type"], "forked");
        if let Some(at_seq) = at_seq {
            assert_eq!(&fork_events[0]["at_seq"], at_seq);
        }
        assert_eq!(fork_events.last().unwrap()["status"], "success");
        let thread = run["thread_id"].as_str().unwrap();
        let history = server
            .get_json(&format!("/orchestrator/pipeline/history/{thread}"))
            .await;
        assert_eq!(nodes(&history), ran, "{thread}: {history}");
    }
    let history = server
        .get_json(&format!("/orchestrator/pipeline/history/{source}"))
        .await;
    assert_eq!(nodes(&history), ["research", "(end)"], "{history}");
    server.stop().await;
}
