//! The real `conclave` binary as a child process.

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// `conclave serve` on 127.0.0.1:0 with `args`, with no `CONCLAVE_*`
/// configuration taken from the test's environment.
pub fn serve_command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_conclave"));
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "warn");
    for (name, _) in std::env::vars() {
        let test_only = name.starts_with("CONCLAVE_TEST_") || name.starts_with("CONCLAVE_BENCH_");
        if name.starts_with("CONCLAVE_") && !test_only {
            command.env_remove(name);
        }
    }
    command
}

/// Spawns `command` and reads the URL it listens on; a start that fails
/// panics with the server's stderr.
pub async fn spawn_server(command: &mut Command) -> (Child, String) {
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

/// The server's stderr, read to its end from a task of its own (so a
/// chatty log never fills the pipe): its text once the server exits.
pub fn drain_stderr(child: &mut Child) -> tokio::task::JoinHandle<String> {
    use tokio::io::AsyncReadExt;
    let mut stderr = child.stderr.take().expect("stderr piped");
    tokio::spawn(async move {
        let mut text = String::new();
        stderr.read_to_string(&mut text).await.expect("read stderr");
        text
    })
}

/// SIGTERM, then waits for a clean exit.
pub async fn stop(child: &mut Child) {
    let pid = child.id().expect("running");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let exit = child.wait().await.expect("exit");
    assert!(exit.success(), "{exit}");
}

/// The JSON body of the answer to `request`.
pub async fn json_of(request: reqwest::RequestBuilder) -> serde_json::Value {
    request
        .send()
        .await
        .expect("the server answers")
        .json()
        .await
        .expect("a JSON body")
}

/// The JSON body of the answer to `request`, which must be a 200.
pub async fn json_ok(request: reqwest::RequestBuilder) -> serde_json::Value {
    let answer = request.send().await.expect("the server answers");
    let status = answer.status();
    let body: serde_json::Value = answer.json().await.expect("a JSON body");
    assert_eq!(status, 200, "{body}");
    body
}

/// A request with `key` as its bearer token: the answer's status and
/// body.
pub async fn send_keyed(
    key: &str,
    method: reqwest::Method,
    url: String,
    body: Option<serde_json::Value>,
) -> (u16, String) {
    let mut request = reqwest::Client::new().request(method, url).bearer_auth(key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("the server answers");
    let status = response.status().as_u16();
    (status, response.text().await.expect("a body"))
}

/// `GET url` with `key` as its bearer token: status and body.
pub async fn get_keyed(key: &str, url: String) -> (u16, String) {
    send_keyed(key, reqwest::Method::GET, url, None).await
}

/// Creates a session with `create` as `key` and runs one turn of
/// `prompt`: the session's id, the turn's NDJSON and its events.
pub async fn keyed_turn(
    key: &str,
    base: &str,
    create: serde_json::Value,
    prompt: &str,
) -> (String, String, Vec<serde_json::Value>) {
    let post = reqwest::Method::POST;
    let url = format!("{base}/agent/session");
    let (status, body) = send_keyed(key, post.clone(), url, Some(create)).await;
    assert_eq!(status, 201, "{body}");
    let id = serde_json::from_str::<serde_json::Value>(&body).expect("JSON")["session_id"]
        .as_str()
        .expect("a session id")
        .to_string();
    let url = format!("{base}/agent/session/{id}/message");
    let prompt = serde_json::json!({ "prompt": prompt });
    let (status, turn) = send_keyed(key, post, url, Some(prompt)).await;
    assert_eq!(status, 200, "{turn}");
    let events = turn
        .lines()
        .map(|l| serde_json::from_str(l).expect("an NDJSON event"))
        .collect();
    (id, turn, events)
}

/// The `output` of each `tool_result` event, as JSON text.
pub fn tool_results(events: &[serde_json::Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"] == "tool_result")
        .map(|e| e["output"].to_string())
        .collect()
}

/// The peak resident memory of process `pid` so far, in MiB.
pub fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("a VmHWM line");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("a number of KiB");
    kib / 1024
}
