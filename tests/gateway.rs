//! The gateway against real `conclave sim` replicas (child processes on
//! 127.0.0.1:0): strategies, affinity, retries when a replica dies under
//! load, health checks, drain and pause, slugs, traces, bad input.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use common::TestServer;
use common::sim::{Sim, checked_pool as pool, gateway, sdk_script};
use conclave::gateway::Strategy;
use futures::future::join_all;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// One chat call: its status, replica header and body.
async fn chat(server: &TestServer, path: &str, body: Value) -> (u16, String, Value) {
    let response = server
        .http
        .post(server.url(path))
        .json(&body)
        .send()
        .await
        .expect("post");
    let status = response.status().as_u16();
    let replica = response
        .headers()
        .get("x-conclave-replica")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, replica, body)
}

fn ask(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hello"}]})
}

/// Which replica served each of `n` calls, counted.
async fn spread(
    server: &TestServer,
    n: usize,
    session: impl Fn(usize) -> Option<String>,
) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for i in 0..n {
        let mut request = server
            .http
            .post(server.url("/v1/chat/completions"))
            .json(&ask("m"));
        if let Some(session) = session(i) {
            request = request.header("x-session-id", session);
        }
        let response = request.send().await.expect("post");
        assert_eq!(response.status(), 200);
        let body: Value = response.json().await.expect("json");
        let served = body["system_fingerprint"]
            .as_str()
            .expect("sim id")
            .to_string();
        *counts.entry(served).or_insert(0) += 1;
    }
    counts
}

async fn replicas(server: &TestServer) -> Value {
    server
        .http
        .get(server.url("/gateway/replicas"))
        .send()
        .await
        .expect("replicas")
        .json()
        .await
        .expect("json")
}

/// Polls `/gateway/replicas` until `check` holds for replica `id` (health
/// checks run every 100 ms here); fails after 20 s.
async fn until_replica(server: &TestServer, id: &str, check: impl Fn(&Value) -> bool) {
    for _ in 0..400 {
        let all = replicas(server).await;
        let found = all["pools"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|p| p["replicas"].as_array().cloned().unwrap_or_default())
            .find(|r| r["id"] == id);
        if check(&found.unwrap_or(Value::Null)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "replica {id} never reached the state: {}",
        replicas(server).await
    );
}

#[tokio::test]
async fn round_robin_shuffle_and_least_outstanding_spread_calls() {
    let (a, b, c) = (
        Sim::start("a", &[]).await,
        Sim::start("b", &[]).await,
        Sim::start("c", &[]).await,
    );
    let server = gateway(vec![("m", pool(Strategy::RoundRobin, &[&a, &b, &c]))]).await;
    let counts = spread(&server, 30, |_| None).await;
    assert_eq!(
        counts,
        HashMap::from([("a".into(), 10), ("b".into(), 10), ("c".into(), 10)])
    );
    drop(server);

    let server = gateway(vec![("m", pool(Strategy::Shuffle, &[&a, &b, &c]))]).await;
    let counts = spread(&server, 60, |_| None).await;
    assert_eq!(counts.len(), 3, "shuffle left a replica out: {counts:?}");
    drop(server);

    // Least outstanding: two slow streamed calls held open on `a` (b and c
    // paused while they start), then calls one at a time all avoid it.
    a.configure(json!({"tokens_per_s": 5.0})).await;
    let server = gateway(vec![("m", pool(Strategy::LeastOutstanding, &[&a, &b, &c]))]).await;
    let act = |id: &str, action: &str| {
        server
            .http
            .post(server.url(&format!("/gateway/replicas/{id}/{action}")))
            .send()
    };
    for id in ["b", "c"] {
        assert_eq!(act(id, "pause").await.unwrap().status(), 200);
    }
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut body = ask("m");
        body["stream"] = json!(true);
        let response = server
            .http
            .post(server.url("/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.headers()["x-conclave-replica"], "a");
        held.push(response);
    }
    for id in ["b", "c"] {
        assert_eq!(act(id, "resume").await.unwrap().status(), 200);
    }
    let counts = spread(&server, 10, |_| None).await;
    assert_eq!(counts.get("a"), None, "{counts:?}");
    assert_eq!(counts.values().sum::<usize>(), 10);
    assert!(counts.len() == 2, "b and c share: {counts:?}");
    drop(held);
}

/// A whole answer goes out with the length the replica gave it (not in
/// chunks) and its trace says it ended; a stream goes out as it comes.
#[tokio::test]
async fn a_whole_answer_keeps_its_length_and_a_stream_streams() {
    let sim = Sim::start("a", &[]).await;
    let server = gateway(vec![("m", pool(Strategy::RoundRobin, &[&sim]))]).await;
    let whole = server.post("/v1/chat/completions", ask("m")).await;
    assert_eq!(whole.status(), 200);
    let length = whole.content_length();
    assert!(whole.headers().get("transfer-encoding").is_none());
    assert_eq!(length, Some(whole.bytes().await.unwrap().len() as u64));
    let mut streamed = ask("m");
    streamed["stream"] = json!(true);
    let stream = server.post("/v1/chat/completions", streamed).await;
    assert_eq!(stream.headers()["transfer-encoding"], "chunked");
    let text = stream.text().await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let traces = server.get_json("/gateway/traces?limit=2").await;
    for trace in traces["traces"].as_array().unwrap() {
        assert_eq!(trace["status"], "ok", "{traces}");
        let text = trace["response_text"].as_str().unwrap_or_default();
        assert!(text.starts_with('a'), "{traces}");
    }
    assert_eq!(traces["traces"].as_array().map(Vec::len), Some(2));
}

#[tokio::test]
async fn session_affinity_is_stable_and_survives_another_replica_leaving() {
    let sims = [
        Sim::start("a", &[]).await,
        Sim::start("b", &[]).await,
        Sim::start("c", &[]).await,
    ];
    let server = gateway(vec![(
        "m",
        pool(Strategy::SessionAffinity, &sims.iter().collect::<Vec<_>>()),
    )])
    .await;
    let home = |counts: HashMap<String, usize>| -> String {
        assert_eq!(counts.len(), 1, "a session moved: {counts:?}");
        counts.into_keys().next().unwrap()
    };
    let mut homes = BTreeMap::new();
    for session in 0..12 {
        let name = format!("session-{session}");
        homes.insert(
            name.clone(),
            home(spread(&server, 5, |_| Some(name.clone())).await),
        );
    }
    let used: std::collections::HashSet<_> = homes.values().collect();
    assert!(used.len() >= 2, "12 sessions all on one replica: {homes:?}");
    // A replica leaves: only its sessions move.
    let leaving = homes.values().next().unwrap().clone();
    let response = server
        .http
        .delete(server.url(&format!("/gateway/replicas/{leaving}")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    for (session, was) in &homes {
        let now = home(spread(&server, 3, |_| Some(session.clone())).await);
        if *was == leaving {
            assert_ne!(now, leaving);
        } else {
            assert_eq!(&now, was, "{session} moved though its replica stayed");
        }
    }
    // The same through a slug: metadata session_id routes and is traced.
    let session = homes.keys().find(|s| homes[*s] != leaving).unwrap().clone();
    let slug = conclave::gateway::slug::encode(
        json!({"session_id": session, "step": 7})
            .as_object()
            .unwrap(),
    );
    let (status, replica, _) = chat(
        &server,
        &format!("/meta/{slug}/v1/chat/completions"),
        ask("m"),
    )
    .await;
    assert_eq!((status, replica), (200, homes[&session].clone()));
    let traces: Value = server
        .http
        .get(server.url(&format!("/gateway/traces?session_id={session}&limit=1")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let trace = &traces["traces"][0];
    assert_eq!(trace["metadata"]["step"], 7);
    assert_eq!(trace["replica"], homes[&session].as_str());
    assert_eq!(trace["status"], "ok");
    assert!(
        trace["response_text"]
            .as_str()
            .unwrap()
            .starts_with(homes[&session].as_str())
    );
    assert!(trace["usage"]["completion_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn a_replica_killed_under_load_costs_no_client_an_error() {
    let mut sims = vec![
        Sim::start("a", &[]).await,
        Sim::start("b", &[]).await,
        Sim::start("c", &[]).await,
    ];
    let server = gateway(vec![(
        "m",
        pool(Strategy::RoundRobin, &sims.iter().collect::<Vec<_>>()),
    )])
    .await;
    let server = std::sync::Arc::new(server);
    let (done_tx, mut done_rx) = tokio::sync::mpsc::channel::<()>(1);
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let server = server.clone();
            let done = done_tx.clone();
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                // Not streamed: a stream cut by the kill after its first
                // byte is past where retries apply.
                for i in 0..40 {
                    let body = ask("m");
                    let response = server
                        .http
                        .post(server.url("/v1/chat/completions"))
                        .json(&body)
                        .send()
                        .await
                        .expect("post");
                    statuses.push(response.status().as_u16());
                    let text = response.text().await.expect("body");
                    assert!(text.contains("t15"), "a cut answer: {text}");
                    if i == 10 {
                        let _ = done.try_send(());
                    }
                }
                statuses
            })
        })
        .collect();
    // Kill a replica once the load is running.
    done_rx.recv().await;
    let mut killed = sims.remove(1);
    killed.child.kill().await.expect("kill");
    let statuses: Vec<u16> = join_all(clients)
        .await
        .into_iter()
        .flat_map(|r| r.expect("client"))
        .collect();
    assert_eq!(statuses.len(), 320);
    assert!(
        statuses.iter().all(|s| *s == 200),
        "client errors: {statuses:?}"
    );
    let traces: Value = server
        .http
        .get(server.url("/gateway/traces?limit=1000"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let retried = traces["traces"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["retries"].as_u64() > Some(0))
        .count();
    assert!(
        retried > 0,
        "no call was retried, so the kill was not exercised"
    );
}

#[tokio::test]
async fn rate_limited_replicas_are_retried_elsewhere_and_cooled_down() {
    let a = Sim::start("a", &["--failure-rate", "1", "--failure-status", "429"]).await;
    let b = Sim::start("b", &[]).await;
    let server = gateway(vec![("m", pool(Strategy::RoundRobin, &[&a, &b]))]).await;
    let counts = spread(&server, 10, |_| None).await;
    assert_eq!(counts, HashMap::from([("b".into(), 10)]));
    let all = replicas(&server).await;
    let a_view = &all["pools"][0]["replicas"][0];
    assert_eq!(a_view["id"], "a");
    assert!(a_view["failures"].as_u64().unwrap() >= 1);
    // With no retries and every replica failing, the upstream answer is
    // passed on as it came.
    b.configure(json!({"failure_rate": 1.0, "failure_status": 503}))
        .await;
    let (status, _, body) = chat(&server, "/v1/chat/completions", ask("m")).await;
    assert!(status == 503 || status == 429, "{status} {body}");
    assert_eq!(body["error"]["message"], "simulated failure");
}

#[tokio::test]
async fn unhealthy_replicas_leave_and_come_back() {
    let (a, b) = (Sim::start("a", &[]).await, Sim::start("b", &[]).await);
    let server = gateway(vec![("m", pool(Strategy::RoundRobin, &[&a, &b]))]).await;
    a.configure(json!({"healthy": false})).await;
    until_replica(&server, "a", |r| r["healthy"] == false).await;
    assert_eq!(
        spread(&server, 6, |_| None).await,
        HashMap::from([("b".into(), 6)])
    );
    a.configure(json!({"healthy": true})).await;
    until_replica(&server, "a", |r| r["healthy"] == true).await;
    assert_eq!(spread(&server, 6, |_| None).await.get("a"), Some(&3));
}

#[tokio::test]
async fn pause_resume_and_drain() {
    let a = Sim::start("a", &["--tokens-per-s", "40"]).await;
    let b = Sim::start("b", &[]).await;
    let server = gateway(vec![("m", pool(Strategy::RoundRobin, &[&a, &b]))]).await;
    let act = |id: &str, action: &str| {
        server
            .http
            .post(server.url(&format!("/gateway/replicas/{id}/{action}")))
            .send()
    };
    assert_eq!(act("a", "pause").await.unwrap().status(), 200);
    assert_eq!(
        spread(&server, 4, |_| None).await,
        HashMap::from([("b".into(), 4)])
    );
    assert_eq!(act("a", "resume").await.unwrap().status(), 200);
    assert_eq!(spread(&server, 4, |_| None).await.get("a"), Some(&2));

    // A streamed call on `a` (16 tokens at 40/s) is in flight when `a`
    // drains: it finishes, then `a` is gone.
    let b_pause = act("b", "pause").await.unwrap();
    assert_eq!(b_pause.status(), 200);
    let mut body = ask("m");
    body["stream"] = json!(true);
    let response = server
        .http
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-conclave-replica"], "a");
    assert_eq!(act("b", "resume").await.unwrap().status(), 200);
    let drained: Value = act("a", "drain").await.unwrap().json().await.unwrap();
    assert_eq!(drained["state"], "draining");
    assert_eq!(
        spread(&server, 3, |_| None).await,
        HashMap::from([("b".into(), 3)])
    );
    let text = response.text().await.unwrap();
    assert!(
        text.contains("t15") && text.contains("[DONE]"),
        "the drained call was cut: {text}"
    );
    until_replica(&server, "a", |r| r.is_null()).await;
    let unknown = act("a", "resume").await.unwrap();
    assert_eq!(unknown.status(), 404);
}

#[tokio::test]
async fn replicas_are_added_and_removed_at_run_time() {
    let a = Sim::start("a", &[]).await;
    let server = gateway(vec![]).await;
    let add = |body: Value| {
        server
            .http
            .post(server.url("/gateway/replicas"))
            .json(&body)
            .send()
    };
    let added = add(json!({"model": "m", "url": a.url, "id": "a"}))
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    assert_eq!(
        spread(&server, 2, |_| None).await,
        HashMap::from([("a".into(), 2)])
    );
    let models: Value = server
        .http
        .get(server.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "m");
    // Bad input: a clear error each, nothing changed.
    let duplicate = add(json!({"model": "m", "url": a.url, "id": "a"}))
        .await
        .unwrap();
    assert_eq!(duplicate.status(), 409);
    let bad_url = add(json!({"model": "m", "url": "ftp://x"})).await.unwrap();
    assert_eq!(bad_url.status(), 422);
    let missing = add(json!({"url": a.url})).await.unwrap();
    assert_eq!(missing.status(), 422);
    let unknown = add(json!({"model": "m", "url": a.url, "weight": 2}))
        .await
        .unwrap();
    assert_eq!(unknown.status(), 422);
    let gone = server
        .http
        .delete(server.url("/gateway/replicas/nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 404);
    let removed = server
        .http
        .delete(server.url("/gateway/replicas/a"))
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 200);
    let (status, _, body) = chat(&server, "/v1/chat/completions", ask("m")).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "no_replica");
}

#[tokio::test]
async fn bad_requests_get_clear_errors() {
    let a = Sim::start("a", &[]).await;
    let server = gateway(vec![("m", pool(Strategy::RoundRobin, &[&a]))]).await;
    let raw = |path: &str, body: &'static str| {
        server
            .http
            .post(server.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    // Not JSON, at the top or deep inside (the gateway keeps nested values
    // as written, but checks them), is 400; JSON that is not an object 422;
    // a model that is not a string 400.
    for (text, status, code) in [
        ("{nope", 400, "malformed_json"),
        (
            r#"{"model": "m", "messages": [{"role": "user", "content": x}]}"#,
            400,
            "malformed_json",
        ),
        ("[1, 2]", 422, "invalid_request"),
        (r#"{"model": 7, "messages": []}"#, 400, "bad_request"),
    ] {
        let response = raw("/v1/chat/completions", text).await.unwrap();
        assert_eq!(response.status(), status, "{text}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], code, "{text}: {body}");
    }
    let (status, _, body) = chat(&server, "/v1/chat/completions", json!({"messages": []})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("bad_request"))
    );
    let (status, _, body) = chat(&server, "/v1/chat/completions", ask("other")).await;
    assert_eq!(status, 404);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("known models: m")
    );
    let empty = gateway(vec![]).await;
    let (status, _, body) = chat(&empty, "/v1/chat/completions", ask("m")).await;
    assert_eq!(status, 404);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("known models: none (add replicas with POST /gateway/replicas"),
        "{body}"
    );
    for slug in ["plain", "conclave1:!!!", "rllm1:W10"] {
        let (status, _, body) = chat(
            &server,
            &format!("/meta/{slug}/v1/chat/completions"),
            ask("m"),
        )
        .await;
        assert_eq!(status, 400, "{slug}: {body}");
    }
    let padded = base64::engine::general_purpose::URL_SAFE.encode(r#"{"session_id":"s9"}"#);
    let (status, _, _) = chat(
        &server,
        &format!("/meta/rllm1:{padded}/v1/completions"),
        json!({"model": "m", "prompt": "once upon"}),
    )
    .await;
    assert_eq!(status, 200);
    let traces: Value = server
        .http
        .get(server.url("/gateway/traces?session_id=s9"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(traces["traces"][0]["endpoint"], "completions");
    let bad_query = server
        .http
        .get(server.url("/gateway/traces?limit=lots"))
        .send()
        .await
        .unwrap();
    assert_eq!(bad_query.status(), 400);
    let metrics = server
        .http
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"conclave_gateway_calls_total{pool="m",replica="a",outcome="ok"}"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn sampling_injection_and_drop_params_shape_the_request() {
    let a = Sim::start("a", &[]).await;
    let mut config = pool(Strategy::RoundRobin, &[&a]);
    config.inject = json!({"logprobs": true, "return_token_ids": true})
        .as_object()
        .unwrap()
        .clone();
    config.drop_params = true;
    config.additional_drop_params = vec!["seed".into()];
    let server = gateway(vec![("m", config)]).await;
    let mut body = ask("m");
    body["seed"] = json!(3);
    body["mirostat"] = json!(2);
    let (status, _, answer) = chat(&server, "/v1/chat/completions", body).await;
    assert_eq!(status, 200);
    assert!(
        answer["choices"][0]["logprobs"]["content"].is_array(),
        "{answer}"
    );
    let traces: Value = server
        .http
        .get(server.url("/gateway/traces"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let trace = &traces["traces"][0];
    let sent = &trace["request"];
    assert_eq!(sent["logprobs"], true);
    assert_eq!(sent["return_token_ids"], true);
    assert!(
        sent.get("seed").is_none() && sent.get("mirostat").is_none(),
        "{sent}"
    );
    assert!(trace["logprobs"].as_array().is_some_and(|l| !l.is_empty()));
}

/// An agent session whose model names a pool calls it through the gateway
/// with its session id: under `session_affinity` every call of the session
/// lands on one replica, tool calls work, and the status lists the calls.
#[tokio::test]
async fn agent_sessions_call_pools_through_the_gateway() {
    let tool = r#"{"name": "Bash", "arguments": {"command": "ls"}}"#;
    let sims = [
        Sim::start("a", &["--tool-call", tool]).await,
        Sim::start("b", &["--tool-call", tool]).await,
        Sim::start("c", &["--tool-call", tool]).await,
    ];
    let server = gateway(vec![(
        "m",
        pool(Strategy::SessionAffinity, &sims.iter().collect::<Vec<_>>()),
    )])
    .await;
    let session = server
        .create_session(json!({"options": {"model": "m"}}))
        .await;
    for prompt in ["first", "second", "third"] {
        let events = server.turn(&session, prompt).await;
        let kinds = common::types(&events);
        assert!(
            kinds.contains(&"tool_use") && kinds.contains(&"tool_result"),
            "{kinds:?}"
        );
        let result = events.last().expect("a result");
        assert_eq!(result["type"], "result");
        assert_eq!(result["status"], "success", "{result}");
    }
    let status: Value = server
        .get(&format!("/agent/session/{session}/status"))
        .await
        .json()
        .await
        .expect("status");
    let calls = status["gateway_calls"].as_array().expect("gateway_calls");
    // Two model calls a turn: the tool call, then the answer.
    assert_eq!(calls.len(), 6, "{calls:?}");
    let replicas: std::collections::HashSet<_> = calls
        .iter()
        .map(|c| c["replica"].as_str().unwrap())
        .collect();
    assert_eq!(replicas.len(), 1, "the session moved: {calls:?}");
    assert!(calls.iter().all(|c| c["status"] == "ok"), "{calls:?}");
    let traces: Value = server
        .get(&format!("/gateway/traces?session_id={session}&limit=1"))
        .await
        .json()
        .await
        .unwrap();
    let home = replicas.iter().next().unwrap().to_string();
    assert!(
        traces["traces"][0]["response_text"]
            .as_str()
            .unwrap()
            .starts_with(&home)
    );
}

/// The official `openai` Python SDK (from PyPI; scripts/test.sh installs
/// it and sets CONCLAVE_TEST_PYTHON): plain, streamed, tool calls,
/// completions, models, a slug, an error.
#[tokio::test]
async fn the_openai_python_sdk_works_against_the_gateway() {
    let plain = Sim::start("a", &[]).await;
    let tools = Sim::start(
        "t",
        &[
            "--tool-call",
            r#"{"name": "Bash", "arguments": {"command": "ls -la"}}"#,
        ],
    )
    .await;
    let server = gateway(vec![
        ("m", pool(Strategy::RoundRobin, &[&plain])),
        ("tools", pool(Strategy::RoundRobin, &[&tools])),
    ])
    .await;
    let seen = sdk_script(&server, "openai_client.py", "py-1", &[]).await;
    let answer = "a t1 t2 t3 t4 t5 t6 t7 t8 t9 t10 t11 t12 t13 t14 t15";
    assert_eq!(seen["plain"], answer);
    assert_eq!(seen["plain_usage"], 16);
    assert_eq!(seen["stream"], answer);
    assert_eq!(
        seen["stream_chunks"], 16,
        "the stream was not passed chunk by chunk"
    );
    assert_eq!(
        seen["tool_call"],
        json!({"name": "Bash", "arguments": {"command": "ls -la"}})
    );
    assert_eq!(
        seen["streamed_tool_arguments"],
        json!({"command": "ls -la"})
    );
    assert_eq!(seen["completion"], answer);
    assert_eq!(seen["models"], json!(["m", "tools"]));
    assert_eq!(seen["slug"], answer);
    assert_eq!(seen["unknown_model"], "NotFoundError");
    let traces = server.get_json("/gateway/traces?session_id=py-1").await;
    assert_eq!(traces["traces"].as_array().map(Vec::len), Some(1));
}

/// A stream is passed on as the replica sends it, not gathered first: the
/// first token reaches the client long before the last is sent.
#[tokio::test]
async fn streams_pass_through_chunk_by_chunk() {
    use futures::StreamExt;
    // 16 tokens at 10/s: about 1.5 s from the first to the last.
    let slow = Sim::start("a", &["--tokens-per-s", "10"]).await;
    let server = gateway(vec![("m", pool(Strategy::RoundRobin, &[&slow]))]).await;
    let mut body = ask("m");
    body["stream"] = json!(true);
    let response = server
        .http
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut stream = response.bytes_stream();
    let first = stream.next().await.expect("a first chunk").unwrap();
    assert!(String::from_utf8_lossy(&first).contains("\"content\":\"a\""));
    let started = std::time::Instant::now();
    let mut rest = Vec::new();
    while let Some(chunk) = stream.next().await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    assert!(String::from_utf8_lossy(&rest).contains("t15"));
    // The rest took the replica's pace after the first chunk arrived.
    assert!(
        started.elapsed() > Duration::from_millis(1000),
        "{:?}",
        started.elapsed()
    );
}

/// `conclave serve --litellm-config` loads a LiteLLM proxy config as
/// is, and `conclave gateway export-litellm` writes it back.
#[tokio::test]
async fn litellm_configs_load_as_is_and_export_back() {
    let (a, b) = (Sim::start("a", &[]).await, Sim::start("b", &[]).await);
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        r#"model_list:
  # One entry per vLLM replica
  - model_name: Qwen/Qwen2.5-7B-Instruct
    litellm_params:
      model: hosted_vllm/Qwen/Qwen2.5-7B-Instruct
      api_base: {a}
      drop_params: true
    model_info:
      id: verl-replica-0
      replica_rank: 0

  - model_name: Qwen/Qwen2.5-7B-Instruct
    litellm_params:
      model: hosted_vllm/Qwen/Qwen2.5-7B-Instruct
      api_base: {b}
      drop_params: true
    model_info:
      id: verl-replica-1
      replica_rank: 1

litellm_settings:
  drop_params: true
  num_retries: 3
  routing_strategy: simple-shuffle  # LiteLLM round-robins across entries
"#,
        a = a.url,
        b = b.url
    );
    let file = dir.path().join("litellm_verl.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let binary = env!("CARGO_BIN_EXE_conclave");

    let mut serve = Command::new(binary)
        .args(["serve", "--listen", "127.0.0.1:0", "--litellm-config"])
        .arg(&file)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("CONCLAVE_SANDBOX", "local")
        .env("CONCLAVE_SANDBOX__WARM_POOL", "0")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let line = BufReader::new(serve.stdout.take().unwrap())
        .lines()
        .next_line()
        .await
        .unwrap()
        .expect("the server says where it listens");
    let base = line
        .strip_prefix("conclave listening on ")
        .unwrap()
        .to_string();
    let http = reqwest::Client::new();
    let mut served = std::collections::HashSet::new();
    for _ in 0..20 {
        let answer: Value = http
            .post(format!("{base}/v1/chat/completions"))
            .json(&ask("Qwen/Qwen2.5-7B-Instruct"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        served.insert(answer["system_fingerprint"].as_str().unwrap().to_string());
    }
    assert_eq!(
        served.len(),
        2,
        "simple-shuffle used both replicas: {served:?}"
    );
    let replicas: Value = http
        .get(format!("{base}/gateway/replicas"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let pool = &replicas["pools"][0];
    assert_eq!(pool["strategy"], "shuffle");
    assert_eq!(pool["replicas"][1]["id"], "verl-replica-1");
    assert_eq!(pool["replicas"][1]["model"], "Qwen/Qwen2.5-7B-Instruct");
    serve.kill().await.unwrap();

    let export = Command::new(binary)
        .args(["gateway", "export-litellm", "--litellm-config"])
        .arg(&file)
        .output()
        .await
        .unwrap();
    assert!(
        export.status.success(),
        "{}",
        String::from_utf8_lossy(&export.stderr)
    );
    let exported = String::from_utf8(export.stdout).unwrap();
    assert!(
        exported.contains("hosted_vllm/Qwen/Qwen2.5-7B-Instruct"),
        "{exported}"
    );
    let load = conclave::gateway::litellm::import;
    assert_eq!(load(&exported).unwrap(), load(&yaml).unwrap());

    // A broken file stops the server at start, naming the file and field.
    std::fs::write(
        &file,
        "model_list:\n  - model_name: m\n    litellm_params:\n      model: openai/m\n",
    )
    .unwrap();
    let refused = Command::new(binary)
        .args(["serve", "--listen", "127.0.0.1:0", "--litellm-config"])
        .arg(&file)
        .output()
        .await
        .unwrap();
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("litellm_verl.yaml") && message.contains("api_base"),
        "{message}"
    );
}

#[tokio::test]
async fn the_sim_takes_its_config_as_json_whatever_the_content_type() {
    let sim = Sim::start("cfg", &[]).await;
    let base = sim.url.trim_end_matches("/v1").to_string();
    let http = reqwest::Client::new();
    // `curl -d` sends a form type.
    let set = http
        .post(format!("{base}/sim/config"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(r#"{"tokens": 3}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200);
    let shown: Value = set.json().await.unwrap();
    assert_eq!(shown["tokens"], 3);
    let bad = http
        .post(format!("{base}/sim/config"))
        .body("{nope")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

#[tokio::test]
async fn an_empty_pool_says_so_and_can_be_deleted() {
    let a = Sim::start("a", &[]).await;
    let server = gateway(vec![("m", pool(Strategy::RoundRobin, &[&a]))]).await;
    let removed = server
        .http
        .delete(server.url("/gateway/replicas/a"))
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 200);
    let (status, _, body) = chat(&server, "/v1/chat/completions", ask("m")).await;
    assert_eq!(status, 503);
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("has no replicas"), "{message}");
    let delete = |name: &str| {
        server
            .http
            .delete(server.url(&format!("/gateway/pools/{name}")))
            .send()
    };
    assert_eq!(delete("m").await.unwrap().status(), 200);
    let (status, _, _) = chat(&server, "/v1/chat/completions", ask("m")).await;
    assert_eq!(status, 404);
    assert_eq!(delete("m").await.unwrap().status(), 404);
}

#[tokio::test]
async fn the_sim_models_a_prefix_cache_by_whole_blocks() {
    let sim = Sim::start("cached", &["--prefix-cache-tokens", "4096"]).await;
    let http = reqwest::Client::new();
    let system = (0..200)
        .map(|i| format!("rule{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    let ask = |question: &str| {
        json!({"model": "sim-model", "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question}]})
    };
    let mut cached = Vec::new();
    for question in ["first question", "second question", "first question"] {
        let answer: Value = http
            .post(format!("{}/chat/completions", sim.url))
            .json(&ask(question))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        cached.push(
            answer["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        );
    }
    // Nothing is cached at first; the shared system prompt (201 tokens,
    // 12 whole blocks of 16) is then, and the whole repeated prompt but
    // its last partial block.
    assert_eq!(cached, [0, 192, 192]);
    let stats = sim.stats().await;
    assert_eq!(stats["cached_tokens"], 384, "{stats}");
    assert!(stats["cache_tokens"].as_u64().unwrap() <= 4096, "{stats}");
}

#[tokio::test]
async fn prefix_cache_keeps_each_conversation_where_its_prefix_is_cached() {
    let sims = [
        Sim::start("p0", &["--prefix-cache-tokens", "65536"]).await,
        Sim::start("p1", &["--prefix-cache-tokens", "65536"]).await,
        Sim::start("p2", &["--prefix-cache-tokens", "65536"]).await,
    ];
    let refs: Vec<&Sim> = sims.iter().collect();
    let server = gateway(vec![("m", pool(Strategy::PrefixCache, &refs))]).await;
    let system = (0..300)
        .map(|i| format!("rule{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    // Six conversations, each growing over four turns.
    let mut homes: BTreeMap<usize, String> = BTreeMap::new();
    let mut cached = 0;
    for turn in 0..4 {
        for conversation in 0..6 {
            let mut messages = vec![
                json!({"role": "system", "content": format!("conversation {conversation} {system}")}),
            ];
            for earlier in 0..=turn {
                messages.push(json!({"role": "user", "content": format!("question {earlier}")}));
            }
            let body = json!({"model": "m", "messages": messages});
            let (status, replica, answer) = chat(&server, "/v1/chat/completions", body).await;
            assert_eq!(status, 200, "{answer}");
            let home = homes.entry(conversation).or_insert_with(|| replica.clone());
            assert_eq!(
                *home, replica,
                "conversation {conversation} moved at turn {turn}"
            );
            if turn > 0 {
                cached += answer["usage"]["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .unwrap();
            }
        }
    }
    // Every later turn found its conversation's prefix in its replica's
    // cache, and the conversations spread over the replicas.
    assert!(cached >= 6 * 3 * 288, "cached {cached} tokens");
    let used: std::collections::BTreeSet<&String> = homes.values().collect();
    assert_eq!(used.len(), 3, "{homes:?}");
}
