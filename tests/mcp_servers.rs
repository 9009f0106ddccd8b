//! What `conclave mcp` serves itself when no server is meant: the real
//! binaries, driven by the official Python SDK (`mcp` from PyPI) over
//! stdio, as an IDE starts them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::binary::{serve_command, spawn_server, stop};
use common::postgres::{TestDatabase, test_server};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::process::Command;

/// A user of their own: a home and a state directory (where servers record
/// themselves) that no other test shares.
struct User {
    home: TempDir,
    state: TempDir,
}

impl User {
    fn new() -> User {
        User {
            home: tempfile::tempdir().unwrap(),
            state: tempfile::tempdir().unwrap(),
        }
    }

    /// `command` as this user, started in `cwd`, with no `CONCLAVE_*`
    /// settings of the test's environment.
    fn env<'a>(&self, command: &'a mut Command, cwd: &Path) -> &'a mut Command {
        for (name, _) in std::env::vars() {
            if name.starts_with("CONCLAVE_") && !name.starts_with("CONCLAVE_TEST_") {
                command.env_remove(name);
            }
        }
        command
            .current_dir(cwd)
            .env("HOME", self.home.path())
            .env("XDG_STATE_HOME", self.state.path())
            .env_remove("XDG_DATA_HOME")
            .env("RUST_LOG", "info")
    }

    /// `conclave serve` on local sandboxes, started in `cwd` (so its data
    /// directory is `cwd/data`).
    async fn serve(&self, cwd: &Path, args: &[&str]) -> (tokio::process::Child, String) {
        let mut command = serve_command(&["--sandbox", "local"]);
        command.args(args);
        self.env(&mut command, cwd).env("RUST_LOG", "warn");
        spawn_server(&mut command).await
    }
}

async fn create_session(url: &str) -> String {
    let response = reqwest::Client::new()
        .post(format!("{url}/agent/session"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let body: Value = response.json().await.unwrap();
    body["session_id"].as_str().unwrap().to_string()
}

/// `conclave mcp` serving the tools itself builds them as `conclave serve`
/// does: with a config naming a PostgreSQL store it finds there the
/// session a server made, works in its sandbox and opens no SQLite, and a
/// later server on that store removes the sandbox it made for the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conclave_mcp_serving_the_tools_itself_uses_the_configured_postgres_store() {
    let database = TestDatabase::create(&test_server()).await;
    let user = User::new();
    let (project, ide) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let config = project.path().join("conclave.toml");
    std::fs::write(&config, format!("store = \"{}\"\n", database.url())).unwrap();
    let config = config.display().to_string();
    let (mut server, url) = user.serve(project.path(), &["--config", &config]).await;
    let session = create_session(&url).await;
    stop(&mut server).await;

    let data_dir = project.path().join("data");
    let shell = |args: Vec<String>| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/client.py");
        let mut command = Command::new(common::python("the mcp package"));
        user.env(&mut command, ide.path())
            .args([script, "shell", &session, "echo from-ide > ide.txt && pwd"])
            .args([env!("CARGO_BIN_EXE_conclave"), "mcp", "--sandbox", "local"])
            .args(args);
        async move {
            let output = command.output().await.unwrap();
            let log = String::from_utf8_lossy(&output.stderr).to_string();
            assert!(output.status.success(), "{log}");
            let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
            (seen, log)
        }
    };
    let data = data_dir.display().to_string();
    let (seen, log) = shell(vec![
        "--config".into(),
        config.clone(),
        "--data-dir".into(),
        data,
    ])
    .await;
    assert_eq!(
        seen,
        json!({"is_error": false, "result": seen["result"]}),
        "{log}"
    );
    assert_eq!(seen["result"]["stdout"], "/workspace\n", "{seen}");
    assert!(log.contains(&format!("store={}", database.url())), "{log}");
    assert!(!data_dir.join("conclave.db").exists());
    // The session's sandbox stays for its next turn: the session is live
    // in the store.
    let sandboxes = data_dir.join("sandboxes");
    let left = || -> Vec<_> {
        std::fs::read_dir(&sandboxes)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default()
    };
    assert_eq!(left().len(), 1, "{:?}", left());

    // Without the config it is the per-user SQLite store: no such session.
    let (seen, _) = shell(Vec::new()).await;
    assert_eq!(seen["is_error"], true, "{seen}");

    // The next server on the store has the session; deleting it removes
    // the sandbox `conclave mcp` made.
    let (mut server, url) = user.serve(project.path(), &["--config", &config]).await;
    let http = reqwest::Client::new();
    let status = http
        .get(format!("{url}/agent/session/{session}/status"))
        .send()
        .await
        .unwrap();
    assert_eq!(status.status(), 200);
    let deleted = http
        .delete(format!("{url}/agent/session/{session}"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    stop(&mut server).await;
    assert!(left().is_empty(), "sandboxes left: {:?}", left());
}
