//! Sandboxes an operator can see and clean up, on real docker: every
//! sandbox carries an expiry that any Conclave instance on the host honours
//! (a stopped server's sandboxes do not run forever), `conclave sandboxes
//! list|prune` works across data directories, `GET/DELETE /sandboxes`
//! answer each key about its own, and `/metrics` counts live sandboxes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{TestServer, docker_sandboxes_of};
use reqwest::Method;
use serde_json::{Value, json};

/// Runs `conclave sandboxes …` on docker and returns its stdout.
async fn sandboxes_cli(args: &[&str]) -> String {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_conclave"))
        .arg("sandboxes")
        .args(args)
        .args(["--sandbox", "docker"])
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("conclave runs");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Waits until `done` holds, failing after `within`.
async fn until<F: std::future::Future<Output = bool>>(
    within: Duration,
    mut done: impl FnMut() -> F,
) {
    let deadline = Instant::now() + within;
    while !done().await {
        assert!(Instant::now() < deadline, "gave up waiting");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A stopped server whose session was live, with a short
/// `sandbox.max_lifetime_s`: its sandbox stays, labelled with its expiry.
async fn stopped_server_with_a_sandbox(dir: &std::path::Path) -> String {
    let server = TestServer::start_with_tools(dir, conclave::server::Tools::Sandboxed, |c| {
        c.sandbox.backend = conclave::config::SandboxBackendKind::Docker;
        c.sandbox.warm_pool = 0;
        c.sandbox.max_lifetime_s = 2;
    })
    .await;
    let id = server.create_session(json!({})).await;
    server.turn(&id, "$ true").await;
    server.stop().await;
    let left = docker_sandboxes_of(dir).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].expires.is_some());
    id
}

/// Past its expiry, `conclave sandboxes list` shows a stopped server's
/// sandbox expired and `prune` removes it; and a server running on another
/// data directory removes such sandboxes by itself. One test, so that the
/// second part's server cannot take the first part's sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_sandboxes_of_stopped_servers_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let id = stopped_server_with_a_sandbox(dir.path()).await;
    let data_dir = dir.path().display().to_string();
    let listed = sandboxes_cli(&["list", "--data-dir", &data_dir]).await;
    let line = |text: &str| {
        text.lines()
            .find(|l| l.contains(&id))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no line for {id} in {text}"))
    };
    assert!(line(&listed).contains("this"), "{listed}");
    until(Duration::from_secs(30), || async {
        line(&sandboxes_cli(&["list", "--data-dir", &data_dir]).await).ends_with("expired")
    })
    .await;
    let report = sandboxes_cli(&["prune", "--data-dir", &data_dir]).await;
    assert!(report.contains("removed 1 expired"), "{report}");
    assert_eq!(docker_sandboxes_of(dir.path()).await, vec![]);

    let first = tempfile::tempdir().unwrap();
    stopped_server_with_a_sandbox(first.path()).await;
    let other = TestServer::start_sandboxed(|c| {
        c.sandbox.warm_pool = 0;
        c.sandbox.max_lifetime_s = 4;
    })
    .await;
    until(Duration::from_secs(30), || async {
        docker_sandboxes_of(first.path()).await.is_empty()
    })
    .await;
    other.stop_and_remove_sandboxes().await;
}

/// `GET /sandboxes` lists the caller's sandboxes only, `DELETE` removes one
/// of the caller's (another key's is 404), the session then gets a fresh
/// sandbox, and `/metrics` counts live sandboxes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_sees_and_deletes_only_its_own_sandboxes() {
    let (alice, bob) = ("alice-key-1", "bob-key-2");
    let server = TestServer::start_sandboxed(|c| {
        c.sandbox.warm_pool = 0;
        c.api_keys = vec![alice.into(), bob.into()];
    })
    .await;
    let api = &server;
    let post = |path: &str, body: Value| api.send_as(alice, Method::POST, path, Some(body));
    let created: Value = post("/agent/session", json!({}))
        .await
        .json()
        .await
        .unwrap();
    let session = created["session_id"].as_str().unwrap().to_string();
    let message = format!("/agent/session/{session}/message");
    common::ndjson(post(&message, json!({"prompt": "$ echo hi > f"})).await).await;
    let list = |key: &'static str| async move {
        let body: Value = api
            .send_as(key, Method::GET, "/sandboxes", None)
            .await
            .json()
            .await
            .unwrap();
        body["sandboxes"].as_array().unwrap().clone()
    };
    let mine = list(alice).await;
    assert_eq!(mine.len(), 1, "{mine:?}");
    assert_eq!(mine[0]["session_id"], session.as_str());
    assert_eq!(mine[0]["kind"], "session");
    assert_eq!(mine[0]["backend"], "docker");
    assert!(mine[0]["expires_at"].is_string());
    // Its age and what it uses, for the dashboard's sandboxes view.
    assert!(mine[0]["created_at"].is_string(), "{mine:?}");
    assert!(mine[0]["memory_bytes"].as_u64().unwrap() > 0, "{mine:?}");
    assert!(mine[0]["pids"].as_u64().unwrap() >= 1, "{mine:?}");
    // Docker tells the CPU only from a second sample on.
    assert!(mine[0].get("cpu_percent").is_some(), "{mine:?}");
    assert_eq!(list(bob).await, Vec::<Value>::new());
    let everything = server
        .send_as(bob, Method::GET, "/sandboxes?all=true", None)
        .await;
    assert_eq!(everything.status(), 403);
    let metrics = server
        .send_as(bob, Method::GET, "/metrics", None)
        .await
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("conclave_sandboxes_live 1"), "{metrics}");

    let sandbox = mine[0]["id"].as_str().unwrap();
    let path = format!("/sandboxes/{sandbox}");
    let delete = |key: &'static str| api.send_as(key, Method::DELETE, &path, None);
    let refused = delete(bob).await;
    assert_eq!(refused.status(), 404);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found");
    assert_eq!(list(alice).await.len(), 1, "bob's delete removed nothing");
    assert_eq!(delete(alice).await.status(), 204);
    assert_eq!(list(alice).await, Vec::<Value>::new());
    // The session goes on in a fresh sandbox.
    let turn = post(&message, json!({"prompt": "$ ls f || echo fresh"})).await;
    let events = common::ndjson(turn).await;
    let result = events.iter().find(|e| e["type"] == "tool_result").unwrap();
    assert!(
        result["output"]["stdout"]
            .as_str()
            .unwrap()
            .contains("fresh"),
        "{result}"
    );
    assert_ne!(list(alice).await[0]["id"], sandbox);
    server.stop_and_remove_sandboxes().await;
}
