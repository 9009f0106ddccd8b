//! The bus over HTTP and the WebSocket against a real server: publish and
//! subscribe (NDJSON and SSE), replay after a restart, the KV with
//! compare-and-set, wait and watch, bad input, and tenant isolation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Lines, TestServer};
use futures::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

const KEY_A: &str = "tenant-a-key-1";
const KEY_B: &str = "tenant-b-key-2";

async fn next(lines: &mut Lines) -> Value {
    tokio::time::timeout(Duration::from_secs(10), lines.next())
        .await
        .expect("a line within 10 s")
        .expect("the stream goes on")
}

/// The next text frame of a WebSocket, within 10 s.
async fn ws_text<S>(ws: &mut S) -> String
where
    S: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
        Ok(Some(Ok(Message::Text(text)))) => text.to_string(),
        other => panic!("expected a text frame within 10 s: {other:?}"),
    }
}

async fn subscribe(server: &TestServer, key: Option<&str>, query: &str) -> Lines {
    let mut request = server
        .http
        .get(server.url(&format!("/bus/subscribe?{query}")));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    Lines::new(response)
}

async fn publish(server: &TestServer, subject: &str, data: Value) -> Value {
    let response = server.post(&format!("/bus/publish/{subject}"), data).await;
    assert_eq!(response.status(), 202);
    response.json().await.unwrap()
}

#[tokio::test]
async fn publish_and_subscribe_over_http_with_replay_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_in(dir.path(), |_| {}).await;
    let mut live = subscribe(&server, None, "subjects=inference/results/*,sync.>").await;
    let first = publish(&server, "inference/results/shared", json!({"i": 1})).await;
    assert_eq!(
        first,
        json!({"subject": "inference/results/shared", "seq": 1})
    );
    publish(&server, "sync/weights_ready", json!({"version": 3})).await;
    publish(&server, "inference.results.shared", json!({"i": 2})).await;
    publish(&server, "elsewhere", json!("not for this subscriber")).await;
    let got: Vec<Value> = [
        next(&mut live).await,
        next(&mut live).await,
        next(&mut live).await,
    ]
    .into();
    let seen: Vec<(&str, u64, &Value)> = got
        .iter()
        .map(|m| {
            (
                m["subject"].as_str().unwrap(),
                m["seq"].as_u64().unwrap(),
                &m["data"],
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("inference/results/shared", 1, &json!({"i": 1})),
            ("sync/weights_ready", 1, &json!({"version": 3})),
            ("inference.results.shared", 2, &json!({"i": 2})),
        ]
    );
    assert_eq!(got[0]["type"], "message");
    assert!(got[0]["time"].is_string());
    drop(live);
    server.stop().await;

    // Durable subjects come back after a restart, from a seq or a time.
    let server = TestServer::start_in(dir.path(), |_| {}).await;
    let mut replay = subscribe(&server, None, "subjects=inference.>&since=1").await;
    assert_eq!(next(&mut replay).await["data"], json!({"i": 2}));
    let time = urlencode(&got[1]["time"]);
    let mut by_time = subscribe(
        &server,
        None,
        &format!("subjects=sync.*,inference.>&since={time}"),
    )
    .await;
    assert_eq!(next(&mut by_time).await["data"], json!({"version": 3}));
    assert_eq!(next(&mut by_time).await["data"], json!({"i": 2}));
    assert_eq!(
        publish(&server, "inference/results/shared", json!(3)).await["seq"],
        3
    );
    assert_eq!(next(&mut replay).await["seq"], 3);
    assert_eq!(next(&mut by_time).await["seq"], 3);

    // SSE: the type is the event name, the seq its id.
    let response = server
        .http
        .get(server.url("/bus/subscribe?subjects=inference.>&since=all"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut body = response.bytes_stream();
    let mut text = String::new();
    while !text.contains("id: 3") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), body.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(text.contains("event: message"), "{text}");
    assert!(text.contains("id: 1") && text.contains("id: 2"), "{text}");
    drop((replay, by_time, body));
    server.stop().await;
}

fn urlencode(time: &Value) -> String {
    time.as_str()
        .unwrap()
        .replace(':', "%3A")
        .replace('+', "%2B")
}

#[tokio::test]
async fn bad_subjects_payloads_and_keys_get_json_errors() {
    let server = TestServer::start_with(|c| c.bus.max_payload_bytes = 64).await;
    let cases = [
        (
            Method::POST,
            "/bus/publish/a..b",
            Some(json!(1)),
            400,
            "bad_subject",
        ),
        (
            Method::POST,
            "/bus/publish/a.*",
            Some(json!(1)),
            400,
            "bad_subject",
        ),
        (
            Method::POST,
            "/bus/publish/big",
            Some(json!("x".repeat(100))),
            413,
            "payload_too_large",
        ),
        (
            Method::GET,
            "/bus/subscribe?subjects=a.>.b",
            None,
            400,
            "bad_subject",
        ),
        (
            Method::GET,
            "/bus/subscribe?subjects=a&since=yesterday",
            None,
            422,
            "invalid_request",
        ),
        (Method::GET, "/bus/subscribe", None, 400, "bad_request"),
        (Method::GET, "/kv/missing", None, 404, "not_found"),
        (Method::GET, "/kv/missing?wait=0.05", None, 404, "not_found"),
        (Method::GET, "/kv/k?wait=9999", None, 422, "invalid_request"),
        (Method::DELETE, "/kv/missing", None, 404, "not_found"),
        (
            Method::PUT,
            "/kv/k",
            Some(json!("x".repeat(100))),
            413,
            "payload_too_large",
        ),
    ];
    for (method, path, body, status, code) in cases {
        let mut request = server.http.request(method.clone(), server.url(path));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), status, "{method} {path}");
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["code"], code, "{method} {path}: {error}");
        assert!(error["error"]["message"].as_str().unwrap().len() > 5);
    }
    // A body that is not JSON is refused, and nothing is published.
    let response = server
        .http
        .post(server.url("/bus/publish/a"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(publish(&server, "a", json!(1)).await["seq"], 1);
    server.stop().await;
}

#[tokio::test]
async fn kv_compare_and_set_wait_and_watch() {
    let server = TestServer::start().await;
    let put = |path: &str, body: Value| server.send_as("unused", Method::PUT, path, Some(body));
    let first = put(
        "/kv/inference_response_topic?if_revision=0",
        json!("results.a"),
    )
    .await;
    assert_eq!(first.status(), 200);
    let revision = first.json::<Value>().await.unwrap()["revision"]
        .as_u64()
        .unwrap();
    let again = put(
        "/kv/inference_response_topic?if_revision=0",
        json!("results.b"),
    )
    .await;
    assert_eq!(again.status(), 409);
    let error: Value = again.json().await.unwrap();
    assert_eq!(error["error"]["code"], "revision_mismatch");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("revision {revision}"))
    );
    let entry: Value = server
        .get("/kv/inference_response_topic")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (entry["value"].clone(), entry["revision"].as_u64()),
        (json!("results.a"), Some(revision))
    );

    // A wait for a key nobody has written ends when it is written.
    let waiter = {
        let request = server.http.get(server.url("/kv/later/key?wait=10"));
        tokio::spawn(async move { request.send().await.unwrap() })
    };
    let mut watch = Lines::new(server.get("/kv?prefix=later/&watch=true").await);
    assert_eq!(
        put("/kv/later/key", json!({"ready": true})).await.status(),
        200
    );
    let waited = waiter.await.unwrap();
    assert_eq!(waited.status(), 200);
    assert_eq!(
        waited.json::<Value>().await.unwrap()["value"],
        json!({"ready": true})
    );
    let change = next(&mut watch).await;
    assert_eq!(
        (change["type"].as_str(), change["key"].as_str()),
        (Some("put"), Some("later/key"))
    );
    // A wait past a revision ends with the next write.
    let rev = change["revision"].as_u64().unwrap();
    let waiter = {
        let request = server
            .http
            .get(server.url(&format!("/kv/later/key?wait=10&after={rev}")));
        tokio::spawn(async move { request.send().await.unwrap() })
    };
    let put_at =
        |path: String, body: Value| server.send_as("unused", Method::PUT, &path, Some(body));
    assert_eq!(
        put_at(format!("/kv/later/key?if_revision={rev}"), json!(2))
            .await
            .status(),
        200
    );
    assert_eq!(
        waiter.await.unwrap().json::<Value>().await.unwrap()["value"],
        json!(2)
    );
    let delete = server
        .http
        .delete(server.url("/kv/later/key"))
        .send()
        .await
        .unwrap();
    assert_eq!(delete.status(), 200);
    assert_eq!(next(&mut watch).await["value"], json!(2));
    let deleted = next(&mut watch).await;
    assert_eq!(deleted["type"], "delete");
    let list: Value = server
        .get("/kv?prefix=inference")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(list["entries"].as_array().unwrap().len(), 1);
    drop(watch);
    server.stop().await;
}

#[tokio::test]
async fn publish_and_subscribe_on_one_websocket() {
    let server = TestServer::start().await;
    let (mut ws, _) =
        tokio_tungstenite::connect_async(server.ws_url("/bus/ws?subscribe=agent.response.*"))
            .await
            .unwrap();
    let frame =
        json!({"type": "publish", "subject": "agent.response.completed", "data": {"answer": 42}});
    ws.send(Message::Text(frame.to_string().into()))
        .await
        .unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        let text = ws_text(&mut ws).await;
        got.push(serde_json::from_str::<Value>(&text).unwrap());
    }
    got.sort_by_key(|v| v["type"].as_str().unwrap().to_owned());
    assert_eq!(got[0]["data"], json!({"answer": 42}));
    assert_eq!(
        got[1],
        json!({"type": "published", "subject": "agent.response.completed", "seq": 1})
    );
    ws.send(Message::Text(
        r#"{"type":"publish","subject":"a..b","data":1}"#.into(),
    ))
    .await
    .unwrap();
    let text = ws_text(&mut ws).await;
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["code"],
        "bad_subject"
    );
    ws.send(Message::Text("nonsense".into())).await.unwrap();
    let text = ws_text(&mut ws).await;
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["code"],
        "bad_frame"
    );
    server.stop().await;
}

#[tokio::test]
async fn each_key_has_its_own_subjects_and_keys() {
    let server = TestServer::start_with(|c| c.api_keys = vec![KEY_A.into(), KEY_B.into()]).await;
    let mut b_sees = subscribe(&server, Some(KEY_B), "subjects=>").await;
    let (mut b_ws, _) = tokio_tungstenite::connect_async(
        server.ws_url(&format!("/bus/ws?subscribe=%3E&token={KEY_B}")),
    )
    .await
    .map_err(|e| match e {
        tokio_tungstenite::tungstenite::Error::Http(r) => format!(
            "{:?} {:?}",
            r.status(),
            r.body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
        ),
        e => e.to_string(),
    })
    .unwrap();
    let mut a_sees = subscribe(&server, Some(KEY_A), "subjects=>").await;
    let published = server
        .send_as(
            KEY_A,
            Method::POST,
            "/bus/publish/sync/weights_ready",
            Some(json!({"v": 1})),
        )
        .await;
    assert_eq!(published.status(), 202);
    assert_eq!(next(&mut a_sees).await["data"], json!({"v": 1}));
    let put = server
        .send_as(
            KEY_A,
            Method::PUT,
            "/kv/inference_response_topic",
            Some(json!("a.results")),
        )
        .await;
    assert_eq!(put.status(), 200);
    // B sees neither A's message nor A's key, and its own seq starts at 1.
    let b_get = server
        .send_as(KEY_B, Method::GET, "/kv/inference_response_topic", None)
        .await;
    assert_eq!(b_get.status(), 404);
    let b_list: Value = server
        .send_as(KEY_B, Method::GET, "/kv", None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(b_list["entries"], json!([]));
    let b_delete = server
        .send_as(KEY_B, Method::DELETE, "/kv/inference_response_topic", None)
        .await;
    assert_eq!(b_delete.status(), 404);
    let b_pub: Value = server
        .send_as(
            KEY_B,
            Method::POST,
            "/bus/publish/sync/weights_ready",
            Some(json!({"v": "b"})),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(b_pub["seq"], 1);
    // B's first message on both ways in is its own.
    assert_eq!(next(&mut b_sees).await["data"], json!({"v": "b"}));
    let text = ws_text(&mut b_ws).await;
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["data"],
        json!({"v": "b"})
    );
    // A replay from the start shows B only B's.
    let mut b_replay = subscribe(&server, Some(KEY_B), "subjects=sync.>&since=all").await;
    assert_eq!(next(&mut b_replay).await["data"], json!({"v": "b"}));
    // Without a key nothing is served.
    let anonymous = server
        .http
        .get(server.url("/bus/subscribe?subjects=>"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    drop((b_sees, a_sees, b_replay));
    server.stop().await;
}

#[tokio::test]
async fn metrics_and_the_openapi_document_cover_the_bus() {
    let server = TestServer::start().await;
    publish(&server, "sync/weights_ready", json!(1)).await;
    publish(&server, "chatter", json!(1)).await;
    let metrics = server.get("/metrics").await.text().await.unwrap();
    for line in [
        r#"conclave_bus_published_total{class="sync.>"} 1"#,
        r#"conclave_bus_published_total{class="transient"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} missing from {metrics}");
    }
    let doc: Value = server.get("/openapi.json").await.json().await.unwrap();
    let paths = doc["paths"].as_object().unwrap();
    for path in [
        "/bus/publish/{subject}",
        "/bus/subscribe",
        "/bus/ws",
        "/kv",
        "/kv/{key}",
        "/rollouts",
        "/rollouts/{id}",
        "/gateway/pools/{model}/weights/begin",
        "/gateway/pools/{model}/weights/commit",
    ] {
        assert!(
            paths.contains_key(path),
            "{path} missing from the OpenAPI document"
        );
    }
    server.stop().await;
}

/// Sends `request` as it is on a new connection and reads until `until`
/// shows up (or the server closes); answers everything read.
async fn raw_http(server: &TestServer, request: &str, until: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = server
        .url("")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains(until) {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer))
            .await
            .expect("the server answers within 10 s")
            .unwrap();
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buffer[..n]);
    }
    String::from_utf8_lossy(&seen).into_owned()
}

#[tokio::test]
async fn a_raw_greater_than_in_the_query_subscribes_as_written() {
    let server = TestServer::start().await;
    publish(&server, "sync/weights_ready", json!({"version": 3})).await;
    // As curl sends the README's example: `>` unencoded.
    let answer = raw_http(
        &server,
        "GET /bus/subscribe?subjects=sync.>&since=all HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        "weights_ready",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains(r#""subject":"sync/weights_ready""#),
        "{answer}"
    );
    // The table's form, after a request whose body holds `<>` on the same
    // connection (bodies pass as they are).
    let answer = raw_http(
        &server,
        "POST /bus/publish/a/b HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: 11\r\n\r\n{\"x\": \"<>\"}\
         GET /bus/subscribe?subjects=a.*,sync/>&since=all HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        "weights_ready",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
    assert!(answer.contains("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("weights_ready"), "{answer}");
    // A route that does not exist answers the server's JSON error.
    let answer = raw_http(
        &server,
        "GET /nowhere?a=> HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        "}",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(answer.contains(r#""code":"not_found""#), "{answer}");

    // Python's urllib sends it raw too.
    let python = std::env::var("CONCLAVE_TEST_PYTHON").expect("CONCLAVE_TEST_PYTHON");
    let script = "import sys, urllib.request\n\
                  r = urllib.request.urlopen(sys.argv[1], timeout=10)\n\
                  print(r.status, r.readline().decode())";
    let url = server.url("/bus/subscribe?subjects=sync.>&since=all");
    let output = tokio::process::Command::new(python)
        .args(["-c", script, &url])
        .output()
        .await
        .unwrap();
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        printed.starts_with("200 ") && printed.contains("weights_ready"),
        "{printed} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    server.stop().await;
}
