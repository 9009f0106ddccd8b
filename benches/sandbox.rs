//! Sandbox start and exec latency against the docker CLI, in one run.
//!
//! - A new session's first exec when the warm pool has a sandbox ready
//!   (target p50 ≤ 30 ms on docker, ≤ 15 ms local).
//! - A cold create+start (ready to exec) against `docker run -d` of the same
//!   image with the same limits (target ≤ 1.0×).
//! - An exec round trip (`true`) against `docker exec` on the same container;
//!   on local, through the resident helper against a container per exec
//!   (the bulk path, as every exec ran before the helper).
//!
//! Run: `cargo bench --bench sandbox` (needs dockerd and the sandbox images;
//! `CONCLAVE_BENCH_ROUNDS` sets the rounds, default 30).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use conclave::config::SandboxConfig;
use conclave::sandbox::docker::DockerBackend;
use conclave::sandbox::local::{LocalBackend, LocalConfig};
use conclave::sandbox::{
    ExecRequest, LABEL_MANAGED, SandboxBackend, SandboxManager, SandboxSpec, exec_collect,
};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const IMAGE: &str = "conclave/sandbox-python:latest";

fn percentile(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index].as_secs_f64() * 1000.0
}

fn report(name: &str, samples: &mut [Duration]) -> f64 {
    let p50 = percentile(samples, 0.5);
    println!(
        "{name:<44} p50 {p50:>8.2} ms  p90 {:>8.2} ms  max {:>8.2} ms  (n={})",
        percentile(samples, 0.9),
        percentile(samples, 1.0),
        samples.len()
    );
    p50
}

async fn exec_true(sandbox: &dyn conclave::sandbox::Sandbox) {
    let request = ExecRequest {
        command: vec!["true".into()],
        ..ExecRequest::shell("", Duration::from_secs(30))
    };
    let (status, _) = exec_collect(sandbox, request, 1024, CancellationToken::new(), |_| {})
        .await
        .expect("exec");
    assert_eq!(status.exit_code, Some(0));
}

/// `true` on the bulk path: on local, in a container of its own, as every
/// exec ran before the resident helper.
async fn exec_true_alone(sandbox: &dyn conclave::sandbox::Sandbox) {
    let request = ExecRequest {
        command: vec!["true".into()],
        ..ExecRequest::shell("", Duration::from_secs(30))
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let drain = async { while rx.recv().await.is_some() {} };
    let (status, ()) = tokio::join!(
        sandbox.exec_bulk(request, tx, CancellationToken::new()),
        drain
    );
    assert_eq!(status.expect("exec").exit_code, Some(0));
}

/// A new session's lease plus its first exec, with a ready pool each time.
async fn warm_first_exec(backend: Arc<dyn SandboxBackend>, rounds: usize) -> Vec<Duration> {
    let config = SandboxConfig {
        image: IMAGE.into(),
        warm_pool: 1,
        ..SandboxConfig::default()
    };
    // As the server runs it: sessions' sandboxes marked in the data
    // directory, so a new session's lease lists nothing.
    let data_dir = tempfile::tempdir().expect("data directory");
    let manager = Arc::new(
        SandboxManager::new(
            backend,
            config,
            format!("bench-{}", Uuid::new_v4().simple()),
        )
        .with_marks(data_dir.path().join("sandbox-sessions")),
    );
    let stop = CancellationToken::new();
    let pool = tokio::spawn({
        let (manager, stop) = (manager.clone(), stop.clone());
        async move { manager.run_pool(stop).await }
    });
    let mut samples = Vec::new();
    for _ in 0..rounds {
        assert!(
            manager.wait_pooled(1, Duration::from_secs(60)).await,
            "pool refill"
        );
        let session = Uuid::new_v4();
        let started = Instant::now();
        let lease = manager
            .lease(session, manager.default_spec())
            .await
            .expect("lease");
        exec_true(lease.sandbox.as_ref()).await;
        samples.push(started.elapsed());
        drop(lease);
        manager.release(session).await;
    }
    stop.cancel();
    let _ = pool.await;
    samples
}

fn spec() -> SandboxSpec {
    SandboxSpec {
        image: IMAGE.into(),
        cpus: 1.0,
        memory_mb: 512,
        pids: 256,
        disk_mb: 256,
        network: false,
        egress: None,
        env: BTreeMap::new(),
        labels: BTreeMap::from([(LABEL_MANAGED.to_string(), "true".to_string())]),
    }
}

fn docker_cli(args: &[&str]) -> String {
    let output = Command::new("docker")
        .args(args)
        .output()
        .expect("docker CLI");
    assert!(
        output.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// `docker run -d` with the limits the backend sets, ready when it returns.
fn docker_run_args() -> Vec<&'static str> {
    vec![
        "run",
        "-d",
        "--network",
        "none",
        "--read-only",
        "--tmpfs",
        "/workspace:size=256m,uid=1000,gid=1000",
        "--tmpfs",
        "/tmp:size=64m",
        "--user",
        "1000:1000",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges:true",
        "--pids-limit",
        "256",
        "--memory",
        "512m",
        "--cpus",
        "1",
        "--init",
        "--label",
        "conclave.bench=true",
        IMAGE,
        "sleep",
        "infinity",
    ]
}

#[tokio::main]
async fn main() {
    let rounds: usize = std::env::var("CONCLAVE_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(30);
    let docker: Arc<dyn SandboxBackend> =
        Arc::new(DockerBackend::connect().await.expect("dockerd answers"));

    println!("== docker");
    let mut warm = warm_first_exec(docker.clone(), rounds).await;
    report("warm pool: lease + first exec", &mut warm);

    let (mut ours, mut cli) = (Vec::new(), Vec::new());
    for _ in 0..rounds.min(20) {
        let started = Instant::now();
        let sandbox = docker.create(&spec()).await.expect("create");
        ours.push(started.elapsed());
        sandbox.destroy().await.expect("destroy");

        let args = docker_run_args();
        let started = Instant::now();
        let id = docker_cli(&args);
        cli.push(started.elapsed());
        docker_cli(&["rm", "-f", &id]);
    }
    let ours_p50 = report("cold create+start (bollard)", &mut ours);
    let cli_p50 = report("cold `docker run -d` (CLI)", &mut cli);
    println!("{:<44} {:.2}×", "ratio", ours_p50 / cli_p50);

    let sandbox = docker.create(&spec()).await.expect("create");
    let (mut ours, mut cli) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let started = Instant::now();
        exec_true(sandbox.as_ref()).await;
        ours.push(started.elapsed());
        let started = Instant::now();
        docker_cli(&["exec", sandbox.id(), "true"]);
        cli.push(started.elapsed());
    }
    let ours_p50 = report("exec round trip (bollard)", &mut ours);
    let cli_p50 = report("exec round trip (`docker exec` CLI)", &mut cli);
    println!("{:<44} {:.2}×", "ratio", ours_p50 / cli_p50);
    sandbox.destroy().await.expect("destroy");

    println!("== local");
    let root = tempfile::tempdir().expect("tempdir");
    let local: Arc<dyn SandboxBackend> = Arc::new(
        LocalBackend::new(LocalConfig::default(), root.path().to_path_buf())
            .expect("local backend"),
    );
    let mut warm = warm_first_exec(local.clone(), rounds).await;
    report("warm pool: lease + first exec", &mut warm);
    let sandbox = local.create(&spec()).await.expect("create");
    let (mut ours, mut alone) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let started = Instant::now();
        exec_true(sandbox.as_ref()).await;
        ours.push(started.elapsed());
        let started = Instant::now();
        exec_true_alone(sandbox.as_ref()).await;
        alone.push(started.elapsed());
    }
    let ours_p50 = report("exec round trip (resident helper)", &mut ours);
    let alone_p50 = report("exec round trip (a container per exec)", &mut alone);
    println!("{:<44} {:.2}×", "ratio", ours_p50 / alone_p50);
    sandbox.destroy().await.expect("destroy");
}
