//! The bus: subjects to publish and subscribe to, and a KV with
//! revisions, each tenant (API key) in its own namespace.
//!
//! - [`subject`]: subjects (`.` or `/` separated) and wildcard patterns.
//! - [`Bus`]: the seam — publish (fire-and-forget, answers the `seq`) and
//!   subscribe from new messages, a `seq` or a time. The embedded
//!   implementation ([`EmbeddedBus`]) fans out in process and keeps durable
//!   subjects in the store; [`NatsBus`] puts the same seam on NATS
//!   JetStream, shared by the replicas of a scale-out.
//! - [`kv`]: keys with revisions, compare-and-set, watch and wait.
//! - `retention`: the durable subjects' retentions (`[bus]` itself is
//!   [`crate::config::BusConfig`]).
//!
//! A subscriber gets each subject's messages in publish order with their
//! per-subject `seq`. A slow subscriber never slows a publisher: past its
//! buffer it catches up from the store on durable subjects and is told
//! what it missed (a [`Delivery::Lagged`]) on the others.

mod embedded;
pub mod kv;
mod nats;
mod retention;
mod storage;
pub mod subject;
mod subscription;

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use serde::Serialize;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

pub use crate::config::{BusConfig, Durable};
pub use embedded::EmbeddedBus;
pub use kv::{Kv, KvChange};
pub use nats::{NatsBus, NatsFiles};
pub use retention::check_durables;
pub use storage::{MeteredBus, StorageError, StorageMeter};
pub use subject::{Pattern, Subject, SubjectError};

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error(transparent)]
    Subject(#[from] SubjectError),
    #[error("the payload has {size} bytes; the bus takes at most {max}")]
    TooLarge { size: usize, max: usize },
    #[error("the bus is shut down")]
    Closed,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("NATS: {0}")]
    Nats(#[source] async_nats::Error),
    /// The namespace's key is past its `storage_mb`.
    #[error(transparent)]
    Quota(crate::quota::QuotaExceeded),
}

/// What every bus checks before it takes a message.
fn admit(payload: &Bytes, max: usize, shutdown: &CancellationToken) -> Result<(), BusError> {
    if payload.len() > max {
        return Err(BusError::TooLarge {
            size: payload.len(),
            max,
        });
    }
    if shutdown.is_cancelled() {
        return Err(BusError::Closed);
    }
    Ok(())
}

/// One published message.
#[derive(Debug)]
pub struct Message {
    pub subject: Subject,
    /// Dense from 1 per subject (and namespace).
    pub seq: u64,
    pub time: DateTime<Utc>,
    pub payload: Bytes,
    /// The message as one JSON object, made once for every subscriber.
    json: OnceLock<Bytes>,
}

/// How a message looks on the HTTP and WebSocket APIs.
#[derive(Serialize)]
struct MessageJson<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    subject: &'a str,
    seq: u64,
    time: DateTime<Utc>,
    /// The payload when it is JSON.
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<&'a RawValue>,
    /// The payload base64-encoded when it is not JSON (gRPC publishers
    /// may send any bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    data_base64: Option<String>,
}

impl Message {
    pub fn new(subject: Subject, seq: u64, time: DateTime<Utc>, payload: Bytes) -> Message {
        Message {
            subject,
            seq,
            time,
            payload,
            json: OnceLock::new(),
        }
    }

    /// `{"type":"message","subject","seq","time","data"|"data_base64"}`.
    pub fn json(&self) -> Bytes {
        self.json
            .get_or_init(|| {
                let text = std::str::from_utf8(&self.payload).ok();
                let data = text.and_then(|t| serde_json::from_str::<&RawValue>(t).ok());
                let data_base64 = data.is_none().then(|| {
                    use base64::Engine;
                    base64::engine::general_purpose::STANDARD.encode(&self.payload)
                });
                let json = MessageJson {
                    kind: "message",
                    subject: self.subject.as_str(),
                    seq: self.seq,
                    time: self.time,
                    data,
                    data_base64,
                };
                Bytes::from(serde_json::to_vec(&json).unwrap_or_default())
            })
            .clone()
    }
}

/// What a subscriber receives.
#[derive(Debug, Clone)]
pub enum Delivery {
    Message(Arc<Message>),
    /// The subscriber fell behind on a subject that is not kept: `missed`
    /// messages after `since` (the last `seq` it received) are gone.
    Lagged {
        subject: String,
        since: u64,
        missed: u64,
    },
}

impl Delivery {
    pub fn json(&self) -> Bytes {
        match self {
            Delivery::Message(message) => message.json(),
            Delivery::Lagged {
                subject,
                since,
                missed,
            } => Bytes::from(
                serde_json::json!({
                    "type": "lagged",
                    "subject": subject,
                    "since": since,
                    "missed": missed,
                })
                .to_string(),
            ),
        }
    }

    /// The message's `seq`; none for a lag.
    pub fn seq(&self) -> Option<u64> {
        match self {
            Delivery::Message(m) => Some(m.seq),
            Delivery::Lagged { .. } => None,
        }
    }

    pub fn type_name(&self) -> &'static str {
        match self {
            Delivery::Message(_) => "message",
            Delivery::Lagged { .. } => "lagged",
        }
    }
}

/// Where a subscription starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Since {
    /// Messages published from now on.
    #[default]
    New,
    /// Kept messages with a greater `seq` on each subject, then new ones
    /// (`Seq(0)`: everything kept).
    Seq(u64),
    /// Kept messages published at or after this time, then new ones.
    Time(DateTime<Utc>),
}

impl Since {
    /// `new`, a `seq`, or an RFC 3339 time.
    pub fn parse(text: &str) -> Result<Since, String> {
        let text = text.trim();
        if text.is_empty() || text == "new" {
            return Ok(Since::New);
        }
        if text == "all" {
            return Ok(Since::Seq(0));
        }
        if let Ok(seq) = text.parse::<u64>() {
            return Ok(Since::Seq(seq));
        }
        DateTime::parse_from_rfc3339(text)
            .map(|t| Since::Time(t.with_timezone(&Utc)))
            .map_err(|_| {
                format!("since must be `new`, `all`, a seq or an RFC 3339 time, not {text:?}")
            })
    }
}

/// The bus seam, one namespace per tenant.
#[async_trait]
pub trait Bus: Send + Sync {
    /// Publishes and answers the message's `seq` at once; subscribers get
    /// it after, and the store keeps it if the subject is durable.
    async fn publish(
        &self,
        namespace: &str,
        subject: &Subject,
        payload: Bytes,
    ) -> Result<u64, BusError>;

    /// The messages of subjects matching any of `patterns`.
    async fn subscribe(
        &self,
        namespace: &str,
        patterns: Vec<Pattern>,
        since: Since,
    ) -> Result<BoxStream<'static, Delivery>, BusError>;

    /// Waits until every message published so far to a durable subject
    /// is stored.
    async fn flush(&self) -> Result<(), BusError>;

    /// The largest payload accepted.
    fn max_payload(&self) -> usize;

    /// Answers once the bus can take messages: what the readiness probe
    /// asks (a shared bus: its server answered).
    async fn ping(&self) -> Result<(), BusError>;

    /// The bytes of `namespace`'s kept messages that live outside the
    /// store (the store counts its own): none for the embedded bus.
    async fn kept_bytes(&self, _namespace: &str) -> Result<u64, BusError> {
        Ok(0)
    }
}

#[cfg(test)]
mod tests;
