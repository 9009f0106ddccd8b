//! [`TracedBody`]: an upstream response body on its way to the client,
//! recording the call's trace and figures as it passes.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, SizeHint};

use super::client::{BodyError, BoxError};

use super::pool::CallGuard;
use super::trace::{Recorder, TraceLog};
use crate::telemetry::Metrics;

/// An upstream body passed on to the client, recording the call's trace
/// and figures when it ends (or when the client goes away). An HTTP body
/// itself (a stream would be wrapped again to be sent), with the
/// replica's length as its size.
pub struct TracedBody {
    pub(super) inner: super::client::Body,
    pub(super) recorder: Option<Recorder>,
    pub(super) call: Option<CallGuard>,
    pub(super) traces: Option<Arc<TraceLog>>,
    pub(super) metrics: Option<Arc<Metrics>>,
    /// The pool of the replica that answered.
    pub(super) pool: Option<Arc<super::pool::Pool>>,
    /// The call's place at its pool's weight gate, held until the
    /// response has been passed on.
    pub(super) _admitted: Option<super::weights::Admission>,
    /// Told the finished trace (the API's gateway routes count usage).
    pub(super) on_done: Option<OnDone>,
}

/// What is told a call's finished trace.
pub type OnDone = Box<dyn FnOnce(&super::trace::Trace) + Send + Sync>;

impl TracedBody {
    /// A body already read (an upstream error passed on), traced already.
    pub(super) fn ready(body: Bytes) -> TracedBody {
        TracedBody {
            inner: Full::new(body)
                .map_err(|never| -> BoxError { match never {} })
                .boxed_unsync(),
            recorder: None,
            call: None,
            traces: None,
            metrics: None,
            pool: None,
            _admitted: None,
            on_done: None,
        }
    }

    /// Tells `done` the call's trace once the body has passed (not for a
    /// body already read: a failed call's, which reports no usage).
    pub fn on_done(&mut self, done: OnDone) {
        if self.recorder.is_some() {
            self.on_done = Some(done);
        }
    }

    /// Records the trace and the replica's figures, once.
    fn finish(&mut self, status: &'static str, error: Option<String>) {
        let Some(recorder) = self.recorder.take() else {
            return;
        };
        let status = match recorder.trace.http_status {
            Some(code) if code >= 400 && status == "ok" => "error",
            _ => status,
        };
        let trace = recorder.finish(status, error);
        if let (Some(call), Some(metrics), Some(pool)) =
            (self.call.take(), &self.metrics, &self.pool)
        {
            let figures = call.replica.figures(metrics, &pool.name);
            let (calls, latency) = match status {
                "error" => &figures.error,
                _ => &figures.ok,
            };
            calls.inc();
            latency.observe(trace.latency_ms / 1000.0);
        }
        if let Some(done) = self.on_done.take() {
            done(&trace);
        }
        if let Some(traces) = &self.traces {
            traces.push(trace);
        }
    }
}

impl Body for TracedBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(chunk), Some(recorder)) = (frame.data_ref(), self.recorder.as_mut()) {
                    recorder.feed(chunk);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => {
                let error = BodyError::from(error);
                self.finish("error", Some(error.0.clone()));
                Poll::Ready(Some(Err(error)))
            }
            Poll::Ready(None) => {
                self.finish("ok", None);
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for TracedBody {
    fn drop(&mut self) {
        if self.recorder.as_ref().is_some_and(|r| r.done) {
            self.finish("ok", None);
        } else {
            self.finish(
                "cancelled",
                Some("the client went away before the end".into()),
            );
        }
    }
}
