//! How the gateway calls a replica. A replica on `http://` (an inference
//! server on the local network, the usual case) is called over hyper's
//! HTTP/1 connections directly: its paths and `Host` header are made once,
//! when the replica is added ([`Plain`]), and its idle connections wait in
//! a list of its own, so a call builds one request, takes a connection and
//! gives it back when the response has been read. reqwest, which the
//! gateway used for every call before, parses each request's URL again for
//! its redirect policy and passes it through retry and redirect layers of
//! its own (about 8 % of the gateway's CPU per call in the profile of issue
//! 20, `benches/notes/routers-cpu.md`); hyper-util's pooled client, used after it,
//! formats the `Host` header, hashes the pool key and goes through its
//! checkout futures on every call (about 5 % more). A replica on
//! `https://` goes through reqwest with rustls. Replicas added at run time
//! resolve through the rules of `gateway.allowed_upstreams` with either.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Uri;
use http::header::HOST;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::GaiResolver;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use tower::ServiceExt;

use super::pool::Replica;
use crate::egress::{Guarded, Rules};
use crate::upstream::describe;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A replica's response body, whichever client read it.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// An error while a response body was read, described with its causes.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BodyError(pub String);

impl From<BoxError> for BodyError {
    fn from(error: BoxError) -> BodyError {
        BodyError(describe(error.as_ref()))
    }
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// An idle connection older than this is closed rather than used.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Idle connections kept per replica; more are closed when given back.
const MAX_IDLE: usize = 256;

/// A replica served on `http://`: what its requests need, made once, and
/// its idle connections.
pub struct Plain {
    /// `http://host:port`, what the connector dials.
    origin: Uri,
    /// Each endpoint's path (origin form), in the order of `Endpoint::ALL`.
    paths: [Uri; 6],
    host: HeaderValue,
    idle: Mutex<Vec<(SendRequest<Full<Bytes>>, Instant)>>,
}

impl Plain {
    /// `None` unless the URLs (of one server, in the order of
    /// `Endpoint::ALL`) are `http://` and parse as URIs.
    pub fn new(urls: &[reqwest::Url; 6]) -> Option<Plain> {
        let chat = &urls[0];
        (chat.scheme() == "http").then_some(())?;
        let path = |url: &reqwest::Url| {
            let path = match url.query() {
                Some(query) => format!("{}?{query}", url.path()),
                None => url.path().to_string(),
            };
            path.parse::<Uri>().ok()
        };
        let host = match chat.port() {
            Some(port) => format!("{}:{port}", chat.host_str()?),
            None => chat.host_str()?.to_string(),
        };
        Some(Plain {
            origin: format!("http://{host}").parse().ok()?,
            paths: urls
                .iter()
                .map(path)
                .collect::<Option<Vec<Uri>>>()?
                .try_into()
                .ok()?,
            host: HeaderValue::try_from(host).ok()?,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// The path of `endpoint`, origin form.
    pub fn path(&self, endpoint: super::Endpoint) -> &Uri {
        &self.paths[endpoint.index()]
    }

    /// An idle connection ready for a request: the newest one ready now,
    /// else the newest still open once it is ready (its last response may
    /// be finishing). Closed ones are dropped, and one idle too long.
    async fn checkout(&self) -> Option<SendRequest<Full<Bytes>>> {
        loop {
            let (mut sender, since) = {
                let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
                idle.retain(|(sender, _)| !sender.is_closed());
                let pick = idle
                    .iter()
                    .rposition(|(sender, _)| sender.is_ready())
                    .or(idle.len().checked_sub(1))?;
                idle.remove(pick)
            };
            if since.elapsed() <= IDLE_TIMEOUT && sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    fn give_back(&self, sender: SendRequest<Full<Bytes>>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push((sender, Instant::now()));
        }
    }
}

pub struct Clients {
    plain: HttpConnector<GaiResolver>,
    guarded_plain: HttpConnector<Guarded>,
    tls: reqwest::Client,
    guarded_tls: reqwest::Client,
}

impl Clients {
    pub fn new(upstreams: &Arc<Rules>) -> Result<Clients, String> {
        let tls = |builder: reqwest::ClientBuilder| {
            builder
                .connect_timeout(CONNECT_TIMEOUT)
                .tcp_nodelay(true)
                .pool_idle_timeout(IDLE_TIMEOUT)
                .build()
                .map_err(|e| format!("cannot build the gateway's HTTP client: {e}"))
        };
        Ok(Clients {
            plain: connector(HttpConnector::new()),
            guarded_plain: connector(HttpConnector::new_with_resolver(Guarded(upstreams.clone()))),
            tls: tls(reqwest::Client::builder())?,
            guarded_tls: tls(upstreams.client())?,
        })
    }

    /// POSTs `payload` (JSON) to `endpoint` of `replica`; the error is
    /// described with its causes.
    pub async fn post(
        &self,
        replica: &Replica,
        endpoint: super::Endpoint,
        payload: Bytes,
        trace: Option<&opentelemetry::Context>,
    ) -> Result<http::Response<Body>, String> {
        let key = replica
            .api_key
            .as_ref()
            .map(|key| HeaderValue::try_from(format!("Bearer {key}")))
            .transpose()
            .map_err(|_| "the replica's api_key holds characters a header cannot carry")?;
        if let Some(plain) = replica.plain() {
            let mut request = http::Request::post(plain.path(endpoint).clone())
                .header(HOST, plain.host.clone())
                .header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            if let Some(key) = key {
                request = request.header(AUTHORIZATION, key);
            }
            let mut request = request
                .body(Full::new(payload))
                .map_err(|e| e.to_string())?;
            // The replica's own traces join the caller's.
            if let Some(cx) = trace {
                crate::telemetry::otel::inject_context(cx, request.headers_mut());
            }
            return self.send_plain(plain, replica.guarded, request).await;
        }
        let url = replica.endpoint_url(endpoint)?;
        let mut request = self
            .reqwest_for(replica)
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .body(payload);
        if let Some(key) = key {
            request = request.header(AUTHORIZATION, key);
        }
        if let Some(cx) = trace {
            let mut headers = http::HeaderMap::new();
            crate::telemetry::otel::inject_context(cx, &mut headers);
            request = request.headers(headers);
        }
        let response = request.send().await.map_err(|e| describe(&e))?;
        Ok(http::Response::from(response).map(|body| body.map_err(BoxError::from).boxed_unsync()))
    }

    /// Sends `request` over an idle connection of `plain` or a new one. A
    /// request an idle connection could not take (it closed meanwhile) goes
    /// out again over a new connection.
    async fn send_plain(
        &self,
        plain: &Arc<Plain>,
        guarded: bool,
        mut request: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<Body>, String> {
        loop {
            let (mut sender, reused) = match plain.checkout().await {
                Some(sender) => (sender, true),
                None => (self.connect(plain, guarded).await?, false),
            };
            match sender.try_send_request(request).await {
                Ok(response) => {
                    let back = Some((sender, plain.clone()));
                    return Ok(response.map(|body| Returning { body, back }.boxed_unsync()));
                }
                Err(mut error) => match error.take_message() {
                    Some(again) if reused => request = again,
                    _ => return Err(describe(error.error())),
                },
            }
        }
    }

    async fn connect(
        &self,
        plain: &Plain,
        guarded: bool,
    ) -> Result<SendRequest<Full<Bytes>>, String> {
        let uri = plain.origin.clone();
        let io = if guarded {
            self.guarded_plain.clone().oneshot(uri).await
        } else {
            self.plain.clone().oneshot(uri).await
        }
        .map_err(|e| format!("cannot connect to {}: {}", plain.origin, describe(&e)))?;
        let (sender, connection) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| describe(&e))?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(error = %describe(&error), "a replica connection ended");
            }
        });
        Ok(sender)
    }

    /// The reqwest client for other calls to `replica` (health checks).
    pub fn reqwest_for(&self, replica: &Replica) -> &reqwest::Client {
        if replica.guarded {
            &self.guarded_tls
        } else {
            &self.tls
        }
    }
}

/// A response body that gives its connection back to the replica's idle
/// list once it has been read to the end (dropped earlier, the connection
/// closes with it).
struct Returning {
    body: Incoming,
    back: Option<(SendRequest<Full<Bytes>>, Arc<Plain>)>,
}

impl Returning {
    fn give_back(&mut self) {
        if let Some((sender, plain)) = self.back.take() {
            plain.give_back(sender);
        }
    }
}

impl hyper::body::Body for Returning {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.give_back(),
            Poll::Ready(Some(Ok(_))) if self.is_end_stream() => self.give_back(),
            Poll::Ready(Some(Err(_))) => self.back = None,
            _ => {}
        }
        polled.map(|frame| frame.map(|frame| frame.map_err(BoxError::from)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        if hyper::body::Body::is_end_stream(&self.body) {
            self.give_back();
        }
    }
}

fn connector<R>(mut connector: HttpConnector<R>) -> HttpConnector<R> {
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
    connector
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::Endpoint;

    fn rules(entries: &[&str]) -> Arc<Rules> {
        let entries: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
        Arc::new(Rules::parse(&entries).unwrap())
    }

    /// A replica added at run time is refused at connect time when its
    /// name resolves where the rules do not allow, on the hyper path too
    /// (a name checked when added may resolve elsewhere later).
    #[tokio::test]
    async fn a_guarded_plain_replica_connects_only_where_the_rules_allow() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let clients = Clients::new(&rules(&["public"])).unwrap();
        let mut replica = Replica::new(
            "r".into(),
            &format!("http://localhost:{port}/v1"),
            "m".into(),
            None,
        );
        assert!(replica.plain().is_some());
        replica.guarded = true;
        let error = clients
            .post(&replica, Endpoint::Chat, Bytes::from_static(b"{}"), None)
            .await
            .unwrap_err();
        assert!(
            error.contains("a loopback address, which the allow list does not include"),
            "{error}"
        );
    }

    /// Serves each request on one accepted connection with `response`,
    /// `requests` times, and returns how many connections it accepted.
    async fn replica_serving(
        response: &'static [u8],
        requests: usize,
    ) -> (u16, tokio::task::JoinHandle<usize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut accepted, mut served) = (0, 0);
            while served < requests {
                let (mut socket, _) = listener.accept().await.unwrap();
                accepted += 1;
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while served < requests {
                    let n = socket.read(&mut buf).await.unwrap();
                    if n == 0 {
                        break;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    if seen.ends_with(b"{}") {
                        seen.clear();
                        socket.write_all(response).await.unwrap();
                        served += 1;
                    }
                }
            }
            accepted
        });
        (port, server)
    }

    /// Makes `calls` calls to a replica answering each with `response`
    /// (its body `"ok"`) and returns how many connections it accepted.
    async fn connections_for(response: &'static [u8], calls: usize) -> usize {
        let (port, server) = replica_serving(response, calls).await;
        let clients = Clients::new(&rules(&[])).unwrap();
        let url = format!("http://127.0.0.1:{port}/v1");
        let replica = Replica::new("r".into(), &url, "m".into(), None);
        for _ in 0..calls {
            let response = clients
                .post(&replica, Endpoint::Chat, Bytes::from_static(b"{}"), None)
                .await
                .unwrap();
            let (body, _) = crate::upstream::bounded_body(response.into_body(), 100).await;
            assert_eq!(body, "\"ok\"");
        }
        server.await.unwrap()
    }

    /// A connection whose response was read is used again by the next call.
    #[tokio::test]
    async fn calls_in_a_row_share_one_connection() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n\"ok\"";
        assert_eq!(connections_for(ok, 3).await, 1);
    }

    /// A connection the replica closed after its response is not used
    /// again: the next call opens another and succeeds.
    #[tokio::test]
    async fn a_connection_the_replica_closed_is_replaced() {
        let close = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 4\r\n\r\n\"ok\"";
        assert_eq!(connections_for(close, 2).await, 2);
    }

    /// The same replica from the config file (not guarded) is called, with
    /// its key, the JSON body and the path of the endpoint.
    #[tokio::test]
    async fn a_plain_replica_gets_the_body_key_and_path() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !seen.ends_with(b"{\"a\":1}") {
                let n = socket.read(&mut buf).await.unwrap();
                assert!(n > 0, "the request ended early");
                seen.extend_from_slice(&buf[..n]);
            }
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
                .await
                .unwrap();
            String::from_utf8(seen).unwrap()
        });
        let clients = Clients::new(&rules(&[])).unwrap();
        let replica = Replica::new(
            "r".into(),
            &format!("http://127.0.0.1:{port}/v1/"),
            "m".into(),
            Some("k-1".into()),
        );
        let response = clients
            .post(
                &replica,
                Endpoint::Completions,
                Bytes::from_static(b"{\"a\":1}"),
                None,
            )
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let (body, _) = crate::upstream::bounded_body(response.into_body(), 100).await;
        assert_eq!(body, "{}");
        let request = server.await.unwrap();
        assert!(
            request.starts_with("POST /v1/completions HTTP/1.1\r\n"),
            "{request}"
        );
        let lower = request.to_ascii_lowercase();
        assert!(lower.contains("authorization: bearer k-1\r\n"), "{request}");
        assert!(
            lower.contains("content-type: application/json\r\n"),
            "{request}"
        );
        assert!(lower.contains("content-length: 7\r\n"), "{request}");
    }
}
