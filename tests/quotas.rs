//! Per-key quotas on the real binary, started as the README does with
//! `[keys.NAME]` in its config file: past a quota a key gets a 429 with
//! `Retry-After` and a JSON error naming the quota, and other keys go on.
//! The sandbox test reproduces issue 41's attack in small on docker: one
//! key holding every sandbox its quota allows does not stop another key's
//! tool calls.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::binary::{serve_command, spawn_server, stop};
use common::{Lines, long_prompt, ndjson};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::process::Child;

const GREEDY: &str = "greedy-key-0123456789";
const OTHER: &str = "other-key-0123456789";
const RACER: &str = "racer-key-0123456789";

const CONFIG: &str = r#"
[keys.greedy]
key = "greedy-key-0123456789"
max_sandboxes = 2
max_concurrent_sessions = 3
max_concurrent_turns = 1
requests_per_minute = 2
storage_mb = 1

[keys.other]
key = "other-key-0123456789"

[keys.racer]
key = "racer-key-0123456789"
max_concurrent_sessions = 2

[demo]
chunk_delay_ms = 20

[sandbox]
warm_pool = 0
"#;

struct Server {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
    docker: bool,
    http: reqwest::Client,
}

impl Server {
    async fn start(sandbox: &str) -> Server {
        Server::start_with(sandbox, &[]).await
    }

    /// With more flags: a replica's shared `--store` and `--bus`.
    async fn start_with(sandbox: &str, args: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("conclave.toml"), CONFIG).unwrap();
        let mut command = serve_command(&["--sandbox", sandbox, "--config", "conclave.toml"]);
        command.args(args);
        command.current_dir(dir.path());
        let (child, url) = spawn_server(&mut command).await;
        Server {
            child,
            url,
            dir,
            docker: sandbox == "docker",
            http: reqwest::Client::new(),
        }
    }

    async fn send(&self, key: &str, method: Method, path: &str, body: Value) -> reqwest::Response {
        self.http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    async fn session(&self, key: &str) -> String {
        let response = self
            .send(key, Method::POST, "/agent/session", json!({}))
            .await;
        assert_eq!(response.status(), StatusCode::CREATED);
        let body: Value = response.json().await.unwrap();
        body["session_id"].as_str().unwrap().to_string()
    }

    async fn turn(&self, key: &str, id: &str, prompt: &str) -> Vec<Value> {
        let path = format!("/agent/session/{id}/message");
        let response = self
            .send(key, Method::POST, &path, json!({"prompt": prompt}))
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        ndjson(response).await
    }

    async fn delete(&self, key: &str, id: &str) {
        let path = format!("/agent/session/{id}");
        let response = self.send(key, Method::DELETE, &path, json!({})).await;
        assert!(response.status().is_success(), "{}", response.status());
    }

    async fn stop(mut self) {
        stop(&mut self.child).await;
        // The server keeps its sessions' sandboxes across restarts.
        if self.docker {
            common::remove_sandboxes_of(&self.dir.path().join("data")).await;
        }
    }
}

/// A 429 naming `quota` with a `Retry-After` of at most `max_wait` seconds.
async fn assert_quota(response: reqwest::Response, quota: &str, max_wait: u64) -> Value {
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=max_wait).contains(&retry_after), "{retry_after}");
    let body: Value = response.json().await.unwrap();
    let error = &body["error"];
    assert_eq!(error["code"], "quota_exceeded", "{body}");
    assert_eq!(error["quota"], quota, "{body}");
    assert_eq!(error["key"], "greedy", "{body}");
    assert!(error["message"].as_str().unwrap().contains(quota), "{body}");
    body
}

/// Three gateway requests of greedy's within one UTC minute, through
/// `servers` in turn: two pass (to a 404 for the unknown model) and the
/// third is past `requests_per_minute`, its reset at the minute's end.
async fn three_requests_in_one_minute(servers: [&Server; 3]) {
    loop {
        let minute = chrono::Utc::now().timestamp() / 60;
        let mut statuses = Vec::new();
        for server in servers {
            let response = server
                .send(
                    GREEDY,
                    Method::POST,
                    "/v1/chat/completions",
                    json!({"model": "none", "messages": []}),
                )
                .await;
            statuses.push(response.status());
            if response.status() == StatusCode::TOO_MANY_REQUESTS {
                let body = assert_quota(response, "requests_per_minute", 60).await;
                let reset = body["error"]["reset"].as_str().unwrap();
                let reset = chrono::DateTime::parse_from_rfc3339(reset).unwrap();
                assert_eq!(reset.timestamp() % 60, 0, "{reset}");
            }
        }
        // Calls that straddled a minute's end count in two minutes: again.
        if chrono::Utc::now().timestamp() / 60 != minute {
            continue;
        }
        assert_eq!(
            statuses,
            [
                StatusCode::NOT_FOUND,
                StatusCode::NOT_FOUND,
                StatusCode::TOO_MANY_REQUESTS
            ]
        );
        break;
    }
}

fn tool_result(events: &[Value]) -> &Value {
    events
        .iter()
        .find(|e| e["type"] == "tool_result")
        .unwrap_or_else(|| panic!("no tool result: {events:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_at_its_sandbox_quota_leaves_the_others_their_tool_calls() {
    let server = Server::start("docker").await;
    let mut sessions = Vec::new();
    for _ in 0..2 {
        sessions.push(server.session(GREEDY).await);
    }
    for (i, id) in sessions.iter().enumerate() {
        let events = server.turn(GREEDY, id, &format!("$ echo held {i}")).await;
        let result = tool_result(&events);
        assert_eq!(result["is_error"], false, "{result}");
        assert_eq!(result["output"]["stdout"], format!("held {i}\n"));
    }
    // A run's tool call is refused too: its session is stored by its
    // turn's first write, and the call counts under the key the turn
    // knows, stored or not.
    let response = server
        .send(
            GREEDY,
            Method::POST,
            "/agent/run",
            json!({"prompt": "$ echo run"}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let events = ndjson(response).await;
    let refused = tool_result(&events);
    assert_eq!(refused["is_error"], true, "{refused}");
    assert!(refused.to_string().contains("max_sandboxes"), "{refused}");
    sessions.push(server.session(GREEDY).await);
    // The third sandbox is past the key's quota: the tool call fails and
    // says why; the turn itself ends normally.
    let events = server.turn(GREEDY, &sessions[2], "$ echo third").await;
    let refused = tool_result(&events);
    assert_eq!(refused["is_error"], true, "{refused}");
    assert!(refused.to_string().contains("max_sandboxes"), "{refused}");
    assert_eq!(events.last().unwrap()["type"], "result");

    // Another key's tool calls still get sandboxes.
    let other = server.session(OTHER).await;
    let events = server.turn(OTHER, &other, "$ echo mine").await;
    let result = tool_result(&events);
    assert_eq!(result["is_error"], false, "{result}");
    assert_eq!(result["output"]["stdout"], "mine\n");

    // Deleting a session of the key frees its slot.
    server.delete(GREEDY, &sessions[0]).await;
    let events = server.turn(GREEDY, &sessions[2], "$ echo third").await;
    let result = tool_result(&events);
    assert_eq!(result["is_error"], false, "{result}");
    assert_eq!(result["output"]["stdout"], "third\n");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_turns_and_gateway_requests_past_their_quota_answer_429() {
    let server = Server::start("local").await;

    // max_concurrent_turns = 1: a second turn of the key while one runs.
    let first = server.session(GREEDY).await;
    let second = server.session(GREEDY).await;
    let running = server
        .send(
            GREEDY,
            Method::POST,
            &format!("/agent/session/{first}/message"),
            json!({"prompt": long_prompt(200)}),
        )
        .await;
    assert_eq!(running.status(), StatusCode::OK);
    let mut running = Lines::new(running);
    running.until("status").await;
    let path = format!("/agent/session/{second}/message");
    let refused = server
        .send(GREEDY, Method::POST, &path, json!({"prompt": "hi"}))
        .await;
    assert_quota(refused, "max_concurrent_turns", 60).await;
    // So is a run, refused before its first write: it leaves no open
    // session behind (the session quota below counts them).
    let refused = server
        .send(GREEDY, Method::POST, "/agent/run", json!({"prompt": "hi"}))
        .await;
    assert_quota(refused, "max_concurrent_turns", 60).await;
    // Another key's turns are not counted with it.
    let other = server.session(OTHER).await;
    assert_eq!(
        server.turn(OTHER, &other, "hi").await.last().unwrap()["type"],
        "result"
    );
    running.until("result").await;
    // The slot goes back before the turn's result is sent.
    let events = server.turn(GREEDY, &second, "hi").await;
    assert_eq!(events.last().unwrap()["type"], "result");

    // max_concurrent_sessions = 3: two open, one more, then refused; a
    // deleted one makes room.
    let third = server.session(GREEDY).await;
    let refused = server
        .send(GREEDY, Method::POST, "/agent/session", json!({}))
        .await;
    assert_quota(refused, "max_concurrent_sessions", 60).await;
    server.delete(GREEDY, &third).await;
    server.session(GREEDY).await;

    // requests_per_minute = 2 on the gateway: the third call in a minute
    // is refused until the minute's end (no pool is named, so the calls
    // let through answer 404).
    three_requests_in_one_minute([&server, &server, &server]).await;
    let response = server
        .send(
            OTHER,
            Method::POST,
            "/v1/chat/completions",
            json!({"model": "none", "messages": []}),
        )
        .await;
    assert_eq!(
        response.status(),
        StatusCode::NOT_FOUND,
        "another key is not counted"
    );
    server.stop().await;
}

/// Two replicas on one PostgreSQL database and one nats-server, as the
/// scale-out runs them: each quota counts the key's sessions, turns and
/// requests on both (needs `CONCLAVE_TEST_POSTGRES` and
/// `CONCLAVE_TEST_NATS_SERVER`, as tests/cluster.rs does).
/// 300,000 bytes of JSON: a fourth of them passes greedy's 1 MiB.
fn chunk() -> Value {
    json!("x".repeat(299_998))
}

/// Kept bus messages and KV values count against `storage_mb`; messages
/// that are not kept, another key's, and room freed by a delete do not.
async fn storage_fills_and_frees(first: &Server, second: &Server) {
    for server in [first, second, first] {
        let response = server
            .send(GREEDY, Method::POST, "/bus/publish/agent.notes", chunk())
            .await;
        assert_eq!(response.status(), StatusCode::ACCEPTED);
    }
    let refused = second
        .send(GREEDY, Method::POST, "/bus/publish/agent.notes", chunk())
        .await;
    let body = assert_quota(refused, "storage_mb", 60).await;
    assert_eq!(body["error"]["limit"], "1", "{body}");
    let refused = first.send(GREEDY, Method::PUT, "/kv/big", chunk()).await;
    assert_quota(refused, "storage_mb", 60).await;
    // Not kept: no disk, no refusal.
    let response = first
        .send(GREEDY, Method::POST, "/bus/publish/chat.live", chunk())
        .await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    // Another key keeps its own.
    let response = second
        .send(OTHER, Method::POST, "/bus/publish/agent.notes", chunk())
        .await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_bus_messages_and_kv_values_past_storage_mb_answer_429() {
    let server = Server::start("local").await;
    // A small value first, whose delete frees its room again below.
    let small = json!("y".repeat(200_000));
    let response = server.send(GREEDY, Method::PUT, "/kv/small", small).await;
    assert!(response.status().is_success(), "{}", response.status());
    let response = server
        .send(GREEDY, Method::POST, "/bus/publish/agent.notes", chunk())
        .await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let response = server
        .send(GREEDY, Method::POST, "/bus/publish/agent.notes", chunk())
        .await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let refused = server
        .send(GREEDY, Method::POST, "/bus/publish/agent.notes", chunk())
        .await;
    assert_quota(refused, "storage_mb", 60).await;
    let response = server
        .send(GREEDY, Method::DELETE, "/kv/small", json!({}))
        .await;
    assert!(response.status().is_success(), "{}", response.status());
    let response = server
        .send(GREEDY, Method::POST, "/bus/publish/agent.notes", chunk())
        .await;
    assert_eq!(
        response.status(),
        StatusCode::ACCEPTED,
        "a delete frees room"
    );
    // Nothing accepted was lost: the three kept messages read back.
    let response = server
        .http
        .get(format!(
            "{}/bus/subscribe?subjects=agent.notes&since=all",
            server.url
        ))
        .bearer_auth(GREEDY)
        .send()
        .await
        .unwrap();
    let mut lines = Lines::new(response);
    for _ in 0..3 {
        let read = lines.until("message").await;
        let message = read.last().unwrap();
        assert_eq!(
            message["data"].as_str().unwrap().len(),
            299_998,
            "{message:.200}"
        );
    }
    server.stop().await;

    // The same from empty on a fresh server, split over "two" calls.
    let fresh = Server::start("local").await;
    storage_fills_and_frees(&fresh, &fresh).await;
    fresh.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_postgres_and_nats_share_each_quota() {
    let database = common::postgres::TestDatabase::create(&common::postgres::test_server()).await;
    let nats = common::nats::NatsServer::start(true).await;
    let url = database.url();
    let shared = ["--store", url.as_str(), "--bus", nats.url.as_str()];
    let a = Server::start_with("local", &shared).await;
    let b = Server::start_with("local", &shared).await;

    // A turn running on one replica fills the key's one turn slot on both.
    let first = a.session(GREEDY).await;
    let second = b.session(GREEDY).await;
    let running = a
        .send(
            GREEDY,
            Method::POST,
            &format!("/agent/session/{first}/message"),
            json!({"prompt": long_prompt(200)}),
        )
        .await;
    let mut running = Lines::new(running);
    running.until("status").await;
    let path = format!("/agent/session/{second}/message");
    let refused = b
        .send(GREEDY, Method::POST, &path, json!({"prompt": "hi"}))
        .await;
    assert_quota(refused, "max_concurrent_turns", 60).await;
    running.until("result").await;
    let events = b.turn(GREEDY, &second, "hi").await;
    assert_eq!(events.last().unwrap()["type"], "result");

    // Two sessions open (one made on each replica), a third on A, and
    // the fourth is refused on B.
    a.session(GREEDY).await;
    let refused = b
        .send(GREEDY, Method::POST, "/agent/session", json!({}))
        .await;
    assert_quota(refused, "max_concurrent_sessions", 60).await;

    // Gateway requests: one on each replica, and the third on either is
    // past the minute's two.
    three_requests_in_one_minute([&a, &b, &a]).await;

    // Kept bytes on NATS JetStream, counted by either replica.
    storage_fills_and_frees(&a, &b).await;
    a.stop().await;
    b.stop().await;
}

/// Sends `body` to `path` on each of `replicas` `each` times, all at once;
/// answers the responses that were admitted (200 or 201) and checks that
/// every other one is a 429 naming `max_concurrent_sessions`.
async fn at_once(
    replicas: &[&Server],
    each: usize,
    path: &str,
    body: Value,
) -> Vec<reqwest::Response> {
    let sends = replicas
        .iter()
        .flat_map(|server| (0..each).map(|_| server.send(RACER, Method::POST, path, body.clone())));
    let mut admitted = Vec::new();
    for response in futures::future::join_all(sends).await {
        if response.status().is_success() {
            admitted.push(response);
        } else {
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
            let body: Value = response.json().await.unwrap();
            assert_eq!(body["error"]["quota"], "max_concurrent_sessions", "{body}");
            assert_eq!(body["error"]["key"], "racer", "{body}");
        }
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_started_at_once_on_three_replicas_stay_within_the_keys_limit() {
    let database = common::postgres::TestDatabase::create(&common::postgres::test_server()).await;
    let nats = common::nats::NatsServer::start(true).await;
    let url = database.url();
    let shared = ["--store", url.as_str(), "--bus", nats.url.as_str()];
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Server::start_with("local", &shared).await);
    }
    let all: Vec<&Server> = replicas.iter().collect();

    // Fifteen runs at once, five on each replica: a run's session counts
    // from its admission, not from its first write.
    let body = json!({"prompt": long_prompt(100), "sandbox_enabled": false});
    let runs = at_once(&all, 5, "/agent/run", body).await;
    assert!(
        (1..=2).contains(&runs.len()),
        "{} of 15 runs were admitted with max_concurrent_sessions = 2",
        runs.len()
    );
    for run in runs {
        let events = Lines::new(run).until("result").await;
        assert_eq!(events.last().unwrap()["status"], "success");
    }

    // Sessions made at once: as many as the key may keep, once the runs'
    // slots are given back (each run's at its end).
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut made = Vec::new();
    while made.len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no room for sessions came back"
        );
        made.extend(at_once(&all, 2, "/agent/session", json!({})).await);
        assert!(
            made.len() <= 2,
            "{} sessions were made with room for 2",
            made.len()
        );
    }
    for server in replicas {
        server.stop().await;
    }
}

/// Opens an MCP session over HTTP with `key` and runs `command` in its
/// scratch sandbox; answers the call's response body.
async fn scratch_call(server: &Server, key: &str, command: &str) -> String {
    let mcp = format!("{}/mcp", server.url);
    let arguments = json!({"command": command});
    common::mcp_tool_call(&server.http, &mcp, Some(key), "execute_shell", arguments).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_scratch_sandboxes_take_the_keys_sandbox_slots() {
    let server = Server::start("local").await;
    // Five MCP connections of a key with max_sandboxes = 2, each running
    // a command in its scratch sandbox (no session named).
    let mut ran = 0;
    let mut refused = Vec::new();
    for _ in 0..5 {
        let body = scratch_call(&server, GREEDY, "echo scratch-ran").await;
        if body.contains("scratch-ran") {
            ran += 1;
        } else {
            refused.push(body);
        }
    }
    assert_eq!(ran, 2, "{refused:?}");
    for body in &refused {
        assert!(body.contains("max_sandboxes"), "{body}");
    }
    // Another key's scratch sandbox is not held back.
    let other = scratch_call(&server, OTHER, "echo other-ran").await;
    assert!(other.contains("other-ran"), "{other}");
    server.stop().await;
}
