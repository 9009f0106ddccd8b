//! Pipelines: the engine's overhead per node, durable
//! checkpoint included, and runs at once, against LangGraph with
//! langgraph-checkpoint-sqlite in the same run on the same machine.
//!
//! The release server runs as a child process in test mode
//! (`CONCLAVE_PIPELINES__TEST_MODE=true`): the built-in `connector`
//! pipeline's six nodes (research → generator → tester → test_reviewer →
//! reviewer → publisher) are mock agents that answer at once, so what a
//! run costs is the engine: each node's events, its answer merged by the
//! reducers, the routing, and its checkpoint committed to the SQLite store
//! before the next node starts. Every run goes over HTTP: `POST
//! /orchestrator/pipeline/start`, then its session's events
//! (`GET /agent/session/{id}/events?since=0&follow=true`) to `result`.
//!
//! 1. **Sequential**: WARMUP runs, then SEQUENTIAL runs one after the
//!    other. Per node, from the events' `ts` (taken in the server when
//!    each event is emitted, nanoseconds): `node_started` → the same
//!    step's `checkpoint` (emitted once the checkpoint is stored: the node
//!    with its checkpoint; goal p99 ≤ 2 ms), `checkpoint` → the next
//!    `node_started` (the gap between nodes), `node_started` → the next
//!    `node_started` (a whole node cycle). From the client: each run's
//!    wall time from sending the POST to reading `result`, and that over
//!    six. The server's CPU time per run (`/proc/PID/stat`).
//! 2. **Concurrent**: CONCURRENT runs started at once on a server whose
//!    `max_concurrent_pipelines` is 200 (none queue), then again on one
//!    with the default 10 (the rest queue; counted from their `Queued`
//!    status event). No loss: every run's status is `completed` and its
//!    history holds exactly its six checkpoints, in the nodes' order.
//! 3. **The peer**: `benches/pipeline_langgraph.py`, the same graph in
//!    LangGraph (no-op nodes writing what the mocks write, the same state
//!    fields and reducers, the same conditional edges) with SqliteSaver /
//!    AsyncSqliteSaver on a file, run with CONCLAVE_BENCH_PYTHON (default
//!    `target/test-venv/bin/python`; `pip install langgraph
//!    langgraph-checkpoint-sqlite` there). Its JSON goes into one table
//!    with Conclave's figures. LangGraph runs in-process, Conclave behind
//!    HTTP with a durable SQLite commit per checkpoint.
//!
//! Run: `cargo bench --bench pipeline`. The goal is reported, not
//! asserted; a lost or failed run fails the bench.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/lines.rs"]
mod lines;
#[path = "common/procfs.rs"]
mod procfs;
#[path = "common/server.rs"]
mod server;

use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use lines::Lines;
use server::ServerProcess;

/// A process's CPU time; zero once it is gone.
fn cpu_time(pid: &str) -> Duration {
    procfs::cpu_time(pid).unwrap_or_default()
}

const WARMUP: usize = 20;
const SEQUENTIAL: usize = 200;
const CONCURRENT: usize = 100;
const NODES: [&str; 6] = [
    "research",
    "generator",
    "tester",
    "test_reviewer",
    "reviewer",
    "publisher",
];
/// The goal: the engine's overhead per node, checkpoint included.
const GOAL_P99_MS: f64 = 2.0;
/// The default `pipelines.max_concurrent_pipelines`.
const DEFAULT_CAP: usize = 10;

/// Nearest-rank percentiles, as the peer's script computes them.
#[derive(Debug, Clone, Copy, Default)]
struct Summary {
    n: usize,
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
    mean: f64,
}

fn summarize(samples: &[f64]) -> Summary {
    if samples.is_empty() {
        return Summary::default();
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let at = |p: f64| sorted[((sorted.len() as f64 - 1.0) * p).round() as usize];
    Summary {
        n: sorted.len(),
        p50: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
        max: sorted[sorted.len() - 1],
        mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
    }
}

/// The peer's summary, from its JSON.
fn summary_of(value: &Value) -> Summary {
    let f = |key: &str| value[key].as_f64().unwrap_or(f64::NAN);
    Summary {
        n: value["n"].as_u64().unwrap_or(0) as usize,
        p50: f("p50"),
        p90: f("p90"),
        p99: f("p99"),
        max: f("max"),
        mean: f("mean"),
    }
}

fn row(label: &str, s: &Summary) {
    println!(
        "  {label:44} p50 {:7.3}  p90 {:7.3}  p99 {:7.3}  max {:8.3}  mean {:7.3} ms  (n={})",
        s.p50, s.p90, s.p99, s.max, s.mean, s.n
    );
}

/// One run as the client saw it.
struct Run {
    thread_id: String,
    /// From sending the POST to its 202, and to reading `result`.
    accepted: Duration,
    wall: Duration,
    /// When the POST was sent and `result` read, for the total wall time.
    sent_at: Instant,
    done_at: Instant,
    /// The same two moments on the wall clock, against the events' `ts`
    /// (the server runs on this machine, on the same clock).
    sent_utc: DateTime<Utc>,
    done_utc: DateTime<Utc>,
    events: Vec<Value>,
}

async fn run_one(http: &reqwest::Client, base: &str, name: String) -> Result<Run, String> {
    let sent_utc = Utc::now();
    let sent_at = Instant::now();
    let response = http
        .post(format!("{base}/orchestrator/pipeline/start"))
        .json(&json!({"connector_name": name, "mock": {"delay_ms": 0}}))
        .send()
        .await
        .map_err(|e| format!("POST start: {e}"))?;
    let accepted = sent_at.elapsed();
    if response.status() != 202 {
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        return Err(format!("POST start answered {status}: {body}"));
    }
    let started: Value = response.json().await.map_err(|e| e.to_string())?;
    let thread_id = started["thread_id"].as_str().unwrap_or_default().to_owned();
    let session = started["session_id"].as_str().unwrap_or_default();
    let stream = http
        .get(format!(
            "{base}/agent/session/{session}/events?since=0&follow=true"
        ))
        .send()
        .await
        .map_err(|e| format!("GET events: {e}"))?;
    let mut lines = Lines::new(stream);
    let mut events = Vec::new();
    loop {
        let event = lines.next().await?;
        let done = event["type"] == "result";
        events.push(event);
        if done {
            break;
        }
    }
    let done_at = Instant::now();
    let done_utc = Utc::now();
    Ok(Run {
        thread_id,
        accepted,
        wall: done_at - sent_at,
        sent_at,
        done_at,
        sent_utc,
        done_utc,
        events,
    })
}

fn ts(event: &Value) -> DateTime<Utc> {
    serde_json::from_value(event["ts"].clone()).expect("an event's ts is RFC 3339")
}

fn ms(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from)
        .num_nanoseconds()
        .map_or(f64::NAN, |ns| ns as f64 / 1e6)
}

/// A run's timings from its events' `ts`, in ms.
#[derive(Default)]
struct Timeline {
    /// `node_started` → the same step's `checkpoint`.
    node: Vec<f64>,
    /// `checkpoint` → the next `node_started`.
    gap: Vec<f64>,
    /// `node_started` → the next `node_started`.
    cycle: Vec<f64>,
    /// The POST sent (client) → the first `node_started`.
    before_first: f64,
    /// The last `checkpoint` → `pipeline_completed`.
    finish: f64,
    /// `pipeline_completed` → `result`.
    closing: f64,
    /// `result` → read by the client.
    delivered: f64,
    /// `node_completed.duration_ms` (whole ms, as the server counts them).
    reported: Vec<f64>,
    /// Whether the run waited for a place (its `Queued` status event).
    queued: bool,
    /// A queued run's wait: its `Queued` status → its first `node_started`.
    queue_wait: Option<f64>,
}

/// Reads a run's events: six nodes, six checkpoints, `completed`, `success`.
fn timeline(run: &Run) -> Result<Timeline, String> {
    let events = &run.events;
    let what = |why: &str| format!("run {}: {why}", run.thread_id);
    let mut t = Timeline::default();
    let mut started: Vec<(u64, String, DateTime<Utc>)> = Vec::new();
    let mut checkpoints: Vec<(u64, DateTime<Utc>)> = Vec::new();
    let mut completed = None;
    let mut queued_at = None;
    for event in events {
        match event["type"].as_str().unwrap_or_default() {
            "node_started" => started.push((
                event["step"].as_u64().unwrap_or(0),
                event["node"].as_str().unwrap_or_default().to_owned(),
                ts(event),
            )),
            "checkpoint" => checkpoints.push((event["step"].as_u64().unwrap_or(0), ts(event))),
            "node_completed" => t
                .reported
                .push(event["duration_ms"].as_f64().unwrap_or(f64::NAN)),
            "pipeline_completed" => {
                if event["status"] != "completed" {
                    return Err(what(&format!("ended {}", event["status"])));
                }
                completed = Some(ts(event));
            }
            "status"
                if event["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("Queued")) =>
            {
                t.queued = true;
                queued_at = Some(ts(event));
            }
            _ => {}
        }
    }
    let last = events.last().ok_or_else(|| what("no events"))?;
    if last["status"] != "success" {
        return Err(what(&format!("its result is {}", last["status"])));
    }
    let nodes: Vec<&str> = started.iter().map(|(_, n, _)| n.as_str()).collect();
    if nodes != NODES || checkpoints.len() != NODES.len() {
        return Err(what(&format!(
            "nodes {nodes:?}, {} checkpoints",
            checkpoints.len()
        )));
    }
    let completed = completed.ok_or_else(|| what("no pipeline_completed"))?;
    for (i, (step, _, at)) in started.iter().enumerate() {
        let (cstep, cat) = checkpoints[i];
        if cstep != *step {
            return Err(what("a checkpoint of another step"));
        }
        t.node.push(ms(*at, cat));
        if let Some((_, _, next)) = started.get(i + 1) {
            t.gap.push(ms(cat, *next));
            t.cycle.push(ms(*at, *next));
        }
    }
    t.before_first = ms(run.sent_utc, started[0].2);
    t.delivered = ms(ts(last), run.done_utc);
    t.finish = ms(checkpoints[NODES.len() - 1].1, completed);
    t.closing = ms(completed, ts(last));
    t.queue_wait = queued_at.map(|q| ms(q, started[0].2));
    Ok(t)
}

/// No loss: the run's status is `completed` with six steps, and its
/// history holds exactly the six checkpoints, in the nodes' order.
async fn check_history(http: &reqwest::Client, base: &str, thread: &str) -> Result<(), String> {
    let get = |path: String| async move {
        let response = http.get(&path).send().await.map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("{path}: {}", response.status()));
        }
        response.json::<Value>().await.map_err(|e| e.to_string())
    };
    let status = get(format!("{base}/orchestrator/pipeline/status/{thread}")).await?;
    if status["status"] != "completed" || status["steps"] != 6 {
        return Err(format!(
            "{thread}: status {} with {} steps",
            status["status"], status["steps"]
        ));
    }
    let history = get(format!("{base}/orchestrator/pipeline/history/{thread}")).await?;
    let steps = history["history"].as_array().cloned().unwrap_or_default();
    let nodes: Vec<&str> = steps.iter().filter_map(|s| s["node"].as_str()).collect();
    let numbers: Vec<u64> = steps.iter().filter_map(|s| s["step"].as_u64()).collect();
    if nodes != NODES || numbers != [1, 2, 3, 4, 5, 6] {
        return Err(format!(
            "{thread}: history holds {nodes:?} at steps {numbers:?}"
        ));
    }
    if steps.last().map(|s| &s["status"]) != Some(&json!("completed")) {
        return Err(format!("{thread}: the last checkpoint is not completed"));
    }
    Ok(())
}

struct Sequential {
    node: Summary,
    gap: Summary,
    cycle: Summary,
    reported: Summary,
    before_first: Summary,
    finish: Summary,
    closing: Summary,
    delivered: Summary,
    accepted: Summary,
    wall: Summary,
    per_node: Summary,
    cpu_per_run_ms: f64,
    runs_per_s: f64,
}

async fn sequential(server: &ServerProcess, http: &reqwest::Client) -> Result<Sequential, String> {
    let base = format!("http://{}", server.addr);
    for i in 0..WARMUP {
        let run = run_one(http, &base, format!("warm {i}")).await?;
        timeline(&run)?;
    }
    let pid = server.pid()?;
    let cpu_before = cpu_time(&pid);
    let began = Instant::now();
    let mut runs = Vec::with_capacity(SEQUENTIAL);
    for i in 0..SEQUENTIAL {
        runs.push(run_one(http, &base, format!("seq {i}")).await?);
    }
    let elapsed = began.elapsed();
    let cpu = cpu_time(&pid) - cpu_before;
    let mut all = Timeline::default();
    let (mut before_first, mut finish, mut closing, mut delivered) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for run in &runs {
        let t = timeline(run)?;
        all.node.extend(t.node);
        all.gap.extend(t.gap);
        all.cycle.extend(t.cycle);
        all.reported.extend(t.reported);
        before_first.push(t.before_first);
        finish.push(t.finish);
        closing.push(t.closing);
        delivered.push(t.delivered);
    }
    for run in &runs {
        check_history(http, &base, &run.thread_id).await?;
    }
    let walls: Vec<f64> = runs.iter().map(|r| r.wall.as_secs_f64() * 1e3).collect();
    let per_node: Vec<f64> = walls.iter().map(|w| w / NODES.len() as f64).collect();
    let accepted: Vec<f64> = runs
        .iter()
        .map(|r| r.accepted.as_secs_f64() * 1e3)
        .collect();
    Ok(Sequential {
        node: summarize(&all.node),
        gap: summarize(&all.gap),
        cycle: summarize(&all.cycle),
        reported: summarize(&all.reported),
        before_first: summarize(&before_first),
        finish: summarize(&finish),
        closing: summarize(&closing),
        delivered: summarize(&delivered),
        accepted: summarize(&accepted),
        wall: summarize(&walls),
        per_node: summarize(&per_node),
        cpu_per_run_ms: cpu.as_secs_f64() * 1e3 / SEQUENTIAL as f64,
        runs_per_s: SEQUENTIAL as f64 / elapsed.as_secs_f64(),
    })
}

struct Concurrent {
    cap: usize,
    wall_s: f64,
    runs_per_s: f64,
    run: Summary,
    node: Summary,
    queued: usize,
    queue_wait: Summary,
    intact: usize,
    cpu_s: f64,
}

async fn concurrent(
    server: &ServerProcess,
    http: &reqwest::Client,
    cap: usize,
) -> Result<Concurrent, String> {
    let base = format!("http://{}", server.addr);
    // Warm: a run, and as many connections as the burst will use.
    run_one(http, &base, "warm".into()).await?;
    let pid = server.pid()?;
    let cpu_before = cpu_time(&pid);
    let runs = futures::future::join_all(
        (0..CONCURRENT).map(|i| run_one(http, &base, format!("con {i}"))),
    )
    .await
    .into_iter()
    .collect::<Result<Vec<Run>, String>>()?;
    let cpu = cpu_time(&pid) - cpu_before;
    let first = runs.iter().map(|r| r.sent_at).min().unwrap();
    let last = runs.iter().map(|r| r.done_at).max().unwrap();
    let wall = (last - first).as_secs_f64();
    let mut node = Vec::new();
    let mut waits = Vec::new();
    let mut queued = 0;
    for run in &runs {
        let t = timeline(run)?;
        node.extend(t.node);
        if t.queued {
            queued += 1;
        }
        waits.extend(t.queue_wait);
    }
    let mut intact = 0;
    for run in &runs {
        check_history(http, &base, &run.thread_id).await?;
        intact += 1;
    }
    let walls: Vec<f64> = runs.iter().map(|r| r.wall.as_secs_f64() * 1e3).collect();
    Ok(Concurrent {
        cap,
        wall_s: wall,
        runs_per_s: CONCURRENT as f64 / wall,
        run: summarize(&walls),
        node: summarize(&node),
        queued,
        queue_wait: summarize(&waits),
        intact,
        cpu_s: cpu.as_secs_f64(),
    })
}

async fn conclave_server(cap: usize) -> Result<ServerProcess, String> {
    ServerProcess::start(&[
        ("CONCLAVE_PIPELINES__TEST_MODE", "true".into()),
        (
            "CONCLAVE_PIPELINES__MAX_CONCURRENT_PIPELINES",
            cap.to_string(),
        ),
    ])
    .await
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(4 * CONCURRENT)
        .build()
        .unwrap()
}

/// Runs the LangGraph script; its JSON.
async fn langgraph() -> Result<Value, String> {
    let python = std::env::var("CONCLAVE_BENCH_PYTHON").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/target/test-venv/bin/python").into()
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/pipeline_langgraph.py");
    let output = tokio::process::Command::new(&python)
        .arg(script)
        .args(["--runs", &SEQUENTIAL.to_string()])
        .args(["--warmup", &WARMUP.to_string()])
        .args(["--concurrent", &CONCURRENT.to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .await
        .map_err(|e| format!("cannot start {python}: {e} (set CONCLAVE_BENCH_PYTHON)"))?;
    if !output.status.success() {
        return Err(format!(
            "{python} {script} exited {}: is LangGraph installed? \
             ({python} -m pip install langgraph langgraph-checkpoint-sqlite)",
            output.status
        ));
    }
    serde_json::from_slice(&output.stdout).map_err(|e| format!("the script's output: {e}"))
}

fn print_conclave(seq: &Sequential, con: &[Concurrent]) {
    println!(
        "conclave, {SEQUENTIAL} sequential test-mode runs (after {WARMUP} warm-up), 6 nodes each; server-side, from the events' ts:"
    );
    row("node_started -> its checkpoint (node+ckpt)", &seq.node);
    row("checkpoint -> next node_started (gap)", &seq.gap);
    row("node_started -> next node_started (cycle)", &seq.cycle);
    row("node_completed.duration_ms (whole ms)", &seq.reported);
    row("last checkpoint -> pipeline_completed", &seq.finish);
    row("pipeline_completed -> result", &seq.closing);
    println!("  from the client (HTTP; the wall clock against the events' ts):");
    row("POST sent -> first node_started", &seq.before_first);
    row("result -> read by the client", &seq.delivered);
    row("POST start -> 202", &seq.accepted);
    row("POST start -> result (run wall)", &seq.wall);
    row("run wall / 6 (per node)", &seq.per_node);
    println!(
        "  {:.1} runs/s; server CPU {:.2} ms per run ({:.3} ms per node)",
        seq.runs_per_s,
        seq.cpu_per_run_ms,
        seq.cpu_per_run_ms / NODES.len() as f64
    );
    println!(
        "  goal: node+checkpoint p99 <= {GOAL_P99_MS} ms: {} ({:.3} ms)",
        if seq.node.p99 <= GOAL_P99_MS {
            "met"
        } else {
            "MISSED"
        },
        seq.node.p99
    );
    for c in con {
        println!(
            "conclave, {CONCURRENT} runs started at once, max_concurrent_pipelines = {}:",
            c.cap
        );
        println!(
            "  wall {:.3} s, {:.1} runs/s; {} queued; {}/{CONCURRENT} completed with exactly 6 checkpoints; server CPU {:.2} s",
            c.wall_s, c.runs_per_s, c.queued, c.intact, c.cpu_s
        );
        row("run wall (POST -> result)", &c.run);
        row("node_started -> its checkpoint", &c.node);
        if c.queued > 0 {
            row("queued -> first node_started", &c.queue_wait);
        }
    }
}

fn f64_of(value: &Value) -> f64 {
    value.as_f64().unwrap_or(f64::NAN)
}

fn print_comparison(seq: &Sequential, con: &[Concurrent], peer: &Value) {
    let variants = peer["variants"].as_array().cloned().unwrap_or_default();
    println!(
        "langgraph {} + langgraph-checkpoint-sqlite {} (Python {}, SQLite {}), same graph, in-process:",
        peer["langgraph"].as_str().unwrap_or("?"),
        peer["langgraph_checkpoint_sqlite"].as_str().unwrap_or("?"),
        peer["python"].as_str().unwrap_or("?"),
        peer["sqlite"].as_str().unwrap_or("?"),
    );
    for v in &variants {
        println!("  durability {}:", v["name"].as_str().unwrap_or("?"));
        row(
            "  node entry -> next node entry (cycle)",
            &summary_of(&v["sequential"]["cycle_ms"]),
        );
        row(
            "  invoke -> return (run wall)",
            &summary_of(&v["sequential"]["run_ms"]),
        );
        row(
            "  run wall / 6 (per node)",
            &summary_of(&v["sequential"]["per_node_ms"]),
        );
        println!(
            "    sequential: {} lost of {}",
            v["sequential"]["lost"], v["sequential"]["runs"]
        );
        for (mode, key) in [("asyncio", "concurrent"), ("threads", "threads")] {
            let c = &v[key];
            println!(
                "    {} at once ({mode}): wall {:.3} s, {:.1} runs/s, {}/{} with their {} checkpoints",
                c["runs"],
                f64_of(&c["wall_s"]),
                f64_of(&c["runs_per_s"]),
                c["intact"],
                c["runs"],
                peer["checkpoints_per_run"],
            );
        }
    }
    let bare = &peer["no_checkpointer"];
    println!("  no checkpointer (LangGraph's own cost):");
    row(
        "  node entry -> next node entry (cycle)",
        &summary_of(&bare["cycle_ms"]),
    );
    row(
        "  invoke -> return (run wall)",
        &summary_of(&bare["run_ms"]),
    );
    let Some(peer) = variants.first() else {
        return;
    };
    let pseq = &peer["sequential"];
    let pcycle = summary_of(&pseq["cycle_ms"]);
    let prun = summary_of(&pseq["run_ms"]);
    let pnode = summary_of(&pseq["per_node_ms"]);
    // The peer's better way of running many at once.
    let (mode, pcon) = [
        ("asyncio", &peer["concurrent"]),
        ("threads", &peer["threads"]),
    ]
    .into_iter()
    .max_by(|a, b| f64_of(&a.1["runs_per_s"]).total_cmp(&f64_of(&b.1["runs_per_s"])))
    .unwrap();
    let uncapped = con.iter().find(|c| c.queued == 0).unwrap_or(&con[0]);
    println!();
    println!(
        "comparison: conclave over HTTP (POST, then the events' stream), a durable SQLite commit per"
    );
    println!(
        "checkpoint (WAL, synchronous=NORMAL); langgraph in-process, durability=\"sync\", WAL,"
    );
    println!("synchronous=NORMAL; ratio = conclave / langgraph (below 1: conclave is faster)");
    println!(
        "| {:44} | {:>12} | {:>12} | {:>6} |",
        "figure", "conclave", "langgraph", "ratio"
    );
    println!("| {:-<44} | {:->12} | {:->12} | {:->6} |", "", "", "", "");
    let line = |label: &str, ours: f64, theirs: f64, unit: &str| {
        let cell = |v: f64| format!("{v:.3} {unit}");
        println!(
            "| {label:44} | {:>12} | {:>12} | {:>6.2} |",
            cell(ours),
            cell(theirs),
            ours / theirs
        );
    };
    line(
        "node cycle p50 (start -> next start)",
        seq.cycle.p50,
        pcycle.p50,
        "ms",
    );
    line("node cycle p99", seq.cycle.p99, pcycle.p99, "ms");
    line(
        "run wall / 6 p50 (client side)",
        seq.per_node.p50,
        pnode.p50,
        "ms",
    );
    line("run wall / 6 p99", seq.per_node.p99, pnode.p99, "ms");
    line("run wall p50", seq.wall.p50, prun.p50, "ms");
    line("run wall p99", seq.wall.p99, prun.p99, "ms");
    line(
        &format!("{CONCURRENT} at once: wall (langgraph: {mode})"),
        uncapped.wall_s,
        f64_of(&pcon["wall_s"]),
        "s",
    );
    line(
        &format!("{CONCURRENT} at once: runs/s (langgraph: {mode})"),
        uncapped.runs_per_s,
        f64_of(&pcon["runs_per_s"]),
        "/s",
    );
}

#[tokio::main]
async fn main() -> ExitCode {
    println!("load average at the start: {}", server::loadavg());
    let http = client();
    let result: Result<(Sequential, Vec<Concurrent>), String> = async {
        let server = conclave_server(2 * CONCURRENT).await?;
        let seq = sequential(&server, &http).await?;
        let uncapped = concurrent(&server, &http, 2 * CONCURRENT).await?;
        drop(server);
        let server = conclave_server(DEFAULT_CAP).await?;
        let capped = concurrent(&server, &http, DEFAULT_CAP).await?;
        drop(server);
        Ok((seq, vec![uncapped, capped]))
    }
    .await;
    let (seq, con) = match result {
        Ok(done) => done,
        Err(e) => {
            eprintln!("pipeline bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    print_conclave(&seq, &con);
    println!("load average before the peer: {}", server::loadavg());
    let peer = match langgraph().await {
        Ok(peer) => peer,
        Err(e) => {
            eprintln!("pipeline bench: the peer: {e}");
            return ExitCode::FAILURE;
        }
    };
    let lost = peer["variants"].as_array().into_iter().flatten().any(|v| {
        v["sequential"]["lost"] != 0
            || v["concurrent"]["intact"] != v["concurrent"]["runs"]
            || v["threads"]["intact"] != v["threads"]["runs"]
    });
    print_comparison(&seq, &con, &peer);
    println!("load average at the end: {}", server::loadavg());
    if lost {
        eprintln!("pipeline bench: LangGraph lost checkpoints (see above)");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
