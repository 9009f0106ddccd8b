//! Pausing idle sandboxes (`sandbox.pause_after_s`) on a real dockerd and
//! on the local backend (as root, through the cgroup freezer): a
//! background run is frozen with its sandbox and carries on when the next
//! lease resumes it, a paused sandbox is still destroyed after the idle
//! TTL, and through the real binary `GET /sandboxes` shows `paused`, the
//! next tool call works and `/metrics` counts it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::binary::{json_of, serve_command, spawn_server, stop};
use common::ndjson;
use conclave::config::SandboxConfig;
use conclave::sandbox::docker::DockerBackend;
use conclave::sandbox::local::{LocalBackend, LocalConfig};
use conclave::sandbox::{
    ExecRequest, Lease, SandboxBackend, SandboxError, SandboxManager, exec_collect,
};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Local sandboxes live under a directory of the test process's own.
fn local_root() -> PathBuf {
    static ROOT: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| tempfile::tempdir().expect("tempdir"))
        .path()
        .to_path_buf()
}

/// A backend, and where its sandboxes' workspaces are on this host (only
/// local ones are).
async fn local() -> (Arc<dyn SandboxBackend>, Option<PathBuf>) {
    let backend = LocalBackend::new(LocalConfig::default(), local_root())
        .expect("the local backend starts (namespaces must be available)");
    (Arc::new(backend), Some(local_root()))
}

async fn docker() -> (Arc<dyn SandboxBackend>, Option<PathBuf>) {
    let backend = DockerBackend::connect()
        .await
        .expect("dockerd must answer (scripts/test.sh starts it)");
    (Arc::new(backend), None)
}

fn manager(backend: Arc<dyn SandboxBackend>, idle_ttl_s: u64) -> Arc<SandboxManager> {
    let config = SandboxConfig {
        image: "conclave/sandbox-shell:latest".into(),
        pause_after_s: 1,
        idle_ttl_s,
        warm_pool: 0,
        memory_mb: 128,
        ..SandboxConfig::default()
    };
    let instance = format!("pause-test-{}", Uuid::new_v4().simple());
    Arc::new(SandboxManager::new(backend, config, instance))
}

async fn sh(lease: &Lease, command: &str) -> String {
    let (status, out) = exec_collect(
        lease.sandbox.as_ref(),
        ExecRequest::shell(command, Duration::from_secs(30)),
        1 << 20,
        CancellationToken::new(),
        |_| {},
    )
    .await
    .expect("exec runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        status.exit_code,
        Some(0),
        "{command}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Polls `done` until it holds, failing after `within`.
async fn until<F: std::future::Future<Output = bool>>(
    what: &str,
    within: Duration,
    mut done: impl FnMut() -> F,
) {
    let deadline = Instant::now() + within;
    while !done().await {
        assert!(Instant::now() < deadline, "gave up waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts, as `execute_shell {background: true}` does, a run that appends
/// `<its pid> <count> <unix ms>` to /workspace/count every 50 ms.
fn background_counter(lease: Lease, cancel: CancellationToken) -> JoinHandle<()> {
    let lease = lease.into_background();
    let script = "i=0; while true; do i=$((i+1)); \
                  echo \"$$ $i $(date +%s%3N)\" >> /workspace/count; sleep 0.05; done";
    tokio::spawn(async move {
        let request = ExecRequest::shell(script, Duration::from_secs(600));
        let _ = exec_collect(lease.sandbox.as_ref(), request, 1024, cancel, |_| {}).await;
    })
}

/// The counter's lines: (pid, count, unix ms).
fn lines(text: &str) -> Vec<(String, u64, i64)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            Some((
                parts.next()?.to_string(),
                parts.next()?.parse().ok()?,
                parts.next()?.parse().ok()?,
            ))
        })
        .collect()
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Waits until the manager has paused the session's sandbox, running its
/// pass as the server's loop does.
async fn wait_paused(manager: &SandboxManager, session: Uuid) {
    until("the sandbox is paused", Duration::from_secs(20), || async {
        manager.pause_idle().await;
        manager.is_paused(session)
    })
    .await;
}

async fn a_background_run_survives_a_pause(
    (backend, host_root): (Arc<dyn SandboxBackend>, Option<PathBuf>),
) {
    let manager = manager(backend, 600);
    let session = Uuid::new_v4();
    let spec = manager.default_spec();
    let lease = manager.lease(session, spec.clone()).await.expect("lease");
    let id = lease.sandbox.id().to_string();
    let cancel = CancellationToken::new();
    let run = background_counter(lease, cancel.clone());
    // A call sees it counting, then leaves the sandbox idle.
    let probe = manager.lease(session, spec.clone()).await.expect("lease");
    until("the counter runs", Duration::from_secs(20), || {
        let text = sh(&probe, "cat /workspace/count 2>/dev/null || true");
        async move { lines(&text.await).len() >= 3 }
    })
    .await;
    drop(probe);

    wait_paused(&manager, session).await;
    let paused_at = now_ms();
    let info = manager.info(session).await.expect("info");
    assert_eq!(
        (info.id.as_str(), info.state.as_str()),
        (id.as_str(), "paused")
    );
    assert_eq!(manager.pause_metrics().pauses.get(), 1);
    // Where the workspace is on this host, it can be read without
    // resuming the sandbox: nothing is written while it is paused.
    if let Some(root) = &host_root {
        let file = root.join(&id).join("workspace/count");
        let before = std::fs::read_to_string(&file).expect("count");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(std::fs::read_to_string(&file).expect("count"), before);
    } else {
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let resumed_at = now_ms();

    // Two calls at once resume it once.
    let (a, b) = tokio::join!(
        manager.lease(session, spec.clone()),
        manager.lease(session, spec.clone())
    );
    let (a, _b) = (a.expect("lease"), b.expect("lease"));
    assert_eq!(manager.pause_metrics().resumes.get(), 1);
    assert!(!manager.is_paused(session));
    let before = lines(&sh(&a, "cat /workspace/count").await);
    until("the counter goes on", Duration::from_secs(20), || {
        let text = sh(&a, "cat /workspace/count");
        let before = before.len();
        async move { lines(&text.await).len() > before + 2 }
    })
    .await;
    let after = lines(&sh(&a, "cat /workspace/count").await);
    // One process throughout, counting on from where it stopped, and
    // nothing written while the sandbox was paused.
    let pid = &after[0].0;
    assert!(after.iter().all(|(p, _, _)| p == pid), "{after:?}");
    assert!(
        after.windows(2).all(|w| w[1].1 == w[0].1 + 1),
        "the count restarted: {after:?}"
    );
    let frozen: Vec<_> = after
        .iter()
        .filter(|(_, _, at)| *at > paused_at + 100 && *at < resumed_at)
        .collect();
    assert!(frozen.is_empty(), "written while paused: {frozen:?}");
    assert!(!run.is_finished(), "the background run ended");

    cancel.cancel();
    run.await.expect("run");
    drop((a, _b));
    manager.release(session).await;
}

async fn a_paused_sandbox_is_still_destroyed_after_the_idle_ttl(
    (backend, _): (Arc<dyn SandboxBackend>, Option<PathBuf>),
) {
    let manager = manager(backend.clone(), 2);
    let session = Uuid::new_v4();
    let lease = manager
        .lease(session, manager.default_spec())
        .await
        .expect("lease");
    let id = lease.sandbox.id().to_string();
    // A background run holds a lease, yet a paused sandbox makes no
    // progress for it: it goes after the idle TTL.
    let run = background_counter(lease, CancellationToken::new());
    wait_paused(&manager, session).await;
    until(
        "the idle sandbox is destroyed",
        Duration::from_secs(20),
        || async { manager.reap_idle().await == 1 },
    )
    .await;
    let left = backend.list_managed().await.expect("list");
    assert!(left.iter().all(|m| m.id != id), "{left:?}");
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("the background run ended with its sandbox")
        .expect("run");
}

macro_rules! suite {
    ($backend:ident: $($test:ident),* $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::$backend().await).await;
                }
            )*
        }
    };
}

suite!(docker:
    a_background_run_survives_a_pause,
    a_paused_sandbox_is_still_destroyed_after_the_idle_ttl,
);

suite!(local:
    a_background_run_survives_a_pause,
    a_paused_sandbox_is_still_destroyed_after_the_idle_ttl,
);

/// A process that attaches a paused docker sandbox (`conclave mcp` beside
/// the server) resumes it, as the server's next call would; an exec into a
/// paused container through `docker exec` says the sandbox is paused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_attaching_a_paused_sandbox_resumes_it() {
    let (backend, _) = docker().await;
    let manager = manager(backend, 600);
    let session = Uuid::new_v4();
    let lease = manager
        .lease(session, manager.default_spec())
        .await
        .expect("lease");
    sh(&lease, "echo kept > /workspace/f").await;
    let id = lease.sandbox.id().to_string();
    drop(lease);
    wait_paused(&manager, session).await;

    // Paused at docker's level: it refuses an exec.
    let refused = tokio::process::Command::new("docker")
        .args(["exec", &id, "true"])
        .output()
        .await
        .expect("docker CLI");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("paused"));

    let (other, _) = docker().await;
    let attached = other.attach(&id).await.expect("attach").expect("found");
    let (status, out) = exec_collect(
        attached.as_ref(),
        ExecRequest::shell("cat /workspace/f", Duration::from_secs(30)),
        1024,
        CancellationToken::new(),
        |_| {},
    )
    .await
    .expect("exec");
    assert_eq!(
        (
            status.exit_code,
            String::from_utf8_lossy(&out.stdout).as_ref()
        ),
        (Some(0), "kept\n")
    );
    // The server's own next call finds it running and goes on.
    let lease = manager
        .lease(session, manager.default_spec())
        .await
        .expect("lease");
    assert_eq!(sh(&lease, "cat /workspace/f").await, "kept\n");
    drop(lease);
    manager.release(session).await;
}

/// A run waiting on the docker helper ends, with the sandbox gone, as soon
/// as its container is removed (a paused sandbox destroyed after the idle
/// TTL, with a background run in it), rather than at its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_container_ends_its_runs() {
    let (backend, _) = docker().await;
    let manager = manager(backend, 600);
    let session = Uuid::new_v4();
    let lease = manager
        .lease(session, manager.default_spec())
        .await
        .expect("lease");
    let (started, up) = tokio::sync::oneshot::channel();
    let mut started = Some(started);
    let run = tokio::spawn(async move {
        let request = ExecRequest::shell("echo up; sleep 300", Duration::from_secs(600));
        exec_collect(
            lease.sandbox.as_ref(),
            request,
            1024,
            CancellationToken::new(),
            |_| {
                if let Some(started) = started.take() {
                    let _ = started.send(());
                }
            },
        )
        .await
    });
    up.await.expect("the run started");
    manager.release(session).await;
    let ended = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the run ended with its container")
        .expect("join");
    assert!(matches!(ended, Err(SandboxError::Gone(_))), "{ended:?}");
}

/// A counter's value in a Prometheus exposition.
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// `conclave serve` with `sandbox.pause_after_s` in its config file: the
/// session's idle sandbox shows `paused` in `GET /sandboxes`, the next
/// tool call runs in it with its files, and `/metrics` counts the pause
/// and the resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_pauses_an_idle_sandbox_and_the_next_call_resumes_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("conclave.toml"),
        "[sandbox]\npause_after_s = 1\nwarm_pool = 0\n",
    )
    .unwrap();
    let mut command = serve_command(&["--sandbox", "docker", "--config", "conclave.toml"]);
    command.current_dir(dir.path());
    let (mut child, url) = spawn_server(&mut command).await;
    let http = reqwest::Client::new();
    let session = json_of(http.post(format!("{url}/agent/session")).json(&json!({}))).await;
    let session = session["session_id"].as_str().unwrap().to_string();
    let turn = |prompt: &'static str| {
        let (http, url, session) = (http.clone(), url.clone(), session.clone());
        async move {
            let response = http
                .post(format!("{url}/agent/session/{session}/message"))
                .json(&json!({ "prompt": prompt }))
                .send()
                .await
                .unwrap();
            let events = ndjson(response).await;
            events
                .into_iter()
                .find(|e| e["type"] == "tool_result")
                .unwrap_or_else(|| panic!("no tool result"))
        }
    };
    turn("$ echo before > f").await;
    let state = || async {
        let body = json_of(http.get(format!("{url}/sandboxes"))).await;
        body["sandboxes"][0]["state"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    until(
        "GET /sandboxes shows paused",
        Duration::from_secs(20),
        || async { state().await == "paused" },
    )
    .await;
    let result = turn("$ cat f").await;
    assert_eq!(result["output"]["stdout"], "before\n", "{result}");
    let metrics = http
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metric(&metrics, "conclave_sandbox_pauses_total") >= 1);
    assert_eq!(metric(&metrics, "conclave_sandbox_resumes_total"), 1);
    assert_eq!(metric(&metrics, "conclave_sandbox_resume_seconds_count"), 1);
    let deleted = http
        .delete(format!("{url}/agent/session/{session}"))
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());
    stop(&mut child).await;
}
