//! Forking a sandbox's workspace: from a fork's first lease (a new sandbox
//! filled from the source's turn-end snapshot) to the first byte an `echo`
//! in it prints, for a workspace of 100 MB in 1,000 files, on docker and
//! on the local backend (as root). Next to it, on the same machine:
//!
//! - the same first lease without a snapshot (an empty workspace): what a
//!   fork costs on top of any new sandbox;
//! - docker's own way to branch a container, `docker commit` of a source
//!   whose workspace is in its writable layer, then create, start and exec
//!   in a container of the committed image (through the Docker API, as
//!   Conclave talks to it);
//! - on local, a plain copy: a new empty sandbox plus `cp -a` of the same
//!   tree on the host;
//! - 64 forks leased at once: the time until all 64 have printed;
//! - the disk a snapshot takes against the workspace's size, and what a
//!   turn end costs when the turn leased no sandbox.
//!
//! Run: `cargo bench --bench fork` (needs dockerd and the sandbox images;
//! `CONCLAVE_BENCH_ROUNDS` sets the rounds, default 10;
//! `CONCLAVE_BENCH_FORKS` the forks at once, default 64;
//! `CONCLAVE_BENCH_BACKENDS` which backends, default `docker,local`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CommitContainerOptionsBuilder, RemoveContainerOptionsBuilder, RemoveImageOptionsBuilder,
};
use conclave::config::SandboxConfig;
use conclave::sandbox::docker::DockerBackend;
use conclave::sandbox::local::{LocalBackend, LocalConfig};
use conclave::sandbox::manager::SandboxFor;
use conclave::sandbox::snapshots::Snapshots;
use conclave::sandbox::{ExecChunk, ExecRequest, SandboxBackend, SandboxManager};
use conclave::store::{SqliteStore, Store};
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const IMAGE: &str = "conclave/sandbox-python:latest";
/// 1,000 files of 100,000 random bytes in ten directories: 100 MB.
const FILES: usize = 1000;
const FILE_BYTES: usize = 100_000;
const MAKE_WORKSPACE: &str = "import os\nfor i in range(1000):\n    d = f'd{i // 100}'\n    os.makedirs(d, exist_ok=True)\n    with open(f'{d}/f{i}', 'wb') as f:\n        f.write(os.urandom(100000))\nprint('made')\n";

fn percentile(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index].as_secs_f64() * 1000.0
}

/// Runs `command` in the session's sandbox (leasing it, from `seed` when
/// it is new); the time from the lease to its first stdout, and all of it.
async fn run(
    manager: &SandboxManager,
    session: Uuid,
    seed: Option<&str>,
    command: &[&str],
) -> (Duration, String) {
    let started = Instant::now();
    let lease = manager
        .lease_from(
            session,
            manager.default_spec(),
            SandboxFor::Session { owner: None },
            seed,
        )
        .await
        .expect("lease");
    let (tx, mut rx) = mpsc::channel(64);
    let request = ExecRequest {
        command: command.iter().map(|c| c.to_string()).collect(),
        ..ExecRequest::shell("", Duration::from_secs(600))
    };
    let exec = lease.sandbox.exec(request, tx, CancellationToken::new());
    tokio::pin!(exec);
    let mut first = None;
    let mut out = Vec::new();
    let mut take = |chunk: ExecChunk| {
        if let ExecChunk::Stdout(data) = chunk {
            first.get_or_insert_with(|| started.elapsed());
            out.extend_from_slice(&data);
        }
    };
    let status = loop {
        tokio::select! {
            status = &mut exec => break status.expect("exec"),
            Some(chunk) = rx.recv() => take(chunk),
        }
    };
    while let Ok(chunk) = rx.try_recv() {
        take(chunk);
    }
    let out = String::from_utf8_lossy(&out).into_owned();
    assert_eq!(status.exit_code, Some(0), "{command:?}: {out}");
    (first.expect("the command printed"), out)
}

/// What one backend measured.
struct Figures {
    fork: Vec<Duration>,
    empty: Vec<Duration>,
    /// docker commit + run, or a new sandbox + `cp -a` on the host.
    peer: Vec<Duration>,
    peer_name: &'static str,
    /// Each fork's first output when `forks` start at once, and the time
    /// until the last.
    together: Vec<Duration>,
    together_all: Duration,
    workspace_bytes: u64,
    snapshot_bytes: u64,
    snapshot_taken: Duration,
    /// Bytes written by the turn end of a turn that leased no sandbox.
    idle_turn_bytes: u64,
}

fn manager(backend: Arc<dyn SandboxBackend>, data: &Path, forks: usize) -> SandboxManager {
    let config = SandboxConfig {
        image: IMAGE.into(),
        warm_pool: 0,
        disk_mb: 512,
        max_live: forks + 4,
        ..SandboxConfig::default()
    };
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(&data.join("bench.db")).expect("sqlite store"));
    let snapshots = Snapshots::new(
        store,
        data.join("snapshots"),
        3,
        "bench".into(),
        Duration::from_secs(600),
    );
    SandboxManager::new(
        backend,
        config,
        format!("bench-{}", Uuid::new_v4().simple()),
    )
    .with_snapshots(snapshots)
}

/// Bytes of the regular files under `dir` (tars, or layers), following
/// no link.
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| Some((e.path(), e.metadata().ok()?)))
                .map(|(path, m)| {
                    if m.is_dir() {
                        dir_bytes(&path)
                    } else if m.is_file() {
                        m.len()
                    } else {
                        0
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

async fn measure(
    backend: Arc<dyn SandboxBackend>,
    rounds: usize,
    forks: usize,
    peer: &Peer,
) -> Figures {
    let data = tempfile::tempdir().expect("tempdir");
    let manager = manager(backend, data.path(), forks);
    let snapshots = manager.snapshots().expect("snapshots").clone();

    // The source: 100 MB in 1,000 files, then its turn end.
    let source = Uuid::new_v4();
    run(&manager, source, None, &["python3", "-c", MAKE_WORKSPACE]).await;
    let (_, du) = run(&manager, source, None, &["du", "-sb", "."]).await;
    let workspace_bytes = du.split_whitespace().next().unwrap().parse().unwrap();
    let started = Instant::now();
    manager.snapshot_turn(source, None, 1);
    manager.snapshot_settled(source).await;
    let snapshot_taken = started.elapsed();
    let kept = snapshots.of_session(source).await.expect("snapshots");
    let snapshot = kept[0].snapshot_id.clone();
    let snapshot_bytes = dir_bytes(&data.path().join("snapshots"));
    // A turn that leased no sandbox: its turn end shares the snapshot.
    manager.snapshot_turn(source, None, 2);
    manager.snapshot_settled(source).await;
    let idle_turn_bytes = dir_bytes(&data.path().join("snapshots")) - snapshot_bytes;
    assert_eq!(
        snapshots.of_session(source).await.expect("snapshots").len(),
        1,
        "a turn without a lease shares the previous snapshot"
    );

    let listing = ["sh", "-c", "echo hi; ls d*/ | grep -c '^f'"];
    let (mut fork, mut empty, mut peer_samples) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let session = Uuid::new_v4();
        let (first, out) = run(&manager, session, Some(&snapshot), &listing).await;
        assert_eq!(
            out.lines().last(),
            Some(FILES.to_string().as_str()),
            "{out}"
        );
        fork.push(first);
        manager.release(session).await;
        let session = Uuid::new_v4();
        let (first, _) = run(&manager, session, None, &["echo", "hi"]).await;
        empty.push(first);
        manager.release(session).await;
        peer_samples.push(peer.once(&manager).await);
    }

    // Many forks at once, as many as the pool may hold.
    let started = Instant::now();
    let sessions: Vec<Uuid> = (0..forks).map(|_| Uuid::new_v4()).collect();
    let firsts = futures::future::join_all(sessions.iter().map(|&session| {
        let (manager, snapshot) = (&manager, &snapshot);
        async move {
            run(manager, session, Some(snapshot), &["echo", "hi"])
                .await
                .0
        }
    }))
    .await;
    let together_all = started.elapsed();
    futures::future::join_all(sessions.iter().map(|&s| manager.release(s))).await;
    manager.release(source).await;
    Figures {
        fork,
        empty,
        peer: peer_samples,
        peer_name: peer.name(),
        together: firsts,
        together_all,
        workspace_bytes,
        snapshot_bytes,
        snapshot_taken,
        idle_turn_bytes,
    }
}

/// What a fork is set against on each backend.
enum Peer {
    /// `docker commit` of this container, then a container of the image.
    DockerCommit { docker: Docker, source: String },
    /// `cp -a` of this tree on the host into a new empty sandbox's time.
    HostCopy { tree: tempfile::TempDir },
}

impl Peer {
    fn name(&self) -> &'static str {
        match self {
            Peer::DockerCommit { .. } => "docker commit + create/start/exec",
            Peer::HostCopy { .. } => "new sandbox + `cp -a` on the host",
        }
    }

    async fn once(&self, manager: &SandboxManager) -> Duration {
        match self {
            Peer::DockerCommit { docker, source } => commit_and_run(docker, source).await,
            Peer::HostCopy { tree } => {
                let started = Instant::now();
                let session = Uuid::new_v4();
                let to = tree.path().with_extension(session.simple().to_string());
                let copied = tokio::process::Command::new("cp")
                    .arg("-a")
                    .arg(tree.path().join("src"))
                    .arg(&to)
                    .status()
                    .await
                    .expect("cp");
                assert!(copied.success());
                run(manager, session, None, &["echo", "hi"]).await;
                let took = started.elapsed();
                manager.release(session).await;
                tokio::fs::remove_dir_all(&to).await.expect("remove copy");
                took
            }
        }
    }
}

async fn docker_exec(docker: &Docker, container: &str, cmd: &[&str], user: &str) -> Vec<u8> {
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                cmd: Some(cmd.iter().map(|c| c.to_string()).collect()),
                user: Some(user.to_string()),
                working_dir: Some("/workspace".into()),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .expect("create exec");
    let StartExecResults::Attached { mut output, .. } =
        docker.start_exec(&exec.id, None).await.expect("start exec")
    else {
        panic!("exec detached");
    };
    let mut out = Vec::new();
    while let Some(chunk) = output.next().await {
        out.extend_from_slice(&chunk.expect("exec output").into_bytes());
        if cmd[0] == "echo" {
            break;
        }
    }
    out
}

async fn container(docker: &Docker, image: &str) -> String {
    let body = ContainerCreateBody {
        image: Some(image.into()),
        cmd: Some(vec!["sleep".into(), "infinity".into()]),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            init: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    let made = docker
        .create_container(None, body)
        .await
        .expect("create container");
    docker
        .start_container(&made.id, None)
        .await
        .expect("start container");
    made.id
}

async fn remove(docker: &Docker, container: &str) {
    let options = RemoveContainerOptionsBuilder::new().force(true).build();
    docker
        .remove_container(container, Some(options))
        .await
        .expect("remove container");
}

/// Commit, create, start, first output of `echo`; then cleaned up.
async fn commit_and_run(docker: &Docker, source: &str) -> Duration {
    let started = Instant::now();
    let tag = Uuid::new_v4().simple().to_string();
    let options = CommitContainerOptionsBuilder::new()
        .container(source)
        .repo("conclave-bench-fork")
        .tag(&tag)
        .pause(false)
        .build();
    docker
        .commit_container(options, bollard::models::ContainerConfig::default())
        .await
        .expect("commit");
    let image = format!("conclave-bench-fork:{tag}");
    let copy = container(docker, &image).await;
    let out = docker_exec(docker, &copy, &["echo", "hi"], "1000").await;
    let took = started.elapsed();
    assert!(String::from_utf8_lossy(&out).contains("hi"));
    remove(docker, &copy).await;
    docker
        .remove_image(&image, Some(RemoveImageOptionsBuilder::new().build()), None)
        .await
        .expect("remove image");
    took
}

fn row(backend: &str, case: &str, samples: &mut [Duration]) {
    println!(
        "| {backend:<7} | {case:<38} | {:>8.1} | {:>8.1} | {:>4} |",
        percentile(samples, 0.5),
        percentile(samples, 0.99),
        samples.len()
    );
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let rounds = env("CONCLAVE_BENCH_ROUNDS", 10).max(2);
    let forks = env("CONCLAVE_BENCH_FORKS", 64);
    let docker = Docker::connect_with_local_defaults().expect("dockerd");
    // docker's peer: a container whose workspace is in its writable layer.
    let source = container(&docker, IMAGE).await;
    docker_exec(&docker, &source, &["python3", "-c", MAKE_WORKSPACE], "root").await;
    let docker_peer = Peer::DockerCommit {
        docker: docker.clone(),
        source: source.clone(),
    };
    // local's peer: the same tree on the host.
    let tree = tempfile::tempdir().expect("tempdir");
    let mut random = std::fs::File::open("/dev/urandom").expect("urandom");
    let mut bytes = vec![0u8; FILE_BYTES];
    for i in 0..FILES {
        let dir = tree.path().join("src").join(format!("d{}", i / 100));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::io::Read::read_exact(&mut random, &mut bytes).expect("random bytes");
        std::fs::write(dir.join(format!("f{i}")), &bytes).expect("write");
    }
    let local_peer = Peer::HostCopy { tree };

    let backends: [(&str, Arc<dyn SandboxBackend>, &Peer); 2] = [
        (
            "docker",
            // Layered workspaces where the host allows them (as the server
            // makes its docker backend).
            Arc::new(
                DockerBackend::connect()
                    .await
                    .expect("dockerd answers")
                    .with_layers(tempfile::tempdir().expect("tempdir").keep())
                    .await,
            ),
            &docker_peer,
        ),
        (
            "local",
            Arc::new(
                LocalBackend::new(
                    LocalConfig::default(),
                    tempfile::tempdir().expect("tempdir").keep(),
                )
                .expect("local backend"),
            ),
            &local_peer,
        ),
    ];
    // CONCLAVE_BENCH_BACKENDS: which of them (default both).
    let wanted = std::env::var("CONCLAVE_BENCH_BACKENDS").unwrap_or_else(|_| "docker,local".into());
    let mut all = Vec::new();
    for (name, backend, peer) in backends {
        if wanted.split(',').any(|w| w.trim() == name) {
            all.push((name, measure(backend, rounds, forks, peer).await));
        }
    }
    remove(&docker, &source).await;

    println!(
        "workspace of {FILES} files, {} MB: lease → first output, ms",
        FILES * FILE_BYTES / 1_000_000
    );
    println!("| backend | case                                   |      p50 |      p99 |    n |");
    println!("|---------|----------------------------------------|----------|----------|------|");
    for (name, f) in &mut all {
        row(name, "fork: new sandbox from the snapshot", &mut f.fork);
        row(name, "new sandbox, empty workspace", &mut f.empty);
        row(name, f.peer_name, &mut f.peer);
        row(
            name,
            &format!("{forks} forks at once, each"),
            &mut f.together,
        );
    }
    println!();
    println!(
        "| backend | {forks} forks: all printed, ms | workspace, MB | snapshot on disk, MB | taking it, ms | turn end without a lease, bytes |"
    );
    println!("|---------|------|------|------|------|------|");
    for (name, f) in &all {
        println!(
            "| {name} | {:.0} | {:.1} | {:.1} | {:.0} | {} |",
            f.together_all.as_secs_f64() * 1000.0,
            f.workspace_bytes as f64 / 1e6,
            f.snapshot_bytes as f64 / 1e6,
            f.snapshot_taken.as_secs_f64() * 1000.0,
            f.idle_turn_bytes
        );
    }
}
