//! Fixtures: a real server on 127.0.0.1:0 in this process, and clients.
#![allow(dead_code)]

pub mod binary;
pub mod nats;
pub mod postgres;
pub mod proxy;
pub mod replicas;
pub mod sim;

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use conclave::agent::{ToolContext, ToolOutput, ToolRouter};
use conclave::config::Config;
use conclave::model::ToolSpec;
use conclave::sandbox::docker::DockerBackend;
use conclave::sandbox::{ManagedSandbox, SandboxBackend};
use conclave::server::{Server, Tools};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub struct TestServer {
    pub addr: SocketAddr,
    pub http: reqwest::Client,
    pub data_dir: std::path::PathBuf,
    root: CancellationToken,
    handle: JoinHandle<std::io::Result<()>>,
    _dir: Option<tempfile::TempDir>,
}

/// Adds `demo-small`: the demo model under the small harness.
pub fn with_small_demo(config: &mut Config) {
    config.models.insert(
        "demo-small".into(),
        conclave::config::ModelAlias {
            provider: conclave::config::ProviderKind::Demo,
            model: "demo".into(),
            harness: Some(conclave::config::HarnessKind::Small),
            ..Default::default()
        },
    );
}

/// A test tool router: `Bash` answers `ran: {command}`, except `block`,
/// which runs until the turn is cancelled.
pub struct EchoTools;

#[async_trait]
impl ToolRouter for EchoTools {
    async fn specs(&self, _ctx: &ToolContext) -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "Bash".into(),
            description: "Echoes the command back".into(),
            input_schema: Arc::new(json!({"type": "object", "properties": {
                "command": {"type": "string"},
                "timeout": {"type": "integer", "minimum": 1, "maximum": 600}
            }, "required": ["command"]})),
            read_only: false,
        }]
    }

    async fn call(
        &self,
        _ctx: &ToolContext,
        name: &str,
        input: Value,
        cancel: CancellationToken,
    ) -> ToolOutput {
        match (name, input.get("command").and_then(Value::as_str)) {
            ("Bash", Some("block")) => {
                cancel.cancelled().await;
                ToolOutput::error("stopped: the turn was cancelled")
            }
            ("Bash", Some(command)) => ToolOutput {
                output: Value::String(format!("ran: {command}")),
                is_error: false,
            },
            _ => ToolOutput::error(format!("bad call {name} {input}")),
        }
    }
}

impl TestServer {
    pub async fn start() -> TestServer {
        TestServer::start_with(|_| {}).await
    }

    pub async fn start_with(configure: impl FnOnce(&mut Config)) -> TestServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().to_path_buf();
        let mut server = TestServer::start_in(&path, configure).await;
        server._dir = Some(dir);
        server
    }

    /// Starts with real sandboxes (the docker backend unless `configure`
    /// says otherwise) and `/mcp`.
    pub async fn start_sandboxed(configure: impl FnOnce(&mut Config)) -> TestServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().to_path_buf();
        let mut server = TestServer::start_with_tools(&path, Tools::Sandboxed, |config| {
            config.sandbox.backend = conclave::config::SandboxBackendKind::Docker;
            config.sandbox.warm_pool = 1;
            configure(config);
        })
        .await;
        server._dir = Some(dir);
        server
    }

    /// Starts on a given data directory (kept by the caller), e.g. to restart.
    pub async fn start_in(
        data_dir: &std::path::Path,
        configure: impl FnOnce(&mut Config),
    ) -> TestServer {
        TestServer::start_with_tools(data_dir, Tools::Custom(Arc::new(EchoTools)), configure).await
    }

    pub async fn start_with_tools(
        data_dir: &std::path::Path,
        tools: Tools,
        configure: impl FnOnce(&mut Config),
    ) -> TestServer {
        TestServer::start_with_kinds(data_dir, tools, Vec::new(), configure).await
    }

    /// Starts running session kinds of the test's own besides the built-in ones.
    pub async fn start_with_kinds(
        data_dir: &std::path::Path,
        tools: Tools,
        kinds: Vec<Arc<dyn conclave::session::SessionTask>>,
        configure: impl FnOnce(&mut Config),
    ) -> TestServer {
        let mut config = Config {
            listen: "127.0.0.1:0".parse().expect("addr"),
            data_dir: data_dir.to_path_buf(),
            ..Config::default()
        };
        configure(&mut config);
        config.validate().expect("valid test config");
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let root = CancellationToken::new();
        let server = Server::build_with_kinds(config, tools, root.clone(), kinds)
            .await
            .expect("server builds");
        let handle = tokio::spawn(server.run(listener));
        TestServer {
            addr,
            http: reqwest::Client::new(),
            data_dir: data_dir.to_path_buf(),
            root,
            handle,
            _dir: None,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn ws_url(&self, path: &str) -> String {
        format!("ws://{}{}", self.addr, path)
    }

    pub async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("request")
    }

    /// A request with `key` as its bearer token (built at once: the
    /// future borrows nothing).
    pub fn send_as(
        &self,
        key: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> impl std::future::Future<Output = reqwest::Response> + use<> {
        let mut request = self.http.request(method, self.url(path)).bearer_auth(key);
        if let Some(body) = body {
            request = request.json(&body);
        }
        async move { request.send().await.expect("request") }
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.http.get(self.url(path)).send().await.expect("request")
    }

    pub async fn create_session(&self, body: Value) -> String {
        let response = self.post("/agent/session", body).await;
        assert_eq!(response.status(), 201);
        let body: Value = response.json().await.expect("json");
        body["session_id"].as_str().expect("id").to_string()
    }

    /// `GET /agent/session/{id}/status`, read as JSON.
    pub async fn status(&self, id: &str) -> Value {
        self.get_json(&format!("/agent/session/{id}/status")).await
    }

    /// `GET path`, its body as JSON.
    pub async fn get_json(&self, path: &str) -> Value {
        let response = self.get(path).await;
        response.json().await.expect("a JSON body")
    }

    /// `POST /agent/session/{id}/message` with a body.
    pub async fn message(&self, id: &str, body: Value) -> reqwest::Response {
        self.post(&format!("/agent/session/{id}/message"), body)
            .await
    }

    /// Sends a prompt to a session and reads the whole turn.
    pub async fn turn(&self, id: &str, prompt: &str) -> Vec<Value> {
        ndjson(self.message(id, json!({"prompt": prompt})).await).await
    }

    /// Stops the server, then removes every sandbox of its instance (the
    /// server keeps its sessions' sandboxes across restarts on purpose).
    pub async fn stop_and_remove_sandboxes(self) {
        // Read first: the data directory goes with the server.
        let instance = instance_of(&self.data_dir);
        let data_dir = self.data_dir.clone();
        self.stop().await;
        remove_sandboxes_of_instance(&instance, &data_dir).await;
    }

    /// Signals shutdown and waits until the server has stopped.
    pub async fn stop(self) {
        self.root.cancel();
        self.handle.await.expect("join").expect("served");
    }

    /// Cancels without waiting, for tests that watch the shutdown happen.
    pub fn begin_stop(&self) {
        self.root.cancel();
    }

    pub async fn wait_stopped(self) {
        self.handle.await.expect("join").expect("served");
    }
}

/// The instance id the server of `data_dir` labels its sandboxes with.
/// Read, never made: a data directory already gone would otherwise get a
/// new id that matches nothing, and its sandboxes would be left running.
fn instance_of(data_dir: &std::path::Path) -> String {
    let path = data_dir.join("instance-id");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("no instance id at {}: {e}", path.display()))
        .trim()
        .to_string()
}

/// The docker sandboxes of the server instance owning `data_dir`.
pub async fn docker_sandboxes_of(data_dir: &std::path::Path) -> Vec<ManagedSandbox> {
    docker_sandboxes_of_instance(&instance_of(data_dir)).await
}

async fn docker_sandboxes_of_instance(instance: &str) -> Vec<ManagedSandbox> {
    let docker = DockerBackend::connect().await.expect("dockerd answers");
    docker
        .list_managed()
        .await
        .expect("list")
        .into_iter()
        .filter(|m| m.instance.as_deref() == Some(instance))
        .collect()
}

/// Removes the docker sandboxes of the instance owning `data_dir`.
pub async fn remove_sandboxes_of(data_dir: &std::path::Path) {
    remove_sandboxes_of_instance(&instance_of(data_dir), data_dir).await;
}

/// As the server would: their layered workspaces (in `data_dir`) go too.
async fn remove_sandboxes_of_instance(instance: &str, data_dir: &std::path::Path) {
    let docker = DockerBackend::connect()
        .await
        .expect("dockerd answers")
        .with_layers(data_dir.join("docker-workspaces"))
        .await;
    for sandbox in docker_sandboxes_of_instance(instance).await {
        docker.remove(&sandbox.id).await.expect("remove");
    }
}

/// Reads a whole NDJSON body.
pub async fn ndjson(response: reqwest::Response) -> Vec<Value> {
    let text = response.text().await.expect("body");
    text.lines()
        .map(|line| serde_json::from_str(line).expect("each line is JSON"))
        .collect()
}

/// Reads NDJSON lines as they arrive.
pub struct Lines {
    stream: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: Vec<u8>,
}

impl Lines {
    pub fn new(response: reqwest::Response) -> Lines {
        Lines {
            stream: response.bytes_stream().boxed(),
            buffer: Vec::new(),
        }
    }

    pub async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(pos) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=pos).collect();
                return Some(serde_json::from_slice(&line).expect("JSON line"));
            }
            match self.stream.next().await {
                Some(Ok(chunk)) => self.buffer.extend_from_slice(&chunk),
                _ => return None,
            }
        }
    }

    /// Reads until an event of `kind`, returning everything read.
    pub async fn until(&mut self, kind: &str) -> Vec<Value> {
        let mut seen = Vec::new();
        while let Some(event) = self.next().await {
            let done = event["type"] == kind;
            seen.push(event);
            if done {
                return seen;
            }
        }
        panic!("stream ended before a {kind} event: {seen:?}");
    }
}

pub fn types(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?"))
        .collect()
}

/// An event without its varying fields (`ts`, `session_id`, `duration_ms`).
pub fn stable(event: &Value) -> Value {
    let mut event = event.clone();
    if let Some(map) = event.as_object_mut() {
        map.remove("ts");
        map.remove("session_id");
        map.remove("duration_ms");
        // How full the model's window was: the window depends on the
        // configuration (tests/long_tasks.rs checks it).
        map.remove("context");
    }
    event
}

/// A prompt the demo model takes a while to answer (with a chunk delay).
pub fn long_prompt(words: usize) -> String {
    (0..words)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The events a WebSocket sends, up to and including the first of type
/// `kind` (frames that are not text are skipped).
pub async fn ws_until<S, E>(ws: &mut S, kind: &str) -> Vec<Value>
where
    S: futures::Stream<Item = Result<tokio_tungstenite::tungstenite::Message, E>> + Unpin,
    E: std::fmt::Debug,
{
    let mut events = Vec::new();
    while let Some(frame) = ws.next().await {
        let tokio_tungstenite::tungstenite::Message::Text(text) = frame.expect("a frame") else {
            continue;
        };
        let event: Value = serde_json::from_str(&text).expect("a JSON event");
        let done = event["type"] == kind;
        events.push(event);
        if done {
            break;
        }
    }
    events
}

/// Opens the session WebSocket at `url`, sends `prompt` as a message and
/// reads until the turn's `result`.
pub async fn ws_turn(url: &str, prompt: &str) -> Vec<Value> {
    use futures::SinkExt;
    let (mut ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("the WebSocket opens");
    ws.send(tokio_tungstenite::tungstenite::Message::Text(
        json!({"type": "message", "prompt": prompt})
            .to_string()
            .into(),
    ))
    .await
    .expect("send");
    ws_until(&mut ws, "result").await
}

/// Runs one scenario of the dashboard's browser tests
/// (`tests/browser/run.py`, selenium and a headless Chromium) against the
/// server at `url`, saving screenshots to `CONCLAVE_SCREENSHOTS` when set,
/// and returns the facts it printed, which must say `ok`.
pub async fn browser_scenario(scenario: &str, url: &str, extra: &[&str]) -> Value {
    let shots = std::env::var("CONCLAVE_SCREENSHOTS").ok();
    let mut args = vec![scenario, "--url", url];
    if let Some(dir) = &shots {
        args.extend(["--screenshots", dir.as_str()]);
    }
    args.extend(extra);
    let facts = python_json(
        "tests/browser/run.py",
        &args,
        "selenium, with Debian's chromium and chromium-driver",
    )
    .await;
    assert_eq!(facts["ok"], true, "{facts}");
    facts
}

/// The Python of `CONCLAVE_TEST_PYTHON`, which must have `needs` installed.
pub fn python(needs: &str) -> String {
    std::env::var("CONCLAVE_TEST_PYTHON").unwrap_or_else(|_| {
        panic!("CONCLAVE_TEST_PYTHON must name a python with {needs} (scripts/test.sh sets it)")
    })
}

/// Runs one of the tests' Python clients (`script` under the repository)
/// with the Python of `CONCLAVE_TEST_PYTHON`, which must have `needs`
/// installed, and reads the one JSON object it prints.
pub async fn python_json(script: &str, args: &[&str], needs: &str) -> Value {
    let output = tokio::process::Command::new(python(needs))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg(script)
        .args(args)
        .output()
        .await
        .expect("python starts");
    assert!(
        output.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the client prints one JSON object")
}

/// Opens an MCP session over HTTP at `mcp` (a `/mcp` URL), with `key`
/// when given, and calls `tool` with `arguments`; the call's response
/// body (JSON or SSE).
pub async fn mcp_tool_call(
    http: &reqwest::Client,
    mcp: &str,
    key: Option<&str>,
    tool: &str,
    arguments: Value,
) -> String {
    let post = |session: Option<String>, body: Value| {
        let mut request = http
            .post(mcp)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .json(&body);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        if let Some(id) = session {
            request = request.header("mcp-session-id", id);
        }
        request.send()
    };
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "1"}}});
    let opened = post(None, init).await.unwrap();
    assert_eq!(opened.status(), 200);
    let session = opened.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let _ = opened.text().await;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let notified = post(Some(session.clone()), initialized).await.unwrap();
    assert_eq!(notified.status(), 202);
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments}});
    let answered = post(Some(session), call).await.unwrap();
    assert_eq!(answered.status(), 200);
    answered.text().await.unwrap()
}

/// A LangGraph run body: the `agent` assistant on one user message, with
/// what to do with a run the thread has going (`multitask_strategy`).
pub fn langgraph_run(prompt: &str, then: &str) -> Value {
    serde_json::json!({
        "assistant_id": "agent",
        "input": {"messages": [{"role": "user", "content": prompt}]},
        "multitask_strategy": then,
    })
}
