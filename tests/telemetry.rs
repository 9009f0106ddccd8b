//! OpenTelemetry traces of the real binary, read back from a real
//! collector: Arize Phoenix (`CONCLAVE_TEST_PHOENIX`, installed by
//! scripts/test.sh). One trace per turn with the request → turn → model
//! call → tool call → sandbox exec shape on docker, the client's
//! `traceparent` continued, a gateway call retried on another replica (and
//! the `traceparent` each replica got), a deliberation's agents, the GenAI
//! attributes, and prompts and answers only under `capture_content`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::binary::{json_of, serve_command, spawn_server, stop};
use common::sim::Sim;
use futures::SinkExt;
use serde_json::{Value, json};
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::Message;

/// A `phoenix serve` on free ports in a temporary directory, killed when
/// dropped.
struct Phoenix {
    _child: Child,
    _dir: tempfile::TempDir,
    url: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Phoenix {
    async fn start() -> Phoenix {
        let phoenix = std::env::var("CONCLAVE_TEST_PHOENIX").expect(
            "CONCLAVE_TEST_PHOENIX must name the phoenix command (scripts/test.sh installs arize-phoenix and sets it)",
        );
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let child = Command::new(&phoenix)
            .arg("serve")
            .env("PHOENIX_WORKING_DIR", dir.path())
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", port.to_string())
            .env("PHOENIX_GRPC_PORT", free_port().to_string())
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{phoenix} does not start: {e}"));
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(180);
        let http = reqwest::Client::new();
        loop {
            let up = http.get(format!("{url}/healthz")).send().await;
            if up.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            assert!(Instant::now() < deadline, "phoenix did not answer in 180 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Phoenix {
            _child: child,
            _dir: dir,
            url,
        }
    }

    /// The spans Phoenix holds of one trace (none before the first
    /// export made its project).
    async fn spans(&self, trace_id: &str) -> Vec<Value> {
        let response = reqwest::get(format!(
            "{}/v1/projects/default/spans?trace_id={trace_id}&limit=1000",
            self.url
        ))
        .await
        .unwrap();
        if response.status() == 404 {
            return Vec::new();
        }
        assert!(response.status().is_success(), "{}", response.status());
        let body: Value = response.json().await.unwrap();
        body["data"].as_array().unwrap().clone()
    }

    /// The spans of a trace once `done` holds of them (the exporter sends
    /// in batches).
    async fn wait(&self, trace_id: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let spans = self.spans(trace_id).await;
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "trace {trace_id} incomplete after 60 s: {}",
                names(&spans).join(", ")
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

fn names(spans: &[Value]) -> Vec<String> {
    spans
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

fn one<'a>(spans: &'a [Value], name: &str) -> &'a Value {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "{name} in {:?}", names(spans));
    found[0]
}

fn id(span: &Value) -> &str {
    span["context"]["span_id"].as_str().unwrap()
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

/// An integer attribute (OTLP's JSON gives 64-bit ones as strings).
fn int(span: &Value, key: &str) -> i64 {
    match attr(span, key) {
        Value::String(s) => s.parse().unwrap(),
        value => value.as_i64().unwrap_or_else(|| panic!("{key} of {span}")),
    }
}

/// A fresh W3C trace id and parent span id, as a client makes them.
fn client_context() -> (String, String, String) {
    let trace = uuid::Uuid::new_v4().simple().to_string();
    let parent = uuid::Uuid::new_v4().simple().to_string()[..16].to_string();
    let header = format!("00-{trace}-{parent}-01");
    (trace, parent, header)
}

/// `conclave serve` exporting to `phoenix`, with `config` as its file.
async fn serve(
    phoenix: Option<&Phoenix>,
    config: &str,
    args: &[&str],
) -> (Child, String, tempfile::TempDir) {
    serve_with(phoenix, config, args, &[]).await
}

async fn serve_with(
    phoenix: Option<&Phoenix>,
    config: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Child, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("conclave.toml");
    std::fs::write(&path, config).unwrap();
    let data = dir.path().join("data");
    let mut command = serve_command(&[
        "--config",
        path.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    command.args(args);
    // Batches every 100 ms rather than 5 s, so the test waits less.
    command.env("OTEL_BSP_SCHEDULE_DELAY", "100");
    if let Some(phoenix) = phoenix {
        command.env("OTEL_EXPORTER_OTLP_ENDPOINT", &phoenix.url);
    }
    command.envs(env.iter().copied());
    let (child, url) = spawn_server(&mut command).await;
    (child, url, dir)
}

/// A run's events; under the client's trace when `traceparent` is given.
async fn run(url: &str, traceparent: Option<&str>, body: Value) -> Vec<Value> {
    let mut request = reqwest::Client::new().post(format!("{url}/agent/run"));
    if let Some(traceparent) = traceparent {
        request = request.header("traceparent", traceparent);
    }
    let response = request.json(&body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    common::ndjson(response).await
}

/// The request that starts a session's turn, as its span is named.
const REQUEST: &str = "POST /agent/session/{id}/message";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_calling_turn_on_docker_is_one_trace_that_continues_the_clients() {
    let phoenix = Phoenix::start().await;
    let (mut server, url, dir) = serve(Some(&phoenix), "", &["--sandbox", "docker"]).await;
    let http = reqwest::Client::new();
    let created = json_of(http.post(format!("{url}/agent/session")).json(&json!({}))).await;
    let session = created["session_id"].as_str().unwrap().to_string();
    let (trace, parent, traceparent) = client_context();
    let response = http
        .post(format!("{url}/agent/session/{session}/message"))
        .header("traceparent", &traceparent)
        .json(&json!({"prompt": "$ echo zebra42"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let events = common::ndjson(response).await;
    assert_eq!(events.last().unwrap()["status"], "success", "{events:?}");
    let tool_use = events.iter().find(|e| e["type"] == "tool_use").unwrap();

    let spans = phoenix
        .wait(&trace, |spans| {
            // The turn ends last, once its result is written.
            !named(spans, "invoke_agent agent").is_empty() && !named(spans, REQUEST).is_empty()
        })
        .await;
    // Every span is in the client's trace: the trace id it sent is the one
    // Phoenix stores, and the request is the child of its span.
    for span in &spans {
        assert_eq!(span["context"]["trace_id"], trace.as_str());
    }
    let request = one(&spans, REQUEST);
    assert_eq!(request["parent_id"], parent.as_str());
    assert_eq!(attr(request, "http.request.method"), "POST");
    assert_eq!(int(request, "http.response.status_code"), 200);

    let turn = one(&spans, "invoke_agent agent");
    assert_eq!(turn["parent_id"], id(request));
    assert_eq!(attr(turn, "gen_ai.operation.name"), "invoke_agent");
    assert_eq!(attr(turn, "gen_ai.conversation.id"), session.as_str());
    assert_eq!(attr(turn, "conclave.result.status"), "success");

    for chat in named(&spans, "chat demo") {
        assert_eq!(chat["parent_id"], id(turn));
        assert_eq!(attr(chat, "gen_ai.operation.name"), "chat");
        assert_eq!(attr(chat, "gen_ai.provider.name"), "conclave.demo");
        assert_eq!(attr(chat, "gen_ai.request.model"), "demo");
        assert_eq!(attr(chat, "gen_ai.conversation.id"), session.as_str());
        assert!(int(chat, "gen_ai.usage.input_tokens") > 0, "{chat}");
        assert!(int(chat, "gen_ai.usage.output_tokens") > 0, "{chat}");
    }
    let tool = one(&spans, "execute_tool Bash");
    assert_eq!(tool["parent_id"], id(turn));
    assert_eq!(attr(tool, "gen_ai.operation.name"), "execute_tool");
    assert_eq!(attr(tool, "gen_ai.tool.name"), "Bash");
    assert_eq!(attr(tool, "gen_ai.tool.call.id"), &tool_use["id"]);

    let exec = one(&spans, "sandbox.exec");
    assert_eq!(exec["parent_id"], id(tool));
    assert_eq!(attr(exec, "conclave.sandbox.backend"), "docker");
    let container = attr(exec, "container.id").as_str().unwrap();
    let ours = common::docker_sandboxes_of(&dir.path().join("data")).await;
    assert!(
        ours.iter()
            .any(|s| s.id == container && s.session.as_deref() == Some(session.as_str())),
        "{container} is not the session's sandbox: {ours:?}"
    );
    assert_eq!(int(exec, "process.exit.code"), 0);

    // No prompt, answer, arguments or output without capture_content.
    let text = serde_json::to_string(&spans).unwrap();
    assert!(!text.contains("zebra42"), "content in the spans: {text}");
    for key in [
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
    ] {
        assert!(!text.contains(key), "{key} in the spans: {text}");
    }

    // A turn with no traceparent is a trace of its own, rooted at its
    // request (a run's session is gone after it, and so is its sandbox).
    let events = run(&url, None, json!({"prompt": "hello"})).await;
    let session = events[0]["session_id"].as_str().unwrap();
    let own = turns_of(&phoenix, session, 1).await.remove(0);
    assert_ne!(own, trace);
    let spans = phoenix
        .wait(&own, |s| !named(s, "POST /agent/run").is_empty())
        .await;
    assert_eq!(one(&spans, "POST /agent/run")["parent_id"], Value::Null);

    // Each turn over one long-lived WebSocket is a trace of its own, its
    // turn the root.
    let session = json_of(http.post(format!("{url}/agent/session")).json(&json!({}))).await;
    let session = session["session_id"].as_str().unwrap();
    let ws = format!(
        "{}/agent/ws?session_id={session}&since=0",
        url.replace("http", "ws")
    );
    let (mut socket, _) = tokio_tungstenite::connect_async(ws).await.unwrap();
    for prompt in ["one", "two"] {
        let message = json!({"type": "message", "prompt": prompt}).to_string();
        socket.send(Message::Text(message.into())).await.unwrap();
        common::ws_until(&mut socket, "result").await;
    }
    let traces = turns_of(&phoenix, session, 2).await;
    assert_ne!(traces[0], traces[1]);
    for trace in &traces {
        let spans = phoenix
            .wait(trace, |s| !named(s, "chat demo").is_empty())
            .await;
        assert_eq!(one(&spans, "invoke_agent agent")["parent_id"], Value::Null);
    }

    stop(&mut server).await;
    common::remove_sandboxes_of(&dir.path().join("data")).await;
}

/// Every turn's span (`invoke_agent agent`) Phoenix holds.
async fn turn_spans(phoenix: &Phoenix) -> Vec<Value> {
    let found = json_of(reqwest::Client::new().get(format!(
        "{}/v1/projects/default/spans?name=invoke_agent%20agent&limit=1000",
        phoenix.url
    )))
    .await;
    found["data"].as_array().unwrap().clone()
}

/// The trace ids of the first `count` turns of `session`, found by their
/// conversation id.
async fn turns_of(phoenix: &Phoenix, session: &str, count: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let turns: Vec<String> = turn_spans(phoenix)
            .await
            .iter()
            .filter(|s| attr(s, "gen_ai.conversation.id") == session)
            .map(|s| s["context"]["trace_id"].as_str().unwrap().to_string())
            .collect();
        if turns.len() >= count {
            return turns;
        }
        assert!(
            Instant::now() < deadline,
            "{count} turns of {session} not in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A replica that fails every call with 503, keeping the `traceparent`
/// of each (the pool checks no health, so it stays in).
async fn failing_replica() -> (String, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let kept = kept.clone();
            async move {
                let parent = headers
                    .get("traceparent")
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default();
                kept.lock().unwrap().push(parent);
                (
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    axum::Json(json!({"error": {"message": "down"}})),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_retries_and_deliberations_are_traced_with_content_when_asked() {
    let phoenix = Phoenix::start().await;
    let (down, seen) = failing_replica().await;
    let up = Sim::start("up", &[]).await;
    let config = format!(
        r#"
[telemetry]
capture_content = true
service_name = "conclave-test"

[gateway]
allowed_upstreams = ["127.0.0.0/8"]

[gateway.pools.m]
strategy = "round_robin"
num_retries = 1
health = {{ enabled = false }}
replicas = [{{ id = "down", url = "{down}" }}, {{ id = "up", url = "{}", model = "up-model" }}]
"#,
        up.url
    );
    let (mut server, url, _dir) = serve(Some(&phoenix), &config, &["--sandbox", "local"]).await;

    // Round robin: of two calls, one goes to `down` first and is retried
    // on `up`.
    let mut traces = Vec::new();
    for _ in 0..2 {
        let (trace, _, traceparent) = client_context();
        let events = run(
            &url,
            Some(&traceparent),
            json!({"prompt": "say okapi7", "model": "m"}),
        )
        .await;
        assert_eq!(events.last().unwrap()["status"], "success", "{events:?}");
        traces.push(trace);
    }
    let (mut retried, mut direct) = (None, None);
    for trace in &traces {
        // Children end, and are sent, before their parents: once the
        // turn is there, so are its attempts.
        let spans = phoenix
            .wait(trace, |s| {
                !named(s, "invoke_agent agent").is_empty() && !named(s, "gateway m").is_empty()
            })
            .await;
        if !named(&spans, "chat m attempt 2").is_empty() {
            retried = Some(spans);
        } else {
            direct = Some(spans);
        }
    }
    // A call its first attempt serves is one span, naming the replica.
    let spans = direct.expect("one call served by its first replica");
    let gateway = one(&spans, "gateway m");
    assert_eq!(gateway["parent_id"], id(one(&spans, "chat m")));
    assert_eq!(attr(gateway, "conclave.gateway.replica"), "up");
    assert_eq!(int(gateway, "conclave.gateway.attempt"), 1);
    assert_eq!(int(gateway, "conclave.gateway.attempts"), 1);
    assert_eq!(int(gateway, "http.response.status_code"), 200);
    assert_eq!(attr(gateway, "gen_ai.response.model"), "up-model");
    assert!(named(&spans, "chat m attempt 1").is_empty(), "{spans:?}");
    let spans = retried.expect("one call retried on another replica");
    let turn = one(&spans, "invoke_agent agent");
    let chat = one(&spans, "chat m");
    assert_eq!(chat["parent_id"], id(turn));
    assert_eq!(attr(chat, "gen_ai.provider.name"), "conclave.gateway");
    let gateway = one(&spans, "gateway m");
    assert_eq!(gateway["parent_id"], id(chat));
    assert_eq!(attr(gateway, "conclave.gateway.replica"), "up");
    assert_eq!(int(gateway, "conclave.gateway.attempts"), 2);
    let first = one(&spans, "chat m attempt 1");
    let second = one(&spans, "chat m attempt 2");
    for attempt in [first, second] {
        assert_eq!(attempt["parent_id"], id(gateway));
        assert_eq!(attr(attempt, "gen_ai.request.model"), "m");
    }
    assert_eq!(attr(first, "conclave.gateway.replica"), "down");
    assert_eq!(int(first, "conclave.gateway.attempt"), 1);
    assert_eq!(int(first, "http.response.status_code"), 503);
    assert_eq!(attr(first, "error.type"), "503");
    assert_eq!(first["status_code"], "ERROR");
    assert_eq!(attr(second, "conclave.gateway.replica"), "up");
    assert_eq!(int(second, "conclave.gateway.attempt"), 2);
    assert_eq!(int(second, "http.response.status_code"), 200);
    // The failing replica was sent the trace under the call (its span
    // for the first attempt is made once the attempt failed).
    let trace = spans[0]["context"]["trace_id"].as_str().unwrap();
    let sent = seen.lock().unwrap().clone();
    assert!(
        sent.contains(&format!("00-{trace}-{}-01", id(gateway))),
        "{sent:?} lacks trace {trace} under the call {}",
        id(gateway)
    );
    // capture_content: the prompt and the answer are in the model call.
    let input = attr(chat, "gen_ai.input.messages").as_str().unwrap();
    assert!(input.contains("okapi7"), "{input}");
    let output = attr(chat, "gen_ai.output.messages").as_str().unwrap();
    assert!(output.contains("assistant"), "{output}");

    // A client's gateway call is one trace under the client's span: the
    // call's span is the request's (no request span of its own).
    let (trace, parent, traceparent) = client_context();
    let answer = reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .header("traceparent", &traceparent)
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200, "{}", answer.text().await.unwrap());
    let spans = phoenix
        .wait(&trace, |s| !named(s, "gateway m").is_empty())
        .await;
    let gateway = one(&spans, "gateway m");
    assert_eq!(gateway["parent_id"], parent.as_str());
    assert_eq!(attr(gateway, "conclave.gateway.replica"), "up");
    assert!(
        named(&spans, "POST /v1/chat/completions").is_empty(),
        "{:?}",
        names(&spans)
    );

    // An MCP client's run_agent continues the trace of the HTTP request
    // that carried the call.
    let (trace, parent, traceparent) = client_context();
    let http = reqwest::Client::new();
    let mcp = |session: Option<&str>, body: Value| {
        let mut request = http
            .post(format!("{url}/mcp"))
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .header("traceparent", &traceparent)
            .json(&body);
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        request.send()
    };
    let opened = mcp(
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
               "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                          "clientInfo": {"name": "traced", "version": "1"}}}),
    )
    .await
    .unwrap();
    let session = opened.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let _ = opened.text().await;
    mcp(
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await
    .unwrap();
    let called = mcp(
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "run_agent", "arguments": {"prompt": "hello"}}}),
    )
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(called.contains("You said: hello"), "{called}");
    let spans = phoenix
        .wait(&trace, |s| !named(s, "invoke_agent agent").is_empty())
        .await;
    let call = one(&spans, "tools/call run_agent");
    assert_eq!(call["parent_id"], parent.as_str());
    assert_eq!(one(&spans, "invoke_agent agent")["parent_id"], id(call));

    // A deliberation: its agents are children of its turn, each agent's
    // model call a child of the agent.
    let (trace, _, traceparent) = client_context();
    let response = reqwest::Client::new()
        .post(format!("{url}/deliberations"))
        .header("traceparent", &traceparent)
        .json(&json!({"task_description": "Name a prime", "num_agents": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let spans = phoenix
        .wait(&trace, |s| {
            let deliberation = named(s, "invoke_agent deliberation");
            deliberation
                .first()
                .is_some_and(|d| !attr(d, "conclave.result.status").is_null())
        })
        .await;
    let request = one(&spans, "POST /deliberations");
    let deliberation = one(&spans, "invoke_agent deliberation");
    assert_eq!(deliberation["parent_id"], id(request));
    assert_eq!(attr(deliberation, "conclave.session.kind"), "deliberation");
    let agents: Vec<&Value> = spans
        .iter()
        .filter(|s| s["parent_id"] == id(deliberation))
        .filter(|s| attr(s, "gen_ai.operation.name") == "invoke_agent")
        .collect();
    assert!(agents.len() >= 2, "{:?}", names(&spans));
    for agent in agents {
        let calls: Vec<&Value> = spans
            .iter()
            .filter(|s| s["parent_id"] == id(agent))
            .filter(|s| attr(s, "gen_ai.operation.name") == "chat")
            .collect();
        assert!(!calls.is_empty(), "no model call under {agent}");
        for call in calls {
            assert!(int(call, "gen_ai.usage.output_tokens") > 0, "{call}");
        }
    }

    stop(&mut server).await;
}

/// `OTEL_TRACES_SAMPLER` is honoured: with `parentbased_always_off` a turn
/// a client started its own sampled trace for is kept, and a turn with no
/// `traceparent` is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standard_sampler_variables_choose_what_is_exported() {
    let phoenix = Phoenix::start().await;
    let sampler = [("OTEL_TRACES_SAMPLER", "parentbased_always_off")];
    let (mut server, url, _dir) =
        serve_with(Some(&phoenix), "", &["--sandbox", "local"], &sampler).await;
    let unsampled = run(&url, None, json!({"prompt": "hello"})).await;
    let unsampled = unsampled[0]["session_id"].as_str().unwrap().to_string();
    let (trace, _, traceparent) = client_context();
    let events = run(&url, Some(&traceparent), json!({"prompt": "hello"})).await;
    let sampled = events[0]["session_id"].as_str().unwrap();
    // Spans go out in the order they end: once the later turn is in, the
    // earlier one would be too.
    phoenix
        .wait(&trace, |s| !named(s, "POST /agent/run").is_empty())
        .await;
    let sessions: Vec<String> = turn_spans(&phoenix)
        .await
        .iter()
        .filter_map(|s| {
            attr(s, "gen_ai.conversation.id")
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(sessions, [sampled], "only {sampled}, not {unsampled}");
    stop(&mut server).await;
}
