//! One subscriber: its bounded queue, filled by publishers, and the
//! stream that drains it, replays kept messages and catches up.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use futures::Stream;
use tokio::sync::Notify;

use super::embedded::{Inner, durable_of};
use super::{BusError, Delivery, Message, Pattern, Since, Subject};
use crate::store::BusCursor;
use crate::sync::lock;

/// Kept messages read from the store per page.
const REPLAY_PAGE: usize = 256;

/// What a subscriber missed of one stream while its queue was full.
#[derive(Debug, Clone, Copy)]
pub(super) struct Lost {
    first: u64,
    count: u64,
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Arc<Message>>,
    /// Streams with messages dropped since the consumer last looked; no
    /// more of a lost stream is queued until it has, so nothing after a gap
    /// arrives before the news of the gap.
    lost: HashMap<String, Lost>,
}

pub(super) struct Subscriber {
    patterns: Vec<Pattern>,
    capacity: usize,
    queue: Mutex<Queue>,
    ready: Notify,
}

impl Subscriber {
    pub(super) fn new(patterns: Vec<Pattern>, capacity: usize) -> Subscriber {
        Subscriber {
            patterns,
            capacity,
            queue: Mutex::default(),
            ready: Notify::new(),
        }
    }

    fn matches_stream(&self, stream: &str) -> bool {
        self.patterns.iter().any(|p| p.matches_stream(stream))
    }

    /// Offers a published message: `None` when the subscriber does not
    /// want it, `Some(true)` when queued, `Some(false)` when lost.
    pub(super) fn offer(&self, message: &Arc<Message>) -> Option<bool> {
        let stream = message.subject.stream();
        if !self.matches_stream(stream) {
            return None;
        }
        let queued = {
            let mut queue = lock(&self.queue);
            if let Some(lost) = queue.lost.get_mut(stream) {
                lost.count += 1;
                false
            } else if queue.items.len() >= self.capacity {
                queue.lost.insert(
                    stream.to_owned(),
                    Lost {
                        first: message.seq,
                        count: 1,
                    },
                );
                false
            } else {
                queue.items.push_back(message.clone());
                true
            }
        };
        self.ready.notify_one();
        Some(queued)
    }
}

/// Kept messages being read back from the store.
struct Replay {
    cursor: BusCursor,
    /// Only these streams (a catch-up), or all that match.
    only: Option<HashSet<String>>,
    buffer: VecDeque<Arc<Message>>,
    done: bool,
}

impl Replay {
    fn new(cursor: BusCursor, only: Option<HashSet<String>>) -> Replay {
        Replay {
            cursor,
            only,
            buffer: VecDeque::new(),
            done: false,
        }
    }
}

enum Taken {
    Message(Arc<Message>),
    Lost(HashMap<String, Lost>),
    Nothing,
}

pub(super) struct Subscription {
    inner: Arc<Inner>,
    namespace: String,
    id: u64,
    subscriber: Arc<Subscriber>,
    /// The last `seq` delivered per stream.
    delivered: HashMap<String, u64>,
    /// What counts as delivered on a stream not yet seen (`since`).
    base: u64,
    replay: Option<Replay>,
    notices: VecDeque<Delivery>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.inner.unsubscribe(&self.namespace, self.id);
    }
}

impl Subscription {
    /// Registers the subscriber first, so nothing published from now on is
    /// missed, then sets up the replay of what the store keeps.
    pub(super) async fn open(
        inner: Arc<Inner>,
        namespace: &str,
        patterns: Vec<Pattern>,
        since: Since,
    ) -> Result<Subscription, BusError> {
        let (id, subscriber) = inner.subscribe(namespace, patterns);
        let mut subscription = Subscription {
            inner,
            namespace: namespace.to_owned(),
            id,
            subscriber,
            delivered: HashMap::new(),
            base: 0,
            replay: None,
            notices: VecDeque::new(),
        };
        let cursor = match since {
            Since::New => return Ok(subscription),
            Since::Seq(seq) => {
                subscription.base = seq;
                BusCursor::default()
            }
            Since::Time(time) => BusCursor {
                after: 0,
                from_time: Some(time),
            },
        };
        subscription.inner.flush().await?;
        subscription.replay = Some(Replay::new(cursor, None));
        Ok(subscription)
    }

    pub(super) fn into_stream(self) -> impl Stream<Item = Delivery> + Send + 'static {
        futures::stream::unfold(self, |mut subscription| async move {
            let next = subscription.next().await?;
            Some((next, subscription))
        })
    }

    /// Whether the message is one the subscriber has not had yet.
    fn fresh(&self, message: &Message) -> bool {
        let stream = message.subject.stream();
        message.seq > self.delivered.get(stream).copied().unwrap_or(self.base)
    }

    fn deliver(&mut self, message: Arc<Message>) -> Option<Delivery> {
        if !self.fresh(&message) {
            return None;
        }
        self.delivered
            .insert(message.subject.stream().to_owned(), message.seq);
        Some(Delivery::Message(message))
    }

    async fn next(&mut self) -> Option<Delivery> {
        loop {
            if self.replay.is_some() {
                match self.step_replay().await {
                    Ok(Some(delivery)) => return Some(delivery),
                    Ok(None) => continue,
                    Err(err) => {
                        tracing::error!(error = %err, "bus subscription cannot read the store; ending it");
                        return None;
                    }
                }
            }
            if let Some(notice) = self.notices.pop_front() {
                return Some(notice);
            }
            let taken = {
                let mut queue = lock(&self.subscriber.queue);
                match queue.items.pop_front() {
                    Some(message) => Taken::Message(message),
                    None if !queue.lost.is_empty() => Taken::Lost(std::mem::take(&mut queue.lost)),
                    None => Taken::Nothing,
                }
            };
            match taken {
                Taken::Message(message) => {
                    if let Some(delivery) = self.deliver(message) {
                        return Some(delivery);
                    }
                }
                Taken::Lost(lost) => self.handle_lost(lost).await,
                Taken::Nothing => {
                    tokio::select! {
                        () = self.subscriber.ready.notified() => {}
                        () = self.inner.shutdown.cancelled() => return None,
                    }
                }
            }
        }
    }

    /// One step of the replay: a message, nothing yet (a page was read, or
    /// the replay ended), or the store's error.
    async fn step_replay(&mut self) -> Result<Option<Delivery>, BusError> {
        let Some(replay) = self.replay.as_mut() else {
            return Ok(None);
        };
        if let Some(message) = replay.buffer.pop_front() {
            return Ok(self.deliver(message));
        }
        if replay.done {
            self.replay = None;
            return Ok(None);
        }
        let page = self
            .inner
            .store
            .bus_read(&self.namespace, replay.cursor, REPLAY_PAGE)
            .await?;
        replay.done = page.len() < REPLAY_PAGE;
        for (position, record) in page {
            replay.cursor.after = position;
            let wanted = replay
                .only
                .as_ref()
                .is_none_or(|s| s.contains(&record.stream))
                && self.subscriber.matches_stream(&record.stream);
            if wanted {
                replay.buffer.push_back(Arc::new(Message::new(
                    Subject::from_parts(record.subject, record.stream),
                    record.seq,
                    record.time,
                    record.payload.into(),
                )));
            }
        }
        Ok(None)
    }

    /// Durable streams are read back from the store; the others' losses
    /// are told.
    async fn handle_lost(&mut self, lost: HashMap<String, Lost>) {
        let durable = durable_of(&self.inner, lost.keys().cloned());
        for (stream, what) in lost {
            if durable.contains(&stream) {
                continue;
            }
            let since = self
                .delivered
                .get(&stream)
                .copied()
                .unwrap_or(what.first.saturating_sub(1));
            self.notices.push_back(Delivery::Lagged {
                subject: stream,
                since,
                missed: what.count,
            });
        }
        if durable.is_empty() {
            return;
        }
        if let Err(err) = self.inner.flush().await {
            tracing::warn!(error = %err, "bus subscription cannot catch up");
            return;
        }
        self.replay = Some(Replay::new(BusCursor::default(), Some(durable)));
    }
}
