//! Secrets in a sandbox's environment (`options.sandbox.env`), as the real
//! binary serves them on docker and on local sandboxes: a secret from the
//! environment (`CONCLAVE_SECRETS__TOKEN`) and one of a key's own
//! (`[keys.alice.secrets]`) reach every command, and their values never
//! reach the tool results, the event log, the status, the model's next
//! request nor the server's log: `echo $TOKEN`, `echo $TOKEN | base64`,
//! Python's `print(os.environ)` and output streamed while a command runs
//! all show `[secret NAME]`. Another key's secret, or one nobody has, is a
//! 422 naming the variable.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "providers/upstream.rs"]
#[allow(dead_code)]
mod upstream;

use common::binary::{
    drain_stderr, get_keyed, keyed_turn, send_keyed as send, serve_command, spawn_server, stop,
    tool_results,
};
use serde_json::json;
use upstream::{Reply, Upstream, says, tool_call};

const TOKEN: &str = "ghp_s3cr3tT0kenValue1234";
const OWN: &str = "alice-own+secret/42";
const ALICE: &str = "alice-key-0001";
const BOB: &str = "bob-key-00002";

fn bash(id: &str, command: &str) -> Reply {
    tool_call(id, "Bash", json!({"command": command}))
}

fn config(upstream: &Upstream) -> String {
    format!(
        r#"
[keys.alice]
key = "{ALICE}"
[keys.alice.secrets]
own = "{OWN}"

[keys.bob]
key = "{BOB}"

[models.capable]
provider = "openai"
model = "capable-model"
base_url = "{}/v1"
"#,
        upstream.url
    )
}

async fn secrets_stay_out_of_everything(backend: &[&str]) {
    let upstream = Upstream::start(vec![
        bash("c1", "echo $TOKEN; echo $PLAIN; echo $TOKEN > token.txt"),
        bash("c2", "echo $TOKEN | base64"),
        bash("c3", "python3 -c 'import os; print(os.environ)'"),
        // Printed while it runs: reported before the call ends.
        bash(
            "c4",
            "for i in 1 2 3; do printf '%s' \"$OWN\"; sleep 0.7; done; echo",
        ),
        says("done"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("conclave.toml"), config(&upstream)).unwrap();
    let mut args = vec!["--config", "conclave.toml"];
    args.extend_from_slice(backend);
    let mut command = serve_command(&args);
    command
        .current_dir(dir.path())
        .env("CONCLAVE_SECRETS__TOKEN", TOKEN)
        .env("RUST_LOG", "info");
    let (mut child, base) = spawn_server(&mut command).await;
    let log = drain_stderr(&mut child);
    let env =
        json!({"TOKEN": {"secret": "TOKEN"}, "OWN": {"secret": "OWN"}, "PLAIN": "plain-value"});
    let post = reqwest::Method::POST;

    // Bob has no secret OWN, and nobody has NOPE.
    let (status, body) = send(
        BOB,
        post.clone(),
        format!("{base}/agent/session"),
        Some(json!({"model": "capable", "sandbox": {"env": env}})),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("options.sandbox.env.OWN"), "{body}");
    let (status, body) = send(ALICE, post.clone(), format!("{base}/agent/run"),
        Some(json!({"prompt": "x", "model": "capable", "sandbox": {"env": {"X": {"secret": "NOPE"}}}}))).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("options.sandbox.env.X") && body.contains("NOPE"),
        "{body}"
    );
    let (status, body) = send(
        ALICE,
        post.clone(),
        format!("{base}/agent/session"),
        Some(json!({"model": "capable", "sandbox": {"env": {"1BAD": "x"}}})),
    )
    .await;
    assert_eq!(status, 422, "{body}");

    let create = json!({"model": "capable", "max_turns": 10, "sandbox": {"env": env}});
    let (id, turn, events) = keyed_turn(ALICE, &base, create, "use the token").await;
    let results = tool_results(&events);
    assert_eq!(results.len(), 4, "{turn}");
    assert!(
        results[0].contains("[secret TOKEN]") && results[0].contains("plain-value"),
        "{}",
        results[0]
    );
    assert!(results[1].contains("[secret TOKEN]"), "{}", results[1]);
    assert!(
        results[2].contains("'TOKEN': '[secret TOKEN]'"),
        "{}",
        results[2]
    );
    assert!(
        results[2].contains("'OWN': '[secret OWN]'"),
        "{}",
        results[2]
    );
    assert!(
        results[3].contains("[secret OWN][secret OWN][secret OWN]"),
        "{}",
        results[3]
    );
    let streamed: String = events
        .iter()
        .filter(|e| e["type"] == "tool_output")
        .map(|e| e["content"].as_str().unwrap_or_default())
        .collect();
    assert!(
        streamed.contains("[secret OWN]"),
        "no output streamed: {turn}"
    );
    assert_eq!(events.last().unwrap()["type"], "result", "{turn}");

    let (_, log_events) = get_keyed(ALICE, format!("{base}/agent/session/{id}/events")).await;
    let (_, status_body) = get_keyed(ALICE, format!("{base}/agent/session/{id}/status")).await;
    assert!(log_events.contains("[secret TOKEN]"), "{log_events}");
    // The turn's diff, which the dashboard shows, is scrubbed too; the
    // workspace keeps what the command wrote, for its own key to take.
    let changes = format!("{base}/agent/session/{id}/changes?format=patch");
    let (status, patch) = get_keyed(ALICE, changes).await;
    assert_eq!(status, 200, "{patch}");
    assert!(patch.contains("+[secret TOKEN]"), "{patch}");
    let written = format!("{base}/agent/session/{id}/files/token.txt");
    assert_eq!(get_keyed(ALICE, written).await.1, format!("{TOKEN}\n"));
    // The model's requests after each call carry the scrubbed results.
    let requests: Vec<String> = upstream
        .requests()
        .iter()
        .map(|r| r.body.to_string())
        .collect();
    assert_eq!(requests.len(), 5);
    assert!(requests[1].contains("[secret TOKEN]"), "{}", requests[1]);
    stop(&mut child).await;
    let log = log.await.unwrap();
    let encoded = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(format!("{TOKEN}\n"))
    };
    for (what, text) in [
        ("the turn", &turn),
        ("the event log", &log_events),
        ("the status", &status_body),
        ("the turn's diff", &patch),
        ("the server's log", &log),
    ]
    .into_iter()
    .chain(requests.iter().map(|r| ("a model request", r)))
    {
        for secret in [TOKEN, OWN, &encoded[..20], "alice-own%2Bsecret"] {
            assert!(!text.contains(secret), "{what} shows {secret}: {text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_docker_secrets_reach_commands_and_nothing_else() {
    secrets_stay_out_of_everything(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_local_secrets_reach_commands_and_nothing_else() {
    secrets_stay_out_of_everything(&["--sandbox", "local"]).await;
}
