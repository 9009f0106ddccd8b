//! Time to first event of `POST /agent/run` with the `demo` model, 200 runs
//! at once.
//!
//! The release server runs as a child process (`conclave serve` on
//! `127.0.0.1:0`, store in a fresh directory under the target dir). Each
//! round starts 200 runs together, one per client, each client holding its
//! own keep-alive connection; a run's time to first event is from the call
//! that sends its request to the first complete NDJSON line, and every
//! stream is read to its `result`.
//!
//! Two measurements, after warm-up rounds:
//! - connection setup excluded: every client's connection was opened by the
//!   warm-up and is reused, so the figure is the server's answer alone;
//! - connection setup included: every run gets a new client, so the figure
//!   also holds a TCP connect and an HTTP/1 handshake.
//!
//! Targets (p50 ≤ 2 ms, p99 ≤ 10 ms) are reported against, not asserted:
//! the bench fails only when a run fails.

use std::net::SocketAddr;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Barrier;

const CONCURRENCY: usize = 200;
const WARMUP_ROUNDS: usize = 3;
const ROUNDS: usize = 10;
const BODY: &str = r#"{"prompt": "hello"}"#;
const TARGET_P50: Duration = Duration::from_millis(2);
const TARGET_P99: Duration = Duration::from_millis(10);

/// The release server as a child process, killed when dropped.
struct ServerProcess {
    child: Child,
    addr: SocketAddr,
    data_dir: tempfile::TempDir,
}

impl ServerProcess {
    async fn start() -> Result<ServerProcess, String> {
        let data_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .map_err(|e| format!("cannot make a data directory: {e}"))?;
        let log = std::fs::File::create(data_dir.path().join("server.log"))
            .map_err(|e| format!("cannot create the server log: {e}"))?;
        let mut child = Command::new(env!("CARGO_BIN_EXE_conclave"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", env!("CARGO_BIN_EXE_conclave")))?;
        let stdout = child.stdout.take().ok_or("the server has no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .map_err(|_| "the server did not say where it listens within 30 s".to_string())?
            .map_err(|e| format!("reading the server's stdout: {e}"))?
            .ok_or("the server exited before listening")?;
        let addr = first
            .strip_prefix("conclave listening on http://")
            .and_then(|addr| addr.trim().parse().ok())
            .ok_or_else(|| format!("unexpected first line from the server: {first:?}"))?;
        // Keep draining stdout so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(ServerProcess {
            child,
            addr,
            data_dir,
        })
    }

    fn log_tail(&self) -> String {
        let log =
            std::fs::read_to_string(self.data_dir.path().join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

/// CPU time used so far by every thread of a process, from the scheduler's
/// per-thread accounting (nanoseconds, no clock-tick rounding).
fn cpu_time(pid: &str) -> Duration {
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    let nanos = threads
        .flatten()
        .filter_map(|thread| std::fs::read_to_string(thread.path().join("schedstat")).ok())
        .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(nanos)
}

/// One run as its client saw it, all times from the call that sent it.
struct Sample {
    headers: Duration,
    first_event: Duration,
    result: Duration,
}

/// Sends one run and reads its stream to the `result` event.
async fn run_once(client: &reqwest::Client, url: &str) -> Result<Sample, String> {
    let sent = Instant::now();
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .body(BODY)
        .send()
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    let headers = sent.elapsed();
    if !response.status().is_success() {
        return Err(format!("status {}", response.status()));
    }
    let mut stream = response.bytes_stream();
    let mut buffer = Vec::new();
    let mut first_event = None;
    while let Some(chunk) = stream.next().await {
        buffer.extend_from_slice(&chunk.map_err(|e| format!("reading the stream: {e}"))?);
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            let first_event = *first_event.get_or_insert_with(|| sent.elapsed());
            let event: Value = serde_json::from_slice(&line)
                .map_err(|e| format!("a line that is not JSON ({e}): {line:?}"))?;
            if event["type"] == "result" {
                if event["status"] != "success" {
                    return Err(format!("run ended with {event}"));
                }
                return Ok(Sample {
                    headers,
                    first_event,
                    result: sent.elapsed(),
                });
            }
        }
    }
    Err("the stream ended before a result event".into())
}

fn client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(1)
        .build()
        .map_err(|e| format!("cannot build a client: {e}"))
}

/// Starts one run per client at the same moment. Returns the samples and
/// the round's wall time (release to the last `result`).
async fn round(
    clients: Vec<reqwest::Client>,
    url: &Arc<str>,
) -> Result<(Vec<Sample>, Duration), String> {
    let start = Arc::new(Barrier::new(clients.len() + 1));
    let runs: Vec<_> = clients
        .into_iter()
        .map(|client| {
            let start = start.clone();
            let url = url.clone();
            tokio::spawn(async move {
                start.wait().await;
                run_once(&client, &url).await
            })
        })
        .collect();
    start.wait().await;
    let released = Instant::now();
    let mut samples = Vec::with_capacity(runs.len());
    for run in runs {
        samples.push(run.await.map_err(|e| format!("a run panicked: {e}"))??);
    }
    Ok((samples, released.elapsed()))
}

/// Nearest-rank percentile of sorted durations.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn summary(label: &str, mut times: Vec<Duration>) -> (Duration, Duration) {
    times.sort();
    let (p50, p99) = (percentile(&times, 50.0), percentile(&times, 99.0));
    println!(
        "  {label:<14} p50 {:>10}  p90 {:>10}  p99 {:>10}  max {:>10}",
        ms(p50),
        ms(percentile(&times, 90.0)),
        ms(p99),
        ms(times[times.len() - 1]),
    );
    (p50, p99)
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

/// Prints the figures of one measurement: latencies, throughput, the CPU
/// time each run cost the server and this client, and the targets.
fn report(
    title: &str,
    samples: &[Sample],
    wall: Duration,
    server_cpu: Duration,
    client_cpu: Duration,
) {
    println!("{title}");
    summary("headers", samples.iter().map(|s| s.headers).collect());
    let (p50, p99) = summary(
        "first event",
        samples.iter().map(|s| s.first_event).collect(),
    );
    summary("result", samples.iter().map(|s| s.result).collect());
    let runs = samples.len() as f64;
    println!(
        "  throughput     {:.0} runs/s over {:.2} s of wall time",
        runs / wall.as_secs_f64(),
        wall.as_secs_f64()
    );
    println!(
        "  CPU per run    server {:.0} µs, client {:.0} µs",
        server_cpu.as_secs_f64() * 1e6 / runs,
        client_cpu.as_secs_f64() * 1e6 / runs
    );
    println!(
        "  targets        p50 ≤ {} {}, p99 ≤ {} {}",
        ms(TARGET_P50),
        verdict(p50 <= TARGET_P50),
        ms(TARGET_P99),
        verdict(p99 <= TARGET_P99),
    );
}

/// Runs `rounds` rounds of simultaneous runs, one per client from
/// `clients`, and reports them.
async fn measure(
    title: &str,
    server: &str,
    url: &Arc<str>,
    rounds: usize,
    mut clients: impl FnMut() -> Result<Vec<reqwest::Client>, String>,
) -> Result<(), String> {
    let mut samples = Vec::with_capacity(rounds * CONCURRENCY);
    let mut wall = Duration::ZERO;
    let (mut server_cpu, mut client_cpu) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..rounds {
        let clients = clients()?;
        let (server_before, client_before) = (cpu_time(server), cpu_time("self"));
        let (round_samples, round_wall) = round(clients, url).await?;
        server_cpu += cpu_time(server) - server_before;
        client_cpu += cpu_time("self") - client_before;
        samples.extend(round_samples);
        wall += round_wall;
        // Let the last round's writes and tasks finish before the next.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let title = format!(
        "{title}: {} runs in {rounds} rounds of {CONCURRENCY}",
        samples.len()
    );
    report(&title, &samples, wall, server_cpu, client_cpu);
    Ok(())
}

/// Runs one at a time on one warm connection: the latency with no queue.
async fn measure_alone(server: &str, url: &str, runs: usize) -> Result<(), String> {
    let client = client()?;
    run_once(&client, url).await?;
    let mut samples = Vec::with_capacity(runs);
    let (server_before, client_before) = (cpu_time(server), cpu_time("self"));
    let started = Instant::now();
    for _ in 0..runs {
        samples.push(run_once(&client, url).await?);
    }
    let wall = started.elapsed();
    let server_cpu = cpu_time(server) - server_before;
    let client_cpu = cpu_time("self") - client_before;
    let title = format!("reference, one run at a time (warm connection): {runs} runs");
    report(&title, &samples, wall, server_cpu, client_cpu);
    Ok(())
}

async fn bench(server: &ServerProcess) -> Result<(), String> {
    let url: Arc<str> = format!("http://{}/agent/run", server.addr).into();
    let pid = server
        .child
        .id()
        .ok_or("the server has exited")?
        .to_string();
    println!(
        "first_event: server pid {pid} on {}, {CONCURRENCY} concurrent runs per round",
        server.addr
    );
    let warm: Vec<reqwest::Client> = (0..CONCURRENCY)
        .map(|_| client())
        .collect::<Result<_, _>>()?;
    for _ in 0..WARMUP_ROUNDS {
        round(warm.clone(), &url).await?;
    }
    // Clones share their pool: each client keeps the connection it warmed.
    measure(
        "connection setup excluded (warm keep-alive connections)",
        &pid,
        &url,
        ROUNDS,
        || Ok(warm.clone()),
    )
    .await?;
    measure(
        "connection setup included (a new connection per run)",
        &pid,
        &url,
        ROUNDS,
        || (0..CONCURRENCY).map(|_| client()).collect(),
    )
    .await?;
    measure_alone(&pid, &url, CONCURRENCY).await
}

#[tokio::main]
async fn main() -> ExitCode {
    let server = match ServerProcess::start().await {
        Ok(server) => server,
        Err(e) => {
            eprintln!("first_event: {e}");
            return ExitCode::FAILURE;
        }
    };
    match bench(&server).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "first_event: {e}\nlast lines of the server log:\n{}",
                server.log_tail()
            );
            ExitCode::FAILURE
        }
    }
}
