//! Time to first event of `POST /agent/run` with the `demo` model under 200
//! concurrent runs.
//!
//! The release server runs as a child process (`conclave serve` on
//! `127.0.0.1:0`, store in a fresh directory under the target dir). A run's
//! time to first event is from the call that sends its request to the first
//! complete NDJSON line; every stream is read to its `result`, and a run that
//! ends any other way than `success` fails the bench.
//!
//! Headline, under load: a server with a 50 ms pause between the demo model's
//! chunks carries 200 background runs at all times (200 clients, each running
//! back-to-back turns that stream a `text_delta` per word of a 50-word prompt,
//! a few seconds each). While they stream, a probe on its own thread starts
//! new short runs at a fixed rate, each on an idle warm connection from a
//! small pool, and times their first event.
//!
//! Secondary, on a second server without the pause: 200 runs released at the
//! same instant on warm connections (a burst), and runs one at a time.
//!
//! Targets (p50 ≤ 2 ms, p99 ≤ 10 ms) are reported against, not asserted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/procfs.rs"]
mod procfs;
#[path = "common/server.rs"]
mod server;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{Barrier, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use procfs::{cpu_time, machine_ticks};
use server::ServerProcess;

const LOAD_RUNS: usize = 200;
const CHUNK_DELAY: Duration = Duration::from_millis(50);
/// One `text_delta` per word, so a background run streams for about
/// `LOAD_WORDS` × `CHUNK_DELAY`.
const LOAD_WORDS: usize = 50;
const PROBE_RATE_PER_S: u32 = 50;
const PROBE_RUNS: usize = 1000;
/// Enough that a probe never waits for a connection: each probe run lasts
/// three chunk pauses, so about eight are in flight at 50 runs/s.
const PROBE_CONNECTIONS: usize = 16;
const BURST: usize = 200;
const BURST_WARMUP_ROUNDS: usize = 3;
const BURST_ROUNDS: usize = 10;
const ALONE_RUNS: usize = 500;
const SHORT_BODY: &str = r#"{"prompt": "hello"}"#;
const TARGET_P50: Duration = Duration::from_millis(2);
const TARGET_P99: Duration = Duration::from_millis(10);

/// One run as its client saw it, all times from the call that sent it.
struct Sample {
    headers: Duration,
    first_event: Duration,
    result: Duration,
}

/// Sends one run and reads its stream to the `result` event, counting every
/// event into `events` as it arrives.
async fn run_once(
    client: &reqwest::Client,
    url: &str,
    body: &str,
    events: &AtomicU64,
) -> Result<Sample, String> {
    let sent = Instant::now();
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
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
            events.fetch_add(1, Ordering::Relaxed);
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

/// A client that keeps one connection: give each run in flight its own.
fn client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(1)
        .build()
        .map_err(|e| format!("cannot build a client: {e}"))
}

/// What the background clients have done so far.
#[derive(Default)]
struct Load {
    /// Background runs sent and not yet at their `result`.
    in_flight: AtomicUsize,
    events: AtomicU64,
    runs: AtomicU64,
}

/// One background client: back-to-back streaming runs until `stop`, the
/// last one read to its `result` like every other.
async fn keep_running(
    url: Arc<str>,
    body: Arc<str>,
    load: Arc<Load>,
    stop: CancellationToken,
) -> Result<(), String> {
    let client = client()?;
    while !stop.is_cancelled() {
        load.in_flight.fetch_add(1, Ordering::Relaxed);
        let outcome = run_once(&client, &url, &body, &load.events).await;
        load.in_flight.fetch_sub(1, Ordering::Relaxed);
        outcome?;
        load.runs.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Counters read at one edge of the measurement window.
struct Snapshot {
    at: Instant,
    server_cpu: Duration,
    client_cpu: Duration,
    machine_busy: u64,
    machine_total: u64,
    events: u64,
    runs: u64,
}

impl Snapshot {
    fn take(server: &str, load: &Load) -> Result<Snapshot, String> {
        let (machine_busy, machine_total) = machine_ticks();
        Ok(Snapshot {
            at: Instant::now(),
            server_cpu: cpu_time(server)?,
            client_cpu: cpu_time("self")?,
            machine_busy,
            machine_total,
            events: load.events.load(Ordering::Relaxed),
            runs: load.runs.load(Ordering::Relaxed),
        })
    }
}

/// What the probe measured, and the load around it.
struct Window {
    samples: Vec<Sample>,
    start: Snapshot,
    end: Snapshot,
    in_flight_min: usize,
    in_flight_avg: f64,
    waited_for_connection: usize,
}

/// Starts `PROBE_RUNS` short runs at `PROBE_RATE_PER_S`, each on an idle
/// warm connection, while sampling how many background runs are in flight.
async fn probe(url: Arc<str>, server: String, load: Arc<Load>) -> Result<Window, String> {
    let (give_back, mut idle) = mpsc::channel(PROBE_CONNECTIONS);
    let probe_events = Arc::new(AtomicU64::new(0));
    for _ in 0..PROBE_CONNECTIONS {
        let client = client()?;
        run_once(&client, &url, SHORT_BODY, &probe_events).await?;
        give_back
            .send(client)
            .await
            .map_err(|_| "the idle pool closed")?;
    }
    let stop_sampling = CancellationToken::new();
    let sampler = tokio::spawn({
        let (load, stop) = (load.clone(), stop_sampling.clone());
        async move {
            let mut every = tokio::time::interval(Duration::from_millis(5));
            let (mut min, mut sum, mut count) = (usize::MAX, 0, 0);
            while stop.run_until_cancelled(every.tick()).await.is_some() {
                let in_flight = load.in_flight.load(Ordering::Relaxed);
                (min, sum, count) = (min.min(in_flight), sum + in_flight, count + 1);
            }
            (min, sum as f64 / count.max(1) as f64)
        }
    });
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / PROBE_RATE_PER_S);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut runs = JoinSet::new();
    let mut waited_for_connection = 0;
    let start = Snapshot::take(&server, &load)?;
    for _ in 0..PROBE_RUNS {
        ticks.tick().await;
        let client = match idle.try_recv() {
            Ok(client) => client,
            Err(_) => {
                waited_for_connection += 1;
                idle.recv().await.ok_or("the idle pool closed")?
            }
        };
        let (url, events, give_back) = (url.clone(), probe_events.clone(), give_back.clone());
        runs.spawn(async move {
            let sample = run_once(&client, &url, SHORT_BODY, &events).await;
            let _ = give_back.send(client).await;
            sample
        });
    }
    let mut samples = Vec::with_capacity(PROBE_RUNS);
    while let Some(run) = runs.join_next().await {
        samples.push(run.map_err(|e| format!("a probe run panicked: {e}"))??);
    }
    let end = Snapshot::take(&server, &load)?;
    stop_sampling.cancel();
    let (in_flight_min, in_flight_avg) = sampler
        .await
        .map_err(|e| format!("the sampler panicked: {e}"))?;
    Ok(Window {
        samples,
        start,
        end,
        in_flight_min,
        in_flight_avg,
        waited_for_connection,
    })
}

/// The headline: first events of probe runs while 200 background runs
/// stream. The probe has a runtime and thread of its own, so its timings
/// do not queue behind the background clients' tasks.
async fn measure_under_load(server: &ServerProcess) -> Result<(), String> {
    let url = server.url();
    let words = vec!["word"; LOAD_WORDS].join(" ");
    let body: Arc<str> = json!({"prompt": words, "text_deltas": true})
        .to_string()
        .into();
    let load = Arc::new(Load::default());
    let stop = CancellationToken::new();
    // Spread the starts over one run's length so the clients' chunks do not
    // all fall on the same ticks.
    let run_length = CHUNK_DELAY * (LOAD_WORDS as u32 + 2);
    let mut background = JoinSet::new();
    for _ in 0..LOAD_RUNS {
        background.spawn(keep_running(
            url.clone(),
            body.clone(),
            load.clone(),
            stop.clone(),
        ));
        tokio::time::sleep(run_length / LOAD_RUNS as u32).await;
    }
    tokio::time::sleep(run_length).await;
    let (done, window) = oneshot::channel();
    std::thread::spawn({
        let (url, pid, load) = (url.clone(), server.pid()?, load.clone());
        move || {
            let window = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("cannot build the probe's runtime: {e}"))
                .and_then(|runtime| runtime.block_on(probe(url, pid, load)));
            let _ = done.send(window);
        }
    });
    let window = window.await.map_err(|_| "the probe thread panicked");
    stop.cancel();
    while let Some(client) = background.join_next().await {
        client.map_err(|e| format!("a background client panicked: {e}"))??;
    }
    let window = window??;
    let (start, end) = (&window.start, &window.end);
    let seconds = (end.at - start.at).as_secs_f64();
    let share = |cpu: Duration| 100.0 * cpu.as_secs_f64() / seconds;
    println!(
        "HEADLINE, under {LOAD_RUNS} concurrent runs: {} probe runs ({{\"prompt\": \"hello\"}}) \
         at {PROBE_RATE_PER_S}/s on {PROBE_CONNECTIONS} warm connections, over {seconds:.1} s",
        window.samples.len(),
    );
    let (p50, p99) = summary(
        "first event",
        window.samples.iter().map(|s| s.first_event).collect(),
    );
    summary(
        "headers",
        window.samples.iter().map(|s| s.headers).collect(),
    );
    summary("result", window.samples.iter().map(|s| s.result).collect());
    println!(
        "  load           {LOAD_RUNS} background clients, back-to-back runs of {} text_delta \
         events {} ms apart; in flight min {} avg {:.1}",
        LOAD_WORDS + 2,
        CHUNK_DELAY.as_millis(),
        window.in_flight_min,
        window.in_flight_avg,
    );
    println!(
        "  background     {:.0} events/s streamed, {:.0} runs/s completed",
        (end.events - start.events) as f64 / seconds,
        (end.runs - start.runs) as f64 / seconds,
    );
    println!(
        "  CPU            server {:.0} %, bench client {:.0} % (100 % = one core); \
         machine {:.0} % busy of all cores",
        share(end.server_cpu - start.server_cpu),
        share(end.client_cpu - start.client_cpu),
        100.0 * (end.machine_busy - start.machine_busy) as f64
            / (end.machine_total - start.machine_total).max(1) as f64,
    );
    println!(
        "  probe          {} of {} waited for an idle connection",
        window.waited_for_connection,
        window.samples.len()
    );
    print_targets(p50, p99);
    Ok(())
}

/// Starts one run per client at the same moment. Returns the samples and
/// the round's wall time (release to the last `result`).
async fn burst(
    clients: &[reqwest::Client],
    url: &Arc<str>,
) -> Result<(Vec<Sample>, Duration), String> {
    let start = Arc::new(Barrier::new(clients.len() + 1));
    let events = Arc::new(AtomicU64::new(0));
    let runs: Vec<_> = clients
        .iter()
        .map(|client| {
            let (client, url, start, events) =
                (client.clone(), url.clone(), start.clone(), events.clone());
            tokio::spawn(async move {
                start.wait().await;
                run_once(&client, &url, SHORT_BODY, &events).await
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

fn print_targets(p50: Duration, p99: Duration) {
    let verdict = |met: bool| if met { "met" } else { "MISSED" };
    println!(
        "  targets        p50 ≤ {} {}, p99 ≤ {} {}",
        ms(TARGET_P50),
        verdict(p50 <= TARGET_P50),
        ms(TARGET_P99),
        verdict(p99 <= TARGET_P99),
    );
}

/// Prints a secondary measurement: latencies, throughput and the CPU time
/// each run cost the server and this client.
fn report(title: &str, samples: &[Sample], wall: Duration, cpu: (Duration, Duration)) {
    println!("{title}");
    summary(
        "first event",
        samples.iter().map(|s| s.first_event).collect(),
    );
    summary("headers", samples.iter().map(|s| s.headers).collect());
    summary("result", samples.iter().map(|s| s.result).collect());
    let runs = samples.len() as f64;
    println!(
        "  throughput     {:.0} runs/s over {:.2} s of wall time",
        runs / wall.as_secs_f64(),
        wall.as_secs_f64()
    );
    println!(
        "  CPU per run    server {:.0} µs, client {:.0} µs",
        cpu.0.as_secs_f64() * 1e6 / runs,
        cpu.1.as_secs_f64() * 1e6 / runs
    );
}

/// The secondary figures, on a server without chunk pauses: a burst of
/// `BURST` runs released together, then runs one at a time.
async fn measure_burst_and_alone(server: &ServerProcess) -> Result<(), String> {
    let (url, pid) = (server.url(), server.pid()?);
    let cpu =
        || -> Result<(Duration, Duration), String> { Ok((cpu_time(&pid)?, cpu_time("self")?)) };
    let clients: Vec<reqwest::Client> = (0..BURST).map(|_| client()).collect::<Result<_, _>>()?;
    for _ in 0..BURST_WARMUP_ROUNDS {
        burst(&clients, &url).await?;
    }
    let mut samples = Vec::with_capacity(BURST_ROUNDS * BURST);
    let mut wall = Duration::ZERO;
    let before = cpu()?;
    for _ in 0..BURST_ROUNDS {
        let (round, round_wall) = burst(&clients, &url).await?;
        samples.extend(round);
        wall += round_wall;
        // Let the last round's writes and tasks finish before the next.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = cpu()?;
    report(
        &format!(
            "secondary, burst: {BURST} runs released at the same instant on warm connections, \
             {BURST_ROUNDS} rounds (no background load, no chunk pause)"
        ),
        &samples,
        wall,
        (after.0 - before.0, after.1 - before.1),
    );
    println!(
        "  (every run's work arrives at once: the last of {BURST} waits for the CPU time of \
         those ahead of it on 2 shared cores, so this measures throughput, not idle latency)"
    );
    let events = AtomicU64::new(0);
    let alone = &clients[0];
    let mut samples = Vec::with_capacity(ALONE_RUNS);
    let (before, started) = (cpu()?, Instant::now());
    for _ in 0..ALONE_RUNS {
        samples.push(run_once(alone, &url, SHORT_BODY, &events).await?);
    }
    let after = cpu()?;
    report(
        &format!("secondary, reference: {ALONE_RUNS} runs one at a time on one warm connection"),
        &samples,
        started.elapsed(),
        (after.0 - before.0, after.1 - before.1),
    );
    Ok(())
}

/// Runs `measure` against a fresh server, adding the server's last log
/// lines to an error.
async fn on_server(
    chunk_delay: Duration,
    measure: impl AsyncFnOnce(&ServerProcess) -> Result<(), String>,
) -> Result<(), String> {
    let server = ServerProcess::start(&[(
        "CONCLAVE_DEMO__CHUNK_DELAY_MS",
        chunk_delay.as_millis().to_string(),
    )])
    .await?;
    measure(&server)
        .await
        .map_err(|e| format!("{e}\nlast lines of the server log:\n{}", server.log_tail()))
}

#[tokio::main]
async fn main() -> ExitCode {
    println!(
        "first_event: {} cores, load average {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim(),
    );
    let outcome = match on_server(CHUNK_DELAY, measure_under_load).await {
        Ok(()) => on_server(Duration::ZERO, measure_burst_and_alone).await,
        Err(e) => Err(e),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("first_event: {e}");
            ExitCode::FAILURE
        }
    }
}
