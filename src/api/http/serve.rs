//! The HTTP listener, with the limits that keep clients holding connections
//! from exhausting the server:
//!
//! - a cap on open connections (below the open-file limit, so accept never
//!   fails for want of descriptors) and a cap per client address;
//! - a deadline for each request's headers, idle keep-alive included;
//! - past a cap, a few overflow connections per address are still served,
//!   with a short header deadline and no keep-alive, by a router that
//!   answers `/health` and `503` to everything else, so probes see a
//!   server that is busy rather than dead; past those, a connection is
//!   closed at once.
//!
//! Each HTTP/1 request line's target is read as clients send it: a raw
//! `>` (a NATS subject in a query) is percent-encoded before the parser
//! refuses it (see `raw_target`). A request the parser refuses all the
//! same gets the server's JSON error, not hyper's empty one (see
//! `refusal`).
//!
//! A connection's slot lives as long as its socket, an upgraded WebSocket's
//! too. On shutdown the listener closes, each connection finishes its
//! request in flight, and `serve` returns when they are gone.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::api::http::raw_target::Targets;
use crate::api::http::refusal::{Refusals, SharedExchanges, Watched, Write};
use crate::sync::lock;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How often an idle HTTP/2 connection is pinged, so a dead peer's is
/// closed.
const H2_PING_EVERY: Duration = Duration::from_secs(30);

/// Overflow connections served at once, in all and per address.
const OVERFLOW: usize = 64;
const OVERFLOW_PER_CLIENT: usize = 4;
/// An overflow connection's deadline for its one request's headers.
const OVERFLOW_HEADER_TIMEOUT: Duration = Duration::from_secs(2);

/// The listener's limits, resolved from `[http]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub max_connections: usize,
    pub max_connections_per_client: usize,
    pub header_timeout: Duration,
}

impl Limits {
    /// `[http]` with its zeros resolved: `max_connections` from the
    /// open-file limit less a reserve for the store, sandboxes and
    /// upstream calls; the per-client cap half of it.
    pub fn new(config: &crate::config::HttpConfig, open_files: u64) -> Limits {
        let open_files = usize::try_from(open_files).unwrap_or(usize::MAX);
        let reserve = (open_files / 10).max(256);
        let max_connections = match config.max_connections {
            0 => open_files.saturating_sub(reserve).max(64),
            n => n,
        };
        let max_connections_per_client = match config.max_connections_per_client {
            0 => (max_connections / 2).max(1),
            n => n.min(max_connections),
        };
        Limits {
            max_connections,
            max_connections_per_client,
            header_timeout: Duration::from_secs(config.header_timeout_s),
        }
    }
}

/// Counts of open connections, in all and per address.
#[derive(Default)]
struct Counts {
    total: usize,
    per_client: HashMap<IpAddr, usize>,
}

impl Counts {
    fn take(&mut self, client: IpAddr, max: usize, per_client: usize) -> bool {
        let mine = self.per_client.entry(client).or_insert(0);
        if self.total >= max || *mine >= per_client {
            if *mine == 0 {
                self.per_client.remove(&client);
            }
            return false;
        }
        *mine += 1;
        self.total += 1;
        true
    }

    fn give_back(&mut self, client: IpAddr) {
        self.total -= 1;
        if let Some(mine) = self.per_client.get_mut(&client) {
            *mine -= 1;
            if *mine == 0 {
                self.per_client.remove(&client);
            }
        }
    }
}

#[derive(Default)]
struct Slots {
    full: Counts,
    overflow: Counts,
}

/// Which service a connection gets.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Full,
    Overflow,
}

/// A connection's place in the counts, given back when dropped.
struct Slot {
    slots: Arc<Mutex<Slots>>,
    client: IpAddr,
    kind: Kind,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut slots = lock(&self.slots);
        match self.kind {
            Kind::Full => slots.full.give_back(self.client),
            Kind::Overflow => slots.overflow.give_back(self.client),
        }
    }
}

fn acquire(slots: &Arc<Mutex<Slots>>, limits: &Limits, client: IpAddr) -> Option<Slot> {
    let mut counts = lock(slots);
    let kind = if counts.full.take(
        client,
        limits.max_connections,
        limits.max_connections_per_client,
    ) {
        Kind::Full
    } else if counts.overflow.take(client, OVERFLOW, OVERFLOW_PER_CLIENT) {
        Kind::Overflow
    } else {
        return None;
    };
    Some(Slot {
        slots: slots.clone(),
        client,
        kind,
    })
}

/// A socket that holds its slot for as long as it lives, reads its
/// requests' targets as clients send them ([`Targets`]) and answers the
/// requests hyper refuses in JSON ([`Refusals`]).
struct Counted {
    stream: TcpStream,
    _slot: Slot,
    targets: Targets,
    /// Rewritten bytes not yet read, from `read_at` on.
    rewritten: Vec<u8>,
    read_at: usize,
    refusals: Refusals,
    exchanges: SharedExchanges,
}

impl Counted {
    fn new(stream: TcpStream, slot: Slot, exchanges: SharedExchanges) -> Counted {
        Counted {
            stream,
            _slot: slot,
            targets: Targets::default(),
            rewritten: Vec::new(),
            read_at: 0,
            refusals: Refusals::default(),
            exchanges,
        }
    }

    /// What becomes of a write starting with `buf`, once what [`Refusals`]
    /// holds back is sent.
    fn poll_judge(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<Write>> {
        if self.refusals.is_passthrough() {
            return Poll::Ready(Ok(Write::Pass));
        }
        std::task::ready!(self.poll_pending(cx))?;
        let (exchanges, http2) = (&self.exchanges, self.targets.is_http2());
        Poll::Ready(Ok(self.refusals.write(buf, || (*lock(exchanges), http2))))
    }

    /// Sends what [`Refusals`] has to send before anything else.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let pending = self.refusals.pending();
            if pending.is_empty() {
                return Poll::Ready(Ok(()));
            }
            let n = std::task::ready!(Pin::new(&mut self.stream).poll_write(cx, pending))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.refusals.sent(n);
        }
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.read_at < this.rewritten.len() {
                let left = &this.rewritten[this.read_at..];
                let take = left.len().min(buf.remaining());
                buf.put_slice(&left[..take]);
                this.read_at += take;
                return Poll::Ready(Ok(()));
            }
            if this.targets.is_passthrough() {
                return Pin::new(&mut this.stream).poll_read(cx, buf);
            }
            // Straight into the caller's buffer; replaced only when a
            // target in it had to be encoded.
            let before = buf.filled().len();
            std::task::ready!(Pin::new(&mut this.stream).poll_read(cx, buf))?;
            let read = &buf.filled()[before..];
            if read.is_empty() {
                return Poll::Ready(Ok(()));
            }
            this.rewritten.clear();
            this.read_at = 0;
            this.targets.feed(read, &mut this.rewritten);
            if this.rewritten.as_slice() == read {
                this.rewritten.clear();
                return Poll::Ready(Ok(()));
            }
            buf.set_filled(before);
        }
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match std::task::ready!(this.poll_judge(cx, buf))? {
            Write::Pass => Pin::new(&mut this.stream).poll_write(cx, buf),
            Write::Held(n) => Poll::Ready(Ok(n)),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.refusals.is_passthrough() {
            return Pin::new(&mut this.stream).poll_flush(cx);
        }
        this.refusals.flushing();
        std::task::ready!(this.poll_pending(cx))?;
        std::task::ready!(Pin::new(&mut this.stream).poll_flush(cx))?;
        this.refusals.flushed(*lock(&this.exchanges));
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.refusals.flushing();
        std::task::ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        // A write is judged by where it starts: passed, it goes whole; held,
        // only its first slice is taken.
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &**b);
        match std::task::ready!(this.poll_judge(cx, first))? {
            Write::Pass => Pin::new(&mut this.stream).poll_write_vectored(cx, bufs),
            Write::Held(n) => Poll::Ready(Ok(n)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Serves `app` on `listener` until `shutdown` completes; `overflow`
/// answers connections past the caps.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    overflow: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let slots = Arc::new(Mutex::new(Slots::default()));
    let connections = TaskTracker::new();
    let stop = CancellationToken::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // A connection that failed before it was accepted is
                    // the client's business; anything else (out of
                    // descriptors despite the cap) is logged and waited out.
                    if !matches!(e.kind(), io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset) {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Some(slot) = acquire(&slots, &limits, peer.ip()) else {
            tracing::debug!(%peer, "connection refused: every slot, overflow included, is taken");
            continue;
        };
        // Events are small writes that must leave at once: no Nagle delay.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let kind = slot.kind;
        let (service, header_timeout) = match kind {
            Kind::Full => (app.clone(), limits.header_timeout),
            Kind::Overflow => (overflow.clone(), OVERFLOW_HEADER_TIMEOUT),
        };
        let stop = stop.clone();
        connections.spawn(async move {
            // The protocol is read from the first bytes, before HTTP/1.1's
            // header deadline starts: they too must come in time, or a
            // connection that sends nothing would hold its slot for ever.
            // (`readable()` may answer before any byte came; a peek waits.)
            let mut first = [0u8; 1];
            if tokio::time::timeout(header_timeout, stream.peek(&mut first))
                .await
                .is_err()
            {
                tracing::debug!("connection closed: nothing sent within the header deadline");
                return;
            }
            let exchanges = SharedExchanges::default();
            let io = TokioIo::new(Counted::new(stream, slot, exchanges.clone()));
            let service = Watched::new(TowerToHyperService::new(service), exchanges);
            // HTTP/1.1, or HTTP/2 with prior knowledge (gRPC clients).
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .keep_alive(kind == Kind::Full);
            builder
                .http2()
                .timer(TokioTimer::new())
                .keep_alive_interval(Some(H2_PING_EVERY));
            let connection = builder.serve_connection_with_upgrades(io, service);
            tokio::pin!(connection);
            let served = tokio::select! {
                served = connection.as_mut() => served,
                _ = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = served {
                tracing::trace!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    stop.cancel();
    connections.close();
    connections.wait().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per_client: usize) -> Limits {
        Limits {
            max_connections: max,
            max_connections_per_client: per_client,
            header_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn zeros_resolve_from_the_open_file_limit() {
        let config = crate::config::HttpConfig::default();
        let resolved = Limits::new(&config, 20_000);
        assert_eq!(resolved.max_connections, 18_000);
        assert_eq!(resolved.max_connections_per_client, 9_000);
        let small = Limits::new(&config, 1024);
        assert_eq!(small.max_connections, 768);
    }

    #[test]
    fn caps_hold_overall_and_per_client_then_overflow_then_refuse() {
        let slots = Arc::new(Mutex::new(Slots::default()));
        let limits = limits(3, 2);
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let kinds = |n: usize, client: IpAddr| -> Vec<Option<Slot>> {
            (0..n).map(|_| acquire(&slots, &limits, client)).collect()
        };
        let held_a = kinds(2 + OVERFLOW_PER_CLIENT + 1, a);
        let of_a: Vec<_> = held_a.iter().map(|s| s.as_ref().map(|s| s.kind)).collect();
        assert_eq!(&of_a[..2], [Some(Kind::Full), Some(Kind::Full)]);
        assert!(
            of_a[2..2 + OVERFLOW_PER_CLIENT]
                .iter()
                .all(|k| *k == Some(Kind::Overflow))
        );
        assert_eq!(of_a.last(), Some(&None));
        // Another client still gets the last full slot, then overflow.
        let held_b = kinds(2, b);
        assert_eq!(held_b[0].as_ref().map(|s| s.kind), Some(Kind::Full));
        assert_eq!(held_b[1].as_ref().map(|s| s.kind), Some(Kind::Overflow));
        drop(held_a);
        drop(held_b);
        let counts = slots.lock().unwrap();
        assert_eq!((counts.full.total, counts.overflow.total), (0, 0));
        assert!(counts.full.per_client.is_empty() && counts.overflow.per_client.is_empty());
    }
}
