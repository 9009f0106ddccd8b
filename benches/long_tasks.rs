//! A 200-turn session against a model with a 16k window, through the
//! release server (`--sandbox local`): the tokens each request sends, with
//! compaction (the default) and without it (`options.compaction: "off"`,
//! against the same upstream with no window to enforce), and the wall
//! time a turn that compacts takes beyond one that does not.
//!
//! The upstream is `tests/common/windowed.rs`: it counts a request's
//! tokens (its JSON, four bytes a token), reports its window as vLLM
//! does, and answers at once; each turn runs a command printing 4 KB. A
//! compaction's own time here is the server's (building the transcript,
//! the summary call to an upstream that answers at once, storing the
//! mark); with a real model the summary's generation comes on top.
//!
//! Run: `cargo bench --bench long_tasks` (about a minute; as root, for the
//! local sandbox). `CONCLAVE_BENCH_TURNS` sets the turns (default 200).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/server.rs"]
mod server;
#[path = "../tests/common/windowed.rs"]
mod windowed;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use server::ServerProcess;

const WINDOW: u64 = 16_384;

/// What one run measured: per turn, the largest request the agent sent
/// (in the upstream's tokens), the turn's wall time and whether it
/// compacted.
struct Run {
    sent: Vec<u64>,
    took: Vec<Duration>,
    compacted: Vec<bool>,
}

async fn run(turns: usize, compaction: &str, window: u64) -> Run {
    let (url, seen) = windowed::upstream(window).await;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let config = format!("default_model = \"windowed\"\n[openai]\nbase_url = \"{url}/v1\"\n");
    let path = dir.path().join("conclave.toml");
    std::fs::write(&path, config).unwrap();
    let args = [
        "--config".to_owned(),
        path.display().to_string(),
        "--sandbox".to_owned(),
        "local".to_owned(),
    ];
    let server = ServerProcess::start_in(dir, &[], &args).await.unwrap();
    let base = format!("http://{}", server.addr);
    let http = reqwest::Client::new();
    let created: Value = http
        .post(format!("{base}/agent/session"))
        .json(&json!({"options": {"compaction": compaction}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no session: {created} {}", server.log_tail()))
        .to_owned();
    let mut measured = Run {
        sent: Vec::new(),
        took: Vec::new(),
        compacted: Vec::new(),
    };
    for step in 0..turns {
        let before = seen.requests.lock().unwrap().len();
        let started = Instant::now();
        let text = http
            .post(format!("{base}/agent/session/{id}/message"))
            .json(&json!({ "prompt": format!("step {step}") }))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        measured.took.push(started.elapsed());
        assert!(
            text.contains("\"status\":\"success\""),
            "turn {step}: {}",
            server.log_tail()
        );
        measured
            .compacted
            .push(text.contains("\"type\":\"compacted\""));
        let requests = seen.requests.lock().unwrap();
        let largest = requests[before..]
            .iter()
            .filter(|(body, _, _)| !windowed::is_summary(body))
            .map(|(_, tokens, _)| *tokens)
            .max()
            .unwrap_or(0);
        measured.sent.push(largest);
    }
    measured
}

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main]
async fn main() {
    let turns: usize = std::env::var("CONCLAVE_BENCH_TURNS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(200);
    let with = run(turns, "auto", WINDOW).await;
    let without = run(turns, "off", u64::MAX).await;
    println!("tokens sent per request (the upstream's count), window {WINDOW}:");
    println!("| turn | with compaction | without |");
    println!("| ---: | ---: | ---: |");
    for at in [1, turns / 4, turns / 2, 3 * turns / 4, turns] {
        let i = at.max(1) - 1;
        println!("| {at} | {} | {} |", with.sent[i], without.sent[i]);
    }
    let max_with = with.sent.iter().max().unwrap();
    let total = |sent: &[u64]| sent.iter().sum::<u64>();
    println!(
        "largest request: {max_with} with ({:.2} of the window), {} without",
        *max_with as f64 / WINDOW as f64,
        without.sent.iter().max().unwrap()
    );
    println!(
        "tokens sent over {turns} turns: {} with, {} without ({:.2}x)",
        total(&with.sent),
        total(&without.sent),
        total(&without.sent) as f64 / total(&with.sent) as f64
    );
    let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    let compacting: Vec<f64> = (0..turns)
        .filter(|i| with.compacted[*i])
        .map(|i| ms(&with.took[i]))
        .collect();
    let plain: Vec<f64> = (0..turns)
        .filter(|i| !with.compacted[*i])
        .map(|i| ms(&with.took[i]))
        .collect();
    let count = compacting.len();
    let (compacting, plain) = (median(compacting), median(plain));
    println!(
        "compactions: {count}; a turn p50 {plain:.1} ms, a turn that compacts p50 {compacting:.1} ms \
         (+{:.1} ms); without compaction a turn p50 {:.1} ms",
        compacting - plain,
        median(without.took.iter().map(ms).collect())
    );
}
