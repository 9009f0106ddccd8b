use std::convert::Infallible;

use axum::http::Request;
use bytes::Bytes;
use http_body_util::Full;
use hyper::service::Service;
use serde_json::Value;

use super::*;

/// hyper's own answer to a head it cannot read, byte for byte.
const HYPER_400: &[u8] =
    b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: Thu, 26 Nov 2026 12:55:56 GMT\r\n\r\n";

fn at(calls: u64, open: usize) -> impl FnOnce() -> (Exchanges, bool) {
    move || {
        (
            Exchanges {
                calls,
                open,
                upgraded: false,
            },
            false,
        )
    }
}

/// Writes `bytes` in pieces of `piece`, all at `calls`/`open`; answers
/// what goes to the socket.
fn written(
    refusals: &mut Refusals,
    bytes: &[u8],
    piece: usize,
    calls: u64,
    open: usize,
) -> Vec<u8> {
    let mut socket = Vec::new();
    for chunk in bytes.chunks(piece) {
        let mut chunk = chunk;
        while !chunk.is_empty() {
            let pending = refusals.pending().to_vec();
            socket.extend_from_slice(&pending);
            refusals.sent(pending.len());
            match refusals.write(chunk, at(calls, open)) {
                Write::Pass => {
                    socket.extend_from_slice(chunk);
                    chunk = &[];
                }
                Write::Held(n) => chunk = &chunk[n..],
            }
        }
    }
    refusals.flushing();
    let pending = refusals.pending().to_vec();
    socket.extend_from_slice(&pending);
    refusals.sent(pending.len());
    refusals.flushed(at(calls, open)().0);
    socket
}

/// The status, lower-cased header lines and the JSON body of a response.
fn parse(response: &[u8]) -> (String, Vec<String>, Value) {
    let end = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8(response[..end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().to_owned();
    let headers = lines.map(str::to_ascii_lowercase).collect();
    let body = serde_json::from_slice(&response[end + 4..]).unwrap();
    (status, headers, body)
}

#[test]
fn hypers_refusal_of_a_first_request_becomes_the_json_error() {
    for piece in [HYPER_400.len(), 1, 7] {
        let mut refusals = Refusals::default();
        let socket = written(&mut refusals, HYPER_400, piece, 0, 0);
        let (status, headers, body) = parse(&socket);
        assert_eq!(status, "HTTP/1.1 400 Bad Request");
        let length = socket.len() - socket.windows(4).position(|w| w == b"\r\n\r\n").unwrap() - 4;
        assert_eq!(
            headers,
            [
                "content-type: application/json".to_owned(),
                format!("content-length: {length}"),
                "connection: close".to_owned(),
                "date: thu, 26 nov 2026 12:55:56 gmt".to_owned(),
            ]
        );
        assert_eq!(body["error"]["code"], "bad_request");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("HTTP/1.1")
        );
        assert!(refusals.is_passthrough());
    }
    for (status, code) in [
        ("414 URI Too Long", "uri_too_long"),
        ("431 Request Header Fields Too Large", "headers_too_large"),
    ] {
        let refusal =
            format!("HTTP/1.1 {status}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n");
        let socket = written(&mut Refusals::default(), refusal.as_bytes(), 5, 0, 0);
        let (line, _, body) = parse(&socket);
        assert_eq!(line, format!("HTTP/1.1 {status}"));
        assert_eq!(body["error"]["code"], code);
    }
}

#[test]
fn responses_to_requests_pass_untouched_and_a_refusal_after_them_is_json() {
    let mut refusals = Refusals::default();
    // A bodiless 400 from a route: its request is with the service.
    let route_400 = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
    assert_eq!(written(&mut refusals, route_400, 9, 1, 1), route_400);
    // Its body was done before hyper wrote a byte: the call since the last
    // flush still marks it as a route's.
    assert_eq!(written(&mut refusals, route_400, 9, 2, 0), route_400);
    // A streamed body's last bytes, written after the body is done.
    let mut refusals = Refusals::default();
    let head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nHTTP/\r\n";
    let mut socket = Vec::new();
    for chunk in head.chunks(4) {
        assert_eq!(refusals.write(chunk, at(1, 1)), Write::Pass);
        socket.extend_from_slice(chunk);
    }
    refusals.flushed(at(1, 1)().0);
    assert_eq!(written(&mut refusals, b"0\r\n\r\n", 5, 1, 0), b"0\r\n\r\n");
    // Then hyper refuses the next head.
    let socket = written(&mut refusals, HYPER_400, 11, 1, 0);
    assert_eq!(parse(&socket).2["error"]["code"], "bad_request");
}

#[test]
fn http2_and_upgrades_are_never_held() {
    let mut refusals = Refusals::default();
    let write = refusals.write(HYPER_400, || (Exchanges::default(), true));
    assert_eq!(write, Write::Pass);
    assert!(refusals.is_passthrough());
    let mut refusals = Refusals::default();
    let upgraded = Exchanges {
        calls: 0,
        open: 0,
        upgraded: true,
    };
    assert_eq!(refusals.write(HYPER_400, || (upgraded, false)), Write::Pass);
    assert!(refusals.is_passthrough());
}

#[test]
fn a_held_write_that_is_not_a_bodiless_refusal_goes_out_as_it_came() {
    let cases: [&[u8]; 6] = [
        b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\nno",
        b"HTTP/1.1 400 Bad Request\r\nx-other: 1\r\ncontent-length: 0\r\n\r\n",
        b"0\r\n\r\n",
        b"\x00\x00\x12\x04\x00\x00\x00\x00\x00",
        b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n",
    ];
    for case in cases {
        for piece in [case.len(), 1, 3] {
            let mut refusals = Refusals::default();
            assert_eq!(written(&mut refusals, case, piece, 0, 0), case);
            assert!(refusals.is_passthrough());
        }
    }
    let long = [
        b"HTTP/1.1 400 Bad Request\r\nx: ".as_slice(),
        &[b'a'; 2 * MAX_HELD],
    ]
    .concat();
    assert_eq!(written(&mut Refusals::default(), &long, 100, 0, 0), long);
}

/// A body of five bytes; `101` when the request says `switch`.
async fn answer(request: Request<String>) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut response = Response::new(Full::new(Bytes::from_static(b"hello")));
    if request.body() == "switch" {
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    }
    Ok(response)
}

#[tokio::test]
async fn the_service_counts_each_request_open_until_its_body_is_done() {
    let exchanges = SharedExchanges::default();
    let service = Watched::new(hyper::service::service_fn(answer), exchanges.clone());
    let answer = service.call(Request::new(String::new()));
    let now = *lock(&exchanges);
    assert_eq!((now.calls, now.open, now.upgraded), (1, 1, false));
    let response = answer.await.unwrap();
    assert_eq!(lock(&exchanges).open, 1);
    assert_eq!(response.body().size_hint().exact(), Some(5));
    drop(response);
    assert_eq!(lock(&exchanges).open, 0);
    // A future dropped unanswered closes its count too.
    drop(service.call(Request::new(String::new())));
    let now = *lock(&exchanges);
    assert_eq!((now.calls, now.open), (2, 0));
    let response = service
        .call(Request::new("switch".to_owned()))
        .await
        .unwrap();
    assert!(lock(&exchanges).upgraded);
    drop(response);
}
