//! Security, second round: each test is an attack that once worked, run
//! against the real binary (or the in-process server where only the
//! server's own parts are in play), and what stops it now.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::binary::{peak_rss_mib, serve_command, spawn_server};
use common::sim::Sim;
use common::{TestServer, ndjson};
use serde_json::{Value, json};

/// What a sandbox tries against a terminal, as Python run with
/// `python3 -c`: open `/dev/tty`, and type `marker` into it and into every
/// open descriptor with TIOCSTI. Prints what each attempt got.
fn terminal_attack(marker: &str) -> String {
    let script = format!(
        r#"import os, fcntl, termios, errno
said = []
def sti(fd, name):
    try:
        for c in "echo {marker}\n":
            fcntl.ioctl(fd, termios.TIOCSTI, c.encode())
        said.append(name + ":typed")
    except OSError as e:
        said.append(name + ":" + errno.errorcode[e.errno])
try:
    tty = os.open("/dev/tty", os.O_RDWR)
    said.append("tty:opened")
    sti(tty, "sti-tty")
except OSError as e:
    said.append("tty:" + errno.errorcode[e.errno])
for fd in range(3):
    if os.isatty(fd):
        said.append("isatty:%d" % fd)
    sti(fd, "sti-%d" % fd)
print(" ".join(said))
"#
    );
    format!(
        "python3 -c \"exec(bytes.fromhex('{}').decode())\"",
        hex(&script)
    )
}

fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

/// A pseudo-terminal: the master the test reads, the slave the server gets.
fn pty() -> (OwnedFd, OwnedFd) {
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two descriptors; the null pointers ask for no
    // name, termios or window size.
    let status = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(status, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both were just opened and are owned here alone.
    unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) }
}

/// `$ command` in a one-shot agent run; the tool result's stdout.
async fn shell(http: &reqwest::Client, url: &str, command: &str) -> String {
    let response = http
        .post(format!("{url}/agent/run"))
        .json(&json!({"prompt": format!("$ {command}")}))
        .send()
        .await
        .unwrap();
    let events = ndjson(response).await;
    let result = events
        .iter()
        .find(|e| e["type"] == "tool_result")
        .unwrap_or_else(|| panic!("no tool result: {events:?}"));
    result["output"]["stdout"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

// 1. A local sandbox and the server's terminal.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_sandbox_cannot_type_into_the_terminal_the_server_started_from() {
    let (master, slave) = pty();
    let dir = tempfile::tempdir().unwrap();
    let mut command = serve_command(&["--sandbox", "local"]);
    command
        .current_dir(dir.path())
        .stdin(Stdio::from(slave.try_clone().unwrap()));
    // SAFETY: setsid and ioctl are async-signal-safe; the pty's slave is
    // the child's stdin by now, and becomes its controlling terminal, as a
    // shell gives one to `conclave serve` typed into it.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (mut child, url) = spawn_server(&mut command).await;
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id().unwrap())).unwrap();
    let tty_nr: i64 = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .nth(4)
        .unwrap()
        .parse()
        .unwrap();
    assert_ne!(tty_nr, 0, "the server has the test's terminal: {stat}");

    // Everything the terminal shows (typed input is echoed back).
    let seen = Arc::new(Mutex::new(Vec::new()));
    let reader = {
        let seen = seen.clone();
        let mut master = std::fs::File::from(master.try_clone().unwrap());
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n) = master.read(&mut buffer) {
                if n == 0 {
                    break;
                }
                seen.lock().unwrap().extend_from_slice(&buffer[..n]);
                if String::from_utf8_lossy(&seen.lock().unwrap()).contains("END-OF-TEST") {
                    break;
                }
            }
        })
    };

    let http = reqwest::Client::new();
    let said = shell(&http, &url, &terminal_attack("PWNED-BY-SANDBOX")).await;
    assert!(said.contains("tty:ENXIO"), "{said}");
    assert!(
        !said.contains("typed") && !said.contains("isatty"),
        "{said}"
    );
    // Refused by the filter, not only for want of a terminal.
    assert!(said.contains("sti-0:EPERM"), "{said}");

    // Whatever reached the terminal has been read once this has.
    let end = b"END-OF-TEST\n";
    // SAFETY: write(2) reads `end`, which outlives the call.
    let wrote = unsafe { libc::write(slave.as_raw_fd(), end.as_ptr().cast(), end.len()) };
    assert_eq!(wrote, end.len() as isize);
    reader.join().unwrap();
    let shown = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    assert!(
        !shown.contains("PWNED-BY-SANDBOX"),
        "typed into the terminal: {shown}"
    );
    child.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_sandbox_has_no_terminal_either() {
    use conclave::config::SandboxBackendKind;
    let server =
        TestServer::start_sandboxed(|c| c.sandbox.backend = SandboxBackendKind::Docker).await;
    let response = server
        .post(
            "/agent/run",
            json!({"prompt": format!("$ {}", terminal_attack("PWNED"))}),
        )
        .await;
    let events = ndjson(response).await;
    let result = events.iter().find(|e| e["type"] == "tool_result").unwrap();
    let said = result["output"]["stdout"].as_str().unwrap_or_default();
    assert!(said.contains("tty:ENXIO"), "{result}");
    assert!(
        !said.contains("typed") && !said.contains("isatty"),
        "{said}"
    );
    server.stop_and_remove_sandboxes().await;
}

// 2. Deep YAML.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_yaml_is_refused_at_once_while_health_answers() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = serve_command(&[]);
    command.current_dir(dir.path());
    let (mut child, url) = spawn_server(&mut command).await;
    let http = reqwest::Client::new();
    let deep = format!("a: {}", "[".repeat(200_000));
    let validate = |yaml: String| {
        let http = http.clone();
        let url = url.clone();
        tokio::spawn(async move {
            let response = http
                .post(format!("{url}/orchestrator/pipelines/validate"))
                .json(&json!({"yaml": yaml}))
                .send()
                .await
                .unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap(),
            )
        })
    };
    let attacks = [validate(deep.clone()), validate(deep)];
    let mut health = Vec::new();
    while health.len() < 20 || attacks.iter().any(|a| !a.is_finished()) {
        let started = Instant::now();
        let response = http.get(format!("{url}/health")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        health.push(started.elapsed());
    }
    for attack in attacks {
        let (status, body) = attack.await.unwrap();
        assert_eq!(status, 422, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("nests deeper than 64"), "{message}");
    }
    health.sort();
    let p90 = health[health.len() * 9 / 10];
    assert!(
        p90 <= Duration::from_millis(100),
        "/health p90 {p90:?}: {health:?}"
    );

    // Too large is refused too, naming the limit; a good one still passes.
    let large = format!("name: x\n#{}\n", "x".repeat(300 * 1024));
    let (status, body) = validate(large).await.unwrap();
    assert_eq!(status, 422);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the limit is 262144"),
        "{body}"
    );
    child.kill().await.unwrap();
}

// 3. A deliberation's memory.

/// The most resident memory the largest accepted deliberation may take the
/// server to (README, "Security").
const DELIBERATION_RSS_MIB: u64 = 512;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_accepted_deliberation_keeps_the_servers_memory_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = serve_command(&[]);
    command.current_dir(dir.path());
    let (mut child, url) = spawn_server(&mut command).await;
    let http = reqwest::Client::new();
    // Short enough that a critique's prompt (its task, its own proposal
    // and 8 others), which the demo model echoes, fits in the 16 KiB a
    // deliberation keeps of an answer.
    let task = "Design a rate limiter. ".repeat(40);

    // The attack: 1024 agents, 5 rounds.
    let refused = http
        .post(format!("{url}/deliberations"))
        .json(&json!({"task_description": task, "num_agents": 1024, "rounds": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 422);
    let body: Value = refused.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("num_agents: ") && message.contains("at most 2048"),
        "{message}"
    );
    let huge_task = "x".repeat(200 * 1024);
    let refused = http
        .post(format!("{url}/deliberations"))
        .json(&json!({"task_description": huge_task, "num_agents": 1024, "rounds": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 422);
    let body: Value = refused.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("task_description: "),
        "{body}"
    );

    // The largest accepted: 1024 agents, a critique round. The demo model
    // echoes its prompt, so every critique answer is as long as what the
    // agent was shown.
    let before = peak_rss_mib(child.id().unwrap());
    let mut bus = common::Lines::new(
        http.get(format!(
            "{url}/bus/subscribe?subjects=deliberation.completed"
        ))
        .send()
        .await
        .unwrap(),
    );
    let submitted = http
        .post(format!("{url}/deliberations"))
        .json(&json!({"task_description": task, "num_agents": 1024, "rounds": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(submitted.status(), 202);
    let submitted: Value = submitted.json().await.unwrap();
    let done = tokio::time::timeout(Duration::from_secs(600), bus.next())
        .await
        .expect("the deliberation ends")
        .expect("the bus goes on");
    assert_eq!(done["data"]["task_id"], submitted["task_id"]);
    assert_eq!(done["data"]["status"], "COMPLETED", "{done}");
    assert_eq!(done["data"]["successful_responses"], 1024, "{done}");
    let peak = peak_rss_mib(child.id().unwrap());
    eprintln!("peak RSS: {before} MiB before, {peak} MiB after 1024 agents x 2 rounds");
    assert!(
        peak <= DELIBERATION_RSS_MIB,
        "the server peaked at {peak} MiB (from {before} MiB)"
    );
    // A critique shows at most 8 other proposals.
    let result: Value = http
        .get(format!(
            "{url}/deliberations/{}",
            submitted["task_id"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let revised = result["results"][0]["proposal"]["content"]
        .as_str()
        .unwrap();
    assert!(
        revised.contains("Proposal H:") && !revised.contains("Proposal I:"),
        "{}",
        &revised[..revised.len().min(400)]
    );
    child.kill().await.unwrap();
}

// 7. Deep JSON through the gateway, then the traces.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_json_through_the_gateway_leaves_the_traces_readable() {
    let sim = Sim::start("s", &[]).await;
    let server = TestServer::start_with(|c| {
        common::sim::pools(c, &[("m", &sim)]);
        c.gateway.allowed_upstreams = Some(vec!["127.0.0.0/8".into()]);
    })
    .await;
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let body = format!(
        r#"{{"model": "m", "messages": [{{"role": "user", "content": "hi", "extra": {deep}}}]}}"#
    );
    let response = server
        .http
        .post(server.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let _ = response.bytes().await;
    let plain = server
        .post(
            "/v1/chat/completions",
            json!({"model": "m", "messages": [{"role": "user", "content": "after"}]}),
        )
        .await;
    assert_eq!(plain.status(), 200);
    let _ = plain.bytes().await;
    for path in ["/gateway/traces", "/gateway/traces?all=true"] {
        let response = server.get(path).await;
        assert_eq!(
            response.status(),
            200,
            "{path} after a call answered {status}"
        );
        let text = response.text().await.unwrap();
        assert!(
            text.starts_with(r#"{"traces":["#),
            "{}",
            &text[..text.len().min(200)]
        );
        assert!(text.contains("after"), "the plain call's trace is there");
        if status == 200 {
            assert!(text.contains(&deep), "the deep request is kept as it came");
        }
    }
    server.stop().await;
}

// 8. A deleted pool and the idle server's CPU.

/// CPU seconds the process has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    // utime and stime, fields 14 and 15 of the line (11 and 12 here).
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf takes a plain integer.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_server_stays_idle_after_a_pool_is_deleted() {
    let sim = Sim::start("s", &[]).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("conclave.toml"),
        "[gateway]\nallowed_upstreams = [\"127.0.0.1\"]\n",
    )
    .unwrap();
    let mut command = serve_command(&["--config", "conclave.toml"]);
    command.current_dir(dir.path());
    let (mut child, url) = spawn_server(&mut command).await;
    let http = reqwest::Client::new();
    let added = http
        .post(format!("{url}/gateway/replicas"))
        .json(&json!({"model": "m", "url": sim.url, "id": "r"}))
        .send()
        .await
        .unwrap();
    assert!(added.status().is_success(), "{:?}", added.text().await);
    let removed = http
        .delete(format!("{url}/gateway/pools/m"))
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 200);
    let pid = child.id().unwrap();
    // The health loop sees the change within a second; then two idle
    // seconds are measured (a loop that spins uses all of them).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = cpu_seconds(pid);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let used = cpu_seconds(pid) - before;
    assert!(
        used < 0.5,
        "the idle server used {used:.2} CPU seconds in 2 s"
    );
    child.kill().await.unwrap();
}

// 11. A stdio MCP server's command line and environment.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_mcp_server_gets_only_its_command_line_and_a_clean_environment() {
    let python = std::env::var("CONCLAVE_TEST_PYTHON")
        .expect("CONCLAVE_TEST_PYTHON must name a python with the mcp package");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/env_server.py");
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("env.json");
    let report = report.to_str().unwrap();
    let line = format!("{python} {script} {report}");
    std::fs::write(
        dir.path().join("conclave.toml"),
        format!("[mcp]\nstdio_commands = [{}]\n", json!(line)),
    )
    .unwrap();
    let mut command = serve_command(&["--config", "conclave.toml"]);
    command
        .current_dir(dir.path())
        .env("ANTHROPIC_API_KEY", "sk-ant-secret-of-the-server")
        .env("PATH", std::env::var("PATH").unwrap());
    let (mut child, url) = spawn_server(&mut command).await;
    let http = reqwest::Client::new();
    let run = |server: Value| {
        http.post(format!("{url}/agent/run"))
            .json(&json!({"prompt": "hello", "sandbox_enabled": false, "mcp_servers": {"envy": server}}))
            .send()
    };

    // Other arguments than the pinned ones, or a variable the operator
    // did not allow, are refused before anything starts.
    for (server, field) in [
        (
            json!({"command": python, "args": ["-c", "import os; os.system('id')"]}),
            "command",
        ),
        (
            json!({"command": python, "args": [script, report], "env": {"NODE_OPTIONS": "--require /tmp/x.js"}}),
            "env",
        ),
    ] {
        let response = run(server).await.unwrap();
        assert_eq!(response.status(), 422);
        let body: Value = response.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("mcp_servers.envy.{field}: ")),
            "{message}"
        );
    }
    assert!(!std::path::Path::new(report).exists());

    // The pinned command line starts, without the server's secrets or its
    // terminal.
    let events = ndjson(
        run(json!({"command": python, "args": [script, report]}))
            .await
            .unwrap(),
    )
    .await;
    assert!(events.iter().any(|e| e["type"] == "result"), "{events:?}");
    let seen: Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    let env = seen["env"].as_object().unwrap();
    assert!(!env.contains_key("ANTHROPIC_API_KEY"), "{env:?}");
    assert!(env.contains_key("PATH"), "{env:?}");
    let unexpected: Vec<&String> = env
        .keys()
        .filter(|k| !["PATH", "HOME", "LANG"].contains(&k.as_str()) && !k.starts_with("LC_"))
        .collect();
    // Python itself may set a few of its own; none comes from the server.
    assert!(
        unexpected
            .iter()
            .all(|k| !k.contains("KEY") && !k.starts_with("CONCLAVE")),
        "{unexpected:?}"
    );
    assert_eq!(seen["terminal"], false);
    child.kill().await.unwrap();
}

// 9. A symlink swapped in between a file tool's check and its open.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_racing_symlink_never_lets_a_file_tool_out_of_the_workspace() {
    use conclave::sandbox::docker::DockerBackend;
    use conclave::sandbox::local::{LocalBackend, LocalConfig};
    use conclave::sandbox::{
        ExecRequest, LABEL_MANAGED, LABEL_SESSION, SandboxBackend, SandboxSpec, exec_collect, files,
    };
    use tokio_util::sync::CancellationToken;

    let root = tempfile::tempdir().unwrap();
    let backends: Vec<std::sync::Arc<dyn SandboxBackend>> = vec![
        std::sync::Arc::new(DockerBackend::connect().await.expect("dockerd answers")),
        std::sync::Arc::new(
            LocalBackend::new(LocalConfig::default(), root.path().to_path_buf()).unwrap(),
        ),
    ];
    for backend in backends {
        let spec = SandboxSpec {
            image: "conclave/sandbox-shell:latest".into(),
            cpus: 1.0,
            memory_mb: 256,
            pids: 64,
            disk_mb: 64,
            network: false,
            egress: None,
            env: Default::default(),
            labels: [
                (LABEL_MANAGED.to_string(), "true".to_string()),
                (LABEL_SESSION.to_string(), uuid::Uuid::new_v4().to_string()),
            ]
            .into(),
        };
        let sandbox = backend.create(&spec).await.unwrap();
        // /workspace/link flips, by atomic renames, between a file of the
        // workspace and a link to the image's /etc/passwd.
        let flipper = CancellationToken::new();
        let flipping = {
            let sandbox = sandbox.clone();
            let cancel = flipper.clone();
            let script = "cd /workspace; while :; do printf inside > s; mv -f s link; \
                          ln -sfn /etc/passwd e; mv -Tf e link; done";
            tokio::spawn(async move {
                let request = ExecRequest {
                    command: vec!["sh".into(), "-c".into(), script.into()],
                    stdin: None,
                    timeout: Duration::from_secs(300),
                    workdir: "/workspace".into(),
                    env: Default::default(),
                };
                exec_collect(sandbox.as_ref(), request, 1024, cancel, |_| {}).await
            })
        };
        let (mut inside, mut refused, mut escaped) = (0, 0, 0);
        for _ in 0..200 {
            match files::read(sandbox.as_ref(), "/workspace/link").await {
                Ok((bytes, _)) if bytes == b"inside" => inside += 1,
                Ok((bytes, _)) => {
                    escaped += 1;
                    eprintln!("read {:?}", String::from_utf8_lossy(&bytes));
                }
                Err(_) => refused += 1,
            }
        }
        flipper.cancel();
        let _ = flipping.await;
        let _ = sandbox.destroy().await;
        eprintln!(
            "{}: {inside} inside, {refused} refused, {escaped} escaped",
            backend.name()
        );
        assert_eq!(escaped, 0, "{} of 200 reads left the workspace", escaped);
        assert!(
            inside > 0 && refused > 0,
            "the link flipped ({inside} inside, {refused} refused)"
        );
    }
}
