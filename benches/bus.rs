//! The bus against nats-server, in one run, same machine, same message
//! (a 128-byte JSON payload), Rust clients on both sides:
//!
//! 1. Publish → deliver latency: one publisher at 1,000 messages/s for
//!    3 s, 100 subscribers (Conclave: WebSockets on `/bus/ws`; NATS: core
//!    subscriptions, one connection each). p50 and p99 over every delivery
//!    (target: Conclave's p99 within 2× of nats-server's).
//! 2. Messages per second: one publisher as fast as it can, one
//!    subscriber, 50,000 messages; the rate at which they are delivered.
//! 3. KV operations per second: sequential put then get of 2,000 keys
//!    (Conclave: HTTP `PUT`/`GET /kv/{key}` on a keep-alive connection;
//!    NATS: a JetStream KV bucket).
//!
//! 4. A rollout of 1,000 prompts over three `conclave sim` replicas (20 ms
//!    each), against the sims' own time: the same 1,000 completions sent
//!    straight to the three sims, 64 at a time as the rollout does
//!    (target: the rollout adds ≤ 5 %).
//!
//! nats-server comes from Debian (`apt-get install nats-server`); set
//! CONCLAVE_BENCH_NATS to its path if it is not on PATH. Without it the
//! bench stops and says so. Run: `cargo bench --bench bus`. Targets are
//! reported, not asserted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/server.rs"]
mod server;

use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::process::Command;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use server::ServerProcess;

const SUBSCRIBERS: usize = 100;
const RATE_PER_S: u64 = 1000;
const LATENCY_FOR: Duration = Duration::from_secs(3);
const THROUGHPUT_MESSAGES: usize = 50_000;
const KV_KEYS: usize = 2000;
const SUBJECT: &str = "bench.lat";

/// The payload: the send time (nanoseconds since `base`) padded to 128 bytes.
fn payload(base: Instant) -> String {
    let t = base.elapsed().as_nanos() as u64;
    let head = format!("{{\"t\":{t},\"pad\":\"");
    let pad = "x".repeat(128 - head.len() - 2);
    format!("{head}{pad}\"}}")
}

fn sent_at(data: &Value) -> u64 {
    data["t"].as_u64().unwrap_or(0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at]
}

struct Latency {
    p50_ms: f64,
    p99_ms: f64,
    deliveries: usize,
}

fn summarize(mut samples: Vec<f64>) -> Latency {
    samples.sort_by(|a, b| a.total_cmp(b));
    Latency {
        p50_ms: percentile(&samples, 0.5),
        p99_ms: percentile(&samples, 0.99),
        deliveries: samples.len(),
    }
}

/// The latency phase's clock: a tick per message, and when it ends.
fn pace() -> (tokio::time::Interval, Instant) {
    let mut every = tokio::time::interval(Duration::from_micros(1_000_000 / RATE_PER_S));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    (every, Instant::now() + LATENCY_FOR)
}

async fn conclave_latency(server: &ServerProcess, base: Instant) -> Latency {
    let url = format!("ws://{}/bus/ws?subscribe={SUBJECT}", server.addr);
    let (samples_tx, mut samples_rx) = mpsc::unbounded_channel::<f64>();
    let mut ready = Vec::new();
    for _ in 0..SUBSCRIBERS {
        let (ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        let samples = samples_tx.clone();
        ready.push(tokio::spawn(async move {
            let (_, mut incoming) = ws.split();
            while let Some(Ok(Message::Text(text))) = incoming.next().await {
                let received = base.elapsed().as_nanos() as u64;
                let message: Value = serde_json::from_str(&text).unwrap();
                if message["type"] == "message" {
                    let latency = received.saturating_sub(sent_at(&message["data"]));
                    let _ = samples.send(latency as f64 / 1e6);
                }
            }
        }));
    }
    drop(samples_tx);
    let (publisher, _) = tokio_tungstenite::connect_async(format!("ws://{}/bus/ws", server.addr))
        .await
        .unwrap();
    let (mut sink, mut replies) = publisher.split();
    let drain = tokio::spawn(async move { while replies.next().await.is_some() {} });
    let (mut every, end) = pace();
    while Instant::now() < end {
        every.tick().await;
        let data = payload(base);
        let frame = format!("{{\"type\":\"publish\",\"subject\":\"{SUBJECT}\",\"data\":{data}}}");
        sink.send(Message::Text(frame.into())).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for task in ready {
        task.abort();
    }
    drain.abort();
    let mut samples = Vec::new();
    while let Ok(sample) = samples_rx.try_recv() {
        samples.push(sample);
    }
    summarize(samples)
}

async fn nats_latency(url: &str, base: Instant) -> Latency {
    let (samples_tx, mut samples_rx) = mpsc::unbounded_channel::<f64>();
    let mut ready = Vec::new();
    for _ in 0..SUBSCRIBERS {
        let client = async_nats::connect(url).await.unwrap();
        let mut subscription = client.subscribe(SUBJECT).await.unwrap();
        client.flush().await.unwrap();
        let samples = samples_tx.clone();
        ready.push(tokio::spawn(async move {
            let _client = client;
            while let Some(message) = subscription.next().await {
                let received = base.elapsed().as_nanos() as u64;
                let data: Value = serde_json::from_slice(&message.payload).unwrap();
                let _ = samples.send(received.saturating_sub(sent_at(&data)) as f64 / 1e6);
            }
        }));
    }
    drop(samples_tx);
    let publisher = async_nats::connect(url).await.unwrap();
    let (mut every, end) = pace();
    while Instant::now() < end {
        every.tick().await;
        publisher
            .publish(SUBJECT, Bytes::from(payload(base)))
            .await
            .unwrap();
        publisher.flush().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for task in ready {
        task.abort();
    }
    let mut samples = Vec::new();
    while let Ok(sample) = samples_rx.try_recv() {
        samples.push(sample);
    }
    summarize(samples)
}

/// Messages delivered per second to one subscriber, and how many came.
async fn conclave_throughput(server: &ServerProcess, base: Instant) -> (f64, usize) {
    let url = format!("ws://{}/bus/ws?subscribe=bench.tp", server.addr);
    let (ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let (_, mut incoming) = ws.split();
    let counter = tokio::spawn(async move {
        let mut got = 0;
        let mut first = None;
        while got < THROUGHPUT_MESSAGES {
            match tokio::time::timeout(Duration::from_secs(5), incoming.next()).await {
                Ok(Some(Ok(Message::Text(_)))) => {
                    first.get_or_insert_with(Instant::now);
                    got += 1;
                }
                _ => break,
            }
        }
        (got, first.map(|f| f.elapsed()))
    });
    let (publisher, _) = tokio_tungstenite::connect_async(format!("ws://{}/bus/ws", server.addr))
        .await
        .unwrap();
    let (mut sink, mut replies) = publisher.split();
    let drain = tokio::spawn(async move { while replies.next().await.is_some() {} });
    let started = Instant::now();
    for _ in 0..THROUGHPUT_MESSAGES {
        let frame = format!(
            "{{\"type\":\"publish\",\"subject\":\"bench.tp\",\"data\":{}}}",
            payload(base)
        );
        sink.feed(Message::Text(frame.into())).await.unwrap();
    }
    sink.flush().await.unwrap();
    let (got, _) = counter.await.unwrap();
    drain.abort();
    (got as f64 / started.elapsed().as_secs_f64(), got)
}

async fn nats_throughput(url: &str, base: Instant) -> (f64, usize) {
    let client = async_nats::connect(url).await.unwrap();
    let mut subscription = client.subscribe("bench.tp").await.unwrap();
    client.flush().await.unwrap();
    let counter = tokio::spawn(async move {
        let mut got = 0;
        while got < THROUGHPUT_MESSAGES {
            match tokio::time::timeout(Duration::from_secs(5), subscription.next()).await {
                Ok(Some(_)) => got += 1,
                _ => break,
            }
        }
        got
    });
    let publisher = async_nats::connect(url).await.unwrap();
    let started = Instant::now();
    for _ in 0..THROUGHPUT_MESSAGES {
        publisher
            .publish("bench.tp", Bytes::from(payload(base)))
            .await
            .unwrap();
    }
    publisher.flush().await.unwrap();
    let got = counter.await.unwrap();
    (got as f64 / started.elapsed().as_secs_f64(), got)
}

async fn conclave_kv(server: &ServerProcess) -> f64 {
    let http = reqwest::Client::new();
    let started = Instant::now();
    for i in 0..KV_KEYS {
        let url = format!("http://{}/kv/bench/{i}", server.addr);
        let put = http.put(&url).json(&json!({"i": i})).send().await.unwrap();
        assert!(put.status().is_success());
        let get = http.get(&url).send().await.unwrap();
        assert!(get.status().is_success());
        let _ = get.bytes().await.unwrap();
    }
    (2 * KV_KEYS) as f64 / started.elapsed().as_secs_f64()
}

async fn nats_kv(url: &str) -> f64 {
    let client = async_nats::connect(url).await.unwrap();
    let jetstream = async_nats::jetstream::new(client);
    let store = jetstream
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: "bench".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let started = Instant::now();
    for i in 0..KV_KEYS {
        let key = format!("bench.{i}");
        store
            .put(&key, json!({"i": i}).to_string().into())
            .await
            .unwrap();
        let _ = store.get(&key).await.unwrap();
    }
    (2 * KV_KEYS) as f64 / started.elapsed().as_secs_f64()
}

const ROLLOUT_PROMPTS: usize = 1000;
const ROLLOUT_CONCURRENCY: usize = 64;
const SIM_LATENCY_MS: &str = "20";

/// A `conclave sim` replica with a fixed latency; its base URL with `/v1`.
async fn sim(id: &str) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt;
    let mut child = Command::new(env!("CARGO_BIN_EXE_conclave"))
        .args([
            "sim",
            "--listen",
            "127.0.0.1:0",
            "--id",
            id,
            "--latency-ms",
            SIM_LATENCY_MS,
        ])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = tokio::io::BufReader::new(stdout)
        .lines()
        .next_line()
        .await
        .unwrap()
        .unwrap();
    let base = line
        .strip_prefix("conclave sim listening on ")
        .unwrap()
        .trim()
        .to_string();
    (child, format!("{base}/v1"))
}

/// The 1,000 completions straight to the sims, 64 at a time.
async fn direct(urls: &[String]) -> Duration {
    let http = reqwest::Client::new();
    let started = Instant::now();
    futures::stream::iter(0..ROLLOUT_PROMPTS)
        .map(|i| {
            let request = http
                .post(format!("{}/completions", urls[i % urls.len()]))
                .json(&json!({"model": "sim", "prompt": format!("prompt {i}"), "max_tokens": 16}));
            async move {
                let response = request.send().await.unwrap();
                assert!(response.status().is_success());
                let _ = response.bytes().await.unwrap();
            }
        })
        .buffer_unordered(ROLLOUT_CONCURRENCY)
        .collect::<()>()
        .await;
    started.elapsed()
}

/// The same completions as one rollout, to its `rollout.completed`.
async fn rollout(server: &ServerProcess) -> Duration {
    let url = format!("ws://{}/bus/ws?subscribe=rollout.completed", server.addr);
    let (ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let (_, mut incoming) = ws.split();
    let prompts: Vec<String> = (0..ROLLOUT_PROMPTS)
        .map(|i| format!("prompt {i}"))
        .collect();
    let started = Instant::now();
    let response = reqwest::Client::new()
        .post(format!("http://{}/rollouts", server.addr))
        .json(
            &json!({"model": "sim", "prompts": prompts, "response_topic": "bench.rollout",
                      "sampling": {"max_tokens": 16}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    while let Some(Ok(frame)) = incoming.next().await {
        if let Message::Text(text) = frame {
            let message: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(message["data"]["failed"], 0, "{message}");
            break;
        }
    }
    started.elapsed()
}

/// nats-server with JetStream on a free port, in a temporary directory.
async fn nats_server(dir: &std::path::Path) -> Result<(tokio::process::Child, String), String> {
    let binary = std::env::var("CONCLAVE_BENCH_NATS").unwrap_or_else(|_| "nats-server".into());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let child = Command::new(&binary)
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            format!("cannot start {binary}: {e}; install it (apt-get install nats-server) or set CONCLAVE_BENCH_NATS")
        })?;
    let url = format!("nats://127.0.0.1:{port}");
    for _ in 0..100 {
        if async_nats::connect(&url).await.is_ok() {
            return Ok((child, url));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("{binary} did not answer on {url}"))
}

#[tokio::main]
async fn main() -> ExitCode {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (nats, nats_url) = match nats_server(dir.path()).await {
        Ok(started) => started,
        Err(e) => {
            eprintln!("bus bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let server = match ServerProcess::start(&[(
        "CONCLAVE_BUS__SUBSCRIBER_BUFFER",
        (THROUGHPUT_MESSAGES * 2).to_string(),
    )])
    .await
    {
        Ok(server) => server,
        Err(e) => {
            eprintln!("bus bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let base = Instant::now();
    let ours = conclave_latency(&server, base).await;
    let theirs = nats_latency(&nats_url, base).await;
    println!(
        "publish -> deliver, 1 publisher at {RATE_PER_S}/s, {SUBSCRIBERS} subscribers, 128-byte payload"
    );
    for (name, l) in [("conclave", &ours), ("nats-server", &theirs)] {
        println!(
            "  {name:12} p50 {:7.3} ms  p99 {:7.3} ms  ({} deliveries)",
            l.p50_ms, l.p99_ms, l.deliveries
        );
    }
    println!(
        "  p99 ratio conclave / nats-server: {:.2} (target <= 2)",
        ours.p99_ms / theirs.p99_ms
    );
    let (our_rate, our_got) = conclave_throughput(&server, base).await;
    let (their_rate, their_got) = nats_throughput(&nats_url, base).await;
    println!("messages/s, 1 publisher -> 1 subscriber, {THROUGHPUT_MESSAGES} messages");
    println!("  conclave     {our_rate:10.0} /s  ({our_got} delivered)");
    println!("  nats-server  {their_rate:10.0} /s  ({their_got} delivered)");
    println!(
        "  ratio conclave / nats-server: {:.3}",
        our_rate / their_rate
    );
    let our_kv = conclave_kv(&server).await;
    let their_kv = nats_kv(&nats_url).await;
    println!("KV ops/s, sequential put + get of {KV_KEYS} keys");
    println!("  conclave (HTTP)          {our_kv:8.0} /s");
    println!("  nats-server (JetStream)  {their_kv:8.0} /s");
    println!("  ratio conclave / nats-server: {:.2}", our_kv / their_kv);
    drop(nats);
    drop(server);

    let sims = [sim("r1").await, sim("r2").await, sim("r3").await];
    let urls: Vec<String> = sims.iter().map(|(_, url)| url.clone()).collect();
    let pool_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let replicas: Vec<String> = urls
        .iter()
        .map(|u| format!("{{ url = \"{u}\" }}"))
        .collect();
    let config = pool_dir.path().join("bench.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway.pools.sim]\nreplicas = [{}]\n",
            replicas.join(", ")
        ),
    )
    .unwrap();
    let args = ["--config".to_string(), config.display().to_string()];
    let server = match ServerProcess::start_in(pool_dir, &[], &args).await {
        Ok(server) => server,
        Err(e) => {
            eprintln!("bus bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Warm both paths, then alternate, two rounds each.
    direct(&urls).await;
    rollout(&server).await;
    let mut straight = Vec::new();
    let mut through = Vec::new();
    for _ in 0..2 {
        straight.push(direct(&urls).await.as_secs_f64());
        through.push(rollout(&server).await.as_secs_f64());
    }
    let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "rollout of {ROLLOUT_PROMPTS} prompts over 3 sims ({SIM_LATENCY_MS} ms each), {ROLLOUT_CONCURRENCY} at a time"
    );
    println!("  sims' own time (direct)  {:?} s", straight);
    println!("  rollout through conclave {:?} s", through);
    println!(
        "  added: {:+.1} % (best of each; target <= 5 %)",
        (best(&through) / best(&straight) - 1.0) * 100.0
    );
    ExitCode::SUCCESS
}
