//! Memory of 10,000 idle WebSocket sessions.
//!
//! The release server runs as a child process (`conclave serve` on
//! `127.0.0.1:0`, store in a fresh directory under the target dir). The
//! bench creates 10,000 sessions, opens a WebSocket to each, proves a
//! sample of them live with one turn each, leaves them all idle and reads
//! the server's resident memory from `/proc/PID/status` once it settles:
//! before any session, with the sessions only, and with every socket open.
//!
//! The target (≤ 300 MB resident with every socket open) is reported
//! against, not asserted: the bench fails only when a step fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/server.rs"]
mod server;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use server::ServerProcess;

const SESSIONS: usize = 10_000;
/// Requests and handshakes in flight at once; connects stay below the
/// server's accept backlog (128, tokio's default), which a larger burst
/// overflows into one-second SYN retransmits.
const CREATE_CONCURRENCY: usize = 100;
const CONNECT_CONCURRENCY: usize = 100;
/// Every `SAMPLE_EVERY`-th socket runs a turn to prove it is live.
const SAMPLE_EVERY: usize = 100;
/// Descriptors beyond the sockets: the runtime, the HTTP client's pool.
const SPARE_FILES: u64 = 1_000;
const TARGET_BYTES: u64 = 300_000_000;

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

impl ServerProcess {
    /// `VmRSS` and `VmHWM` in bytes.
    fn memory(&self) -> Result<(u64, u64), String> {
        let pid = self.pid()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map_err(|e| format!("cannot read the server's /proc status: {e}"))?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.trim().strip_suffix("kB"))
                .and_then(|kib| kib.trim().parse::<u64>().ok())
                .map(|kib| kib * 1024)
                .ok_or_else(|| format!("no {name} in /proc/{pid}/status"))
        };
        Ok((field("VmRSS:")?, field("VmHWM:")?))
    }

    /// Waits until RSS has moved less than 0.5% over the last two seconds
    /// (at most 30 s), then returns `VmRSS` and `VmHWM`.
    async fn settled_memory(&self) -> Result<(u64, u64), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut recent = Vec::new();
        loop {
            let (rss, hwm) = self.memory()?;
            recent.push(rss);
            if recent.len() > 8 {
                recent.remove(0);
                let (low, high) = (recent.iter().min(), recent.iter().max());
                if let (Some(&low), Some(&high)) = (low, high)
                    && (high - low) * 200 < high
                {
                    return Ok((rss, hwm));
                }
            }
            if Instant::now() > deadline {
                println!("  (RSS still moving after 30 s; reading it as it is)");
                return Ok((rss, hwm));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

async fn create_session(http: &reqwest::Client, url: &str) -> Result<String, String> {
    let response = http
        .post(url)
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .map_err(|e| format!("POST /agent/session: {e}"))?;
    if response.status() != reqwest::StatusCode::CREATED {
        return Err(format!("POST /agent/session: status {}", response.status()));
    }
    let body: Value = response
        .json()
        .await
        .map_err(|e| format!("POST /agent/session body: {e}"))?;
    body["session_id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("POST /agent/session: no session_id in {body}"))
}

/// Sends one message and reads the socket up to the turn's `result`.
async fn prove_live(socket: &mut Socket) -> Result<(), String> {
    socket
        .send(Message::text(r#"{"type":"message","prompt":"hi"}"#))
        .await
        .map_err(|e| format!("sending a message: {e}"))?;
    let read = async {
        while let Some(frame) = socket.next().await {
            let frame = frame.map_err(|e| format!("reading the socket: {e}"))?;
            let Message::Text(text) = frame else { continue };
            let event: Value = serde_json::from_str(text.as_str())
                .map_err(|e| format!("a frame that is not JSON ({e}): {text}"))?;
            match event["type"].as_str() {
                Some("result") if event["status"] == "success" => return Ok(()),
                Some("result" | "error") => return Err(format!("turn failed: {event}")),
                _ => {}
            }
        }
        Err("the socket closed before a result".to_string())
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .map_err(|_| "no result within 30 s".to_string())?
}

/// The server's `websocket_connections` gauge.
async fn open_sockets(http: &reqwest::Client, base: &str) -> Result<u64, String> {
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| format!("GET /metrics: {e}"))?
        .text()
        .await
        .map_err(|e| format!("GET /metrics body: {e}"))?;
    metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            name.ends_with("websocket_connections")
                .then(|| value.parse().ok())?
        })
        .ok_or_else(|| "no websocket_connections gauge in /metrics".into())
}

async fn bench(server: &ServerProcess) -> Result<(), String> {
    let base = format!("http://{}", server.addr);
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| format!("cannot build a client: {e}"))?;
    println!(
        "ws_memory: server pid {} on {}, {SESSIONS} sessions",
        server.pid()?,
        server.addr
    );
    http.get(format!("{base}/health"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| format!("GET /health: {e}"))?;
    let (baseline, _) = server.settled_memory().await?;
    println!("  baseline                 VmRSS {}", mb(baseline));

    let started = Instant::now();
    let session_url = format!("{base}/agent/session");
    let ids: Vec<String> = futures::stream::iter(0..SESSIONS)
        .map(|_| create_session(&http, &session_url))
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    println!(
        "  created {SESSIONS} sessions in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let (with_sessions, _) = server.settled_memory().await?;
    println!("  sessions, no sockets     VmRSS {}", mb(with_sessions));

    let started = Instant::now();
    let ws_base = format!("ws://{}/agent/ws?session_id=", server.addr);
    let mut sockets: Vec<Socket> = futures::stream::iter(ids)
        .map(|id| {
            let url = format!("{ws_base}{id}");
            async move {
                tokio_tungstenite::connect_async(url)
                    .await
                    .map(|(socket, _)| socket)
                    .map_err(|e| format!("opening a WebSocket: {e}"))
            }
        })
        .buffer_unordered(CONNECT_CONCURRENCY)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    println!(
        "  opened {} WebSockets in {:.1} s",
        sockets.len(),
        started.elapsed().as_secs_f64()
    );

    let sample: Vec<&mut Socket> = sockets.iter_mut().step_by(SAMPLE_EVERY).collect();
    let proved = sample.len();
    futures::future::try_join_all(sample.into_iter().map(prove_live)).await?;
    let open = open_sockets(&http, &base).await?;
    if open != SESSIONS as u64 {
        return Err(format!(
            "the server counts {open} open WebSockets, not {SESSIONS}"
        ));
    }
    println!("  {proved} sampled sockets ran a turn; the server counts {open} open");

    let (rss, hwm) = server.settled_memory().await?;
    let per_connection = rss.saturating_sub(baseline) / SESSIONS as u64;
    println!(
        "  sessions + idle sockets  VmRSS {}  VmHWM {}",
        mb(rss),
        mb(hwm)
    );
    println!(
        "  per session              {} B (session {} B + socket {} B)",
        per_connection,
        with_sessions.saturating_sub(baseline) / SESSIONS as u64,
        rss.saturating_sub(with_sessions) / SESSIONS as u64,
    );
    println!(
        "  target                   VmRSS ≤ {} {}",
        mb(TARGET_BYTES),
        if rss <= TARGET_BYTES { "met" } else { "MISSED" }
    );
    drop(sockets);
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    // Every socket is a descriptor here too: lift the soft limit as far as
    // the hard one allows and check it is enough.
    let needed = SESSIONS as u64 + SPARE_FILES;
    match rlimit::increase_nofile_limit(needed) {
        Ok(limit) if limit >= needed => {}
        Ok(limit) => {
            eprintln!(
                "ws_memory: the open-file limit is {limit}, {needed} needed; raise the hard limit (ulimit -Hn)"
            );
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("ws_memory: cannot raise the open-file limit: {e}");
            return ExitCode::FAILURE;
        }
    }
    // Every socket comes from this one address: lift the per-client
    // connection cap (half the server's cap by default) out of the way.
    let server = match ServerProcess::start(&[(
        "CONCLAVE_HTTP__MAX_CONNECTIONS_PER_CLIENT",
        (SESSIONS + 1_000).to_string(),
    )])
    .await
    {
        Ok(server) => server,
        Err(e) => {
            eprintln!("ws_memory: {e}");
            return ExitCode::FAILURE;
        }
    };
    match bench(&server).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "ws_memory: {e}\nlast lines of the server log:\n{}",
                server.log_tail()
            );
            ExitCode::FAILURE
        }
    }
}
