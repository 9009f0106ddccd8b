//! The server's JSON error for the requests the HTTP/1 parser refuses.
//!
//! hyper answers a request head it cannot read (a malformed request line,
//! a control character in the target, an invalid header, a head past its
//! bounds) itself, before any route runs, with a bodiless `400`, `414` or
//! `431`, and offers no hook to change that answer. So a connection's
//! writes are watched. hyper reads the next request head only once the
//! previous response is out in full (written and flushed), and a request
//! it has read goes to the service before anything is written for it: a
//! write that starts while every request handed to the service has its
//! response out is hyper's own. [`Exchanges`] keeps that count
//! ([`Watched`] around the service, [`Tracked`] around each response
//! body); [`Refusals`] holds such a write, and when it is hyper's
//! bodiless refusal, sends the same status with the server's JSON error
//! and `connection: close` in its place (hyper closes the connection
//! after it). Every other byte passes as it is, and after an upgrade or on
//! HTTP/2 nothing is held at all.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::http::{Response, StatusCode};
use hyper::body::{Body, Frame, SizeHint};

use crate::api::http::error::ApiError;
use crate::sync::lock;

/// The most bytes held while a write might be hyper's refusal; its own is
/// about 100.
const MAX_HELD: usize = 1024;

/// Where a connection's requests stand with the service.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Exchanges {
    /// Requests handed to the service so far.
    calls: u64,
    /// Those whose response is not out in full yet (its body not done).
    open: usize,
    /// A response switched protocols: the bytes are no longer HTTP/1's.
    upgraded: bool,
}

pub(super) type SharedExchanges = Arc<Mutex<Exchanges>>;

/// One request with the service, until its response body is done.
struct Open(SharedExchanges);

impl Open {
    fn new(exchanges: &SharedExchanges) -> Open {
        let mut now = lock(exchanges);
        now.calls += 1;
        now.open += 1;
        Open(exchanges.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        lock(&self.0).open -= 1;
    }
}

/// A service whose requests are counted in [`Exchanges`].
pub(super) struct Watched<S> {
    inner: S,
    exchanges: SharedExchanges,
}

impl<S> Watched<S> {
    pub(super) fn new(inner: S, exchanges: SharedExchanges) -> Watched<S> {
        Watched { inner, exchanges }
    }
}

type Answer<B, E> = Pin<Box<dyn Future<Output = Result<Response<Tracked<B>>, E>> + Send>>;

impl<S, R, B> hyper::service::Service<R> for Watched<S>
where
    S: hyper::service::Service<R, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<Tracked<B>>;
    type Error = S::Error;
    type Future = Answer<B, S::Error>;

    fn call(&self, request: R) -> Self::Future {
        let open = Open::new(&self.exchanges);
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                lock(&open.0).upgraded = true;
            }
            Ok(response.map(|body| Tracked { body, _open: open }))
        })
    }
}

/// A response body that keeps its request counted open until hyper is
/// done with it; its frames and size are the inner body's, unchanged.
pub(super) struct Tracked<B> {
    body: B,
    _open: Open,
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// What becomes of one write.
#[derive(Debug, PartialEq)]
pub(super) enum Write {
    /// To the socket as it is.
    Pass,
    /// Held (this many bytes of it): it may be hyper's refusal.
    Held(usize),
}

#[derive(Debug)]
enum Out {
    /// Writes pass; one that starts while no request is open is held.
    Watching,
    /// A write that may be hyper's refusal, up to its blank line.
    Holding(Vec<u8>),
    /// Bytes to send before any other, from `at` on.
    Sending { bytes: Vec<u8>, at: usize },
    /// Everything passes: HTTP/2, an upgrade, or the refusal sent.
    Passthrough,
}

/// One connection's writes, with hyper's refusals in JSON.
#[derive(Debug)]
pub(super) struct Refusals {
    out: Out,
    /// `calls` at the last flush with no response going out.
    settled: u64,
}

impl Default for Refusals {
    fn default() -> Self {
        Refusals {
            out: Out::Watching,
            settled: 0,
        }
    }
}

impl Refusals {
    /// Whether every later byte passes as it is.
    pub(super) fn is_passthrough(&self) -> bool {
        matches!(self.out, Out::Passthrough)
    }

    /// Bytes to send before any write (or flush) goes on.
    pub(super) fn pending(&self) -> &[u8] {
        match &self.out {
            Out::Sending { bytes, at } => &bytes[*at..],
            _ => &[],
        }
    }

    /// `n` bytes of [`Refusals::pending`] went out.
    pub(super) fn sent(&mut self, n: usize) {
        if let Out::Sending { bytes, at } = &mut self.out {
            *at += n;
            if *at >= bytes.len() {
                self.out = Out::Passthrough;
            }
        }
    }

    /// What becomes of `buf`, hyper's next write, once nothing is pending;
    /// `now` tells where the exchanges stand and whether the connection
    /// speaks HTTP/2.
    pub(super) fn write(&mut self, buf: &[u8], now: impl FnOnce() -> (Exchanges, bool)) -> Write {
        match self.out {
            Out::Watching if !buf.is_empty() => {
                let (now, http2) = now();
                if http2 || now.upgraded {
                    self.out = Out::Passthrough;
                    return Write::Pass;
                }
                if now.open > 0 || now.calls != self.settled {
                    return Write::Pass;
                }
                self.out = Out::Holding(Vec::new());
                self.hold(buf)
            }
            Out::Holding(_) => self.hold(buf),
            _ => Write::Pass,
        }
    }

    fn hold(&mut self, buf: &[u8]) -> Write {
        let Out::Holding(held) = &mut self.out else {
            return Write::Pass;
        };
        let take = buf.len().min(MAX_HELD - held.len());
        held.extend_from_slice(&buf[..take]);
        const START: &[u8] = b"HTTP/1.";
        let start = held.len().min(START.len());
        if held[..start] != START[..start] {
            self.release();
        } else if let Some(end) = held.windows(4).position(|w| w == b"\r\n\r\n") {
            match in_json(held, end) {
                Some(bytes) => self.out = Out::Sending { bytes, at: 0 },
                None => self.release(),
            }
        } else if held.len() >= MAX_HELD {
            self.release();
        }
        Write::Held(take)
    }

    /// What is held goes out as it came; nothing is held after.
    fn release(&mut self) {
        if let Out::Holding(held) = &mut self.out {
            let bytes = std::mem::take(held);
            self.out = if bytes.is_empty() {
                Out::Passthrough
            } else {
                Out::Sending { bytes, at: 0 }
            };
        }
    }

    /// Before a flush or a shutdown: hyper's refusal comes whole before
    /// either, so a write still held then is something else.
    pub(super) fn flushing(&mut self) {
        self.release();
    }

    /// After a flush: with no response going out, all of the last one has
    /// been written, and the next write not preceded by a call is hyper's.
    pub(super) fn flushed(&mut self, now: Exchanges) {
        if now.open == 0 {
            self.settled = now.calls;
        }
    }
}

/// hyper's bodiless refusal (`head` ends at `end`) as the server's JSON
/// error, or `None` when it is anything else.
fn in_json(head: &[u8], end: usize) -> Option<Vec<u8>> {
    if head.len() != end + 4 {
        return None;
    }
    let head = std::str::from_utf8(&head[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let status = StatusCode::from_bytes(status_line.split(' ').nth(1)?.as_bytes()).ok()?;
    let (code, message) = match status {
        StatusCode::BAD_REQUEST => (
            "bad_request",
            "the request's head is not valid HTTP/1.1: its request line (method, target, \
             version) or a header is malformed or holds a control character",
        ),
        StatusCode::URI_TOO_LONG => (
            "uri_too_long",
            "the request target is longer than the server reads (65,534 bytes)",
        ),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => (
            "headers_too_large",
            "the request's headers are more than the server reads (100 headers, about 400 KiB)",
        ),
        _ => return None,
    };
    let mut date = None;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "content-length" if value == "0" => {}
            "connection" if value.eq_ignore_ascii_case("close") => {}
            "date" => date = Some(value),
            _ => return None,
        }
    }
    let body = serde_json::to_vec(&ApiError::new(status, code, message).body()).ok()?;
    let mut out = format!(
        "{status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    if let Some(date) = date {
        out.push_str(&format!("date: {date}\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(&body);
    Some(out)
}

#[cfg(test)]
#[path = "refusal_tests.rs"]
mod tests;
