//! `options.workspace.git`, as the real binary serves it on local and
//! docker sandboxes: the server clones from a git smart-HTTP server this
//! test runs on loopback (`git http-backend` behind basic auth, allowed by
//! `mcp.allowed_http_servers`), with the credential from a secret, before
//! the first turn's model call. The clone is in the workspace, logged as
//! `workspace_uploaded` with its source; the credential appears nowhere:
//! not in the events, the status, the server's log, the model's requests,
//! nor the workspace's `.git/config`. A URL the rules refuse, one with a
//! password in it, or a secret the key lacks is a 422; a clone that fails
//! ends the first turn with an error naming the URL and git's message.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "providers/upstream.rs"]
#[allow(dead_code)]
mod upstream;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use base64::Engine;
use common::binary::{
    drain_stderr, get_keyed, send_keyed as send, serve_command, spawn_server, stop,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use upstream::{Reply, Upstream, chunk_usage, content, delta, end, finish};

const TOKEN: &str = "glpat-Cl0neT0ken-9876";

fn git(dir: &Path, args: &[&str]) {
    let status = std::process::Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(["-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "git {args:?}");
}

/// A bare repository `repo.git` under `root` with two commits on `main`.
fn repository(root: &Path) {
    let work = root.join("work");
    std::fs::create_dir_all(work.join("src")).unwrap();
    git(&work, &["init", "-q"]);
    std::fs::write(work.join("README.md"), "# cloned project\n").unwrap();
    git(&work, &["add", "."]);
    git(&work, &["commit", "-q", "-m", "first"]);
    std::fs::write(work.join("src/main.py"), "print('hi')\n").unwrap();
    git(&work, &["add", "."]);
    git(&work, &["commit", "-q", "-m", "second"]);
    git(root, &["clone", "-q", "--bare", "work", "repo.git"]);
    // One past the test's 16 MB sandbox disk: 20 MB that do not compress.
    let big = root.join("big");
    std::fs::create_dir_all(&big).unwrap();
    git(&big, &["init", "-q"]);
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let noise: Vec<u8> = (0..20 << 20)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect();
    std::fs::write(big.join("blob.bin"), noise).unwrap();
    git(&big, &["add", "."]);
    git(&big, &["commit", "-q", "-m", "big"]);
    git(root, &["clone", "-q", "--bare", "big", "big.git"]);
}

/// `git http-backend` as CGI, behind basic auth with `x-access-token`.
async fn backend(
    State(root): State<PathBuf>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{TOKEN}"))
    );
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(expected.as_str()) {
        return Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header("www-authenticate", "Basic realm=\"git\"")
            .body(Body::empty())
            .unwrap();
    }
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let mut child = tokio::process::Command::new("git")
        .arg("http-backend")
        .env("GIT_PROJECT_ROOT", &root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", method.as_str())
        .env("PATH_INFO", uri.path())
        .env("QUERY_STRING", uri.query().unwrap_or_default())
        .env("CONTENT_TYPE", header("content-type"))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", header("content-encoding"))
        .env("GIT_PROTOCOL", header("git-protocol"))
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&body).await.unwrap();
    drop(stdin);
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut out)
        .await
        .unwrap();
    child.wait().await.unwrap();
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    let split = split.or_else(|| out.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)));
    let (at, gap) = split.expect("CGI headers");
    let mut response = Response::builder();
    for line in String::from_utf8_lossy(&out[..at]).lines() {
        let (name, value) = line.split_once(':').unwrap();
        if name.eq_ignore_ascii_case("status") {
            let code: u16 = value.trim()[..3].parse().unwrap();
            response = response.status(code);
        } else {
            response = response.header(name.trim(), value.trim());
        }
    }
    response.body(Body::from(out[at + gap..].to_vec())).unwrap()
}

async fn git_server(root: PathBuf) -> String {
    let app = axum::Router::new().fallback(backend).with_state(root);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

const KEY: &str = "clone-test-key-1";

async fn clone_from_a_private_repository(backend_args: &[&str]) {
    let root = tempfile::tempdir().unwrap();
    repository(root.path());
    let git_url = git_server(root.path().to_path_buf()).await;
    let repo = format!("{git_url}/repo.git");
    let bash = json!({"command": "cat README.md src/main.py"}).to_string();
    let upstream = Upstream::start(vec![
        Reply::sse(vec![
            delta(
                json!({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                          "function": {"name": "Bash", "arguments": bash}}]}),
            ),
            finish("tool_calls"),
            chunk_usage(10, 5),
            end(),
        ]),
        Reply::sse(vec![
            content("read it"),
            finish("stop"),
            chunk_usage(10, 5),
            end(),
        ]),
        Reply::sse(vec![
            content("ok"),
            finish("stop"),
            chunk_usage(10, 5),
            end(),
        ]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        r#"
api_keys = ["{KEY}"]
[secrets]
git_token = "{TOKEN}"
[mcp]
allowed_http_servers = ["127.0.0.1"]
[sandbox]
disk_mb = 16
[models.capable]
provider = "openai"
model = "capable-model"
base_url = "{}/v1"
"#,
        upstream.url
    );
    std::fs::write(dir.path().join("conclave.toml"), config).unwrap();
    let mut args = vec!["--config", "conclave.toml"];
    args.extend_from_slice(backend_args);
    let mut command = serve_command(&args);
    command.current_dir(dir.path()).env("RUST_LOG", "info");
    let (mut child, base) = spawn_server(&mut command).await;
    let log = drain_stderr(&mut child);
    let post = reqwest::Method::POST;
    let create = |git: Value| {
        send(
            KEY,
            post.clone(),
            format!("{base}/agent/session"),
            Some(json!({"model": "capable", "workspace": {"git": git}})),
        )
    };

    // A new session's first turn: its id, the NDJSON and its events.
    let first_turn = |git: Value, prompt: &'static str| {
        let base = base.clone();
        async move {
            let (status, body) = create(git).await;
            assert_eq!(status, 201, "{body}");
            let created: Value = serde_json::from_str(&body).unwrap();
            let id = created["session_id"].as_str().unwrap().to_string();
            let url = format!("{base}/agent/session/{id}/message");
            let (_, turn) = send(
                KEY,
                reqwest::Method::POST,
                url,
                Some(json!({"prompt": prompt})),
            )
            .await;
            let events: Vec<Value> = turn
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            (id, turn, events)
        }
    };

    // Refused before any session exists.
    for (git, field) in [
        (
            json!({"url": "http://10.255.255.1/repo.git"}),
            "workspace.git.url",
        ),
        (
            json!({"url": format!("http://user:pw@{}/repo.git", &git_url[7..])}),
            "workspace.git.url",
        ),
        (
            json!({"url": repo, "credential": "nope"}),
            "workspace.git.credential",
        ),
        (
            json!({"url": repo, "ref": "--upload-pack=x"}),
            "workspace.git.ref",
        ),
    ] {
        let (status, body) = create(git.clone()).await;
        assert_eq!(status, 422, "{git}: {body}");
        assert!(body.contains(field), "{git}: {body}");
    }

    // A clone that fails ends the first turn, naming the URL and what git
    // said; the model is never asked.
    let missing = format!("{git_url}/missing.git");
    let big = format!("{git_url}/big.git");
    for git in [
        json!({"url": missing, "credential": "git_token"}),
        json!({"url": repo}),
        json!({"url": big, "credential": "git_token"}),
    ] {
        let (_, turn, events) = first_turn(git.clone(), "go").await;
        let error = events
            .iter()
            .find(|e| e["type"] == "error")
            .unwrap_or_else(|| panic!("{turn}"));
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains(git["url"].as_str().unwrap()) && message.contains("git"),
            "{message}"
        );
        assert_eq!(events.last().unwrap()["status"], "error", "{turn}");
        if git["url"] == big.as_str() {
            assert!(message.contains("sandbox's disk"), "{message}");
        }
    }
    assert!(upstream.requests().is_empty());

    let (id, turn, events) = first_turn(
        json!({"url": repo, "credential": "git_token", "depth": 1, "ref": "main"}),
        "read the project",
    )
    .await;
    let uploaded = events
        .iter()
        .find(|e| e["type"] == "workspace_uploaded")
        .unwrap_or_else(|| panic!("{turn}"));
    assert_eq!(uploaded["source"], format!("{repo}@main"), "{uploaded}");
    assert_eq!(uploaded["path"], "/workspace");
    let result = events.iter().find(|e| e["type"] == "tool_result").unwrap();
    let stdout = result["output"]["stdout"].as_str().unwrap();
    assert!(
        stdout.contains("# cloned project") && stdout.contains("print('hi')"),
        "{result}"
    );
    assert_eq!(events.last().unwrap()["status"], "success", "{turn}");

    let (status, git_config) =
        get_keyed(KEY, format!("{base}/agent/session/{id}/files/.git/config")).await;
    assert_eq!(status, 200, "{git_config}");
    assert!(git_config.contains(&repo), "{git_config}");
    let (_, shallow) =
        get_keyed(KEY, format!("{base}/agent/session/{id}/files/.git/shallow")).await;
    assert_eq!(shallow.lines().count(), 1, "depth 1: {shallow}");
    // A commit for ref: the tree as it was then (the first commit has no
    // src/main.py).
    let first = std::process::Command::new("git")
        .args(["rev-parse", "main~1"])
        .current_dir(root.path().join("repo.git"))
        .output()
        .unwrap();
    let first = String::from_utf8(first.stdout).unwrap().trim().to_string();
    let (pinned, turn_at, _) = first_turn(
        json!({"url": repo, "credential": "git_token", "ref": first}),
        "look",
    )
    .await;
    assert!(turn_at.contains("workspace_uploaded"), "{turn_at}");
    let files = |path: &str| get_keyed(KEY, format!("{base}/agent/session/{pinned}/files/{path}"));
    assert_eq!(files("README.md").await.0, 200);
    assert_eq!(files("src/main.py").await.0, 404);

    let (_, log_events) = get_keyed(KEY, format!("{base}/agent/session/{id}/events")).await;
    let (_, status_body) = get_keyed(KEY, format!("{base}/agent/session/{id}/status")).await;
    let requests: Vec<String> = upstream
        .requests()
        .iter()
        .map(|r| r.body.to_string())
        .collect();
    stop(&mut child).await;
    let log = log.await.unwrap();
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{TOKEN}"));
    for (what, text) in [
        ("the turn", &turn),
        ("the event log", &log_events),
        ("the status", &status_body),
        ("the server's log", &log),
        (".git/config", &git_config),
    ]
    .into_iter()
    .chain(requests.iter().map(|r| ("a model request", r)))
    {
        assert!(
            !text.contains(TOKEN) && !text.contains(&basic),
            "{what} shows the credential: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_local_a_private_repository_is_cloned_into_the_workspace() {
    clone_from_a_private_repository(&["--sandbox", "local"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_docker_a_private_repository_is_cloned_into_the_workspace() {
    clone_from_a_private_repository(&[]).await;
}
