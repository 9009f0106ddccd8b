//! The span of a gateway call, made with the OpenTelemetry SDK directly
//! rather than through `tracing`: the gateway is the hot path, and its
//! export must cost next to nothing a call.
//!
//! A call its first attempt serves is one span, `gateway {pool}`, that
//! names the replica, the attempt (1) and the status; that replica is
//! sent the span's context. A call that takes more attempts gets a child
//! span for each, `chat {pool} attempt {n}`: the first is made when it
//! fails (from its start time; its replica had the call's context), the
//! later ones before they are sent (their replicas get their context).

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{Span as SdkSpan, Tracer as SdkTracer};

use super::otel::{self, Parent};

/// A gateway call's span; inert while export is off.
pub struct CallSpan(Option<Live>);

struct Live {
    tracer: &'static SdkTracer,
    span: SdkSpan,
    /// The call's context, parent of its attempts.
    cx: Context,
    pool: String,
    attempts: u32,
}

/// One attempt of a call: the context its replica is sent.
pub struct Attempt {
    number: u32,
    started: SystemTime,
    replica: String,
    url: String,
    /// The model the replica serves under its own name.
    model: String,
    /// Attempts after the first have a span from the start.
    span: Option<SdkSpan>,
    cx: Option<Context>,
}

/// How an attempt ended: the replica's status, if it answered.
pub enum Outcome {
    Answered(u16),
    Failed(Option<u16>),
}

fn kv(key: &'static str, value: impl Into<opentelemetry::Value>) -> KeyValue {
    KeyValue::new(key, value)
}

impl CallSpan {
    /// The span of a call while export is off: nothing.
    pub fn off() -> Self {
        CallSpan(None)
    }

    /// Starts the span of a call of `pool`, under `parent`.
    pub fn start(pool: &str, session_id: Option<&str>, parent: &Parent) -> Self {
        let Some(tracer) = otel::tracer() else {
            return CallSpan(None);
        };
        let (kind, parent_cx) = match parent {
            Parent::Current => (SpanKind::Internal, Context::current()),
            Parent::Request(cx) => (SpanKind::Server, cx.clone().unwrap_or_default()),
        };
        let mut attributes = Vec::with_capacity(8);
        attributes.push(kv("gen_ai.operation.name", "chat"));
        attributes.push(kv("gen_ai.request.model", pool.to_string()));
        if let Some(id) = session_id {
            attributes.push(kv("gen_ai.conversation.id", id.to_string()));
        }
        let builder = tracer
            .span_builder(format!("gateway {pool}"))
            .with_kind(kind)
            .with_attributes(attributes);
        let span = tracer.build_with_context(builder, &parent_cx);
        let cx = parent_cx.with_remote_span_context(span.span_context().clone());
        CallSpan(Some(Live {
            tracer,
            span,
            cx,
            pool: pool.to_string(),
            attempts: 0,
        }))
    }

    /// Begins attempt `number` on `replica`, which serves `model`.
    pub fn attempt(&mut self, number: u32, replica: &str, url: &str, model: &str) -> Attempt {
        let Some(live) = &mut self.0 else {
            return Attempt {
                number,
                started: SystemTime::UNIX_EPOCH,
                replica: String::new(),
                url: String::new(),
                model: String::new(),
                span: None,
                cx: None,
            };
        };
        live.attempts = number;
        let started = SystemTime::now();
        let mut attempt = Attempt {
            number,
            started,
            replica: replica.to_string(),
            url: url.to_string(),
            model: model.to_string(),
            span: None,
            cx: Some(live.cx.clone()),
        };
        if number > 1 {
            let span = live.child(&attempt, started);
            attempt.cx = Some(
                live.cx
                    .with_remote_span_context(span.span_context().clone()),
            );
            attempt.span = Some(span);
        }
        attempt
    }

    /// Ends `attempt`: on the call's span when the first attempt served
    /// the call, else on the attempt's own span.
    pub fn attempt_ended(&mut self, mut attempt: Attempt, outcome: Outcome) {
        let Some(live) = &mut self.0 else {
            return;
        };
        let status = match outcome {
            Outcome::Answered(status) => Some(status),
            Outcome::Failed(status) => status,
        };
        let failed = matches!(outcome, Outcome::Failed(_));
        let mut span = match attempt.span.take() {
            Some(span) => span,
            None if !failed => {
                let span = &mut live.span;
                span.set_attributes(attempt.attributes());
                if let Some(status) = status {
                    span.set_attribute(kv("http.response.status_code", i64::from(status)));
                }
                return;
            }
            None => live.child(&attempt, attempt.started),
        };
        if let Some(status) = status {
            span.set_attribute(kv("http.response.status_code", i64::from(status)));
        }
        if failed {
            let error = status.map_or(Cow::Borrowed("unreachable"), |s| s.to_string().into());
            span.set_attribute(kv("error.type", error.clone()));
            span.set_status(Status::error(error));
        }
        span.end();
    }

    /// Ends the call: the replica that served it, or why it failed.
    pub fn end(mut self, replica: Option<&str>, error: Option<Cow<'static, str>>) {
        let Some(live) = &mut self.0 else {
            return;
        };
        let span = &mut live.span;
        if let Some(replica) = replica {
            span.set_attribute(kv("conclave.gateway.replica", replica.to_string()));
        }
        span.set_attribute(kv("conclave.gateway.attempts", i64::from(live.attempts)));
        if let Some(error) = error {
            span.set_attribute(kv("error.type", error.clone()));
            span.set_status(Status::error(error));
        }
        span.end();
    }
}

impl Live {
    /// A span of `attempt`, child of the call, from `started`.
    fn child(&self, attempt: &Attempt, started: SystemTime) -> SdkSpan {
        let mut attributes = attempt.attributes();
        attributes.push(kv("gen_ai.operation.name", "chat"));
        attributes.push(kv("gen_ai.request.model", self.pool.clone()));
        let builder = self
            .tracer
            .span_builder(format!("chat {} attempt {}", self.pool, attempt.number))
            .with_kind(SpanKind::Client)
            .with_start_time(started)
            .with_attributes(attributes);
        self.tracer.build_with_context(builder, &self.cx)
    }
}

impl Attempt {
    /// The trace context to send the replica (`None` while not exporting).
    pub fn context(&self) -> Option<&Context> {
        self.cx.as_ref()
    }

    /// The replica, attempt number, address and model of the attempt.
    fn attributes(&self) -> Vec<KeyValue> {
        vec![
            kv("conclave.gateway.replica", self.replica.clone()),
            kv("conclave.gateway.attempt", i64::from(self.number)),
            kv("server.address", self.url.clone()),
            kv("gen_ai.response.model", self.model.clone()),
        ]
    }
}
