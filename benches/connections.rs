//! 20,000 idle connections against the release server: does `/health` still
//! answer, and does a keyed turn still run, while one client holds every
//! connection it can?
//!
//! The server runs as a child process (`conclave serve` on `127.0.0.1:0`,
//! an API key, every limit at its default). First a baseline: `/health`
//! and a keyed `/agent/run` turn (`demo` model, read to its `result`),
//! each on a new connection, from 127.0.0.1. Then an attacker at 127.0.0.2
//! (two child processes of the bench, 10,000 each, as one process may hold
//! no more descriptors than its hard limit) opens 20,000 connections, 500
//! at a time, each sending half a request line and nothing more
//! (slowloris), and the same probes run again from
//! 127.0.0.1 while they are held. Reported: how many connections the
//! server kept and how many it closed at once, the probes' p50/p99 with
//! and without the attack, the server's resident memory and descriptors,
//! and whether the held ones were cut off at the header deadline.
//!
//! Nothing is asserted about times; the bench fails only when a probe gets
//! no answer or a wrong one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/server.rs"]
mod server;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use server::ServerProcess;

const IDLE: usize = 20_000;
/// Child processes the idle connections are split over: one process may
/// hold no more descriptors than its hard limit (20,000 here).
const ATTACKERS: usize = 2;
const CONNECT_BATCH: usize = 500;
const PROBES: usize = 100;
const TURNS: usize = 20;
const KEY: &str = "bench-connections-key";

/// One request on a new connection from 127.0.0.1: its status and the time
/// to the end of the answer.
async fn probe(addr: SocketAddr, request: &str) -> Result<(u16, Duration), String> {
    let started = Instant::now();
    let mut stream = connect_from("127.0.0.1", addr).await?;
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
        .await
        .map_err(|_| "no answer within 30 s".to_string())?
        .map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&answer);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {:?}", &text[..text.len().min(200)]))?;
    Ok((status, started.elapsed()))
}

async fn connect_from(source: &str, addr: SocketAddr) -> Result<TcpStream, String> {
    let socket = TcpSocket::new_v4().map_err(|e| format!("socket: {e}"))?;
    socket
        .bind(
            format!("{source}:0")
                .parse()
                .map_err(|e| format!("{source}: {e}"))?,
        )
        .map_err(|e| format!("bind {source}: {e}"))?;
    socket
        .connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))
}

fn health_request() -> String {
    "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".to_string()
}

fn turn_request() -> String {
    let body = r#"{"prompt": "hello"}"#;
    format!(
        "POST /agent/run HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// p50 and p99 of `n` probes, in ms.
async fn measure(addr: SocketAddr, request: &str, n: usize) -> Result<(f64, f64), String> {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let (status, took) = probe(addr, request).await?;
        if status != 200 {
            return Err(format!("a probe got HTTP {status}"));
        }
        times.push(took.as_secs_f64() * 1000.0);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    Ok((at(0.5), at(0.99)))
}

/// Whether the server has closed `stream` (EOF or reset), without waiting.
fn closed(stream: &TcpStream) -> bool {
    let mut buf = [0u8; 1];
    match stream.try_read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

fn proc_field(pid: &str, name: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

fn open_files(pid: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Attacker mode (a child of the bench, so that its sockets count against
/// a descriptor limit of their own): opens `n` slow connections from
/// 127.0.0.2, prints `opened N failed F kept K`, then answers each line on
/// stdin with the number still open, until stdin closes.
async fn attack(addr: SocketAddr, n: usize) -> Result<(), String> {
    let mut held = Vec::with_capacity(n);
    let mut failed = 0usize;
    while held.len() + failed < n {
        let batch = CONNECT_BATCH.min(n - held.len() - failed);
        let connects = (0..batch).map(|_| async {
            let mut stream = connect_from("127.0.0.2", addr).await?;
            let _ = stream
                .write_all(b"GET /agent/sessions HTTP/1.1\r\nHo")
                .await;
            Ok::<_, String>(stream)
        });
        for result in futures::future::join_all(connects).await {
            match result {
                Ok(stream) => held.push(stream),
                Err(_) => failed += 1,
            }
        }
    }
    // Give the server a moment to close what it will not keep.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let open = |held: &[TcpStream]| held.iter().filter(|s| !closed(s)).count();
    println!("opened {} failed {failed} kept {}", held.len(), open(&held));
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(_)) = lines.next_line().await {
        println!("{}", open(&held));
    }
    Ok(())
}

/// One attacker child and its pipes.
struct Attacker {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Attacker {
    fn start(addr: SocketAddr, n: usize) -> Result<Attacker, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let mut child = tokio::process::Command::new(exe)
            .env("CONCLAVE_BENCH_ATTACK", format!("{addr} {n}"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start an attacker: {e}"))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        Ok(Attacker {
            child,
            stdin,
            lines: tokio::io::BufReader::new(stdout).lines(),
        })
    }

    async fn line(&mut self) -> Result<String, String> {
        self.lines
            .next_line()
            .await
            .map_err(|e| format!("attacker: {e}"))?
            .ok_or_else(|| "an attacker exited".to_string())
    }

    async fn still_open(&mut self) -> Result<usize, String> {
        self.stdin
            .write_all(b"count\n")
            .await
            .map_err(|e| format!("attacker: {e}"))?;
        self.line()
            .await?
            .trim()
            .parse()
            .map_err(|e| format!("attacker count: {e}"))
    }
}

async fn bench(server: &ServerProcess) -> Result<(), String> {
    let addr = server.addr;
    let pid = server.pid()?;
    let (health_p50, health_p99) = measure(addr, &health_request(), PROBES).await?;
    let (turn_p50, turn_p99) = measure(addr, &turn_request(), TURNS).await?;
    println!(
        "baseline: /health p50 {health_p50:.2} ms p99 {health_p99:.2} ms; keyed turn p50 {turn_p50:.2} ms p99 {turn_p99:.2} ms"
    );

    let opening = Instant::now();
    let mut attackers = (0..ATTACKERS)
        .map(|_| Attacker::start(addr, IDLE / ATTACKERS))
        .collect::<Result<Vec<_>, _>>()?;
    let (mut opened, mut failed, mut kept) = (0usize, 0usize, 0usize);
    for attacker in &mut attackers {
        let line = attacker.line().await?;
        let numbers: Vec<usize> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        let [o, f, k] = numbers[..] else {
            return Err(format!("attacker said {line:?}"));
        };
        (opened, failed, kept) = (opened + o, failed + f, kept + k);
    }
    let opened_in = opening.elapsed();
    let server_files = open_files(&pid);
    let rss_mb = proc_field(&pid, "VmRSS:").unwrap_or(0) as f64 / 1024.0;
    println!(
        "attacker: {opened} connections opened in {:.1} s ({failed} failed to connect); the server kept {kept}, closed {} at once; server descriptors {server_files}, RSS {rss_mb:.1} MB",
        opened_in.as_secs_f64(),
        opened - kept
    );
    let measuring = Instant::now();
    let (health_p50_held, health_p99_held) = measure(addr, &health_request(), PROBES).await?;
    let (turn_p50_held, turn_p99_held) = measure(addr, &turn_request(), TURNS).await?;
    println!(
        "held ({:.1} s of probes): /health p50 {health_p50_held:.2} ms p99 {health_p99_held:.2} ms; keyed turn p50 {turn_p50_held:.2} ms p99 {turn_p99_held:.2} ms",
        measuring.elapsed().as_secs_f64()
    );
    println!(
        "ratio held/baseline: /health p50 {:.2}x p99 {:.2}x; turn p50 {:.2}x p99 {:.2}x",
        health_p50_held / health_p50,
        health_p99_held / health_p99,
        turn_p50_held / turn_p50,
        turn_p99_held / turn_p99
    );
    // The header deadline (10 s) cuts the held ones off.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut still_open = kept;
    while Instant::now() < deadline {
        still_open = 0;
        for attacker in &mut attackers {
            still_open += attacker.still_open().await?;
        }
        if still_open == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "after the header deadline: {still_open} held connections still open, {:.1} s after the last was opened",
        opening.elapsed().as_secs_f64() - opened_in.as_secs_f64()
    );
    for mut attacker in attackers {
        drop(attacker.stdin);
        let _ = attacker.child.wait().await;
    }
    if still_open > 0 {
        return Err(format!(
            "{still_open} slow connections outlived the header deadline"
        ));
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    if let Ok(spec) = std::env::var("CONCLAVE_BENCH_ATTACK") {
        let parsed = spec
            .split_once(' ')
            .and_then(|(addr, n)| Some((addr.parse().ok()?, n.parse().ok()?)));
        let Some((addr, n)) = parsed else {
            eprintln!("connections: bad CONCLAVE_BENCH_ATTACK {spec:?}");
            return ExitCode::FAILURE;
        };
        let _ = rlimit::increase_nofile_limit(n as u64 + 1_000);
        return match attack(addr, n).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("connections attacker: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let server = match ServerProcess::start(&[("CONCLAVE_API_KEYS", KEY.to_string())]).await {
        Ok(server) => server,
        Err(e) => {
            eprintln!("connections: {e}");
            return ExitCode::FAILURE;
        }
    };
    match bench(&server).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "connections: {e}\nlast lines of the server log:\n{}",
                server.log_tail()
            );
            ExitCode::FAILURE
        }
    }
}
