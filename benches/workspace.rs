//! A session's workspace in and out through the release server, next to
//! `docker cp` of the same data into and out of a container:
//!
//! - upload: `PUT /agent/session/{id}/workspace?path=in` of a tar of
//!   100 MB in 1,000 files (random bytes, ten directories), streamed from
//!   disk, until the answer, into a session whose sandbox runs already
//!   (made by a one-byte upload first); against `docker cp DIR
//!   CONTAINER:/workspace/in` into a running container of the same image
//!   (a sandbox's root file system is read-only, which `docker cp`
//!   refuses). Also the same upload into a new session, whose sandbox the
//!   upload makes;
//! - download: `GET /agent/session/{id}/workspace`, read to the end;
//!   against `docker cp CONTAINER:/workspace/… -` (a tar on stdout);
//! - the server's resident memory above where it stood before each, its
//!   highest of samples every 5 ms;
//! - `changes` between two turn ends of that workspace (a turn that
//!   appends to ten of the files), answered as JSON.
//!
//! Run: `cargo bench --bench workspace` (needs dockerd, the sandbox image
//! and the docker CLI; `CONCLAVE_BENCH_ROUNDS` sets the rounds, default 3).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/server.rs"]
mod server;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use server::ServerProcess;

const IMAGE: &str = "conclave/sandbox-python:latest";
const FILES: usize = 1000;
const FILE_BYTES: usize = 100_000;

/// The server's resident memory in bytes (VmRSS).
fn rss(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// Runs `work` while sampling the server's RSS; its duration and the most
/// the RSS rose above where it stood before.
async fn measured<F: std::future::Future<Output = ()>>(pid: &str, work: F) -> (Duration, u64) {
    let before = rss(pid);
    let peak = Arc::new(AtomicU64::new(before));
    let stop = tokio_util::sync::CancellationToken::new();
    let sampler = {
        let (pid, peak, stop) = (pid.to_owned(), peak.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                peak.fetch_max(rss(&pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let started = Instant::now();
    work.await;
    let took = started.elapsed();
    stop.cancel();
    sampler.await.unwrap();
    (took, peak.load(Ordering::Relaxed).saturating_sub(before))
}

/// A new session of the server at `base`; its id.
async fn new_session(http: &reqwest::Client, base: &str) -> String {
    let created: Value = http
        .post(format!("{base}/agent/session"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    created["session_id"].as_str().unwrap().to_owned()
}

fn make_tree(dir: &Path) {
    let mut rng = fastrand::Rng::with_seed(68);
    for i in 0..FILES {
        let sub = dir.join(format!("d{}", i / 100));
        std::fs::create_dir_all(&sub).unwrap();
        let mut data = vec![0u8; FILE_BYTES];
        rng.fill(&mut data);
        std::fs::write(sub.join(format!("f{i}")), data).unwrap();
    }
}

fn docker(args: &[&str]) -> Duration {
    let started = Instant::now();
    let out = std::process::Command::new("docker")
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("the docker CLI runs");
    assert!(out.success(), "docker {args:?}");
    started.elapsed()
}

/// A docker CLI command's output, trimmed.
fn docker_out(args: &[&str]) -> String {
    let out = std::process::Command::new("docker")
        .args(args)
        .output()
        .expect("the docker CLI runs");
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[samples.len() / 2]
}

#[tokio::main]
async fn main() {
    let rounds: usize = std::env::var("CONCLAVE_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let tree = work.path().join("tree");
    make_tree(&tree);
    let archive = work.path().join("tree.tar");
    let status = std::process::Command::new("tar")
        .args([
            "-C",
            tree.to_str().unwrap(),
            "-cf",
            archive.to_str().unwrap(),
            ".",
        ])
        .status()
        .unwrap();
    assert!(status.success());
    let server = ServerProcess::start(&[
        ("CONCLAVE_SANDBOX__BACKEND", "docker".into()),
        ("CONCLAVE_SANDBOX__DISK_MB", "1024".into()),
        ("RUST_LOG", "warn".into()),
    ])
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let pid = server.pid().unwrap();
    let base = format!("http://{}", server.addr);
    let http = reqwest::Client::new();
    println!(
        "workspace: {FILES} files, {} MB; {rounds} rounds; load {}",
        FILES * FILE_BYTES / 1_000_000,
        server::loadavg()
    );
    let (mut up, mut up_cp, mut down, mut down_cp, mut changes) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut up_cold = Vec::new();
    let upload = |url: String| {
        let (http, archive) = (http.clone(), archive.clone());
        async move {
            let file = tokio::fs::File::open(&archive).await.unwrap();
            // Read in large pieces: 4 KiB reads of a tokio file (the
            // default) made this client slower than the server.
            let stream = tokio_util::io::ReaderStream::with_capacity(file, 1 << 20);
            let body = reqwest::Body::wrap_stream(stream);
            let response = http
                .put(&url)
                .header("content-type", "application/x-tar")
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
        }
    };
    let (mut up_rss, mut down_rss) = (0u64, 0u64);
    for _ in 0..rounds {
        let id = new_session(&http, &base).await;
        let url = format!("{base}/agent/session/{id}/workspace");
        // Its sandbox made first, by one byte.
        let one = http
            .put(format!("{base}/agent/session/{id}/files/one.txt"))
            .header("content-type", "application/octet-stream")
            .body("1")
            .send()
            .await
            .unwrap();
        assert_eq!(one.status(), 200);
        let (took, rose) = measured(&pid, upload(format!("{url}?path=in"))).await;
        up.push(took.as_secs_f64() * 1000.0);
        up_rss = up_rss.max(rose);

        // The upload's own snapshot (a tar of the workspace, taken after
        // it answered) done first: the download alone is measured.
        http.get(format!("{base}/agent/session/{id}/snapshots"))
            .send()
            .await
            .unwrap();
        let (took, rose) = measured(&pid, async {
            let mut response = http.get(&url).send().await.unwrap();
            assert_eq!(response.status(), 200);
            let mut bytes = 0usize;
            while let Some(chunk) = response.chunk().await.unwrap() {
                bytes += chunk.len();
            }
            assert!(bytes > FILES * FILE_BYTES, "{bytes}");
        })
        .await;
        down.push(took.as_secs_f64() * 1000.0);
        down_rss = down_rss.max(rose);

        // The peer: a container of the same image (a sandbox's root file
        // system is read-only, which docker cp refuses), the same tree
        // copied into its /workspace and out again.
        let peer = docker_out(&[
            "run",
            "-d",
            "--rm",
            "--entrypoint",
            "sleep",
            IMAGE,
            "infinity",
        ]);
        let source = format!("{}/.", tree.display());
        let target = format!("{peer}:/workspace/in");
        up_cp.push(docker(&["cp", &source, &target]).as_secs_f64() * 1000.0);
        let whole = format!("{peer}:/workspace/in/.");
        down_cp.push(docker(&["cp", &whole, "-"]).as_secs_f64() * 1000.0);
        docker(&["rm", "-f", &peer]);

        // Changes between two turn ends of that workspace.
        let turn = |prompt: &'static str| {
            let request = http
                .post(format!("{base}/agent/session/{id}/message"))
                .json(&json!({ "prompt": prompt }));
            async move {
                let text = request.send().await.unwrap().text().await.unwrap();
                assert!(text.contains("\"status\":\"success\""), "{text}");
            }
        };
        turn("$ true").await;
        turn("$ for i in 0 1 2 3 4 5 6 7 8 9; do echo more >> in/d0/f$i; done").await;
        // The last turn end's snapshot taken (its listing waits for it).
        http.get(format!("{base}/agent/session/{id}/snapshots"))
            .send()
            .await
            .unwrap();
        let started = Instant::now();
        let listed: Value = http
            .get(format!("{base}/agent/session/{id}/changes"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        changes.push(started.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(
            listed["files"].as_array().map(Vec::len),
            Some(10),
            "{listed}"
        );
        // Last, alone: a new session, whose sandbox the upload makes.
        let fresh = new_session(&http, &base).await;
        let (took, _) = measured(
            &pid,
            upload(format!("{base}/agent/session/{fresh}/workspace")),
        )
        .await;
        up_cold.push(took.as_secs_f64() * 1000.0);
        // Its snapshot taken before it goes: nothing of it runs on into
        // the next round.
        http.get(format!("{base}/agent/session/{fresh}/snapshots"))
            .send()
            .await
            .unwrap();
        let _ = http
            .delete(format!("{base}/agent/session/{fresh}"))
            .send()
            .await
            .unwrap();
        let _ = http
            .delete(format!("{base}/agent/session/{id}"))
            .send()
            .await
            .unwrap();
    }
    let (up, up_cp) = (median(&mut up), median(&mut up_cp));
    let (down, down_cp) = (median(&mut down), median(&mut down_cp));
    println!("| what | Conclave, p50 ms | docker cp, p50 ms | ratio |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| upload 100 MB / 1,000 files | {up:.0} | {up_cp:.0} | {:.2}× |",
        up / up_cp
    );
    let up_cold = median(&mut up_cold);
    println!(
        "| the same into a new session (its sandbox made by the upload) | {up_cold:.0} | {up_cp:.0} | {:.2}× |",
        up_cold / up_cp
    );
    println!(
        "| download 100 MB / 1,000 files | {down:.0} | {down_cp:.0} | {:.2}× |",
        down / down_cp
    );
    println!(
        "server RSS rise, most of {rounds} rounds: upload {:.1} MB, download {:.1} MB",
        up_rss as f64 / 1e6,
        down_rss as f64 / 1e6
    );
    println!(
        "changes between two turn ends (10 files modified): p50 {:.0} ms",
        median(&mut changes)
    );
}
