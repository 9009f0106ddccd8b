//! The dashboard in a real Chromium: selenium (`tests/browser/run.py`)
//! drives each view against a server with what it shows: real docker
//! sandboxes, `conclave sim` replicas behind a gateway pool, test-mode
//! pipelines, keys. With `CONCLAVE_SCREENSHOTS=DIR` each scenario saves a
//! screenshot of the views it visits there (the README shows those of
//! `docs/screenshots/`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::TestServer;
use common::sim::{Sim, pools};
use serde_json::{Value, json};

const KEY_A: &str = "dashboard-key-a";
const KEY_B: &str = "dashboard-key-b";

/// Runs one scenario of `tests/browser/run.py` against `server`.
async fn browser(scenario: &str, server: &TestServer, extra: &[&str]) -> Value {
    common::browser_scenario(scenario, server.url("").trim_end_matches('/'), extra).await
}

#[tokio::test]
async fn in_chromium_a_session_streams_runs_a_sandbox_tool_interrupts_and_survives_a_reload() {
    let server = TestServer::start_sandboxed(|c| c.demo.chunk_delay_ms = 30).await;
    let facts = browser("sessions", &server, &[]).await;
    assert!(facts["events"].as_u64().unwrap() > 10, "{facts}");
    server.stop_and_remove_sandboxes().await;
}

/// What the small harness did shows in the chat as the harness's, apart
/// from the model's text.
#[tokio::test]
async fn in_chromium_a_small_harness_intervention_shows_in_the_chat() {
    let server = TestServer::start_sandboxed(common::with_small_demo).await;
    let facts = browser("interventions", &server, &[]).await;
    // The cell's repair, then the answer asked for after its output.
    assert_eq!(facts["interventions"], 2, "{facts}");
    server.stop_and_remove_sandboxes().await;
}

/// A session made with the permission mode `ask` in the form: each call
/// waits in the chat with its input, and is decided by a click, by keys
/// (`y`, `n`, `a`; typing in the composer decides nothing) and by another
/// client over the API; each turn goes on once its call is decided.
#[tokio::test]
async fn in_chromium_a_waiting_tool_call_is_decided_by_click_keys_and_another_client() {
    let server = TestServer::start().await;
    let facts = browser("approvals", &server, &[]).await;
    // The server's log agrees with what the page did: five calls waited,
    // decided in order by the page (approve, y, n), the API (deny) and `a`,
    // which remembered Bash; six turns ended.
    let id = facts["session_id"].as_str().unwrap();
    let events = common::ndjson(server.get(&format!("/agent/session/{id}/events")).await).await;
    let of = |kind: &str| -> Vec<&Value> { events.iter().filter(|e| e["type"] == kind).collect() };
    assert_eq!(of("approval_requested").len(), 5, "{events:?}");
    let decided: Vec<(&str, &str)> = of("approval_decided")
        .iter()
        .map(|e| (e["decision"].as_str().unwrap(), e["by"].as_str().unwrap()))
        .collect();
    let by_user = |d| (d, "user");
    assert_eq!(
        decided,
        ["allow", "allow", "deny", "deny", "allow"].map(by_user),
        "{events:?}"
    );
    assert_eq!(
        of("approval_decided")[4]["remembered"],
        "Bash",
        "{events:?}"
    );
    assert_eq!(of("result").len(), 6, "{events:?}");
    server.stop().await;
}

/// A turn's Fork button makes a session from that turn's end, which opens
/// saying where it came from, with that turn's history and workspace, and
/// runs on; the source stays as it was; a refused fork shows the server's
/// message.
#[tokio::test]
async fn in_chromium_a_turn_is_forked_into_a_session_that_runs_on() {
    let server = TestServer::start_sandboxed(|c| c.sandbox.warm_pool = 0).await;
    let facts = browser("fork", &server, &[]).await;
    // The server agrees: the fork's log starts with where it came from.
    let fork = facts["fork"].as_str().unwrap();
    let events = common::ndjson(server.get(&format!("/agent/session/{fork}/events")).await).await;
    assert_eq!(events[0]["type"], "forked", "{events:?}");
    assert_eq!(events[0]["from_session"], facts["source"], "{events:?}");
    assert_eq!(events[0]["at_seq"], facts["at_seq"], "{events:?}");
    assert_eq!(events.last().unwrap()["type"], "result", "{events:?}");
    server.stop_and_remove_sandboxes().await;
}

/// A thread a LangGraph client rolled back: the chat marks the undone
/// turn, shows the rewind, and keeps each prompt with its own turn.
#[tokio::test]
async fn in_chromium_a_rolled_back_turn_shows_as_undone() {
    let server = TestServer::start_with(|c| c.demo.chunk_delay_ms = 30).await;
    let facts = browser("rollback", &server, &[]).await;
    // The server agrees: one rewind, to the first turn's end.
    let thread = facts["thread"].as_str().unwrap();
    let events = common::ndjson(server.get(&format!("/agent/session/{thread}/events")).await).await;
    let first_end = events.iter().find(|e| e["type"] == "result").unwrap()["seq"].clone();
    let rewound: Vec<&Value> = events.iter().filter(|e| e["type"] == "rewound").collect();
    assert_eq!(rewound.len(), 1, "{events:?}");
    assert_eq!(rewound[0]["to_seq"], first_end, "{events:?}");
    assert_eq!(facts["prompts"], json!(["one", "three"]));
    server.stop().await;
}

/// On a session's page a picked file goes into the workspace, a turn's
/// result says what it changed and shows the diff, and Download saves the
/// workspace.
#[tokio::test]
async fn in_chromium_files_go_in_a_turns_diff_shows_and_the_workspace_comes_out() {
    let server = TestServer::start_sandboxed(|c| c.sandbox.warm_pool = 0).await;
    let facts = browser("workspace", &server, &[]).await;
    let id = facts["session"].as_str().unwrap();
    // The server agrees with what the page showed.
    let edited = server
        .get(&format!("/agent/session/{id}/files/notes.txt"))
        .await;
    assert_eq!(edited.text().await.unwrap(), "hello, world\n");
    let events = common::ndjson(server.get(&format!("/agent/session/{id}/events")).await).await;
    let result = events.iter().find(|e| e["type"] == "result").unwrap();
    assert_eq!(
        result["files_changed"],
        serde_json::json!({"added": 1, "modified": 1, "deleted": 0})
    );
    assert!(facts["downloaded"].as_u64().unwrap() > 100, "{facts}");
    server.stop_and_remove_sandboxes().await;
}

/// A session of 10,000 events opens whole (every seq once, in order) and
/// scrolls end to end with only a window of them in the page.
#[tokio::test]
async fn in_chromium_a_session_of_ten_thousand_events_opens_and_scrolls() {
    let server = TestServer::start().await;
    let facts = browser("bigsession", &server, &[]).await;
    assert!(facts["events"].as_u64().unwrap() >= 10_000, "{facts}");
    server.stop().await;
}

#[tokio::test]
async fn in_chromium_a_deliberation_shows_every_proposal_and_the_decision() {
    let server = TestServer::start().await;
    browser("deliberations", &server, &[]).await;
    server.stop().await;
}

#[tokio::test]
async fn in_chromium_a_pipeline_shows_its_path_and_history() {
    let server = TestServer::start_with(|c| c.pipelines.test_mode = true).await;
    browser("pipelines", &server, &[]).await;
    server.stop().await;
}

/// A pipeline node whose agent waits for approval shows so in the graph,
/// and the call is allowed from the run's page.
#[tokio::test]
async fn in_chromium_a_pipeline_node_waiting_for_approval_is_shown_and_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let gated = "name: gated\nstart: run\nterminal: [run]\nstate:\n  code: {reducer: replace}\n\
                 nodes:\n  run:\n    prompt: '{code}'\n    tools: [Bash]\n";
    std::fs::write(dir.path().join("gated.yaml"), gated).unwrap();
    let path = dir.path().to_path_buf();
    let server = TestServer::start_with(|c| c.pipelines.dir = Some(path)).await;
    let facts = browser("pipeline_approvals", &server, &[]).await;
    assert_eq!(facts["label"], "waiting for approval", "{facts}");
    server.stop().await;
}

#[tokio::test]
async fn in_chromium_a_drained_replica_changes_state() {
    let (r1, r2) = (Sim::start("r1", &[]).await, Sim::start("r2", &[]).await);
    let server = TestServer::start_with(|c| {
        pools(c, &[("sim", &r1)]);
        let pool = c.gateway.pools.get_mut("sim").unwrap();
        pool.replicas.push(r2.replica());
    })
    .await;
    browser("gateway", &server, &[]).await;
    server.stop().await;
}

#[tokio::test]
async fn in_chromium_the_sandboxes_and_bus_views_show_live_state() {
    let server = TestServer::start_sandboxed(|c| c.sandbox.warm_pool = 0).await;
    let id = server
        .create_session(json!({"session_name": "with a sandbox"}))
        .await;
    let events = server.turn(&id, "$ echo ready").await;
    assert_eq!(events.last().unwrap()["status"], "success", "{events:?}");
    let put = server
        .http
        .put(server.url("/kv/dashboard/greeting"))
        .json(&json!({"value": "hello"}))
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{:?}", put.text().await);
    let facts = browser("views", &server, &[]).await;
    // The scenario checked each shows one decimal; both were shown.
    for shown in ["sandbox_cpu", "session_sandbox_cpu"] {
        assert!(
            facts[shown].as_str().is_some_and(|cpu| cpu.ends_with(" %")),
            "{shown}: {facts}"
        );
    }
    server.stop_and_remove_sandboxes().await;
}

#[tokio::test]
async fn in_chromium_a_wrong_key_is_refused_and_a_key_sees_only_its_sessions() {
    let server = TestServer::start_with(|c| c.api_keys = vec![KEY_A.into(), KEY_B.into()]).await;
    let created = server
        .send_as(
            KEY_B,
            reqwest::Method::POST,
            "/agent/session",
            Some(json!({"session_name": "secret-of-b"})),
        )
        .await;
    assert_eq!(created.status(), 201);
    browser(
        "auth",
        &server,
        &["--key", KEY_A, "--wrong-key", "not-a-key-at-all"],
    )
    .await;
    server.stop().await;
}

/// The Usage view, signed in with an admin key: a bar per day with
/// today's tokens (the turn's, as the API counts them), the breakdown by
/// model and by key name, never a key.
#[tokio::test]
async fn in_chromium_the_usage_view_charts_days_and_breaks_down_by_model_and_key() {
    let server = TestServer::start_with(|c| {
        for (name, key, admin) in [("alice", KEY_A, false), ("ops", KEY_B, true)] {
            c.keys.insert(
                name.into(),
                conclave::config::NamedKey {
                    key: key.into(),
                    admin,
                    secrets: Default::default(),
                    quota: Default::default(),
                },
            );
        }
    })
    .await;
    let run = server.send_as(
        KEY_A,
        reqwest::Method::POST,
        "/agent/run",
        Some(json!({"prompt": "$ echo counted"})),
    );
    let events = common::ndjson(run.await).await;
    let usage = &events.last().unwrap()["usage"];
    let tokens = usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap();
    let facts = browser("usage", &server, &["--key", KEY_B, "--secret", KEY_A]).await;
    assert_eq!(facts["today"]["tokens"], tokens, "{facts}");
    assert_eq!(facts["models"], json!(["demo"]), "{facts}");
    assert_eq!(facts["keys"], json!(["alice"]), "{facts}");
    server.stop().await;
}
