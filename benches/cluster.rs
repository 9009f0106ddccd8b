//! Scale-out (issue 16): three `conclave serve` replicas on one PostgreSQL
//! database and one nats-server against one replica on the same, with one
//! replica on the embedded defaults (SQLite, in-process bus) as the
//! reference.
//!
//! Each deployment is started fresh (its own database and nats-server) from
//! the release binary, as `tests/cluster.rs` starts its replicas, and
//! measured twice:
//!
//! - first event: short runs (`POST /agent/run`, `{"prompt": "hello"}`) one
//!   at a time, round-robin over the replicas on one warm connection each,
//!   timed from the call that sends the request to the first complete NDJSON
//!   line; every stream is read to a `success` result. Each run makes a
//!   session, so the PostgreSQL statements and NATS messages per run
//!   (printed after the times) are what a new session costs.
//! - turns per second: SESSIONS sessions, session `i` made on and driven
//!   through replica `i mod n`, all at once, each sending TURNS messages of
//!   PROMPT (`hello`: a plain turn; `'$ echo hi'`: a turn that calls the
//!   sandbox's `Bash` tool once) back to back (the next when the last one's
//!   `result` arrives).
//!
//! Over the turns, per turn: the CPU time of the replicas, nats-server and
//! PostgreSQL's processes from `/proc`, with the whole machine's busy share
//! (everything here shares the same cores); the PostgreSQL statements (and
//! round trips), the bytes of WAL they wrote, and the NATS messages (see
//! `common/backends.rs`).
//!
//! Three replicas are measured twice: with tokio's default runtime (as
//! many threads as the machine's cores, so three replicas run three times
//! as many as one) and with a third of the cores each
//! (`TOKIO_WORKER_THREADS`, as in three containers each limited to a
//! third of the cores), which tells what the replicas' coordination costs
//! from what three runtimes on the same cores do. One replica is measured
//! a second time driving a third of the sessions, the load each of three
//! replicas takes: what three replicas pay per turn beyond that is what
//! their coordination costs, apart from what a third of the load does to
//! a replica's per-turn costs (fewer writes per statement, fewer events
//! per wake-up).
//!
//! The five deployments are measured in turn, ROUNDS times (3 unless
//! `CONCLAVE_BENCH_ROUNDS` says), and the summary gives each figure's
//! median over the rounds with its range, and the medians of each round's
//! ratios (one replica on PostgreSQL + NATS against the embedded one,
//! each kind of three replicas against one, and three replicas against
//! one driving a third of the sessions).
//!
//! usage: cargo bench --bench cluster [-- SESSIONS TURNS [PROMPT]] (default
//! 60 10 hello)
//!
//! Needs `CONCLAVE_BENCH_POSTGRES` (a PostgreSQL server URL the bench may
//! create databases in, started with `shared_preload_libraries =
//! pg_stat_statements`) and `CONCLAVE_BENCH_NATS_SERVER` (the nats-server
//! binary).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/backends.rs"]
mod backends;
#[path = "common/lines.rs"]
mod lines;
#[path = "common/procfs.rs"]
mod procfs;
#[path = "common/server.rs"]
mod server;
#[path = "common/services.rs"]
mod services;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use backends::Backends;
use lines::Lines;
use procfs::{cpu_time, machine_ticks, switches};
use server::{ServerProcess, loadavg};
use services::{Database, Nats, required};

/// Each deployment is measured this many times by default: one turns
/// phase lasts seconds, and one round's ratios move by a tenth.
const ROUNDS: usize = 3;
const WARMUP_RUNS: usize = 60;
const FIRST_EVENT_RUNS: usize = 500;
/// Sessions and turns of each by default.
const LOAD: Load = Load {
    sessions: 60,
    turns: 10,
    prompt: PROMPT,
};
/// What the first-event runs send, and the turns by default.
const PROMPT: &str = "hello";
/// A refused message (409: the session's last turn is not yet released
/// everywhere) is sent again after this pause; refusals are counted.
const RETRY_PAUSE: Duration = Duration::from_millis(2);

/// How many sessions the turns phase drives, turns in each, and what
/// each turn sends.
#[derive(Clone, Copy)]
struct Load {
    sessions: usize,
    turns: usize,
    /// `hello` (a plain turn) unless given: `'$ echo hi'` makes each turn
    /// one call of the sandbox's `Bash` tool and a second model call.
    prompt: &'static str,
}

/// One deployment: how many replicas, on what, with how many runtime
/// threads each.
#[derive(Clone, Copy)]
struct Shape {
    label: &'static str,
    replicas: usize,
    /// PostgreSQL + NATS; else the embedded store and bus.
    shared: bool,
    /// Each replica's runtime threads (`TOKIO_WORKER_THREADS`); else as
    /// many as the machine's cores, tokio's default.
    workers: Option<usize>,
    /// The turns phase drives this share of the sessions: 1 for all, 3
    /// for a third (at least one).
    share: usize,
}

/// The deployments of each round, in order.
fn shapes() -> [Shape; 5] {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let shape = |label, replicas, shared| Shape {
        label,
        replicas,
        shared,
        workers: None,
        share: 1,
    };
    [
        shape("embedded (SQLite, in-process bus), 1 replica", 1, false),
        shape("PostgreSQL + NATS, 1 replica", 1, true),
        shape("PostgreSQL + NATS, 3 replicas", 3, true),
        // As three containers each limited to a third of the cores would
        // run: tokio sizes its runtime from the CPUs a process may use.
        Shape {
            workers: Some((cores / 3).max(1)),
            ..shape(
                "PostgreSQL + NATS, 3 replicas of a third of the cores",
                3,
                true,
            )
        },
        // The load each of three replicas takes, on one: what a replica
        // pays per turn at that load, with no other replica to
        // coordinate with.
        Shape {
            share: 3,
            ..shape(
                "PostgreSQL + NATS, 1 replica, a third of the sessions",
                1,
                true,
            )
        },
    ]
}

/// The replicas of one deployment and what they share.
struct Deployment {
    label: &'static str,
    replicas: Vec<ServerProcess>,
    nats: Option<Nats>,
    database: Option<Database>,
}

impl Deployment {
    /// The shape's replicas on a fresh database and nats-server, or, not
    /// `shared`, one server on the embedded store and bus.
    async fn start(shape: Shape) -> Result<Self, String> {
        let Shape {
            label,
            replicas,
            shared,
            workers,
            share: _,
        } = shape;
        let (database, nats) = if shared {
            (Some(Database::create().await?), Some(Nats::start().await?))
        } else {
            (None, None)
        };
        let mut args = vec!["--sandbox".to_string(), "local".to_string()];
        if let (Some(database), Some(nats)) = (&database, &nats) {
            args.extend(["--store".into(), database.url.clone()]);
            args.extend(["--bus".into(), nats.url.clone()]);
        }
        let mut envs = vec![
            ("CONCLAVE_DEMO__CHUNK_DELAY_MS", "0".to_string()),
            ("RUST_LOG", "warn".to_string()),
        ];
        if let Some(workers) = workers {
            envs.push(("TOKIO_WORKER_THREADS", workers.to_string()));
        }
        let mut started = Vec::with_capacity(replicas);
        for _ in 0..replicas {
            let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))
                .map_err(|e| format!("cannot make a data directory: {e}"))?;
            started.push(ServerProcess::start_in(dir, &envs, &args).await?);
        }
        Ok(Deployment {
            label,
            replicas: started,
            nats,
            database,
        })
    }

    fn base(&self, replica: usize) -> String {
        format!(
            "http://{}",
            self.replicas[replica % self.replicas.len()].addr
        )
    }

    /// The counters of the deployment's database and nats-server.
    async fn backends(&self) -> Result<Backends, String> {
        let nats = self.nats.as_ref().map(|nats| nats.monitor.clone());
        let database = self.database.as_ref().map(|d| d.url.as_str());
        Backends::connect(database, nats).await
    }

    /// The replicas' context switches, voluntary and not.
    fn switches(&self) -> Result<(u64, u64), String> {
        let mut total = (0, 0);
        for replica in &self.replicas {
            let (voluntary, forced) = switches(replica.pid()?);
            total = (total.0 + voluntary, total.1 + forced);
        }
        Ok(total)
    }

    /// CPU time of the replicas and of nats-server.
    fn cpu(&self) -> Result<(Duration, Duration), String> {
        let mut replicas = Duration::ZERO;
        for replica in &self.replicas {
            replicas += cpu_time(replica.pid()?)?;
        }
        let nats = match &self.nats {
            Some(nats) => cpu_time(nats.child.id().ok_or("nats-server has exited")?)?,
            None => Duration::ZERO,
        };
        Ok((replicas, nats))
    }

    fn logs(&self) -> String {
        let tails = self.replicas.iter().enumerate();
        tails
            .map(|(i, replica)| format!("replica {i}:\n{}", replica.log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    async fn stop(mut self) -> Result<(), String> {
        self.replicas.clear();
        self.nats = None;
        match self.database.take() {
            Some(database) => database.drop_it().await,
            None => Ok(()),
        }
    }
}

/// Sends one prompt and reads its stream to a `success` result. Returns the
/// time to the first event and to the result, or `None` on a 409.
async fn one_turn(
    client: &reqwest::Client,
    url: &str,
    prompt: &str,
) -> Result<Option<(Duration, Duration)>, String> {
    let sent = Instant::now();
    let response = client
        .post(url)
        .json(&json!({ "prompt": prompt }))
        .send()
        .await
        .map_err(|e| format!("POST {url}: {e}"))?;
    match response.status().as_u16() {
        200 => {}
        409 => return Ok(None),
        status => return Err(format!("POST {url}: status {status}")),
    }
    let mut lines = Lines::new(response);
    let mut event: Value = lines.next().await?;
    let first_event = sent.elapsed();
    while event["type"] != "result" {
        event = lines.next().await?;
    }
    if event["status"] != "success" {
        return Err(format!("POST {url}: the turn ended with {event}"));
    }
    Ok(Some((first_event, sent.elapsed())))
}

fn client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| format!("cannot build a client: {e}"))
}

/// Nearest-rank percentile of sorted durations.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn print_percentiles(label: &str, mut times: Vec<Duration>) -> (Duration, Duration) {
    times.sort();
    let (p50, p99) = (percentile(&times, 50.0), percentile(&times, 99.0));
    println!(
        "  {label:<12} p50 {:>10}  p90 {:>10}  p99 {:>10}  max {:>10}",
        ms(p50),
        ms(percentile(&times, 90.0)),
        ms(p99),
        ms(times[times.len() - 1]),
    );
    (p50, p99)
}

/// What one deployment measured.
struct Figures {
    first_event: (Duration, Duration),
    turns: Turns,
}

/// What the turns phase measured, per turn where it says so.
struct Turns {
    per_s: f64,
    replicas_cpu: Duration,
    system_cpu: Duration,
    statements: f64,
    wal_bytes: f64,
    nats_messages: f64,
}

/// `WARMUP_RUNS` then `FIRST_EVENT_RUNS` runs one at a time, round-robin.
async fn measure_first_event(deployment: &Deployment) -> Result<(Duration, Duration), String> {
    let clients: Vec<reqwest::Client> = (0..deployment.replicas.len())
        .map(|_| client())
        .collect::<Result<_, _>>()?;
    let mut first_events = Vec::with_capacity(FIRST_EVENT_RUNS);
    let mut backends = deployment.backends().await?;
    let mut counted_before = None;
    for i in 0..WARMUP_RUNS + FIRST_EVENT_RUNS {
        if i == WARMUP_RUNS {
            backends.reset().await?;
            counted_before = Some(backends.read().await?);
        }
        let replica = i % clients.len();
        let url = format!("{}/agent/run", deployment.base(replica));
        let (first_event, _) = one_turn(&clients[replica], &url, PROMPT)
            .await?
            .ok_or("POST /agent/run answered 409")?;
        if i >= WARMUP_RUNS {
            first_events.push(first_event);
        }
    }
    println!(
        "  first event, {FIRST_EVENT_RUNS} runs one at a time (after {WARMUP_RUNS} to warm up), \
         round-robin over {} replica(s):",
        clients.len()
    );
    let percentiles = print_percentiles("first event", first_events);
    let counted_after = backends.read().await?;
    let runs = FIRST_EVENT_RUNS as f64;
    if let Some(before) = counted_before {
        backends::print_per_turn(&before, &counted_after, runs);
    }
    for line in backends.top_statements(runs).await? {
        println!("    {line}");
    }
    Ok(percentiles)
}

/// `load.turns` back-to-back turns in each of `load.sessions` sessions at
/// once.
async fn measure_turns(deployment: &Deployment, load: Load) -> Result<Turns, String> {
    let Load {
        sessions,
        turns,
        prompt,
    } = load;
    let mut urls = Vec::with_capacity(sessions);
    let maker = client()?;
    for i in 0..sessions {
        let base = deployment.base(i);
        let created: Value = maker
            .post(format!("{base}/agent/session"))
            .json(&json!({}))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| format!("creating a session on {base}: {e}"))?
            .json()
            .await
            .map_err(|e| format!("reading a created session: {e}"))?;
        let id = created["session_id"]
            .as_str()
            .ok_or_else(|| format!("no session_id in {created}"))?;
        urls.push(format!("{base}/agent/session/{id}/message"));
    }
    let start = Arc::new(Barrier::new(sessions + 1));
    let refused = Arc::new(AtomicU64::new(0));
    let mut running = JoinSet::new();
    for url in urls {
        let (start, refused, client) = (start.clone(), refused.clone(), client()?);
        running.spawn(async move {
            let mut turn_times = Vec::with_capacity(turns);
            start.wait().await;
            while turn_times.len() < turns {
                match one_turn(&client, &url, prompt).await? {
                    Some((_, result)) => turn_times.push(result),
                    None => {
                        refused.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(RETRY_PAUSE).await;
                    }
                }
            }
            Ok::<_, String>(turn_times)
        });
    }
    let mut backends = deployment.backends().await?;
    backends.reset().await?;
    let counted_before = backends.read().await?;
    let (cpu_before, machine_before) = (deployment.cpu()?, machine_ticks());
    let switches_before = deployment.switches()?;
    start.wait().await;
    let started = Instant::now();
    let mut turn_times = Vec::with_capacity(sessions * turns);
    while let Some(session) = running.join_next().await {
        turn_times.extend(session.map_err(|e| format!("a session task panicked: {e}"))??);
    }
    let wall = started.elapsed();
    let (cpu_after, machine_after) = (deployment.cpu()?, machine_ticks());
    let switches_after = deployment.switches()?;
    let counted_after = backends.read().await?;
    let turns = turn_times.len() as f64;
    let turns_per_s = turns / wall.as_secs_f64();
    println!(
        "  turns, {sessions} sessions × {} back-to-back turns of {:?} at once, session i \
         on replica i mod {}:",
        load.turns,
        load.prompt,
        deployment.replicas.len()
    );
    print_percentiles("turn", turn_times);
    println!(
        "  throughput   {turns_per_s:.1} turns/s ({turns:.0} turns in {:.2} s), \
         {} messages refused with 409 and sent again",
        wall.as_secs_f64(),
        refused.load(Ordering::Relaxed),
    );
    let per_turn = |cpu: Duration| cpu.as_secs_f64() * 1e6 / turns;
    let (replicas_cpu, nats_cpu) = (cpu_after.0 - cpu_before.0, cpu_after.1 - cpu_before.1);
    println!(
        "  CPU per turn replicas {:.0} µs, nats-server {:.0} µs; machine {:.0} % busy",
        per_turn(replicas_cpu),
        per_turn(nats_cpu),
        100.0 * (machine_after.0 - machine_before.0) as f64
            / (machine_after.1 - machine_before.1).max(1) as f64,
    );
    println!(
        "  replicas' context switches per turn: {:.1} voluntary, {:.1} forced",
        (switches_after.0 - switches_before.0) as f64 / turns,
        (switches_after.1 - switches_before.1) as f64 / turns,
    );
    let postgres_cpu = backends::print_per_turn(&counted_before, &counted_after, turns);
    for line in backends.top_statements(turns).await? {
        println!("    {line}");
    }
    let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / turns;
    Ok(Turns {
        per_s: turns_per_s,
        replicas_cpu: replicas_cpu.div_f64(turns),
        system_cpu: (replicas_cpu + nats_cpu + postgres_cpu).div_f64(turns),
        statements: per(counted_before.statements(), counted_after.statements()),
        wal_bytes: per(counted_before.wal_bytes(), counted_after.wal_bytes()),
        nats_messages: per(
            counted_before.nats_messages(),
            counted_after.nats_messages(),
        ),
    })
}

async fn measure(shape: Shape, load: Load) -> Result<Figures, String> {
    let workers = shape
        .workers
        .map_or(String::new(), |n| format!(", {n} runtime thread(s) each"));
    println!("{}{workers} (load average {})", shape.label, loadavg());
    let load = Load {
        sessions: (load.sessions / shape.share).max(1),
        ..load
    };
    let deployment = Deployment::start(shape).await?;
    let figures = async {
        Ok::<_, String>(Figures {
            first_event: measure_first_event(&deployment).await?,
            turns: measure_turns(&deployment, load).await?,
        })
    }
    .await
    .map_err(|e| format!("{}: {e}\n{}", deployment.label, deployment.logs()));
    deployment.stop().await?;
    figures
}

/// The figures the summary compares: a label, the figure, and its unit.
type Row = (&'static str, fn(&Figures) -> f64, &'static str);

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn rows() -> [Row; 8] {
    [
        ("first event p50", |f| millis(f.first_event.0), " ms"),
        ("first event p99", |f| millis(f.first_event.1), " ms"),
        ("turns/s", |f| f.turns.per_s, ""),
        (
            "replicas' CPU per turn",
            |f| micros(f.turns.replicas_cpu),
            " µs",
        ),
        (
            "whole-system CPU per turn (replicas, nats-server, PostgreSQL)",
            |f| micros(f.turns.system_cpu),
            " µs",
        ),
        (
            "PostgreSQL statements (round trips) per turn",
            |f| f.turns.statements,
            "",
        ),
        ("PostgreSQL WAL bytes per turn", |f| f.turns.wal_bytes, ""),
        (
            "NATS messages (in + out) per turn",
            |f| f.turns.nats_messages,
            "",
        ),
    ]
}

/// The median of some values with their least and greatest.
fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    (median, values[0], values[n - 1])
}

/// A median, with the range it comes from when there was more than one
/// round; a dash for a ratio over nothing (the embedded server's
/// statements).
fn cell(values: Vec<f64>, unit: &str) -> String {
    if values.iter().any(|v| !v.is_finite()) {
        return "—".to_string();
    }
    let rounds = values.len();
    let (median, least, greatest) = spread(values);
    if rounds == 1 {
        format!("{median:.2}{unit}")
    } else {
        format!("{median:.2}{unit} ({least:.2}–{greatest:.2})")
    }
}

/// One table over every round: each figure's median (and range) per
/// deployment, and the median of each round's ratios, so one slow round
/// moves no ratio much.
fn print_summary(rounds: &[[Figures; 5]]) {
    println!(
        "summary over {} round(s): medians (least–greatest) of the rounds' figures; each ratio \
         is taken in its round (same machine minutes), then the median of those",
        rounds.len()
    );
    println!(
        "| figure | embedded, 1 replica | PG + NATS, 1 replica | PG + NATS, 3 replicas \
         | PG + NATS, 3 replicas of a third of the cores \
         | PG + NATS, 1 replica, a third of the sessions | one / embedded | three / one \
         | three of a third / one | three / one at a third of the sessions |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (label, value, unit) in rows() {
        let of = |deployment: usize| -> Vec<f64> {
            rounds
                .iter()
                .map(|round| value(&round[deployment]))
                .collect()
        };
        let ratio = |over: usize, under: usize| -> Vec<f64> {
            let (over, under) = (of(over), of(under));
            over.iter().zip(&under).map(|(o, u)| o / u).collect()
        };
        println!(
            "| {label} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            cell(of(0), unit),
            cell(of(1), unit),
            cell(of(2), unit),
            cell(of(3), unit),
            cell(of(4), unit),
            cell(ratio(1, 0), ""),
            cell(ratio(2, 1), ""),
            cell(ratio(3, 1), ""),
            cell(ratio(2, 4), ""),
        );
    }
}

/// How many times the deployments are measured, one after the
/// other: `CONCLAVE_BENCH_ROUNDS`, by default `ROUNDS`.
fn rounds() -> Result<usize, String> {
    match std::env::var("CONCLAVE_BENCH_ROUNDS") {
        Err(_) => Ok(ROUNDS),
        Ok(n) => n
            .parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("CONCLAVE_BENCH_ROUNDS={n:?} is not a count")),
    }
}

/// SESSIONS, TURNS and PROMPT from the command line (cargo passes
/// `--bench`).
fn load() -> Result<Load, String> {
    let numbers: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let parse = |i: usize, default: usize| match numbers.get(i) {
        None => Ok(default),
        Some(n) => n.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| {
            format!("usage: cluster [SESSIONS TURNS [PROMPT]]: {n:?} is not a count")
        }),
    };
    Ok(Load {
        sessions: parse(0, LOAD.sessions)?,
        turns: parse(1, LOAD.turns)?,
        // Leaked once: the bench's whole run uses it.
        prompt: numbers
            .get(2)
            .map_or(LOAD.prompt, |p| Box::leak(p.clone().into_boxed_str())),
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    println!(
        "cluster: {} cores, load average {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg(),
    );
    required("CONCLAVE_BENCH_POSTGRES");
    required("CONCLAVE_BENCH_NATS_SERVER");
    let outcome = async {
        let load = load()?;
        let count = rounds()?;
        let mut measured = Vec::with_capacity(count);
        for round in 1..=count {
            println!("round {round} of {count}");
            let [embedded, one, three, three_shared, one_third] = shapes();
            measured.push([
                measure(embedded, load).await?,
                measure(one, load).await?,
                measure(three, load).await?,
                measure(three_shared, load).await?,
                measure(one_third, load).await?,
            ]);
        }
        print_summary(&measured);
        Ok::<_, String>(())
    }
    .await;
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cluster: {e}");
            ExitCode::FAILURE
        }
    }
}
