//! The real binary on the PostgreSQL store: what one server wrote, a second
//! server with another data directory reads from the same database after
//! the first has stopped; a database that does not answer is a start error
//! that names the URL without its password.
//!
//! Needs `CONCLAVE_TEST_POSTGRES` (scripts/test.sh starts a server and sets
//! it); each test makes a database of its own there.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::binary::{serve_command, spawn_server, stop};
use common::ndjson;
use common::postgres::{TestDatabase, test_server};
use conclave::store::{PostgresStore, SessionStore};
use serde_json::{Value, json};

async fn get_json(http: &reqwest::Client, url: String) -> Value {
    let response = http.get(&url).send().await.unwrap();
    assert_eq!(response.status(), 200, "GET {url}");
    response.json().await.unwrap()
}

async fn events(http: &reqwest::Client, url: &str, id: &str) -> Vec<Value> {
    ndjson(
        http.get(format!("{url}/agent/session/{id}/events"))
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// A session's status without what lives in one process only (its
/// sandbox, the gateway's in-memory traces).
async fn stored_status(http: &reqwest::Client, url: &str, id: &str) -> Value {
    let mut status = get_json(http, format!("{url}/agent/session/{id}/status")).await;
    let fields = status.as_object_mut().unwrap();
    fields.remove("sandbox");
    fields.remove("gateway_calls");
    status
}

/// Waits until the ephemeral session `id` is closed, which happens just
/// after its run's stream ends.
async fn closed(http: &reqwest::Client, url: &str, id: &str) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while stored_status(http, url, id).await["status"] != "closed" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "run {id} not closed after 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_second_server_reads_what_the_first_wrote_to_postgres() {
    let database = TestDatabase::create(&test_server()).await;
    let store_url = database.url();
    let (first_dir, second_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let http = reqwest::Client::new();
    let serve = |dir: &tempfile::TempDir| {
        serve_command(&[
            "--store",
            &store_url,
            "--data-dir",
            dir.path().to_str().unwrap(),
        ])
    };

    let (mut first, url) = spawn_server(&mut serve(&first_dir)).await;
    let created: Value = http
        .post(format!("{url}/agent/session"))
        .json(&json!({"session_name": "kept"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let session = created["session_id"].as_str().unwrap().to_owned();
    let turn = ndjson(
        http.post(format!("{url}/agent/session/{session}/message"))
            .json(&json!({"prompt": "remember this"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(turn.last().unwrap()["type"], "result", "{turn:?}");
    let run = ndjson(
        http.post(format!("{url}/agent/run"))
            .json(&json!({"prompt": "an ephemeral run"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(run.last().unwrap()["type"], "result", "{run:?}");
    let ran = run[0]["session_id"].as_str().unwrap().to_owned();
    closed(&http, &url, &ran).await;
    let before: Vec<(Value, Vec<Value>)> =
        futures::future::join_all([&session, &ran].map(|id| async {
            (
                stored_status(&http, &url, id).await,
                events(&http, &url, id).await,
            )
        }))
        .await;
    let listed = get_json(&http, format!("{url}/agent/sessions")).await;
    stop(&mut first).await;

    let (mut second, url) = spawn_server(&mut serve(&second_dir)).await;
    for (id, (status, logged)) in [&session, &ran].into_iter().zip(&before) {
        assert_eq!(&stored_status(&http, &url, id).await, status);
        assert_eq!(&events(&http, &url, id).await, logged);
    }
    assert_eq!(before[0].0["session_name"], "kept");
    assert_eq!(before[0].0["status"], "idle");
    assert_eq!(
        get_json(&http, format!("{url}/agent/sessions")).await,
        listed
    );
    stop(&mut second).await;

    // The messages as the store holds them: the prompt, then the reply.
    let store = PostgresStore::open(&store_url).await.unwrap();
    let messages = store.messages(session.parse().unwrap()).await.unwrap();
    let roles: Vec<Value> = messages
        .iter()
        .map(|m| serde_json::to_value(m).unwrap()["role"].clone())
        .collect();
    assert_eq!(roles, [json!("user"), json!("assistant")], "{messages:?}");
    conclave::store::Store::close(&store).await.unwrap();
}

#[tokio::test]
async fn a_database_that_does_not_answer_is_a_start_error_without_the_password() {
    let dir = tempfile::tempdir().unwrap();
    // A port nobody listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://conclave:hunter2@127.0.0.1:{port}/conclave");
    let output = serve_command(&["--store", &url, "--data-dir", dir.path().to_str().unwrap()])
        .output()
        .await
        .unwrap();

    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "postgres://conclave:***@127.0.0.1:{port}/conclave"
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

/// `/ready` on `url` until it answers `status` (within 60 s).
async fn ready_is(http: &reqwest::Client, url: &str, status: u16) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let answered = http.get(format!("{url}/ready")).send().await.unwrap();
        if answered.status().as_u16() == status {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/ready stayed {}, not {status}",
            answered.status()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_database_that_goes_away_is_a_503_with_retry_after_and_the_server_comes_back() {
    let database = TestDatabase::create(&test_server()).await;
    let mut through = url::Url::parse(&database.url()).unwrap();
    let target = format!(
        "{}:{}",
        through.host_str().unwrap(),
        through.port().unwrap_or(5432)
    );
    let proxy = common::proxy::Proxy::start(target).await;
    through.set_host(Some("127.0.0.1")).unwrap();
    through.set_port(Some(proxy.port)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut command = serve_command(&["--store", through.as_str()]);
    command.current_dir(dir.path());
    let (mut child, url) = spawn_server(&mut command).await;
    let http = reqwest::Client::new();
    let run = |prompt: &str| {
        http.post(format!("{url}/agent/run"))
            .json(&json!({"prompt": prompt, "sandbox_enabled": false}))
            .send()
    };
    let before = run("before").await.unwrap();
    assert_eq!(before.status(), 200);
    let _ = before.text().await;

    // The database goes away: not ready, and a run is a 503 to retry.
    proxy.cut();
    ready_is(&http, &url, 503).await;
    let refused = run("during").await.unwrap();
    assert_eq!(refused.status(), 503);
    let retry: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "store_unavailable", "{body}");

    // It comes back: so does the server, with nothing to restart.
    proxy.mend();
    ready_is(&http, &url, 200).await;
    let after = run("after").await.unwrap();
    assert_eq!(after.status(), 200);
    let events = ndjson(after).await;
    assert_eq!(events.last().unwrap()["status"], "success");
    stop(&mut child).await;
}
