//! The docker sandbox's exec-helper channel under attack, on the real
//! daemon: a run's processes try to forge the helper's replies and read the
//! server's requests through `/proc`, and two sandboxes flood while the
//! server's `/health` is timed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::TestServer;
use conclave::sandbox::docker::DockerBackend;
use conclave::sandbox::{
    ExecChunk, ExecRequest, LABEL_MANAGED, LABEL_SESSION, Sandbox, SandboxBackend, SandboxSpec,
    exec_collect, files,
};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Opens the channel's ends as another process in the sandbox would (pid
/// 1, the boot shell, the helper), prints what each open did, and answers
/// every request it can read with forged output.
const FORGER: &str = r#"
import os
helper = next(p for p in os.listdir("/proc") if p.isdigit()
              and open(f"/proc/{p}/comm").read().strip() == ".conclave-exec")
shell = open(f"/proc/{helper}/stat").read().rsplit(")", 1)[1].split()[1]
names = {"1": "1", shell: "SHELL", helper: "HELPER"}
def attempt(pid, fd, mode):
    try:
        opened = open(f"/proc/{pid}/fd/{fd}", mode, buffering=0)
    except OSError as e:
        print(f"/proc/{names[pid]}/fd/{fd}: {e.strerror}", flush=True)
        return None
    print(f"/proc/{names[pid]}/fd/{fd}: opened", flush=True)
    return opened
requests = attempt("1", 0, "rb")
writers = [w for w in (attempt(pid, 1, "wb") for pid in ("1", shell, helper)) if w]
forged = b"forged\n".hex()
for line in requests or []:
    fields = line.split()
    if fields[:1] == [b"r"]:
        run = fields[1].decode()
        for w in writers:
            w.write(f"o {run} {forged}\nx {run} 0\n".encode())
"#;

fn spec() -> SandboxSpec {
    SandboxSpec {
        image: "conclave/sandbox-python:latest".into(),
        cpus: 1.0,
        memory_mb: 256,
        pids: 64,
        disk_mb: 64,
        network: false,
        egress: None,
        env: BTreeMap::new(),
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

/// A command's exit code and stdout.
async fn run(sandbox: &dyn Sandbox, command: &str) -> (Option<i64>, String) {
    let request = ExecRequest::shell(command, Duration::from_secs(10));
    let (status, out) = exec_collect(sandbox, request, 1 << 20, CancellationToken::new(), |_| {})
        .await
        .expect("exec runs");
    (
        status.exit_code,
        String::from_utf8_lossy(&out.stdout).into(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_can_neither_forge_replies_nor_read_requests() {
    let backend = DockerBackend::connect()
        .await
        .expect("dockerd must answer (scripts/test.sh starts it)");
    let sandbox = Live(backend.create(&spec()).await.expect("sandbox starts"));
    let sandbox = sandbox.0.as_ref();
    files::write(sandbox, "/workspace/forge.py", Bytes::from(FORGER))
        .await
        .expect("write");
    files::write(sandbox, "/workspace/real.txt", Bytes::from("real\n"))
        .await
        .expect("write");

    // The forger runs in the background of a run that stays up while the
    // next commands run beside it.
    let (tx, mut output) = mpsc::channel(64);
    let cancel = CancellationToken::new();
    let attacker = sandbox.exec(
        ExecRequest::shell("python3 forge.py & sleep 30", Duration::from_secs(60)),
        tx,
        cancel.clone(),
    );
    let victim = async {
        let mut report = String::new();
        while report.matches('\n').count() < 4 {
            match output.recv().await {
                Some(ExecChunk::Stdout(data)) => report.push_str(&String::from_utf8_lossy(&data)),
                Some(ExecChunk::Stderr(data)) => panic!("{}", String::from_utf8_lossy(&data)),
                None => break,
            }
        }
        let read = files::read(sandbox, "/workspace/real.txt")
            .await
            .expect("read");
        let echoed = run(sandbox, "echo real").await;
        cancel.cancel();
        (report, read, echoed)
    };
    let (status, (report, read, echoed)) = tokio::join!(attacker, victim);
    assert!(status.expect("the attacker's run").cancelled);
    assert_eq!(
        (report.as_str(), read, echoed),
        (
            "/proc/1/fd/0: Permission denied\n\
             /proc/1/fd/1: Permission denied\n\
             /proc/SHELL/fd/1: Permission denied\n\
             /proc/HELPER/fd/1: Permission denied\n",
            (b"real\n".to_vec(), false),
            (Some(0), "real\n".to_string())
        )
    );
}

/// The 50th and 90th percentiles of `samples`, in milliseconds.
fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at = |p: usize| samples[(samples.len() - 1) * p / 100].as_secs_f64() * 1000.0;
    (at(50), at(90))
}

/// Times `/health` every 20 ms for `window`.
async fn time_health(server: &TestServer, window: Duration) -> Vec<Duration> {
    let mut samples = Vec::new();
    let until = Instant::now() + window;
    while Instant::now() < until {
        let asked = Instant::now();
        let response = server.get("/health").await;
        samples.push(asked.elapsed());
        assert_eq!(response.status(), 200);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    samples
}

/// The one tool result of a turn.
fn tool_result(events: &[Value]) -> &Value {
    let result = events.iter().find(|e| e["type"] == "tool_result");
    &result.unwrap_or_else(|| panic!("no tool result: {events:?}"))["output"]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_while_two_sandboxes_flood_their_channels() {
    let server = TestServer::start_sandboxed(|_| {}).await;
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let id = server.create_session(json!({})).await;
        // Its sandbox is up before the clock starts.
        let events = server.turn(&id, "$ true").await;
        assert_eq!(tool_result(&events)["exit_code"], 0, "{events:?}");
        sessions.push(id);
    }
    let quiet = percentiles(time_health(&server, Duration::from_secs(1)).await);
    // Each sandbox floods the helper's channel from the background, as the
    // attack did (refused now), and stays up for 8 s. A command's own
    // output is paced by the channel's rate (the reader's unit tests).
    let flood = "$ for end in /proc/1/fd/1 /proc/$PPID/fd/1; do \
                 (cat /dev/zero > $end &); done; sleep 8; echo y; echo y";
    let server = Arc::new(server);
    let floods: Vec<_> = sessions
        .iter()
        .map(|id| {
            let (server, id) = (server.clone(), id.clone());
            tokio::spawn(async move { server.turn(&id, flood).await })
        })
        .collect();
    // Past the first second, which takes the channels' bursts.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let samples = time_health(&server, Duration::from_secs(6)).await;
    for flood in floods {
        let events = flood.await.expect("the turn");
        let output = tool_result(&events);
        let (stdout, stderr) = (output["stdout"].as_str(), output["stderr"].as_str());
        assert!(
            stdout.is_some_and(|out| out.starts_with("y\ny\n")),
            "{output}"
        );
        assert_eq!(
            stderr.map(|err| err.matches("Permission denied").count()),
            Some(2),
            "{output}"
        );
    }
    let count = samples.len();
    let (median, p90) = percentiles(samples);
    eprintln!(
        "/health: quiet median {:.1} ms, p90 {:.1} ms; during the floods ({count} samples) \
         median {median:.1} ms, p90 {p90:.1} ms",
        quiet.0, quiet.1
    );
    assert!(p90 < 100.0, "median {median:.1} ms, p90 {p90:.1} ms");
    Arc::into_inner(server)
        .expect("the floods are over")
        .stop_and_remove_sandboxes()
        .await;
}
