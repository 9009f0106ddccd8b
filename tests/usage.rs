//! Usage per key end to end: a turn's tokens and its docker sandbox's CPU
//! time land under its key and no other, `/usage` shows a key its own and
//! an admin every key by name, the Prometheus counters carry key names,
//! and the daily budgets refuse new turns and gateway calls (429 with
//! `Retry-After`) and end a running turn `budget_exceeded` — the last on
//! the real binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::binary::{serve_command, spawn_server, stop};
use common::sim::Sim;
use common::{TestServer, ndjson};
use conclave::config::{Config, NamedKey, Quota};
use reqwest::Method;
use serde_json::{Value, json};

const ALICE: &str = "alice-secret-key-0001";
const BOB: &str = "bob-secret-key-0002";
const OPS: &str = "ops-secret-key-0003";

fn add_key(config: &mut Config, name: &str, key: &str, admin: bool) {
    config.keys.insert(
        name.into(),
        NamedKey {
            key: key.into(),
            admin,
            secrets: Default::default(),
            quota: Quota::default(),
        },
    );
}

/// The group named `name` of a `/usage` answer.
fn group<'a>(usage: &'a Value, name: &str) -> Option<&'a Value> {
    usage["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["group"] == name)
}

/// A POST to the server at `url` with `key`.
async fn post_as(url: &str, key: &str, path: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{url}{path}"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap()
}

/// `GET /usage{query}` of the server at `url` as `key`.
async fn usage_at(url: &str, key: &str, query: &str) -> Value {
    let response = reqwest::Client::new()
        .get(format!("{url}/usage{query}"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_tokens_and_sandbox_cpu_land_under_its_key_only() {
    let server = TestServer::start_sandboxed(|config| {
        add_key(config, "alice", ALICE, false);
        add_key(config, "bob", BOB, false);
        add_key(config, "ops", OPS, true);
    })
    .await;
    let usage_of = |key: &str, query: &str| {
        let request = server.send_as(key, Method::GET, &format!("/usage{query}"), None);
        async move {
            let response = request.await;
            assert_eq!(response.status(), 200);
            response.json::<Value>().await.unwrap()
        }
    };
    // Alice's turn runs a code block in a docker sandbox, which goes with
    // the ephemeral run: its CPU time is counted as it is removed.
    let prompt = "Please run:\n```python\nprint(sum(i * i for i in range(300000)))\n```";
    let run = server.send_as(
        ALICE,
        Method::POST,
        "/agent/run",
        Some(json!({"prompt": prompt})),
    );
    let events = ndjson(run.await).await;
    let result = events.last().unwrap();
    assert_eq!(result["status"], "success", "{events:?}");
    // Bob's turn calls no tool.
    let run = server.send_as(
        BOB,
        Method::POST,
        "/agent/run",
        Some(json!({"prompt": "Say hi.", "allowed_tools": []})),
    );
    assert_eq!(ndjson(run.await).await.last().unwrap()["status"], "success");

    let alice = usage_of(ALICE, "?group_by=model").await;
    let demo = group(&alice, "demo").expect("alice's demo model row");
    assert_eq!(demo["input_tokens"], result["usage"]["input_tokens"]);
    assert_eq!(demo["output_tokens"], result["usage"]["output_tokens"]);
    assert_eq!(demo["turns"], 1);
    assert_eq!(demo["tool_calls"], 1);
    let sandbox = group(&alice, "-").expect("alice's sandbox row");
    assert!(sandbox["sandbox_cpu_s"].as_f64().unwrap() > 0.0, "{alice}");
    assert!(sandbox["sandbox_wall_s"].as_f64().unwrap() > 0.0, "{alice}");
    assert!(alice["total"]["input_tokens"].as_u64().unwrap() > 0);

    // Bob sees his own usage only, and asking as Bob for every key still
    // gives his own: no sandbox time, one turn.
    let bob = usage_of(BOB, "?group_by=key").await;
    let names: Vec<&str> = bob["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["group"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["bob"], "{bob}");
    assert_eq!(bob["total"]["sandbox_cpu_s"], 0.0);
    assert_eq!(bob["total"]["turns"], 1);

    // The admin sees both keys by name, never a key or its hash.
    let all = usage_of(OPS, "?group_by=key").await;
    let alice_row = group(&all, "alice").expect("alice by name");
    assert!(alice_row["sandbox_cpu_s"].as_f64().unwrap() > 0.0);
    assert_eq!(group(&all, "bob").unwrap()["sandbox_cpu_s"], 0.0);
    let text = all.to_string();
    for secret in [ALICE, BOB, &conclave::config::key_owner(ALICE)] {
        assert!(!text.contains(secret), "{text}");
    }
    let by_day = usage_of(OPS, "").await;
    assert_eq!(by_day["group_by"], "day");
    assert_eq!(by_day["groups"].as_array().unwrap().len(), 1);
    assert_eq!(by_day["total"]["turns"], 2);

    // Bad input names its field.
    for (query, field) in [
        ("?from=yesterday", "from"),
        ("?to=2026-13-01", "to"),
        ("?from=2026-11-27&to=2026-11-01", "to"),
        ("?group_by=owner", "group_by"),
    ] {
        let response = server
            .send_as(ALICE, Method::GET, &format!("/usage{query}"), None)
            .await;
        assert_eq!(response.status(), 422, "{query}");
        let body: Value = response.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("{field}:")),
            "{query}: {message}"
        );
    }
    // An RFC 3339 time stands for its UTC day.
    let today = chrono::Utc::now().date_naive();
    let since = format!("?from={today}T00:00:00Z&group_by=key");
    assert_eq!(usage_of(OPS, &since).await["groups"], all["groups"]);

    // Prometheus counters by key name, never the key.
    let metrics = server
        .send_as(OPS, Method::GET, "/metrics", None)
        .await
        .text()
        .await
        .unwrap();
    let tokens = format!(
        "conclave_usage_tokens_total{{key=\"alice\",direction=\"input\"}} {}",
        result["usage"]["input_tokens"]
    );
    assert!(metrics.contains(&tokens), "{metrics}");
    assert!(metrics.contains("conclave_usage_turns_total{key=\"bob\"} 1"));
    assert!(metrics.contains("conclave_usage_tool_calls_total{key=\"alice\"} 1"));
    assert!(metrics.contains("conclave_usage_sandbox_cpu_seconds_total{key=\"alice\"}"));
    assert!(!metrics.contains(ALICE) && !metrics.contains(&conclave::config::key_owner(ALICE)));
    server.stop_and_remove_sandboxes().await;
}

/// The real binary with a key whose daily token budget one model call
/// exceeds, a key without one, and a gateway pool of one sim replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daily_budgets_end_a_running_turn_and_refuse_new_turns_and_gateway_calls() {
    let sim = Sim::start("sim-0", &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[keys.alice]\nkey = \"{ALICE}\"\ntokens_per_day = 5\n\n\
         [keys.ops]\nkey = \"{OPS}\"\nadmin = true\n\n\
         [gateway.pools.simpool]\nnum_retries = 0\nreplicas = [{{ id = \"sim-0\", url = \"{}\" }}]\n",
        sim.url
    );
    std::fs::write(dir.path().join("conclave.toml"), config).unwrap();
    let mut command = serve_command(&["--sandbox", "local", "--config", "conclave.toml"]);
    command
        .current_dir(dir.path())
        .arg("--data-dir")
        .arg(dir.path().join("data"));
    for name in [
        "OPENAI_BASE_URL",
        "OPENAI_MODEL",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
    ] {
        command.env_remove(name);
    }
    let (mut child, url) = spawn_server(&mut command).await;

    // The first model call asks for a shell command and spends more than
    // the budget: the turn ends there, the command not run, and says why.
    let turn = json!({"prompt": "$ echo never-run", "model": "demo"});
    let events = ndjson(post_as(&url, ALICE, "/agent/run", &turn).await).await;
    let result = events.last().unwrap();
    assert_eq!(result["type"], "result");
    assert_eq!(result["status"], "budget_exceeded", "{events:?}");
    assert!(
        result["usage"]["input_tokens"].as_u64().unwrap()
            + result["usage"]["output_tokens"].as_u64().unwrap()
            >= 5
    );
    assert!(
        !events.iter().any(|e| e["type"] == "tool_result"),
        "{events:?}"
    );
    let said = events
        .iter()
        .filter(|e| e["type"] == "status")
        .filter_map(|e| e["message"].as_str())
        .any(|m| m.contains("tokens_per_day"));
    assert!(said, "{events:?}");

    // A new turn and a gateway call are refused until midnight UTC.
    let gateway_call = json!({"model": "simpool", "messages": [{"role": "user", "content": "hi"}]});
    for (path, body) in [
        ("/agent/run", turn),
        ("/v1/chat/completions", gateway_call.clone()),
    ] {
        let response = post_as(&url, ALICE, path, &body).await;
        assert_eq!(response.status(), 429, "{path}");
        let retry_after: u64 = response.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=86_400).contains(&retry_after), "{retry_after}");
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["quota"], "tokens_per_day", "{error}");
        assert_eq!(error["error"]["key"], "alice");
        let reset = error["error"]["reset"].as_str().unwrap();
        assert!(reset.ends_with("T00:00:00Z"), "{reset}");
    }

    // A key without a budget goes on, and its gateway call's reported
    // tokens are counted under it once the response has passed.
    let response = post_as(&url, OPS, "/v1/chat/completions", &gateway_call).await;
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    let reported = answer["usage"]["prompt_tokens"].as_u64().unwrap();
    let counted = async {
        loop {
            let usage = usage_at(&url, OPS, "?group_by=model").await;
            if group(&usage, "simpool").is_some() {
                break usage;
            }
            tokio::task::yield_now().await;
        }
    };
    let usage = tokio::time::timeout(std::time::Duration::from_secs(10), counted)
        .await
        .expect("the gateway call's usage is counted");
    assert_eq!(group(&usage, "simpool").unwrap()["input_tokens"], reported);
    let by_key = usage_at(&url, OPS, "?group_by=key").await;
    assert!(
        group(&by_key, "alice").unwrap()["input_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert_eq!(group(&by_key, "ops").unwrap()["input_tokens"], reported);
    stop(&mut child).await;
}

/// On PostgreSQL, a second server reads the usage the first wrote, and
/// refuses a turn of the key whose budget the first server's turn spent:
/// budgets are the store's, not a process's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_spent_on_one_server_binds_the_next_on_postgres() {
    use common::postgres::{TestDatabase, test_server};
    let database = TestDatabase::create(&test_server()).await;
    let store = database.url();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[keys.alice]\nkey = \"{ALICE}\"\ntokens_per_day = 5\n\n[keys.ops]\nkey = \"{OPS}\"\nadmin = true\n"
    );
    std::fs::write(dir.path().join("conclave.toml"), config).unwrap();
    let serve = |data: &str| {
        let mut command = serve_command(&[
            "--sandbox",
            "local",
            "--config",
            "conclave.toml",
            "--store",
            &store,
        ]);
        command
            .current_dir(dir.path())
            .arg("--data-dir")
            .arg(dir.path().join(data));
        command
    };
    let turn = json!({"prompt": "$ echo never-run", "model": "demo"});

    let (mut first, url) = spawn_server(&mut serve("first")).await;
    let events = ndjson(post_as(&url, ALICE, "/agent/run", &turn).await).await;
    let result = events.last().unwrap();
    assert_eq!(result["status"], "budget_exceeded", "{events:?}");
    stop(&mut first).await;

    let (mut second, url) = spawn_server(&mut serve("second")).await;
    let refused = post_as(&url, ALICE, "/agent/run", &turn).await;
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    let usage = usage_at(&url, OPS, "?group_by=key").await;
    let alice = group(&usage, "alice").expect("alice's usage from the first server");
    assert_eq!(alice["input_tokens"], result["usage"]["input_tokens"]);
    assert_eq!(alice["output_tokens"], result["usage"]["output_tokens"]);
    assert_eq!(alice["turns"], 1);
    stop(&mut second).await;
}
