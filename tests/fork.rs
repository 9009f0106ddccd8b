//! Forks and workspace snapshots on real sandboxes (docker and local), with
//! a scripted capable model: a fork after turn 2 of 3 has turns 1–2's
//! history and files and runs on; eight forks are independent; another
//! key cannot fork; a seq inside a turn is refused; retention; a session
//! started `from_snapshot`; deleting a session cleans its snapshots.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "approvals/script.rs"]
#[allow(dead_code)]
mod script;
#[path = "providers/upstream.rs"]
#[allow(dead_code)]
mod upstream;

use common::TestServer;
use conclave::config::{Config, SandboxBackendKind};
use script::{bash, capable, says};
use serde_json::{Value, json};
use upstream::{Reply, Upstream};

/// One writing turn: a shell call, then a closing answer.
fn shell_turn(id: &str, command: &str) -> Vec<Reply> {
    vec![bash(id, command), says("Done.")]
}

async fn server(
    upstream: &Upstream,
    backend: SandboxBackendKind,
    more: impl FnOnce(&mut Config),
) -> TestServer {
    let url = upstream.url.clone();
    TestServer::start_sandboxed(move |c| {
        capable(c, &url);
        c.sandbox.backend = backend;
        c.sandbox.warm_pool = 0;
        more(c);
    })
    .await
}

async fn session(server: &TestServer) -> String {
    server
        .create_session(json!({"model": "capable", "max_turns": 5}))
        .await
}

/// The `result` of a turn (its events read to the end).
async fn turn(server: &TestServer, id: &str, prompt: &str) -> Vec<Value> {
    let events = server.turn(id, prompt).await;
    let last = events.last().unwrap();
    assert_eq!(last["type"], "result", "{events:?}");
    assert_eq!(last["status"], "success", "{events:?}");
    events
}

/// What the turn's one shell call printed.
fn printed(events: &[Value]) -> String {
    let result = events
        .iter()
        .find(|e| e["type"] == "tool_result")
        .unwrap_or_else(|| panic!("no tool result: {events:?}"));
    match &result["output"] {
        Value::String(text) => text.clone(),
        other => other["stdout"].as_str().unwrap_or_default().to_string(),
    }
}

/// The user messages of a history.
fn users(history: &Value) -> Vec<&str> {
    history
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap())
        .collect()
}

async fn fork(server: &TestServer, id: &str, body: Value) -> (u16, Value) {
    let response = server
        .post(&format!("/agent/session/{id}/fork"), body)
        .await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// Turns end after their snapshot: the snapshot list shows them all.
async fn snapshots(server: &TestServer, id: &str) -> Value {
    server
        .get_json(&format!("/agent/session/{id}/snapshots"))
        .await
}

async fn delete(server: &TestServer, path: &str) -> u16 {
    let response = server.http.delete(server.url(path)).send().await.unwrap();
    response.status().as_u16()
}

async fn fork_after_turn_two_of_three(backend: SandboxBackendKind) {
    let mut replies = Vec::new();
    replies.extend(shell_turn("a", "echo one > /workspace/one.txt"));
    replies.extend(shell_turn("b", "echo two > /workspace/two.txt"));
    replies.extend(shell_turn("c", "echo three > /workspace/three.txt"));
    replies.extend(shell_turn("d", "ls /workspace && cat /workspace/two.txt"));
    replies.extend(shell_turn("e", "ls /workspace"));
    let upstream = Upstream::start(replies).await;
    let server = server(&upstream, backend, |_| {}).await;
    let id = session(&server).await;
    turn(&server, &id, "first").await;
    let second = turn(&server, &id, "second").await;
    let second_end = second.last().unwrap()["seq"].as_u64().unwrap();
    let third = turn(&server, &id, "third").await;
    let inside = third[1]["seq"].as_u64().unwrap();

    // A seq inside turn 3 is refused with the turn ends.
    let (status, body) = fork(&server, &id, json!({"at_seq": inside})).await;
    assert_eq!(status, 409, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(&second_end.to_string()), "{message}");
    assert_eq!(body["error"]["code"], "inside_turn");

    let (status, forked) = fork(
        &server,
        &id,
        json!({"at_seq": second_end, "session_name": "branch"}),
    )
    .await;
    assert_eq!(status, 201, "{forked}");
    assert_eq!(forked["at_seq"], second_end);
    assert!(forked["from_snapshot"].is_string(), "{forked}");
    let fork_id = forked["sessions"][0]["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(forked["sessions"][0]["session_name"], "branch");

    // History: turns 1–2 only.
    let status = server.status(&fork_id).await;
    assert_eq!(users(&status["history"]), ["first", "second"], "{status}");
    let events = common::ndjson(
        server
            .get(&format!("/agent/session/{fork_id}/events?since=0"))
            .await,
    )
    .await;
    assert_eq!(events[0]["type"], "forked", "{events:?}");
    assert_eq!(events[0]["from_session"], id.as_str());
    assert_eq!(events[0]["at_seq"], second_end);
    assert_eq!(
        events[0]["history_len"],
        status["history"].as_array().unwrap().len()
    );

    // Its workspace holds turn 2's files, not turn 3's, and it runs on.
    let next = turn(&server, &fork_id, "look").await;
    let listing = printed(&next);
    assert!(
        listing.contains("one.txt") && listing.contains("two.txt"),
        "{listing}"
    );
    assert!(!listing.contains("three.txt"), "{listing}");
    assert!(listing.contains("two\n"), "{listing}");
    // The model saw the forked history before the new prompt.
    let asked = upstream.requests();
    assert_eq!(
        users(&asked[6].body["messages"]),
        ["first", "second", "look"]
    );

    // The source is unchanged.
    let source = turn(&server, &id, "source").await;
    assert!(printed(&source).contains("three.txt"));
    server.stop_and_remove_sandboxes().await;
}

async fn eight_forks_are_independent(backend: SandboxBackendKind) {
    let mut replies = shell_turn("w", "echo base > /workspace/base.txt");
    for i in 0..8 {
        replies.extend(shell_turn(
            &format!("f{i}"),
            &format!("echo {i} > /workspace/mine-{i}.txt && ls /workspace"),
        ));
    }
    replies.extend(shell_turn("s", "ls /workspace"));
    let upstream = Upstream::start(replies).await;
    let server = server(&upstream, backend, |_| {}).await;
    let id = session(&server).await;
    turn(&server, &id, "base").await;
    let (status, forked) = fork(&server, &id, json!({"count": 8, "session_name": "roll"})).await;
    assert_eq!(status, 201, "{forked}");
    let forks = forked["sessions"].as_array().unwrap();
    assert_eq!(forks.len(), 8);
    assert_eq!(forks[7]["session_name"], "roll #8");
    // None started a sandbox yet: they start at their first call.
    let listed = server.get_json("/sandboxes").await;
    assert_eq!(listed["sandboxes"].as_array().unwrap().len(), 1, "{listed}");
    for (i, fork) in forks.iter().enumerate() {
        let events = turn(&server, fork["session_id"].as_str().unwrap(), "write").await;
        let listing = printed(&events);
        assert!(listing.contains("base.txt"), "{listing}");
        let mine: Vec<&str> = listing.lines().filter(|l| l.starts_with("mine-")).collect();
        assert_eq!(
            mine,
            [format!("mine-{i}.txt")],
            "fork {i} sees only its own file: {listing}"
        );
    }
    let source = turn(&server, &id, "after").await;
    assert!(!printed(&source).contains("mine-"), "{source:?}");
    // Too many is refused, naming the cap.
    let (status, body) = fork(&server, &id, json!({"count": 65})).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("agent.max_forks")
    );
    server.stop_and_remove_sandboxes().await;
}

async fn retention_named_snapshots_and_delete(backend: SandboxBackendKind) {
    let mut replies = Vec::new();
    for i in 1..=3 {
        replies.extend(shell_turn(
            &format!("t{i}"),
            &format!("echo {i} > /workspace/t{i}.txt"),
        ));
    }
    replies.extend(shell_turn("n", "ls /workspace"));
    let upstream = Upstream::start(replies).await;
    let server = server(&upstream, backend, |c| c.sandbox.snapshots.keep_last = 2).await;
    let id = session(&server).await;
    let first = turn(&server, &id, "1").await;
    let first_end = first.last().unwrap()["seq"].as_u64().unwrap();
    turn(&server, &id, "2").await;
    turn(&server, &id, "3").await;
    let kept = snapshots(&server, &id).await;
    let list = kept["snapshots"].as_array().unwrap();
    assert_eq!(kept["keep_last"], 2);
    let turns: usize = list
        .iter()
        .map(|s| s["turns"].as_array().unwrap().len())
        .sum();
    assert_eq!(turns, 2, "{kept}");
    assert!(
        list.iter().all(|s| s["size_bytes"].as_u64().unwrap() > 0),
        "{kept}"
    );
    let (status, body) = fork(&server, &id, json!({"at_seq": first_end})).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "snapshot_dropped");

    // Named, it starts a new session; another key cannot name or use it.
    let response = server
        .post("/sandboxes/snapshots", json!({"session_id": id}))
        .await;
    assert_eq!(response.status(), 201);
    let named: Value = response.json().await.unwrap();
    let snapshot = named["snapshot_id"].as_str().unwrap().to_string();
    assert_eq!(named["named"], true);
    let fresh = server
        .create_session(json!({"model": "capable", "sandbox": {"from_snapshot": snapshot}}))
        .await;
    let events = turn(&server, &fresh, "look").await;
    let listing = printed(&events);
    assert!(
        listing.contains("t3.txt") && listing.contains("t2.txt"),
        "{listing}"
    );

    // Deleting the session keeps the named snapshot, which the new
    // session also uses (beside its own turn end's); un-naming it and
    // deleting the new session removes them all. A tar file is one
    // snapshot; layers (local sandboxes as root) are one per turn that
    // changed the workspace, shared by the snapshots whose chains hold
    // them: the three turns' layers stay while any chain holds them.
    let layered = server.data_dir.join("snapshots/layers").exists();
    let files = || {
        let count = |dir: &str| {
            std::fs::read_dir(server.data_dir.join(dir))
                .map(|listing| {
                    listing
                        .flatten()
                        .filter(|e| !e.file_name().to_string_lossy().ends_with(".size"))
                        .filter(|e| e.file_name() != "layers")
                        .count()
                })
                .unwrap_or(0)
        };
        count("snapshots") + count("snapshots/layers")
    };
    let expect = |tars: usize, layers: usize| if layered { layers } else { tars };
    let own = snapshots(&server, &fresh).await;
    assert_eq!(own["snapshots"].as_array().unwrap().len(), 1, "{own}");
    assert_eq!(
        files(),
        expect(3, 3),
        "two kept turn ends of the source, one of the new session"
    );
    assert_eq!(delete(&server, &format!("/agent/session/{id}")).await, 200);
    assert_eq!(files(), expect(2, 3), "the named one stays");
    assert_eq!(
        delete(&server, &format!("/sandboxes/snapshots/{snapshot}")).await,
        204
    );
    assert_eq!(
        delete(&server, &format!("/sandboxes/snapshots/{snapshot}")).await,
        404
    );
    assert_eq!(files(), expect(2, 3), "the new session still uses it");
    assert_eq!(
        delete(&server, &format!("/agent/session/{fresh}")).await,
        200
    );
    assert_eq!(files(), 0);
    server.stop_and_remove_sandboxes().await;
}

macro_rules! suite {
    ($backend:ident, $kind:expr; $($test:ident),* $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test($kind).await;
                }
            )*
        }
    };
}

suite!(docker, super::SandboxBackendKind::Docker;
    fork_after_turn_two_of_three,
    eight_forks_are_independent,
    retention_named_snapshots_and_delete,
);

suite!(local, super::SandboxBackendKind::Local;
    fork_after_turn_two_of_three,
    eight_forks_are_independent,
    retention_named_snapshots_and_delete,
);

const OWNER: &str = "owner-key";
const OTHER: &str = "other-key";

/// Only the source's key forks it; another key's fork is a 404 and it
/// cannot start a session from the source's snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_key_cannot_fork_or_use_a_snapshot() {
    let upstream = Upstream::start(shell_turn("a", "echo mine > /workspace/mine.txt")).await;
    let server = server(&upstream, SandboxBackendKind::Docker, |c| {
        c.api_keys = vec![OWNER.into(), OTHER.into()];
    })
    .await;
    let as_key = |key: &str, method: reqwest::Method, path: &str, body: Option<Value>| {
        server.send_as(key, method, path, body)
    };
    let created: Value = as_key(
        OWNER,
        reqwest::Method::POST,
        "/agent/session",
        Some(json!({"model": "capable"})),
    )
    .await
    .json()
    .await
    .unwrap();
    let id = created["session_id"].as_str().unwrap().to_string();
    let events = common::ndjson(
        as_key(
            OWNER,
            reqwest::Method::POST,
            &format!("/agent/session/{id}/message"),
            Some(json!({"prompt": "write"})),
        )
        .await,
    )
    .await;
    assert_eq!(events.last().unwrap()["status"], "success", "{events:?}");
    let fork_path = format!("/agent/session/{id}/fork");
    let refused = as_key(OTHER, reqwest::Method::POST, &fork_path, Some(json!({}))).await;
    assert_eq!(refused.status(), 404);
    let listed = as_key(
        OTHER,
        reqwest::Method::GET,
        &format!("/agent/session/{id}/snapshots"),
        None,
    )
    .await;
    assert_eq!(listed.status(), 404);
    let named = as_key(
        OTHER,
        reqwest::Method::POST,
        "/sandboxes/snapshots",
        Some(json!({"session_id": id})),
    )
    .await;
    assert_eq!(named.status(), 404);
    let forked: Value = as_key(OWNER, reqwest::Method::POST, &fork_path, Some(json!({})))
        .await
        .json()
        .await
        .unwrap();
    let snapshot = forked["from_snapshot"].as_str().unwrap().to_string();
    let stolen = as_key(
        OTHER,
        reqwest::Method::POST,
        "/agent/session",
        Some(json!({"model": "capable", "sandbox": {"from_snapshot": snapshot}})),
    )
    .await;
    assert_eq!(stolen.status(), 422);
    let body: Value = stolen.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("options.sandbox.from_snapshot"),
        "{body}"
    );
    server.stop_and_remove_sandboxes().await;
}

/// The real binary as the README starts it (a fresh data directory, its
/// default sandbox backend, a config naming the model): a fork at turn 1
/// of 2 over plain HTTP has turn 1's files only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_forks_a_session_with_its_workspace() {
    use common::binary::{serve_command, spawn_server, stop};
    let mut replies = shell_turn("a", "echo 1 > /workspace/first.txt");
    replies.extend(shell_turn("b", "echo 2 > /workspace/second.txt"));
    replies.extend(shell_turn("c", "ls /workspace"));
    let upstream = Upstream::start(replies).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("conclave.toml");
    std::fs::write(
        &config,
        format!(
            "[models.capable]\nprovider = \"openai\"\nmodel = \"capable-model\"\nbase_url = \"{}/v1\"\n",
            upstream.url
        ),
    )
    .unwrap();
    let data = dir.path().join("data");
    let mut command = serve_command(&[]);
    command
        .current_dir(dir.path())
        .arg("--data-dir")
        .arg(&data)
        .arg("--config")
        .arg(&config);
    let (mut child, url) = spawn_server(&mut command).await;
    let http = reqwest::Client::new();
    let post = |path: String, body: Value| {
        let request = http.post(format!("{url}{path}")).json(&body);
        async move { request.send().await.unwrap() }
    };
    let created: Value = post("/agent/session".into(), json!({"model": "capable"}))
        .await
        .json()
        .await
        .unwrap();
    let id = created["session_id"].as_str().unwrap().to_string();
    let message = format!("/agent/session/{id}/message");
    let first = common::ndjson(post(message.clone(), json!({"prompt": "one"})).await).await;
    let first_end = first.last().unwrap()["seq"].as_u64().unwrap();
    common::ndjson(post(message, json!({"prompt": "two"})).await).await;
    let response = post(
        format!("/agent/session/{id}/fork"),
        json!({"at_seq": first_end}),
    )
    .await;
    assert_eq!(response.status(), 201);
    let forked: Value = response.json().await.unwrap();
    let fork_id = forked["sessions"][0]["session_id"].as_str().unwrap();
    let events = common::ndjson(
        post(
            format!("/agent/session/{fork_id}/message"),
            json!({"prompt": "look"}),
        )
        .await,
    )
    .await;
    let listing = printed(&events);
    assert!(listing.contains("first.txt"), "{listing}");
    assert!(!listing.contains("second.txt"), "{listing}");
    stop(&mut child).await;
    common::remove_sandboxes_of(&data).await;
}
