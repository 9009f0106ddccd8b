//! What orchestrators rely on: `/health` and `/ready` answer probes without
//! a key, and the real binary drains on SIGTERM: `/ready` turns 503 at
//! once, new turns are refused with 503, running turns finish (or are
//! interrupted after `cluster.drain_s`) with their `result`, and the
//! process exits 0.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::binary::{serve_command, spawn_server};
use common::{Lines, TestServer, long_prompt};
use serde_json::{Value, json};
use tokio::process::Child;

#[tokio::test]
async fn health_and_ready_answer_probes_without_a_key() {
    let server = TestServer::start_with(|c| c.api_keys = vec!["key-probes-1".into()]).await;
    let health = server.get("/health").await;
    assert_eq!(health.status(), 200);
    let health: Value = health.json().await.unwrap();
    assert_eq!(health["status"], "ok");
    let ready = server.get("/ready").await;
    assert_eq!(ready.status(), 200);
    assert_eq!(
        ready.json::<Value>().await.unwrap(),
        json!({"status": "ready", "store": "ok", "bus": "ok", "draining": false})
    );
    // Everything else still needs the key.
    assert_eq!(server.get("/agent/sessions").await.status(), 401);
    let doc: Value = server
        .http
        .get(server.url("/openapi.json"))
        .bearer_auth("key-probes-1")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for path in ["/health", "/ready"] {
        let get = &doc["paths"][path]["get"];
        assert_eq!(get["security"], json!([{}]), "{path} needs no key: {get}");
    }
    assert!(doc["paths"]["/ready"]["get"]["responses"]["503"].is_object());
    server.stop().await;
}

/// `conclave serve` on loopback with `drain_s`, the demo model pausing
/// `chunk_ms` between words; answers the child and its URL.
async fn serve(cwd: &std::path::Path, drain_s: u64, chunk_ms: u64) -> (Child, String) {
    let mut command = serve_command(&["--sandbox", "local"]);
    command
        .current_dir(cwd)
        .env("CONCLAVE_CLUSTER__DRAIN_S", drain_s.to_string())
        .env("CONCLAVE_DEMO__CHUNK_DELAY_MS", chunk_ms.to_string())
        .env("CONCLAVE_SANDBOX__WARM_POOL", "0");
    spawn_server(&mut command).await
}

fn sigterm(child: &Child) {
    let pid = child.id().expect("running");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// A turn of `words` words, streamed, read until its first word arrives.
async fn running_turn(http: &reqwest::Client, url: &str, words: usize) -> (Lines, Vec<Value>) {
    let response = http
        .post(format!("{url}/agent/run"))
        .json(&json!({"prompt": long_prompt(words), "options": {"text_deltas": true}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut lines = Lines::new(response);
    let seen = lines.until("text_delta").await;
    (lines, seen)
}

/// Polls `/ready` until it answers 503, within a deadline.
async fn wait_not_ready(http: &reqwest::Client, url: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let response = http.get(format!("{url}/ready")).send().await.unwrap();
        if response.status() == 503 {
            return response.json().await.unwrap();
        }
        assert_eq!(response.status(), 200);
        assert!(Instant::now() < deadline, "/ready never answered 503");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn exit_status(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    tokio::time::timeout(within, child.wait())
        .await
        .unwrap_or_else(|_| panic!("the server did not exit within {within:?}"))
        .unwrap()
}

#[tokio::test]
async fn sigterm_drains_a_running_turn_to_its_result_and_exits_zero() {
    let cwd = tempfile::tempdir().unwrap();
    let (mut child, url) = serve(cwd.path(), 60, 40).await;
    let http = reqwest::Client::new();
    assert_eq!(
        http.get(format!("{url}/ready"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // About 60 words at 40 ms: the turn runs for ~2.5 s.
    let (mut turn, _) = running_turn(&http, &url, 60).await;
    sigterm(&child);

    let readiness = wait_not_ready(&http, &url).await;
    assert_eq!(
        readiness,
        json!({"status": "not_ready", "store": "ok", "bus": "ok", "draining": true})
    );
    // Liveness holds while the replica drains.
    assert_eq!(
        http.get(format!("{url}/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let refused = http
        .post(format!("{url}/agent/run"))
        .json(&json!({"prompt": "one more"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "shutting_down", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("draining") && message.contains("another replica"),
        "{message}"
    );

    let rest = turn.until("result").await;
    let result = rest.last().unwrap();
    assert_eq!(result["status"], "success", "{result}");
    assert!(
        result["result"]
            .as_str()
            .unwrap()
            .ends_with(&long_prompt(60)),
        "{result}"
    );
    let exit = exit_status(&mut child, Duration::from_secs(30)).await;
    assert!(exit.success(), "{exit}");
}

#[tokio::test]
async fn a_turn_longer_than_drain_s_is_interrupted_with_its_result() {
    let cwd = tempfile::tempdir().unwrap();
    let (mut child, url) = serve(cwd.path(), 1, 200).await;
    let http = reqwest::Client::new();
    // About 500 words at 200 ms: far longer than the one second of drain.
    let (mut turn, _) = running_turn(&http, &url, 500).await;
    let stopped = Instant::now();
    sigterm(&child);
    let rest = turn.until("result").await;
    assert_eq!(rest.last().unwrap()["status"], "interrupted");
    let exit = exit_status(&mut child, Duration::from_secs(30)).await;
    assert!(exit.success(), "{exit}");
    assert!(
        stopped.elapsed() >= Duration::from_secs(1),
        "the turn had its drain_s before it was interrupted"
    );
}
