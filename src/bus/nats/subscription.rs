//! A subscription on NATS: one ordered consumer per class whose subjects
//! the patterns may select, each pumped by a task into one bounded queue.
//!
//! A pump keeps its class's state: the last stream sequence it took (an
//! ordered consumer recreated after a reconnect may start over) and each
//! subject's last `seq`. When the queue is full, a pump of kept subjects
//! waits — the stream holds the rest — and one of the other subjects drops
//! the message and counts it; the consumer is told what was dropped once it
//! has read what came before.
//!
//! A consumer that fails, or whose client reconnected, is made again from
//! the pump's last stream sequence, with back-off, for as long as the
//! subscription lasts; meanwhile the bus's `ping` fails. A class whose
//! stream was lost and made again (a restarted NATS server's memory
//! stream) starts over from the new stream's start, and the subscriber is
//! told with a `lagged` line per subject it had read (`missed` 0: how many
//! went with the old stream is not known).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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

/// The first wait before a failed consumer is made again; it doubles
/// up to [`REMAKE_MAX`].
const REMAKE_FIRST: Duration = Duration::from_millis(100);
const REMAKE_MAX: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Queue {
    /// Messages, each holding a place of the queue's room, and notices
    /// of a consumer made again, holding none.
    items: VecDeque<Delivery>,
    /// Subjects with messages dropped since the consumer last looked; no
    /// more of such a subject is queued until it has, so nothing after a
    /// gap arrives before the news of the gap.
    lost: HashMap<String, Lost>,
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
    /// The class's index in the bus's names.
    class: usize,
    /// The consumer's filter subject.
    filter: String,
    /// The patterns this class serves, named in a notice when no subject
    /// was read yet.
    wanted: Vec<String>,
    /// When the class's stream was created (ns since the epoch), as the
    /// pump last saw it.
    created: i128,
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
        let info = stream.info().await.map_err(nats)?;
        let (last, created) = (
            info.state.last_sequence,
            info.created.unix_timestamp_nanos(),
        );
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
        let messages = consume(shared, index, &filter, policy).await?;
        let pump = Pump {
            inbox: inbox.clone(),
            class: index,
            filter,
            wanted: wanted.iter().map(|p| p.as_str().to_owned()).collect(),
            created,
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

/// An ordered consumer of the class's stream and its messages.
async fn consume(
    shared: &Shared,
    class: usize,
    filter: &str,
    policy: DeliverPolicy,
) -> Result<push::Ordered, BusError> {
    let stream = &shared.streams[class];
    let consumer = stream
        .create_consumer(push::OrderedConfig {
            deliver_subject: shared.client.new_inbox(),
            filter_subject: filter.to_owned(),
            deliver_policy: policy,
            ..Default::default()
        })
        .await
        .map_err(nats)?;
    consumer.messages().await.map_err(nats)
}

/// A consumer being made again: counted in the bus's `down` while it
/// lasts.
struct Down<'a>(&'a Shared);

impl<'a> Down<'a> {
    fn new(shared: &'a Shared) -> Down<'a> {
        shared.down.fetch_add(1, Ordering::SeqCst);
        Down(shared)
    }
}

impl Drop for Down<'_> {
    fn drop(&mut self) {
        self.0.down.fetch_sub(1, Ordering::SeqCst);
    }
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
        let mut reconnects = shared.reconnects.clone();
        reconnects.borrow_and_update();
        loop {
            let next = tokio::select! {
                next = messages.next() => next,
                // The client reconnected: the consumer may be gone with
                // the server's state, or its stream with it.
                moved = reconnects.changed() => {
                    if moved.is_err() {
                        return;
                    }
                    messages = match self.remake(&shared, &stop).await {
                        Some(messages) => messages,
                        None => return,
                    };
                    continue;
                }
                () = stop.cancelled() => return,
            };
            let message = match next {
                Some(Ok(message)) => message,
                // Idle and unread for a while: the consumer goes on.
                Some(Err(err)) if err.kind() == push::OrderedErrorKind::MissingHeartbeat => {
                    continue;
                }
                failed => {
                    match failed {
                        Some(Err(err)) => tracing::warn!(error = %err,
                            "a bus subscription's consumer failed; making it again"),
                        _ => tracing::warn!("a bus subscription's consumer ended; making it again"),
                    }
                    messages = match self.remake(&shared, &stop).await {
                        Some(messages) => messages,
                        None => return,
                    };
                    continue;
                }
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
    }

    /// Makes the consumer again from the last stream sequence taken,
    /// waiting longer after each failure; `None` once the subscription is
    /// gone.
    async fn remake(&mut self, shared: &Shared, stop: &CancellationToken) -> Option<push::Ordered> {
        let _down = Down::new(shared);
        let mut wait = REMAKE_FIRST;
        let mut said = false;
        loop {
            match self.resume(shared).await {
                Ok(messages) => {
                    if said {
                        tracing::info!(class = %self.label.class, "a bus subscription's consumer is back");
                    }
                    return Some(messages);
                }
                Err(e) if !said => {
                    tracing::warn!(class = %self.label.class, error = %e,
                        "a bus subscription's consumer cannot be made again yet; retrying");
                    said = true;
                }
                Err(_) => {}
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stop.cancelled() => return None,
            }
            wait = (wait * 2).min(REMAKE_MAX);
        }
    }

    async fn resume(&mut self, shared: &Shared) -> Result<push::Ordered, BusError> {
        shared.ensure_stream(self.class).await?;
        let mut stream = shared.streams[self.class].clone();
        let info = stream.info().await.map_err(nats)?;
        let created = info.created.unix_timestamp_nanos();
        if created != self.created {
            // A new stream: its sequences start over, and what the old one
            // held that this consumer had not read is gone.
            self.created = created;
            self.stream_seq = 0;
            self.tell_cut();
        }
        let policy = DeliverPolicy::ByStartSequence {
            start_sequence: self.stream_seq + 1,
        };
        consume(shared, self.class, &self.filter, policy).await
    }

    /// Tells the subscriber that messages may have gone with a lost
    /// stream: a `lagged` line for each subject it read, or for each
    /// pattern when it read none.
    fn tell_cut(&self) {
        let notices: Vec<Delivery> = if self.seqs.is_empty() {
            self.wanted
                .iter()
                .map(|pattern| Delivery::Lagged {
                    subject: pattern.clone(),
                    since: 0,
                    missed: 0,
                })
                .collect()
        } else {
            self.seqs
                .iter()
                .map(|(subject, seq)| Delivery::Lagged {
                    subject: subject.clone(),
                    since: *seq,
                    missed: 0,
                })
                .collect()
        };
        lock(&self.inbox.queue).items.extend(notices);
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
            lock(&self.inbox.queue)
                .items
                .push_back(Delivery::Message(Arc::new(message)));
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
                    queue.items.push_back(Delivery::Message(Arc::new(message)));
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
                if let Some(item) = queue.items.pop_front() {
                    if matches!(item, Delivery::Message(_)) {
                        self.inbox.room.add_permits(1);
                    }
                    return Some(item);
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
            }
            tokio::select! {
                () = self.inbox.ready.notified() => {}
                () = self.stop.cancelled() => return None,
            }
        }
    }
}
