//! The real binary with `OPENAI_BASE_URL` at a server other than OpenAI's
//! and no `OPENAI_MODEL`: the default model is the first one the server
//! lists at `/v1/models` (asked again at first use when the server could
//! not answer at start), and its calls are priced only by `[prices]`,
//! never by OpenAI's price of a name.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "providers/upstream.rs"]
#[allow(dead_code)]
mod upstream;

use common::binary::{serve_command, spawn_server, stop};
use common::{ndjson, types};
use serde_json::{Value, json};
use tokio::process::Command;
use upstream::{Reply, Upstream, chunk_usage, content, end, finish};

const LISTED: &str = "listed-model";

/// `GET /v1/models` as llama-server answers it; the second one is not
/// the default.
fn listing() -> Reply {
    Reply::status(
        200,
        &json!({"object": "list", "data": [
            {"id": LISTED, "object": "model", "owned_by": "llamacpp"},
            {"id": "gpt-4o-mini", "object": "model", "owned_by": "llamacpp"}
        ]})
        .to_string(),
    )
    .for_get()
}

/// One answer of 10 input and 5 output tokens.
fn answer() -> Reply {
    Reply::sse(vec![
        content("Hello."),
        finish("stop"),
        chunk_usage(10, 5),
        end(),
    ])
}

/// `conclave serve` whose only provider is `upstream`, named by the
/// conventional variables alone, with `config` as its config file.
fn command(upstream: &Upstream, dir: &std::path::Path, config: &str) -> Command {
    std::fs::write(dir.join("conclave.toml"), config).unwrap();
    let mut command = serve_command(&["--sandbox", "local", "--config", "conclave.toml"]);
    command
        .current_dir(dir)
        .env("OPENAI_BASE_URL", format!("{}/v1", upstream.url));
    for name in [
        "OPENAI_MODEL",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
    ] {
        command.env_remove(name);
    }
    command
}

async fn run(url: &str) -> Vec<Value> {
    let response = reqwest::Client::new()
        .post(format!("{url}/agent/run"))
        .json(&json!({"prompt": "Say hello.", "allowed_tools": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    ndjson(response).await
}

async fn health_default(url: &str) -> Value {
    let health: Value = reqwest::get(format!("{url}/health"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    health["default_model"].clone()
}

#[tokio::test]
async fn the_default_is_the_first_model_listed_and_it_has_no_price() {
    let upstream = Upstream::start(vec![listing(), answer()]).await;
    let dir = tempfile::tempdir().unwrap();
    let (mut child, url) = spawn_server(&mut command(&upstream, dir.path(), "")).await;
    assert_eq!(health_default(&url).await, LISTED);

    let events = run(&url).await;
    assert_eq!(
        types(&events),
        vec!["status", "thinking", "result"],
        "{events:?}"
    );
    let result = events.last().unwrap();
    assert_eq!(result["status"], "success", "{result}");
    assert_eq!(result["usage"]["input_tokens"], 10);
    assert_eq!(
        (result["cost_known"].clone(), result["cost_usd"].clone()),
        (json!(false), json!(0.0)),
        "a local server's model has no price: {result}"
    );
    let requests = upstream.requests();
    assert_eq!(requests[0].path, "/v1/models");
    assert_eq!(requests[1].path, "/v1/chat/completions");
    assert_eq!(requests[1].body["model"], LISTED);
    stop(&mut child).await;
}

#[tokio::test]
async fn a_prices_entry_prices_the_listed_model() {
    let upstream = Upstream::start(vec![listing(), answer()]).await;
    let dir = tempfile::tempdir().unwrap();
    let config =
        format!("[prices.\"{LISTED}\"]\ninput_per_mtok = 100000.0\noutput_per_mtok = 200000.0\n");
    let (mut child, url) = spawn_server(&mut command(&upstream, dir.path(), &config)).await;
    let events = run(&url).await;
    let result = events.last().unwrap();
    assert_eq!(result["status"], "success", "{result}");
    assert_eq!(result["cost_known"], true, "{result}");
    let cost = result["cost_usd"].as_f64().unwrap();
    assert!(
        (cost - 2.0).abs() < 1e-9,
        "10 tokens at $0.1 and 5 at $0.2: {result}"
    );
    stop(&mut child).await;
}

#[tokio::test]
async fn a_listing_that_cannot_be_read_at_start_is_asked_again_at_first_use() {
    let loading = || Reply::status(503, r#"{"error": {"message": "Loading model"}}"#).for_get();
    let upstream =
        Upstream::start(vec![loading(), loading(), loading(), listing(), answer()]).await;
    let dir = tempfile::tempdir().unwrap();
    let (mut child, url) = spawn_server(&mut command(&upstream, dir.path(), "")).await;
    assert_eq!(health_default(&url).await, Value::Null, "not known yet");

    // A deliberation whose agents would all use the default is refused
    // before it starts any of them.
    let response = reqwest::Client::new()
        .post(format!("{url}/deliberations"))
        .json(&json!({"task_description": "Pick a name."}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 422);
    let error: Value = response.json().await.unwrap();
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("options.models") && message.contains("OPENAI_MODEL"),
        "{message}"
    );

    let refused = run(&url).await;
    assert_eq!(
        types(&refused),
        vec!["status", "error", "result"],
        "{refused:?}"
    );
    assert_eq!(refused[1]["code"], "no_default_model");
    let message = refused[1]["message"].as_str().unwrap();
    assert!(
        message.contains("/v1/models")
            && message.contains("HTTP 503")
            && message.contains("OPENAI_MODEL"),
        "{message}"
    );
    assert_eq!(refused[2]["status"], "error");

    let events = run(&url).await;
    assert_eq!(events.last().unwrap()["status"], "success", "{events:?}");
    assert_eq!(health_default(&url).await, LISTED);
    let paths: Vec<String> = upstream.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        [
            "/v1/models",
            "/v1/models",
            "/v1/models",
            "/v1/models",
            "/v1/chat/completions"
        ]
    );
    assert_eq!(upstream.requests()[4].body["model"], LISTED);
    stop(&mut child).await;
}
