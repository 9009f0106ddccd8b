//! A2A 1.0 at `/a2a/{agent}`, through the official `a2a-sdk` Python client
//! against the real binary: the card, send (blocking, streamed, at once),
//! get, list, an approval as `INPUT_REQUIRED` and its decision, a push
//! notification to a local receiver (and one to a forbidden address
//! refused), subscribe and cancel, another key refused, bad requests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::binary::{serve_command, spawn_server, stop};
use serde_json::{Value, json};

const KEY_A: &str = "a2a-test-key-a-0123456789";
const KEY_B: &str = "a2a-test-key-b-0123456789";

/// Two keys; the demo model paced so that a long prompt's turn runs for
/// seconds; push notifications may reach this host only.
const CONFIG: &str = r#"
api_keys = ["a2a-test-key-a-0123456789", "a2a-test-key-b-0123456789"]

[demo]
chunk_delay_ms = 40

[mcp]
allowed_http_servers = ["127.0.0.1"]
"#;

/// The binary serving CONFIG from a fresh directory.
async fn serve() -> (tempfile::TempDir, tokio::process::Child, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("conclave.toml"), CONFIG).unwrap();
    let mut command = serve_command(&["--sandbox", "local", "--config", "conclave.toml"]);
    command.current_dir(dir.path());
    let (child, url) = spawn_server(&mut command).await;
    (dir, child, url)
}

#[tokio::test]
async fn the_a2a_sdk_sends_follows_and_cancels_tasks() {
    let (_dir, mut child, url) = serve().await;

    let seen = common::python_json("tests/a2a/client.py", &[&url, KEY_A, KEY_B], "a2a-sdk").await;

    let card = &seen["card"];
    assert_eq!(card["name"], "agent", "{seen}");
    assert_eq!(card["url"], format!("{url}/a2a/agent"));
    assert_eq!(card["binding"], "JSONRPC");
    assert_eq!(card["version"], "1.0");
    assert_eq!(card["streaming"], true);
    assert_eq!(card["schemes"], json!(["bearer"]));
    let skills: Vec<&str> = card["skills"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(skills[0], "agent");
    assert!(skills.contains(&"tool:Bash"), "{skills:?}");
    assert_eq!(seen["root_card"], "agent");
    assert_eq!(seen["no_key_card"], 200);
    assert_eq!(seen["no_key_call"], 401);
    assert_eq!(
        seen["bad"],
        json!({"no_version": -32009, "unknown": -32601, "not_json": -32700, "extended_card": -32004})
    );

    let send = &seen["send"];
    assert_eq!(send["state"], "TASK_STATE_COMPLETED", "{seen}");
    assert_eq!(send["texts"], json!(["You said: hello there"]));
    assert_eq!(send["history"], 2);

    // The streamed task: the task first, then status updates, the result
    // as an artifact, and the final status last; in the same context.
    let stream = &seen["stream"];
    let kinds: Vec<&str> = stream["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(kinds.first(), Some(&"task"), "{stream}");
    assert_eq!(kinds.last(), Some(&"status_update"));
    assert!(kinds.contains(&"artifact_update"), "{stream}");
    assert_eq!(stream["last_state"], "TASK_STATE_COMPLETED");
    assert_eq!(stream["texts"], json!(["You said: and again"]));
    assert_eq!(stream["context"], send["context"]);

    assert_eq!(
        seen["get"],
        json!({"state": "TASK_STATE_COMPLETED", "texts": ["You said: and again"]})
    );
    assert_eq!(seen["list"]["total"], 2, "{seen}");
    assert_eq!(seen["second_first"], true);

    // Approval: the task waits with the call, the decision finishes it,
    // and the receiver heard each state with the config's token.
    assert_eq!(
        seen["approval"],
        json!({"state": "TASK_STATE_INPUT_REQUIRED", "tool": "Bash"})
    );
    assert_eq!(seen["push_refused"], "InvalidParamsError", "{seen}");
    assert_eq!(
        seen["decided"],
        json!({"state": "TASK_STATE_COMPLETED", "same": true, "made": true})
    );
    assert_eq!(seen["push_done"], true, "{seen}");
    let pushed: Vec<&str> = seen["push"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert_eq!(p["token"], "tok-1");
            p["state"].as_str().unwrap()
        })
        .collect();
    assert_eq!(
        pushed.first(),
        Some(&"TASK_STATE_INPUT_REQUIRED"),
        "{pushed:?}"
    );
    assert!(pushed.contains(&"TASK_STATE_WORKING"), "{pushed:?}");
    assert_eq!(pushed.last(), Some(&"TASK_STATE_COMPLETED"));

    // A long task returned at once, followed, then cancelled.
    assert_ne!(seen["at_once"], "TASK_STATE_COMPLETED", "{seen}");
    assert_eq!(
        seen["cancel"],
        json!({"state": "TASK_STATE_CANCELED", "first": "task", "last": "TASK_STATE_CANCELED"})
    );
    assert_eq!(seen["cancel_again"], seen["not_cancelable"]);
    assert_eq!(seen["subscribe_ended"], seen["unsupported"]);

    let not_found = &seen["not_found"];
    let other = &seen["other"];
    assert_eq!(other["get"], *not_found, "{other}");
    assert_eq!(other["cancel"], *not_found);
    assert_eq!(other["list"], 0);
    assert_eq!(other["context"], *not_found);
    assert_eq!(other["subscribe"], *not_found);
    assert_eq!(
        seen["named"],
        json!({"echoed": ["shared-name", "shared-name"], "mine": true, "theirs": true})
    );
    // The contexts' sessions are the adapter's: listed under its origin,
    // and not among the key's own.
    let listed = |origin: &str| {
        common::binary::json_of(
            reqwest::Client::new()
                .get(format!("{url}/agent/sessions?origin={origin}"))
                .bearer_auth(KEY_A),
        )
    };
    let made = listed("a2a").await;
    let made = made["sessions"].as_array().unwrap();
    assert!(!made.is_empty(), "no A2A session listed");
    assert!(made.iter().all(|s| s["origin"] == "a2a"), "{made:?}");
    let own = listed("conclave").await;
    assert_eq!(own["sessions"], json!([]), "{own}");

    stop(&mut child).await;
}

/// The official JavaScript SDK streams a task and goes on in its context.
#[tokio::test]
async fn the_javascript_sdk_streams_a_task() {
    let prefix = std::env::var("CONCLAVE_TEST_A2A_JS").expect(
        "CONCLAVE_TEST_A2A_JS must name the npm prefix of @a2a-js/sdk (scripts/test.sh installs it)",
    );
    let (_dir, mut child, url) = serve().await;
    let output = tokio::process::Command::new("node")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/a2a/js_client.mjs"
        ))
        .args([&prefix, &url, KEY_A])
        .output()
        .await
        .expect("node starts");
    assert!(
        output.status.success(),
        "js_client.mjs failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(seen["kinds"][0], "task", "{seen}");
    assert_eq!(
        seen["states"].as_array().unwrap().last().unwrap(),
        "TASK_STATE_COMPLETED"
    );
    assert_eq!(seen["texts"], json!(["You said: hello from js"]));
    assert_eq!(
        seen["again"],
        json!({"state": "TASK_STATE_COMPLETED", "context": true})
    );
    assert_eq!(seen["got"], "TASK_STATE_COMPLETED");
    stop(&mut child).await;
}

/// `[a2a] public_cards = false` asks a key for cards too.
#[tokio::test]
async fn cards_can_need_a_key() {
    let server = common::TestServer::start_with(|c| {
        c.api_keys = vec![KEY_A.into()];
        c.a2a.public_cards = false;
    })
    .await;
    let http = reqwest::Client::new();
    for path in [
        "/.well-known/agent-card.json",
        "/a2a/agent/.well-known/agent-card.json",
    ] {
        let anonymous = http.get(server.url(path)).send().await.unwrap();
        assert_eq!(anonymous.status(), 401, "{path}");
        let keyed = http
            .get(server.url(path))
            .bearer_auth(KEY_A)
            .send()
            .await
            .unwrap();
        assert_eq!(keyed.status(), 200, "{path}");
    }
    let missing = http
        .get(server.url("/a2a/nobody/.well-known/agent-card.json"))
        .bearer_auth(KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    server.stop().await;
}

/// Two keys name one new context at once: one gets it, the other a "not
/// found" as if it did not exist, never an internal error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_raced_by_two_keys_is_one_keys_and_not_found_for_the_other() {
    let server = common::TestServer::start_with(|c| {
        c.api_keys = vec![KEY_A.into(), KEY_B.into()];
    })
    .await;
    let http = reqwest::Client::new();
    let send = |key: &'static str, context: String| {
        let request = http
            .post(server.url("/a2a/agent"))
            .bearer_auth(key)
            .header("A2A-Version", "1.0")
            .json(
                &serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                "params": {
                    "message": {"messageId": uuid::Uuid::new_v4().to_string(),
                                "role": "ROLE_USER", "contextId": context,
                                "parts": [{"text": "hello"}]},
                    "configuration": {"returnImmediately": true}}}),
            );
        async move {
            let answered: serde_json::Value = request.send().await.unwrap().json().await.unwrap();
            answered
        }
    };
    for _ in 0..10 {
        let context = uuid::Uuid::new_v4().to_string();
        let (a, b) = tokio::join!(send(KEY_A, context.clone()), send(KEY_B, context));
        let won = [&a, &b]
            .iter()
            .filter(|answer| answer.get("result").is_some())
            .count();
        assert_eq!(won, 1, "{a}\n{b}");
        let lost = if a.get("result").is_some() { &b } else { &a };
        assert_eq!(lost["error"]["code"], -32001, "{lost}");
    }
    server.stop().await;
}
