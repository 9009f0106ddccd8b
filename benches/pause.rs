//! A paused sandbox's first output: from a session's next call (its lease,
//! which resumes the sandbox) to the first byte an `echo` prints, against
//! the same call on a sandbox that is running (the baseline), on docker
//! and on the local backend (as root: the cgroup freezer). Goal: p50 ≤
//! 30 ms after a pause.
//!
//! Each round waits for the manager to pause the idle sandbox
//! (`sandbox.pause_after_s = 1`), so a round takes a little over a second.
//!
//! Run: `cargo bench --bench pause` (needs dockerd and the sandbox images;
//! `CONCLAVE_BENCH_ROUNDS` sets the rounds, default 20).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use conclave::config::SandboxConfig;
use conclave::sandbox::docker::DockerBackend;
use conclave::sandbox::local::{LocalBackend, LocalConfig};
use conclave::sandbox::{ExecChunk, ExecRequest, SandboxBackend, SandboxManager};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

fn percentile(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index].as_secs_f64() * 1000.0
}

/// From the session's lease to the first stdout of `echo`.
async fn first_output(manager: &SandboxManager, session: Uuid) -> Duration {
    let started = Instant::now();
    let lease = manager
        .lease(session, manager.default_spec())
        .await
        .expect("lease");
    let (tx, mut rx) = mpsc::channel(16);
    let request = ExecRequest {
        command: vec!["echo".into(), "hi".into()],
        ..ExecRequest::shell("", Duration::from_secs(30))
    };
    let run = lease.sandbox.exec(request, tx, CancellationToken::new());
    tokio::pin!(run);
    let mut first = None;
    loop {
        tokio::select! {
            status = &mut run => {
                assert_eq!(status.expect("exec").exit_code, Some(0));
                break;
            }
            Some(chunk) = rx.recv() => {
                if matches!(chunk, ExecChunk::Stdout(_)) && first.is_none() {
                    first = Some(started.elapsed());
                }
            }
        }
    }
    while let Ok(chunk) = rx.try_recv() {
        if matches!(chunk, ExecChunk::Stdout(_)) && first.is_none() {
            first = Some(started.elapsed());
        }
    }
    first.expect("echo printed")
}

/// Waits until the manager has paused the session's idle sandbox.
async fn paused(manager: &SandboxManager, session: Uuid) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !manager.is_paused(session) {
        assert!(Instant::now() < deadline, "the sandbox was not paused");
        manager.pause_idle().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Samples on `backend`: running, running after as long idle as a pause
/// takes to come (nothing paused), and after a pause.
async fn measure(backend: Arc<dyn SandboxBackend>, rounds: usize) -> [Vec<Duration>; 3] {
    let config = SandboxConfig {
        image: "conclave/sandbox-python:latest".into(),
        warm_pool: 0,
        pause_after_s: 1,
        ..SandboxConfig::default()
    };
    let manager = SandboxManager::new(
        backend,
        config,
        format!("bench-{}", Uuid::new_v4().simple()),
    );
    let session = Uuid::new_v4();
    // Made, and its helper started, before anything is timed.
    first_output(&manager, session).await;
    let (mut running, mut idle, mut resumed) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        running.push(first_output(&manager, session).await);
        let since = Instant::now();
        paused(&manager, session).await;
        let waited = since.elapsed();
        resumed.push(first_output(&manager, session).await);
        // The baseline's caches and CPU as cold as after the pause.
        tokio::time::sleep(waited).await;
        idle.push(first_output(&manager, session).await);
    }
    assert_eq!(
        manager.pause_metrics().resumes.get(),
        rounds as u64,
        "every round resumed"
    );
    manager.release(session).await;
    [running, idle, resumed]
}

fn row(backend: &str, case: &str, samples: &mut [Duration]) {
    println!(
        "| {backend:<7} | {case:<30} | {:>8.2} | {:>8.2} | {:>4} |",
        percentile(samples, 0.5),
        percentile(samples, 0.99),
        samples.len()
    );
}

#[tokio::main]
async fn main() {
    let rounds: usize = std::env::var("CONCLAVE_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20);
    let docker: Arc<dyn SandboxBackend> =
        Arc::new(DockerBackend::connect().await.expect("dockerd answers"));
    let root = tempfile::tempdir().expect("tempdir");
    let local: Arc<dyn SandboxBackend> = Arc::new(
        LocalBackend::new(LocalConfig::default(), root.path().to_path_buf())
            .expect("local backend"),
    );
    println!("lease → first output of `echo hi`, ms");
    println!("| backend | case                           |      p50 |      p99 |    n |");
    println!("|---------|--------------------------------|----------|----------|------|");
    for (name, backend) in [("docker", docker), ("local", local)] {
        let [mut running, mut idle, mut resumed] = measure(backend, rounds).await;
        row(name, "running (baseline)", &mut running);
        row(name, "running, idle as long", &mut idle);
        row(name, "paused: resume + first output", &mut resumed);
    }
}
