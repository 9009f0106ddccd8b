//! A sandbox's network allow-list (`options.sandbox.network: {allow:
//! [...]}`), as the real binary serves it on docker and on local
//! sandboxes: the sandbox reaches nothing but the server's egress proxy.
//!
//! The test runs a package index on loopback and pins its names to it in
//! the proxy's resolver (`sandbox.network.hosts`), with the ceiling
//! (`sandbox.network.allow`) naming loopback. `pip install` of a wheel
//! from that index succeeds (the index on one name, the wheel on a name
//! under a wildcard); a name off the session's list, a listed name pinned
//! to a private address the ceiling does not name, and a direct connection
//! that skips the proxy all fail, the first two reported as `status`
//! events and counted in `/metrics`. A session's list wider than the
//! ceiling is a 422 naming the entry.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "providers/upstream.rs"]
#[allow(dead_code)]
mod upstream;

use std::path::{Path, PathBuf};

use common::binary::{
    get_keyed, keyed_turn, send_keyed as send, serve_command, spawn_server, stop, tool_results,
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use upstream::{Reply, Upstream, says, tool_call};

const KEY: &str = "egress-key-0001";

fn bash(id: &str, command: &str) -> Reply {
    tool_call(id, "Bash", json!({"command": command, "timeout": 120000}))
}

/// A wheel of package `demo`, made with Python's zipfile.
fn make_wheel(dir: &Path) -> PathBuf {
    let wheel = dir.join("demo-1.0-py3-none-any.whl");
    let script = r#"
import sys, zipfile
files = {
    "demo/__init__.py": "VALUE = 'from-the-local-index'\n",
    "demo-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
    "demo-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: conclave-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = "".join(f"{name},,\n" for name in files) + "demo-1.0.dist-info/RECORD,,\n"
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for name, text in files.items():
        z.writestr(name, text)
    z.writestr("demo-1.0.dist-info/RECORD", record)
"#;
    let status = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&wheel)
        .status()
        .expect("python3 makes the wheel");
    assert!(status.success());
    wheel
}

/// A PEP 503 index on loopback: `/simple/demo/` links the wheel at
/// `http://files.pythonhosted.test:PORT/`; every request path is recorded.
async fn serve_index(wheel: PathBuf) -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (seen_tx, seen) = tokio::sync::mpsc::unbounded_channel();
    let wheel_bytes = std::fs::read(&wheel).unwrap();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let (seen_tx, wheel_bytes) = (seen_tx.clone(), wheel_bytes.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buffer = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                let _ = seen_tx.send(head.lines().take(2).collect::<Vec<_>>().join(" | "));
                let (status, kind, body) = if path.starts_with("/simple/demo") {
                    let page = format!(
                        "<html><body><a href=\"http://files.pythonhosted.test:{port}/files/demo-1.0-py3-none-any.whl\">demo-1.0-py3-none-any.whl</a></body></html>"
                    );
                    ("200 OK", "text/html", page.into_bytes())
                } else if path.ends_with(".whl") {
                    ("200 OK", "application/octet-stream", wheel_bytes)
                } else {
                    ("404 Not Found", "text/plain", b"not here".to_vec())
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
                let _ = socket.write_all(&body).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (port, seen)
}

fn config(upstream: &Upstream) -> String {
    format!(
        r#"
[keys.egress]
key = "{KEY}"

[sandbox.network]
allow = ["pypi.test", "*.pythonhosted.test", "inner.test", "127.0.0.1"]

[sandbox.network.hosts]
"pypi.test" = "127.0.0.1"
"files.pythonhosted.test" = "127.0.0.1"
"inner.test" = "10.255.0.1"

[models.capable]
provider = "openai"
model = "capable-model"
base_url = "{}/v1"
"#,
        upstream.url
    )
}

async fn only_the_allowed_names_are_reached(backend: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let wheel = make_wheel(dir.path());
    let (port, mut seen) = serve_index(wheel).await;
    let pip = format!(
        "python3 -m pip install --no-cache-dir --disable-pip-version-check --target /workspace/lib \
         --index-url http://pypi.test:{port}/simple/ --trusted-host pypi.test \
         --trusted-host files.pythonhosted.test demo \
         && python3 -c 'import sys; sys.path.insert(0, \"/workspace/lib\"); import demo; print(demo.VALUE)'"
    );
    let fetch = |url: &str| {
        format!(
            "python3 -c 'import urllib.request; print(urllib.request.urlopen(\"{url}\", timeout=20).read())'"
        )
    };
    let upstream = Upstream::start(vec![
        bash("c1", &pip),
        bash("c2", &fetch("http://evil.test/")),
        bash("c3", &fetch("http://inner.test/")),
        // Straight out, skipping the proxy: the internet, then the host's
        // loopback where the index listens.
        bash(
            "c4",
            &format!(
                "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), timeout=5)'; \
                 python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=5)'"
            ),
        ),
        says("done"),
    ])
    .await;
    std::fs::write(dir.path().join("conclave.toml"), config(&upstream)).unwrap();
    let mut args = vec!["--config", "conclave.toml"];
    args.extend_from_slice(backend);
    let mut command = serve_command(&args);
    command.current_dir(dir.path());
    let (mut child, base) = spawn_server(&mut command).await;
    let post = reqwest::Method::POST;

    // Wider than the ceiling, or not an entry at all: 422s naming it.
    for (allow, field) in [
        (
            json!(["pypi.test", "github.com"]),
            "sandbox.network.allow[1]",
        ),
        (json!(["*.test"]), "sandbox.network.allow[0]"),
        (json!(["10.0.0.0/8"]), "sandbox.network.allow[0]"),
        (json!(["http://pypi.test/"]), "sandbox.network.allow[0]"),
    ] {
        let (status, body) = send(
            KEY,
            post.clone(),
            format!("{base}/agent/session"),
            Some(json!({"model": "capable", "sandbox": {"network": {"allow": allow}}})),
        )
        .await;
        assert_eq!(status, 422, "{allow}: {body}");
        assert!(body.contains(field), "{allow}: {body}");
    }

    let allow = json!(["pypi.test", "files.pythonhosted.test", "inner.test"]);
    let create = json!({"model": "capable", "max_turns": 10,
                        "sandbox": {"network": {"allow": allow}}});
    let (id, turn, events) = keyed_turn(KEY, &base, create, "install demo").await;
    let results = tool_results(&events);
    assert_eq!(results.len(), 4, "{turn}");
    assert!(
        results[0].contains("from-the-local-index"),
        "pip install: {}",
        results[0]
    );
    assert!(results[1].contains("403"), "{}", results[1]);
    assert!(results[2].contains("403"), "{}", results[2]);
    assert!(
        results[3].contains("Network is unreachable") && results[3].contains("Connection refused"),
        "{}",
        results[3]
    );
    let statuses: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "status")
        .filter_map(|e| e["message"].as_str())
        .filter(|m| m.contains("egress proxy"))
        .collect();
    assert_eq!(statuses.len(), 2, "{statuses:?}");
    assert!(
        statuses[0].contains("evil.test is not on this session's allow-list"),
        "{statuses:?}"
    );
    assert!(
        statuses[1].contains("10.255.0.1, a private address"),
        "{statuses:?}"
    );
    // The index saw the index page and the wheel, each through the proxy
    // (origin-form requests), and nothing of the refused ones.
    let mut requests = Vec::new();
    while let Ok(request) = seen.try_recv() {
        requests.push(request);
    }
    assert!(
        requests.iter().any(|r| r.starts_with("GET /simple/demo/")),
        "{requests:?}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("GET /files/demo-1.0-py3-none-any.whl")),
        "{requests:?}"
    );
    assert!(
        requests.iter().all(|r| !r.contains("evil.test")),
        "{requests:?}"
    );
    // The log keeps the refusals; /metrics counts them.
    let (_, log) = get_keyed(KEY, format!("{base}/agent/session/{id}/events")).await;
    assert!(log.contains("evil.test is not on"), "{log}");
    let (_, metrics) = get_keyed(KEY, format!("{base}/metrics")).await;
    let refused = metrics
        .lines()
        .find(|l| l.starts_with("conclave_sandbox_egress_connections") && l.contains("refused"))
        .unwrap_or_else(|| panic!("no refusal count: {metrics}"));
    assert!(refused.ends_with(" 2"), "{refused}");
    stop(&mut child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_docker_a_sandbox_reaches_only_its_allow_list() {
    only_the_allowed_names_are_reached(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_local_a_sandbox_reaches_only_its_allow_list() {
    only_the_allowed_names_are_reached(&["--sandbox", "local"]).await;
}
