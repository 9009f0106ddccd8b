//! The real binary as a new user starts it: from a fresh working directory,
//! with the default data directory (`./data`) or a relative one, on the
//! local sandbox backend named on the command line and on `auto` where
//! docker does not answer, and on docker (whose workspaces the server
//! keeps in the data directory). Each server runs a tool call in a
//! sandbox.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Stdio;

use common::ndjson;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// How the backend is chosen.
enum Backend {
    /// `--sandbox local`.
    LocalFlag,
    /// No flag: `auto`, with `DOCKER_HOST` naming a socket nobody serves.
    AutoWithoutDocker,
    /// `--sandbox docker`: the daemon the test command starts.
    DockerFlag,
}

impl Backend {
    /// The backend the session's status names, and the directory of the
    /// data directory its sandboxes' files are in.
    fn expected(&self) -> (&'static str, &'static str) {
        match self {
            Backend::LocalFlag | Backend::AutoWithoutDocker => ("local", "sandboxes"),
            Backend::DockerFlag => ("docker", "docker-workspaces"),
        }
    }
}

/// Where the data directory is given, always relative.
enum DataDir {
    Default,
    Flag(&'static str),
    Env(&'static str),
}

/// Starts `conclave serve` in a fresh working directory with `data_dir`,
/// runs `$ …` through the demo model's `Bash` tool, and checks that the
/// answer came from a sandbox of `backend` and that the state lies under
/// `expected`.
async fn serve_and_run_a_tool(backend: Backend, data_dir: DataDir, expected: &str) {
    let cwd = tempfile::tempdir().expect("tempdir");
    let mut command = Command::new(env!("CARGO_BIN_EXE_conclave"));
    command
        .current_dir(cwd.path())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_remove("CONCLAVE_SANDBOX")
        .env_remove("CONCLAVE_DATA_DIR")
        .env("RUST_LOG", "warn");
    match backend {
        Backend::LocalFlag => {
            command.args(["--sandbox", "local"]);
        }
        Backend::AutoWithoutDocker => {
            let socket = cwd.path().join("no-docker.sock");
            command.env("DOCKER_HOST", format!("unix://{}", socket.display()));
        }
        Backend::DockerFlag => {
            command.args(["--sandbox", "docker"]);
        }
    }
    match data_dir {
        DataDir::Default => {}
        DataDir::Flag(dir) => {
            command.args(["--data-dir", dir]);
        }
        DataDir::Env(dir) => {
            command.env("CONCLAVE_DATA_DIR", dir);
        }
    }
    let (mut child, url) = serve(&mut command).await;
    let http = reqwest::Client::new();
    let id = create_session(&http, &url).await;
    let result = tool_result(
        &http,
        &url,
        &id,
        "$ echo from-a-sandbox > note.txt && cat note.txt && pwd",
    )
    .await;
    assert_eq!(result["is_error"], false, "{result}");
    assert_eq!(
        result["output"]["stdout"], "from-a-sandbox\n/workspace\n",
        "{result}"
    );
    let status: Value = http
        .get(format!("{url}/agent/session/{id}/status"))
        .send()
        .await
        .expect("status")
        .json()
        .await
        .expect("json");
    let (name, sandboxes) = backend.expected();
    assert_eq!(status["sandbox"]["backend"], name, "{status}");

    let state = cwd.path().join(expected);
    for file in ["conclave.db", "instance-id", sandboxes] {
        assert!(
            state.join(file).exists(),
            "{} is missing",
            state.join(file).display()
        );
    }
    // Deleted, the session takes its sandbox (and its cgroups) with it.
    delete_session(&http, &url, &id).await;
    stop(&mut child).await;
    assert_eq!(sandbox_dirs(&state.join(sandboxes)), Vec::<String>::new());
}

/// Spawns the server and reads where it listens; a start that fails says
/// why.
async fn serve(command: &mut Command) -> (tokio::process::Child, String) {
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("the conclave binary starts");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let Some(first) = lines.next_line().await.expect("read stdout") else {
        let output = child.wait_with_output().await.expect("exit");
        panic!(
            "the server exited at start ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let url = first
        .strip_prefix("conclave listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_string();
    (child, url)
}

async fn create_session(http: &reqwest::Client, url: &str) -> String {
    let created: Value = http
        .post(format!("{url}/agent/session"))
        .json(&json!({}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("json");
    created["session_id"]
        .as_str()
        .expect("session_id")
        .to_string()
}

async fn delete_session(http: &reqwest::Client, url: &str, id: &str) {
    let deleted = http
        .delete(format!("{url}/agent/session/{id}"))
        .send()
        .await
        .expect("delete");
    assert_eq!(deleted.status(), 200);
}

/// Runs `prompt` (a `$ …` line: the demo model's `Bash` call) as a turn of
/// session `id` and returns its `tool_result` event.
async fn tool_result(http: &reqwest::Client, url: &str, id: &str, prompt: &str) -> Value {
    let events = ndjson(
        http.post(format!("{url}/agent/session/{id}/message"))
            .json(&json!({"prompt": prompt}))
            .send()
            .await
            .expect("message"),
    )
    .await;
    events
        .into_iter()
        .find(|e| e["type"] == "tool_result")
        .expect("a tool_result event")
}

/// The sandbox directories in `dir` (a data directory's `sandboxes`).
fn sandbox_dirs(dir: &std::path::Path) -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(dir)
        .expect("sandboxes")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        // The exec helper's directory beside the sandboxes is not one.
        .filter(|name| name != ".exec")
        .collect();
    dirs.sort();
    dirs
}

/// `conclave serve` on the local backend from `cwd`, its data directory
/// the default one.
fn local_serve(cwd: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_conclave"));
    command
        .current_dir(cwd)
        .args(["serve", "--listen", "127.0.0.1:0", "--sandbox", "local"])
        .env_remove("CONCLAVE_DATA_DIR")
        .env("RUST_LOG", "warn");
    command
}

/// SIGTERM, so the server removes its sandboxes, then waits for the exit.
async fn stop(child: &mut tokio::process::Child) {
    let pid = child.id().expect("running");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let exit = child.wait().await.expect("exit");
    assert!(exit.success(), "{exit}");
}

/// After the URL the server prints where a person goes next: the
/// dashboard and a curl that runs as printed.
#[tokio::test]
async fn the_start_lines_say_where_to_go_and_the_curl_runs() {
    let cwd = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_conclave"))
        .current_dir(cwd.path())
        .args(["serve", "--listen", "127.0.0.1:0", "--sandbox", "local"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the conclave binary starts");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut next = async || lines.next_line().await.expect("read").expect("a line");
    let first = next().await;
    let url = first
        .strip_prefix("conclave listening on ")
        .expect("the URL first")
        .to_string();
    assert_eq!(next().await, format!("  dashboard  {url}/"));
    let try_line = next().await;
    let command = try_line.strip_prefix("  try        ").expect("a try line");
    assert!(
        command.starts_with(&format!("curl -N {url}/agent/run ")),
        "{command}"
    );

    let page = reqwest::get(format!("{url}/")).await.expect("dashboard");
    assert_eq!(page.status(), 200);
    assert!(page.text().await.expect("html").contains("<html"));
    let ran = Command::new("sh")
        .args(["-c", command])
        .output()
        .await
        .expect("sh and curl");
    let out = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success(),
        "{out} {}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let last: Value = serde_json::from_str(out.lines().last().expect("events")).expect("NDJSON");
    assert_eq!(
        (&last["type"], &last["status"]),
        (&json!("result"), &json!("success")),
        "{out}"
    );
    stop(&mut child).await;
}

#[tokio::test]
async fn local_flag_with_the_default_data_dir() {
    serve_and_run_a_tool(Backend::LocalFlag, DataDir::Default, "data").await;
}

#[tokio::test]
async fn local_flag_with_a_relative_data_dir() {
    serve_and_run_a_tool(
        Backend::LocalFlag,
        DataDir::Flag("state/here"),
        "state/here",
    )
    .await;
}

#[tokio::test]
async fn auto_without_docker_with_the_default_data_dir() {
    serve_and_run_a_tool(Backend::AutoWithoutDocker, DataDir::Default, "data").await;
}

#[tokio::test]
async fn auto_without_docker_with_a_relative_data_dir() {
    serve_and_run_a_tool(Backend::AutoWithoutDocker, DataDir::Flag("./rel"), "rel").await;
}

#[tokio::test]
async fn docker_flag_with_the_default_data_dir() {
    serve_and_run_a_tool(Backend::DockerFlag, DataDir::Default, "data").await;
}

#[tokio::test]
async fn local_flag_with_a_relative_data_dir_from_the_environment() {
    serve_and_run_a_tool(Backend::LocalFlag, DataDir::Env("from-env"), "from-env").await;
}

/// A normal stop removes every sandbox no live session owns (an MCP
/// connection's scratch sandbox here) and keeps a live session's, which the
/// next start takes over.
#[tokio::test]
async fn a_normal_stop_keeps_only_live_sessions_sandboxes() {
    let cwd = tempfile::tempdir().expect("tempdir");
    let start = || {
        let mut command = local_serve(cwd.path());
        command.env("CONCLAVE_SANDBOX__WARM_POOL", "0");
        command
    };
    let (mut child, url) = serve(&mut start()).await;
    let http = reqwest::Client::new();
    let id = create_session(&http, &url).await;
    tool_result(&http, &url, &id, "$ echo kept > kept.txt").await;
    // An MCP connection's scratch sandbox.
    let mcp = |session: Option<&str>, body: Value| {
        let mut request = http
            .post(format!("{url}/mcp"))
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
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
                          "clientInfo": {"name": "scratch", "version": "1"}}}),
    )
    .await
    .expect("initialize");
    let mcp_session = opened.headers()["mcp-session-id"]
        .to_str()
        .expect("id")
        .to_string();
    let _ = opened.text().await;
    mcp(
        Some(&mcp_session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await
    .expect("initialized");
    let called = mcp(
        Some(&mcp_session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "execute_shell", "arguments": {"command": "echo scratch"}}}),
    )
    .await
    .expect("call")
    .text()
    .await
    .expect("text");
    assert!(called.contains("scratch"), "{called}");
    let state = cwd.path().join("data/sandboxes");
    assert_eq!(sandbox_dirs(&state).len(), 2);

    stop(&mut child).await;
    let left = sandbox_dirs(&state);
    assert_eq!(
        left.len(),
        1,
        "only the live session's sandbox stays: {left:?}"
    );

    // The next start takes it over, workspace and all; deleting the
    // session then removes it.
    let (mut child, url) = serve(&mut start()).await;
    let result = tool_result(&http, &url, &id, "$ cat kept.txt").await;
    assert_eq!(result["output"]["stdout"], "kept\n", "{result}");
    delete_session(&http, &url, &id).await;
    stop(&mut child).await;
    assert_eq!(sandbox_dirs(&state), Vec::<String>::new());
}

/// The bus as a new user meets it: `conclave serve` with its defaults from
/// a fresh working directory; a durable subject's message, a KV key, and
/// a SIGTERM; after the restart both are there and a waiting read of the
/// KV ends when the key is written.
#[tokio::test]
async fn the_bus_keeps_durable_subjects_and_the_kv_across_a_restart() {
    let cwd = tempfile::tempdir().expect("tempdir");
    let start = || local_serve(cwd.path());
    let http = reqwest::Client::new();
    let (mut child, url) = serve(&mut start()).await;
    let published: Value = http
        .post(format!("{url}/bus/publish/sync/weights_ready"))
        .json(&json!({"model": "m", "version": 1}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(published["seq"], 1);
    let put = http
        .put(format!("{url}/kv/inference_response_topic"))
        .json(&json!("inference/results/shared"))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    stop(&mut child).await;
    assert!(cwd.path().join("data/conclave.db").is_file());

    let (mut child, url) = serve(&mut start()).await;
    let response = http
        .get(format!("{url}/bus/subscribe?subjects=sync.>&since=all"))
        .send()
        .await
        .unwrap();
    let mut lines = common::Lines::new(response);
    let replayed = lines.next().await.expect("the kept message");
    assert_eq!(replayed["data"], json!({"model": "m", "version": 1}));
    assert_eq!(replayed["subject"], "sync/weights_ready");
    let entry: Value = http
        .get(format!("{url}/kv/inference_response_topic?wait=5"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(entry["value"], "inference/results/shared");
    let waiting = http.get(format!("{url}/kv/later?wait=30")).send();
    let writer = async {
        http.put(format!("{url}/kv/later"))
            .json(&json!(1))
            .send()
            .await
            .unwrap()
    };
    let (waited, _) = tokio::join!(waiting, writer);
    assert_eq!(waited.unwrap().json::<Value>().await.unwrap()["value"], 1);
    drop(lines);
    stop(&mut child).await;
}

/// `GET url` read as JSON.
async fn get_json(http: &reqwest::Client, url: String) -> Value {
    http.get(url).send().await.unwrap().json().await.unwrap()
}

/// `POST url` with a JSON body, the answer read as JSON.
async fn post_json(http: &reqwest::Client, url: String, body: &Value) -> Value {
    http.post(url)
        .json(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// A streamed `GET url`, line by line.
async fn stream(http: &reqwest::Client, url: String) -> common::Lines {
    common::Lines::new(http.get(url).send().await.unwrap())
}

/// A deliberation that a `kill -9` cuts off is finished at the next start
/// with the answers that had arrived: COMPLETED, the unanswered agent
/// failed with `restarted`, and `deliberation.completed` on the bus.
#[tokio::test]
async fn a_deliberation_cut_by_kill_9_is_finished_on_restart() {
    let fast = common::sim::Sim::start("fast", &[]).await;
    let slow = common::sim::Sim::start("slow", &["--ttft-ms", "600000"]).await;
    let cwd = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        cwd.path().join("conclave.toml"),
        format!(
            "[gateway]\nallowed_upstreams = [\"127.0.0.1\"]\n\
             [gateway.pools.fast]\nreplicas = [{{ url = \"{}\" }}]\n\
             [gateway.pools.slow]\nreplicas = [{{ url = \"{}\" }}]\n",
            fast.url, slow.url
        ),
    )
    .unwrap();
    let start = || {
        let mut command = local_serve(cwd.path());
        command.args(["--config", "conclave.toml"]);
        command
    };
    let http = reqwest::Client::new();
    let (mut child, url) = serve(&mut start()).await;
    let submitted: Value = post_json(
        &http,
        format!("{url}/deliberations"),
        &json!({"task_description": "t", "num_agents": 3, "models": ["fast", "slow"]}),
    )
    .await;
    let task_id = submitted["task_id"].as_str().unwrap().to_string();
    let session = submitted["session_id"].as_str().unwrap();
    // The two fast agents' answers are stored before the kill.
    let mut events = stream(
        &http,
        format!("{url}/agent/session/{session}/events?since=0&follow=true"),
    )
    .await;
    let mut answered = 0;
    while answered < 2 {
        let event = events.next().await.expect("the stream goes on");
        if event["type"] == "agent_completed" {
            answered += 1;
        }
    }
    drop(events);
    child.kill().await.expect("kill -9");

    let (mut child, url) = serve(&mut start()).await;
    let result: Value = get_json(&http, format!("{url}/deliberations/{task_id}")).await;
    assert_eq!(result["status"], "COMPLETED", "{result}");
    assert_eq!(result["reason"], "restarted");
    assert_eq!(result["successful_responses"], 2);
    assert_eq!(result["results"][1]["agent_id"], "agent-general-002");
    assert_eq!(result["results"][1]["status"], "failed");
    assert_eq!(result["results"][1]["error"], "restarted");
    assert_eq!(result["results"][0]["status"], "completed");
    let replay = ndjson(
        http.get(format!("{url}/agent/session/{session}/events?since=0"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let kinds: Vec<&str> = replay.iter().filter_map(|e| e["type"].as_str()).collect();
    let done = kinds.iter().position(|k| *k == "deliberation_completed");
    assert!(done.is_some(), "{kinds:?}");
    assert_eq!(*kinds.last().unwrap(), "result");
    assert_eq!(replay.last().unwrap()["status"], "interrupted");
    let mut bus = stream(
        &http,
        format!("{url}/bus/subscribe?subjects=deliberation.completed&since=all"),
    )
    .await;
    let completed = bus.next().await.expect("the kept message");
    assert_eq!(completed["data"]["task_id"], task_id.as_str());
    assert_eq!(completed["data"]["status"], "COMPLETED");
    drop(bus);
    stop(&mut child).await;
}

/// A pipeline run that a `kill -9` cuts off shows `interrupted` after the
/// restart, and `resume` continues after its last checkpoint without
/// running a completed node again.
#[tokio::test]
async fn a_pipeline_cut_by_kill_9_resumes_after_its_last_checkpoint() {
    let cwd = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        cwd.path().join("conclave.toml"),
        "[pipelines]\ntest_mode = true\n",
    )
    .unwrap();
    let start = || {
        let mut command = local_serve(cwd.path());
        command.args(["--config", "conclave.toml"]);
        command
    };
    let http = reqwest::Client::new();
    let (mut child, url) = serve(&mut start()).await;
    let started: Value = post_json(
        &http,
        format!("{url}/orchestrator/pipeline/start"),
        &json!({"connector_name": "crm", "mock": {"delay_ms": 400}}),
    )
    .await;
    let thread = started["thread_id"].as_str().unwrap().to_string();
    let session = started["session_id"].as_str().unwrap().to_string();
    let mut events = stream(
        &http,
        format!("{url}/agent/session/{session}/events?since=0&follow=true"),
    )
    .await;
    let mut checkpoints = 0;
    while checkpoints < 2 {
        if events.next().await.expect("the stream goes on")["type"] == "checkpoint" {
            checkpoints += 1;
        }
    }
    drop(events);
    child.kill().await.expect("kill -9");

    let (mut child, url) = serve(&mut start()).await;
    let status: Value = get_json(
        &http,
        format!("{url}/orchestrator/pipeline/status/{thread}"),
    )
    .await;
    assert_eq!(status["status"], "interrupted", "{status}");
    let resumed = http
        .post(format!("{url}/orchestrator/pipeline/resume/{thread}"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), 202);
    let resumed: Value = resumed.json().await.unwrap();
    let from = resumed["from_step"].as_u64().unwrap();
    assert!(from >= 2, "{resumed}");
    let mut events = stream(
        &http,
        format!("{url}/agent/session/{session}/events?since=0&follow=true"),
    )
    .await;
    // The cut-off turn's result, then the resumed turn's.
    events.until("result").await;
    let last = events.until("result").await;
    assert_eq!(last.last().unwrap()["status"], "success");
    let history: Value = get_json(
        &http,
        format!("{url}/orchestrator/pipeline/history/{thread}"),
    )
    .await;
    let ran: Vec<&str> = history["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["node"].as_str())
        .collect();
    assert_eq!(
        ran,
        [
            "research",
            "generator",
            "tester",
            "test_reviewer",
            "reviewer",
            "publisher"
        ],
        "{history}"
    );
    stop(&mut child).await;
}

/// The dashboard as a new user opens it: the binary started from a fresh
/// working directory serves the page from what it embeds, and a
/// deliberation runs through it in a real Chromium.
#[tokio::test]
async fn the_dashboard_of_a_fresh_start_runs_a_deliberation_in_chromium() {
    let cwd = tempfile::tempdir().expect("tempdir");
    let (mut child, url) = serve(&mut local_serve(cwd.path())).await;
    let http = reqwest::Client::new();
    for path in ["/", "/ui/deliberations", "/static/js/app.js"] {
        let page = http.get(format!("{url}{path}")).send().await.expect("get");
        assert_eq!(page.status(), 200, "{path}");
    }
    let facts = common::browser_scenario("deliberations", &url, &[]).await;
    assert_eq!(facts["ok"], true);
    stop(&mut child).await;
}
