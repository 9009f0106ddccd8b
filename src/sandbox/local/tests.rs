//! These tests start real sandboxes: they need root (or unprivileged user
//! namespaces) and `bash` and `python3` on the host.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::sandbox::{Collected, ExecChunk, ExecRequest, ExecStatus, LABEL_SESSION, exec_collect};

pub(super) struct Fixture {
    pub(super) backend: LocalBackend,
    config: LocalConfig,
    pub(super) root: PathBuf,
    _dir: tempfile::TempDir,
}

/// A failed test leaves its sandboxes behind: at least their cgroups, which
/// outlive the temporary directory, go with the fixture.
impl Drop for Fixture {
    fn drop(&mut self) {
        for entry in fs::read_dir(&self.root).into_iter().flatten().flatten() {
            let id = entry.file_name().to_string_lossy().into_owned();
            self.backend.host.cgroups.sandbox(&id).remove();
            let layout = self.backend.host.layout(&id);
            let _ = crate::sandbox::layers::detach_under(&layout.dir);
        }
    }
}

/// A backend of its own, with a uid range of its own, so that sandboxes of
/// tests running side by side never share a uid.
pub(super) fn fixture() -> Fixture {
    static NEXT_RANGE: AtomicU32 = AtomicU32::new(0);
    let config = LocalConfig {
        uid_base: 1_500_000_000 + NEXT_RANGE.fetch_add(1, Ordering::Relaxed) * 100,
        uid_count: 100,
        ..LocalConfig::default()
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("sandboxes");
    let backend = LocalBackend::new(config.clone(), root.clone()).expect("local backend");
    Fixture {
        backend,
        config,
        root,
        _dir: dir,
    }
}

pub(super) fn spec() -> SandboxSpec {
    SandboxSpec {
        image: "host".into(),
        cpus: 1.0,
        memory_mb: 256,
        pids: 64,
        disk_mb: 64,
        network: false,
        egress: None,
        env: BTreeMap::from([("GREETING".into(), "hi".into())]),
        labels: BTreeMap::from([(LABEL_MANAGED.into(), "true".into())]),
    }
}

pub(super) async fn sh(
    sandbox: &dyn Sandbox,
    script: &str,
    timeout: Duration,
) -> (ExecStatus, String, String) {
    let (status, Collected { stdout, stderr, .. }) = exec_collect(
        sandbox,
        ExecRequest::shell(script, timeout),
        1 << 20,
        CancellationToken::new(),
        |_| {},
    )
    .await
    .expect("exec");
    (
        status,
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

pub(super) const SHORT: Duration = Duration::from_secs(30);

/// Host processes whose argv is `argv`: with an unusual argument, the
/// ones a test started, whoever runs them.
fn processes_running(argv: &[&str]) -> Vec<u32> {
    let expected: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    let mut pids = Vec::new();
    for entry in fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| cmdline == expected) {
            pids.push(pid);
        }
    }
    pids
}

pub(super) async fn uid_of(sandbox: &dyn Sandbox) -> u32 {
    let (_, stdout, _) = sh(sandbox, "id -u", SHORT).await;
    stdout.trim().parse().expect("uid")
}

#[tokio::test]
async fn echo_streams_stdout_and_exits_zero() {
    let f = fixture();
    let sandbox = f.backend.create(&spec()).await.expect("create");
    let (tx, mut rx) = mpsc::channel(16);
    let status = sandbox
        .exec(
            ExecRequest::shell("echo hello $GREETING", SHORT),
            tx,
            CancellationToken::new(),
        )
        .await
        .expect("exec");
    assert_eq!(
        rx.recv().await,
        Some(ExecChunk::Stdout(Bytes::from("hello hi\n")))
    );
    assert_eq!(rx.recv().await, None);
    assert_eq!(
        (status.exit_code, status.timed_out, status.cancelled),
        (Some(0), false, false)
    );
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn a_warm_sandbox_runs_execs_through_its_resident_helper_and_restarts_it() {
    let f = fixture();
    let sandbox = f.backend.host.create(&spec()).await.expect("create");
    // The helper marks each run's processes; the namespace's init is the
    // gate shell running the helper, not the command.
    let (status, first, _) = sh(
        &*sandbox,
        "echo $CONCLAVE_EXEC; tr '\\0' ' ' < /proc/1/cmdline",
        SHORT,
    )
    .await;
    assert_eq!(status.exit_code, Some(0));
    let (marker, init) = first.split_once('\n').expect("two lines");
    assert!(!marker.is_empty(), "{first}");
    assert!(init.contains("/.conclave/conclave-exec"), "{first}");

    // The resident ends under a run (as when the OOM killer takes it): the
    // run reports a kill, and the next exec gets a new resident.
    let (tx, mut rx) = mpsc::channel(16);
    let exec = sandbox.exec(
        ExecRequest::shell("echo started; sleep 1006", SHORT),
        tx,
        CancellationToken::new(),
    );
    let end_it = async {
        assert_eq!(
            rx.recv().await,
            Some(ExecChunk::Stdout(Bytes::from("started\n")))
        );
        match &*sandbox.resident.lock().await {
            ResidentState::Ready(resident) => resident.kill(),
            other => panic!("no resident: {other:?}"),
        }
    };
    let (status, ()) = tokio::join!(exec, end_it);
    assert_eq!(status.expect("exec").exit_code, Some(137));
    assert_eq!(processes_running(&["sleep", "1006"]), Vec::<u32>::new());
    let (status, again, _) = sh(&*sandbox, "echo $CONCLAVE_EXEC", SHORT).await;
    assert_eq!(status.exit_code, Some(0));
    assert!(
        !again.trim().is_empty() && again.trim() != marker,
        "{again}"
    );
    sandbox.destroy().await.expect("destroy");
}

/// Runs `script` on the bulk path and returns its stdout.
async fn bulk(sandbox: &dyn Sandbox, script: &str) -> (ExecStatus, Vec<u8>) {
    let (tx, mut rx) = mpsc::channel(16);
    let collect = async {
        let mut stdout = Vec::new();
        while let Some(chunk) = rx.recv().await {
            if let ExecChunk::Stdout(data) = chunk {
                stdout.extend_from_slice(&data);
            }
        }
        stdout
    };
    let (status, stdout) = tokio::join!(
        sandbox.exec_bulk(
            ExecRequest::shell(script, SHORT),
            tx,
            CancellationToken::new()
        ),
        collect
    );
    (status.expect("bulk exec"), stdout)
}

#[tokio::test]
async fn bulk_output_goes_through_the_resident_on_a_socket_whole() {
    let f = fixture();
    let sandbox = f.backend.create(&spec()).await.expect("create");
    let (status, stdout) = bulk(
        &*sandbox,
        "readlink /proc/self/fd/1; echo marked=${CONCLAVE_EXEC:+yes}",
    )
    .await;
    assert_eq!(status.exit_code, Some(0));
    let stdout = String::from_utf8_lossy(&stdout).into_owned();
    if f.backend.host.is_root {
        // As root the server binds in the resident's namespace.
        assert!(stdout.starts_with("socket:["), "{stdout}");
        assert!(stdout.ends_with("marked=yes\n"), "{stdout}");
    } else {
        assert!(stdout.starts_with("pipe:["), "{stdout}");
    }
    // Many megabytes come through whole, and the exit status with them.
    let (status, stdout) = bulk(&*sandbox, "echo start; head -c 5000000 /dev/zero; exit 3").await;
    assert_eq!(status.exit_code, Some(3));
    assert!(stdout.starts_with(b"start\n"));
    assert_eq!(stdout.len(), "start\n".len() + 5_000_000);
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn stderr_and_exit_code_come_back() {
    let f = fixture();
    let sandbox = f.backend.create(&spec()).await.expect("create");
    let (status, stdout, stderr) = sh(&*sandbox, "echo out; echo oops >&2; exit 3", SHORT).await;
    assert_eq!(
        (status.exit_code, stdout.as_str(), stderr.as_str()),
        (Some(3), "out\n", "oops\n")
    );

    let missing = ExecRequest {
        command: vec!["no-such-command".into()],
        ..ExecRequest::shell("", SHORT)
    };
    let (status, _) = exec_collect(&*sandbox, missing, 1024, CancellationToken::new(), |_| {})
        .await
        .expect("exec");
    assert_eq!(status.exit_code, Some(127));
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn stdin_is_written_then_closed() {
    let f = fixture();
    let sandbox = f.backend.create(&spec()).await.expect("create");
    let input = "line one\nline two\n".repeat(10_000);
    let request = ExecRequest {
        command: vec!["cat".into()],
        stdin: Some(Bytes::from(input.clone()).into()),
        ..ExecRequest::shell("", SHORT)
    };
    let (status, collected) = exec_collect(
        &*sandbox,
        request,
        1 << 20,
        CancellationToken::new(),
        |_| {},
    )
    .await
    .expect("exec");
    assert_eq!(status.exit_code, Some(0));
    assert_eq!(String::from_utf8_lossy(&collected.stdout), input);
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn timeout_kills_the_whole_tree() {
    let f = fixture();
    let sandbox = f.backend.create(&spec()).await.expect("create");
    let (status, _, _) = sh(&*sandbox, "sleep 1001 & sleep 1002", Duration::from_secs(1)).await;
    assert!(status.timed_out && !status.cancelled, "{status:?}");
    assert_eq!(status.exit_code, None);
    assert!(status.duration < Duration::from_secs(10), "{status:?}");
    assert_eq!(processes_running(&["sleep", "1001"]), Vec::<u32>::new());
    assert_eq!(processes_running(&["sleep", "1002"]), Vec::<u32>::new());
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn cancel_kills_and_says_so() {
    let f = fixture();
    let sandbox = f.backend.create(&spec()).await.expect("create");
    let (tx, mut rx) = mpsc::channel(16);
    let cancel = CancellationToken::new();
    let exec = sandbox.exec(
        ExecRequest::shell("sleep 1003 & echo started; wait", SHORT),
        tx,
        cancel.clone(),
    );
    let watch = async {
        assert_eq!(
            rx.recv().await,
            Some(ExecChunk::Stdout(Bytes::from("started\n")))
        );
        cancel.cancel();
    };
    let (status, ()) = tokio::join!(exec, watch);
    let status = status.expect("exec");
    assert!(status.cancelled && !status.timed_out, "{status:?}");
    assert_eq!(status.exit_code, None);
    assert_eq!(processes_running(&["sleep", "1003"]), Vec::<u32>::new());
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn only_loopback_and_it_is_up() {
    let f = fixture();
    let sandbox = f.backend.create(&spec()).await.expect("create");
    let (status, stdout, stderr) = sh(
        &*sandbox,
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
        SHORT,
    )
    .await;
    assert_eq!(
        (status.exit_code, stdout.as_str()),
        (Some(0), "lo\n"),
        "{stderr}"
    );

    let loopback = "import socket\n\
        s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n\
        c = socket.create_connection(s.getsockname(), timeout=5)\n\
        print('connected')\n";
    let request = ExecRequest {
        command: vec!["python3".into(), "-c".into(), loopback.into()],
        ..ExecRequest::shell("", SHORT)
    };
    let (status, collected) =
        exec_collect(&*sandbox, request, 4096, CancellationToken::new(), |_| {})
            .await
            .expect("exec");
    assert_eq!(
        (
            status.exit_code,
            String::from_utf8_lossy(&collected.stdout).as_ref()
        ),
        (Some(0), "connected\n"),
        "{}",
        String::from_utf8_lossy(&collected.stderr)
    );
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn network_true_gets_an_interface_of_its_own_linked_to_the_host() {
    let f = fixture();
    let sandbox = f
        .backend
        .create(&SandboxSpec {
            network: true,
            ..spec()
        })
        .await
        .expect("create");
    let (_, stdout, stderr) = sh(
        &*sandbox,
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' '; echo; \
         ip -4 -o addr show dev eth0 | awk '{print $4}'; ip route show default",
        SHORT,
    )
    .await;
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.first(), Some(&"eth0 lo "), "{stdout}{stderr}");
    let addr: ipnet::Ipv4Net = lines[1].parse().expect("an address");
    assert!(
        "10.213.0.0/16"
            .parse::<ipnet::Ipv4Net>()
            .expect("a CIDR")
            .contains(&addr),
        "{addr}"
    );
    assert!(lines[2].starts_with("default via 10.213."), "{stdout}");
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn host_is_hidden_and_only_workspace_and_tmp_are_writable() {
    let f = fixture();
    let sandbox = f.backend.create(&spec()).await.expect("create");
    let script = format!(
        "for p in /root /home /work /var /sys/kernel /sys/class {root} /etc/shadow; do \
             test -e $p && echo visible $p; done; \
         for p in /x /etc/x /usr/x /bin/x /proc/x /dev/x; do \
             touch $p 2>/dev/null && echo wrote $p; done; \
         touch /workspace/x /tmp/x && echo writable; \
         ls / | tr '\\n' ' '; echo; ls /sys /sys/fs | tr '\\n' ' '; echo; \
         id -un; pwd; echo $HOME",
        root = f.root.display()
    );
    let (status, stdout, stderr) = sh(&*sandbox, &script, SHORT).await;
    assert_eq!(status.exit_code, Some(0), "{stderr}");
    assert_eq!(
        stdout,
        "writable\nbin dev etc lib lib64 proc sbin sys tmp usr workspace \n\
         /sys: fs  /sys/fs: cgroup \nsandbox\n/workspace\n/workspace\n"
    );
    assert_ne!(uid_of(&*sandbox).await, 0);
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn escapes_are_refused() {
    let f = fixture();
    let sandbox = f.backend.create(&spec()).await.expect("create");
    let script = "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\t' ' '; \
         unshare -U true 2>/dev/null && echo made a user namespace; \
         python3 -c 'import os; os.setuid(0)' 2>/dev/null && echo became root; \
         cp /bin/true /dev/shm/true && /dev/shm/true 2>/dev/null && echo ran from /dev/shm; \
         cp /bin/true /tmp/true && /tmp/true && echo ran from /tmp";
    let (status, stdout, stderr) = sh(&*sandbox, script, SHORT).await;
    assert_eq!(status.exit_code, Some(0), "{stderr}");
    let mut expected = "CapEff: 0000000000000000\nNoNewPrivs: 1\nSeccomp: 2\n".to_string();
    if !f.backend.host.landlock {
        // Only landlock keeps the writable, exec-allowed /dev/shm tmpfs
        // from running programs.
        expected.push_str("ran from /dev/shm\n");
    }
    expected.push_str("ran from /tmp\n");
    assert_eq!(stdout, expected);
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn signals_reach_the_command() {
    let f = fixture();
    let sandbox = f.backend.create(&spec()).await.expect("create");
    // Were the command its pid namespace's init, the kernel would drop a
    // signal it sends itself without a handler.
    let (status, _, _) = sh(&*sandbox, "kill -TERM $$; sleep 5", SHORT).await;
    assert_eq!(status.exit_code, Some(128 + 15));
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn limits_reach_the_cgroups() {
    let f = fixture();
    let sandbox = f
        .backend
        .create(&SandboxSpec {
            cpus: 0.5,
            ..spec()
        })
        .await
        .expect("create");
    let read = |controller: &str, file: &str| {
        let path = Path::new(CGROUP_MOUNT)
            .join(controller)
            .join(&f.config.cgroup_parent)
            .join(sandbox.id())
            .join(file);
        fs::read_to_string(&path).map(|v| v.trim().to_string()).ok()
    };
    let mut expected = Vec::new();
    let mut found = Vec::new();
    let cgroups = &f.backend.host.cgroups;
    if cgroups.has(Controller::Memory) {
        expected.push(Some((256u64 << 20).to_string()));
        found.push(read("memory", "memory.limit_in_bytes"));
    }
    if cgroups.has(Controller::Pids) {
        expected.push(Some("64".into()));
        found.push(read("pids", "pids.max"));
    }
    if cgroups.has(Controller::Cpu) {
        expected.push(Some("50000".into()));
        found.push(read("cpu", "cpu.cfs_quota_us"));
    }
    assert_eq!(found, expected);
    // Every exec of the sandbox lands in them.
    let (_, stdout, _) = sh(&*sandbox, "cat /proc/self/cgroup", SHORT).await;
    for controller in ["memory", "pids", "cpu"] {
        if cgroups.has(match controller {
            "memory" => Controller::Memory,
            "pids" => Controller::Pids,
            _ => Controller::Cpu,
        }) {
            let suffix = format!("/{}/{}", f.config.cgroup_parent, sandbox.id());
            assert!(
                stdout
                    .lines()
                    .any(|l| l.contains(controller) && l.ends_with(&suffix)),
                "{controller} not in {stdout}"
            );
        }
    }
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn a_file_cannot_outgrow_disk_mb() {
    let f = fixture();
    let sandbox = f
        .backend
        .create(&SandboxSpec {
            disk_mb: 8,
            ..spec()
        })
        .await
        .expect("create");
    for path in ["/workspace/big", "/tmp/big"] {
        let script = format!("head -c 16M /dev/zero > {path}");
        let (status, _, _) = sh(&*sandbox, &script, SHORT).await;
        assert_ne!(status.exit_code, Some(0), "{path}");
        let (_, size, err) = sh(&*sandbox, &format!("stat -c %s {path}"), SHORT).await;
        assert!(
            size.trim().parse::<u64>().expect(&err) <= 8 << 20,
            "{path}: {size}"
        );
    }
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn execs_run_side_by_side() {
    let f = fixture();
    let sandbox = f.backend.create(&spec()).await.expect("create");
    let runs = (0..4).map(|i| {
        let sandbox = &sandbox;
        async move { sh(&**sandbox, &format!("echo {i}"), SHORT).await }
    });
    let outputs: Vec<String> = futures::future::join_all(runs)
        .await
        .into_iter()
        .map(|(status, stdout, stderr)| {
            assert_eq!(status.exit_code, Some(0), "{stderr}");
            stdout
        })
        .collect();
    assert_eq!(outputs, ["0\n", "1\n", "2\n", "3\n"]);
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn files_persist_between_execs() {
    let f = fixture();
    let sandbox = f.backend.create(&spec()).await.expect("create");
    let script = "mkdir -p sub && echo kept > sub/file && echo also > /tmp/file";
    let (status, _, _) = sh(&*sandbox, script, SHORT).await;
    assert_eq!(status.exit_code, Some(0));
    let (_, stdout, _) = sh(&*sandbox, "cat /workspace/sub/file /tmp/file", SHORT).await;
    assert_eq!(stdout, "kept\nalso\n");
    let on_host = f.root.join(sandbox.id()).join("workspace/sub/file");
    assert_eq!(fs::read_to_string(on_host).expect("file on host"), "kept\n");
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn fork_bomb_is_contained() {
    let f = fixture();
    let sandbox = f.backend.create(&spec()).await.expect("create");
    let request = ExecRequest {
        command: vec!["bash".into(), "-c".into(), ":(){ :|:& };:".into()],
        ..ExecRequest::shell("", Duration::from_secs(3))
    };
    let (status, _) = exec_collect(
        &*sandbox,
        request,
        1 << 16,
        CancellationToken::new(),
        |_| {},
    )
    .await
    .expect("exec");
    assert!(status.duration < Duration::from_secs(15), "{status:?}");
    assert_eq!(
        processes_running(&["bash", "-c", ":(){ :|:& };:"]),
        Vec::<u32>::new()
    );
    let (status, stdout, _) = sh(&*sandbox, "echo alive", SHORT).await;
    assert_eq!((status.exit_code, stdout.as_str()), (Some(0), "alive\n"));
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn memory_hog_is_killed() {
    let f = fixture();
    let sandbox = f.backend.create(&spec()).await.expect("create");
    let request = ExecRequest {
        command: vec![
            "python3".into(),
            "-c".into(),
            "b = bytearray(2 * 1024 ** 3); print('survived')".into(),
        ],
        ..ExecRequest::shell("", Duration::from_secs(60))
    };
    let (status, collected) = exec_collect(
        &*sandbox,
        request,
        1 << 16,
        CancellationToken::new(),
        |_| {},
    )
    .await
    .expect("exec");
    assert!(!status.timed_out, "{status:?}");
    assert!(collected.stdout.is_empty());
    if f.backend.host.cgroups.has(Controller::Memory) {
        // The cgroup's OOM killer: SIGKILL, reported as 128 + 9.
        assert_eq!(status.exit_code, Some(137));
    } else {
        // RLIMIT_AS: Python raises MemoryError.
        assert_eq!(status.exit_code, Some(1));
    }
    let (status, _, _) = sh(&*sandbox, "true", SHORT).await;
    assert_eq!(status.exit_code, Some(0));
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn a_full_tmpfs_is_named_when_it_gets_commands_killed() {
    let f = fixture();
    if !f.backend.host.is_root || !f.backend.host.cgroups.has(Controller::Memory) {
        // Without root there is no tmpfs, and without the memory cgroup no
        // kill to explain.
        return;
    }
    let spec = SandboxSpec {
        memory_mb: 64,
        disk_mb: 256,
        ..spec()
    };
    let sandbox = f.backend.create(&spec).await.expect("create");
    let (status, _, stderr) = sh(&*sandbox, "head -c 200M /dev/zero > /tmp/fill", SHORT).await;
    assert_eq!(status.exit_code, Some(137), "{stderr}");
    assert!(stderr.contains("killed for lack of memory"), "{stderr}");
    assert!(stderr.contains("DELETE /sandboxes/"), "{stderr}");
    // What the note warns of: even the command that would delete them is
    // often killed (and then says why).
    // The OOM killer may take the shell while its rm still unlinks the
    // file: then the files are gone, and so is the note.
    let (status, _, stderr) = sh(&*sandbox, "rm -f /tmp/fill", SHORT).await;
    if status.exit_code == Some(137) {
        let in_files = sandbox.stats().await.expect("stats").memory_bytes;
        assert!(
            stderr.contains("reset the sandbox") || in_files < Some(32 << 20),
            "{stderr} {in_files:?}"
        );
    }
    sandbox.destroy().await.expect("destroy");
    // A reset is a fresh sandbox, which works.
    let sandbox = f.backend.create(&spec).await.expect("create");
    let (status, _, _) = sh(&*sandbox, "true", SHORT).await;
    assert_eq!(status.exit_code, Some(0));
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn stats_come_from_the_cgroups() {
    let f = fixture();
    let sandbox = f.backend.create(&spec()).await.expect("create");
    let (status, _, _) = sh(
        &*sandbox,
        "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done",
        SHORT,
    )
    .await;
    assert_eq!(status.exit_code, Some(0));
    let stats = sandbox.stats().await.expect("stats");
    let cgroups = &f.backend.host.cgroups;
    // Without a controller there is no figure: no guesses.
    assert_eq!(stats.pids, cgroups.has(Controller::Pids).then_some(0));
    assert_eq!(
        stats.memory_bytes.is_some(),
        cgroups.has(Controller::Memory)
    );
    assert_eq!(
        stats.cpu_percent.is_some_and(|p| p > 0.0),
        cgroups.has(Controller::Cpuacct),
        "{stats:?}"
    );
    sandbox.destroy().await.expect("destroy");
}

#[tokio::test]
async fn list_managed_and_remove() {
    let f = fixture();
    let mut labelled = spec();
    labelled
        .labels
        .insert(LABEL_SESSION.into(), "session-1".into());
    let sandbox = f.backend.create(&labelled).await.expect("create");
    let unmanaged = f
        .backend
        .create(&SandboxSpec {
            labels: BTreeMap::new(),
            ..spec()
        })
        .await
        .expect("create");
    let id = sandbox.id().to_string();
    assert_eq!(
        f.backend.list_managed().await.expect("list"),
        vec![ManagedSandbox {
            instance: None,
            id: id.clone(),
            session: Some("session-1".into()),
            pool: None,
            expires: None,
            created: None,
        }]
    );

    f.backend.remove(&id).await.expect("remove");
    assert_eq!(f.backend.list_managed().await.expect("list"), vec![]);
    assert!(!f.root.join(&id).exists());
    assert!(matches!(
        sandbox
            .exec(
                ExecRequest::shell("true", SHORT),
                mpsc::channel(1).0,
                CancellationToken::new()
            )
            .await,
        Err(SandboxError::Gone(_))
    ));
    assert!(f.backend.attach(&id).await.expect("attach").is_none());
    // Removing what is gone, or was never there, is fine.
    f.backend.remove(&id).await.expect("remove again");
    f.backend
        .remove("../../etc")
        .await
        .expect("remove a bad id");
    unmanaged.destroy().await.expect("destroy");
}

#[tokio::test]
async fn remove_kills_running_execs() {
    let f = fixture();
    let sandbox = f.backend.create(&spec()).await.expect("create");
    let (tx, mut rx) = mpsc::channel(16);
    let exec = sandbox.exec(
        ExecRequest::shell("echo started; sleep 1004", SHORT),
        tx,
        CancellationToken::new(),
    );
    let remove = async {
        assert_eq!(
            rx.recv().await,
            Some(ExecChunk::Stdout(Bytes::from("started\n")))
        );
        f.backend.remove(sandbox.id()).await
    };
    let (status, removed) = tokio::join!(exec, remove);
    removed.expect("remove");
    let status = status.expect("exec");
    assert_eq!(status.exit_code, Some(137), "{status:?}");
    assert_eq!(processes_running(&["sleep", "1004"]), Vec::<u32>::new());
    assert!(!f.root.join(sandbox.id()).exists());
}

#[tokio::test]
async fn sandboxes_of_a_previous_run_are_found_again() {
    let f = fixture();
    let mut labelled = spec();
    labelled
        .labels
        .insert(LABEL_SESSION.into(), "old-session".into());
    let id = {
        let sandbox = f.backend.create(&labelled).await.expect("create");
        sh(&*sandbox, "echo from before > note", SHORT).await;
        sandbox.id().to_string()
    };
    // A create that crashed before writing meta.json.
    let half_made = format!("{ID_PREFIX}{}", uuid::Uuid::new_v4().simple());
    fs::create_dir_all(f.root.join(&half_made).join("workspace")).expect("mkdir");

    let restarted = LocalBackend::new(f.config.clone(), f.root.clone()).expect("backend");
    let mut listed = restarted.list_managed().await.expect("list");
    listed.sort_by(|a, b| a.session.cmp(&b.session));
    assert_eq!(
        listed,
        vec![
            ManagedSandbox {
                instance: None,
                id: half_made.clone(),
                session: None,
                pool: None,
                expires: None,
                created: None,
            },
            ManagedSandbox {
                instance: None,
                id: id.clone(),
                session: Some("old-session".into()),
                pool: None,
                expires: None,
                created: None,
            },
        ]
    );
    let attached = restarted.attach(&id).await.expect("attach").expect("found");
    let (_, stdout, _) = sh(&*attached, "cat note", SHORT).await;
    assert_eq!(stdout, "from before\n");

    restarted.remove(&half_made).await.expect("remove");
    restarted.remove(&id).await.expect("remove");
    assert_eq!(restarted.list_managed().await.expect("list"), vec![]);
    // Nothing is left but the exec helper the backend keeps beside the
    // sandboxes, alone in its directory (no temporary copy).
    let left: Vec<_> = fs::read_dir(&f.root)
        .expect("root")
        .map(|entry| entry.expect("entry").file_name())
        .collect();
    assert_eq!(left, [".exec"]);
    let helpers: Vec<_> = fs::read_dir(f.root.join(".exec"))
        .expect("helper directory")
        .map(|entry| entry.expect("entry").file_name())
        .collect();
    assert_eq!(helpers, ["conclave-exec"]);
}

#[test]
fn config_reads_with_defaults_and_names_bad_fields() {
    let config: LocalConfig = serde_json::from_str(r#"{"uid_base": 2000000}"#).expect("config");
    assert_eq!(
        config,
        LocalConfig {
            uid_base: 2_000_000,
            ..LocalConfig::default()
        }
    );
    assert!(serde_json::from_str::<LocalConfig>(r#"{"uid_bsae": 1}"#).is_err());
    for (bad, field) in [
        (
            LocalConfig {
                uid_base: 0,
                ..LocalConfig::default()
            },
            "uid_base",
        ),
        (
            LocalConfig {
                uid_count: u32::MAX,
                ..LocalConfig::default()
            },
            "uid_count",
        ),
        (
            LocalConfig {
                cgroup_parent: "../escape".into(),
                ..LocalConfig::default()
            },
            "cgroup_parent",
        ),
    ] {
        match bad.validate() {
            Err(SandboxError::Unavailable(msg)) => assert!(msg.contains(field), "{msg}"),
            other => panic!("{field}: {other:?}"),
        }
    }
}

#[test]
fn a_relative_root_is_refused_before_any_mount() {
    let err = LocalBackend::new(LocalConfig::default(), PathBuf::from("data/sandboxes"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "sandbox backend unavailable: the local sandbox root data/sandboxes is not an absolute path"
    );
}

#[test]
fn the_probe_hint_names_namespaces_only_when_a_namespace_call_failed() {
    // Failures as hakoniwa words them: the call and its arguments.
    let refused = "unshare(CLONE_NEWNS | CLONE_NEWPID) => EPERM: Operation not permitted";
    assert!(probe_hint(refused, true).starts_with("this host refused to make new namespaces"));
    assert!(probe_hint(refused, false).contains("unprivileged user namespaces"));
    let relative = "mount source path must be absolute: data/sandboxes/.probe-1/etc/group";
    let hint = probe_hint(relative, true);
    assert!(!hint.contains("namespace"), "{hint}");
    assert!(hint.contains("absolute data_dir"), "{hint}");
    let pivot = "pivot_root(\"/x\", \"/x/.oldroot\") => EINVAL: Invalid argument";
    assert!(!probe_hint(pivot, true).contains("namespace"));
    assert!(probe_hint("seccomp_load => EINVAL", true).starts_with("local sandboxes need seccomp"));
}
