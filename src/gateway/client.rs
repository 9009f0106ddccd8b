//! How the gateway calls a replica. A replica on `http://` (an inference
//! server on the local network, the usual case) is called with hyper's
//! pooled client directly: its URI is parsed once, when the replica is
//! added, and a call builds one request and nothing else. reqwest, which
//! the gateway used for every call before, parses each request's URL again
//! for its redirect policy and passes it through retry and redirect layers
//! of its own: about 8 % of the gateway's CPU per call in the profile of
//! issue 20 (`benches/README.md`). A replica on `https://` goes through
//! reqwest with rustls. Replicas added at run time resolve through the
//! rules of `gateway.allowed_upstreams` with either client.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as Hyper;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::GaiResolver;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};

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
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

pub struct Clients {
    plain: Hyper<HttpConnector<GaiResolver>, Full<Bytes>>,
    guarded_plain: Hyper<HttpConnector<Guarded>, Full<Bytes>>,
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
            plain: hyper().build(connector(HttpConnector::new())),
            guarded_plain: hyper().build(connector(HttpConnector::new_with_resolver(Guarded(
                upstreams.clone(),
            )))),
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
    ) -> Result<http::Response<Body>, String> {
        let key = replica
            .api_key
            .as_ref()
            .map(|key| HeaderValue::try_from(format!("Bearer {key}")))
            .transpose()
            .map_err(|_| "the replica's api_key holds characters a header cannot carry")?;
        if let Some(uri) = replica.plain_uri(endpoint) {
            let mut request = http::Request::post(uri.clone())
                .header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            if let Some(key) = key {
                request = request.header(AUTHORIZATION, key);
            }
            let request = request
                .body(Full::new(payload))
                .map_err(|e| e.to_string())?;
            let sent = if replica.guarded {
                self.guarded_plain.request(request).await
            } else {
                self.plain.request(request).await
            };
            return sent
                .map(|response| response.map(|body| body.map_err(BoxError::from).boxed_unsync()))
                .map_err(|e| describe(&e));
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
        let response = request.send().await.map_err(|e| describe(&e))?;
        Ok(http::Response::from(response).map(|body| body.map_err(BoxError::from).boxed_unsync()))
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

fn connector<R>(mut connector: HttpConnector<R>) -> HttpConnector<R> {
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
    connector
}

fn hyper() -> hyper_util::client::legacy::Builder {
    let mut builder = Hyper::builder(TokioExecutor::new());
    builder
        .pool_idle_timeout(IDLE_TIMEOUT)
        .pool_timer(TokioTimer::new());
    builder
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
        assert!(replica.plain_uri(Endpoint::Chat).is_some());
        replica.guarded = true;
        let error = clients
            .post(&replica, Endpoint::Chat, Bytes::from_static(b"{}"))
            .await
            .unwrap_err();
        assert!(
            error.contains("a loopback address, which the allow list does not include"),
            "{error}"
        );
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
