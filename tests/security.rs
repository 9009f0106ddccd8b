//! The server as an attacker meets it: one test (or more) per point of the
//! security review, each over real HTTP, WebSocket or MCP.
//!
//! - keys own their gateway traces; pool administration needs an admin key;
//! - URLs from requests connect only where the allow rules say, after DNS;
//! - a web page on another origin or host name cannot drive the server;
//! - an MCP session belongs to the key that opened it;
//! - sandbox limits have floors a caller cannot go under;
//! - connections cannot exhaust the server;
//! - smaller: the bearer scheme, list limits, name lengths, WebSocket frames.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::TestServer;
use common::sim::Sim;
use conclave::config::Config;
use conclave::gateway::{GatewayConfig, PoolConfig};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite;

const KEY_A: &str = "key-of-tenant-a";
const KEY_B: &str = "key-of-tenant-b";
const ADMIN: &str = "key-of-the-admin";

fn keyed(config: &mut Config) {
    config.api_keys = vec![KEY_A.into(), KEY_B.into()];
    config.admin_keys = vec![ADMIN.into()];
}

/// A request with a key, JSON body or none.
async fn call(
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
    key: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = server
        .http
        .request(method, server.url(path))
        .bearer_auth(key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("?")
}

// 1. The gateway respects keys.

#[tokio::test]
async fn traces_belong_to_their_key_and_pools_to_admins() {
    let sim = Sim::start("r0", &[]).await;
    let replica = sim.replica();
    let server = TestServer::start_with(|c| {
        keyed(c);
        c.gateway = GatewayConfig {
            pools: [(
                "m".to_string(),
                PoolConfig {
                    replicas: vec![replica],
                    ..PoolConfig::default()
                },
            )]
            .into(),
            ..GatewayConfig::default()
        };
    })
    .await;
    let ask =
        |secret: &str| json!({"model": "m", "messages": [{"role": "user", "content": secret}]});
    use reqwest::Method;
    for (key, secret) in [(KEY_A, "secret of a"), (KEY_B, "secret of b")] {
        let (status, _) = call(
            &server,
            Method::POST,
            "/v1/chat/completions",
            key,
            Some(ask(secret)),
        )
        .await;
        assert_eq!(status, 200);
    }
    // Each key reads only its own trace.
    for (key, secret) in [(KEY_A, "secret of a"), (KEY_B, "secret of b")] {
        let (status, body) = call(&server, Method::GET, "/gateway/traces", key, None).await;
        assert_eq!(status, 200);
        let traces = body["traces"].as_array().expect("traces");
        assert_eq!(traces.len(), 1, "{body}");
        assert_eq!(traces[0]["request"]["messages"][0]["content"], secret);
        assert!(
            traces[0].get("owner").is_none(),
            "key hashes are never shown"
        );
    }
    let (status, body) = call(
        &server,
        Method::GET,
        "/gateway/traces?all=true",
        KEY_A,
        None,
    )
    .await;
    assert_eq!((status, code(&body)), (403, "forbidden"));
    let (status, body) = call(
        &server,
        Method::GET,
        "/gateway/traces?all=true",
        ADMIN,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["traces"].as_array().map(Vec::len), Some(2));
    let (_, body) = call(&server, Method::GET, "/gateway/traces", ADMIN, None).await;
    assert_eq!(body["traces"].as_array().map(Vec::len), Some(0));

    // Administration is refused to a tenant key, whatever the route.
    let add = json!({"model": "m", "url": "http://8.8.8.8/v1", "id": "mine"});
    for (method, path, body) in [
        (Method::GET, "/gateway/replicas", None),
        (Method::POST, "/gateway/replicas", Some(add)),
        (Method::DELETE, "/gateway/replicas/r0", None),
        (Method::POST, "/gateway/replicas/r0/pause", None),
        (Method::POST, "/gateway/replicas/r0/drain", None),
        (Method::POST, "/gateway/replicas/r0/resume", None),
        (Method::DELETE, "/gateway/pools/m", None),
    ] {
        let (status, answer) = call(&server, method.clone(), path, KEY_A, body).await;
        assert_eq!(
            (status, code(&answer)),
            (403, "forbidden"),
            "{method} {path}: {answer}"
        );
    }
    let (status, body) = call(&server, Method::GET, "/gateway/replicas", ADMIN, None).await;
    assert_eq!(status, 200);
    assert_eq!(
        body["pools"][0]["replicas"][0]["state"], "active",
        "untouched: {body}"
    );
    let (status, body) = call(
        &server,
        Method::POST,
        "/gateway/replicas/r0/pause",
        ADMIN,
        None,
    )
    .await;
    assert_eq!((status, body["state"].as_str()), (200, Some("paused")));
    server.stop().await;
}

// 2. No server-side request forgery.

#[tokio::test]
async fn replica_and_mcp_urls_pass_the_allow_rules_after_dns() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // The list as an operator of a server on loopback may set it: public
    // addresses only (unset, loopback would pass there).
    let server =
        TestServer::start_with(|c| c.gateway.allowed_upstreams = Some(vec!["public".into()])).await;
    for url in [
        format!("http://127.0.0.1:{port}/v1"),
        format!("http://localhost:{port}/v1"),
        "http://169.254.169.254/latest/meta-data".to_string(),
        "http://10.0.0.1:8000/v1".to_string(),
        "http://[::ffff:192.168.1.1]/v1".to_string(),
        "http://[::1]:8000/v1".to_string(),
    ] {
        let response = server
            .post("/gateway/replicas", json!({"model": "m", "url": url}))
            .await;
        assert_eq!(response.status(), 422, "{url}");
        let body: Value = response.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("url: ") && message.contains("gateway.allowed_upstreams"),
            "{message}"
        );
    }
    // A name is judged by what it resolves to.
    let body: Value = server
        .post(
            "/gateway/replicas",
            json!({"model": "m", "url": format!("http://localhost:{port}/v1")}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("loopback"),
        "{body}"
    );
    let models: Value = server.get("/v1/models").await.json().await.unwrap();
    assert_eq!(models["data"], json!([]), "nothing was added");

    for url in [
        format!("http://127.0.0.1:{port}/mcp"),
        format!("http://localhost:{port}/mcp"),
        "http://169.254.169.254/mcp".to_string(),
    ] {
        let response = server
            .post(
                "/agent/session",
                json!({"options": {"mcp_servers": {"internal": {"url": url}}}}),
            )
            .await;
        assert_eq!(response.status(), 422);
        let body: Value = response.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("options.mcp_servers.internal.url: ")
                && message.contains("mcp.allowed_http_servers"),
            "{message}"
        );
    }
    let sessions: Value = server.get("/agent/sessions").await.json().await.unwrap();
    assert_eq!(sessions["sessions"], json!([]), "no session was made");
    server.stop().await;

    // An operator's entry lets one address through, and only it.
    let allowing = TestServer::start_with(|c| {
        c.gateway.allowed_upstreams = Some(vec!["127.0.0.1".into()]);
    })
    .await;
    let added = allowing
        .post(
            "/gateway/replicas",
            json!({"model": "m", "url": format!("http://127.0.0.1:{port}/v1")}),
        )
        .await;
    assert_eq!(added.status(), 201);
    let refused = allowing
        .post(
            "/gateway/replicas",
            json!({"model": "m", "url": "http://127.0.0.2:1/v1"}),
        )
        .await;
    assert_eq!(refused.status(), 422);
    allowing.stop().await;
}

// 3. A web page the user visits cannot drive the server.

#[tokio::test]
async fn cross_site_requests_are_refused_before_they_act() {
    let server = TestServer::start_with(|c| {
        c.allowed_origins = vec!["https://app.example.com".into()];
    })
    .await;
    let own_origin = format!("http://{}", server.addr);
    let prompt = r#"{"prompt": "$ touch /workspace/pwned"}"#;
    let send = |content_type: Option<&str>, origin: Option<&str>, host: Option<&str>| {
        let mut request = server.http.post(server.url("/agent/run")).body(prompt);
        if let Some(kind) = content_type {
            request = request.header("content-type", kind);
        }
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        if let Some(host) = host {
            request = request.header("host", host);
        }
        request.send()
    };
    // Bodies of the types a page sends without a preflight.
    for kind in [
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let response = send(kind, None, None).await.unwrap();
        assert_eq!(response.status(), 415, "{kind:?}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(code(&body), "unsupported_media_type");
    }
    // A form is how a run takes the user's files (docs/workspace.md): one
    // a browser marks as another site's is refused before it is read; a
    // JSON body sent as a form is no form, and runs nothing.
    let form = "multipart/form-data; boundary=x";
    let response = server
        .http
        .post(server.url("/agent/run"))
        .header("content-type", form)
        .header("sec-fetch-site", "cross-site")
        .body(prompt)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    let response = send(Some(form), Some("http://evil.example"), None)
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    let response = send(Some(form), None, None).await.unwrap();
    assert_eq!(response.status(), 400);
    // A page of another origin, even with a JSON body (after a preflight
    // the server never approves, or from a non-browser pretending).
    let response = send(Some("application/json"), Some("http://evil.example"), None)
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    let body: Value = response.json().await.unwrap();
    assert_eq!(code(&body), "origin_not_allowed");
    let response = send(Some("application/json"), Some("null"), None)
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    // DNS rebinding: the right address under another name.
    for path in ["/agent/sessions", "/health", "/gateway/traces"] {
        let response = server
            .http
            .get(server.url(path))
            .header("host", format!("rebound.example:{}", server.addr.port()))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 403, "{path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(code(&body), "host_not_allowed");
    }
    let sessions: Value = server.get("/agent/sessions").await.json().await.unwrap();
    assert_eq!(sessions["sessions"], json!([]), "nothing ran");

    // A bodiless state change from another origin (a form's POST).
    let id = server.create_session(json!({})).await;
    let response = server
        .http
        .post(server.url(&format!("/agent/session/{id}/interrupt")))
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    let response = server
        .http
        .delete(server.url(&format!("/agent/session/{id}")))
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    assert_eq!(
        server
            .get(&format!("/agent/session/{id}/status"))
            .await
            .status(),
        200
    );

    // The server's own pages and the configured origin act as before.
    for origin in [own_origin.as_str(), "https://app.example.com"] {
        let response = send(Some("application/json"), Some(origin), None)
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{origin}");
        let _ = response.text().await;
    }

    // WebSocket upgrades are checked too.
    let url = server.ws_url(&format!("/agent/ws?session_id={id}"));
    let mut request =
        tungstenite::client::IntoClientRequest::into_client_request(url.as_str()).unwrap();
    request
        .headers_mut()
        .insert("origin", "http://evil.example".parse().unwrap());
    match tokio_tungstenite::connect_async(request).await {
        Err(tungstenite::Error::Http(response)) => assert_eq!(response.status(), 403),
        other => panic!("expected a 403, got {:?}", other.map(|_| ())),
    }
    let mut request =
        tungstenite::client::IntoClientRequest::into_client_request(url.as_str()).unwrap();
    request
        .headers_mut()
        .insert("origin", own_origin.parse().unwrap());
    let (socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("same origin");
    drop(socket);
    server.stop().await;
}

// 4. An MCP session belongs to the key that opened it.

fn rpc(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

async fn mcp_post(
    server: &TestServer,
    key: &str,
    session: Option<&str>,
    body: Value,
) -> reqwest::Response {
    let mut request = server
        .http
        .post(server.url("/mcp"))
        .bearer_auth(key)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .json(&body);
    if let Some(id) = session {
        request = request.header("mcp-session-id", id);
    }
    request.send().await.expect("post")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_session_answers_only_the_key_that_opened_it() {
    let server = TestServer::start_sandboxed(|c| {
        keyed(c);
        c.sandbox.backend = conclave::config::SandboxBackendKind::Local;
        c.sandbox.warm_pool = 0;
    })
    .await;
    let init = rpc(
        1,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "tenant-a", "version": "1"}}),
    );
    let opened = mcp_post(&server, KEY_A, None, init).await;
    assert_eq!(opened.status(), 200);
    let session = opened
        .headers()
        .get("mcp-session-id")
        .expect("a session id")
        .to_str()
        .unwrap()
        .to_string();
    let _ = opened.text().await;
    let notified = mcp_post(
        &server,
        KEY_A,
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    assert_eq!(notified.status(), 202);

    // B presents A's session id: as if there were none.
    let steal = rpc(
        2,
        "tools/call",
        json!({"name": "execute_shell", "arguments": {"command": "touch /workspace/from-b"}}),
    );
    let refused = mcp_post(&server, KEY_B, Some(&session), steal).await;
    assert_eq!(refused.status(), 404);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(code(&body), "not_found");
    let closed = server
        .http
        .delete(server.url("/mcp"))
        .bearer_auth(KEY_B)
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(closed.status(), 404);

    // A's session is intact, and B's command never ran in its sandbox.
    let listing = mcp_post(
        &server,
        KEY_A,
        Some(&session),
        rpc(
            3,
            "tools/call",
            json!({"name": "execute_shell", "arguments": {"command": "ls /workspace; echo done"}}),
        ),
    )
    .await;
    assert_eq!(listing.status(), 200);
    let text = listing.text().await.unwrap();
    assert!(text.contains("done") && !text.contains("from-b"), "{text}");
    let closed = server
        .http
        .delete(server.url("/mcp"))
        .bearer_auth(KEY_A)
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    // 204, which the official SDKs take as a clean close (rmcp says 202).
    assert_eq!(closed.status(), 204);
    server.stop().await;
}

// 5. Resource limits cannot be switched off by the caller.

#[tokio::test]
async fn sandbox_limits_below_the_floor_are_refused_naming_the_field() {
    let server = TestServer::start_sandboxed(|c| {
        c.sandbox.backend = conclave::config::SandboxBackendKind::Local;
        c.sandbox.warm_pool = 0;
    })
    .await;
    for (sandbox, field) in [
        (json!({"cpus": 1e-9}), "options.sandbox.cpus"),
        (json!({"cpus": 0.001}), "options.sandbox.cpus"),
        (json!({"cpus": 0}), "options.sandbox.cpus"),
        (json!({"cpus": 1000}), "options.sandbox.cpus"),
        (json!({"memory_mb": 1}), "options.sandbox.memory_mb"),
        (json!({"memory_mb": 1_000_000}), "options.sandbox.memory_mb"),
        (json!({"timeout_s": 0}), "options.sandbox.timeout_s"),
        (json!({"network": true}), "options.sandbox.network"),
        // No ceiling (sandbox.network.allow) is configured: any name is wider.
        (
            json!({"network": {"allow": ["pypi.org"]}}),
            "options.sandbox.network.allow[0]",
        ),
        (json!({"network": {"deny": []}}), "options.sandbox.network"),
    ] {
        let response = server
            .post("/agent/session", json!({"options": {"sandbox": sandbox}}))
            .await;
        assert_eq!(response.status(), 422, "{sandbox}");
        let body: Value = response.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(&format!("{field}: ")), "{message}");
    }
    server.stop().await;
}

// 6. Connections cannot exhaust the server.

/// A TCP connection from `source` (an address of 127.0.0.0/8), so one
/// test can play several clients.
async fn connect_from(source: &str, server: std::net::SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(server).await.expect("connect")
}

/// One request on its own connection; the answer's status and body.
async fn raw_get(source: &str, server: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = connect_from(source, server).await;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.ok()?;
    let status = answer.split(' ').nth(1)?.parse().ok()?;
    Some((status, answer))
}

/// Waits (bounded) until the server closes `stream`.
async fn closed_by_server(stream: &mut tokio::net::TcpStream) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(Duration::from_secs(20), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test]
async fn idle_connections_are_capped_per_client_and_health_still_answers() {
    let server = TestServer::start_with(|c| {
        c.http.max_connections = 12;
        c.http.max_connections_per_client = 6;
        c.http.header_timeout_s = 2;
    })
    .await;
    // One client holds every connection it may, sending half a request.
    let mut held = Vec::new();
    for _ in 0..30 {
        let mut stream = connect_from("127.0.0.2", server.addr).await;
        let _ = stream
            .write_all(b"GET /agent/sessions HTTP/1.1\r\nHo")
            .await;
        held.push(stream);
    }
    // Its next connection is an overflow one, or closed at once: /health
    // answers there when it gets one, nothing else does.
    if let Some((status, answer)) = raw_get("127.0.0.2", server.addr, "/agent/sessions").await {
        assert_eq!(status, 503, "{answer}");
        assert!(answer.contains("server_busy"), "{answer}");
    }
    // Everyone else is served.
    let (status, _) = raw_get("127.0.0.3", server.addr, "/health")
        .await
        .expect("health");
    assert_eq!(status, 200);
    let (status, _) = raw_get("127.0.0.1", server.addr, "/agent/sessions")
        .await
        .expect("served");
    assert_eq!(status, 200);
    // The half requests are dropped at the header deadline.
    for stream in held.iter_mut().take(6) {
        assert!(
            closed_by_server(stream).await,
            "a slow header was not cut off"
        );
    }
    drop(held);
    server.stop().await;
}

/// The listener reads the protocol (HTTP/1.1 or HTTP/2) from the first
/// bytes: a connection that sends none is closed at the header deadline
/// too (HTTP/2 clients are served: tests/bus_grpc.rs).
#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_at_the_header_deadline() {
    let server = TestServer::start_with(|c| c.http.header_timeout_s = 1).await;
    let mut silent = connect_from("127.0.0.4", server.addr).await;
    assert!(
        closed_by_server(&mut silent).await,
        "a silent connection was kept"
    );
    let (status, _) = raw_get("127.0.0.4", server.addr, "/health")
        .await
        .expect("health");
    assert_eq!(status, 200);
    server.stop().await;
}

#[tokio::test]
async fn a_body_that_stalls_is_answered_408_and_the_connection_closed() {
    let server = TestServer::start_with(|c| {
        keyed(c);
        c.http.body_timeout_s = 1;
    })
    .await;
    let mut stream = connect_from("127.0.0.1", server.addr).await;
    let head = format!(
        "POST /agent/session HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY_A}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"options\""
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the connection was not closed");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");
    server.stop().await;
}

#[tokio::test]
async fn the_real_binary_lifts_its_open_file_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_conclave"))
        .current_dir(dir.path())
        .args(["serve", "--listen", "127.0.0.1:0", "--sandbox", "local"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stdout);
    let mut first = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut lines, &mut first)
        .await
        .unwrap();
    assert!(first.starts_with("conclave listening on"), "{first}");
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id().unwrap())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        fields[3], fields[4],
        "soft limit raised to the hard one: {line}"
    );
    child.kill().await.unwrap();
}

// 9. Smaller points.

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let server = TestServer::start_with(keyed).await;
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let response = server
            .http
            .get(server.url("/agent/sessions"))
            .header("authorization", format!("{scheme} {KEY_A}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{scheme}");
    }
    let response = server
        .http
        .get(server.url("/agent/sessions"))
        .header("authorization", format!("Basic {KEY_A}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    server.stop().await;
}

#[tokio::test]
async fn list_limits_and_names_are_bounded() {
    let server = TestServer::start_with(|c| {
        c.gateway.allowed_upstreams = Some(vec!["127.0.0.1".into()]);
    })
    .await;
    for query in ["limit=-1", "limit=0", "limit=10001"] {
        let response = server.get(&format!("/agent/sessions?{query}")).await;
        assert_eq!(response.status(), 422, "{query}");
        let body: Value = response.json().await.unwrap();
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("limit: ")
        );
    }
    let response = server.get("/agent/sessions?limit=abc").await;
    assert_eq!(response.status(), 400);
    let response = server.get("/agent/sessions?limt=1").await;
    assert_eq!(response.status(), 400);
    for id in 0..3 {
        server
            .create_session(json!({"session_name": format!("s{id}")}))
            .await;
    }
    let two: Value = server
        .get("/agent/sessions?limit=2")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(two["sessions"].as_array().map(Vec::len), Some(2));

    let long = "m".repeat(100_000);
    let response = server
        .post(
            "/gateway/replicas",
            json!({"model": long, "url": "http://127.0.0.1:1/v1"}),
        )
        .await;
    assert_eq!(response.status(), 422);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("model: ")
    );
    server.stop().await;
}

#[tokio::test]
async fn websocket_binary_and_oversized_frames_are_answered() {
    let server = TestServer::start().await;
    let id = server.create_session(json!({})).await;
    let (mut socket, _) =
        tokio_tungstenite::connect_async(server.ws_url(&format!("/agent/ws?session_id={id}")))
            .await
            .unwrap();
    socket
        .send(tungstenite::Message::Binary(vec![1, 2, 3].into()))
        .await
        .unwrap();
    let reply = socket.next().await.unwrap().unwrap();
    let reply: Value = serde_json::from_str(reply.to_text().unwrap()).unwrap();
    assert_eq!(reply["code"], "bad_frame", "{reply}");
    // Still open: a message still works.
    socket
        .send(tungstenite::Message::Text(
            json!({"type": "message", "prompt": "hi"})
                .to_string()
                .into(),
        ))
        .await
        .unwrap();
    loop {
        let frame = socket.next().await.unwrap().unwrap();
        let event: Value = serde_json::from_str(frame.to_text().unwrap()).unwrap();
        if event["type"] == "result" {
            break;
        }
    }
    let big = "x".repeat(2 * 1024 * 1024);
    let _ = socket.send(tungstenite::Message::Text(big.into())).await;
    let mut said_why = false;
    let mut close_code = None;
    while let Some(frame) = socket.next().await {
        match frame {
            Ok(tungstenite::Message::Text(text)) => {
                let reply: Value = serde_json::from_str(&text).unwrap();
                said_why |= reply["code"] == "bad_frame";
            }
            Ok(tungstenite::Message::Close(frame)) => {
                close_code = frame.map(|f| u16::from(f.code));
                break;
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    assert!(said_why, "no bad_frame reply before the close");
    assert_eq!(close_code, Some(1009));
    server.stop().await;
}

// 8. Network off unless the operator allows it, and then the internet only.

/// Tries each `host:port` from inside the session's sandbox; the errno of
/// each connect (0: connected, 111: refused by the firewall's REJECT).
async fn connects_from_sandbox(server: &TestServer, targets: &[String]) -> Vec<i64> {
    let id = server
        .create_session(json!({"options": {"sandbox": {"network": true}}}))
        .await;
    let command = format!(
        "$ python3 -c \"import socket,sys;[print((lambda s:(s.settimeout(5),s.connect_ex((a.rsplit(':',1)[0],int(a.rsplit(':',1)[1]))))[1])(socket.socket())) for a in sys.argv[1:]]\" {}",
        targets.join(" ")
    );
    let events = server.turn(&id, &command).await;
    let result = events
        .iter()
        .find(|e| e["type"] == "tool_result")
        .unwrap_or_else(|| panic!("no tool result: {events:?}"));
    let stdout = result["output"]["stdout"].as_str().unwrap_or_default();
    let codes: Vec<i64> = stdout
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert_eq!(codes.len(), targets.len(), "{result}");
    let deleted = server
        .http
        .delete(server.url(&format!("/agent/session/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    codes
}

/// This host's first non-loopback IPv4 address.
fn host_address() -> String {
    let out = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .expect("hostname -I");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find(|a| {
            a.parse::<std::net::Ipv4Addr>()
                .is_ok_and(|ip| !ip.is_loopback())
        })
        .expect("a non-loopback address")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_given_network_reach_neither_their_host_nor_private_ranges() {
    use conclave::config::SandboxBackendKind::{Docker, Local};
    // A host service on every interface, as the review's attack used.
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let _ = socket.write_all(b"host service\n").await;
        }
    });
    let host = format!("{}:{port}", host_address());
    // The servers share one firewall chain (the last to start writes it):
    // one backend after the other, the allowing server first, so the
    // default rules are what stays.
    for backend in [Docker, Local] {
        // A container's 127.0.0.1 is its own, and so is a local sandbox's
        // (a network namespace per exec): the host is reached at its
        // address only.
        let targets: Vec<String> = vec![host.clone()];
        let allowing = TestServer::start_sandboxed(|c| {
            c.sandbox.backend = backend;
            c.sandbox.warm_pool = 0;
            c.sandbox.allow_network = true;
            c.sandbox.network_allow = vec![host_address(), "127.0.0.1".into()];
        })
        .await;
        let codes = connects_from_sandbox(&allowing, &targets).await;
        assert!(
            codes.iter().all(|c| *c == 0),
            "{backend:?} allowed: {codes:?}"
        );
        allowing.stop_and_remove_sandboxes().await;

        let server = TestServer::start_sandboxed(|c| {
            c.sandbox.backend = backend;
            c.sandbox.warm_pool = 0;
            c.sandbox.allow_network = true;
        })
        .await;
        let codes = connects_from_sandbox(&server, &targets).await;
        assert!(
            codes.iter().all(|c| *c == 111),
            "{backend:?}: the host answered a sandbox ({codes:?} for {targets:?})"
        );
        server.stop_and_remove_sandboxes().await;
    }
    let rules = std::process::Command::new("iptables")
        .args(["-S", "CONCLAVE-SANDBOX"])
        .output()
        .expect("iptables");
    let rules = String::from_utf8_lossy(&rules.stdout);
    for range in [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",
        "203.0.113.0/24",
    ] {
        assert!(
            rules.contains(&format!("-d {range} -j REJECT")),
            "{range} is not rejected: {rules}"
        );
    }
}

// 5 (applied) and 7, through the API on both backends.

/// Runs `$ command` in a new session with `options` and returns stdout.
async fn shell_in_session(server: &TestServer, options: Value, command: &str) -> (String, String) {
    let id = server.create_session(json!({"options": options})).await;
    let events = server.turn(&id, &format!("$ {command}")).await;
    let result = events
        .iter()
        .find(|e| e["type"] == "tool_result")
        .unwrap_or_else(|| panic!("no tool result: {events:?}"));
    (
        id,
        result["output"]["stdout"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_hold_and_nothing_a_call_starts_outlives_it() {
    use conclave::config::SandboxBackendKind::{Docker, Local};
    for backend in [Docker, Local] {
        let server = TestServer::start_sandboxed(|c| {
            c.sandbox.backend = backend;
            c.sandbox.warm_pool = 0;
        })
        .await;
        let (_, limits) = shell_in_session(
            &server,
            json!({"sandbox": {"cpus": 0.25, "memory_mb": 96}}),
            "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/memory/memory.limit_in_bytes",
        )
        .await;
        assert_eq!(
            limits,
            format!("25000\n{}\n", 96 * 1024 * 1024),
            "{backend:?}"
        );

        let (id, started) = shell_in_session(
            &server,
            json!({}),
            "sleep 310 & setsid sleep 311 & nohup sleep 312 >/dev/null 2>&1 & echo started",
        )
        .await;
        assert_eq!(started, "started\n");
        let events = server
            .turn(&id, "$ cat /sys/fs/cgroup/pids/pids.current; ps -eo args | grep -c '[s]leep 31[012]' || true")
            .await;
        let stdout = events
            .iter()
            .find(|e| e["type"] == "tool_result")
            .and_then(|e| e["output"]["stdout"].as_str())
            .unwrap_or_default()
            .to_string();
        let counts: Vec<&str> = stdout.lines().collect();
        assert_eq!(counts.get(1), Some(&"0"), "{backend:?}: {stdout}");
        // The sandbox's processes are this call's alone: its shell, ps,
        // grep and the helper or init around them; three sleeps would
        // push the count past that.
        let pids: u32 = counts[0].parse().unwrap();
        assert!(
            pids <= 7,
            "{backend:?}: {pids} processes in the sandbox: {stdout}"
        );
        server.stop_and_remove_sandboxes().await;
    }
}
