//! The browser dashboard over HTTP: its files served from the binary
//! (ETag, `304`, compression, a content security policy, no key needed for
//! files but a key for every datum) and WebSocket tickets. `browser.rs`
//! drives the views in a real Chromium.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::TestServer;
use serde_json::{Value, json};

const KEY_A: &str = "dashboard-key-a";
const KEY_B: &str = "dashboard-key-b";

async fn keyed() -> TestServer {
    TestServer::start_with(|c| c.api_keys = vec![KEY_A.into(), KEY_B.into()]).await
}

#[tokio::test]
async fn the_page_is_served_from_the_binary_with_etags_compression_and_a_strict_policy() {
    let server = keyed().await;
    // No key for the files: they hold no data.
    for path in ["/", "/ui/sessions", "/ui/pipelines/pipeline-x-12345678"] {
        let page = server.get(path).await;
        assert_eq!(page.status(), 200, "{path}");
        let headers = page.headers().clone();
        assert!(
            headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/html")
        );
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("script-src 'self'"), "{csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert_eq!(headers["cache-control"], "no-cache");
        let text = page.text().await.unwrap();
        assert!(text.contains("/static/"), "{text}");
    }
    let css = server.get("/static/app.css").await;
    assert_eq!(css.status(), 200);
    assert!(
        css.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/css")
    );
    let etag = css.headers()["etag"].to_str().unwrap().to_owned();
    let plain = css.bytes().await.unwrap().len();
    let again = server
        .http
        .get(server.url("/static/app.css"))
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 304);
    let gzipped = server
        .http
        .get(server.url("/static/app.css"))
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(gzipped.headers()["content-encoding"], "gzip");
    assert!(gzipped.bytes().await.unwrap().len() < plain);
    // Nothing outside static/, and no data without a key.
    for (path, status) in [
        ("/static/..%2FCargo.toml", 404),
        ("/static/..%2F..%2FCargo.toml", 404),
        ("/static/nothing.js", 404),
        ("/auth/me", 401),
        ("/agent/sessions", 401),
    ] {
        assert_eq!(server.get(path).await.status(), status, "{path}");
    }
    assert_eq!(
        me(&server, KEY_A).await,
        json!({"auth": true, "admin": false})
    );
    server.stop().await;
}

/// A server without keys tells a caller that sent one that it was
/// ignored, and says nothing to one that sent none.
#[tokio::test]
async fn a_keyless_server_says_a_key_sent_to_it_is_ignored() {
    let server = TestServer::start().await;
    let plain: Value = server.get("/auth/me").await.json().await.unwrap();
    assert_eq!(plain, json!({"auth": false, "admin": true}));
    let told = me(&server, KEY_A).await;
    assert_eq!(
        (&told["auth"], &told["admin"]),
        (&json!(false), &json!(true))
    );
    let note = told["note"].as_str().unwrap();
    assert!(
        note.contains("no API keys") && note.contains("ignored"),
        "{note}"
    );
    server.stop().await;
}

/// `GET /auth/me` as `key` sees it.
async fn me(server: &TestServer, key: &str) -> Value {
    server
        .send_as(key, reqwest::Method::GET, "/auth/me", None)
        .await
        .json()
        .await
        .unwrap()
}

async fn ticket(server: &TestServer, key: &str) -> reqwest::Response {
    server
        .send_as(key, reqwest::Method::POST, "/auth/ticket", Some(json!({})))
        .await
}

async fn ws_status(server: &TestServer, query: &str) -> Result<(), u16> {
    match tokio_tungstenite::connect_async(server.ws_url(&format!("/agent/ws?{query}"))).await {
        Ok(_) => Ok(()),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            Err(response.status().as_u16())
        }
        Err(e) => panic!("{e}"),
    }
}

/// A ticket opens one socket, once, as its key: not another key's
/// session, not twice, and never without a key to get it.
#[tokio::test]
async fn a_ticket_opens_one_socket_once_as_its_key() {
    let server = keyed().await;
    let created = server
        .send_as(
            KEY_B,
            reqwest::Method::POST,
            "/agent/session",
            Some(json!({"session_name": "b's"})),
        )
        .await;
    let bs: Value = created.json().await.unwrap();
    let session = bs["session_id"].as_str().unwrap();
    assert_eq!(
        server
            .post("/auth/ticket", json!({}))
            .await
            .status()
            .as_u16(),
        401
    );
    let bad = ticket(&server, KEY_A).await;
    assert_eq!(bad.status(), 200);
    let a: Value = bad.json().await.unwrap();
    assert_eq!(a["expires_in_s"], 30);
    let a = a["ticket"].as_str().unwrap();
    assert!(a.len() >= 64);
    // A's ticket does not open B's session, and is spent by trying.
    let query = format!("session_id={session}&ticket={a}");
    assert_eq!(ws_status(&server, &query).await, Err(404));
    assert_eq!(ws_status(&server, &query).await, Err(401));
    assert_eq!(
        ws_status(&server, &format!("session_id={session}&ticket=made-up")).await,
        Err(401)
    );
    // B's ticket opens B's session, once.
    let b: Value = ticket(&server, KEY_B).await.json().await.unwrap();
    let b = b["ticket"].as_str().unwrap();
    let url = server.ws_url(&format!(
        "/agent/ws?session_id={session}&since=0&ticket={b}"
    ));
    let events = common::ws_turn(&url, "hi").await;
    assert_eq!(events.last().unwrap()["status"], "success");
    assert!(matches!(
        tokio_tungstenite::connect_async(url.as_str()).await,
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) if r.status() == 401
    ));
    // A ticket is for the WebSocket routes only.
    let other: Value = ticket(&server, KEY_B).await.json().await.unwrap();
    let path = format!(
        "/agent/sessions?ticket={}",
        other["ticket"].as_str().unwrap()
    );
    assert_eq!(server.get(&path).await.status(), 401);
    // One key cannot hoard tickets.
    let mut statuses = Vec::new();
    for _ in 0..70 {
        statuses.push(ticket(&server, KEY_A).await.status().as_u16());
    }
    assert!(statuses[..60].iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(*statuses.last().unwrap(), 429);
    assert_eq!(ticket(&server, KEY_B).await.status(), 200);
    server.stop().await;
}

/// Without keys the page opens its sockets the same way.
#[tokio::test]
async fn a_page_without_keys_still_opens_sockets_with_tickets() {
    let server = TestServer::start().await;
    let id = server.create_session(json!({})).await;
    let t: Value = server
        .post("/auth/ticket", json!({}))
        .await
        .json()
        .await
        .unwrap();
    let url = server.ws_url(&format!(
        "/agent/ws?session_id={id}&since=0&ticket={}",
        t["ticket"].as_str().unwrap()
    ));
    let events = common::ws_turn(&url, "hi").await;
    assert!(events.iter().all(|e| e["session_id"] == id.as_str()));
    assert_eq!(events.last().unwrap()["status"], "success");
    server.stop().await;
}
