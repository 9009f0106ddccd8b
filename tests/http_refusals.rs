//! Requests the HTTP/1 parser refuses before any route runs (a malformed
//! request line, a control character in the target, an invalid header, a
//! head too large) answer the server's JSON error, with the status the
//! parser chose and `connection: close`; bytes the URI parser refused but
//! that mean one thing (raw non-ASCII in a target) reach the routes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::TestServer;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One response, as read off the socket.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as the server's error shape, `(code, message)`; panics
    /// when it is anything else.
    fn error(&self) -> (String, String) {
        assert_eq!(
            self.header("content-type"),
            Some("application/json"),
            "{self:?}"
        );
        assert_eq!(
            self.header("content-length"),
            Some(self.body.len().to_string().as_str()),
            "{self:?}"
        );
        let body: Value = serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"));
        let error = body["error"].as_object().expect("an error object");
        assert_eq!(error.len(), 2, "{body}");
        let code = error["code"].as_str().expect("a code").to_owned();
        let message = error["message"].as_str().expect("a message").to_owned();
        assert!(!message.is_empty(), "{body}");
        (code, message)
    }
}

/// Sends `request` on a new connection and reads until the server closes
/// it; answers the one response read.
async fn exchange(server: &TestServer, request: &[u8]) -> Answer {
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut seen))
        .await
        .expect("the server answers and closes within 10 s")
        .unwrap();
    let end = seen
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(&seen)));
    let head = String::from_utf8_lossy(&seen[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {status_line:?}"));
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: seen[end + 4..].to_vec(),
    }
}

/// A request that reaches a route, on a new connection.
async fn health_still_answers(server: &TestServer) {
    let answer = exchange(
        server,
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
}

#[tokio::test]
async fn raw_non_ascii_and_punctuation_in_a_target_reach_the_routes() {
    let server = TestServer::start().await;
    // Raw `{`, `|`, `^`, UTF-8 and a byte that is not UTF-8 in the query.
    let answer = exchange(
        &server,
        b"GET /health?q={a|b}^\xc3\xa9\xff HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    // The same in a path no route serves: the router's JSON 404.
    let answer = exchange(
        &server,
        b"GET /nowhere/{a|b}^\xff\xfe HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(answer.status, 404, "{answer:?}");
    assert_eq!(answer.error().0, "not_found");
    // A method no route takes, with a body of any type: the router's 405,
    // not a refusal of the body's type.
    let answer = exchange(
        &server,
        b"TRACE /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n\
          Content-Length: 3\r\nConnection: close\r\n\r\n[0]",
    )
    .await;
    assert_eq!(answer.status, 405, "{answer:?}");
    assert_eq!(answer.error().0, "method_not_allowed");
    server.stop().await;
}

#[tokio::test]
async fn what_the_parser_refuses_answers_the_json_error_and_closes() {
    let server = TestServer::start().await;
    let many_headers: String = (0..150).map(|i| format!("X-H{i}: v\r\n")).collect();
    // A head that fills hyper's read buffer (8192 + 4096 × 100 bytes, the
    // "about 400 KiB" of the message) before it ends: the client sends no
    // byte more, so none is left unread to turn the close into a reset.
    let mut full_head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ".to_vec();
    full_head.resize(8192 + 4096 * 100, b'a');
    let long_target = format!("/health?q={}", "a".repeat(70 * 1024));
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "a control character in the target",
            b"GET /health?q=a\x01b HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                .to_vec(),
            400,
            "bad_request",
        ),
        (
            "a malformed request line",
            b"GET\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
        (
            "an unsupported version",
            b"GET /health HTTP/3.7\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
        (
            "a space in a header name",
            b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nBad Name: x\r\n\r\n"
                .to_vec(),
            400,
            "bad_request",
        ),
        (
            "a control character in a header value",
            b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-A: a\x01b\r\n\r\n"
                .to_vec(),
            400,
            "bad_request",
        ),
        (
            "150 headers",
            format!(
                "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{many_headers}\r\n"
            )
            .into_bytes(),
            431,
            "headers_too_large",
        ),
        ("a head past 400 KiB", full_head, 431, "headers_too_large"),
        (
            "a 70 KiB target",
            format!("GET {long_target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .into_bytes(),
            414,
            "uri_too_long",
        ),
    ];
    for (what, request, status, code) in cases {
        let answer = exchange(&server, &request).await;
        assert_eq!(answer.status, status, "{what}: {answer:?}");
        assert_eq!(
            answer.header("connection"),
            Some("close"),
            "{what}: {answer:?}"
        );
        assert_eq!(answer.error().0, code, "{what}: {answer:?}");
        health_still_answers(&server).await;
    }
    server.stop().await;
}

#[tokio::test]
async fn a_refusal_after_answered_requests_on_one_connection_is_json_too() {
    let server = TestServer::start().await;
    // Two requests answered on one connection, then one the parser
    // refuses: the answers before it are as they were, the refusal JSON.
    let answer = {
        let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        stream
            .write_all(
                b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n\
                  GET /nowhere HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n\
                  GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Name: x\r\n\r\n",
            )
            .await
            .unwrap();
        let mut seen = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut seen))
            .await
            .expect("the server closes within 10 s")
            .unwrap();
        String::from_utf8_lossy(&seen).into_owned()
    };
    let responses: Vec<&str> = answer
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| &answer[i..])
        .collect();
    assert_eq!(responses.len(), 3, "{answer}");
    assert!(responses[0].starts_with("HTTP/1.1 200"), "{answer}");
    assert!(responses[1].starts_with("HTTP/1.1 404"), "{answer}");
    assert!(responses[1].contains(r#""code":"not_found""#), "{answer}");
    assert!(responses[2].starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        responses[2]
            .to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{answer}"
    );
    assert!(responses[2].contains(r#""code":"bad_request""#), "{answer}");
    server.stop().await;
}
