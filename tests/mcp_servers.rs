//! How `conclave mcp` finds the server its user means among the
//! `conclave serve`s running as that user, and what it serves itself when
//! none is meant: the real binaries, driven by the official Python SDK
//! (`mcp` from PyPI) over stdio, as an IDE starts them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};

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

    /// What `conclave mcp ARGS`, started in `cwd`, offers an MCP client,
    /// and its log.
    async fn offers(&self, cwd: &Path, args: &[&str]) -> (Value, String) {
        let args: Vec<&str> = ["mcp", "--sandbox", "local"]
            .iter()
            .chain(args)
            .copied()
            .collect();
        self.offers_of(cwd, &args).await
    }

    /// What `conclave ARGS` (exactly those), started in `cwd`, offers an
    /// MCP client, and its log.
    async fn offers_of(&self, cwd: &Path, args: &[&str]) -> (Value, String) {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/offers.py");
        let mut command = Command::new(common::python("the mcp package"));
        self.env(&mut command, cwd)
            .args([script, env!("CARGO_BIN_EXE_conclave")])
            .args(args);
        let output = command.output().await.unwrap();
        let log = String::from_utf8_lossy(&output.stderr).to_string();
        assert!(output.status.success(), "{log}");
        (serde_json::from_slice(&output.stdout).unwrap(), log)
    }

    /// The servers' record files.
    fn records(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.state.path().join("conclave/servers"))
            .map(|dir| dir.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
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

fn resources_of(session: &str) -> Value {
    let uri = format!("conclave://sessions/{session}");
    json!([uri.clone(), format!("{uri}/events")])
}

fn lists(seen: &Value, tool: &str) -> bool {
    seen["tools"].as_array().unwrap().iter().any(|t| t == tool)
}

/// Two servers as one user, each started in its project: `conclave mcp`
/// relays to the one on its data directory (./data where it starts, or
/// --data-dir), refuses to guess between them elsewhere, still finds the
/// first after the second stops (which removes only its own record), takes
/// the only one left from anywhere, and ignores a killed one's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conclave_mcp_relays_to_the_server_of_its_data_dir_among_several() {
    let user = User::new();
    let (a_dir, b_dir, elsewhere) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let (mut a, a_url) = user.serve(a_dir.path(), &[]).await;
    let (mut b, b_url) = user.serve(b_dir.path(), &[]).await;
    let (a_session, b_session) = (create_session(&a_url).await, create_session(&b_url).await);
    assert_eq!(user.records().len(), 2);

    let (seen, log) = user.offers(a_dir.path(), &[]).await;
    assert_eq!(seen["resources"], resources_of(&a_session), "{log}");
    assert!(lists(&seen, "run_agent"), "{seen}");
    assert!(log.contains(&format!("url={a_url}")), "{log}");
    let b_data = b_dir.path().join("data").display().to_string();
    let (seen, log) = user
        .offers(elsewhere.path(), &["--data-dir", &b_data])
        .await;
    assert_eq!(seen["resources"], resources_of(&b_session), "{log}");

    // Elsewhere, with no data directory: which one is meant is unknown.
    let mut command = Command::new(env!("CARGO_BIN_EXE_conclave"));
    user.env(&mut command, elsewhere.path())
        .args(["mcp", "--sandbox", "local"])
        .stdin(std::process::Stdio::null());
    let refused = command.output().await.unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    let here = elsewhere.path().join("data");
    assert!(
        stderr.contains(&format!(
            "2 conclave servers run as this user, none of them on {} or on \
             http://127.0.0.1:8080; pick one with --server URL",
            here.display()
        )),
        "{stderr}"
    );
    for (child, url, dir) in [(&a, &a_url, &a_dir), (&b, &b_url, &b_dir)] {
        let data_dir = std::fs::canonicalize(dir.path().join("data")).unwrap();
        let line = format!(
            "  conclave mcp --server {url}    (data dir {}, pid {})",
            data_dir.display(),
            child.id().unwrap()
        );
        assert!(stderr.contains(&line), "{line:?} in {stderr}");
    }
    // The line it prints is a command that works.
    let (seen, log) = user.offers(elsewhere.path(), &["--server", &b_url]).await;
    assert_eq!(seen["resources"], resources_of(&b_session), "{log}");

    // The second server stopping leaves the first one's record.
    stop(&mut b).await;
    assert_eq!(user.records().len(), 1);
    let (seen, log) = user.offers(a_dir.path(), &[]).await;
    assert_eq!(seen["resources"], resources_of(&a_session), "{log}");
    assert!(lists(&seen, "run_agent"), "{seen}");
    let (seen, log) = user.offers(elsewhere.path(), &[]).await;
    assert_eq!(seen["resources"], resources_of(&a_session), "{log}");
    assert!(log.contains("the only one running as this user"), "{log}");

    // Killed, the first leaves its record, which is ignored and removed:
    // the tools are served here, on the per-user data directory.
    a.kill().await.unwrap();
    let (seen, log) = user.offers(elsewhere.path(), &[]).await;
    assert_eq!(seen["server"], "conclave-sandbox", "{log}");
    assert!(
        !lists(&seen, "run_agent") && seen.get("resources").is_none(),
        "{seen}"
    );
    assert!(log.contains("the per-user default"), "{log}");
    assert_eq!(user.records(), Vec::<PathBuf>::new());
}

/// The IDE config of docs/sandboxes.md as written (`conclave mcp`, no
/// flags) on a machine where three servers run as the user, none of them
/// on the directory the IDE starts it in: it relays to the one on the
/// default address, the one a browser and the docs go to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_ide_config_relays_to_the_server_on_the_default_address() {
    if let Err(e) = std::net::TcpListener::bind("127.0.0.1:8080") {
        panic!("this test runs a server on 127.0.0.1:8080, which is taken: {e}");
    }
    let user = User::new();
    let dirs: Vec<TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let (mut a, a_url) = user.serve(dirs[0].path(), &[]).await;
    let (mut b, b_url) = user.serve(dirs[1].path(), &[]).await;
    // `conclave serve` with its default flags, as the README starts it.
    let mut command = Command::new(env!("CARGO_BIN_EXE_conclave"));
    user.env(&mut command, dirs[2].path())
        .args(["serve", "--sandbox", "local"])
        .env("RUST_LOG", "warn");
    let (mut c, c_url) = spawn_server(&mut command).await;
    assert_eq!(c_url, "http://127.0.0.1:8080");
    let sessions = [
        create_session(&a_url).await,
        create_session(&b_url).await,
        create_session(&c_url).await,
    ];
    assert_eq!(user.records().len(), 3);

    let ide = dirs[3].path();
    let (seen, log) = user.offers_of(ide, &["mcp"]).await;
    assert_eq!(seen["resources"], resources_of(&sessions[2]), "{log}");
    assert!(lists(&seen, "run_agent"), "{seen}");
    assert!(
        log.contains("on the default address http://127.0.0.1:8080"),
        "{log}"
    );
    // The data directory still decides first.
    let (seen, log) = user.offers(dirs[0].path(), &[]).await;
    assert_eq!(seen["resources"], resources_of(&sessions[0]), "{log}");
    for child in [&mut a, &mut b, &mut c] {
        stop(child).await;
    }
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
        // The exec helper's directory beside the sandboxes is not one.
        std::fs::read_dir(&sandboxes)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name())
                    .filter(|name| name != ".exec")
                    .collect()
            })
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
