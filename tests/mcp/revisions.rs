//! The 2026-07-28 revision of MCP beside 2025-11-25, with the official
//! Python SDK (`tests/mcp/stateless.py`): `server/discover`, a sandbox
//! tool's output as progress, the scratch sandbox a call without
//! `session_id` is handed by id (kept for the key that got it, at most
//! eight per key), `run_agent`'s approval as an `input_required` result
//! answered with the elicitation form, and `subscriptions/listen` for a
//! session's events; the handshake of today's IDEs keeps one scratch
//! sandbox per connection.

use serde_json::json;

use super::common::{self, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_2026_07_28_revision_beside_2025_11_25() {
    let server = TestServer::start_sandboxed(|config| {
        config.api_keys = vec!["ide-key-1".into(), "other-key-2".into()];
        config.admin_keys = vec!["admin-key-3".into()];
    })
    .await;
    let url = server.url("/mcp");
    let seen = common::python_json(
        "tests/mcp/stateless.py",
        &[&url, "ide-key-1", "other-key-2", "admin-key-3"],
        "the mcp package",
    )
    .await;
    assert_eq!(seen["version"], "2026-07-28", "{seen}");
    assert_eq!(seen["server"], "conclave-sandbox");
    assert_eq!(seen["legacy_version"], "2025-11-25");
    // The command's lines came as progress before its result.
    let progress: Vec<&str> = seen["progress"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    assert!(progress.iter().any(|m| m.contains("line1")), "{progress:?}");
    // The first call was handed a scratch sandbox; the handle reaches it.
    let first = &seen["first"];
    let handle = first["handle"]
        .as_str()
        .expect("the result names its sandbox");
    assert!(
        first["texts"][1]
            .as_str()
            .unwrap()
            .contains(&format!("pass session_id \"{handle}\"")),
        "{first}"
    );
    assert_eq!(seen["again"]["stdout"], "kept\n");
    assert_eq!(seen["again"]["handle"], json!(null));
    // A call without it gets another, empty one.
    assert_eq!(seen["fresh"]["stdout"], "none\n");
    assert_ne!(seen["fresh"]["handle"].as_str(), Some(handle));
    // Another key's call with the handle finds nothing.
    assert_eq!(seen["stolen"]["is_error"], true);
    assert_eq!(
        seen["stolen"]["texts"][0],
        format!("unknown session '{handle}'")
    );
    // Past eight handles, the least recently used went.
    assert_eq!(seen["evicted"]["is_error"], true, "{}", seen["evicted"]);
    assert_eq!(
        seen["evicted"]["texts"][0],
        format!("unknown session '{handle}'")
    );
    // The call the client gave up on left no scratch sandbox and took no
    // handle's place: the eight handles' sandboxes, before and after.
    assert_eq!(
        seen["scratch_before"].as_array().unwrap().len(),
        8,
        "{seen}"
    );
    assert_eq!(seen["scratch_after_cancel"], seen["scratch_before"]);
    // The approval came as the form of an input_required result, and the
    // turn went on with the answer.
    let elicitations = seen["elicitations"].as_array().unwrap();
    assert_eq!(elicitations.len(), 1, "{seen}");
    assert!(
        elicitations[0]
            .as_str()
            .unwrap()
            .contains("The agent wants to run mcp__sandbox__execute_code")
    );
    let ran = &seen["run_agent"];
    let session = ran["structured"]["session_id"].as_str().unwrap();
    // Another key's retry naming the session was refused, and its deny
    // decided nothing.
    assert_eq!(
        seen["forged_retry"],
        json!({"is_error": true, "text": format!("session '{session}' not found")})
    );
    assert_eq!(ran["is_error"], false, "{ran}");
    assert_eq!(ran["structured"]["status"], "success");
    assert!(
        ran["structured"]["result"]
            .as_str()
            .unwrap()
            .contains("approved 42"),
        "{ran}"
    );
    assert!(
        progress.contains(&"call toolu_demo_1_1 allowed by user: go ahead"),
        "{progress:?}"
    );
    // The listen stream was acknowledged for the events and told of the
    // next turn.
    let events = format!("conclave://sessions/{session}/events");
    assert_eq!(seen["honored"], json!([events.clone()]));
    assert_eq!(seen["updated"], events);
    // Another key's listen for the session was acknowledged and told of
    // nothing.
    assert_eq!(seen["spy_honored"], json!([events.clone()]));
    assert_eq!(seen["spied"], json!([]), "{seen}");
    // Today's handshake: one scratch sandbox for the connection.
    assert_eq!(seen["legacy"]["stdout"], "mine\n");
    assert_eq!(seen["legacy"]["handle"], json!(null));
    server.stop_and_remove_sandboxes().await;
}

/// A stdio client of 2026-07-28 through `conclave mcp --server URL`: the
/// relay's results carry the revision's `resultType`, and its one session
/// with the server keeps the process's scratch sandbox between calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stdio_relay_serves_2026_07_28() {
    let server = TestServer::start_sandboxed(|config| {
        config.api_keys = vec!["ide-key-1".into()];
    })
    .await;
    let url = server.url("");
    let seen = common::python_json(
        "tests/mcp/stateless_stdio.py",
        &[
            "ide-key-1",
            env!("CARGO_BIN_EXE_conclave"),
            "mcp",
            "--server",
            &url,
        ],
        "the mcp package",
    )
    .await;
    assert_eq!(seen["version"], "2026-07-28", "{seen}");
    assert!(
        seen["tools"]
            .as_array()
            .unwrap()
            .contains(&json!("run_agent"))
    );
    assert_eq!(seen["kept"], "relayed\n");
    assert_eq!(seen["handle"], false);
    assert_eq!(seen["templates"], 3);
    server.stop_and_remove_sandboxes().await;
}

/// `conclave mcp` serving the sandbox tools itself (no server, a data
/// directory of its own) to a 2026-07-28 client: its results hand out
/// scratch handles as `/mcp`'s do, and a handle reaches the same sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_without_a_server_hands_out_scratch_handles() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().display().to_string();
    let seen = common::python_json(
        "tests/mcp/stateless_stdio.py",
        &[
            "unused-key",
            env!("CARGO_BIN_EXE_conclave"),
            "mcp",
            "--sandbox",
            "docker",
            "--data-dir",
            &data_dir,
        ],
        "the mcp package",
    )
    .await;
    assert_eq!(seen["version"], "2026-07-28", "{seen}");
    assert_eq!(seen["handle"], true, "{seen}");
    assert_eq!(seen["kept"], "relayed\n");
    // No server: no session resources.
    assert_eq!(seen["templates"], 0);
}
