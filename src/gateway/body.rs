//! [`TracedBody`]: an upstream response body on its way to the client,
//! recording the call's trace and figures as it passes.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::{Stream, TryStreamExt};

use super::client::BodyError;

use super::pool::CallGuard;
use super::trace::{Recorder, TraceLog};
use crate::telemetry::Metrics;

/// An upstream body passed on to the client, recording the call's trace
/// and figures when it ends (or when the client goes away).
pub struct TracedBody {
    pub(super) inner: Pin<Box<dyn Stream<Item = Result<Bytes, BodyError>> + Send>>,
    pub(super) recorder: Option<Recorder>,
    pub(super) call: Option<CallGuard>,
    pub(super) traces: Option<Arc<TraceLog>>,
    pub(super) metrics: Option<Arc<Metrics>>,
    /// The pool of the replica that answered.
    pub(super) pool: Option<Arc<super::pool::Pool>>,
    /// The call's place at its pool's weight gate, held until the
    /// response has been passed on.
    pub(super) _admitted: Option<super::weights::Admission>,
}

impl TracedBody {
    /// The data of a replica's response body.
    pub(super) fn data(
        body: super::client::Body,
    ) -> Pin<Box<dyn Stream<Item = Result<Bytes, BodyError>> + Send>> {
        Box::pin(http_body_util::BodyDataStream::new(body).map_err(BodyError::from))
    }

    /// A body already read (an upstream error passed on), traced already.
    pub(super) fn ready(body: Bytes) -> TracedBody {
        TracedBody {
            inner: Box::pin(futures::stream::iter([Ok(body)])),
            recorder: None,
            call: None,
            traces: None,
            metrics: None,
            pool: None,
            _admitted: None,
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
        if let Some(traces) = &self.traces {
            traces.push(trace);
        }
    }
}

impl Stream for TracedBody {
    type Item = Result<Bytes, BodyError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let next = self.inner.as_mut().poll_next(cx);
        match &next {
            Poll::Ready(Some(Ok(chunk))) => {
                if let Some(recorder) = self.recorder.as_mut() {
                    recorder.feed(chunk);
                }
            }
            Poll::Ready(Some(Err(e))) => {
                let message = e.0.clone();
                self.finish("error", Some(message));
            }
            Poll::Ready(None) => self.finish("ok", None),
            Poll::Pending => {}
        }
        next
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
