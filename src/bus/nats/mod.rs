//! The bus on NATS JetStream, shared by every replica connected to one
//! NATS server.
//!
//! - [`names`]: how namespaces, subjects and durable classes are named
//!   there (`<prefix>.bus.<namespace>.<class>.<tokens>`, one stream per
//!   class).
//! - [`subscription`]: ordered consumers, one per class a subscription
//!   may read, pumped into one bounded queue.
//! - [`files`]: files every replica reads, in an object store bucket.
//! - [`kv_peers`]: KV writes told to the other replicas over core NATS.
//!
//! Every message, kept or not, is stored in its class's stream, whose
//! last message of a subject carries the subject's `seq`: a publish sends
//! the next `seq` with `Nats-Expected-Last-Subject-Sequence`, so of two
//! replicas publishing to one subject at once one wins and the other reads
//! the new last message and tries again, and the `seq`s stay dense. The
//! stream of subjects that are not kept lives in memory and holds the last
//! `subscriber_buffer` messages per subject.
//!
//! The bus outlives its broker: a publish that finds its class's stream
//! gone (a NATS server restarted, whose memory stream went with it)
//! creates it again and tries once more; every reconnect of the client
//! is counted, and each subscription's consumers are made again from
//! where they were ([`subscription`]). `ping` fails while the client is
//! disconnected or any consumer is being made again, so `/ready` says so.

mod files;
mod kv_peers;
mod names;
mod subscription;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_nats::jetstream::{self, context::PublishErrorKind, stream::LastRawMessageErrorKind};
use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::kv::Kv;
use super::{Bus, BusError, Delivery, Pattern, Since, Subject};
use crate::config::BusConfig;
use crate::store::Store;
use crate::sync::lock;
use crate::telemetry::{BusLabel, Metrics};
pub use files::NatsFiles;
use names::Names;

/// The header with the message's per-subject `seq`.
const SEQ: &str = "Conclave-Seq";
/// The header with the subject as the publisher wrote it, encoded.
const WRITTEN: &str = "Conclave-Subject";
/// Room left in NATS's largest message for the headers.
const HEADER_ROOM: usize = 4096;
/// Publishes of one subject tried before giving up: each failed try means
/// another replica's publish to the subject succeeded.
const MAX_TRIES: usize = 1000;
/// A namespace's subjects of one stream whose last message is read to
/// size them when measuring what it keeps; the others are counted at
/// their mean size.
const SIZED_SUBJECTS: usize = 256;
/// Subjects whose last message is remembered before the idle ones are
/// forgotten (and read back from the stream when next published to).
const REMEMBERED: usize = 16_384;

fn nats(error: impl Into<async_nats::Error>) -> BusError {
    BusError::Nats(error.into())
}

/// The last message of a subject: its stream sequence and its `seq`.
#[derive(Debug, Clone, Copy, Default)]
struct Last {
    stream_seq: u64,
    seq: u64,
}

type Slot = Arc<tokio::sync::Mutex<Option<Last>>>;

pub(super) struct Shared {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    names: Names,
    /// The stream of each class, as `names.classes()`.
    streams: Vec<jetstream::stream::Stream>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    max_payload: usize,
    buffer: usize,
    /// Each subject's last message, as this replica last saw it; a
    /// subject's publishes queue on its slot.
    last: Mutex<HashMap<String, Slot>>,
    /// Counts the client's reconnects: each subscription makes its
    /// consumers again when it moves.
    reconnects: tokio::sync::watch::Receiver<u64>,
    /// Whether the client is connected now.
    connected: Arc<AtomicBool>,
    /// Subscription consumers being made again now.
    down: AtomicUsize,
}

/// The [`Bus`] on NATS JetStream.
pub struct NatsBus(Arc<Shared>);

impl NatsBus {
    /// Connects, checks that JetStream answers and creates (or updates)
    /// each class's stream. Subjects and streams start with `prefix`.
    pub async fn connect(
        url: &str,
        prefix: &str,
        config: &BusConfig,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> Result<NatsBus, BusError> {
        let (moved, reconnects) = tokio::sync::watch::channel(0u64);
        let connected = Arc::new(AtomicBool::new(true));
        let moved = Arc::new(moved);
        let state = connected.clone();
        let client = async_nats::ConnectOptions::new()
            .name("conclave")
            .event_callback(move |event| {
                let (moved, state) = (moved.clone(), state.clone());
                async move {
                    match event {
                        async_nats::Event::Connected => {
                            tracing::info!("the bus is connected to NATS again");
                            state.store(true, Ordering::SeqCst);
                            moved.send_modify(|count| *count += 1);
                        }
                        async_nats::Event::Disconnected => {
                            tracing::warn!("the bus lost its NATS connection; reconnecting");
                            state.store(false, Ordering::SeqCst);
                        }
                        _ => {}
                    }
                }
            })
            .connect(url)
            .await
            .map_err(nats)?;
        let jetstream = jetstream::new(client.clone());
        jetstream.query_account().await.map_err(|e| {
            BusError::Nats(format!("JetStream does not answer (is it enabled, -js?): {e}").into())
        })?;
        let names = Names::new(prefix, config);
        let mut streams = Vec::new();
        for class in names.classes() {
            let wanted = class.stream_config();
            let mut stream = jetstream
                .get_or_create_stream(wanted.clone())
                .await
                .map_err(nats)?;
            let info = stream.info().await.map_err(nats)?;
            let current = &info.config;
            if current.max_messages_per_subject != wanted.max_messages_per_subject
                || current.max_age != wanted.max_age
            {
                jetstream
                    .update_stream(wanted.clone())
                    .await
                    .map_err(nats)?;
            }
            streams.push(stream);
        }
        let server_max = client.server_info().max_payload;
        let max_payload = config
            .max_payload_bytes
            .min(server_max.saturating_sub(HEADER_ROOM));
        if max_payload < config.max_payload_bytes {
            tracing::info!(
                max_payload,
                server_max,
                "bus payloads are limited by the NATS server's max_payload"
            );
        }
        Ok(NatsBus(Arc::new(Shared {
            client,
            jetstream,
            names,
            streams,
            metrics,
            shutdown,
            max_payload,
            buffer: config.subscriber_buffer,
            last: Mutex::new(HashMap::new()),
            reconnects,
            connected,
            down: AtomicUsize::new(0),
        })))
    }

    /// The KV in `store`, its writes told to every replica on this NATS
    /// and theirs to this one's watchers and waiters (a task on `tasks`
    /// listens until shutdown).
    pub async fn kv(
        &self,
        store: Arc<dyn Store>,
        max_value: usize,
        meter: Option<Arc<crate::bus::StorageMeter>>,
        tasks: &TaskTracker,
    ) -> Result<Arc<Kv>, BusError> {
        kv_peers::start(&self.0, store, max_value, meter, tasks).await
    }
}

impl Shared {
    fn slot(&self, subject: &str) -> Slot {
        let mut last = lock(&self.last);
        if last.len() >= REMEMBERED && !last.contains_key(subject) {
            last.retain(|_, slot| Arc::strong_count(slot) > 1);
        }
        last.entry(subject.to_owned()).or_default().clone()
    }

    /// Creates the class's stream if it is not there (a NATS server that
    /// restarted lost the memory one), with the configuration it had.
    async fn ensure_stream(&self, class: usize) -> Result<(), BusError> {
        let config = self.names.classes()[class].stream_config().clone();
        self.jetstream
            .get_or_create_stream(config)
            .await
            .map_err(nats)?;
        Ok(())
    }

    /// The subject's last message in its class's stream.
    async fn read_last(&self, class: usize, subject: &str) -> Result<Last, BusError> {
        let mut ensured = false;
        let raw = loop {
            match self.streams[class]
                .get_last_raw_message_by_subject(subject)
                .await
            {
                Ok(raw) => break raw,
                Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => {
                    return Ok(Last::default());
                }
                Err(err) if !ensured => {
                    tracing::debug!(error = %err, "reading a subject's last message; making sure its stream exists");
                    self.ensure_stream(class).await?;
                    ensured = true;
                }
                Err(err) => return Err(nats(err)),
            }
        };
        let stream_seq = raw.sequence;
        let message = async_nats::Message::try_from(raw).map_err(BusError::Nats)?;
        let seq = message
            .headers
            .as_ref()
            .and_then(|h| h.get(SEQ))
            .and_then(|v| v.as_str().parse().ok())
            .unwrap_or(0);
        Ok(Last { stream_seq, seq })
    }

    async fn publish(
        &self,
        namespace: &str,
        subject: &Subject,
        payload: Bytes,
    ) -> Result<u64, BusError> {
        super::admit(&payload, self.max_payload, &self.shutdown)?;
        let class = self.names.class_of(subject.stream());
        let nats_subject = self
            .names
            .subject(namespace, &self.names.classes()[class], subject);
        let slot = self.slot(&nats_subject);
        let mut last = slot.lock().await;
        let written = names::encode(subject.as_str());
        let mut ensured = false;
        for _ in 0..MAX_TRIES {
            let known = match *last {
                Some(known) => known,
                None => self.read_last(class, &nats_subject).await?,
            };
            let seq = known.seq + 1;
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(SEQ, seq.to_string().as_str());
            headers.insert(WRITTEN, written.as_str());
            headers.insert(
                async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
                known.stream_seq.to_string().as_str(),
            );
            let ack = self
                .jetstream
                .publish_with_headers(nats_subject.clone(), headers, payload.clone())
                .await
                .map_err(nats)?
                .await;
            match ack {
                Ok(ack) => {
                    *last = Some(Last {
                        stream_seq: ack.sequence,
                        seq,
                    });
                    let label = BusLabel {
                        class: self.names.classes()[class].label.clone(),
                    };
                    self.metrics.bus_published.get_or_create(&label).inc();
                    return Ok(seq);
                }
                // Another replica published to the subject meanwhile.
                Err(err) if err.kind() == PublishErrorKind::WrongLastSequence => *last = None,
                // The server restarted without the class's stream.
                Err(err) if err.kind() == PublishErrorKind::StreamNotFound && !ensured => {
                    *last = None;
                    self.ensure_stream(class).await?;
                    ensured = true;
                }
                Err(err) => {
                    *last = None;
                    return Err(nats(err));
                }
            }
        }
        Err(BusError::Nats(
            format!("{MAX_TRIES} publishes to {subject} lost to other replicas'").into(),
        ))
    }
}

#[async_trait]
impl Bus for NatsBus {
    async fn publish(
        &self,
        namespace: &str,
        subject: &Subject,
        payload: Bytes,
    ) -> Result<u64, BusError> {
        self.0.publish(namespace, subject, payload).await
    }

    async fn subscribe(
        &self,
        namespace: &str,
        patterns: Vec<Pattern>,
        since: Since,
    ) -> Result<BoxStream<'static, Delivery>, BusError> {
        if self.0.shutdown.is_cancelled() {
            return Err(BusError::Closed);
        }
        subscription::open(&self.0, namespace, patterns, since).await
    }

    /// A publish answers once its stream has stored the message, so what
    /// is left is what this connection has not sent yet.
    async fn flush(&self) -> Result<(), BusError> {
        self.0.client.flush().await.map_err(nats)
    }

    fn max_payload(&self) -> usize {
        self.0.max_payload
    }

    /// Asks JetStream for the account's state (a round trip to the
    /// server); fails while the client is disconnected or a subscription's
    /// consumers are being made again.
    async fn ping(&self) -> Result<(), BusError> {
        if self.0.shutdown.is_cancelled() {
            return Err(BusError::Closed);
        }
        if !self.0.connected.load(Ordering::SeqCst) {
            return Err(BusError::Nats("not connected to NATS; reconnecting".into()));
        }
        self.0.jetstream.query_account().await.map_err(nats)?;
        let down = self.0.down.load(Ordering::SeqCst);
        if down > 0 {
            return Err(BusError::Nats(
                format!("{down} bus consumers are being made again after a reconnect").into(),
            ));
        }
        Ok(())
    }

    /// JetStream tells messages per subject but not bytes: each durable
    /// stream's count of each of the namespace's subjects, at the size of
    /// that subject's last message (the largest [`SIZED_SUBJECTS`]
    /// subjects are sized so; the rest at their mean). Only the
    /// namespace's own messages are read, so another key's sizes never
    /// weigh on its count.
    async fn kept_bytes(&self, namespace: &str) -> Result<u64, BusError> {
        let mut bytes = 0.0;
        for (index, class) in self.0.names.classes().iter().enumerate() {
            if !class.durable() {
                continue;
            }
            let stream = &self.0.streams[index];
            let name = &stream.cached_info().config.name;
            let filter = self.0.names.filter(namespace, class, None);
            let info: serde_json::Value = self
                .0
                .jetstream
                .request(
                    format!("STREAM.INFO.{name}"),
                    &serde_json::json!({"subjects_filter": filter}),
                )
                .await
                .map_err(nats)?;
            if info.get("state").is_none() {
                return Err(BusError::Nats(format!("STREAM.INFO {name}: {info}").into()));
            }
            let mut subjects: Vec<(String, f64)> = info["state"]["subjects"]
                .as_object()
                .map(|subjects| {
                    subjects
                        .iter()
                        .filter_map(|(subject, n)| Some((subject.clone(), n.as_f64()?)))
                        .collect()
                })
                .unwrap_or_default();
            if subjects.is_empty() {
                continue;
            }
            subjects.sort_by(|a, b| b.1.total_cmp(&a.1));
            let rest: f64 = subjects.iter().skip(SIZED_SUBJECTS).map(|(_, n)| n).sum();
            subjects.truncate(SIZED_SUBJECTS);
            let sized: Vec<(f64, f64)> = futures::stream::iter(subjects)
                .map(|(subject, count)| async move {
                    match stream.get_last_raw_message_by_subject(&subject).await {
                        Ok(raw) => Ok(Some((count, payload_len(&raw.payload) as f64))),
                        // Gone since it was counted (retention, a delete).
                        Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => {
                            Ok(None)
                        }
                        Err(err) => Err(nats(err)),
                    }
                })
                .buffer_unordered(16)
                .try_filter_map(|sized| async move { Ok(sized) })
                .try_collect()
                .await?;
            let (messages, size) = sized.iter().fold((0.0, 0.0), |(m, b), (count, len)| {
                (m + count, b + count * len)
            });
            bytes += size;
            if messages > 0.0 {
                bytes += rest * size / messages;
            }
        }
        Ok(bytes as u64)
    }
}

/// The length of a payload JetStream answered base64-encoded.
fn payload_len(encoded: &str) -> usize {
    let padding = encoded.bytes().rev().take_while(|b| *b == b'=').count();
    (encoded.len() / 4 * 3).saturating_sub(padding)
}
