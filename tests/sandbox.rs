//! One suite, run against every backend that can run here: a real dockerd
//! (the test command installs and starts it, and builds the images) and
//! the local namespace backend. Nothing is skipped: a backend that cannot
//! start fails its tests with the reason.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use conclave::config::SandboxConfig;
use conclave::sandbox::docker::DockerBackend;
use conclave::sandbox::local::{LocalBackend, LocalConfig};
use conclave::sandbox::{
    Collected, ExecChunk, ExecRequest, ExecStatus, LABEL_MANAGED, LABEL_SESSION, Sandbox,
    SandboxBackend, SandboxError, SandboxManager, SandboxSpec, exec_collect, files,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const IMAGE: &str = "conclave/sandbox-python:latest";

/// Local sandboxes live under a directory of the test's own, kept for the
/// process's life (tests run in parallel and each makes its backend).
async fn local() -> Arc<dyn SandboxBackend> {
    static ROOT: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let root = ROOT.get_or_init(|| tempfile::tempdir().expect("tempdir"));
    Arc::new(
        LocalBackend::new(LocalConfig::default(), root.path().to_path_buf())
            .expect("the local backend starts (namespaces must be available)"),
    )
}

async fn docker() -> Arc<dyn SandboxBackend> {
    Arc::new(
        DockerBackend::connect()
            .await
            .expect("dockerd must answer (scripts/test.sh starts it)"),
    )
}

/// Docker with layered workspaces (the server's default as root on the
/// daemon's host), kept in a directory of each test's own: a backend
/// deletes the workspaces of gone containers from its directory as it
/// starts, which would take those other tests are making.
async fn docker_layered() -> Arc<dyn SandboxBackend> {
    let root = tempfile::tempdir().expect("tempdir").keep();
    Arc::new(
        DockerBackend::connect()
            .await
            .expect("dockerd must answer (scripts/test.sh starts it)")
            .with_layers(root.join("docker-workspaces"))
            .await,
    )
}

fn spec() -> SandboxSpec {
    SandboxSpec {
        image: IMAGE.into(),
        cpus: 1.0,
        memory_mb: 256,
        pids: 64,
        disk_mb: 64,
        network: false,
        egress: None,
        env: BTreeMap::from([("GREETING".to_string(), "hello".to_string())]),
        labels: BTreeMap::from([
            (LABEL_MANAGED.to_string(), "true".to_string()),
            (LABEL_SESSION.to_string(), Uuid::new_v4().to_string()),
        ]),
    }
}

/// A sandbox destroyed when the test ends, pass or fail.
struct Live(Arc<dyn Sandbox>);

impl Drop for Live {
    fn drop(&mut self) {
        let sandbox = self.0.clone();
        // The test's runtime is going away: destroy on a thread of its own.
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Runtime::new() {
                let _ = rt.block_on(sandbox.destroy());
            }
        })
        .join();
    }
}

async fn create(backend: &Arc<dyn SandboxBackend>) -> Live {
    Live(backend.create(&spec()).await.expect("sandbox starts"))
}

async fn sh(sandbox: &Live, command: &str, timeout_s: u64) -> (ExecStatus, Collected) {
    exec_collect(
        sandbox.0.as_ref(),
        ExecRequest::shell(command, Duration::from_secs(timeout_s)),
        1 << 20,
        CancellationToken::new(),
        |_| {},
    )
    .await
    .expect("exec runs")
}

/// Checks that no process whose command line matches `pattern` survived
/// a timeout.
async fn assert_none_left(sandbox: &Live, pattern: &str) {
    let (_, out) = sh(
        sandbox,
        &format!("ps -eo args | grep -c '{pattern}' || true"),
        10,
    )
    .await;
    assert_eq!(
        text(&out.stdout).trim(),
        "0",
        "children survived the timeout"
    );
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn exec_streams_output_and_exit_code(backend: Arc<dyn SandboxBackend>) {
    let sandbox = create(&backend).await;
    let (tx, mut rx) = mpsc::channel(64);
    let request = ExecRequest::shell(
        "echo one; sleep 0.3; echo two; echo oops >&2; echo $GREETING; \
         [ \"$(id -u)\" != 0 ] && echo not-root; exit 3",
        Duration::from_secs(30),
    );
    let run = sandbox.0.exec(request, tx, CancellationToken::new());
    let collect = async {
        let mut chunks = Vec::new();
        while let Some(chunk) = rx.recv().await {
            chunks.push(chunk);
        }
        chunks
    };
    let (status, chunks) = tokio::join!(run, collect);
    let status = status.expect("exec");
    assert_eq!(status.exit_code, Some(3));
    assert!(!status.timed_out);
    let stdout: Vec<u8> = chunks
        .iter()
        .filter_map(|c| match c {
            ExecChunk::Stdout(d) => Some(d.to_vec()),
            ExecChunk::Stderr(_) => None,
        })
        .flatten()
        .collect();
    assert_eq!(text(&stdout), "one\ntwo\nhello\nnot-root\n");
    // "one" arrived before "two" was written: output streams, in chunks.
    assert!(
        matches!(&chunks[0], ExecChunk::Stdout(d) if d.as_ref() == b"one\n"),
        "{chunks:?}"
    );
    assert!(chunks.contains(&ExecChunk::Stderr(Bytes::from_static(b"oops\n"))));

    let (status, out) = exec_collect(
        sandbox.0.as_ref(),
        ExecRequest {
            stdin: Some(Bytes::from_static(b"from stdin").into()),
            ..ExecRequest::shell("cat; echo", Duration::from_secs(30))
        },
        1 << 20,
        CancellationToken::new(),
        |_| {},
    )
    .await
    .expect("exec");
    assert_eq!(status.exit_code, Some(0));
    assert_eq!(text(&out.stdout), "from stdin\n");

    // A file of the server's is streamed in, on the bulk path too: 3 MiB,
    // more than any pipe holds, so it is written as the command reads.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("input");
    let data: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &data).expect("write input");
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let request = ExecRequest {
        stdin: Some(conclave::sandbox::Stdin::File(path)),
        ..ExecRequest::shell("wc -c", Duration::from_secs(60))
    };
    let run = sandbox.0.exec_bulk(request, tx, CancellationToken::new());
    let collect = async {
        let mut out = Vec::new();
        while let Some(chunk) = rx.recv().await {
            if let ExecChunk::Stdout(d) = chunk {
                out.extend_from_slice(&d);
            }
        }
        out
    };
    let (status, out) = tokio::join!(run, collect);
    assert_eq!(status.expect("exec_bulk").exit_code, Some(0));
    let out = text(&out);
    assert!(out.starts_with(&format!("{}\n", data.len())), "{out}");
}

async fn timeout_kills_the_process_tree(backend: Arc<dyn SandboxBackend>) {
    let sandbox = create(&backend).await;
    let (status, _) = sh(&sandbox, "sleep 301 & (sleep 302 &); sleep 303", 1).await;
    assert!(status.timed_out, "{status:?}");
    assert_eq!(status.exit_code, None);
    assert!(status.duration < Duration::from_secs(15), "{status:?}");
    assert_none_left(&sandbox, "^sleep 30[123]").await;

    let (status, _) = sh(&sandbox, "while :; do :; done", 1).await;
    assert!(status.timed_out);
    let (status, out) = sh(&sandbox, "echo still here", 10).await;
    assert_eq!(
        (status.exit_code, text(&out.stdout)),
        (Some(0), "still here\n".into())
    );

    // Cancelling stops a command like a timeout does.
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    let run = exec_collect(
        sandbox.0.as_ref(),
        ExecRequest::shell("echo started; sleep 300", Duration::from_secs(120)),
        1 << 20,
        cancel,
        move |_| trigger.cancel(),
    );
    let (status, _) = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("cancel ends the exec")
        .expect("exec");
    assert!(status.cancelled);
}

async fn fork_bomb_is_contained(backend: Arc<dyn SandboxBackend>) {
    let sandbox = create(&backend).await;
    // A bomb inside a run that lasts, then one left behind by a shell that
    // exits at once, holding every pid the sandbox may have.
    for bomb in [
        "bomb() { bomb | bomb & }; bomb; sleep 5",
        "bomb() { bomb | bomb & }; bomb",
    ] {
        let (status, _) = sh(&sandbox, bomb, 3).await;
        assert!(status.timed_out || status.exit_code.is_some());
        let (status, out) = sh(&sandbox, "echo alive", 20).await;
        assert_eq!(
            (status.exit_code, text(&out.stdout)),
            (Some(0), "alive\n".into()),
            "after {bomb}"
        );
    }
}

async fn memory_hog_is_killed(backend: Arc<dyn SandboxBackend>) {
    let sandbox = create(&backend).await;
    let (status, _) = sh(
        &sandbox,
        "python3 -c 'x = bytearray(1024 * 1024 * 1024); print(len(x))'",
        60,
    )
    .await;
    assert_ne!(status.exit_code, Some(0), "1 GiB fit in a 256 MiB sandbox");
    let (status, _) = sh(&sandbox, "true", 10).await;
    assert_eq!(status.exit_code, Some(0));
}

async fn disk_fill_is_contained(backend: Arc<dyn SandboxBackend>) {
    let sandbox = create(&backend).await;
    let used_mib = async || {
        let (_, out) = sh(&sandbox, "du -sm /workspace | cut -f1", 10).await;
        text(&out.stdout)
            .trim()
            .parse::<u64>()
            .expect("du prints MiB")
    };
    // One file bigger than the disk, then many files smaller than it that
    // add up to more: the limit holds for the workspace as a whole.
    for fill in [
        "dd if=/dev/zero of=/workspace/fill bs=1M count=1024 2>&1",
        "for i in 1 2 3 4 5 6; do dd if=/dev/zero of=/workspace/part$i bs=1M count=24 2>&1 || exit 1; done",
    ] {
        let (status, out) = sh(&sandbox, fill, 60).await;
        assert_ne!(status.exit_code, Some(0), "{fill}: {}", text(&out.stdout));
        let used = used_mib().await;
        assert!(
            used <= 70,
            "{fill}: the workspace grew to {used} MiB past its 64 MiB limit"
        );
        let (status, _) = sh(&sandbox, "rm /workspace/*", 10).await;
        assert_eq!(status.exit_code, Some(0));
    }
    let (status, _) = sh(&sandbox, "echo ok > /workspace/small", 10).await;
    assert_eq!(status.exit_code, Some(0));
}

/// The limits a sandbox was given are the ones its cgroups hold, read from
/// inside the sandbox (where a container has them).
async fn limits_are_in_its_cgroups(backend: Arc<dyn SandboxBackend>) {
    let sandbox = Live(
        backend
            .create(&SandboxSpec {
                cpus: 0.5,
                memory_mb: 192,
                pids: 48,
                ..spec()
            })
            .await
            .expect("sandbox starts"),
    );
    let (status, out) = sh(
        &sandbox,
        "cd /sys/fs/cgroup && cat cpu/cpu.cfs_quota_us cpu/cpu.cfs_period_us \
         memory/memory.limit_in_bytes pids/pids.max; \
         (echo -1 > cpu/cpu.cfs_quota_us) 2>/dev/null && echo raised; \
         (echo max > pids/pids.max) 2>/dev/null && echo raised; true",
        10,
    )
    .await;
    assert_eq!(status.exit_code, Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!("50000\n100000\n{}\n48\n", 192 * 1024 * 1024)
    );
}

/// What a call leaves running when it returns (a background job, a
/// `setsid` daemon) is killed with it.
async fn nothing_a_call_started_outlives_it(backend: Arc<dyn SandboxBackend>) {
    let sandbox = create(&backend).await;
    // Counted by the sandbox's pids cgroup, which sees every exec's
    // processes (a local exec's own pid namespace hides the others from ps).
    let count = "cat /sys/fs/cgroup/pids/pids.current";
    let (_, before) = sh(&sandbox, count, 10).await;
    let (status, out) = sh(
        &sandbox,
        "sleep 300 & setsid sleep 301 & nohup sleep 302 >/dev/null 2>&1 & echo started",
        10,
    )
    .await;
    assert_eq!(status.exit_code, Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "started\n");
    // Killed processes stay charged to the cgroup until they are reaped,
    // a moment after the call returned: read until the count is back.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, after) = sh(&sandbox, count, 10).await;
        if text(&after.stdout) == text(&before.stdout) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "processes a call started still run 10 s after it: {} against {} before",
            text(&after.stdout).trim(),
            text(&before.stdout).trim()
        );
    }
    assert_none_left(&sandbox, "[s]leep 30[012]").await;
}

async fn no_network_but_loopback(backend: Arc<dyn SandboxBackend>) {
    let sandbox = create(&backend).await;
    let (_, out) = sh(
        &sandbox,
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
        10,
    )
    .await;
    assert_eq!(text(&out.stdout), "lo\n");
}

async fn host_files_are_out_of_reach(backend: Arc<dyn SandboxBackend>) {
    let marker = std::env::temp_dir().join(format!("conclave-secret-{}", Uuid::new_v4()));
    std::fs::write(&marker, "secret").expect("write marker");
    let sandbox = create(&backend).await;
    let command = format!(
        "cat {} 2>/dev/null; ls /root 2>/dev/null; echo x > /etc/x 2>/dev/null && echo wrote-etc; \
         echo x > /usr/x 2>/dev/null && echo wrote-usr; echo done",
        marker.display()
    );
    let (_, out) = sh(&sandbox, &command, 10).await;
    let _ = std::fs::remove_file(&marker);
    assert_eq!(text(&out.stdout), "done\n");
}

async fn files_round_trip_and_stay_confined(backend: Arc<dyn SandboxBackend>) {
    let sandbox = create(&backend).await;
    let sb = sandbox.0.as_ref();
    let content = "line one\nline 'two' \"quoted\" $HOME\n";
    files::write(sb, "/workspace/dir/a.txt", Bytes::from(content))
        .await
        .expect("write");
    let (read, truncated) = files::read(sb, "/workspace/dir/a.txt").await.expect("read");
    assert_eq!((text(&read), truncated), (content.to_string(), false));
    assert_eq!(
        files::edit(sb, "/workspace/dir/a.txt", "one", "1", false, None)
            .await
            .expect("edit"),
        1
    );
    let (entries, _) = files::list(sb, "/workspace", 3, 100).await.expect("list");
    let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["dir", "dir/a.txt"]);
    let (found, _) = files::glob(sb, "/workspace", "**/*.txt", 100)
        .await
        .expect("glob");
    assert_eq!(found, ["dir/a.txt"]);
    let (lines, _) = files::grep(sb, "/workspace", "line 1", None, false, 4096)
        .await
        .expect("grep");
    assert_eq!(lines, "/workspace/dir/a.txt:1:line 1\n");
    let missing = files::read(sb, "/workspace/nope").await.unwrap_err();
    assert!(
        matches!(&missing, SandboxError::File(m) if m.contains("does not exist")),
        "{missing}"
    );

    // A symlink out of the workspace is refused, not followed.
    sh(&sandbox, "ln -s /etc /workspace/etc-link", 10).await;
    let escape = files::read(sb, "/workspace/etc-link/passwd")
        .await
        .unwrap_err();
    assert!(
        matches!(&escape, SandboxError::InvalidPath(m) if m.contains("outside /workspace")),
        "{escape}"
    );
    let escape = files::write(sb, "/workspace/etc-link/x", Bytes::new())
        .await
        .unwrap_err();
    assert!(matches!(escape, SandboxError::InvalidPath(_)));

    // A path checked where it led acts only on that file: a link swapped
    // in since sends it nowhere, and nothing is written.
    sh(
        &sandbox,
        "mkdir -p /workspace/real && ln -s /workspace/dir /workspace/swapped",
        10,
    )
    .await;
    let expected = Some("/workspace/real/a.txt");
    let moved = files::read_expecting(sb, "/workspace/swapped/a.txt", expected)
        .await
        .unwrap_err();
    assert!(
        matches!(&moved, SandboxError::InvalidPath(m) if m.contains("no longer leads")),
        "{moved}"
    );
    let moved = files::write_expecting(sb, "/workspace/swapped/a.txt", Bytes::from("x"), expected)
        .await
        .unwrap_err();
    assert!(matches!(moved, SandboxError::InvalidPath(_)), "{moved}");
    // Nor does it make the directories of a path that leads elsewhere.
    let moved = files::write_expecting(sb, "/workspace/swapped/new/b.txt", Bytes::new(), expected)
        .await
        .unwrap_err();
    assert!(matches!(moved, SandboxError::InvalidPath(_)), "{moved}");
    let (entries, _) = files::list(sb, "/workspace/dir", 1, 100)
        .await
        .expect("list");
    assert!(entries.iter().all(|e| e.path != "new"), "{entries:?}");
    let (read, _) = files::read(sb, "/workspace/dir/a.txt").await.expect("read");
    assert!(text(&read).starts_with("line 1"), "{}", text(&read));
    let (read, _) =
        files::read_expecting(sb, "/workspace/swapped/a.txt", Some("/workspace/dir/a.txt"))
            .await
            .expect("read as expected");
    assert!(text(&read).starts_with("line 1"));
}

async fn orphans_are_reaped_and_live_sessions_kept(backend: Arc<dyn SandboxBackend>) {
    let config = SandboxConfig {
        image: IMAGE.into(),
        warm_pool: 0,
        ..SandboxConfig::default()
    };
    let instance = Uuid::new_v4().simple().to_string();
    let first = SandboxManager::new(backend.clone(), config.clone(), instance.clone());
    let (kept, orphan) = (Uuid::new_v4(), Uuid::new_v4());
    let kept_id = first
        .lease(kept, first.default_spec())
        .await
        .expect("lease")
        .sandbox
        .id()
        .to_string();
    let orphan_id = first
        .lease(orphan, first.default_spec())
        .await
        .expect("lease")
        .sandbox
        .id()
        .to_string();
    // The "crash": the first manager goes away without cleaning up.
    drop(first);

    let second = SandboxManager::new(backend.clone(), config, instance);
    let removed = second
        .reap_orphans(|session| session != orphan)
        .await
        .expect("reap");
    assert!(removed >= 1);
    let managed: Vec<String> = backend
        .list_managed()
        .await
        .expect("list")
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert!(!managed.contains(&orphan_id), "the orphan survived");
    assert!(
        managed.contains(&kept_id),
        "a live session's sandbox was reaped"
    );
    // The live session takes its sandbox back.
    let lease = second
        .lease(kept, second.default_spec())
        .await
        .expect("lease");
    assert_eq!(lease.sandbox.id(), kept_id);
    drop(lease);
    second.release(kept).await;
    assert!(backend.attach(&kept_id).await.expect("attach").is_none());
}

/// The backend's sandboxes labelled with `session`.
async fn sandboxes_of(backend: &Arc<dyn SandboxBackend>, session: &str) -> Vec<String> {
    backend
        .list_managed()
        .await
        .expect("list")
        .into_iter()
        .filter(|m| m.session.as_deref() == Some(session))
        .map(|m| m.id)
        .collect()
}

/// A create given up halfway (its future dropped: a session's first call
/// interrupted) leaves nothing behind. The create is abandoned as soon as
/// its sandbox shows in the listing, and must then go. Run for docker only:
/// a local create is over in a few milliseconds, too quick to be cut
/// midway on purpose, and it goes through the same `create_detached`.
async fn an_abandoned_create_leaves_nothing(backend: Arc<dyn SandboxBackend>) {
    // How long a create takes varies with the daemon's load: on a busy
    // machine most finish before the listing shows them, so it tries
    // until one is cut midway (20 tries at most).
    let mut abandoned = 0;
    for _ in 0..20 {
        if abandoned > 0 {
            break;
        }
        let spec = spec();
        let session = spec.labels[LABEL_SESSION].clone();
        let creating = tokio::spawn({
            let backend = backend.clone();
            async move { backend.create(&spec).await.map(Live) }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while sandboxes_of(&backend, &session).await.is_empty() && !creating.is_finished() {
            assert!(Instant::now() < deadline, "the sandbox never showed");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        creating.abort();
        if let Ok(finished) = creating.await {
            drop(finished.expect("create")); // too late to abandon: destroyed
            continue;
        }
        abandoned += 1;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !sandboxes_of(&backend, &session).await.is_empty() {
            assert!(
                Instant::now() < deadline,
                "an abandoned create left its sandbox for 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert!(
        abandoned > 0,
        "no create was slow enough to abandon in 20 tries"
    );
}

macro_rules! suite {
    ($($backend:ident),+: $tests:tt) => {
        $(suite!(@one $backend $tests);)+
    };
    (@one $backend:ident [$($test:ident),* $(,)?]) => {
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

suite!(docker, docker_layered: [
    exec_streams_output_and_exit_code,
    timeout_kills_the_process_tree,
    fork_bomb_is_contained,
    memory_hog_is_killed,
    disk_fill_is_contained,
    limits_are_in_its_cgroups,
    nothing_a_call_started_outlives_it,
    no_network_but_loopback,
    host_files_are_out_of_reach,
    files_round_trip_and_stay_confined,
    orphans_are_reaped_and_live_sessions_kept,
    an_abandoned_create_leaves_nothing,
]);

suite!(local: [
    exec_streams_output_and_exit_code,
    timeout_kills_the_process_tree,
    fork_bomb_is_contained,
    memory_hog_is_killed,
    disk_fill_is_contained,
    limits_are_in_its_cgroups,
    nothing_a_call_started_outlives_it,
    no_network_but_loopback,
    host_files_are_out_of_reach,
    files_round_trip_and_stay_confined,
    orphans_are_reaped_and_live_sessions_kept,
]);

/// The docker backend's exec helper: what only docker has.
mod docker_helper {
    use super::*;

    /// The comm and pid of the process that started the exec's shell: the
    /// helper (comm `.conclave-exec`) unless `docker exec` ran it.
    async fn parent(sandbox: &Live) -> (String, String) {
        let (status, out) = sh(sandbox, "cat /proc/$PPID/comm; echo $PPID", 10).await;
        assert_eq!(status.exit_code, Some(0), "{}", text(&out.stderr));
        let out = text(&out.stdout);
        let mut lines = out.lines().map(str::to_string);
        (
            lines.next().unwrap_or_default(),
            lines.next().unwrap_or_default(),
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn execs_go_through_the_helper_and_a_new_server_reuses_it() {
        let backend = docker().await;
        let sandbox = create(&backend).await;
        let (comm, pid) = parent(&sandbox).await;
        assert_eq!(comm, ".conclave-exec");

        // A program written to the workspace runs (the tmpfs is not noexec).
        let (status, out) = sh(&sandbox, "cp /bin/echo ./e && ./e ran", 10).await;
        assert_eq!(
            (status.exit_code, text(&out.stdout)),
            (Some(0), "ran\n".into())
        );

        // A server started later attaches to the same container and finds
        // the helper running: same process, not a second one.
        let adopted = docker()
            .await
            .attach(sandbox.0.id())
            .await
            .expect("attach")
            .expect("running");
        let adopted = Live(adopted);
        assert_eq!(parent(&adopted).await, (comm, pid));
        std::mem::forget(adopted); // `sandbox` destroys the container
    }

    /// Runs `command` on the bulk path: its status, stdout and stderr.
    async fn bulk(sandbox: &Live, command: &str) -> (ExecStatus, Vec<u8>, String) {
        let (tx, mut rx) = mpsc::channel(64);
        let request = ExecRequest::shell(command, Duration::from_secs(30));
        let run = sandbox.0.exec_bulk(request, tx, CancellationToken::new());
        let collect = async {
            let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
            while let Some(chunk) = rx.recv().await {
                match chunk {
                    ExecChunk::Stdout(data) => stdout.extend_from_slice(&data),
                    ExecChunk::Stderr(data) => stderr.extend_from_slice(&data),
                }
            }
            (stdout, stderr)
        };
        let (status, (stdout, stderr)) = tokio::join!(run, collect);
        (status.expect("bulk exec"), stdout, text(&stderr))
    }

    /// What the bulk path's command had as stdout, then 3 MB of zeros and
    /// a word on stderr, exiting 3.
    const BULK: &str =
        "readlink /proc/self/fd/1; echo warned >&2; head -c 3000000 /dev/zero; exit 3";

    fn check_bulk(stdout: &[u8], kind: &str) {
        let line = stdout
            .iter()
            .position(|b| *b == b'\n')
            .expect("a first line");
        let first = text(&stdout[..line]);
        assert!(first.starts_with(kind), "stdout was {first}, not a {kind}");
        assert_eq!(stdout.len() - line - 1, 3_000_000);
        assert!(stdout[line + 1..].iter().all(|b| *b == 0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bulk_output_goes_over_a_socket_of_its_own() {
        let backend = docker().await;
        let sandbox = create(&backend).await;
        // The server (root, on the docker host) binds a listener in the
        // sandbox's network namespace: stdout is that socket, not the
        // attach stream's pipe; stderr and the exit status are the exec's.
        let (status, stdout, stderr) = bulk(&sandbox, BULK).await;
        assert_eq!(status.exit_code, Some(3));
        assert_eq!(stderr, "warned\n");
        check_bulk(&stdout, "socket:[");
        // No listener is left behind in the sandbox.
        let (_, out) = sh(&sandbox, "cat /proc/net/tcp | grep -c ' 0A ' || true", 10).await;
        assert_eq!(text(&out.stdout).trim(), "0");

        // Without bash in the image the attach stream carries it, whole.
        let image = "conclave-test/no-bash:latest";
        let dockerfile = "FROM conclave/sandbox-shell:latest\nUSER root\n\
                          RUN rm -f /usr/bin/bash /bin/bash\nUSER 1000:1000\n";
        build_image(image, dockerfile).await;
        let mut spec = spec();
        spec.image = image.into();
        let plain = Live(backend.create(&spec).await.expect("sandbox starts"));
        for _ in 0..2 {
            let (status, stdout, stderr) = bulk(&plain, BULK).await;
            assert_eq!(status.exit_code, Some(3));
            assert_eq!(stderr, "warned\n");
            check_bulk(&stdout, "pipe:[");
        }
    }

    async fn build_image(image: &str, dockerfile: &str) {
        let mut build = tokio::process::Command::new("docker")
            .args(["build", "-q", "-t", image, "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("docker CLI");
        let mut stdin = build.stdin.take().expect("stdin");
        tokio::io::AsyncWriteExt::write_all(&mut stdin, dockerfile.as_bytes())
            .await
            .expect("write Dockerfile");
        drop(stdin);
        assert!(build.wait().await.expect("docker build").success());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_the_helper_execs_go_through_docker_exec() {
        // An image with no `base64`, so the helper cannot be unpacked.
        let image = "conclave-test/no-base64:latest";
        let dockerfile = "FROM conclave/sandbox-shell:latest\nUSER root\n\
                          RUN rm /usr/bin/base64\nUSER 1000:1000\n";
        build_image(image, dockerfile).await;

        let backend = docker().await;
        let mut spec = spec();
        spec.image = image.into();
        let sandbox = Live(backend.create(&spec).await.expect("sandbox starts"));
        let (comm, _) = parent(&sandbox).await;
        assert_ne!(comm, ".conclave-exec");
        let (status, out) = sh(&sandbox, "echo $GREETING", 10).await;
        assert_eq!(
            (status.exit_code, text(&out.stdout)),
            (Some(0), "hello\n".into())
        );
        // The marker kill still ends a whole tree.
        let (status, _) = sh(&sandbox, "sleep 301 & sleep 302", 1).await;
        assert!(status.timed_out, "{status:?}");
        assert_none_left(&sandbox, "^sleep 30[12]").await;
    }
}
