//! The egress proxy of sandboxes given an allow-list
//! (`options.sandbox.network: {allow: [...]}`): an HTTP proxy the server
//! runs, reached from inside the sandbox at `127.0.0.1:3128` and nowhere
//! else.
//!
//! Such a sandbox has no network but loopback (docker's `none` network, a
//! local exec's own network namespace). The server binds the proxy's
//! listener inside that namespace ([`EgressProxy::listen`]: a thread joins
//! it with `setns`, binds, and leaves; the socket stays there), so the
//! proxy is the one way out and every connection it accepts is known to
//! be that sandbox's, with no address or credential to forge.
//!
//! For each connection the proxy reads one request head: `CONNECT
//! host:port` (TLS and anything else tunnelled), or a plain HTTP request
//! with an absolute URI, forwarded with `Connection: close`. It resolves
//! the name itself (`sandbox.network.hosts` first), checks it against the
//! session's list, refuses loopback, private, link-local and reserved
//! addresses unless the ceiling (`sandbox.network.allow`) names them, and
//! connects to the address it checked. A refusal is answered `403`, counted
//! in `/metrics` and told to whoever follows the sandbox's running call
//! ([`EgressProxy::follow`]), which makes it a `status` event.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;
use tokio::task::{AbortHandle, JoinSet};

use crate::config::{AllowList, NetworkConfig};
use crate::sandbox::secrets::Scrubber;

/// Where a sandbox reaches its proxy.
pub const PROXY_PORT: u16 = 3128;
/// The longest request head the proxy reads.
const MAX_HEAD: usize = 32 * 1024;
/// Refusals kept for a follower that lags.
const FEED_BACKLOG: usize = 64;

/// The variables every command of a sandbox with an allow-list gets.
pub fn proxy_env() -> BTreeMap<String, String> {
    let url = format!("http://127.0.0.1:{PROXY_PORT}");
    let mut env = BTreeMap::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        env.insert(name.to_string(), url.clone());
    }
    for name in ["NO_PROXY", "no_proxy"] {
        env.insert(name.to_string(), "localhost,127.0.0.1,::1".to_string());
    }
    env
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// The server's one egress proxy; each sandbox with an allow-list has a
/// listener of its own.
pub struct EgressProxy {
    ceiling: AllowList,
    hosts: BTreeMap<String, IpAddr>,
    /// Takes every configured secret out of what is logged and told: a
    /// host name is the sandbox's to choose, so it can carry one.
    scrubber: Scrubber,
    /// Refusals, by sandbox id, while a call of that sandbox is followed.
    feeds: Mutex<HashMap<String, (broadcast::Sender<String>, usize)>>,
    connections: Family<OutcomeLabel, Counter>,
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for EgressProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressProxy")
            .field("ceiling", &self.ceiling)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// A sandbox's listener; dropping it closes the listener and every
/// connection it accepted.
#[derive(Debug)]
pub struct Listening(AbortHandle);

impl Drop for Listening {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A follower of one sandbox's refusals, while a call runs.
pub struct Follow {
    proxy: Arc<EgressProxy>,
    key: String,
    pub refusals: broadcast::Receiver<String>,
}

impl Drop for Follow {
    fn drop(&mut self) {
        let mut feeds = lock(&self.proxy.feeds);
        if let Some((_, followers)) = feeds.get_mut(&self.key) {
            *followers -= 1;
            if *followers == 0 {
                feeds.remove(&self.key);
            }
        }
    }
}

impl EgressProxy {
    /// Must be made inside the server's runtime, whose handle it keeps for
    /// listeners bound from plain threads (the local backend's).
    pub fn new(config: &NetworkConfig, scrubber: Scrubber) -> EgressProxy {
        EgressProxy {
            ceiling: AllowList::parse(&config.allow).unwrap_or_default(),
            hosts: config.pinned(),
            scrubber,
            feeds: Mutex::new(HashMap::new()),
            connections: Family::default(),
            runtime: tokio::runtime::Handle::current(),
        }
    }

    /// The ceiling every session's list narrows.
    pub fn ceiling(&self) -> &AllowList {
        &self.ceiling
    }

    /// Adds the counts to the server's `/metrics`.
    pub fn register(&self, metrics: &crate::telemetry::Metrics) {
        metrics.register_with(|registry| {
            registry.register(
                "sandbox_egress_connections",
                "Connections sandboxes asked their egress proxy for, by outcome (allowed, refused, failed)",
                self.connections.clone(),
            );
        });
    }

    /// Binds a listener on port [`PROXY_PORT`] in the network namespace of
    /// process `pid` (a sandbox's), serving `allow` for sandbox `key`.
    pub fn listen(
        self: &Arc<Self>,
        pid: u32,
        allow: AllowList,
        key: String,
    ) -> io::Result<Listening> {
        let listener = bind_in_namespace(pid)?;
        let proxy = self.clone();
        let task = self.runtime.spawn(async move {
            let listener = match TcpListener::from_std(listener) {
                Ok(listener) => listener,
                Err(e) => {
                    tracing::warn!(sandbox = %key, error = %e, "egress proxy listener");
                    return;
                }
            };
            let allow = Arc::new(allow);
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((socket, _)) => {
                            let proxy = proxy.clone();
                            let (allow, key) = (allow.clone(), key.clone());
                            connections.spawn(async move { proxy.serve(socket, &allow, &key).await });
                        }
                        Err(e) => {
                            tracing::debug!(sandbox = %key, error = %e, "egress proxy accept");
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        }
                    },
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Ok(Listening(task.abort_handle()))
    }

    /// Follows sandbox `key`'s refusals until the [`Follow`] is dropped.
    pub fn follow(self: &Arc<Self>, key: &str) -> Follow {
        let mut feeds = lock(&self.feeds);
        let (sender, followers) = feeds
            .entry(key.to_string())
            .or_insert_with(|| (broadcast::channel(FEED_BACKLOG).0, 0));
        *followers += 1;
        Follow {
            proxy: self.clone(),
            key: key.to_string(),
            refusals: sender.subscribe(),
        }
    }

    async fn serve(&self, mut client: TcpStream, allow: &AllowList, key: &str) {
        let (request, rest) = match read_head(&mut client).await {
            Ok(read) => read,
            Err(message) => {
                let _ = respond(&mut client, "400 Bad Request", &message).await;
                return;
            }
        };
        let target = format!("{}:{}", request.host, request.port);
        let addr = match self.decide(&request.host, request.port, allow).await {
            Ok(addr) => addr,
            Err(reason) => {
                self.count("refused");
                let message = self.scrubber.scrub(&format!(
                    "egress proxy refused {} {target}: {reason}",
                    request.method
                ));
                tracing::info!(sandbox = %key, "{message}");
                if let Some((feed, _)) = lock(&self.feeds).get(key) {
                    let _ = feed.send(message.clone());
                }
                let _ = respond(&mut client, "403 Forbidden", &message).await;
                return;
            }
        };
        let mut upstream = match TcpStream::connect(addr).await {
            Ok(upstream) => upstream,
            Err(e) => {
                self.count("failed");
                let message = self
                    .scrubber
                    .scrub(&format!("egress proxy cannot reach {target} ({addr}): {e}"));
                let _ = respond(&mut client, "502 Bad Gateway", &message).await;
                return;
            }
        };
        self.count("allowed");
        let sent = match &request.forward {
            None => {
                client
                    .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                    .await
            }
            Some(head) => upstream.write_all(head).await,
        };
        if sent.is_err() || upstream.write_all(&rest).await.is_err() {
            return;
        }
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    }

    /// The address to connect to for `host:port`, or why not.
    async fn decide(&self, host: &str, port: u16, allow: &AllowList) -> Result<SocketAddr, String> {
        let list = "this session's allow-list (options.sandbox.network.allow)";
        if let Ok(addr) = host.parse::<IpAddr>() {
            return if allow.names_addr(addr) {
                Ok(SocketAddr::new(addr, port))
            } else {
                Err(format!("{addr} is not on {list}"))
            };
        }
        if !allow.allows_name(host) {
            return Err(format!("{host} is not on {list}"));
        }
        let name = host.trim_end_matches('.').to_ascii_lowercase();
        let addrs: Vec<IpAddr> = match self.hosts.get(&name) {
            Some(pinned) => vec![*pinned],
            None => tokio::net::lookup_host((name.as_str(), port))
                .await
                .map_err(|e| format!("{host} does not resolve: {e}"))?
                .map(|a| a.ip())
                .collect(),
        };
        let mut refused = None;
        for addr in addrs {
            let kind = crate::egress::kind_of(addr);
            if kind == "public" || self.ceiling.names_addr(addr) {
                return Ok(SocketAddr::new(addr, port));
            }
            refused.get_or_insert((addr, kind));
        }
        Err(match refused {
            Some((addr, kind)) => format!(
                "{host} resolves to {addr}, a {kind} address, which sandbox.network.allow does not name"
            ),
            None => format!("{host} does not resolve"),
        })
    }

    fn count(&self, outcome: &'static str) {
        self.connections
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }
}

/// One request head: where it goes, and for plain HTTP the head to send
/// there instead (origin-form, `Connection: close`).
struct Head {
    method: String,
    host: String,
    port: u16,
    /// `None` for CONNECT.
    forward: Option<Vec<u8>>,
}

/// Reads one request head; what was read past it is returned with it.
async fn read_head(client: &mut TcpStream) -> Result<(Head, Vec<u8>), String> {
    let mut buffer = Vec::with_capacity(1024);
    loop {
        let mut chunk = [0u8; 4096];
        let read = client
            .read(&mut chunk)
            .await
            .map_err(|e| format!("reading the request: {e}"))?;
        if read == 0 {
            return Err("the connection closed before a request head".into());
        }
        buffer.extend_from_slice(&chunk[..read]);
        let mut headers = [httparse::EMPTY_HEADER; 100];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(&buffer) {
            Ok(httparse::Status::Complete(length)) => {
                let head = interpret(&request)?;
                return Ok((head, buffer[length..].to_vec()));
            }
            Ok(httparse::Status::Partial) if buffer.len() < MAX_HEAD => continue,
            Ok(httparse::Status::Partial) => {
                return Err(format!("a request head longer than {MAX_HEAD} bytes"));
            }
            Err(e) => return Err(format!("not an HTTP request: {e}")),
        }
    }
}

fn interpret(request: &httparse::Request) -> Result<Head, String> {
    let method = request.method.unwrap_or_default().to_string();
    let target = request.path.unwrap_or_default();
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(target, None)
            .ok_or_else(|| format!("CONNECT needs host:port, not {target:?}"))?;
        return Ok(Head {
            method,
            host,
            port,
            forward: None,
        });
    }
    let url = url::Url::parse(target).map_err(|_| {
        format!("a proxy request needs an absolute http:// URI (or CONNECT), not {target:?}")
    })?;
    if url.scheme() != "http" {
        return Err(format!(
            "{} URLs go through CONNECT, not a plain request",
            url.scheme()
        ));
    }
    let host = match url.host() {
        Some(url::Host::Domain(name)) => name.to_string(),
        Some(url::Host::Ipv4(addr)) => addr.to_string(),
        Some(url::Host::Ipv6(addr)) => addr.to_string(),
        None => return Err(format!("{target:?} has no host")),
    };
    let port = url.port_or_known_default().unwrap_or(80);
    let mut path = url.path().to_string();
    if let Some(query) = url.query() {
        path.push('?');
        path.push_str(query);
    }
    let mut head = format!(
        "{method} {path} HTTP/1.{}\r\n",
        request.version.unwrap_or(1)
    )
    .into_bytes();
    for header in request.headers.iter() {
        let hop = [
            "connection",
            "proxy-connection",
            "proxy-authorization",
            "keep-alive",
        ];
        if hop.iter().any(|h| header.name.eq_ignore_ascii_case(h)) {
            continue;
        }
        head.extend_from_slice(header.name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(header.value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Head {
        method,
        host,
        port,
        forward: Some(head),
    })
}

/// `host:port` or `[v6]:port`.
fn split_authority(text: &str, default: Option<u16>) -> Option<(String, u16)> {
    let (host, port) = match text.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && !port.contains(']') => (host, port.parse().ok()?),
        _ => (text, default?),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| (host.to_string(), port))
}

async fn respond(client: &mut TcpStream, status: &str, message: &str) -> io::Result<()> {
    let body = format!("{message}\n");
    let answer = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(answer.as_bytes()).await?;
    client.shutdown().await
}

/// A listener on `0.0.0.0:PROXY_PORT` of process `pid`'s network
/// namespace. A namespace of a sandbox without network holds only
/// loopback, which may not be up yet: the wildcard address binds
/// whatever the interface's state.
fn bind_in_namespace(pid: u32) -> io::Result<std::net::TcpListener> {
    let namespace = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    std::thread::Builder::new()
        .name("egress-bind".into())
        .spawn(move || {
            // SAFETY: setns on a descriptor this thread owns moves only
            // this thread, which binds one socket and exits.
            if unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            let listener = std::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, PROXY_PORT))?;
            listener.set_nonblocking(true)?;
            Ok(listener)
        })?
        .join()
        .map_err(|_| io::Error::other("the thread binding the egress proxy panicked"))?
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
#[path = "proxy_tests.rs"]
mod tests;
