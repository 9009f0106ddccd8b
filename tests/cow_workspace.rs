//! Copy-on-write workspaces through the server, on the local and docker
//! backends as root (as CI runs): a fork mounts its source's layers rather than
//! copying them and writes apart from it and its siblings; a snapshot a
//! live session uses can be deleted without breaking it; a restarted
//! server keeps every kept snapshot of a chain usable.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "approvals/script.rs"]
#[allow(dead_code)]
mod script;
#[path = "providers/upstream.rs"]
#[allow(dead_code)]
mod upstream;

use std::path::{Path, PathBuf};

use common::TestServer;
use conclave::config::{Config, SandboxBackendKind};
use conclave::server::Tools;
use script::{bash, capable, says};
use serde_json::{Value, json};
use upstream::{Reply, Upstream};

fn shell_turn(id: &str, command: &str) -> Vec<Reply> {
    vec![bash(id, command), says("Done.")]
}

fn on(kind: SandboxBackendKind, url: String) -> impl FnOnce(&mut Config) {
    move |c: &mut Config| {
        capable(c, &url);
        c.sandbox.backend = kind;
        c.sandbox.warm_pool = 0;
    }
}

async fn start(upstream: &Upstream, dir: &Path, kind: SandboxBackendKind) -> TestServer {
    TestServer::start_with_tools(dir, Tools::Sandboxed, on(kind, upstream.url.clone())).await
}

/// Each test on both backends.
macro_rules! on_both {
    ($($test:ident),* $(,)?) => {
        mod local {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(conclave::config::SandboxBackendKind::Local).await
                }
            )*
        }
        mod docker {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(conclave::config::SandboxBackendKind::Docker).await
                }
            )*
        }
    };
}

on_both!(
    a_fork_mounts_its_sources_layers_and_writes_apart,
    a_snapshot_a_live_session_uses_is_deleted_without_breaking_it,
    a_restarted_server_keeps_every_kept_snapshot_of_a_chain,
);

async fn session(server: &TestServer, body: Value) -> String {
    let mut body = body;
    body["model"] = json!("capable");
    server.create_session(body).await
}

/// What the turn's one shell call printed (its result checked).
async fn run(server: &TestServer, id: &str, prompt: &str) -> (Vec<Value>, String) {
    let events = server.turn(id, prompt).await;
    let last = events.last().unwrap();
    assert_eq!(last["status"], "success", "{events:?}");
    let result = events
        .iter()
        .find(|e| e["type"] == "tool_result")
        .unwrap_or_else(|| panic!("no tool result: {events:?}"));
    let text = match &result["output"] {
        Value::String(text) => text.clone(),
        other => other["stdout"].as_str().unwrap_or_default().to_string(),
    };
    (events, text)
}

/// The layers of the server's layer store, and the tar files beside it.
fn stored(data_dir: &Path) -> (Vec<String>, usize) {
    let names = |dir: PathBuf| -> Vec<String> {
        std::fs::read_dir(dir)
            .map(|l| {
                l.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let layers = names(data_dir.join("snapshots/layers"))
        .into_iter()
        .filter(|n| n.len() == 32)
        .collect();
    let tars = names(data_dir.join("snapshots"))
        .iter()
        .filter(|n| n.ends_with(".tar"))
        .count();
    (layers, tars)
}

/// Waits for the session's turn-end snapshots (the list waits for them).
async fn settled(server: &TestServer, id: &str) {
    server
        .get_json(&format!("/agent/session/{id}/snapshots"))
        .await;
}

fn mounts_naming(layer: &str) -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|line| line.contains(layer))
        .count()
}

fn layered() -> bool {
    conclave::sandbox::layers::supported()
}

async fn a_fork_mounts_its_sources_layers_and_writes_apart(kind: SandboxBackendKind) {
    assert!(
        layered(),
        "copy-on-write workspaces need root and overlayfs; the tests run as root"
    );
    let mut replies = shell_turn(
        "w",
        "mkdir data && for i in $(seq 200); do echo $i > data/f$i; done && echo base > base.txt",
    );
    replies.extend(shell_turn(
        "a",
        "echo mine > data/f1 && echo a > only-a.txt && rm base.txt && ls",
    ));
    replies.extend(shell_turn("b", "cat data/f1 base.txt && ls"));
    replies.extend(shell_turn("s", "cat data/f1 base.txt && ls"));
    let upstream = Upstream::start(replies).await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(&upstream, dir.path(), kind).await;
    let id = session(&server, json!({})).await;
    run(&server, &id, "write").await;
    settled(&server, &id).await;
    let (layers, tars) = stored(dir.path());
    assert_eq!(
        (layers.len(), tars),
        (1, 0),
        "one layer, no tar: {layers:?}"
    );
    let source_layer = layers[0].clone();

    let forked = server
        .post(&format!("/agent/session/{id}/fork"), json!({"count": 2}))
        .await;
    assert_eq!(forked.status(), 201);
    let forked: Value = forked.json().await.unwrap();
    let ids: Vec<String> = forked["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap().to_string())
        .collect();
    let (_, a) = run(&server, &ids[0], "change").await;
    assert!(a.contains("only-a.txt") && !a.contains("base.txt"), "{a}");
    let (_, b) = run(&server, &ids[1], "look").await;
    assert!(b.starts_with("1\nbase\n") && !b.contains("only-a"), "{b}");
    let (_, s) = run(&server, &id, "look").await;
    assert!(s.starts_with("1\nbase\n") && !s.contains("only-a"), "{s}");

    // Both forks mounted the source's layer (each one's overlay names
    // it): no copy of it was made, only fork A's change became a layer.
    for session in ids.iter().chain([&id]) {
        settled(&server, session).await;
    }
    assert!(mounts_naming(&source_layer) >= 2, "{source_layer}");
    let (layers, tars) = stored(dir.path());
    assert_eq!((layers.len(), tars), (2, 0), "{layers:?}");
    server.stop_and_remove_sandboxes().await;
}

async fn a_snapshot_a_live_session_uses_is_deleted_without_breaking_it(kind: SandboxBackendKind) {
    assert!(
        layered(),
        "copy-on-write workspaces need root and overlayfs; the tests run as root"
    );
    let mut replies = shell_turn("w", "echo kept > kept.txt");
    replies.extend(shell_turn("r", "cat kept.txt"));
    replies.extend(shell_turn("again", "cat kept.txt && echo more > more.txt"));
    let upstream = Upstream::start(replies).await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(&upstream, dir.path(), kind).await;
    let id = session(&server, json!({})).await;
    run(&server, &id, "write").await;
    let named = server
        .post("/sandboxes/snapshots", json!({"session_id": id}))
        .await;
    assert_eq!(named.status(), 201);
    let named: Value = named.json().await.unwrap();
    let snapshot = named["snapshot_id"].as_str().unwrap().to_string();
    let user = session(&server, json!({"sandbox": {"from_snapshot": snapshot}})).await;
    let (_, out) = run(&server, &user, "read").await;
    assert_eq!(out.trim(), "kept");

    // The source and the snapshot go; the session that uses it runs on.
    let delete = |path: String| {
        let request = server.http.delete(server.url(&path));
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(delete(format!("/agent/session/{id}")).await, 200);
    assert_eq!(
        delete(format!("/sandboxes/snapshots/{snapshot}")).await,
        204
    );
    settled(&server, &user).await;
    let (layers, _) = stored(dir.path());
    assert_eq!(layers.len(), 1, "its layer stays while the session uses it");
    let (_, out) = run(&server, &user, "again").await;
    assert_eq!(out.trim(), "kept");
    // Gone with the last session that used it.
    assert_eq!(delete(format!("/agent/session/{user}")).await, 200);
    let (layers, tars) = stored(dir.path());
    assert_eq!((layers.len(), tars), (0, 0), "{layers:?}");
    server.stop_and_remove_sandboxes().await;
}

async fn a_restarted_server_keeps_every_kept_snapshot_of_a_chain(kind: SandboxBackendKind) {
    assert!(
        layered(),
        "copy-on-write workspaces need root and overlayfs; the tests run as root"
    );
    let mut replies = shell_turn("1", "echo one > one.txt");
    replies.extend(shell_turn("2", "echo two > two.txt"));
    replies.extend(shell_turn("3", "rm one.txt && echo three > three.txt"));
    replies.extend(shell_turn("f2", "ls"));
    replies.extend(shell_turn("f3", "ls"));
    replies.extend(shell_turn("s", "ls && cat two.txt"));
    let upstream = Upstream::start(replies).await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(&upstream, dir.path(), kind).await;
    let id = session(&server, json!({"max_turns": 9})).await;
    let mut ends = Vec::new();
    for prompt in ["one", "two", "three"] {
        let (events, _) = run(&server, &id, prompt).await;
        ends.push(events.last().unwrap()["seq"].as_u64().unwrap());
    }
    server.stop().await;

    let server = start(&upstream, dir.path(), kind).await;
    let mut listings = Vec::new();
    for at in [ends[1], ends[2]] {
        let forked = server
            .post(&format!("/agent/session/{id}/fork"), json!({"at_seq": at}))
            .await;
        assert_eq!(forked.status(), 201);
        let forked: Value = forked.json().await.unwrap();
        let fork = forked["sessions"][0]["session_id"]
            .as_str()
            .unwrap()
            .to_string();
        listings.push(run(&server, &fork, "look").await.1);
    }
    assert_eq!(listings[0], "one.txt\ntwo.txt\n");
    assert_eq!(listings[1], "three.txt\ntwo.txt\n");
    let (_, own) = run(&server, &id, "on").await;
    assert_eq!(own, "three.txt\ntwo.txt\ntwo\n");
    server.stop_and_remove_sandboxes().await;
}
