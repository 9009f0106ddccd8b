//! The LangGraph Agent Protocol at `/langgraph`, through the official
//! `langgraph-sdk` Python client against the real binary: assistants,
//! threads, runs in every served stream mode and multitask strategy, a
//! pipeline thread's state and history, cancel, join, the store, and two
//! keys that cannot see each other's threads.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::binary::{serve_command, spawn_server, stop};
use serde_json::{Value, json};

const KEY_A: &str = "lg-test-key-a-0123456789";
const KEY_B: &str = "lg-test-key-b-0123456789";

/// Two keys; the demo model paced so that a long prompt's turn runs for
/// seconds; a pipeline assistant with mock agents; a pipeline definition
/// of the user's own in `pipelines.dir`.
const CONFIG: &str = r#"
api_keys = ["lg-test-key-a-0123456789", "lg-test-key-b-0123456789"]

[demo]
chunk_delay_ms = 40

[agents.chatty]
description = "Streams its text a word at a time"
options = { text_deltas = true }

[agents.sync]
kind = "pipeline"
description = "Syncs a sheet (mock agents)"
options = { connector_name = "google-sheets", mock = {} }

[pipelines]
dir = "pipelines"
"#;

/// A pipeline of the user's own: it is an assistant named `pipeline:triage`.
const TRIAGE: &str = "name: triage
description: Sorts a ticket
start: read
terminal: [answer]
nodes:
  read:
    prompt: read the ticket
  answer:
    prompt: answer
edges:
  - {from: read, to: answer}
";

/// The binary serving CONFIG from a fresh directory.
async fn serve() -> (tempfile::TempDir, tokio::process::Child, String) {
    serve_on("local").await
}

/// The binary serving CONFIG from a fresh directory, its sandboxes on
/// `backend`.
async fn serve_on(backend: &str) -> (tempfile::TempDir, tokio::process::Child, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("conclave.toml"), CONFIG).unwrap();
    std::fs::create_dir(dir.path().join("pipelines")).unwrap();
    std::fs::write(dir.path().join("pipelines/triage.yaml"), TRIAGE).unwrap();
    let mut command = serve_command(&["--sandbox", backend, "--config", "conclave.toml"]);
    command.current_dir(dir.path());
    let (child, url) = spawn_server(&mut command).await;
    (dir, child, url)
}

/// The frames of one streamed mode, without the leading `metadata`.
fn frames<'a>(seen: &'a Value, mode: &str) -> &'a [Value] {
    let all = seen["modes"][mode].as_array().unwrap();
    assert_eq!(all[0][0], "metadata", "{mode}: {all:?}");
    assert!(all[0][1]["run_id"].is_string(), "{all:?}");
    &all[1..]
}

#[tokio::test]
async fn the_langgraph_sdk_drives_threads_runs_and_the_store() {
    let (_dir, mut child, url) = serve().await;

    let seen = common::python_json(
        "tests/langgraph/client.py",
        &[&url, KEY_A, KEY_B],
        "langgraph-sdk",
    )
    .await;

    assert_eq!(
        seen["assistants"],
        json!([
            "chatty",
            "sync",
            "agent",
            "deliberation",
            "pipeline",
            "pipeline:connector",
            "pipeline:triage"
        ])
    );
    assert_eq!(
        seen["triage"],
        json!({"graph_id": "pipeline", "description": "Sorts a ticket"})
    );
    assert_eq!(
        seen["triage_thread"],
        json!({"graph_id": "pipeline:triage", "values": {}})
    );
    assert_eq!(seen["triage_search"], true, "searched by its graph id");
    assert_eq!(seen["unknown_assistant"], 404);
    assert_eq!(seen["unknown_run_assistant"], 404);
    assert_eq!(seen["no_key"], 401);
    assert_eq!(seen["thread_status"], "idle");

    // Each mode maps the turn's events its own way.
    let values = frames(&seen, "values");
    assert_eq!(values.len(), 1, "{values:?}");
    assert_eq!(values[0][0], "values");
    assert_eq!(
        values[0][1]["messages"][1],
        json!({"type": "ai", "id": "msg-1", "content": "You said: hello values", "tool_calls": []})
    );
    let updates = frames(&seen, "updates");
    assert_eq!(
        updates,
        [
            json!(["updates", {"agent": {"messages": [{"type": "ai", "content": "You said: hello updates"}]}}])
        ]
    );
    let messages = frames(&seen, "messages-tuple");
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert_eq!(messages[0][0], "messages");
    assert_eq!(messages[0][1][0]["type"], "AIMessageChunk");
    assert_eq!(
        messages[0][1][0]["content"],
        "You said: hello messages-tuple"
    );
    // With text deltas, a chunk per word, all of one message id.
    let deltas = seen["deltas"].as_array().unwrap();
    assert!(deltas.len() > 3, "{deltas:?}");
    let text: String = deltas
        .iter()
        .map(|d| d[0]["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, "You said: say it a word at a time");
    assert!(
        deltas.iter().all(|d| d[0]["id"] == deltas[0][0]["id"]),
        "{deltas:?}"
    );
    let events: Vec<&Value> = frames(&seen, "events")
        .iter()
        .map(|f| &f[1]["type"])
        .collect();
    assert_eq!(events, ["status", "thinking", "result"]);
    let custom = frames(&seen, "custom");
    assert_eq!(custom.len(), 1, "{custom:?}");
    assert_eq!(custom[0][1]["type"], "status");
    assert_eq!(seen["bad_mode"], 422);

    assert_eq!(seen["wait"][11], "You said: wait please");
    assert_eq!(
        seen["stateless"],
        json!(["no thread", "You said: no thread"])
    );

    // reject is the session's 409; enqueue runs after the first run, which
    // ends well; interrupt stops it.
    assert_eq!(seen["reject"], 409);
    assert!(
        seen["enqueue"][1]
            .as_str()
            .unwrap()
            .starts_with("You said: word word"),
        "{seen}"
    );
    assert_eq!(seen["enqueue"][2], "enqueued");
    assert_eq!(seen["enqueue"][3], "You said: enqueued");
    assert_eq!(seen["enqueue_first"], "success");
    assert_eq!(
        seen["interrupt"],
        json!(["after interrupt", "You said: after interrupt"])
    );
    assert_eq!(seen["interrupted_status"], "interrupted");
    assert_eq!(seen["cancelled_status"], "interrupted");
    rolled_back(&url, &seen).await;
    assert_eq!(seen["join"], "You said: joined");

    // The history is one state per finished turn, newest first, the
    // newest being the state now.
    let lens: Vec<u64> = seen["history_lens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert_eq!(lens[0], seen["state_len"].as_u64().unwrap());
    assert!(lens.windows(2).all(|w| w[0] > w[1]), "{lens:?}");
    assert_eq!(*lens.last().unwrap(), 2);

    // The other key sees none of it.
    assert_eq!(seen["search_a"], true);
    assert_eq!(seen["search_b"], false);
    // A copy has the thread's conversation, and its next run is its own.
    assert_eq!(seen["copy_differs"], true);
    assert_eq!(seen["copy_len"], seen["state_len"]);
    assert_eq!(
        seen["copy_after"].as_u64().unwrap(),
        seen["state_len"].as_u64().unwrap() + 2,
        "{seen}"
    );
    assert_eq!(seen["source_after"], seen["state_len"]);
    for call in [
        "b_get", "b_state", "b_run", "b_delete", "b_copy", "b_update",
    ] {
        assert_eq!(seen[call], 404, "{call}");
    }
    thread_metadata(&url, &seen).await;

    let pipeline = &seen["pipeline"];
    assert_eq!(pipeline["final_is_state"], true, "{pipeline}");
    assert_eq!(pipeline["newest_is_state"], true, "{pipeline}");
    assert_eq!(
        pipeline["history_nodes"],
        json!([
            "publisher",
            "reviewer",
            "test_reviewer",
            "tester",
            "generator",
            "research"
        ])
    );
    assert!(
        pipeline["state_keys"]
            .as_array()
            .unwrap()
            .contains(&json!("original_request"))
    );
    assert_eq!(seen["wrong_kind"], 422);

    assert_eq!(seen["store_get"], json!({"theme": "dark"}));
    assert_eq!(seen["store_search"], json!([[["users", "u1"], "prefs"]]));
    assert_eq!(
        seen["store_namespaces"],
        json!([["users", "u1"], ["users", "u2"]])
    );
    assert_eq!(seen["store_b_get"], 404);
    assert_eq!(seen["store_deleted"], 404);
    assert_eq!(seen["deleted_get"], 404);
    store_item_by_labels(&url).await;

    stop(&mut child).await;
}

/// A thread's metadata as made, merged, searched and copied; the sessions
/// list tells the threads LangGraph made from the caller's own.
async fn thread_metadata(url: &str, seen: &Value) {
    let made = json!({"project": "alpha", "n": 1, "graph_id": "agent"});
    assert_eq!(seen["metadata_made"], made);
    let merged = json!({"project": "alpha", "n": 2, "owner": "me", "graph_id": "agent"});
    assert_eq!(seen["metadata_updated"], merged);
    assert_eq!(seen["metadata_get"], merged);
    assert_eq!(seen["metadata_search"], json!([true]));
    assert_eq!(seen["metadata_search_stale"], 0);
    assert_eq!(seen["b_search"], 0);
    assert_eq!(seen["metadata_after_b"], 2);
    assert_eq!(seen["metadata_copy"], merged);

    let http = reqwest::Client::new();
    let lid = seen["labelled"].as_str().unwrap();
    let listed = |origin: &'static str| {
        let request = http
            .get(format!("{url}/agent/sessions?origin={origin}"))
            .bearer_auth(KEY_A);
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let (status, threads) = listed("langgraph").await;
    assert_eq!(status, 200, "{threads}");
    let sessions = threads["sessions"].as_array().unwrap();
    let thread = sessions.iter().find(|s| s["session_id"] == lid);
    let thread = thread.unwrap_or_else(|| panic!("{lid} not in {threads}"));
    assert_eq!(thread["origin"], "langgraph");
    assert_eq!(
        thread["metadata"],
        json!({"project": "alpha", "n": 2, "owner": "me"})
    );
    assert!(
        sessions.iter().all(|s| s["origin"] == "langgraph"),
        "{threads}"
    );
    let (_, own) = listed("conclave").await;
    assert!(
        own["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s.get("origin").is_none()),
        "{own}"
    );
    let (status, refused) = listed("openai").await;
    assert_eq!(status, 422, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("origin: must be conclave or one of a2a, agui, langgraph"),
        "{refused}"
    );
    // An update needs its metadata, as an object.
    let patch = |body: Value| {
        http.patch(format!("{url}/langgraph/threads/{lid}"))
            .bearer_auth(KEY_A)
            .json(&body)
            .send()
    };
    let response = patch(json!({})).await.unwrap();
    assert_eq!(response.status().as_u16(), 422);
    let response = patch(json!({"metadata": [1]})).await.unwrap();
    assert_eq!(response.status().as_u16(), 422);
}

/// A store item is read with its namespace dotted or one `namespace=` per
/// label; another key reads nothing, an unknown parameter is a 400.
async fn store_item_by_labels(url: &str) {
    let http = reqwest::Client::new();
    let items = format!("{url}/langgraph/store/items");
    let put = http
        .put(&items)
        .bearer_auth(KEY_A)
        .json(&json!({"namespace": ["docs", "v2"], "key": "k", "value": {"n": 1}}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 204);
    for query in [
        "namespace=docs&namespace=v2&key=k",
        "namespace=docs.v2&key=k",
    ] {
        let get = || http.get(format!("{items}?{query}"));
        let item = common::binary::json_of(get().bearer_auth(KEY_A)).await;
        assert_eq!(item["value"], json!({"n": 1}), "{query}: {item}");
        assert_eq!(item["namespace"], json!(["docs", "v2"]), "{query}: {item}");
        let other = get().bearer_auth(KEY_B).send().await.unwrap();
        assert_eq!(other.status(), 404, "{query}: another key's item");
    }
    for (query, status) in [
        ("namespace=docs&namespace=v2", 400),
        ("namespace=docs&key=k&nope=1", 400),
        ("namespace=docs&key=k", 404),
    ] {
        let answer = http
            .get(format!("{items}?{query}"))
            .bearer_auth(KEY_A)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), status, "{query}");
    }
}

/// Forks KEY_A's session `id` at `at_seq`: the status and the answer.
async fn fork_at(url: &str, id: &str, at_seq: Value) -> (u16, Value) {
    let fork = reqwest::Client::new()
        .post(format!("{url}/agent/session/{id}/fork"))
        .bearer_auth(KEY_A)
        .json(&json!({ "at_seq": at_seq }))
        .send()
        .await
        .unwrap();
    (fork.status().as_u16(), fork.json().await.unwrap())
}

/// rollback stopped the slow run and left nothing of it in the thread:
/// its values and history hold the turn before it and the new run only,
/// and the session's log says it was rewound to the turn end before it.
async fn rolled_back(url: &str, seen: &Value) {
    let kept = json!(["kept", "You said: kept"]);
    let after = json!(["kept", "You said: kept", "instead", "You said: instead"]);
    assert_eq!(seen["rollback"], after, "{seen}");
    assert_eq!(seen["rollback_state"], after);
    assert_eq!(seen["rollback_history"], json!([after, kept]));

    let thread = seen["rollback_thread"].as_str().unwrap();
    // The history read with a GET is the SDK's POST form's.
    let http = reqwest::Client::new();
    let history = format!("{url}/langgraph/threads/{thread}/history");
    let got =
        common::binary::json_of(http.get(format!("{history}?limit=1")).bearer_auth(KEY_A)).await;
    let texts: Vec<&Value> = got[0]["values"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["content"])
        .collect();
    assert_eq!(
        (got.as_array().unwrap().len(), json!(texts)),
        (1, after.clone()),
        "{got}"
    );
    let other = http.get(&history).bearer_auth(KEY_B).send().await.unwrap();
    assert_eq!(other.status(), 404, "another key's thread");
    let typo = http
        .get(format!("{history}?limt=1"))
        .bearer_auth(KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(typo.status(), 400);
    let response = http
        .get(format!("{url}/agent/session/{thread}/events"))
        .bearer_auth(KEY_A)
        .send()
        .await
        .unwrap();
    let events = common::ndjson(response).await;
    let log = Value::from(events.clone());
    let results: Vec<&Value> = events.iter().filter(|e| e["type"] == "result").collect();
    assert_eq!(results.len(), 3, "{log}");
    assert_eq!(results[1]["status"], "interrupted", "{log}");
    let rewound: Vec<&Value> = events.iter().filter(|e| e["type"] == "rewound").collect();
    assert_eq!(rewound.len(), 1, "{log}");
    assert_eq!(rewound[0]["to_seq"], results[0]["seq"], "{log}");
    assert_eq!(rewound[0]["history_len"], 2);
    // It never had a sandbox: its workspace is as empty as it was.
    assert_eq!(rewound[0]["workspace"], "restored");
    // Between the stopped turn's result and the new turn.
    assert!(
        rewound[0]["seq"].as_u64().unwrap() > results[1]["seq"].as_u64().unwrap(),
        "{log}"
    );
    assert!(
        rewound[0]["seq"].as_u64().unwrap() < results[2]["seq"].as_u64().unwrap(),
        "{log}"
    );
    // A fork at a point of the undone turn is answered by the rewound
    // history: the turn end the rollback went back to.
    for inside in [
        results[1]["seq"].as_u64().unwrap(),
        results[0]["seq"].as_u64().unwrap() + 1,
    ] {
        let (status, fork) = fork_at(url, thread, json!(inside)).await;
        assert_eq!(status, 201, "at_seq {inside}: {fork}");
        assert_eq!(fork["at_seq"], results[0]["seq"], "{fork}");
        let id = fork["sessions"][0]["session_id"].as_str().unwrap();
        let status = common::binary::json_of(
            http.get(format!("{url}/agent/session/{id}/status"))
                .bearer_auth(KEY_A),
        )
        .await;
        let texts: Vec<&Value> = status["history"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| &m["content"])
            .collect();
        assert_eq!(json!(texts), kept, "{status}");
    }
}

#[tokio::test]
async fn bad_runs_get_json_errors_and_streams_say_their_run() {
    let (_dir, mut child, url) = serve().await;
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        http.post(format!("{url}/langgraph{path}"))
            .header("x-api-key", KEY_A)
            .json(&body)
            .send()
    };

    let thread: Value = post("/threads", json!({}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = thread["thread_id"].as_str().unwrap();
    let input = json!({"messages": [{"role": "user", "content": "hi"}]});
    let cases = [
        (
            json!({"assistant_id": "agent", "input": input, "stream_mode": "debug"}),
            422,
            "stream_mode",
        ),
        (
            json!({"assistant_id": "agent", "input": input, "multitask_strategy": "later"}),
            422,
            "multitask_strategy",
        ),
        (
            json!({"assistant_id": "agent", "input": {"messages": []}}),
            422,
            "input",
        ),
        (json!({"input": input}), 422, "assistant_id"),
        (
            json!({"assistant_id": "nobody", "input": input}),
            404,
            "nobody",
        ),
    ];
    for (body, status, names) in cases {
        let response = post(&format!("/threads/{id}/runs/stream"), body.clone())
            .await
            .unwrap();
        assert_eq!(response.status(), status, "{body}");
        let error: Value = response.json().await.unwrap();
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(names), "{body}: {error}");
    }

    let response = post(
        &format!("/threads/{id}/runs/stream"),
        json!({"assistant_id": "agent", "input": input}),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 200);
    let location = response.headers()["content-location"].to_str().unwrap();
    assert!(
        location.starts_with(&format!("/langgraph/threads/{id}/runs/")),
        "{location}"
    );
    let body = response.text().await.unwrap();
    assert!(body.starts_with("event: metadata\n"), "{body}");

    // The key goes in x-api-key on these routes only.
    let elsewhere = http
        .get(format!("{url}/agent/sessions"))
        .header("x-api-key", KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(elsewhere.status(), 401);

    stop(&mut child).await;
}

/// A rollback takes the undone run's files out of the workspace too: the
/// session's next sandbox starts from the snapshot of the turn end it went
/// back to (`workspace: "restored"`). The undone run wrote `undone.txt`
/// and was stopped while it slept; the run that replaced it lists the
/// workspace and sees only what the first run left and the file a client
/// put in between the runs.
#[tokio::test]
async fn a_rollback_takes_the_undone_runs_files_out_of_the_workspace() {
    rollback_restores("local").await;
}

/// As above, on docker (its sandboxes removed afterwards).
#[tokio::test]
async fn a_rollback_takes_the_undone_runs_files_out_of_a_docker_workspace() {
    rollback_restores("docker").await;
}

async fn rollback_restores(backend: &str) {
    let (dir, mut child, url) = serve_on(backend).await;
    let http = reqwest::Client::new();
    let run = common::langgraph_run;
    let post = |path: String, body: Value| {
        let request = http.post(format!("{url}/langgraph{path}"));
        common::binary::json_ok(request.header("x-api-key", KEY_A).json(&body))
    };
    let thread = post("/threads".into(), json!({})).await;
    let id = thread["thread_id"].as_str().unwrap().to_owned();
    let first = run("$ echo kept > kept.txt", "reject");
    post(format!("/threads/{id}/runs/wait"), first).await;

    let follow = http
        .get(format!(
            "{url}/agent/session/{id}/events?since=0&follow=true"
        ))
        .bearer_auth(KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(follow.status(), 200);
    let mut events = common::Lines::new(follow);
    events.until("result").await;
    // Put in between the runs: not the undone run's, so it stays.
    let put = http
        .put(format!("{url}/agent/session/{id}/files/put.txt"))
        .bearer_auth(KEY_A)
        .header("content-type", "application/octet-stream")
        .body("put\n")
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.status());
    let undone = run("$ echo undone | tee undone.txt && sleep 300", "reject");
    post(format!("/threads/{id}/runs"), undone).await;
    // The file is written once its line is out.
    let seen = events.until("tool_output").await;
    assert!(
        seen.last().unwrap()["content"]
            .as_str()
            .unwrap()
            .contains("undone"),
        "{seen:?}"
    );

    // The rollback's own run lists the workspace.
    let after = post(format!("/threads/{id}/runs/wait"), run("$ ls", "rollback")).await;
    let said = after["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        said.contains("kept.txt") && said.contains("put.txt"),
        "{after}"
    );
    assert!(!said.contains("undone"), "{after}");

    let file = |name: &str| {
        http.get(format!("{url}/agent/session/{id}/files/{name}"))
            .bearer_auth(KEY_A)
            .send()
    };
    let kept = file("kept.txt").await.unwrap();
    assert_eq!(kept.status(), 200);
    assert_eq!(kept.text().await.unwrap(), "kept\n");
    assert_eq!(file("undone.txt").await.unwrap().status(), 404);
    assert_eq!(
        file("put.txt").await.unwrap().text().await.unwrap(),
        "put\n"
    );

    let rewound = events.until("rewound").await;
    assert_eq!(
        rewound.last().unwrap()["workspace"],
        "restored",
        "{rewound:?}"
    );
    // A fork at the rewind has the files it went back to.
    let at_seq = rewound.last().unwrap()["seq"].clone();
    let (status, fork) = fork_at(&url, &id, at_seq.clone()).await;
    assert_eq!(status, 201, "{fork}");
    assert_eq!(fork["at_seq"], at_seq, "{fork}");
    let forked = fork["sessions"][0]["session_id"].as_str().unwrap();
    for (name, status) in [("kept.txt", 200), ("put.txt", 200), ("undone.txt", 404)] {
        let got = http
            .get(format!("{url}/agent/session/{forked}/files/{name}"))
            .bearer_auth(KEY_A)
            .send()
            .await
            .unwrap();
        assert_eq!(got.status(), status, "{name} in the fork");
    }
    stop(&mut child).await;
    if backend == "docker" {
        common::remove_sandboxes_of(&dir.path().join("data")).await;
    }
}
