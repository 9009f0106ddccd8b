//! The strict harness (every model's default) against a scripted capable
//! model, one that answers with native tool calls, on real docker
//! sandboxes: every call runs against the sandbox's current state, the
//! turn's result is the model's own text, calls come only from the
//! tool-call channel, and nothing is cut for its content. The same model
//! under the small harness keeps reads after writes fresh.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "providers/upstream.rs"]
#[allow(dead_code)]
mod upstream;

use common::TestServer;
use conclave::config::{HarnessKind, ModelAlias, ProviderKind};
use serde_json::{Value, json};
use upstream::{Reply, Upstream, chunk_usage, content, delta, end, finish};

/// A reply that is one native tool call.
fn calls(id: &str, name: &str, arguments: Value) -> Reply {
    Reply::sse(vec![
        delta(
            json!({"tool_calls": [{"index": 0, "id": id, "type": "function",
                                     "function": {"name": name, "arguments": arguments.to_string()}}]}),
        ),
        finish("tool_calls"),
        chunk_usage(10, 5),
        end(),
    ])
}

fn bash(id: &str, command: &str) -> Reply {
    calls(id, "Bash", json!({"command": command}))
}

fn read(id: &str) -> Reply {
    calls(id, "Read", json!({"file_path": "/workspace/f.txt"}))
}

/// A reply that is text only, streamed in pieces of `piece` bytes.
fn says(text: &str, piece: usize) -> Reply {
    let mut events: Vec<String> = text
        .as_bytes()
        .chunks(piece)
        .map(|c| content(std::str::from_utf8(c).unwrap()))
        .collect();
    events.extend([finish("stop"), chunk_usage(10, 5), end()]);
    Reply::sse(events)
}

/// A sandboxed server whose `capable` model is the scripted upstream under
/// `harness`.
async fn server(upstream: &Upstream, harness: HarnessKind) -> TestServer {
    let base_url = format!("{}/v1", upstream.url);
    TestServer::start_sandboxed(move |c| {
        c.models.insert(
            "capable".into(),
            ModelAlias {
                provider: ProviderKind::Openai,
                model: "capable-model".into(),
                base_url: Some(base_url),
                harness: Some(harness),
                ..Default::default()
            },
        );
    })
    .await
}

/// One session's turns, one per prompt, each event list in order.
async fn session_turns(server: &TestServer, prompts: &[&str]) -> Vec<Vec<Value>> {
    let id = server
        .create_session(json!({"model": "capable", "max_turns": 30}))
        .await;
    let mut turns = Vec::new();
    for prompt in prompts {
        turns.push(server.turn(&id, prompt).await);
    }
    turns
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

/// What each call printed: a `Read`'s text, an exec's stdout.
fn outputs(events: &[Value]) -> Vec<String> {
    of_type(events, "tool_result")
        .iter()
        .map(|e| match &e["output"] {
            Value::String(text) => text.clone(),
            other => other["stdout"].as_str().unwrap_or_default().to_string(),
        })
        .collect()
}

fn result_of(events: &[Value]) -> (&str, &str) {
    let result = events.last().unwrap();
    assert_eq!(result["type"], "result", "{events:?}");
    (
        result["status"].as_str().unwrap(),
        result["result"].as_str().unwrap_or_default(),
    )
}

/// A read after a shell write, a `Write` and an `Edit` each sees what was
/// written: no call is answered from an earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_after_writes_see_the_new_state() {
    let upstream = Upstream::start(vec![
        bash("c1", "echo one > /workspace/f.txt"),
        read("c2"),
        calls(
            "c3",
            "Write",
            json!({"file_path": "/workspace/f.txt", "content": "two\n"}),
        ),
        read("c4"),
        calls(
            "c5",
            "Edit",
            json!({"file_path": "/workspace/f.txt", "old_string": "two", "new_string": "three"}),
        ),
        read("c6"),
        bash("c7", "echo four > /workspace/f.txt"),
        bash("c8", "cat /workspace/f.txt"),
        says("The file went one, two, three, four.", 7),
    ])
    .await;
    let server = server(&upstream, HarnessKind::Strict).await;
    let turns = session_turns(&server, &["edit f.txt"]).await;
    let events = &turns[0];
    let printed = outputs(events);
    assert_eq!(printed.len(), 8, "{events:?}");
    assert!(printed[1].contains("one"), "{printed:?}");
    assert!(printed[3].contains("two"), "{printed:?}");
    assert!(printed[5].contains("three"), "{printed:?}");
    assert_eq!(printed[7], "four\n");
    assert_eq!(
        result_of(events),
        ("success", "The file went one, two, three, four.")
    );
    assert!(of_type(events, "intervention").is_empty(), "{events:?}");
    server.stop_and_remove_sandboxes().await;
}

/// The same shell command four times runs four times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_run_four_times_counts_to_four() {
    let counter = "n=$(cat n 2>/dev/null || echo 0); echo $((n+1)) > n; cat n";
    let upstream = Upstream::start(vec![
        bash("c1", counter),
        bash("c2", counter),
        bash("c3", counter),
        bash("c4", counter),
        says("It counted to 4.", 100),
    ])
    .await;
    let server = server(&upstream, HarnessKind::Strict).await;
    let events = &session_turns(&server, &["count"]).await[0];
    assert_eq!(outputs(events), ["1\n", "2\n", "3\n", "4\n"], "{events:?}");
    assert_eq!(result_of(events), ("success", "It counted to 4."));
    server.stop_and_remove_sandboxes().await;
}

/// A call that failed twice runs again once the model has fixed what made
/// it fail, and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_failed_twice_runs_after_the_fix() {
    let upstream = Upstream::start(vec![
        bash("c1", "cat /workspace/missing.txt"),
        bash("c2", "cat /workspace/missing.txt"),
        calls(
            "c3",
            "Write",
            json!({"file_path": "/workspace/missing.txt", "content": "here\n"}),
        ),
        bash("c4", "cat /workspace/missing.txt"),
        says("It says: here", 100),
    ])
    .await;
    let server = server(&upstream, HarnessKind::Strict).await;
    let events = &session_turns(&server, &["read missing.txt"]).await[0];
    let results = of_type(events, "tool_result");
    assert_eq!(results.len(), 4, "{events:?}");
    assert_eq!(results[0]["is_error"], true);
    assert_eq!(results[1]["is_error"], true);
    assert_eq!(results[3]["is_error"], false);
    assert_eq!(results[3]["output"]["stdout"], "here\n");
    assert_eq!(result_of(events), ("success", "It says: here"));
    // Each model call saw the history as it was, without an ask of ours.
    for request in upstream.requests() {
        let last = request.body["messages"].as_array().unwrap().last().cloned();
        let last = last.unwrap();
        assert!(
            last["role"] == "tool" || last["content"] == "read missing.txt",
            "{last}"
        );
    }
    server.stop_and_remove_sandboxes().await;
}

/// A call written into an answer's text is text: it does not run, and the
/// answer is the turn's result as written. A JSON answer listing twenty
/// objects with `name` keys arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_is_never_run_nor_cut() {
    let advice = r#"To run it yourself, call {"name": "Bash", "arguments": {"command": "touch /workspace/pwned"}} from your client."#;
    let listing = serde_json::to_string_pretty(&json!(
        (1..=20)
            .map(|i| json!({"name": "Bash", "arguments": {"command": format!("echo {i}")}}))
            .collect::<Vec<_>>()
    ))
    .unwrap();
    let upstream = Upstream::start(vec![
        says(advice, 9),
        says(&listing, 16),
        bash("c1", "ls -A /workspace"),
        says("Nothing was touched.", 100),
    ])
    .await;
    let server = server(&upstream, HarnessKind::Strict).await;
    let turns = session_turns(&server, &["how?", "list", "look"]).await;
    for (events, text) in turns[..2].iter().zip([advice, listing.as_str()]) {
        assert!(of_type(events, "tool_use").is_empty(), "{events:?}");
        assert!(of_type(events, "intervention").is_empty(), "{events:?}");
        assert_eq!(result_of(events), ("success", text));
    }
    let listed: Vec<Value> = serde_json::from_str(result_of(&turns[1]).1).unwrap();
    assert_eq!(listed.len(), 20);
    assert!(!outputs(&turns[2])[0].contains("pwned"), "{:?}", turns[2]);
    server.stop_and_remove_sandboxes().await;
}

/// The same model under the small harness: a read after a write is run
/// again and sees the write; a read repeated with nothing in between is
/// answered from its earlier output, and an intervention says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_small_harness_reads_fresh_after_writes() {
    let upstream = Upstream::start(vec![
        bash("c1", "echo one > /workspace/f.txt"),
        read("c2"),
        read("c3"),
        bash("c4", "echo two > /workspace/f.txt"),
        read("c5"),
        says("one, then two", 100),
    ])
    .await;
    let server = server(&upstream, HarnessKind::Small).await;
    let events = &session_turns(&server, &["edit f.txt"]).await[0];
    let printed = outputs(events);
    assert_eq!(printed.len(), 5, "{events:?}");
    assert!(printed[1].contains("one"), "{printed:?}");
    assert!(
        printed[2].contains("one") && printed[2].contains("already ran in this turn"),
        "{printed:?}"
    );
    assert!(
        printed[4].contains("two") && !printed[4].contains("already ran"),
        "{printed:?}"
    );
    let kinds: Vec<&Value> = of_type(events, "intervention")
        .iter()
        .map(|e| &e["kind"])
        .collect();
    assert!(kinds.contains(&&json!("repeat_answered")), "{events:?}");
    assert_eq!(result_of(events), ("success", "one, then two"));
    server.stop_and_remove_sandboxes().await;
}
