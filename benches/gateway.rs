//! The gateway's cost and throughput, in one run, against `conclave sim`
//! replicas (release build, child processes on loopback).
//!
//! 1. Latency added: the same non-streamed chat call at a fixed 1,000
//!    requests/s, open loop, alternately straight to a sim replica and
//!    through a one-replica pool of the gateway (blocks of 2.5 s, two of
//!    each). The figure is the gateway's p50 and p99 minus the direct ones
//!    (targets: p50 ≤ 0.3 ms, p99 ≤ 2 ms).
//! 2. Throughput against the LiteLLM proxy: closed loop at the same
//!    concurrency for the same time, a two-replica pool through the
//!    gateway, then the same two replicas through LiteLLM (one worker),
//!    configured by `conclave gateway export-litellm` from the gateway's own
//!    config (target: ≥ 30× LiteLLM's requests/s, and a lower p99).
//!
//! LiteLLM comes from PyPI (`litellm[proxy]`): set CONCLAVE_BENCH_LITELLM to
//! its `litellm` command, or run `scripts/bench-gateway.sh`, which installs
//! it and runs this. Without it the bench stops and says so.
//! Run: `cargo bench --bench gateway`. Targets are reported, not asserted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/server.rs"]
mod server;

use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Mutex;
use tokio::time::MissedTickBehavior;

use server::ServerProcess;

const RATE_PER_S: u64 = 1000;
const BLOCK: Duration = Duration::from_millis(2500);
const BLOCKS_EACH: usize = 2;
const CONCURRENCY: usize = 16;
const THROUGHPUT_FOR: Duration = Duration::from_secs(10);
const TARGET_ADDED_P50_MS: f64 = 0.3;
const TARGET_ADDED_P99_MS: f64 = 2.0;
const TARGET_RATIO: f64 = 30.0;

fn body(model: &str) -> String {
    json!({"model": model, "max_tokens": 16,
           "messages": [{"role": "user", "content": "Say hello to the benchmark."}]})
    .to_string()
}

/// A `conclave sim` replica.
async fn sim(id: &str) -> Result<(Child, String), String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_conclave"))
        .args([
            "sim",
            "--listen",
            "127.0.0.1:0",
            "--id",
            id,
            "--tokens",
            "16",
        ])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start conclave sim: {e}"))?;
    let line = BufReader::new(child.stdout.take().ok_or("no stdout")?)
        .lines()
        .next_line()
        .await
        .map_err(|e| e.to_string())?
        .ok_or("the sim exited")?;
    let base = line
        .strip_prefix("conclave sim listening on ")
        .ok_or_else(|| format!("unexpected sim output {line:?}"))?;
    Ok((child, base.to_string()))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn sorted(mut samples: Vec<f64>) -> Vec<f64> {
    samples.sort_by(f64::total_cmp);
    samples
}

/// One call, timed from send to the whole body; an error or non-200 is
/// a failure.
async fn call(client: &reqwest::Client, url: &str, body: &str) -> Result<f64, String> {
    let sent = Instant::now();
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .header("authorization", "Bearer bench")
        .body(body.to_string())
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let text = response.bytes().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&text)));
    }
    Ok(sent.elapsed().as_secs_f64() * 1000.0)
}

/// Open loop: one call started every 1/RATE s for `length`, each on its
/// own task; returns the latencies and the failures.
async fn open_loop(
    client: &reqwest::Client,
    url: &str,
    body: &str,
    length: Duration,
) -> (Vec<f64>, usize) {
    let samples = Arc::new(Mutex::new(Vec::new()));
    let failures = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut ticks = tokio::time::interval(Duration::from_micros(1_000_000 / RATE_PER_S));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut tasks = Vec::new();
    while started.elapsed() < length {
        ticks.tick().await;
        let (client, url, body) = (client.clone(), url.to_string(), body.to_string());
        let (samples, failures) = (samples.clone(), failures.clone());
        tasks.push(tokio::spawn(async move {
            match call(&client, &url, &body).await {
                Ok(ms) => samples.lock().await.push(ms),
                Err(_) => {
                    failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let samples = std::mem::take(&mut *samples.lock().await);
    (samples, failures.load(std::sync::atomic::Ordering::Relaxed))
}

/// Closed loop: CONCURRENCY clients back to back for THROUGHPUT_FOR.
async fn closed_loop(
    client: &reqwest::Client,
    url: &str,
    body: &str,
) -> (f64, Vec<f64>, usize, Option<String>) {
    let started = Instant::now();
    let workers: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (client, url, body) = (client.clone(), url.to_string(), body.to_string());
            tokio::spawn(async move {
                let mut samples = Vec::new();
                let mut failures = 0;
                let mut first_error = None;
                while started.elapsed() < THROUGHPUT_FOR {
                    match call(&client, &url, &body).await {
                        Ok(ms) => samples.push(ms),
                        Err(e) => {
                            failures += 1;
                            first_error.get_or_insert(e);
                        }
                    }
                }
                (samples, failures, first_error)
            })
        })
        .collect();
    let mut samples = Vec::new();
    let mut failures = 0;
    let mut first_error = None;
    for worker in workers {
        if let Ok((s, f, e)) = worker.await {
            samples.extend(s);
            failures += f;
            first_error = first_error.or(e);
        }
    }
    let rate = samples.len() as f64 / started.elapsed().as_secs_f64();
    (rate, sorted(samples), failures, first_error)
}

fn line(name: &str, samples: &[f64]) {
    println!(
        "  {name:<34} p50 {:>8.3} ms  p90 {:>8.3} ms  p99 {:>8.3} ms  (n={})",
        percentile(samples, 50.0),
        percentile(samples, 90.0),
        percentile(samples, 99.0),
        samples.len()
    );
}

/// Starts the LiteLLM proxy on the exported config and waits until it
/// answers.
async fn litellm(command: &str, config: &std::path::Path) -> Result<(Child, String), String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let log = std::fs::File::create(config.with_extension("log")).map_err(|e| e.to_string())?;
    let mut child = Command::new(command)
        .arg("--config")
        .arg(config)
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--num_workers",
            "1",
        ])
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .env(
            "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY",
            "true",
        )
        .env("LITELLM_LOG", "ERROR")
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {command}: {e}"))?;
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    for _ in 0..1800 {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "LiteLLM exited ({status}); see {}",
                config.with_extension("log").display()
            ));
        }
        if let Ok(response) = client.get(format!("{base}/health/liveliness")).send().await
            && response.status().is_success()
        {
            return Ok((child, base));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err("LiteLLM did not answer within 180 s".into())
}

async fn run() -> Result<(), String> {
    let litellm_command = std::env::var("CONCLAVE_BENCH_LITELLM").map_err(|_| {
        "missing prerequisite: CONCLAVE_BENCH_LITELLM must name the `litellm` command of \
         `pip install 'litellm[proxy]'`; scripts/bench-gateway.sh installs it and runs this bench"
            .to_string()
    })?;
    let (_s1, one) = sim("s1").await?;
    let (_s2, two) = sim("s2").await?;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).map_err(|e| e.to_string())?;
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway.pools.one]\nreplicas = [{{ id = \"s1\", url = \"{one}/v1\" }}]\n\
             [gateway.pools.bench]\nstrategy = \"shuffle\"\n\
             replicas = [{{ id = \"s1b\", url = \"{one}/v1\" }}, {{ id = \"s2\", url = \"{two}/v1\" }}]\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    let args = ["--config".to_string(), config.display().to_string()];
    let gateway = ServerProcess::start_in(dir, &[], &args).await?;
    let gateway_base = format!("http://{}", gateway.addr);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| e.to_string())?;
    println!(
        "gateway: 2 cores, load average {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );

    // 1. Latency added at 1,000 requests/s.
    let direct_url = format!("{one}/v1/chat/completions");
    let gateway_url = format!("{gateway_base}/v1/chat/completions");
    for url in [&direct_url, &gateway_url] {
        open_loop(&client, url, &body("one"), Duration::from_millis(500)).await; // warm-up
    }
    let (mut direct, mut through, mut failed) = (Vec::new(), Vec::new(), 0);
    for _ in 0..BLOCKS_EACH {
        let (samples, failures) = open_loop(&client, &direct_url, &body("one"), BLOCK).await;
        direct.extend(samples);
        failed += failures;
        let (samples, failures) = open_loop(&client, &gateway_url, &body("one"), BLOCK).await;
        through.extend(samples);
        failed += failures;
    }
    let (direct, through) = (sorted(direct), sorted(through));
    println!(
        "HEADLINE 1, latency added at {RATE_PER_S} requests/s (open loop, non-streamed chat, 16 tokens):"
    );
    line("direct to the sim replica", &direct);
    line("through the gateway", &through);
    let added_p50 = percentile(&through, 50.0) - percentile(&direct, 50.0);
    let added_p99 = percentile(&through, 99.0) - percentile(&direct, 99.0);
    println!(
        "  added                              p50 {added_p50:>8.3} ms  p99 {added_p99:>8.3} ms  failures {failed}"
    );
    println!(
        "  targets                            p50 ≤ {TARGET_ADDED_P50_MS} ms {}, p99 ≤ {TARGET_ADDED_P99_MS} ms {}",
        if added_p50 <= TARGET_ADDED_P50_MS {
            "met"
        } else {
            "MISSED"
        },
        if added_p99 <= TARGET_ADDED_P99_MS {
            "met"
        } else {
            "MISSED"
        }
    );

    // 2. Throughput against LiteLLM on the same replicas.
    let export = Command::new(env!("CARGO_BIN_EXE_conclave"))
        .args(["gateway", "export-litellm", "--config"])
        .arg(config_path(&gateway))
        .output()
        .await
        .map_err(|e| e.to_string())?;
    if !export.status.success() {
        return Err(format!(
            "export-litellm failed: {}",
            String::from_utf8_lossy(&export.stderr)
        ));
    }
    let litellm_dir =
        tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).map_err(|e| e.to_string())?;
    let litellm_config = litellm_dir.path().join("litellm.yaml");
    std::fs::write(&litellm_config, &export.stdout).map_err(|e| e.to_string())?;
    let (gw_rate, gw_samples, gw_failed, gw_error) =
        closed_loop(&client, &gateway_url, &body("bench")).await;
    let (_litellm, litellm_base) = litellm(&litellm_command, &litellm_config).await?;
    let litellm_url = format!("{litellm_base}/v1/chat/completions");
    call(&client, &litellm_url, &body("bench"))
        .await
        .map_err(|e| format!("LiteLLM: {e}"))?;
    let (ll_rate, ll_samples, ll_failed, ll_error) =
        closed_loop(&client, &litellm_url, &body("bench")).await;
    println!(
        "HEADLINE 2, throughput at concurrency {CONCURRENCY} for {} s, pool of 2 sim replicas:",
        THROUGHPUT_FOR.as_secs()
    );
    line("conclave gateway", &gw_samples);
    line("LiteLLM proxy (1 worker)", &ll_samples);
    println!(
        "  requests/s                         gateway {gw_rate:.0}, LiteLLM {ll_rate:.0}, ratio {:.1}×",
        gw_rate / ll_rate
    );
    println!(
        "  failures                           gateway {gw_failed} {gw_error:?}, LiteLLM {ll_failed} {ll_error:?}"
    );
    let lower_p99 = percentile(&gw_samples, 99.0) < percentile(&ll_samples, 99.0);
    println!(
        "  targets                            ≥ {TARGET_RATIO}× {}, lower p99 {}",
        if gw_rate / ll_rate >= TARGET_RATIO {
            "met"
        } else {
            "MISSED"
        },
        if lower_p99 { "met" } else { "MISSED" }
    );
    Ok(())
}

/// The config file written into the server's data directory.
fn config_path(server: &ServerProcess) -> std::path::PathBuf {
    server.data_dir().join("gateway.toml")
}

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
