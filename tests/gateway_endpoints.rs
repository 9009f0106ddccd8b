//! The gateway's Responses API, embeddings, tokenize and detokenize over
//! real `conclave sim` replicas: the official OpenAI Python SDK through
//! it (a conversation stays on the replica that stored it, calls survive
//! a stopped replica), and the token endpoints, bad input, key scoping,
//! traces and metrics over plain HTTP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::TestServer;
use common::sim::{Sim, checked_pool, gateway, gateway_with, sdk_script};
use conclave::gateway::{HealthConfig, PoolConfig, ReplicaConfig, Strategy};
use serde_json::{Value, json};

/// Runs `tests/gateway/openai_responses.py` in `phase` (`both` replicas
/// up, or `one`) and returns what it printed.
async fn sdk(server: &TestServer, phase: &str) -> Value {
    sdk_script(server, "openai_responses.py", "rs-1", &[phase]).await
}

/// POSTs `body` to `path` and returns the status and JSON body.
async fn post(server: &TestServer, path: &str, body: Value) -> (u16, Value) {
    post_as(server, None, path, body).await
}

async fn post_as(server: &TestServer, key: Option<&str>, path: &str, body: Value) -> (u16, Value) {
    let mut request = server.http.post(server.url(path)).json(&body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.expect("post");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The official SDK's `responses.create` (streamed and not) and
/// `embeddings.create` over two replicas: follow-ups stay where their
/// conversation is stored, new ones spread, and with one replica stopped
/// every call still succeeds.
#[tokio::test]
async fn the_openai_sdk_uses_responses_and_embeddings_through_the_gateway() {
    let a = Sim::start("a", &[]).await;
    let mut b = Sim::start("b", &[]).await;
    // No health checks and no cooldown: a stopped replica stays in turn,
    // so every other call meets it and must go on to the other.
    let pool = PoolConfig {
        cooldown_s: 0,
        health: HealthConfig {
            enabled: false,
            ..HealthConfig::default()
        },
        ..checked_pool(Strategy::RoundRobin, &[&a, &b])
    };
    let server = gateway(vec![("m", pool)]).await;
    let seen = sdk(&server, "both").await;
    let chain: Vec<&str> = seen["chain"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(chain.len(), 7);
    assert!(
        chain.iter().all(|r| *r == chain[0]),
        "a follow-up left its replica: {chain:?}"
    );
    assert_eq!(seen["spread"], json!(["a", "b"]));
    let words = " t1 t2 t3 t4 t5 t6 t7 t8 t9 t10 t11 t12 t13 t14 t15";
    assert_eq!(seen["stream_text"], words);
    assert_eq!(seen["whole_text"], words);
    assert_eq!(seen["whole_status"], "completed");
    assert_eq!(
        seen["stream_deltas"], 16,
        "the stream was not passed on event by event"
    );
    assert_eq!(seen["stream_first"], "response.created");
    assert_eq!(seen["stream_last"], "response.completed");
    assert_eq!(
        seen["stream_kinds"],
        json!([
            "response.completed",
            "response.content_part.added",
            "response.content_part.done",
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.output_item.done",
            "response.output_text.delta",
            "response.output_text.done"
        ])
    );
    assert_eq!(seen["stream_usage"], json!([3, 16]));
    assert_eq!(seen["embedding_dims"], 8);
    assert_eq!(seen["embedding_count"], 2);
    assert_eq!(seen["embedding_same"], true);
    assert_eq!(seen["embedding_differs"], true);
    assert_eq!(seen["base64_floats"], 4);
    assert_eq!(seen["embedding_usage"], 2);
    assert_eq!(seen["slug_response"], true);
    assert_eq!(seen["slug_embedding"], 1);
    assert_eq!(seen["unknown_model"], "NotFoundError 404");
    assert_eq!(seen["unknown_previous"], "NotFoundError 404");
    assert_eq!(seen["empty_input"], "BadRequestError 400");
    assert_eq!(seen["bad_format"], "BadRequestError 400");

    // Traces name the endpoint and read what each answer said.
    let traces = server.get_json("/gateway/traces?session_id=rs-1").await;
    let endpoints: Vec<&str> = traces["traces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["endpoint"].as_str().unwrap())
        .collect();
    assert_eq!(endpoints, ["embeddings", "responses"]);
    let traces = server.get_json("/gateway/traces?limit=1000").await;
    let responses: Vec<&Value> = traces["traces"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["endpoint"] == "responses" && t["status"] == "ok")
        .collect();
    assert!(responses.len() >= 12, "{}", responses.len());
    for trace in &responses {
        assert!(
            trace["response_text"].as_str().unwrap().ends_with(" t15"),
            "{trace}"
        );
        assert_eq!(trace["usage"]["output_tokens"], 16, "{trace}");
        assert!(trace["ttft_ms"].is_number(), "{trace}");
    }
    let metrics = server.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains(r#"conclave_gateway_calls_total{pool="m",replica="b",outcome="ok"}"#),
        "{metrics}"
    );

    // One replica stopped: conversations, streams and embeddings go on
    // on the other, before the health checks notice as after.
    b.child.kill().await.expect("kill");
    let seen = sdk(&server, "one").await;
    assert_eq!(seen["chain"], json!(["a", "a", "a", "a", "a", "a", "a"]));
    assert_eq!(seen["spread"], json!(["a"]));
    assert_eq!(seen["stream_text"], words);
    assert_eq!(seen["embedding_count"], 2);
    let traces = server.get_json("/gateway/traces?limit=1000").await;
    for endpoint in ["responses", "embeddings"] {
        let retried = traces["traces"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["endpoint"] == endpoint && t["retries"].as_u64() > Some(0))
            .inspect(|t| assert_eq!(t["replica"], "a", "{t}"))
            .count();
        assert!(retried > 0, "no {endpoint} call met the stopped replica");
    }
}

/// `/tokenize` and `/detokenize` pass through (a round trip gives the
/// prompt back), bad bodies are refused before any replica is called, a
/// replica without the endpoint gives a clear error, and a response id is
/// only followed up by the key whose call made it.
#[tokio::test]
async fn tokens_round_trip_bad_input_is_refused_and_response_ids_stay_with_their_key() {
    let a = Sim::start("a", &[]).await;
    // The same sim under another path: it has no `/elsewhere/tokenize`.
    let elsewhere = PoolConfig {
        replicas: vec![ReplicaConfig {
            id: Some("bare".into()),
            url: a.url.replace("/v1", "/elsewhere/v1"),
            model: None,
            api_key: None,
        }],
        ..PoolConfig::default()
    };
    let (alice, bob) = ("key-alice-0123456789", "key-bob-0123456789ab");
    let server = gateway_with(
        vec![
            ("m", checked_pool(Strategy::RoundRobin, &[&a])),
            ("bare", elsewhere),
        ],
        |config| config.api_keys = vec![alice.into(), bob.into()],
    )
    .await;
    let me = Some(alice);
    let prompt = "héllo, wörld";
    let (status, tokens) = post_as(
        &server,
        me,
        "/tokenize",
        json!({"model": "m", "prompt": prompt}),
    )
    .await;
    assert_eq!(status, 200, "{tokens}");
    assert_eq!(tokens["count"], prompt.len());
    assert!(tokens["max_model_len"].as_u64().unwrap() > 0);
    let (status, text) = post_as(
        &server,
        me,
        "/detokenize",
        json!({"model": "m", "tokens": tokens["tokens"]}),
    )
    .await;
    assert_eq!((status, text), (200, json!({"prompt": prompt})));
    let slug = conclave::gateway::slug::encode(json!({"session_id": "tok"}).as_object().unwrap());
    let (status, _) = post_as(
        &server,
        me,
        &format!("/meta/{slug}/tokenize"),
        json!({"model": "m", "prompt": "x"}),
    )
    .await;
    assert_eq!(status, 200);

    // Refused with a JSON error naming what is wrong.
    let sim_requests = a.stats().await["requests"].as_u64().unwrap();
    for (path, body, status, needle) in [
        ("/tokenize", json!({"model": "m"}), 400, "prompt"),
        ("/tokenize", json!({"prompt": "x"}), 400, "model"),
        (
            "/detokenize",
            json!({"model": "m", "tokens": "12"}),
            400,
            "tokens",
        ),
        ("/v1/embeddings", json!({"model": "m"}), 400, "input"),
        (
            "/v1/embeddings",
            json!({"model": "m", "input": 7}),
            400,
            "input",
        ),
        (
            "/v1/responses",
            json!({"model": "m", "input": "x", "previous_response_id": 3}),
            400,
            "previous_response_id",
        ),
        (
            "/v1/responses",
            json!({"model": "nope", "input": "x"}),
            404,
            "nope",
        ),
        ("/v1/embeddings", json!([1, 2]), 422, "object"),
    ] {
        let (got, error) = post_as(&server, me, path, body.clone()).await;
        assert_eq!(got, status, "{path} {body}: {error}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{path} {body}: {error}");
    }
    assert_eq!(
        a.stats().await["requests"].as_u64().unwrap(),
        sim_requests,
        "a refused call reached the replica"
    );
    let (status, error) = post_as(
        &server,
        me,
        "/tokenize",
        json!({"model": "bare", "prompt": "x"}),
    )
    .await;
    assert_eq!(status, 404, "{error}");
    assert_eq!(error["error"]["code"], "endpoint_not_served");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not serve /tokenize"),
        "{error}"
    );

    // Alice's response id: she follows it up; Bob, naming it, is told
    // there is no such response, and his call reaches no replica.
    let (status, first) = post_as(
        &server,
        me,
        "/v1/responses",
        json!({"model": "m", "input": "hi"}),
    )
    .await;
    assert_eq!(status, 200, "{first}");
    let id = first["id"].as_str().unwrap();
    let follow = json!({"model": "m", "input": "more", "previous_response_id": id});
    let (status, _) = post_as(&server, me, "/v1/responses", follow.clone()).await;
    assert_eq!(status, 200);
    let before = a.stats().await["requests"].as_u64().unwrap();
    let (status, error) = post_as(&server, Some(bob), "/v1/responses", follow).await;
    assert_eq!(status, 404, "{error}");
    assert_eq!(error["error"]["code"], "response_not_found");
    assert_eq!(a.stats().await["requests"].as_u64().unwrap(), before);
    let (status, _) = post(
        &server,
        "/v1/responses",
        json!({"model": "m", "input": "x"}),
    )
    .await;
    assert_eq!(status, 401, "no key, no call");
}
