//! The MCP server through the official Python SDK (`mcp` from PyPI), over
//! streamable HTTP at `/mcp` and over stdio from `conclave mcp`, against
//! real docker sandboxes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "mcp/approvals.rs"]
mod approvals;
mod common;
#[path = "mcp/conformance.rs"]
mod conformance;
#[path = "mcp/revisions.rs"]
mod revisions;

use std::process::Command;

use common::TestServer;
use serde_json::{Value, json};

/// The Python with the `mcp` package; scripts/test.sh sets it.
fn python() -> String {
    std::env::var("CONCLAVE_TEST_PYTHON").expect(
        "CONCLAVE_TEST_PYTHON must name a python with the mcp package (scripts/test.sh sets it)",
    )
}

fn run_client(args: &[&str]) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/client.py");
    let output = Command::new(python())
        .arg(script)
        .args(args)
        .output()
        .expect("python starts");
    assert!(
        output.status.success(),
        "client failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("client prints JSON")
}

/// What an MCP client saw; `deliberate`, `start_pipeline`, `run_agent` and
/// `fork_session` are listed by the server's `/mcp`
/// (which runs sessions), not by the stdio `conclave mcp`.
fn check(seen: &Value, served: bool) {
    let tools: Vec<&str> = seen["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(Value::as_str)
        .filter(|name| {
            let server_only = matches!(
                *name,
                "deliberate" | "start_pipeline" | "run_agent" | "fork_session"
            );
            assert!(served || !server_only, "stdio lists {name}");
            served || !server_only
        })
        .collect();
    let tools: Vec<&str> = if served {
        tools
    } else {
        let mut all: Vec<&str> = ["deliberate", "fork_session", "run_agent", "start_pipeline"]
            .into_iter()
            .chain(tools)
            .collect();
        all.sort();
        all
    };
    assert_eq!(
        tools,
        [
            "deliberate",
            "download",
            "edit_file",
            "execute_code",
            "execute_shell",
            "fork_session",
            "glob",
            "grep",
            "kill_background",
            "list_background",
            "list_files",
            "read_file",
            "run_agent",
            "start_pipeline",
            "upload",
            "write_file"
        ]
    );
    assert_eq!(seen["schema_formats"], json!([]));
    let schema = &seen["execute_code_schema"]["properties"];
    assert_eq!(
        schema["timeout"]["minimum"], 0,
        "unsigned integers keep their bound: {schema}"
    );
    for field in ["code", "language", "session_id", "timeout", "repair"] {
        assert!(
            schema.get(field).is_some(),
            "execute_code lacks {field}: {schema}"
        );
    }
    let code = &seen["execute_code"];
    assert_eq!(code["stdout"], "42 1000\n");
    assert_eq!(code["exit_code"], 0);
    assert_eq!(code["status"], "success");
    assert_eq!(code["truncated"], false);
    assert!(code["duration_ms"].is_u64());
    // Python's own error for a caller that did not ask for repairs; the
    // repair, said on stderr, for one that did.
    let plain = &seen["plain_cell"];
    assert_eq!(plain["stdout"], "a\n", "{plain}");
    let stderr = plain["stderr"].as_str().expect("stderr");
    assert!(
        stderr.contains("AttributeError: 'NoneType' object has no attribute 'upper'")
            && !stderr.contains("repair"),
        "{plain}"
    );
    assert_eq!(plain["exit_code"], 1);
    let repaired = &seen["repaired_cell"];
    assert_eq!(repaired["stdout"], "A\n", "{repaired}");
    assert!(
        repaired["stderr"]
            .as_str()
            .expect("stderr")
            .starts_with("repair: print() returns None"),
        "{repaired}"
    );
    assert_eq!(seen["read_file"]["content"], "hello from mcp\n");
    assert_eq!(
        seen["upload"]["path"], "/workspace/up",
        "{}",
        seen["upload"]
    );
    assert_eq!(seen["upload"]["files"], 2);
    assert_eq!(
        seen["download"],
        json!([["./one.txt", "one\n"], ["./sub/two.txt", "two\n"]])
    );
    let hostile = seen["hostile_upload"].as_str().unwrap_or_default();
    assert!(hostile.contains("../escape.txt"), "{hostile}");
    assert_eq!(
        seen["execute_shell"]["stdout"],
        "tick 1\ntick 2\ntick 3\ntick 4\n"
    );
    // Progress carries the output itself, not only a byte count: the
    // ticks printed after the first second come as they are printed.
    let progress: Vec<&str> = seen["progress"]
        .as_array()
        .expect("progress")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        progress.iter().any(|m| m.contains("tick 2")),
        "a 2 s execution reported no output as progress: {progress:?}"
    );
    assert_eq!(seen["sh_language"]["stdout"], "1\n");
    let big = &seen["big_output"];
    assert_eq!(big["stdout_bytes"], 600_000, "{big}");
    assert_eq!(big["truncated"], false, "{big}");
    assert!(
        big["text_bytes"].as_u64().is_some_and(|n| n < 1000),
        "the output is not copied into a text block: {big}"
    );
    let error = |key: &str| seen[key].as_str().unwrap_or_default().to_string();
    assert_eq!(
        seen["background"],
        json!({
            "started": "running",
            "listed": [[true, "running", "up\n"]],
            // The background run alone: the plain call's `sleep 301` died
            // with its call.
            "alive_before_kill": "1",
            "killed": "killed",
            "alive_after_kill": "0",
        })
    );
    assert!(
        error("unknown_background").contains("no background run"),
        "{}",
        error("unknown_background")
    );
    assert!(
        error("missing_argument").contains("code"),
        "{}",
        error("missing_argument")
    );
    assert!(!error("bad_type").is_empty());
    assert!(
        error("unknown_session").contains("unknown session"),
        "{}",
        error("unknown_session")
    );
    assert!(
        error("not_a_uuid").contains("not a UUID"),
        "{}",
        error("not_a_uuid")
    );
    assert!(
        error("escape").contains("outside /workspace"),
        "{}",
        error("escape")
    );
    assert!(
        error("bad_language").contains("cobol"),
        "{}",
        error("bad_language")
    );
    assert!(!error("unknown_tool").is_empty());
    // No prompts are declared, and prompts/list says so: method not found.
    assert_eq!(seen["declares_prompts"], json!(false));
    assert_eq!(seen["list_prompts"], json!(-32601));
    assert_eq!(
        seen["failures_as_results"],
        json!([
            ["read_file", true, true],
            ["edit_file", true, true],
            ["execute_code", true, true],
            ["execute_shell", true, true],
        ])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_over_streamable_http() {
    let key = "mcp-test-key-1";
    let server = TestServer::start_sandboxed(|config| {
        config.api_keys = vec![key.into(), "other-key-2".into()];
    })
    .await;
    let new_session = || async {
        let response = server
            .http
            .post(server.url("/agent/session"))
            .bearer_auth(key)
            .json(&json!({"session_name": "ide"}))
            .send()
            .await
            .expect("create");
        assert_eq!(response.status(), 201);
        let session: Value = response.json().await.expect("json");
        session["session_id"].as_str().expect("id").to_string()
    };
    let id = new_session().await;

    // Without a key, /mcp answers 401 like every route.
    let response = server
        .http
        .post(server.url("/mcp"))
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 401);

    let url = server.url("/mcp");
    let ide = id.clone();
    let seen = tokio::task::spawn_blocking(move || run_client(&["http", &url, &ide, key]))
        .await
        .expect("client");
    check(&seen, true);
    // The upload is in the session's history, as an HTTP upload is.
    let log = server
        .http
        .get(server.url(&format!("/agent/session/{id}/events")))
        .bearer_auth(key)
        .send()
        .await
        .expect("events")
        .text()
        .await
        .expect("text");
    assert!(log.contains("\"workspace_uploaded\""), "{log}");
    // The same through `conclave mcp` relaying to the server with the key,
    // in a session of its own (the background runs listed are a session's).
    let url = server.url("");
    let relayed = new_session().await;
    let seen = tokio::task::spawn_blocking(move || {
        let conclave = env!("CARGO_BIN_EXE_conclave");
        run_client(&[
            "stdio",
            &relayed,
            conclave,
            "mcp",
            "--server",
            &url,
            "--api-key",
            key,
        ])
    })
    .await
    .expect("client");
    check(&seen, true);

    // The sandbox the IDE used is the session's: its status shows it.
    let status: Value = server
        .http
        .get(server.url(&format!("/agent/session/{id}/status")))
        .bearer_auth(key)
        .send()
        .await
        .expect("status")
        .json()
        .await
        .expect("json");
    assert_eq!(status["sandbox"]["backend"], "docker");
    assert_eq!(status["sandbox"]["state"], "running");
    assert!(
        status["sandbox"]["memory_bytes"]
            .as_u64()
            .is_some_and(|b| b > 0)
    );
    server.stop_and_remove_sandboxes().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_cannot_reach_another_keys_session_over_mcp() {
    let server = TestServer::start_sandboxed(|config| {
        config.api_keys = vec!["owner-key-1".into(), "intruder-key-2".into()];
    })
    .await;
    let session: Value = server
        .http
        .post(server.url("/agent/session"))
        .bearer_auth("owner-key-1")
        .json(&json!({}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("json");
    let id = session["session_id"].as_str().expect("id").to_string();
    let url = server.url("/mcp");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/intruder.py");
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .args([script, &url, &id, "intruder-key-2"])
            .output()
            .expect("python")
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("unknown session"), "{stdout}");
    server.stop_and_remove_sandboxes().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_over_stdio_from_conclave_mcp() {
    let server = TestServer::start_sandboxed(|_| {}).await;
    let id = server
        .create_session(json!({"session_name": "stdio"}))
        .await;
    let data_dir = server.data_dir.display().to_string();
    let seen = tokio::task::spawn_blocking(move || {
        run_client(&[
            "stdio",
            &id,
            env!("CARGO_BIN_EXE_conclave"),
            "mcp",
            "--sandbox",
            "docker",
            "--data-dir",
            &data_dir,
        ])
    })
    .await
    .expect("client");
    check(&seen, false);
    server.stop_and_remove_sandboxes().await;
}

/// `conclave mcp` over stdio on the server's data directory works in the
/// session's own sandbox: it sees what the agent wrote, the agent's next
/// turn sees what it wrote, and a sandbox it made first outlives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_shares_the_sessions_sandbox_with_the_server() {
    let server = TestServer::start_sandboxed(|_| {}).await;
    let data_dir = server.data_dir.display().to_string();
    let stdio_shell = |id: String, command: &'static str| {
        let data_dir = data_dir.clone();
        tokio::task::spawn_blocking(move || {
            run_client(&[
                "shell",
                &id,
                command,
                env!("CARGO_BIN_EXE_conclave"),
                "mcp",
                "--sandbox",
                "docker",
                "--data-dir",
                &data_dir,
            ])
        })
    };
    let tool_stdout = |events: &[Value]| {
        events
            .iter()
            .find(|e| e["type"] == "tool_result")
            .map(|e| e["output"]["stdout"].clone())
            .unwrap_or_else(|| panic!("no tool_result in {events:?}"))
    };

    // The agent made the sandbox first.
    let agent_first = server.create_session(json!({})).await;
    let events = server
        .turn(&agent_first, "$ echo from-agent > a.txt && echo ok")
        .await;
    assert_eq!(tool_stdout(&events), "ok\n");
    let seen = stdio_shell(agent_first.clone(), "cat a.txt && echo from-ide > b.txt")
        .await
        .unwrap();
    assert_eq!(seen["is_error"], false, "{seen}");
    assert_eq!(seen["result"]["stdout"], "from-agent\n", "{seen}");
    let events = server.turn(&agent_first, "$ cat b.txt").await;
    assert_eq!(tool_stdout(&events), "from-ide\n");

    // The IDE made it first, and exited.
    let ide_first = server.create_session(json!({})).await;
    let seen = stdio_shell(ide_first.clone(), "echo ide-first > c.txt")
        .await
        .unwrap();
    assert_eq!(seen["is_error"], false, "{seen}");
    let events = server.turn(&ide_first, "$ cat c.txt").await;
    assert_eq!(tool_stdout(&events), "ide-first\n");
    server.stop_and_remove_sandboxes().await;
}

/// `/mcp` answers only the hosts in `allowed_hosts` (DNS rebinding):
/// a page on another name that resolves here cannot drive the tools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_refuses_a_host_outside_allowed_hosts() {
    let server = TestServer::start_sandboxed(|_| {}).await;
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "probe", "version": "1"}}
    });
    let post = |host: &str| {
        server
            .http
            .post(server.url("/mcp"))
            .header("host", host)
            .header("accept", "application/json, text/event-stream")
            .json(&initialize)
            .send()
    };
    let refused = post("rebound.example").await.expect("post");
    assert_eq!(refused.status(), 403);
    let body: Value = refused.json().await.expect("a JSON error");
    assert_eq!(body["error"]["code"], "host_not_allowed");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("allowed_hosts")),
        "{body}"
    );
    let port = server.addr.port();
    let allowed = post(&format!("localhost:{port}")).await.expect("post");
    assert_eq!(allowed.status(), 200, "{:?}", allowed.text().await);
    server.stop_and_remove_sandboxes().await;
}

/// A body that is not one JSON-RPC message is answered with a JSON-RPC
/// error and `400`: not JSON `-32700`, a batch or another value `-32600`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_mcp_body_gets_a_jsonrpc_error() {
    let server = TestServer::start_sandboxed(|_| {}).await;
    for (body, code) in [
        ("{", -32700),
        (r#"[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]"#, -32600),
        (r#"{"id": 1, "method": "ping"}"#, -32600),
        (r#"{"jsonrpc": "2.0", "id": 1}"#, -32600),
        ("42", -32600),
    ] {
        let answer = server
            .http
            .post(server.url("/mcp"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body)
            .send()
            .await
            .expect("post");
        assert_eq!(answer.status(), 400, "{body}");
        let error: Value = answer.json().await.expect("a JSON-RPC error");
        assert_eq!(
            (&error["jsonrpc"], &error["id"], &error["error"]["code"]),
            (&json!("2.0"), &Value::Null, &json!(code)),
            "{body}: {error}"
        );
    }
    server.stop_and_remove_sandboxes().await;
}

/// As an IDE starts it: `conclave mcp` without `--data-dir`, from another
/// directory, relays to the `conclave serve` running as the same user (the
/// README's default flags), says so in its log, and makes no `./data` where
/// it was started. With no server running it serves the tools itself on the
/// per-user data directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_without_a_data_dir_relays_to_the_running_server() {
    use tokio::io::AsyncBufReadExt;
    let home = tempfile::tempdir().unwrap();
    let serve_cwd = tempfile::tempdir().unwrap();
    let ide_cwd = tempfile::tempdir().unwrap();
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_conclave"))
        .current_dir(serve_cwd.path())
        .args(["serve", "--listen", "127.0.0.1:0", "--sandbox", "local"])
        .env("HOME", home.path())
        .env_remove("XDG_STATE_HOME")
        .env_remove("XDG_DATA_HOME")
        .env_remove("CONCLAVE_DATA_DIR")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(server.stdout.take().unwrap()).lines();
    let first = lines.next_line().await.unwrap().expect("a first line");
    let url = first
        .strip_prefix("conclave listening on ")
        .unwrap()
        .to_string();
    let created: Value = reqwest::Client::new()
        .post(format!("{url}/agent/session"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["session_id"].as_str().unwrap().to_string();
    let ide = |id: String| {
        let (home, cwd) = (home.path().to_owned(), ide_cwd.path().to_owned());
        tokio::task::spawn_blocking(move || {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/client.py");
            Command::new(python())
                .current_dir(cwd)
                .env("HOME", home)
                .env_remove("XDG_STATE_HOME")
                .env_remove("XDG_DATA_HOME")
                .env_remove("CONCLAVE_DATA_DIR")
                .args([script, "shell", &id, "pwd"])
                .args([env!("CARGO_BIN_EXE_conclave"), "mcp", "--sandbox", "local"])
                .output()
                .unwrap()
        })
    };
    let output = ide(id.clone()).await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(output.status.success(), "{stderr}");
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(seen["is_error"], false, "{seen} {stderr}");
    assert_eq!(seen["result"]["stdout"], "/workspace\n", "{seen}");
    assert!(!ide_cwd.path().join("data").exists());
    let data_dir = serve_cwd.path().join("data");
    assert!(
        stderr.contains(&format!("url={url}"))
            && stderr.contains("relaying to a running server")
            && stderr.contains("the server running as pid"),
        "{stderr}"
    );

    // Deleting the session removes the sandbox `conclave mcp` made for it.
    let deleted = reqwest::Client::new()
        .delete(format!("{url}/agent/session/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    let pid = server.id().unwrap();
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(server.wait().await.unwrap().success());
    // The exec helper's directory beside the sandboxes is not one.
    let left: Vec<_> = std::fs::read_dir(data_dir.join("sandboxes"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name())
                .filter(|name| name != ".exec")
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "sandboxes left: {left:?}");

    // No server: the per-user directory, where that session is unknown.
    let output = ide(id).await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(seen["is_error"], true, "{seen}");
    assert!(stderr.contains("the per-user default"), "{stderr}");
    assert!(
        home.path()
            .join(".local/share/conclave/conclave.db")
            .exists()
    );
}

/// An IDE hands whole tasks to a sandboxed agent over `/mcp` and watches
/// them: progress before the result, a second turn in the same session, a
/// cancelled turn that ends interrupted with its command killed, the
/// session as resources (listed, read, updates to a subscriber), and
/// another key that finds none of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_agent_and_session_resources_over_streamable_http() {
    let server = agent_server().await;
    let url = server.url("/mcp");
    check_agent_script(&["http", &url, "ide-key-1", "other-key-2"]).await;
    server.stop_and_remove_sandboxes().await;
}

/// The same through `conclave mcp --server URL` over stdio, one process per
/// key (given in CONCLAVE_API_KEY): it relays to the server's `/mcp`, whose
/// live sessions it shares, and the server's key check decides what each
/// of them sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_agent_and_session_resources_over_stdio_relaying_to_the_server() {
    let server = agent_server().await;
    let url = server.url("");
    let conclave = env!("CARGO_BIN_EXE_conclave");
    check_agent_script(&[
        "stdio",
        "ide-key-1",
        "other-key-2",
        conclave,
        "mcp",
        "--server",
        &url,
    ])
    .await;
    server.stop_and_remove_sandboxes().await;
}

async fn agent_server() -> TestServer {
    TestServer::start_sandboxed(|config| {
        config.api_keys = vec!["ide-key-1".into(), "other-key-2".into()];
    })
    .await
}

/// Runs `tests/mcp/agent.py` with `args` and checks what the owner
/// (`ide-key-1`) and the other key saw.
async fn check_agent_script(args: &[&str]) {
    let seen = common::python_json("tests/mcp/agent.py", args, "the mcp package").await;
    check_agent(&seen);
    let id = seen["first"]["structured"]["session_id"].as_str().unwrap();
    let uri = format!("conclave://sessions/{id}");
    let other = &seen["other"];
    let own = format!("conclave://sessions/{}", other["own_id"].as_str().unwrap());
    assert_eq!(
        *other,
        json!({
            "run_agent": format!("session '{id}' not found"),
            "fork_session": format!("session {id} not found"),
            "read": format!("no resource {uri}"),
            "read_events": format!("no resource {uri}/events"),
            "read_file": format!("no resource {uri}/files/notes/hello.md"),
            "subscribe": format!("no resource {uri}"),
            "own_id": other["own_id"],
            "listed": [own.clone(), format!("{own}/events")],
        })
    );
}

/// What `tests/mcp/agent.py` saw as the session's owner.
fn check_agent(seen: &Value) {
    // fork_session made two sessions of the owner from the first turn's end.
    let forked = &seen["forked"];
    assert_eq!(forked["is_error"], false, "{forked}");
    assert_eq!(
        forked["structured"]["from_session"],
        seen["first"]["structured"]["session_id"]
    );
    assert_eq!(
        forked["structured"]["sessions"].as_array().unwrap().len(),
        2,
        "{forked}"
    );
    assert!(
        seen["tools"]
            .as_array()
            .unwrap()
            .contains(&json!("run_agent"))
    );
    assert_eq!(
        seen["templates"],
        json!([
            "conclave://sessions/{session_id}",
            "conclave://sessions/{session_id}/events",
            "conclave://sessions/{session_id}/files/{path}"
        ])
    );
    assert_eq!(
        seen["file"],
        json!({"mime_type": "text/markdown", "text": "# hi\n"})
    );
    assert!(
        seen["missing_file"]
            .as_str()
            .unwrap()
            .contains("no resource"),
        "{}",
        seen["missing_file"]
    );
    let first = &seen["first"];
    let id = first["structured"]["session_id"]
        .as_str()
        .expect("a session id");
    assert_eq!(first["is_error"], false, "{first}");
    assert_eq!(first["structured"]["status"], "success");
    assert!(
        first["text"].as_str().unwrap().contains("stdout:\n42"),
        "{first}"
    );
    assert_eq!(first["structured"]["usage"]["tool_calls"], 1);
    assert_eq!(seen["list_changed_after_first"], 1);
    // The second call continues the same session.
    let second = &seen["second"];
    assert_eq!(second["text"], "You said: and now say hello again");
    assert_eq!(second["structured"]["session_id"], id);
    assert_eq!(second["structured"]["session_usage"]["turns"], 3);
    // Progress came before each result: the tool call, its output, the text.
    let timeline: Vec<(String, String, String)> = seen["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let text = |i: usize| e[i].as_str().unwrap_or_default().to_string();
            (text(0), text(1), text(2))
        })
        .collect();
    let at = |label: &str, what: &str, starts: &str| {
        timeline
            .iter()
            .position(|(l, w, m)| l == label && w == what && m.starts_with(starts))
            .unwrap_or_else(|| panic!("no {label} {what} {starts:?} in {timeline:?}"))
    };
    let result = at("first", "result", "");
    assert!(
        at(
            "first",
            "progress",
            "mcp__sandbox__execute_code print(6 * 7)"
        ) < result
    );
    assert!(
        at(
            "first",
            "progress",
            "mcp__sandbox__execute_code returned: 42"
        ) < result
    );
    assert!(at("second", "progress", "You said") < at("second", "result", ""));
    // The resources: listed, read, and updates while the turn ran.
    let uri = format!("conclave://sessions/{id}");
    // The session and the two forks fork_session made.
    let mut listed = vec![uri.clone(), format!("{uri}/events")];
    for fork in seen["forked"]["structured"]["sessions"].as_array().unwrap() {
        let fork = format!(
            "conclave://sessions/{}",
            fork["session_id"].as_str().unwrap()
        );
        listed.extend([fork.clone(), format!("{fork}/events")]);
    }
    listed.sort();
    assert_eq!(seen["listed"], json!(listed));
    assert_eq!(seen["updated"], json!([format!("{uri}/events")]));
    let status = &seen["status"];
    assert_eq!(status["status"], "idle");
    assert_eq!(status["usage"], second["structured"]["session_usage"]);
    let roles: Vec<&str> = status["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["role"].as_str())
        .collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant"
        ]
    );
    assert_eq!(seen["events_mime"], "application/x-ndjson");
    assert_eq!(
        seen["event_types"],
        json!([
            "status",
            "thinking",
            "tool_use",
            "tool_result",
            "thinking",
            "result",
            "status",
            "thinking",
            "result"
        ])
    );
    // Cancelled mid-command: interrupted, and the command is gone.
    assert_eq!(seen["sleeps_before_cancel"], "1");
    assert_eq!(seen["after_cancel"], "interrupted");
    assert_eq!(seen["last_event"]["type"], "result");
    assert_eq!(seen["last_event"]["status"], "interrupted");
    assert_eq!(seen["sleeps_after_cancel"], "0");
}

/// The MCP Inspector's CLI (`@modelcontextprotocol/inspector` from npm;
/// scripts/test.sh installs it and names it in
/// `CONCLAVE_TEST_MCP_INSPECTOR`) lists the tools and the resource
/// templates of `/mcp` and says nothing about them on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_inspector_lists_the_tools_and_resources_without_warnings() {
    let inspector = std::env::var("CONCLAVE_TEST_MCP_INSPECTOR").expect(
        "CONCLAVE_TEST_MCP_INSPECTOR must name the MCP Inspector (scripts/test.sh installs it from npm)",
    );
    let server = TestServer::start_sandboxed(|c| c.sandbox.warm_pool = 0).await;
    let url = server.url("/mcp");
    let list = |method: &'static str| {
        let (inspector, url) = (inspector.clone(), url.clone());
        tokio::task::spawn_blocking(move || {
            let output = Command::new(&inspector)
                .args(["--cli", &url, "--transport", "http", "--method", method])
                .output()
                .expect("the inspector starts");
            let stderr = String::from_utf8_lossy(&output.stderr);
            // npm's own notices about its configuration are not the server's.
            let warnings: Vec<&str> = stderr
                .lines()
                .filter(|l| !l.trim().is_empty() && !l.starts_with("npm warn"))
                .collect();
            assert!(output.status.success(), "{method}: {stderr}");
            assert_eq!(warnings, Vec::<&str>::new(), "{method}");
            serde_json::from_slice::<Value>(&output.stdout).expect("JSON on stdout")
        })
    };
    let tools = list("tools/list").await.unwrap();
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    for wanted in ["run_agent", "deliberate", "start_pipeline", "execute_code"] {
        assert!(names.contains(&wanted), "{names:?}");
    }
    let templates = list("resources/templates/list").await.unwrap();
    let uris: Vec<&str> = templates["resourceTemplates"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["uriTemplate"].as_str())
        .collect();
    assert_eq!(
        uris,
        [
            "conclave://sessions/{session_id}",
            "conclave://sessions/{session_id}/events",
            "conclave://sessions/{session_id}/files/{path}"
        ]
    );
    server.stop_and_remove_sandboxes().await;
}
