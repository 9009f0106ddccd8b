//! The real binary: a `kill -9` during a turn loses no event a client
//! already received and the restart closes the cut-off turn as
//! `interrupted`; SIGTERM closes running turns before exiting; a bad start
//! is refused with a message naming the field.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Stdio;

use common::{Lines, long_prompt, ndjson};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Starts the real binary on port 0 and returns it with its base URL.
async fn spawn_server(data_dir: &std::path::Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_conclave"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .env("CONCLAVE_DEMO__CHUNK_DELAY_MS", "20")
        // No drain: SIGTERM interrupts running turns at once (the drain
        // itself is tests/shutdown.rs's).
        .env("CONCLAVE_CLUSTER__DRAIN_S", "0")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the conclave binary starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let first = lines
        .next_line()
        .await
        .expect("read")
        .expect("a first line");
    let url = first
        .strip_prefix("conclave listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_string();
    (child, url)
}

/// Starts an ephemeral run that streams for many seconds.
async fn long_run(http: &reqwest::Client, url: &str) -> Lines {
    let response = http
        .post(format!("{url}/agent/run"))
        .json(&json!({"prompt": long_prompt(1000), "text_deltas": true}))
        .send()
        .await
        .unwrap();
    Lines::new(response)
}

#[tokio::test]
async fn kill_9_mid_turn_loses_nothing_received_and_closes_the_turn() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let (mut child, url) = spawn_server(dir.path()).await;

    let mut lines = long_run(&http, &url).await;
    let mut received = Vec::new();
    while received.len() < 20 {
        received.push(lines.next().await.expect("events before the kill"));
    }
    child.kill().await.expect("SIGKILL");
    // Whatever was already on the wire still counts as received.
    while let Some(event) = lines.next().await {
        received.push(event);
    }
    assert!(
        received.iter().all(|e| e["type"] != "result"),
        "the turn was still running"
    );
    let id = received[0]["session_id"].as_str().unwrap().to_string();

    let (mut restarted, url) = spawn_server(dir.path()).await;
    let replay: Vec<Value> = ndjson(
        http.get(format!("{url}/agent/session/{id}/events"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        replay[..received.len()],
        received[..],
        "every received event is replayed as it was"
    );
    let tail: Vec<(&str, &str)> = replay[received.len()..]
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap(),
                e["status"].as_str().or(e["message"].as_str()).unwrap_or(""),
            )
        })
        .collect();
    let closing = &tail[tail.len() - 2..];
    assert_eq!(
        closing,
        [
            (
                "status",
                "The server restarted during this turn; it was interrupted."
            ),
            ("result", "interrupted"),
        ]
    );
    let seqs: Vec<u64> = replay.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=replay.len() as u64).collect::<Vec<_>>(),
        "no gaps"
    );

    let status: Value = http
        .get(format!("{url}/agent/session/{id}/status"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (status["status"].as_str(), status["running"].as_bool()),
        (Some("closed"), Some(false))
    );
    restarted.kill().await.expect("SIGKILL");
    common::remove_sandboxes_of(dir.path()).await;
}

#[tokio::test]
async fn sigterm_closes_running_turns_then_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let (mut child, url) = spawn_server(dir.path()).await;
    let mut lines = long_run(&http, &url).await;
    lines.until("text_delta").await;
    let pid = child.id().expect("pid").to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let rest = lines.until("result").await;
    assert_eq!(rest.last().unwrap()["status"], "interrupted");
    let exit = child.wait().await.unwrap();
    assert!(exit.success(), "exit status {exit}");
}

#[tokio::test]
async fn a_bad_start_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("conclave.toml");
    std::fs::write(&config, "[agent]\nmax_turns = \"lots\"\n").unwrap();
    // (flags, environment, the field the error must name)
    type Case<'a> = (Vec<String>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec!["--listen".into(), "0.0.0.0:0".into()],
            vec![],
            "listen",
        ),
        (
            vec!["--config".into(), config.display().to_string()],
            vec![],
            "max_turns",
        ),
        (
            vec![],
            vec![("CONCLAVE_MAX_BODY_BYTES", "many")],
            "max_body_bytes",
        ),
        (vec![], vec![("CONCLAVE_API_KEYS", "short")], "api_keys[0]"),
    ];
    for (args, env, field) in cases {
        let output = Command::new(env!("CARGO_BIN_EXE_conclave"))
            .arg("serve")
            .args(["--data-dir"])
            .arg(dir.path())
            .args(&args)
            .envs(env.iter().copied())
            .output()
            .await
            .unwrap();
        assert!(!output.status.success(), "{args:?} {env:?} should fail");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(field), "{field} not named in {stderr:?}");
    }
}

#[tokio::test]
async fn a_restart_after_kill_9_reaps_orphan_sandboxes_and_keeps_live_ones() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let (mut child, url) = spawn_server(dir.path()).await;

    let session: Value = http
        .post(format!("{url}/agent/session"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let kept = session["session_id"].as_str().unwrap().to_string();
    let events = ndjson(
        http.post(format!("{url}/agent/session/{kept}/message"))
            .json(&json!({"prompt": "$ echo survived > k.txt"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(events.last().unwrap()["status"], "success");

    // An ephemeral run stuck in a tool call when the server dies.
    let response = http
        .post(format!("{url}/agent/run"))
        .json(&json!({"prompt": "$ sleep 300"}))
        .send()
        .await
        .unwrap();
    let mut lines = Lines::new(response);
    let seen = lines.until("tool_use").await;
    let ephemeral = seen[0]["session_id"].as_str().unwrap().to_string();

    let of = |sandboxes: &[conclave::sandbox::ManagedSandbox], session: &str| {
        sandboxes
            .iter()
            .find(|s| s.session.as_deref() == Some(session))
            .map(|s| s.id.clone())
    };
    // `tool_use` goes out before the call leases its sandbox, and a sandbox
    // drawn from the warm pool is relabelled in the background: wait until
    // docker shows it as the run's.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let before = loop {
        let listed = common::docker_sandboxes_of(dir.path()).await;
        if of(&listed, &ephemeral).is_some() || std::time::Instant::now() > deadline {
            break listed;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let kept_id = of(&before, &kept).expect("the session's sandbox");
    let ephemeral_id = of(&before, &ephemeral).expect("the run's sandbox");
    child.kill().await.expect("SIGKILL");

    let (mut restarted, url) = spawn_server(dir.path()).await;
    let after: Vec<String> = common::docker_sandboxes_of(dir.path())
        .await
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert!(
        after.contains(&kept_id),
        "a live session's sandbox was reaped"
    );
    for old in before.iter().filter(|s| s.id != kept_id) {
        assert!(
            !after.contains(&old.id),
            "orphan {old:?} survived the restart"
        );
    }
    assert!(!after.contains(&ephemeral_id));

    // The live session carries on in the same sandbox, its files intact.
    let events = ndjson(
        http.post(format!("{url}/agent/session/{kept}/message"))
            .json(&json!({"prompt": "$ cat k.txt"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let result = events.iter().find(|e| e["type"] == "tool_result").unwrap();
    assert_eq!(result["output"]["stdout"], "survived\n");
    restarted.kill().await.expect("SIGKILL");
    common::remove_sandboxes_of(dir.path()).await;
}

/// The log a new user reads: the gateway pools loaded at start, one INFO
/// line per request (with the `x-request-id` the client sent, which comes
/// back in the response) and one per finished turn; no rmcp dumps.
#[tokio::test]
async fn the_log_names_pools_requests_and_turns() {
    let cwd = tempfile::tempdir().unwrap();
    std::fs::write(
        cwd.path().join("conclave.toml"),
        "[gateway.pools.tiny]\nreplicas = [{ id = \"r0\", url = \"http://127.0.0.1:9/v1\" }]\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_conclave"))
        .current_dir(cwd.path())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--config",
            "conclave.toml",
            "--sandbox",
            "local",
        ])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the conclave binary starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next_line().await.unwrap().expect("a first line");
    let url = first
        .strip_prefix("conclave listening on ")
        .unwrap()
        .to_string();
    let http = reqwest::Client::new();
    let response = http
        .post(format!("{url}/agent/run"))
        .header("x-request-id", "req-42")
        .json(&json!({"prompt": "hello", "sandbox_enabled": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-request-id"], "req-42");
    let events = ndjson(response).await;
    let session = events[0]["session_id"].as_str().unwrap().to_string();
    let made = http
        .get(format!("{url}/agent/sessions"))
        .send()
        .await
        .unwrap();
    assert!(made.headers().contains_key("x-request-id"));
    let pid = child.id().unwrap();
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let output = child.wait_with_output().await.unwrap();
    let log = String::from_utf8_lossy(&output.stderr);
    let has = |needles: &[&str]| {
        log.lines()
            .any(|line| needles.iter().all(|n| line.contains(n)))
    };
    assert!(
        has(&["INFO", "gateway pool", "pool=tiny", "127.0.0.1:9"]),
        "{log}"
    );
    assert!(
        has(&[
            "INFO",
            "request",
            "request=req-42",
            "method=POST",
            "path=/agent/run",
            "status=200"
        ]),
        "{log}"
    );
    assert!(
        has(&[
            "INFO",
            "turn finished",
            &format!("session={session}"),
            "status=success"
        ]),
        "{log}"
    );
    assert!(!log.contains("InitializeRequestParam"), "{log}");
}
