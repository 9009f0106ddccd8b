//! Replicas on one NATS server (`CONCLAVE_TEST_NATS`), each a
//! [`NatsJobs`] on the test's own prefix.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{NatsJobs, QueueConfig};
use crate::jobs::{Handler, Handlers, JobError, Jobs, answer, read, run_json};
use crate::telemetry::Metrics;

fn nats_url() -> String {
    std::env::var("CONCLAVE_TEST_NATS").unwrap_or_else(|_| {
        panic!(
            "CONCLAVE_TEST_NATS is not set: the job queue tests need a NATS server with \
             JetStream (scripts/test.sh starts one and sets it)"
        )
    })
}

/// What one replica's handler does with a job: `n` doubled after `pause`,
/// or nothing ever (`stall`), counting the jobs it began.
struct Worker {
    pause: Duration,
    stall: bool,
    began: AtomicUsize,
    began_one: Notify,
    /// Jobs whose future was dropped before they answered.
    dropped: Arc<Dropped>,
}

impl Worker {
    fn new(pause: Duration, stall: bool) -> Arc<Worker> {
        Arc::new(Worker {
            pause,
            stall,
            began: AtomicUsize::new(0),
            began_one: Notify::new(),
            dropped: Arc::new(Dropped::default()),
        })
    }
}

#[derive(Default)]
struct Dropped {
    count: AtomicUsize,
    one: Notify,
}

struct CountDrop(Option<Arc<Dropped>>);

impl Drop for CountDrop {
    fn drop(&mut self) {
        if let Some(dropped) = self.0.take() {
            dropped.count.fetch_add(1, Ordering::SeqCst);
            dropped.one.notify_waiters();
        }
    }
}

#[async_trait]
impl Handler for Worker {
    async fn run(&self, job: Bytes) -> Result<Bytes, String> {
        let n: i64 = read(&job)?;
        self.began.fetch_add(1, Ordering::SeqCst);
        self.began_one.notify_waiters();
        let mut guard = CountDrop(Some(self.dropped.clone()));
        if self.stall {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(self.pause).await;
        guard.0 = None;
        if n < 0 {
            return Err(format!("{n} is negative"));
        }
        answer(&(n * 2))
    }
}

struct Replica {
    jobs: Arc<NatsJobs>,
    worker: Arc<Worker>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
    serving: tokio::task::JoinHandle<()>,
}

async fn replica(prefix: &str, worker: Arc<Worker>, ack_wait: Duration) -> Replica {
    let metrics = Arc::new(Metrics::new());
    let jobs = NatsJobs::connect(
        &nats_url(),
        prefix,
        Handlers::default().with("double", worker.clone()),
        QueueConfig {
            ack_wait,
            max_running: 4,
        },
        metrics.clone(),
    )
    .await
    .unwrap();
    let jobs = Arc::new(jobs);
    let stop = CancellationToken::new();
    let serving = tokio::spawn(jobs.clone().serve(stop.clone()));
    Replica {
        jobs,
        worker,
        metrics,
        stop,
        serving,
    }
}

fn prefix() -> String {
    format!("t{}", uuid::Uuid::new_v4().simple())
}

async fn clean(prefix: &str) {
    let client = async_nats::connect(nats_url()).await.unwrap();
    let jetstream = async_nats::jetstream::new(client);
    let _ = jetstream.delete_stream(format!("{prefix}_jobs")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_spread_over_the_replicas_and_answer_their_submitter() {
    let prefix = prefix();
    let pause = Duration::from_millis(100);
    let a = replica(&prefix, Worker::new(pause, false), Duration::from_secs(5)).await;
    let b = replica(&prefix, Worker::new(pause, false), Duration::from_secs(5)).await;
    let calls = (0..16).map(|n| {
        let jobs = a.jobs.clone();
        async move { run_json::<_, i64>(jobs.as_ref(), "double", &n).await }
    });
    let answers = futures::future::join_all(calls).await;
    let answers: Vec<i64> = answers.into_iter().map(Result::unwrap).collect();
    assert_eq!(answers, (0..16).map(|n| n * 2).collect::<Vec<_>>());
    let on_a = a.worker.began.load(Ordering::SeqCst);
    let on_b = b.worker.began.load(Ordering::SeqCst);
    assert_eq!(on_a + on_b, 16);
    assert!(on_a > 0 && on_b > 0, "a did {on_a}, b did {on_b}");
    // A failure comes back as the handler's message; an unknown kind is
    // refused before anything is queued.
    match run_json::<_, i64>(b.jobs.as_ref(), "double", &-3).await {
        Err(JobError::Failed(message)) => assert_eq!(message, "-3 is negative"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        b.jobs.run("triple", Bytes::new()).await,
        Err(JobError::Unknown(_))
    ));
    let metrics = format!("{}{}", a.metrics.render(), b.metrics.render());
    assert!(
        metrics.contains(r#"conclave_jobs_done_total{kind="double",outcome="failed"} 1"#),
        "{metrics}"
    );
    for r in [a, b] {
        r.stop.cancel();
        r.serving.await.unwrap();
    }
    clean(&prefix).await;
}

/// A replica in a runtime of its own on its own thread, so that killing
/// it ends everything it runs, its NATS connection included, as SIGKILL
/// would.
fn replica_to_kill(
    prefix: String,
    ack_wait: Duration,
) -> (Arc<Worker>, std::sync::mpsc::Sender<()>) {
    let worker = Worker::new(Duration::ZERO, true);
    let (kill_tx, kill_rx) = std::sync::mpsc::channel::<()>();
    let theirs = worker.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let serving = runtime.block_on(replica(&prefix, theirs, ack_wait));
        let _ = kill_rx.recv();
        runtime.shutdown_background();
        drop(serving);
    });
    (worker, kill_tx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_replica_died_is_done_by_another_after_the_ack_wait() {
    let prefix = prefix();
    let ack_wait = Duration::from_secs(1);
    // Only the replica about to die takes jobs at first.
    let (doomed, kill) = replica_to_kill(prefix.clone(), ack_wait);
    let submitter = NatsJobs::connect(
        &nats_url(),
        &prefix,
        Handlers::default().with("double", doomed.clone()),
        QueueConfig {
            ack_wait,
            max_running: 1,
        },
        Arc::new(Metrics::new()),
    )
    .await
    .unwrap();
    let submitted =
        tokio::spawn(async move { run_json::<_, i64>(&submitter, "double", &21).await });
    let began = doomed.began_one.notified();
    if doomed.began.load(Ordering::SeqCst) == 0 {
        tokio::time::timeout(Duration::from_secs(30), began)
            .await
            .expect("the doomed replica takes the job");
    }
    kill.send(()).unwrap();
    let survivor = replica(&prefix, Worker::new(Duration::ZERO, false), ack_wait).await;
    let answered = tokio::time::timeout(Duration::from_secs(30), submitted)
        .await
        .expect("the job is handed to the survivor")
        .unwrap()
        .unwrap();
    assert_eq!(answered, 42);
    assert_eq!(survivor.worker.began.load(Ordering::SeqCst), 1);
    let metrics = survivor.metrics.render();
    assert!(
        metrics.contains(r#"conclave_jobs_taken_over_total{kind="double"} 1"#),
        "{metrics}"
    );
    survivor.stop.cancel();
    survivor.serving.await.unwrap();
    clean(&prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitter_that_stops_waiting_cancels_the_job_where_it_runs() {
    let prefix = prefix();
    let worker = Worker::new(Duration::from_secs(3600), false);
    let dropped = worker.dropped.clone();
    let r = replica(&prefix, worker, Duration::from_secs(5)).await;
    let began = r.worker.began_one.notified();
    let submitter = {
        let jobs = r.jobs.clone();
        tokio::spawn(async move { run_json::<_, i64>(jobs.as_ref(), "double", &1).await })
    };
    tokio::time::timeout(Duration::from_secs(30), began)
        .await
        .expect("the job begins");
    let gone = dropped.one.notified();
    submitter.abort();
    if dropped.count.load(Ordering::SeqCst) == 0 {
        tokio::time::timeout(Duration::from_secs(30), gone)
            .await
            .expect("the job stops once its submitter left");
    }
    r.stop.cancel();
    r.serving.await.unwrap();
    let metrics = r.metrics.render();
    assert!(
        metrics.contains(r#"conclave_jobs_done_total{kind="double",outcome="cancelled"} 1"#),
        "{metrics}"
    );
    clean(&prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_together_all_open_the_queue() {
    let prefix = prefix();
    let url = nats_url();
    let starts = (0..4).map(|_| {
        NatsJobs::connect(
            &url,
            &prefix,
            Handlers::default().with("double", Worker::new(Duration::ZERO, false)),
            QueueConfig {
                ack_wait: Duration::from_secs(5),
                max_running: 1,
            },
            Arc::new(Metrics::new()),
        )
    });
    for started in futures::future::join_all(starts).await {
        assert!(started.is_ok(), "{:?}", started.err());
    }
    clean(&prefix).await;
}
