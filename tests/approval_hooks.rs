//! Who decides a waiting call: the permission hook (allow, deny, ask, slow,
//! unreachable, outside the egress rules), the session's key or an admin
//! key (never another key), an API key's policy that a session cannot
//! loosen; and a call left waiting by a server that was killed, with the
//! real binary restarted on the same data directory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "approvals/script.rs"]
#[allow(dead_code)]
mod script;
#[path = "providers/upstream.rs"]
#[allow(dead_code)]
mod upstream;

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use common::TestServer;
use common::binary::{serve_command, spawn_server};
use script::{
    allow, bash, capable, decide, of_type, says, start_turn, status_says, told, until_asked,
};
use serde_json::{Value, json};
use upstream::Upstream;

/// A hook that decides by the command: `allow …`, `deny …`, `ask …`, and
/// `slow …`, which it never answers. It records what it was asked.
async fn hook() -> (String, Arc<Mutex<Vec<Value>>>) {
    async fn answer(
        State(asked): State<Arc<Mutex<Vec<Value>>>>,
        Json(body): Json<Value>,
    ) -> Json<Value> {
        asked.lock().unwrap().push(body.clone());
        let command = body["input"]["command"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        match command.split_whitespace().next() {
            Some("allow") => Json(json!({"decision": "allow"})),
            Some("deny") => Json(json!({"decision": "deny", "message": "the hook says no"})),
            Some("slow") => std::future::pending().await,
            _ => Json(json!({"decision": "ask"})),
        }
    }
    let asked = Arc::new(Mutex::new(Vec::new()));
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(answer))
        .with_state(asked.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, asked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hook_allows_denies_and_falls_back_to_a_person() {
    let upstream = Upstream::start(vec![
        bash("h1", "allow me"),
        bash("h2", "deny me"),
        bash("h3", "slow one"),
        bash("h4", "ask someone"),
        says("Done."),
        bash("u1", "allow me"),
        says("Done."),
    ])
    .await;
    let (hook_url, asked) = hook().await;
    let url = upstream.url.clone();
    let server = TestServer::start_with(move |c| {
        capable(c, &url);
        c.mcp.allowed_http_servers = vec!["127.0.0.1".into()];
    })
    .await;
    let outside = server
        .post(
            "/agent/session",
            json!({"model": "capable", "permissions": {"mode": "ask", "hook_url": "http://10.1.2.3/hook"}}),
        )
        .await;
    assert_eq!(outside.status(), 422);
    let body: Value = outside.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("hook_url"),
        "{body}"
    );

    let id = server
        .create_session(json!({"model": "capable", "permissions":
            {"mode": "ask", "hook_url": hook_url, "hook_timeout_ms": 300}}))
        .await;
    let mut turn = start_turn(&server, &id, "go").await;
    let before = until_asked(&mut turn, "h3").await;
    let decided = of_type(&before, "approval_decided");
    assert_eq!(
        (
            &decided[0]["call_id"],
            &decided[0]["by"],
            &decided[0]["decision"]
        ),
        (&json!("h1"), &json!("hook"), &json!("allow"))
    );
    assert_eq!(
        (&decided[1]["call_id"], &decided[1]["decision"]),
        (&json!("h2"), &json!("deny"))
    );
    let results = of_type(&before, "tool_result");
    assert_eq!(results[0]["output"], "ran: allow me");
    assert!(
        results[1]["output"]
            .as_str()
            .unwrap()
            .contains("the hook says no")
    );
    assert!(
        status_says(&before, "did not answer within 300 ms"),
        "{before:?}"
    );
    allow(&server, &id, "h3").await;
    until_asked(&mut turn, "h4").await;
    allow(&server, &id, "h4").await;
    let rest = turn.until("result").await;
    assert_eq!(rest.last().unwrap()["status"], "success");
    let seen = asked.lock().unwrap().clone();
    assert_eq!(seen.len(), 4);
    assert_eq!(seen[0]["session_id"], id.as_str());
    assert_eq!(
        (&seen[0]["call_id"], &seen[0]["tool"]),
        (&json!("h1"), &json!("Bash"))
    );

    // A hook that cannot be reached leaves the call to a person.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gone = format!("http://{}/hook", closed.local_addr().unwrap());
    drop(closed);
    let id = server
        .create_session(
            json!({"model": "capable", "permissions": {"mode": "ask", "hook_url": gone}}),
        )
        .await;
    let mut turn = start_turn(&server, &id, "go").await;
    let before = until_asked(&mut turn, "u1").await;
    assert!(status_says(&before, "could not be reached"), "{before:?}");
    allow(&server, &id, "u1").await;
    turn.until("result").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_sessions_key_or_an_admin_decides_and_a_key_policy_holds() {
    const OWNER: &str = "owner-key-1";
    const OTHER: &str = "other-key-2";
    const ADMIN: &str = "admin-key-3";
    let upstream = Upstream::start(vec![bash("k1", "echo one"), says("Done.")]).await;
    let url = upstream.url.clone();
    let server = TestServer::start_with(move |c| {
        capable(c, &url);
        c.api_keys = vec![OWNER.into(), OTHER.into()];
        c.admin_keys = vec![ADMIN.into()];
        c.agent.permissions.keys.insert(
            OWNER.into(),
            conclave::permission::Permissions {
                mode: Some(conclave::permission::Mode::AskWrites),
                ..Default::default()
            },
        );
    })
    .await;
    let send = |key: &str, method: reqwest::Method, path: String, body: Option<Value>| {
        server.send_as(key, method, &path, body)
    };
    let created = send(
        OWNER,
        reqwest::Method::POST,
        "/agent/session".into(),
        Some(json!({"model": "capable", "permissions": {"mode": "auto"}})),
    )
    .await;
    assert_eq!(created.status(), 201);
    let id = created.json::<Value>().await.unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let response = send(
        OWNER,
        reqwest::Method::POST,
        format!("/agent/session/{id}/message"),
        Some(json!({"prompt": "go"})),
    )
    .await;
    let mut turn = common::Lines::new(response);
    let before = until_asked(&mut turn, "k1").await;
    let asked = of_type(&before, "approval_requested")[0];
    assert!(
        asked["reason"].as_str().unwrap().contains("the API key's"),
        "{asked}"
    );
    let listed = |key: &'static str| {
        let request = send(key, reqwest::Method::GET, "/agent/approvals".into(), None);
        async move { request.await.json::<Value>().await.unwrap()["approvals"].clone() }
    };
    assert_eq!(listed(OTHER).await, json!([]));
    assert_eq!(listed(OWNER).await[0]["call_id"], "k1");
    let (status, _) = decide(
        &server,
        Some(OTHER),
        &id,
        "k1",
        json!({"decision": "allow"}),
    )
    .await;
    assert_eq!(status, 404, "another key's session is not found");
    let (status, _) = decide(&server, None, &id, "k1", json!({"decision": "allow"})).await;
    assert_eq!(status, 401);
    let (status, body) = decide(
        &server,
        Some(ADMIN),
        &id,
        "k1",
        json!({"decision": "allow"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let rest = turn.until("result").await;
    assert_eq!(of_type(&rest, "approval_decided")[0]["by"], "admin");
    assert_eq!(of_type(&rest, "tool_result")[0]["output"], "ran: echo one");
    server.stop().await;
}

/// Deleting a session ends its call's wait: the turn ends and nothing is
/// left waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_session_ends_its_wait() {
    let upstream = Upstream::start(vec![bash("d1", "echo never")]).await;
    let url = upstream.url.clone();
    let server = TestServer::start_with(move |c| capable(c, &url)).await;
    let id = server
        .create_session(json!({"model": "capable", "permissions": {"mode": "ask"}}))
        .await;
    let mut turn = start_turn(&server, &id, "go").await;
    until_asked(&mut turn, "d1").await;
    let deleted = server
        .http
        .delete(server.url(&format!("/agent/session/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    let rest = turn.until("result").await;
    assert_eq!(of_type(&rest, "approval_decided")[0]["by"], "interrupt");
    let result = of_type(&rest, "tool_result")[0]["output"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        result.starts_with("not run: the turn was stopped"),
        "{result}"
    );
    assert_eq!(
        server.get_json("/agent/approvals").await["approvals"],
        json!([])
    );
    let (status, _) = decide(&server, None, &id, "d1", json!({"decision": "allow"})).await;
    assert_eq!(status, 404);
    server.stop().await;
}

/// A server killed while a call waits: at restart the turn is closed as
/// interrupted, the call denied by the restart and listed; the next turn
/// starts from a valid history that says the call did not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_closes_the_wait_and_lists_the_call() {
    let upstream = Upstream::start(vec![bash("r1", "echo hi"), says("Starting over.")]).await;
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
    let args = |c: &mut tokio::process::Command| {
        c.arg("--data-dir")
            .arg(&data)
            .arg("--config")
            .arg(&config)
            .args(["--sandbox", "docker"]);
    };
    let mut first = serve_command(&[]);
    args(&mut first);
    let (mut child, url) = spawn_server(&mut first).await;
    let http = reqwest::Client::new();
    let created: Value = http
        .post(format!("{url}/agent/session"))
        .json(&json!({"model": "capable", "permissions": {"mode": "ask"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["session_id"].as_str().unwrap().to_string();
    let response = http
        .post(format!("{url}/agent/session/{id}/message"))
        .json(&json!({"prompt": "go"}))
        .send()
        .await
        .unwrap();
    let mut turn = common::Lines::new(response);
    until_asked(&mut turn, "r1").await;
    child.start_kill().unwrap();
    child.wait().await.unwrap();

    let mut again = serve_command(&[]);
    args(&mut again);
    let (mut child, url) = spawn_server(&mut again).await;
    let events = common::ndjson(
        http.get(format!("{url}/agent/session/{id}/events?since=0"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let decided = of_type(&events, "approval_decided");
    assert_eq!(
        (&decided[0]["call_id"], &decided[0]["by"]),
        (&json!("r1"), &json!("restart"))
    );
    assert!(
        of_type(&events, "status").iter().any(|s| {
            let m = s["message"].as_str().unwrap();
            m.contains("waited for approval") && m.contains("r1 (Bash")
        }),
        "{events:?}"
    );
    assert_eq!(events.last().unwrap()["status"], "interrupted");
    let listed: Value = http
        .get(format!("{url}/agent/approvals"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["approvals"], json!([]));
    let late = http
        .post(format!("{url}/agent/session/{id}/approvals/r1"))
        .json(&json!({"decision": "allow"}))
        .send()
        .await
        .unwrap();
    assert_eq!(late.status(), 409);
    let next = common::ndjson(
        http.post(format!("{url}/agent/session/{id}/message"))
            .json(&json!({"prompt": "again"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(next.last().unwrap()["status"], "success", "{next:?}");
    let requests: Vec<Value> = upstream.requests().into_iter().map(|r| r.body).collect();
    assert!(told(&requests[1], "r1").contains("server restarted"));
    common::binary::stop(&mut child).await;
    common::remove_sandboxes_of(&data).await;
}
