//! Jobs on a JetStream work queue shared by every replica.
//!
//! One stream, `<prefix>_jobs`, keeps each job until a replica acks it
//! (work-queue retention), and one durable pull consumer per kind hands
//! each job to one replica at a time. A job is a message on
//! `conclave.jobs.queue.<kind>` whose `Conclave-Job` header names it:
//!
//! - the submitter subscribes to `conclave.jobs.answer.<job>` before it
//!   publishes the job, and awaits one answer there (`Conclave-Outcome`
//!   `ok` or `failed`); dropping the wait publishes
//!   `conclave.jobs.cancel.<job>`;
//! - each replica pulls one job whenever it has room (`cluster.max_jobs`),
//!   tells the queue it is still working every third of the ack wait,
//!   publishes the answer, then acks. A replica that dies stops telling,
//!   and the queue hands the job to another after `cluster.job_ack_wait_s`;
//!   a replica told to stop hands its running jobs back at once (a nak).
//!
//! An answer published just before its replica died is still answered
//! again by the next replica: jobs are done at least once, and the
//! submitter takes the first answer.

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::stream::{Config, RetentionPolicy, StorageType};
use async_nats::jetstream::{self, AckKind};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::{Handler, Handlers, JobError, Jobs, Running, count_done};
use crate::telemetry::{JobLabel, Metrics};

const JOB: &str = "Conclave-Job";
const OUTCOME: &str = "Conclave-Outcome";
/// A job nobody took in this long is dropped from the queue (its
/// submitter gave up long before).
const MAX_AGE: Duration = Duration::from_secs(3600);
/// How long one pull waits for a job before asking again.
const PULL_WAIT: Duration = Duration::from_secs(5);
/// Wait after the queue refused a pull, before the next.
const PULL_RETRY: Duration = Duration::from_secs(1);
/// Deliveries of one job before the queue gives up on it (its submitter
/// times out).
const MAX_DELIVER: i64 = 5;

fn queue_error(e: impl std::fmt::Display) -> JobError {
    JobError::Queue(e.to_string())
}

/// Durable consumer names take no dots.
fn consumer_name(kind: &str) -> String {
    format!("jobs_{}", kind.replace(['.', '*', '>', ' '], "_"))
}

/// Tries at opening the queue before `connect` gives up.
const OPEN_ATTEMPTS: u32 = 3;

/// The queue's stream, and a consumer for each of `kinds` (or those
/// another replica made).
async fn open(
    jetstream: &jetstream::Context,
    names: &Names,
    kinds: &[&'static str],
    ack_wait: Duration,
) -> Result<jetstream::stream::Stream, JobError> {
    let stream = jetstream
        .get_or_create_stream(Config {
            name: names.stream.clone(),
            subjects: vec![format!("{}.>", names.queue)],
            retention: RetentionPolicy::WorkQueue,
            storage: StorageType::File,
            max_age: MAX_AGE,
            ..Config::default()
        })
        .await
        .map_err(queue_error)?;
    for kind in kinds {
        consumer(&stream, names, kind, ack_wait).await?;
    }
    Ok(stream)
}

/// The durable pull consumer of `kind`'s jobs.
async fn consumer(
    stream: &jetstream::stream::Stream,
    names: &Names,
    kind: &str,
    ack_wait: Duration,
) -> Result<jetstream::consumer::PullConsumer, JobError> {
    let name = consumer_name(kind);
    stream
        .get_or_create_consumer(
            &name,
            pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: format!("{}.{kind}", names.queue),
                ack_policy: AckPolicy::Explicit,
                ack_wait,
                max_deliver: MAX_DELIVER,
                ..pull::Config::default()
            },
        )
        .await
        .map_err(queue_error)
}

/// The stream and subjects under a prefix (`conclave` in the server, one
/// per test in the tests).
#[derive(Clone)]
struct Names {
    stream: String,
    queue: String,
    answer: String,
    cancel: String,
}

impl Names {
    fn new(prefix: &str) -> Names {
        Names {
            stream: format!("{prefix}_jobs"),
            queue: format!("{prefix}.jobs.queue"),
            answer: format!("{prefix}.jobs.answer"),
            cancel: format!("{prefix}.jobs.cancel"),
        }
    }
}

/// The queue's settings.
#[derive(Debug, Clone, Copy)]
pub struct QueueConfig {
    /// How long a job may go without word from its replica before the
    /// queue gives it to another.
    pub ack_wait: Duration,
    /// Jobs one replica does at once.
    pub max_running: usize,
}

/// The [`Jobs`] of replicas sharing one NATS server.
pub struct NatsJobs {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    stream: jetstream::stream::Stream,
    names: Names,
    handlers: Handlers,
    config: QueueConfig,
    metrics: Arc<Metrics>,
}

/// The queue opened on the NATS server, before the handlers of this
/// process exist ([`NatsQueue::with_handlers`] makes the [`NatsJobs`]).
pub struct NatsQueue {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    stream: jetstream::stream::Stream,
    names: Names,
    config: QueueConfig,
    metrics: Arc<Metrics>,
}

impl NatsQueue {
    /// Connects and creates the queue's stream and one consumer per kind
    /// of `kinds` (or finds those another replica made); the stream and
    /// subjects start with `prefix`.
    pub async fn open(
        url: &str,
        prefix: &str,
        kinds: &[&'static str],
        config: QueueConfig,
        metrics: Arc<Metrics>,
    ) -> Result<NatsQueue, JobError> {
        let client = async_nats::ConnectOptions::new()
            .name("conclave-jobs")
            .connect(url)
            .await
            .map_err(queue_error)?;
        let jetstream = jetstream::new(client.clone());
        let names = Names::new(prefix);
        // Replicas starting together race to make the stream and its
        // consumers; a loser (or a JetStream API call timed out on a busy
        // server) tries again before giving up.
        let mut attempt = 1;
        loop {
            match open(&jetstream, &names, kinds, config.ack_wait).await {
                Ok(stream) => {
                    return Ok(NatsQueue {
                        client,
                        jetstream,
                        stream,
                        names,
                        config,
                        metrics,
                    });
                }
                Err(e) if attempt < OPEN_ATTEMPTS => {
                    tracing::warn!(error = %e, attempt, "cannot open the job queue yet; trying again");
                    tokio::time::sleep(PULL_RETRY / 2).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The jobs of this process: `handlers` do those it takes.
    pub fn with_handlers(self, handlers: Handlers) -> NatsJobs {
        NatsJobs {
            client: self.client,
            jetstream: self.jetstream,
            stream: self.stream,
            names: self.names,
            handlers,
            config: self.config,
            metrics: self.metrics,
        }
    }
}

impl NatsJobs {
    /// [`NatsQueue::open`] for the kinds `handlers` does, then
    /// [`NatsQueue::with_handlers`].
    pub async fn connect(
        url: &str,
        prefix: &str,
        handlers: Handlers,
        config: QueueConfig,
        metrics: Arc<Metrics>,
    ) -> Result<NatsJobs, JobError> {
        let kinds: Vec<&'static str> = handlers.kinds().collect();
        let queue = NatsQueue::open(url, prefix, &kinds, config, metrics).await?;
        Ok(queue.with_handlers(handlers))
    }

    async fn consumer(&self, kind: &str) -> Result<jetstream::consumer::PullConsumer, JobError> {
        consumer(&self.stream, &self.names, kind, self.config.ack_wait).await
    }

    /// Pulls jobs of `kind` one at a time while there is room, until
    /// `stop`.
    async fn take(
        self: Arc<Self>,
        kind: &'static str,
        handler: Arc<dyn Handler>,
        room: Arc<Semaphore>,
        stop: CancellationToken,
        running: TaskTracker,
    ) {
        let mut consumer = None;
        while !stop.is_cancelled() {
            let permit = tokio::select! {
                permit = room.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
                _ = stop.cancelled() => return,
            };
            let pulled = tokio::select! {
                pulled = self.pull(kind, &mut consumer) => pulled,
                _ = stop.cancelled() => return,
            };
            match pulled {
                Ok(Some(message)) => {
                    let jobs = self.clone();
                    let handler = handler.clone();
                    let stop = stop.clone();
                    running.spawn(async move {
                        jobs.work(kind, handler.as_ref(), message, stop).await;
                        drop(permit);
                    });
                }
                Ok(None) => {}
                Err(e) => {
                    consumer = None;
                    tracing::warn!(kind, error = %e, "pulling a job failed");
                    tokio::select! {
                        _ = tokio::time::sleep(PULL_RETRY) => {}
                        _ = stop.cancelled() => return,
                    }
                }
            }
        }
    }

    /// One job of `kind`, if one comes within [`PULL_WAIT`].
    async fn pull(
        &self,
        kind: &str,
        consumer: &mut Option<jetstream::consumer::PullConsumer>,
    ) -> Result<Option<jetstream::Message>, JobError> {
        let consumer = match consumer {
            Some(consumer) => consumer,
            None => consumer.insert(self.consumer(kind).await?),
        };
        let mut batch = consumer
            .batch()
            .max_messages(1)
            .expires(PULL_WAIT)
            .messages()
            .await
            .map_err(queue_error)?;
        match batch.next().await {
            Some(Ok(message)) => Ok(Some(message)),
            Some(Err(e)) => Err(queue_error(e)),
            None => Ok(None),
        }
    }

    /// Does one job: answers its submitter and acks it, or hands it back.
    async fn work(
        &self,
        kind: &str,
        handler: &dyn Handler,
        message: jetstream::Message,
        stop: CancellationToken,
    ) {
        let Some(id) = message
            .headers
            .as_ref()
            .and_then(|h| h.get(JOB))
            .map(|v| v.as_str().to_owned())
        else {
            tracing::warn!(kind, "a job without its {JOB} header was dropped");
            let _ = message.ack_with(AckKind::Term).await;
            return;
        };
        if let Ok(info) = message.info()
            && info.delivered > 1
        {
            tracing::info!(kind, job = %id, delivery = info.delivered, "taking over a job another replica did not finish");
            let label = JobLabel {
                kind: kind.to_owned(),
            };
            self.metrics.jobs_taken_over.get_or_create(&label).inc();
        }
        let mut cancelled = match self
            .client
            .subscribe(format!("{}.{id}", self.names.cancel))
            .await
        {
            Ok(subscriber) => subscriber,
            Err(e) => {
                tracing::warn!(kind, job = %id, error = %e, "cannot listen for the job's cancel; handing it back");
                let _ = message.ack_with(AckKind::Nak(None)).await;
                return;
            }
        };
        let still_working = async {
            let mut every = tokio::time::interval(self.config.ack_wait / 3);
            every.tick().await;
            loop {
                every.tick().await;
                if let Err(e) = message.ack_with(AckKind::Progress).await {
                    tracing::warn!(kind, job = %id, error = %e, "telling the queue the job goes on failed");
                }
            }
        };
        let running = Running::new(&self.metrics, kind);
        let result = tokio::select! {
            result = handler.run(message.payload.clone()) => Some(result),
            _ = still_working => None,
            _ = cancelled.next() => {
                drop(running);
                count_done(&self.metrics, kind, "cancelled");
                let _ = message.ack_with(AckKind::Term).await;
                return;
            }
            _ = stop.cancelled() => None,
        };
        drop(running);
        let Some(result) = result else {
            // Stopping: another replica does it now rather than after the
            // ack wait.
            count_done(&self.metrics, kind, "handed_back");
            let _ = message.ack_with(AckKind::Nak(None)).await;
            return;
        };
        let (outcome, body) = match result {
            Ok(answer) => ("ok", answer),
            Err(failure) => ("failed", Bytes::from(failure)),
        };
        count_done(&self.metrics, kind, outcome);
        let mut headers = HeaderMap::new();
        headers.insert(OUTCOME, outcome);
        if let Err(e) = self
            .client
            .publish_with_headers(format!("{}.{id}", self.names.answer), headers, body)
            .await
        {
            tracing::warn!(kind, job = %id, error = %e, "sending a job's answer failed; the queue will hand it out again");
            return;
        }
        if let Err(e) = message.double_ack().await {
            tracing::warn!(kind, job = %id, error = %e, "acking a done job failed; it may be done again");
        }
    }
}

/// Publishes the cancel of a job whose submitter stopped waiting.
struct CancelOnDrop {
    client: async_nats::Client,
    /// The job's cancel subject, until its answer came.
    subject: Option<String>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(subject) = self.subject.take() else {
            return;
        };
        let client = self.client.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = client.publish(subject, Bytes::new()).await;
            });
        }
    }
}

#[async_trait]
impl Jobs for NatsJobs {
    async fn run(&self, kind: &'static str, job: Bytes) -> Result<Bytes, JobError> {
        if self.handlers.get(kind).is_none() {
            return Err(JobError::Unknown(kind.to_owned()));
        }
        let id = Uuid::new_v4();
        // Subscribed before the job exists, so its answer cannot pass by.
        let mut answers = self
            .client
            .subscribe(format!("{}.{id}", self.names.answer))
            .await
            .map_err(queue_error)?;
        let mut headers = HeaderMap::new();
        headers.insert(JOB, id.to_string().as_str());
        self.jetstream
            .publish_with_headers(format!("{}.{kind}", self.names.queue), headers, job)
            .await
            .map_err(queue_error)?
            .await
            .map_err(queue_error)?;
        let mut cancel = CancelOnDrop {
            client: self.client.clone(),
            subject: Some(format!("{}.{id}", self.names.cancel)),
        };
        let answer = answers
            .next()
            .await
            .ok_or_else(|| JobError::Queue("the connection to NATS closed".into()))?;
        cancel.subject = None;
        let failed = answer
            .headers
            .as_ref()
            .and_then(|h| h.get(OUTCOME))
            .is_some_and(|v| v.as_str() == "failed");
        if failed {
            return Err(JobError::Failed(
                String::from_utf8_lossy(&answer.payload).into_owned(),
            ));
        }
        Ok(answer.payload)
    }

    async fn serve(self: Arc<Self>, stop: CancellationToken) {
        let room = Arc::new(Semaphore::new(self.config.max_running));
        let running = TaskTracker::new();
        let takers = TaskTracker::new();
        let kinds: Vec<_> = self
            .handlers
            .kinds()
            .filter_map(|kind| Some((kind, self.handlers.get(kind)?.clone())))
            .collect();
        for (kind, handler) in kinds {
            takers.spawn(self.clone().take(
                kind,
                handler,
                room.clone(),
                stop.clone(),
                running.clone(),
            ));
        }
        takers.close();
        takers.wait().await;
        running.close();
        running.wait().await;
    }
}

#[cfg(test)]
mod tests;
