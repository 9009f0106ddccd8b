//! Deliberations: the wall time of `POST /deliberations` with N
//! agents on one `conclave sim` replica whose time to first token is
//! 200 ms (`--latency-ms 0 --ttft-ms 200`; the agents call the model
//! streamed, through a gateway pool named `sim`), from sending the POST to
//! receiving its `deliberation.completed` on a bus subscription
//! (`GET /bus/subscribe?subjects=deliberation.completed`, opened before the
//! POST). Every agent must answer (`successful_responses == N`), or the
//! bench fails.
//!
//! For N = 32 and N = 256, one warm-up then five runs each, alternating
//! with the same N streamed chat completions sent straight to the sim at
//! once from the bench (the sim's own time: the model itself, the
//! strongest peer). Also shown: the time if the agents ran one after
//! another, N × 200 ms.
//! After each run, the deliberation session's events (`ts`) show where the
//! time went.
//!
//! Target (reported, not asserted): N = 32 within 1.3 × 200 ms + 50 ms
//! = 310 ms. Run: `cargo bench --bench deliberation`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/lines.rs"]
mod lines;
#[path = "common/server.rs"]
mod server;

use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use lines::Lines;
use server::ServerProcess;

const TTFT_MS: u64 = 200;
const SIZES: [u32; 2] = [32, 256];
const WARMUPS: usize = 1;
const RUNS: usize = 5;
const POOL: &str = "sim";
const TASK: &str = "Propose a name for a streaming agent server, in one line.";
/// The target for N = 32: 1.3 × TTFT + 50 ms.
const TARGET_MS: f64 = 1.3 * TTFT_MS as f64 + 50.0;

/// A `conclave sim` replica answering after 200 ms; its base URL.
async fn sim() -> Result<(Child, String), String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_conclave"))
        .args([
            "sim",
            "--listen",
            "127.0.0.1:0",
            "--id",
            "s1",
            "--latency-ms",
            "0",
            "--ttft-ms",
            &TTFT_MS.to_string(),
        ])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start conclave sim: {e}"))?;
    let line = BufReader::new(child.stdout.take().ok_or("the sim has no stdout")?)
        .lines()
        .next_line()
        .await
        .map_err(|e| e.to_string())?
        .ok_or("the sim exited")?;
    let base = line
        .strip_prefix("conclave sim listening on ")
        .ok_or_else(|| format!("unexpected sim output {line:?}"))?
        .trim()
        .to_string();
    Ok((child, base))
}

/// Where one deliberation's time went, in ms after the POST was sent.
#[derive(Default)]
struct Breakdown {
    accepted: f64,
    started: Option<f64>,
    first_agent_started: Option<f64>,
    last_agent_started: Option<f64>,
    first_agent_completed: Option<f64>,
    last_agent_completed: Option<f64>,
    completed_event: Option<f64>,
}

fn show(ms: Option<f64>) -> String {
    ms.map_or_else(|| "—".into(), |ms| format!("{ms:.1}"))
}

impl Breakdown {
    fn print(&self, wall: f64) {
        println!(
            "    202 {:.1} | deliberation_started {} | agent_started first {} last {} | \
             agent_completed first {} last {} | deliberation_completed {} | on the bus {wall:.1} (ms after the POST)",
            self.accepted,
            show(self.started),
            show(self.first_agent_started),
            show(self.last_agent_started),
            show(self.first_agent_completed),
            show(self.last_agent_completed),
            show(self.completed_event),
        );
    }
}

/// The session's events, timed against the POST's send time.
async fn breakdown(
    client: &reqwest::Client,
    base: &str,
    session: &str,
    sent: DateTime<Utc>,
    accepted: f64,
) -> Result<Breakdown, String> {
    // The bus message can come before the last events are stored (a
    // replay reads the store): read again until the turn's `result`.
    let mut text = String::new();
    for _ in 0..100 {
        text = client
            .get(format!("{base}/agent/session/{session}/events?since=0"))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .text()
            .await
            .map_err(|e| e.to_string())?;
        if text.contains("\"type\":\"result\"") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut out = Breakdown {
        accepted,
        ..Breakdown::default()
    };
    let after = |event: &Value| -> Option<f64> {
        let ts: DateTime<Utc> = event["ts"].as_str()?.parse().ok()?;
        Some((ts - sent).num_microseconds()? as f64 / 1000.0)
    };
    let first = |slot: &mut Option<f64>, at: Option<f64>| {
        if slot.is_none() {
            *slot = at;
        }
    };
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let event: Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
        let at = after(&event);
        match event["type"].as_str().unwrap_or_default() {
            "deliberation_started" => first(&mut out.started, at),
            "agent_started" => {
                first(&mut out.first_agent_started, at);
                out.last_agent_started = at;
            }
            "agent_completed" => {
                first(&mut out.first_agent_completed, at);
                out.last_agent_completed = at;
            }
            "deliberation_completed" => first(&mut out.completed_event, at),
            _ => {}
        }
    }
    Ok(out)
}

/// One deliberation of `agents` agents: ms from sending the POST to its
/// `deliberation.completed` on the bus, and where the time went.
async fn deliberation(
    client: &reqwest::Client,
    base: &str,
    agents: u32,
) -> Result<(f64, Breakdown), String> {
    let subscription = client
        .get(format!(
            "{base}/bus/subscribe?subjects=deliberation.completed"
        ))
        .send()
        .await
        .map_err(|e| format!("subscribing: {e}"))?;
    if !subscription.status().is_success() {
        return Err(format!("subscribing: {}", subscription.status()));
    }
    let mut bus = Lines::new(subscription);
    let body = json!({"task_description": TASK, "num_agents": agents, "models": [POOL]});
    let sent_at = Utc::now();
    let sent = Instant::now();
    let response = client
        .post(format!("{base}/deliberations"))
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("POST /deliberations: {e}"))?;
    let accepted = sent.elapsed().as_secs_f64() * 1000.0;
    let status = response.status();
    let answer: Value = response.json().await.map_err(|e| e.to_string())?;
    if status != 202 {
        return Err(format!("POST /deliberations answered {status}: {answer}"));
    }
    let task_id = answer["task_id"].as_str().ok_or("no task_id")?.to_string();
    let session = answer["session_id"]
        .as_str()
        .ok_or("no session_id")?
        .to_string();
    let done = loop {
        let line = tokio::time::timeout(Duration::from_secs(120), bus.next())
            .await
            .map_err(|_| format!("no deliberation.completed for {task_id} within 120 s"))??;
        if line["type"] == "message" && line["data"]["task_id"] == task_id.as_str() {
            break line["data"].clone();
        }
    };
    let wall = sent.elapsed().as_secs_f64() * 1000.0;
    if done["successful_responses"] != agents {
        return Err(format!(
            "{agents} agents, {} successful responses (status {}, reason {}); first result: {}",
            done["successful_responses"], done["status"], done["reason"], done["results"][0]
        ));
    }
    let parts = breakdown(client, base, &session, sent_at, accepted).await?;
    Ok((wall, parts))
}

/// The same `agents` streamed chat completions straight to the sim, all at
/// once: ms until the last body is read.
async fn direct(client: &reqwest::Client, sim: &str, agents: u32) -> Result<f64, String> {
    let url = format!("{sim}/v1/chat/completions");
    let started = Instant::now();
    let calls = (0..agents).map(|i| {
        let request = client.post(&url).json(&json!({
            "model": POOL, "stream": true, "max_tokens": 4096,
            "temperature": if i == 0 { 0.7 } else { 0.9 },
            "messages": [{"role": "system", "content": "You are an agent."},
                         {"role": "user", "content": TASK}],
        }));
        async move {
            let response = request.send().await.map_err(|e| e.to_string())?;
            if !response.status().is_success() {
                return Err(format!("the sim answered {}", response.status()));
            }
            let body = response.bytes().await.map_err(|e| e.to_string())?;
            if !body.ends_with(b"data: [DONE]\n\n") {
                return Err("the stream did not end with [DONE]".into());
            }
            Ok::<(), String>(())
        }
    });
    for result in futures::future::join_all(calls).await {
        result?;
    }
    Ok(started.elapsed().as_secs_f64() * 1000.0)
}

/// min, median, max.
fn spread(samples: &[f64]) -> (f64, f64, f64) {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    (
        sorted[0],
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1],
    )
}

struct Figures {
    agents: u32,
    through: Vec<f64>,
    straight: Vec<f64>,
}

async fn run() -> Result<(), String> {
    let (_sim, sim_base) = sim().await?;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).map_err(|e| e.to_string())?;
    let config = dir.path().join("bench.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway.pools.{POOL}]\nnum_retries = 0\nreplicas = [{{ id = \"s1\", url = \"{sim_base}/v1\" }}]\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    let args = ["--config".to_string(), config.display().to_string()];
    let server = ServerProcess::start_in(dir, &[], &args).await?;
    let base = format!("http://{}", server.addr);
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .build()
        .map_err(|e| e.to_string())?;
    println!(
        "deliberation: 2 cores, load average {}; sim ttft {TTFT_MS} ms, latency 0 ms",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let mut figures = Vec::new();
    for agents in SIZES {
        println!("N = {agents}");
        for _ in 0..WARMUPS {
            direct(&client, &sim_base, agents).await?;
            deliberation(&client, &base, agents)
                .await
                .map_err(|e| format!("{e}\nserver log:\n{}", server.log_tail()))?;
        }
        let mut through = Vec::new();
        let mut straight = Vec::new();
        for run in 1..=RUNS {
            let own = direct(&client, &sim_base, agents).await?;
            let (wall, parts) = deliberation(&client, &base, agents)
                .await
                .map_err(|e| format!("{e}\nserver log:\n{}", server.log_tail()))?;
            println!("  run {run}: conclave {wall:.1} ms, direct to the sim {own:.1} ms");
            parts.print(wall);
            through.push(wall);
            straight.push(own);
        }
        figures.push(Figures {
            agents,
            through,
            straight,
        });
    }

    println!();
    println!(
        "| N | sequential reading (N × {TTFT_MS} ms) | direct to the sim, min / median / max | \
         conclave, min / median / max | conclave / direct (median) | target ≤ {TARGET_MS:.0} ms (median) |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for f in &figures {
        let (dmin, dmed, dmax) = spread(&f.straight);
        let (cmin, cmed, cmax) = spread(&f.through);
        let verdict = match (f.agents, cmed <= TARGET_MS) {
            (32, true) => "met",
            (32, false) => "MISSED",
            (_, true) => "n/a (within it)",
            (_, false) => "n/a (over it)",
        };
        println!(
            "| {} | {:.0} ms | {dmin:.1} / {dmed:.1} / {dmax:.1} ms | {cmin:.1} / {cmed:.1} / {cmax:.1} ms | {:.2}× | {verdict} |",
            f.agents,
            f64::from(f.agents) * TTFT_MS as f64,
            cmed / dmed,
        );
    }
    Ok(())
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
            eprintln!("deliberation bench: {e}");
            ExitCode::FAILURE
        }
    }
}
