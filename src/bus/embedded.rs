//! The embedded bus: fan-out in process, durable subjects in the store.
//!
//! A publish takes the namespace's lock, gives the message the subject's
//! next `seq`, offers it to every matching subscriber's bounded queue and,
//! for a durable subject, queues it for the writer — all under that lock,
//! so every subscriber sees a subject's messages in `seq` order and the
//! store holds them in the same order. The writer task stores what is
//! queued in batches and applies the retention.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::Utc;
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::BusConfig;
use super::retention::Retentions;
use super::subscription::{Subscriber, Subscription};
use super::{Bus, BusError, Delivery, Message, Pattern, Since, Subject};
use crate::store::{BusRecord, Store, StoreError};
use crate::sync::lock;
use crate::telemetry::{BusLabel, Metrics};

/// How often retention by age sweeps subjects nobody publishes to.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// One tenant's subjects and subscribers.
#[derive(Default)]
pub(super) struct Namespace {
    /// The last `seq` of each stream.
    last_seq: HashMap<String, u64>,
    pub(super) subscribers: HashMap<u64, Arc<Subscriber>>,
}

pub(super) struct Inner {
    pub(super) namespaces: Mutex<HashMap<String, Namespace>>,
    pub(super) retentions: Retentions,
    pub(super) store: Arc<dyn Store>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) shutdown: CancellationToken,
    max_payload: usize,
    pub(super) buffer: usize,
    next_subscriber: AtomicU64,
    /// Durable messages not yet handed to the store.
    pending: Mutex<Vec<BusRecord>>,
    /// Messages ever queued for the writer.
    queued: AtomicU64,
    /// Messages the writer has finished with (stored, or failed and
    /// logged); `None` once it has stopped.
    written: watch::Sender<Option<u64>>,
    wake: Notify,
}

/// The in-process [`Bus`].
pub struct EmbeddedBus(Arc<Inner>);

impl EmbeddedBus {
    /// Loads each durable subject's last `seq` and starts the writer,
    /// which stores what is left and stops once `shutdown` is cancelled.
    pub async fn start(
        store: Arc<dyn Store>,
        config: &BusConfig,
        metrics: Arc<Metrics>,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Result<EmbeddedBus, StoreError> {
        let retentions = Retentions::new(config);
        let mut namespaces: HashMap<String, Namespace> = HashMap::new();
        for stream in store.bus_streams().await? {
            if let Some(retention) = retentions.of(&stream.stream) {
                metrics
                    .bus_retained
                    .get_or_create(&BusLabel {
                        class: retention.class.clone(),
                    })
                    .inc_by(stream.retained as i64);
            }
            namespaces
                .entry(stream.namespace)
                .or_default()
                .last_seq
                .insert(stream.stream, stream.last_seq);
        }
        let inner = Arc::new(Inner {
            namespaces: Mutex::new(namespaces),
            retentions,
            store,
            metrics,
            shutdown,
            max_payload: config.max_payload_bytes,
            buffer: config.subscriber_buffer,
            next_subscriber: AtomicU64::new(1),
            pending: Mutex::new(Vec::new()),
            queued: AtomicU64::new(0),
            written: watch::Sender::new(Some(0)),
            wake: Notify::new(),
        });
        tasks.spawn(write_loop(inner.clone()));
        Ok(EmbeddedBus(inner))
    }
}

fn class(inner: &Inner, stream: &str) -> String {
    inner
        .retentions
        .of(stream)
        .map_or_else(|| "transient".to_owned(), |r| r.class.clone())
}

impl Inner {
    fn publish(&self, namespace: &str, subject: &Subject, payload: Bytes) -> Result<u64, BusError> {
        super::admit(&payload, self.max_payload, &self.shutdown)?;
        let retention = self.retentions.of(subject.stream());
        let durable = retention.is_some();
        let (mut delivered, mut lost) = (0, 0);
        let seq = {
            let mut namespaces = lock(&self.namespaces);
            let space = namespaces.entry(namespace.to_owned()).or_default();
            let last = space
                .last_seq
                .entry(subject.stream().to_owned())
                .or_insert(0);
            *last += 1;
            let seq = *last;
            let message = Arc::new(Message::new(subject.clone(), seq, Utc::now(), payload));
            for subscriber in space.subscribers.values() {
                match subscriber.offer(&message) {
                    Some(true) => delivered += 1,
                    Some(false) => lost += 1,
                    None => {}
                }
            }
            if durable {
                lock(&self.pending).push(BusRecord {
                    namespace: namespace.to_owned(),
                    stream: subject.stream().to_owned(),
                    subject: subject.as_str().to_owned(),
                    seq,
                    time: message.time,
                    payload: message.payload.to_vec(),
                });
                self.queued.fetch_add(1, Ordering::Release);
                self.wake.notify_one();
            }
            seq
        };
        let label = BusLabel {
            class: retention.map_or_else(|| "transient".to_owned(), |r| r.class.clone()),
        };
        self.metrics.bus_published.get_or_create(&label).inc();
        self.metrics
            .bus_delivered
            .get_or_create(&label)
            .inc_by(delivered);
        if !durable && lost > 0 {
            self.metrics.bus_lagged.get_or_create(&label).inc_by(lost);
        }
        Ok(seq)
    }

    pub(super) async fn flush(&self) -> Result<(), BusError> {
        let target = self.queued.load(Ordering::Acquire);
        let mut written = self.written.subscribe();
        let reached = written
            .wait_for(|w| w.is_none_or(|w| w >= target))
            .await
            .map_err(|_| BusError::Closed)?;
        match *reached {
            Some(_) => Ok(()),
            None => Err(BusError::Closed),
        }
    }

    pub(super) fn subscribe(
        self: &Arc<Self>,
        namespace: &str,
        patterns: Vec<Pattern>,
    ) -> (u64, Arc<Subscriber>) {
        let id = self.next_subscriber.fetch_add(1, Ordering::Relaxed);
        let subscriber = Arc::new(Subscriber::new(patterns, self.buffer));
        lock(&self.namespaces)
            .entry(namespace.to_owned())
            .or_default()
            .subscribers
            .insert(id, subscriber.clone());
        (id, subscriber)
    }

    pub(super) fn unsubscribe(&self, namespace: &str, id: u64) {
        let mut namespaces = lock(&self.namespaces);
        if let Some(space) = namespaces.get_mut(namespace) {
            space.subscribers.remove(&id);
        }
    }

    /// Stores one batch and prunes the streams it touched.
    async fn write_batch(&self, batch: Vec<BusRecord>) {
        if let Err(err) = self.store.bus_append(&batch).await {
            tracing::error!(error = %err, messages = batch.len(), "cannot store bus messages");
            return;
        }
        let mut touched: HashMap<(String, String), u64> = HashMap::new();
        for record in &batch {
            let label = BusLabel {
                class: class(self, &record.stream),
            };
            self.metrics.bus_retained.get_or_create(&label).inc();
            let last = touched
                .entry((record.namespace.clone(), record.stream.clone()))
                .or_default();
            *last = (*last).max(record.seq);
        }
        for ((namespace, stream), last) in touched {
            self.prune(&namespace, &stream, last).await;
        }
    }

    async fn prune(&self, namespace: &str, stream: &str, last_seq: u64) {
        let Some(retention) = self.retentions.of(stream) else {
            return;
        };
        let through = match retention.max_messages {
            0 => 0,
            max => last_seq.saturating_sub(max),
        };
        let older_than = retention
            .max_age
            .and_then(|age| Utc::now().checked_sub_signed(age));
        if through == 0 && older_than.is_none() {
            return;
        }
        match self
            .store
            .bus_prune(namespace, stream, through, older_than)
            .await
        {
            Ok(0) => {}
            Ok(deleted) => {
                let label = BusLabel {
                    class: retention.class.clone(),
                };
                self.metrics
                    .bus_retained
                    .get_or_create(&label)
                    .dec_by(deleted as i64);
            }
            Err(err) => tracing::warn!(error = %err, stream, "cannot prune bus messages"),
        }
    }

    /// Applies the retention by age to every durable stream.
    async fn sweep(&self) {
        let streams: Vec<(String, String, u64)> = {
            let namespaces = lock(&self.namespaces);
            namespaces
                .iter()
                .flat_map(|(namespace, space)| {
                    space
                        .last_seq
                        .iter()
                        .filter(|(stream, _)| self.retentions.of(stream).is_some())
                        .map(|(stream, seq)| (namespace.clone(), stream.clone(), *seq))
                })
                .collect()
        };
        for (namespace, stream, last) in streams {
            self.prune(&namespace, &stream, last).await;
        }
    }
}

/// Stores queued messages in batches until shutdown, then what is left.
async fn write_loop(inner: Arc<Inner>) {
    let mut sweep = tokio::time::interval(SWEEP_EVERY);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stopping = tokio::select! {
            () = inner.wake.notified() => false,
            _ = sweep.tick() => {
                inner.sweep().await;
                continue;
            }
            () = inner.shutdown.cancelled() => true,
        };
        let batch = std::mem::take(&mut *lock(&inner.pending));
        let count = batch.len() as u64;
        if count > 0 {
            inner.write_batch(batch).await;
            inner.written.send_modify(|w| *w = w.map(|w| w + count));
        }
        if stopping {
            // Publishes are refused from now on; store the last ones.
            let rest = std::mem::take(&mut *lock(&inner.pending));
            let count = rest.len() as u64;
            if count > 0 {
                inner.write_batch(rest).await;
            }
            inner.written.send_modify(|w| *w = w.map(|w| w + count));
            inner.written.send_replace(None);
            return;
        }
    }
}

#[async_trait]
impl Bus for EmbeddedBus {
    async fn publish(
        &self,
        namespace: &str,
        subject: &Subject,
        payload: Bytes,
    ) -> Result<u64, BusError> {
        self.0.publish(namespace, subject, payload)
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
        let subscription = Subscription::open(self.0.clone(), namespace, patterns, since).await?;
        Ok(subscription.into_stream().boxed())
    }

    async fn flush(&self) -> Result<(), BusError> {
        self.0.flush().await
    }

    fn max_payload(&self) -> usize {
        self.0.max_payload
    }

    /// In process: ready until shut down.
    async fn ping(&self) -> Result<(), BusError> {
        if self.0.shutdown.is_cancelled() {
            return Err(BusError::Closed);
        }
        Ok(())
    }
}

/// The durable streams among `streams`.
pub(super) fn durable_of(
    inner: &Inner,
    streams: impl IntoIterator<Item = String>,
) -> HashSet<String> {
    streams
        .into_iter()
        .filter(|s| inner.retentions.of(s).is_some())
        .collect()
}
