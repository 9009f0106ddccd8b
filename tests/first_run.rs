//! The real binary as a new user starts it: from a fresh working directory,
//! with the default data directory (`./data`) or a relative one, on the
//! local sandbox backend named on the command line and on `auto` where
//! docker does not answer. Each server runs a tool call in a sandbox.

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
}

/// Where the data directory is given, always relative.
enum DataDir {
    Default,
    Flag(&'static str),
    Env(&'static str),
}

/// Starts `conclave serve` in a fresh working directory with `data_dir`,
/// runs `$ …` through the demo model's `Bash` tool, and checks that the
/// answer came from a local sandbox and that the state lies under `expected`.
async fn serve_and_run_a_tool(backend: Backend, data_dir: DataDir, expected: &str) {
    let cwd = tempfile::tempdir().expect("tempdir");
    let mut command = Command::new(env!("CARGO_BIN_EXE_conclave"));
    command
        .current_dir(cwd.path())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_remove("CONCLAVE_SANDBOX")
        .env_remove("CONCLAVE_DATA_DIR")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    match backend {
        Backend::LocalFlag => {
            command.args(["--sandbox", "local"]);
        }
        Backend::AutoWithoutDocker => {
            let socket = cwd.path().join("no-docker.sock");
            command.env("DOCKER_HOST", format!("unix://{}", socket.display()));
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

    let http = reqwest::Client::new();
    let created: Value = http
        .post(format!("{url}/agent/session"))
        .json(&json!({}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("json");
    let id = created["session_id"].as_str().expect("session_id");
    let events = ndjson(
        http.post(format!("{url}/agent/session/{id}/message"))
            .json(&json!({"prompt": "$ echo from-a-sandbox > note.txt && cat note.txt && pwd"}))
            .send()
            .await
            .expect("message"),
    )
    .await;
    let result = events
        .iter()
        .find(|e| e["type"] == "tool_result")
        .unwrap_or_else(|| panic!("no tool_result in {events:?}"));
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
    assert_eq!(status["sandbox"]["backend"], "local", "{status}");

    let state = cwd.path().join(expected);
    for file in ["conclave.db", "instance-id", "sandboxes"] {
        assert!(
            state.join(file).exists(),
            "{} is missing",
            state.join(file).display()
        );
    }
    stop(&mut child).await;
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
async fn local_flag_with_a_relative_data_dir_from_the_environment() {
    serve_and_run_a_tool(Backend::LocalFlag, DataDir::Env("from-env"), "from-env").await;
}
