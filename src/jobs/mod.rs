//! Work any replica may do for a turn running on another: a deliberation
//! agent's model call, a pipeline node in test mode. The turn hands the
//! job to [`Jobs::run`] and awaits its answer; which process does it is
//! the implementation's business.
//!
//! - [`LocalJobs`] (one server, the default): the job runs in this process,
//!   its payload and answer encoded as they would be for another replica.
//! - [`nats::NatsJobs`] (replicas on one NATS server): the job is a
//!   message on a JetStream work queue shared by every replica; whichever
//!   replica takes it does it and sends the answer back. A replica that
//!   dies mid-job stops telling the queue it is still working, and the
//!   queue gives the job to another replica after `cluster.job_ack_wait_s`.
//!
//! A handler is registered per kind of job on every replica (the replicas
//! share their configuration, so each can do any job). Jobs are done at
//! least once: a handler's work must be safe to repeat.

pub mod nats;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::telemetry::{JobDoneLabel, JobLabel, Metrics};

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// No handler does jobs of this kind here.
    #[error("no handler for jobs of kind {0:?}")]
    Unknown(String),
    /// The handler ran and failed; the message is the handler's.
    #[error("{0}")]
    Failed(String),
    /// The payload or the answer could not be encoded or read.
    #[error("job encoding: {0}")]
    Encoding(String),
    #[error("the job queue: {0}")]
    Queue(String),
}

/// Does jobs of one kind.
#[async_trait]
pub trait Handler: Send + Sync {
    /// Does the job and answers; an `Err` is the job's failure, as the
    /// submitter will read it. Dropping the future abandons the job.
    async fn run(&self, job: Bytes) -> Result<Bytes, String>;
}

/// The handlers of every kind of job this process does.
#[derive(Clone, Default)]
pub struct Handlers(HashMap<&'static str, Arc<dyn Handler>>);

impl Handlers {
    pub fn with(mut self, kind: &'static str, handler: Arc<dyn Handler>) -> Handlers {
        self.0.insert(kind, handler);
        self
    }

    pub fn get(&self, kind: &str) -> Option<&Arc<dyn Handler>> {
        self.0.get(kind)
    }

    pub fn kinds(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.0.keys().copied()
    }
}

/// Where jobs are done.
#[async_trait]
pub trait Jobs: Send + Sync {
    /// Has a job of `kind` done and returns its answer. Dropping the
    /// future cancels the job wherever it runs.
    async fn run(&self, kind: &'static str, job: Bytes) -> Result<Bytes, JobError>;

    /// Takes jobs from the other replicas until `stop` fires (nothing to
    /// do where jobs only run in process).
    async fn serve(self: Arc<Self>, stop: CancellationToken) {
        stop.cancelled().await;
    }
}

/// Where this server's jobs are done, opened before their handlers exist
/// (a child turn's handler needs the session manager, which needs the
/// jobs): [`Queue::with_handlers`] makes the [`Jobs`].
pub enum Queue {
    /// One server: jobs run in process.
    InProcess(Arc<Metrics>),
    /// Replicas share the queue on a NATS server.
    Nats(Box<nats::NatsQueue>),
}

/// Opens the queue of jobs of `kinds`: on the NATS server at `bus_url`
/// when there is one (replicas share them), in process otherwise.
pub async fn open(
    bus_url: Option<&str>,
    kinds: &[&'static str],
    config: nats::QueueConfig,
    metrics: Arc<Metrics>,
) -> Result<Queue, JobError> {
    Ok(match bus_url {
        None => Queue::InProcess(metrics),
        Some(url) => Queue::Nats(Box::new(
            nats::NatsQueue::open(url, "conclave", kinds, config, metrics).await?,
        )),
    })
}

impl Queue {
    /// The jobs of this process, done by `handlers`.
    pub fn with_handlers(self, handlers: Handlers) -> Arc<dyn Jobs> {
        match self {
            Queue::InProcess(metrics) => Arc::new(LocalJobs::new(handlers, metrics)),
            Queue::Nats(queue) => Arc::new((*queue).with_handlers(handlers)),
        }
    }
}

/// Encodes `job`, has it done, decodes the answer.
pub async fn run_json<J: Serialize + Sync, A: DeserializeOwned>(
    jobs: &dyn Jobs,
    kind: &'static str,
    job: &J,
) -> Result<A, JobError> {
    let payload = serde_json::to_vec(job).map_err(|e| JobError::Encoding(e.to_string()))?;
    let answer = jobs.run(kind, Bytes::from(payload)).await?;
    serde_json::from_slice(&answer).map_err(|e| JobError::Encoding(e.to_string()))
}

/// Reads a job's payload in a handler.
pub fn read<J: DeserializeOwned>(job: &[u8]) -> Result<J, String> {
    serde_json::from_slice(job).map_err(|e| format!("the job is not readable: {e}"))
}

/// Encodes a handler's answer.
pub fn answer<A: Serialize>(answer: &A) -> Result<Bytes, String> {
    serde_json::to_vec(answer)
        .map(Bytes::from)
        .map_err(|e| format!("the answer cannot be encoded: {e}"))
}

/// Runs `handler` on `job`, counted in the metrics as done here.
async fn counted(
    metrics: &Metrics,
    kind: &str,
    handler: &dyn Handler,
    job: Bytes,
) -> Result<Bytes, String> {
    let _running = Running::new(metrics, kind);
    let result = handler.run(job).await;
    let outcome = if result.is_ok() { "ok" } else { "failed" };
    count_done(metrics, kind, outcome);
    result
}

/// Counts a job as running here until dropped (done or abandoned).
struct Running<'a> {
    metrics: &'a Metrics,
    label: JobLabel,
}

impl Running<'_> {
    fn new<'a>(metrics: &'a Metrics, kind: &str) -> Running<'a> {
        let label = JobLabel {
            kind: kind.to_owned(),
        };
        metrics.jobs_running.get_or_create(&label).inc();
        Running { metrics, label }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.metrics.jobs_running.get_or_create(&self.label).dec();
    }
}

fn count_done(metrics: &Metrics, kind: &str, outcome: &'static str) {
    let label = JobDoneLabel {
        kind: kind.to_owned(),
        outcome,
    };
    metrics.jobs_done.get_or_create(&label).inc();
}

/// Every job done in this process, as soon as it is asked for.
pub struct LocalJobs {
    handlers: Handlers,
    metrics: Arc<Metrics>,
}

impl LocalJobs {
    pub fn new(handlers: Handlers, metrics: Arc<Metrics>) -> LocalJobs {
        LocalJobs { handlers, metrics }
    }
}

#[async_trait]
impl Jobs for LocalJobs {
    async fn run(&self, kind: &'static str, job: Bytes) -> Result<Bytes, JobError> {
        let handler = self
            .handlers
            .get(kind)
            .ok_or_else(|| JobError::Unknown(kind.to_owned()))?;
        counted(&self.metrics, kind, handler.as_ref(), job)
            .await
            .map_err(JobError::Failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Doubles a number; fails on a negative one.
    pub(super) struct Double;

    #[async_trait]
    impl Handler for Double {
        async fn run(&self, job: Bytes) -> Result<Bytes, String> {
            let n: i64 = read(&job)?;
            if n < 0 {
                return Err(format!("{n} is negative"));
            }
            answer(&(n * 2))
        }
    }

    #[tokio::test]
    async fn local_jobs_run_in_process_and_count() {
        let metrics = Arc::new(Metrics::new());
        let jobs = LocalJobs::new(
            Handlers::default().with("double", Arc::new(Double)),
            metrics.clone(),
        );
        let doubled: i64 = run_json(&jobs, "double", &21).await.unwrap();
        assert_eq!(doubled, 42);
        let failed = run_json::<_, i64>(&jobs, "double", &-1).await.unwrap_err();
        assert_eq!(failed.to_string(), "-1 is negative");
        assert!(matches!(
            run_json::<_, i64>(&jobs, "triple", &1).await,
            Err(JobError::Unknown(kind)) if kind == "triple"
        ));
        let text = metrics.render();
        assert!(
            text.contains(r#"conclave_jobs_done_total{kind="double",outcome="ok"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"conclave_jobs_done_total{kind="double",outcome="failed"} 1"#),
            "{text}"
        );
    }
}
