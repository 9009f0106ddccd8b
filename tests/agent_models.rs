//! The turn loop against scripted model upstreams, through the real server:
//! a broken stream closes the turn with an `error` event and an `error`
//! result and the server goes on; an OpenAI tool call runs through the
//! tool router and its result goes back to the model.

mod common;
#[path = "providers/upstream.rs"]
#[allow(dead_code)]
mod upstream;

use common::{TestServer, ndjson, stable, types};
use conclave::config::{ModelAlias, ProviderKind};
use serde_json::{Value, json};
use upstream::{Reply, Upstream, chunk_usage, content, delta, end, finish};

async fn server_for(upstream: &Upstream) -> TestServer {
    let base_url = format!("{}/v1", upstream.url);
    TestServer::start_with(move |c| {
        c.models.insert(
            "scripted".into(),
            ModelAlias {
                provider: ProviderKind::Openai,
                model: "small-model".into(),
                base_url: Some(base_url),
                api_key: None,
                tool_call_mode: Default::default(),
            },
        );
    })
    .await
}

#[tokio::test]
async fn a_malformed_stream_is_an_error_event_and_a_closed_turn() {
    let upstream = Upstream::start(vec![
        Reply::sse(vec![
            content("par"),
            "data: {\"choices\": [oops\n\n".into(),
            content("never"),
        ]),
        Reply::sse(vec![
            content("fine"),
            finish("stop"),
            chunk_usage(3, 1),
            end(),
        ]),
    ])
    .await;
    let server = server_for(&upstream).await;
    let id = server.create_session(json!({"model": "scripted"})).await;

    let broken = server.turn(&id, "hi").await;
    assert_eq!(types(&broken), vec!["status", "error", "result"]);
    assert_eq!(broken[1]["code"], "model_protocol_error");
    assert_eq!(broken[2]["status"], "error");

    let health = server.get("/health").await;
    assert_eq!(health.status(), 200);
    let next = server.turn(&id, "again").await;
    assert_eq!(next.last().unwrap()["status"], "success");
    assert_eq!(next.last().unwrap()["result"], "fine");
    server.stop().await;
}

#[tokio::test]
async fn an_openai_tool_call_runs_and_its_result_goes_back_to_the_model() {
    let call = |index: u32, piece: Value| {
        delta(json!({"tool_calls": [{"index": index, "function": piece}]}))
    };
    let upstream = Upstream::start(vec![
        Reply::sse(vec![
            delta(
                json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                         "function": {"name": "Bash", "arguments": ""}}]}),
            ),
            call(0, json!({"arguments": "{\"comm"})),
            call(0, json!({"arguments": "and\": \"ls\"}"})),
            finish("tool_calls"),
            chunk_usage(10, 5),
            end(),
        ]),
        Reply::sse(vec![
            content("Done."),
            finish("stop"),
            chunk_usage(20, 2),
            end(),
        ]),
    ])
    .await;
    let server = server_for(&upstream).await;
    let events = ndjson(
        server
            .post(
                "/agent/run",
                json!({"prompt": "list files", "model": "scripted"}),
            )
            .await,
    )
    .await;
    let stable: Vec<Value> = events.iter().map(stable).collect();
    assert_eq!(
        stable,
        vec![
            json!({"type": "status", "message": "Starting agent...", "seq": 1}),
            json!({"type": "tool_use", "id": "call_1", "tool": "Bash", "input": {"command": "ls"}, "seq": 2}),
            json!({"type": "tool_result", "id": "call_1", "tool": "Bash", "output": "ran: ls", "is_error": false, "seq": 3}),
            json!({"type": "thinking", "content": "Done.", "seq": 4}),
            json!({"type": "result", "status": "success", "result": "Done.", "cost_usd": 0.0, "cost_known": false,
                   "turns": 2, "usage": {"input_tokens": 30, "output_tokens": 7, "cost_usd": 0.0, "turns": 2, "tool_calls": 1},
                   "seq": 5}),
        ]
    );
    let requests = upstream.requests();
    assert_eq!(requests.len(), 2);
    let session_id = events[0]["session_id"].as_str().unwrap();
    assert_eq!(requests[0].headers["x-session-id"], session_id);
    let messages = requests[1].body["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "system");
    assert_eq!(
        json!(messages[1..]),
        json!([
            {"role": "user", "content": "list files"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": "{\"command\":\"ls\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "ran: ls"},
        ])
    );
    server.stop().await;
}

/// A session that gives no system prompt still tells the model its tools and
/// its workspace (small models' chat templates often drop `tools`), and a
/// model call is capped by `agent.max_tokens` unless the session says
/// otherwise; a session's own prompt and cap replace both.
#[tokio::test]
async fn model_calls_get_a_default_system_prompt_and_token_cap() {
    let done = || {
        Reply::sse(vec![
            content("ok"),
            finish("stop"),
            chunk_usage(1, 1),
            end(),
        ])
    };
    let upstream = Upstream::start(vec![done(), done()]).await;
    let server = server_for(&upstream).await;
    for body in [
        json!({"prompt": "hi", "model": "scripted"}),
        json!({"prompt": "hi", "model": "scripted", "system_prompt": "Be brief.", "max_tokens": 50}),
    ] {
        let events = ndjson(server.post("/agent/run", body).await).await;
        assert_eq!(events.last().unwrap()["status"], "success", "{events:?}");
    }
    let requests = upstream.requests();
    let first = &requests[0].body;
    assert_eq!(first["max_tokens"], 4096, "{first}");
    let system = first["messages"][0]["content"].as_str().unwrap();
    assert_eq!(first["messages"][0]["role"], "system");
    assert!(
        system.contains("- Bash: Echoes the command back"),
        "{system}"
    );
    assert!(system.contains("/workspace"), "{system}");
    let second = &requests[1].body;
    assert_eq!(second["max_tokens"], 50, "{second}");
    assert_eq!(
        second["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    server.stop().await;
}
