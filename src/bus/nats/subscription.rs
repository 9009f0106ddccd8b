//! A subscription on NATS: one ordered consumer per class whose subjects
//! the patterns may select, each pumped by a task into one bounded queue.
//!
//! A pump keeps its class's state: the last stream sequence it took (an
//! ordered consumer recreated after a reconnect may start over) and each
//! subject's last `seq`. When the queue is full, a pump of kept subjects
//! waits — the stream holds the rest — and one of the other subjects drops
//! the message and counts it; the consumer is told what was dropped once it
//! has read what came before.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use async_nats::jetstream::consumer::{DeliverPolicy, push};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::names::decode;
use super::{SEQ, Shared, WRITTEN, nats};
use crate::bus::{BusError, Delivery, Message, Pattern, Since, Subject};
use crate::sync::lock;
use crate::telemetry::BusLabel;

/// What a subscriber missed of one subject that is not kept.
struct Lost {
    since: u64,
    missed: u64,
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Arc<Message>>,
    /// Subjects with messages dropped since the consumer last looked; no
    /// more of such a subject is queued until it has, so nothing after a
    /// gap arrives before the news of the gap.
    lost: HashMap<String, Lost>,
    /// A consumer ended for good (its stream is gone, NATS is unreachable).
    failed: bool,
}

struct Inbox {
    queue: Mutex<Queue>,
    /// Free places in the queue.
    room: Semaphore,
    ready: Notify,
}

/// One class's consumer, as its pump sees it.
struct Pump {
    inbox: Arc<Inbox>,
    durable: bool,
    label: BusLabel,
    /// Subscribed with one filter per class, several patterns are matched
    /// here.
    patterns: Option<Vec<Pattern>>,
    /// The last stream sequence taken.
    stream_seq: u64,
    /// Each subject's last `seq`.
    seqs: HashMap<String, u64>,
    /// Subjects never seen start after this `seq` (`Since::Seq`).
    base: u64,
    /// Kept messages older than this are skipped (`Since::Time`).
    from_time: Option<DateTime<Utc>>,
}

/// `ByStartTime` of a chrono time: async-nats names times with the `time`
/// crate, so the policy is read from its wire form.
fn from_time(time: DateTime<Utc>) -> Result<DeliverPolicy, BusError> {
    serde_json::from_value(serde_json::json!({
        "deliver_policy": "by_start_time",
        "opt_start_time": time.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
    }))
    .map_err(nats)
}

/// Creates the consumers (so nothing published from now on is missed)
/// and starts their pumps.
pub(super) async fn open(
    shared: &Arc<Shared>,
    namespace: &str,
    patterns: Vec<Pattern>,
    since: Since,
) -> Result<BoxStream<'static, Delivery>, BusError> {
    let inbox = Arc::new(Inbox {
        queue: Mutex::default(),
        room: Semaphore::new(shared.buffer),
        ready: Notify::new(),
    });
    let stop = shared.shutdown.child_token();
    // Held from here, so the pumps started stop if a later consumer fails.
    let guard = stop.clone().drop_guard();
    for (index, class) in shared.names.classes().iter().enumerate() {
        let wanted: Vec<&Pattern> = patterns.iter().filter(|p| class.may_hold(p)).collect();
        if wanted.is_empty() {
            continue;
        }
        let only = (wanted.len() == 1).then(|| wanted[0]);
        let filter = shared.names.filter(namespace, class, only);
        let mut stream = shared.streams[index].clone();
        let last = stream.info().await.map_err(nats)?.state.last_sequence;
        let (policy, floor) = match since {
            Since::Seq(_) if class.durable() => (DeliverPolicy::All, 0),
            Since::Time(time) if class.durable() => (from_time(time)?, 0),
            _ => (
                DeliverPolicy::ByStartSequence {
                    start_sequence: last + 1,
                },
                last,
            ),
        };
        let consumer = stream
            .create_consumer(push::OrderedConfig {
                deliver_subject: shared.client.new_inbox(),
                filter_subject: filter,
                deliver_policy: policy,
                ..Default::default()
            })
            .await
            .map_err(nats)?;
        let messages = consumer.messages().await.map_err(nats)?;
        let pump = Pump {
            inbox: inbox.clone(),
            durable: class.durable(),
            label: BusLabel {
                class: class.label.clone(),
            },
            patterns: only.is_none().then(|| patterns.clone()),
            stream_seq: floor,
            seqs: HashMap::new(),
            base: match since {
                Since::Seq(seq) => seq,
                _ => 0,
            },
            from_time: match since {
                Since::Time(time) if class.durable() => Some(time),
                _ => None,
            },
        };
        tokio::spawn(pump.run(messages, stop.clone(), shared.clone()));
    }
    let reader = Reader {
        inbox,
        notices: VecDeque::new(),
        stop,
        _guard: guard,
    };
    Ok(reader.into_stream().boxed())
}

/// The message a consumer delivered, with its stream sequence.
fn read(message: &async_nats::jetstream::Message) -> Option<(u64, Message)> {
    let info = message.info().ok()?;
    let headers = message.headers.as_ref()?;
    let seq = headers.get(SEQ)?.as_str().parse().ok()?;
    let written = decode(headers.get(WRITTEN)?.as_str())?;
    let subject = Subject::parse(&written).ok()?;
    let nanos = i64::try_from(info.published.unix_timestamp_nanos()).ok()?;
    let time = DateTime::from_timestamp_nanos(nanos);
    Some((
        info.stream_sequence,
        Message::new(subject, seq, time, message.payload.clone()),
    ))
}

impl Pump {
    async fn run(
        mut self,
        mut messages: push::Ordered,
        stop: CancellationToken,
        shared: Arc<Shared>,
    ) {
        loop {
            let next = tokio::select! {
                next = messages.next() => next,
                () = stop.cancelled() => return,
            };
            let message = match next {
                Some(Ok(message)) => message,
                // Idle and unread for a while: the consumer goes on.
                Some(Err(err)) if err.kind() == push::OrderedErrorKind::MissingHeartbeat => {
                    continue;
                }
                Some(Err(err)) => {
                    tracing::warn!(error = %err, "a bus subscription's consumer failed; ending it");
                    break;
                }
                None => break,
            };
            let Some((stream_seq, message)) = read(&message) else {
                tracing::warn!(subject = %message.subject, "skipping a bus message without its headers");
                continue;
            };
            if !self.take(stream_seq, &message) {
                continue;
            }
            let kept = tokio::select! {
                kept = self.queue(message, &shared) => kept,
                () = stop.cancelled() => return,
            };
            if !kept {
                return;
            }
        }
        lock(&self.inbox.queue).failed = true;
        self.inbox.ready.notify_one();
    }

    /// Whether the message is one to hand on.
    fn take(&mut self, stream_seq: u64, message: &Message) -> bool {
        if stream_seq <= self.stream_seq {
            return false;
        }
        self.stream_seq = stream_seq;
        let stream = message.subject.stream();
        if let Some(patterns) = &self.patterns
            && !patterns.iter().any(|p| p.matches_stream(stream))
        {
            return false;
        }
        if self.from_time.is_some_and(|from| message.time < from) {
            return false;
        }
        message.seq > self.base || self.seqs.contains_key(stream)
    }

    /// Queues the message, or counts it lost; `false` once the
    /// subscription is gone.
    async fn queue(&mut self, message: Message, shared: &Shared) -> bool {
        let stream = message.subject.stream().to_owned();
        let previous = self.seqs.insert(stream.clone(), message.seq);
        let queued = if self.durable {
            match self.inbox.room.acquire().await {
                Ok(permit) => permit.forget(),
                Err(_) => return false,
            }
            lock(&self.inbox.queue).items.push_back(Arc::new(message));
            true
        } else {
            // A gap (messages gone from the stream before this consumer
            // read them) counts as lost, like a full queue.
            let gap = previous.is_some_and(|p| message.seq > p + 1);
            let missed = previous.map_or(1, |p| message.seq.saturating_sub(p).max(1));
            let queued = {
                let mut queue = lock(&self.inbox.queue);
                if let Some(lost) = queue.lost.get_mut(&stream) {
                    lost.missed += missed;
                    false
                } else if gap || self.inbox.room.try_acquire().map(|p| p.forget()).is_err() {
                    let since = previous.unwrap_or(message.seq.saturating_sub(1));
                    queue.lost.insert(stream, Lost { since, missed });
                    false
                } else {
                    queue.items.push_back(Arc::new(message));
                    true
                }
            };
            if !queued {
                let lagged = shared.metrics.bus_lagged.get_or_create(&self.label);
                lagged.inc_by(missed);
            }
            queued
        };
        if queued {
            shared
                .metrics
                .bus_delivered
                .get_or_create(&self.label)
                .inc();
        }
        self.inbox.ready.notify_one();
        true
    }
}

/// The subscriber's side of the queue.
struct Reader {
    inbox: Arc<Inbox>,
    notices: VecDeque<Delivery>,
    stop: CancellationToken,
    /// Stops the pumps once the subscriber is gone.
    _guard: DropGuard,
}

impl Reader {
    fn into_stream(self) -> impl futures::Stream<Item = Delivery> + Send + 'static {
        futures::stream::unfold(self, |mut reader| async move {
            let next = reader.next().await?;
            Some((next, reader))
        })
    }

    async fn next(&mut self) -> Option<Delivery> {
        loop {
            if let Some(notice) = self.notices.pop_front() {
                return Some(notice);
            }
            {
                let mut queue = lock(&self.inbox.queue);
                if let Some(message) = queue.items.pop_front() {
                    self.inbox.room.add_permits(1);
                    return Some(Delivery::Message(message));
                }
                if !queue.lost.is_empty() {
                    self.notices = std::mem::take(&mut queue.lost)
                        .into_iter()
                        .map(|(subject, lost)| Delivery::Lagged {
                            subject,
                            since: lost.since,
                            missed: lost.missed,
                        })
                        .collect();
                    continue;
                }
                if queue.failed {
                    return None;
                }
            }
            tokio::select! {
                () = self.inbox.ready.notified() => {}
                () = self.stop.cancelled() => return None,
            }
        }
    }
}
