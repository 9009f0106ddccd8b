//! Rollouts over three real `conclave sim` replicas: the response topic
//! read from the KV (waited for), every prompt's result published with its
//! token ids, replica and weights version, a failing pool's prompts
//! published with their errors, progress, and bad input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::sim::Sim;
use common::{Lines, TestServer};
use conclave::gateway::{GatewayConfig, PoolConfig};
use reqwest::Method;
use serde_json::{Value, json};

async fn next(lines: &mut Lines) -> Value {
    tokio::time::timeout(Duration::from_secs(30), lines.next())
        .await
        .expect("a line within 30 s")
        .expect("the stream goes on")
}

#[tokio::test]
async fn a_rollout_publishes_every_result_with_token_ids_and_the_weights_version() {
    let sims = [
        Sim::start("r1", &[]).await,
        Sim::start("r2", &[]).await,
        Sim::start("r3", &[]).await,
    ];
    let failing = Sim::start("bad", &[]).await;
    failing
        .configure(json!({"failure_rate": 1.0, "failure_status": 400}))
        .await;
    let server = TestServer::start_with(|config| {
        config.gateway = GatewayConfig {
            pools: [
                (
                    "m".to_string(),
                    PoolConfig {
                        replicas: sims.iter().map(Sim::replica).collect(),
                        ..PoolConfig::default()
                    },
                ),
                (
                    "broken".to_string(),
                    PoolConfig {
                        replicas: vec![failing.replica()],
                        num_retries: 0,
                        ..PoolConfig::default()
                    },
                ),
            ]
            .into(),
            ..GatewayConfig::default()
        };
    })
    .await;
    let begun = server
        .post("/gateway/pools/m/weights/begin", json!({}))
        .await;
    assert_eq!(begun.status(), 200);
    let committed = server
        .post("/gateway/pools/m/weights/commit", json!({"version": 1}))
        .await;
    assert_eq!(committed.status(), 200);
    let mut results = Lines::new(
        server
            .get("/bus/subscribe?subjects=inference.results.*,rollout.completed")
            .await,
    );

    // No response_topic: the rollout waits for the KV key.
    let prompts: Vec<String> = (0..64).map(|i| format!("prompt {i}")).collect();
    let started = server
        .post(
            "/rollouts",
            json!({"model": "m", "prompts": prompts, "metadata": {"step": 7},
                   "sampling": {"max_tokens": 8, "return_token_ids": true, "logprobs": true}}),
        )
        .await;
    assert_eq!(started.status(), 202);
    let id = started.json::<Value>().await.unwrap()["rollout_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let progress: Value = server
        .get(&format!("/rollouts/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(progress["state"], "waiting_for_topic", "{progress}");
    let put = server
        .send_as(
            "-",
            Method::PUT,
            "/kv/inference_response_topic",
            Some(json!("inference/results/shared")),
        )
        .await;
    assert_eq!(put.status(), 200);

    let mut indexes = BTreeSet::new();
    let mut replicas = BTreeSet::new();
    for _ in 0..64 {
        let message = next(&mut results).await;
        assert_eq!(message["subject"], "inference/results/shared");
        let result = &message["data"];
        assert_eq!(result["rollout_id"], id.as_str());
        assert!(result.get("error").is_none(), "{result}");
        let index = result["index"].as_u64().unwrap();
        assert_eq!(result["prompt"], format!("prompt {index}"));
        assert_eq!(result["weights_version"], 1);
        assert_eq!(result["metadata"], json!({"step": 7}));
        let output = &result["outputs"][0];
        assert!(
            !output["token_ids"].as_array().unwrap().is_empty(),
            "{result}"
        );
        assert!(output["text"].as_str().unwrap().len() > 1);
        assert!(output["logprobs"].is_object(), "{result}");
        assert!(result["usage"]["completion_tokens"].as_u64().unwrap() > 0);
        indexes.insert(index);
        replicas.insert(result["replica"].as_str().unwrap().to_owned());
    }
    assert_eq!(indexes, (0..64).collect());
    assert_eq!(
        replicas.len(),
        3,
        "every replica took prompts: {replicas:?}"
    );
    let done = next(&mut results).await;
    assert_eq!(done["subject"], "rollout.completed");
    assert_eq!(
        (
            done["data"]["count"].as_u64(),
            done["data"]["failed"].as_u64()
        ),
        (Some(64), Some(0))
    );
    let progress: Value = server
        .get(&format!("/rollouts/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (progress["state"].as_str(), progress["completed"].as_u64()),
        (Some("completed"), Some(64))
    );

    // A failing pool: every prompt is published, with its error.
    let started = server
        .post("/rollouts", json!({"model": "broken", "prompts": ["a", "b"], "response_topic": "inference.results.broken"}))
        .await;
    assert_eq!(started.status(), 202);
    for _ in 0..2 {
        let message = next(&mut results).await;
        assert_eq!(message["subject"], "inference.results.broken");
        assert!(
            message["data"]["error"].as_str().unwrap().contains("400"),
            "{message}"
        );
    }
    let done = next(&mut results).await;
    assert_eq!(done["data"]["failed"], 2);

    // Bad input.
    for (body, status) in [
        (json!({"model": "m"}), 422),
        (json!({"model": "m", "prompts": []}), 422),
        (
            json!({"model": "m", "prompts": ["x"], "sampling": {"seed": 1}}),
            422,
        ),
        (
            json!({"model": "m", "prompts": ["x"], "response_topic": "a..b"}),
            422,
        ),
        (json!({"model": "m", "prompts": ["x"], "extra": 1}), 422),
        (json!({"model": "nope", "prompts": ["x"]}), 404),
    ] {
        let response = server.post("/rollouts", body.clone()).await;
        assert_eq!(response.status(), status, "{body}");
    }
    assert_eq!(server.get("/rollouts/not-an-id").await.status(), 404);
    assert_eq!(
        server
            .get(&format!("/rollouts/{}", uuid::Uuid::new_v4()))
            .await
            .status(),
        404
    );
    drop(results);
    server.stop().await;
}

/// A rollout belongs to the key that started it: another key cannot read
/// its progress or receive its results.
#[tokio::test]
async fn a_rollout_belongs_to_its_key() {
    const KEY_A: &str = "tenant-a-key-1";
    const KEY_B: &str = "tenant-b-key-2";
    let sim = Sim::start("r1", &[]).await;
    let server = TestServer::start_with(|config| {
        config.api_keys = vec![KEY_A.into(), KEY_B.into()];
        config.gateway = GatewayConfig {
            pools: [(
                "m".to_string(),
                PoolConfig {
                    replicas: vec![sim.replica()],
                    ..PoolConfig::default()
                },
            )]
            .into(),
            ..GatewayConfig::default()
        };
    })
    .await;
    let subscribe = |key: &str| {
        server
            .http
            .get(server.url("/bus/subscribe?subjects=%3E"))
            .bearer_auth(key)
            .send()
    };
    let mut b_sees = Lines::new(subscribe(KEY_B).await.unwrap());
    let mut a_sees = Lines::new(subscribe(KEY_A).await.unwrap());
    let started = server
        .send_as(
            KEY_A,
            Method::POST,
            "/rollouts",
            Some(json!({"model": "m", "prompts": ["x"], "response_topic": "results"})),
        )
        .await;
    assert_eq!(started.status(), 202);
    let id = started.json::<Value>().await.unwrap()["rollout_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(next(&mut a_sees).await["subject"], "results");
    assert_eq!(next(&mut a_sees).await["subject"], "rollout.completed");
    let theirs = server
        .send_as(KEY_B, Method::GET, &format!("/rollouts/{id}"), None)
        .await;
    assert_eq!(theirs.status(), 404);
    let mine = server
        .send_as(KEY_A, Method::GET, &format!("/rollouts/{id}"), None)
        .await;
    assert_eq!(mine.status(), 200);
    // B's stream got nothing of A's: its first message is its own.
    let own = server
        .send_as(KEY_B, Method::POST, "/bus/publish/mine", Some(json!(1)))
        .await;
    assert_eq!(own.status(), 202);
    assert_eq!(next(&mut b_sees).await["subject"], "mine");
    drop((a_sees, b_sees));
    server.stop().await;
}
