//! Weight sync around a gateway pool with real `conclave sim` replicas:
//! `begin` waits for the call in flight, a call sent meanwhile waits and
//! goes on after `commit`, under the committed version (its trace says
//! so), and the commit is announced on the bus.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::sim::Sim;
use common::{Lines, TestServer};
use conclave::gateway::{GatewayConfig, PoolConfig};
use serde_json::{Value, json};

/// Reads `GET /gateway/replicas` until `check` holds for the pool `name`
/// (each read follows a change the test caused; 10 s at most).
async fn until(server: &TestServer, name: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let view: Value = server.get("/gateway/replicas").await.json().await.unwrap();
        let pool = view["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["model"] == name)
            .unwrap()
            .clone();
        if check(&pool) {
            return pool;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pool {name} never got there: {pool}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn call(server: &TestServer, model: &str) -> tokio::task::JoinHandle<(u16, Value)> {
    let request = server
        .http
        .post(server.url("/v1/completions"))
        .json(&json!({"model": model, "prompt": "hello", "max_tokens": 4}));
    tokio::spawn(async move {
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    })
}

#[tokio::test]
async fn begin_waits_for_calls_in_flight_and_commit_resumes_under_the_new_version() {
    let sim = Sim::start("r1", &[]).await;
    sim.configure(json!({"latency_ms": 400})).await;
    let pool = |id: &str, wait_s| PoolConfig {
        replicas: vec![conclave::gateway::ReplicaConfig {
            id: Some(id.into()),
            ..sim.replica()
        }],
        weights_wait_s: wait_s,
        ..PoolConfig::default()
    };
    let server = TestServer::start_with(|config| {
        config.gateway = GatewayConfig {
            pools: [
                ("m".to_string(), pool("r1", 300)),
                ("n".to_string(), pool("r2", 0)),
            ]
            .into(),
            ..GatewayConfig::default()
        };
    })
    .await;
    let mut announced = Lines::new(server.get("/bus/subscribe?subjects=sync.>").await);

    let first = call(&server, "m");
    until(&server, "m", |p| p["weights"]["in_flight"] == 1).await;
    let begin = {
        let request = server
            .http
            .post(server.url("/gateway/pools/m/weights/begin"));
        tokio::spawn(async move { request.send().await.unwrap() })
    };
    until(&server, "m", |p| p["weights"]["paused"] == true).await;
    let second = call(&server, "m");
    until(&server, "m", |p| p["weights"]["waiting"] == 1).await;
    let begun = begin.await.unwrap();
    assert_eq!(begun.status(), 200);
    // Quiet when begin answered: the first call had ended, the second waits.
    let pool_now = until(&server, "m", |_| true).await;
    assert_eq!(pool_now["weights"]["in_flight"], 0, "{pool_now}");
    assert_eq!(pool_now["weights"]["waiting"], 1, "{pool_now}");
    assert_eq!(first.await.unwrap().0, 200);
    assert!(!second.is_finished());

    let committed = server
        .post("/gateway/pools/m/weights/commit", json!({"version": 5}))
        .await;
    assert_eq!(committed.status(), 200);
    let committed: Value = committed.json().await.unwrap();
    assert_eq!(committed["replicas"], json!(["r1"]));
    let (status, _) = second.await.unwrap();
    assert_eq!(status, 200);
    let pool_now = until(&server, "m", |p| p["weights"]["paused"] == false).await;
    assert_eq!(pool_now["replicas"][0]["weights_version"], 5);
    let traces: Value = server.get("/gateway/traces").await.json().await.unwrap();
    let versions: Vec<&Value> = traces["traces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["weights_version"])
        .collect();
    // Newest first: the second call ran under version 5, the first under none.
    assert_eq!(versions, [&json!(5), &Value::Null]);
    let ready = tokio::time::timeout(Duration::from_secs(10), announced.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ready["subject"], "sync/weights_ready");
    assert_eq!(ready["data"], json!({"model": "m", "version": 5}));

    // A pool that lets calls wait 0 s fails them at once while paused.
    let begun = server
        .post("/gateway/pools/n/weights/begin", json!({}))
        .await;
    assert_eq!(begun.status(), 200);
    let (status, body) = call(&server, "n").await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "pool_paused");
    // Bad input.
    let no_version = server
        .post("/gateway/pools/n/weights/commit", json!({}))
        .await;
    assert_eq!(no_version.status(), 422);
    let unknown = server
        .post("/gateway/pools/nope/weights/begin", json!({}))
        .await;
    assert_eq!(unknown.status(), 404);
    let extra = server
        .post(
            "/gateway/pools/n/weights/commit",
            json!({"version": 1, "x": 2}),
        )
        .await;
    assert_eq!(extra.status(), 422);
    drop(announced);
    server.stop().await;
}
