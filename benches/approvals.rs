//! Tool-call approvals (issue 37): what the approval path adds between a
//! call and its tool's first output.
//!
//! Each arm runs turns of `{"prompt": "$ echo bench"}` (the `demo` model,
//! no chunk delay, makes one `Bash` call) on an in-process server whose
//! `Bash` is a router of the bench's own that answers at once, so the
//! tool's own time is nil and the same everywhere. Each turn is read from
//! its `POST /agent/session/{id}/message` stream:
//!
//! - `auto` (the baseline): a session with `{"permissions": {"mode":
//!   "auto"}}`; from the `tool_use` event's arrival to the arrival of the
//!   call's first `tool_output` or `tool_result`.
//! - `ask`: a session with `{"mode": "ask"}`; when `approval_requested`
//!   arrives, the bench sends `POST .../approvals/{call_id}` `{"decision":
//!   "allow"}` on a warm connection of its own and times from that call to
//!   the call's first `tool_output` or `tool_result` on the turn's stream
//!   (read while the POST is in flight).
//!
//! The arms alternate turn by turn (which goes first alternates too). Every
//! turn must end `success` with its tool's result, and every decision must
//! be a 200, or the bench fails.
//!
//! Two deployments, each its own baseline:
//! 1. one server on the embedded defaults (SQLite, in-process bus);
//! 2. two replicas A and B (in this process, each a server of its own) on
//!    one PostgreSQL database and one nats-server, the turns on A, the
//!    decision sent to A and, in a third arm, to B (it reaches the turn
//!    over the bus). Run when `CONCLAVE_TEST_POSTGRES` (a server the bench
//!    makes a database in) and `CONCLAVE_TEST_NATS_SERVER` (the binary)
//!    are set, as scripts/test.sh sets them; said and skipped otherwise.
//!
//! The servers run on a tokio runtime of their own (two workers); the
//! client on another thread. Targets (reported, not asserted): the
//! approval path adds ≤ 2 ms at p99 on one server (issues 37 and 71) and
//! ≤ 10 ms on two replicas (issue 71). Run: `cargo bench --bench
//! approvals`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/lines.rs"]
mod lines;
#[path = "../tests/common/nats.rs"]
#[allow(dead_code)]
mod nats;
#[path = "../tests/common/postgres.rs"]
#[allow(dead_code)]
mod postgres;
#[path = "common/server.rs"]
mod server;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use conclave::agent::{ToolContext, ToolOutput, ToolRouter};
use conclave::config::Config;
use conclave::model::ToolSpec;
use conclave::server::{Server, Tools};
use serde_json::{Value, json};
use tokio::runtime::{Handle, Runtime};
use tokio_util::sync::CancellationToken;

use lines::Lines;

const WARMUP: usize = 50;
const ROUNDS: usize = 2_000;
const CLUSTER_ROUNDS: usize = 1_000;
const PROMPT: &str = "$ echo bench";
/// What deciding may add to the tool's first output at p99: on one
/// server (issues 37 and 71), and on two replicas (issue 71).
const TARGET_ONE_MS: f64 = 2.0;
const TARGET_REPLICAS_MS: f64 = 10.0;

/// `Bash`, answering at once.
struct Echo;

#[async_trait]
impl ToolRouter for Echo {
    async fn specs(&self, _ctx: &ToolContext) -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "Bash".into(),
            description: "Echoes the command".into(),
            input_schema: Arc::new(json!({"type": "object", "properties": {
                "command": {"type": "string"}
            }, "required": ["command"]})),
            read_only: false,
        }]
    }

    async fn call(
        &self,
        _ctx: &ToolContext,
        _name: &str,
        input: Value,
        _cancel: CancellationToken,
    ) -> ToolOutput {
        ToolOutput {
            output: input["command"].clone(),
            is_error: false,
        }
    }
}

/// Starts a server with `store` and `bus` (None: the embedded ones) on the
/// servers' runtime; answers its base URL.
async fn start(
    servers: &Handle,
    data_dir: &std::path::Path,
    shared: Option<(&str, &str)>,
    root: &CancellationToken,
) -> Result<String, String> {
    let mut config = Config {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        data_dir: data_dir.to_path_buf(),
        ..Config::default()
    };
    config.demo.chunk_delay_ms = 0;
    if let Some((store, bus)) = shared {
        config.store = Some(store.to_string());
        config.bus.url = Some(bus.to_string());
    }
    config.validate().map_err(|e| e.to_string())?;
    let root = root.clone();
    servers
        .spawn(async move {
            let listener = tokio::net::TcpListener::bind(config.listen)
                .await
                .map_err(|e| format!("bind: {e}"))?;
            let addr = listener.local_addr().map_err(|e| e.to_string())?;
            let server = Server::build(config, Tools::Custom(Arc::new(Echo)), root)
                .await
                .map_err(|e| format!("the server does not build: {e}"))?;
            tokio::spawn(server.run(listener));
            Ok(format!("http://{addr}"))
        })
        .await
        .map_err(|e| e.to_string())?
}

async fn create_session(http: &reqwest::Client, url: &str, mode: &str) -> Result<String, String> {
    let body = json!({"options": {"permissions": {"mode": mode}}});
    let created: Value = http
        .post(format!("{url}/agent/session"))
        .json(&body)
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    created["session_id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("no session made: {created}"))
}

/// Whether `event` is the first output of call `id`.
fn output_of(event: &Value, id: &str) -> bool {
    matches!(event["type"].as_str(), Some("tool_output" | "tool_result")) && event["id"] == id
}

/// Reads the turn's events to its `result`, which must be a success
/// after a good tool result (`ran`: one was read already).
async fn to_the_end(lines: &mut Lines, mut ran: bool) -> Result<(), String> {
    loop {
        let event = lines.next().await?;
        match event["type"].as_str() {
            Some("tool_result") => ran = event["is_error"] == false,
            Some("result") if event["status"] == "success" && ran => return Ok(()),
            Some("result") => return Err(format!("the turn ended badly: {event}")),
            _ => {}
        }
    }
}

/// Reads until the first output of call `id`; answers whether it was a
/// good `tool_result`.
async fn first_output(lines: &mut Lines, id: &str) -> Result<bool, String> {
    loop {
        let event = lines.next().await?;
        if output_of(&event, id) {
            return Ok(event["type"] == "tool_result" && event["is_error"] == false);
        }
        if event["type"] == "result" {
            return Err(format!("the turn ended before its call's output: {event}"));
        }
    }
}

async fn send(http: &reqwest::Client, url: &str, session: &str) -> Result<Lines, String> {
    let response = http
        .post(format!("{url}/agent/session/{session}/message"))
        .json(&json!({"prompt": PROMPT}))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if response.status() != 200 {
        return Err(format!("message: {}", response.status()));
    }
    Ok(Lines::new(response))
}

/// One `auto` turn: `tool_use` to the call's first output.
async fn auto_turn(http: &reqwest::Client, url: &str, session: &str) -> Result<Duration, String> {
    let mut lines = send(http, url, session).await?;
    let (took, ran) = loop {
        let event = lines.next().await?;
        if event["type"] == "tool_use" {
            let from = Instant::now();
            let ran = first_output(&mut lines, event["id"].as_str().unwrap_or_default()).await?;
            break (from.elapsed(), ran);
        }
    };
    to_the_end(&mut lines, ran).await?;
    Ok(took)
}

/// One `ask` turn on `url`, decided on `decide_on`: the decision's POST to
/// the call's first output, and to the POST's answer.
async fn ask_turn(
    http: &reqwest::Client,
    deciding: &reqwest::Client,
    (url, decide_on): (&str, &str),
    session: &str,
) -> Result<(Duration, Duration), String> {
    let mut lines = send(http, url, session).await?;
    let (took, decided, answer) = loop {
        let event = lines.next().await?;
        if event["type"] == "approval_requested" {
            let call = event["call_id"].as_str().unwrap_or_default().to_owned();
            let decide = deciding
                .post(format!(
                    "{decide_on}/agent/session/{session}/approvals/{call}"
                ))
                .json(&json!({"decision": "allow"}))
                .send();
            let from = Instant::now();
            let read = async {
                let ran = first_output(&mut lines, &call).await?;
                Ok::<_, String>((from.elapsed(), ran))
            };
            let answered = async {
                let decided = decide.await;
                (decided, from.elapsed())
            };
            let ((decided, answer), took) = tokio::join!(answered, read);
            break (took?, decided.map_err(|e| e.to_string())?, answer);
        }
    };
    let (took, ran) = took;
    if decided.status() != 200 {
        let status = decided.status();
        return Err(format!(
            "decision: {status} {}",
            decided.text().await.unwrap_or_default()
        ));
    }
    to_the_end(&mut lines, ran).await?;
    Ok((took, answer))
}

/// An arm's samples, sorted.
struct Arm {
    name: String,
    samples: Vec<Duration>,
    /// `ask`: the decision's POST to its answer.
    answers: Vec<Duration>,
}

impl Arm {
    fn new(name: &str) -> Arm {
        Arm {
            name: name.into(),
            samples: Vec::new(),
            answers: Vec::new(),
        }
    }

    fn at(&self, p: f64) -> f64 {
        percentile(&self.samples, p)
    }
}

/// The nearest-rank percentile `p` (0–100) of `samples`, in ms.
fn percentile(samples: &[Duration], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1e3
}

impl Arm {
    fn row(&self, baseline: &Arm) -> String {
        let cell = |p: f64| {
            let (own, base) = (self.at(p), baseline.at(p));
            if std::ptr::eq(self, baseline) {
                format!("{own:.3} ms")
            } else {
                format!("{own:.3} ms (+{:.3}, {:.2}×)", own - base, own / base)
            }
        };
        format!(
            "| {} | {} | {} | {} | {} | {} |",
            self.name,
            self.samples.len(),
            cell(50.0),
            cell(90.0),
            cell(99.0),
            cell(100.0)
        )
    }
}

/// Runs the deployment's arms, alternating: `auto` on `url`, then `ask`
/// on `url` decided on each of `deciders`.
async fn deployment(
    title: &str,
    url: &str,
    deciders: &[(&str, &str)],
    rounds: usize,
    target_ms: f64,
) -> Result<(), String> {
    let http = reqwest::Client::new();
    let deciding = reqwest::Client::new();
    let auto = create_session(&http, url, "auto").await?;
    let mut asking = Vec::new();
    for _ in deciders {
        asking.push(create_session(&http, url, "ask").await?);
    }
    let mut base = Arm::new("auto: `tool_use` → first output");
    let mut arms: Vec<Arm> = deciders
        .iter()
        .map(|(name, _)| Arm::new(&format!("ask, decided on {name}: POST → first output")))
        .collect();
    for round in 0..WARMUP + rounds {
        let measured = round >= WARMUP;
        let mut order: Vec<usize> = (0..=deciders.len()).collect();
        let turn = round % order.len();
        order.rotate_left(turn);
        for arm in order {
            if arm == 0 {
                let took = auto_turn(&http, url, &auto).await?;
                if measured {
                    base.samples.push(took);
                }
            } else {
                let (_, decide_on) = deciders[arm - 1];
                let ends = (url, decide_on);
                let (took, answer) = ask_turn(&http, &deciding, ends, &asking[arm - 1]).await?;
                if measured {
                    arms[arm - 1].samples.push(took);
                    arms[arm - 1].answers.push(answer);
                }
            }
        }
    }
    println!(
        "\n{title} ({rounds} turns an arm after {WARMUP} warm-up; load {})",
        server::loadavg()
    );
    println!("| arm | turns | p50 | p90 | p99 | max |");
    println!("| --- | --- | --- | --- | --- | --- |");
    println!("{}", base.row(&base));
    for arm in &arms {
        println!("{}", arm.row(&base));
        println!(
            "  its POST answered in p50 {:.3} ms, p99 {:.3} ms",
            percentile(&arm.answers, 50.0),
            percentile(&arm.answers, 99.0)
        );
        let added = arm.at(99.0) - base.at(99.0);
        let met = if added <= target_ms { "met" } else { "NOT met" };
        println!(
            "target (approval path adds ≤ {target_ms} ms at p99), {}: +{added:.3} ms, {met}",
            arm.name
        );
    }
    Ok(())
}

async fn bench(servers: Handle) -> Result<(), String> {
    let root = CancellationToken::new();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).map_err(|e| e.to_string())?;
    let one = start(&servers, &dir.path().join("one"), None, &root).await?;
    deployment(
        "One server, embedded store and bus",
        &one,
        &[("the same server", &one)],
        ROUNDS,
        TARGET_ONE_MS,
    )
    .await?;

    let cluster = ["CONCLAVE_TEST_POSTGRES", "CONCLAVE_TEST_NATS_SERVER"];
    if cluster.iter().any(|name| std::env::var(name).is_err()) {
        println!(
            "\nTwo replicas: skipped ({} not both set)",
            cluster.join(" and ")
        );
        root.cancel();
        return Ok(());
    }
    let database = postgres::TestDatabase::create(&postgres::test_server()).await;
    let nats = nats::NatsServer::start(true).await;
    let shared = Some((database.url(), nats.url.clone()));
    let shared = shared.as_ref().map(|(s, b)| (s.as_str(), b.as_str()));
    let a = start(&servers, &dir.path().join("a"), shared, &root).await?;
    let b = start(&servers, &dir.path().join("b"), shared, &root).await?;
    let outcome = deployment(
        "Two replicas on PostgreSQL and NATS, turns on A",
        &a,
        &[("A", &a), ("B (over the bus)", &b)],
        CLUSTER_ROUNDS,
        TARGET_REPLICAS_MS,
    )
    .await;
    root.cancel();
    outcome
}

fn main() -> ExitCode {
    let servers = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("no runtime for the servers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let handle = servers.handle().clone();
    let client = std::thread::spawn(move || {
        let runtime: Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(bench(handle))
    });
    let outcome = client
        .join()
        .unwrap_or_else(|_| Err("the client panicked".into()));
    servers.shutdown_timeout(Duration::from_secs(5));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("approvals bench failed: {e}");
            ExitCode::FAILURE
        }
    }
}
