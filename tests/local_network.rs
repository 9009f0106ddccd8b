//! Local sandboxes given network, attacked as the security review did: a
//! listener in a sandbox must not be reachable from another host (a
//! network namespace with a route to this one) nor on the host's own
//! address; the sandbox still reaches the outside, but not the reserved
//! ranges the firewall refuses; and `kill -9` of the real server leaves no
//! sandbox process behind, so a restart takes the same port.
//!
//! Real namespaces, veths, iptables and processes: these tests need root,
//! `ip` (iproute2) and `iptables`, as `scripts/test.sh` provides.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use conclave::sandbox::local::{self, LocalBackend, LocalConfig};
use conclave::sandbox::{ExecChunk, ExecRequest, SandboxBackend, SandboxSpec, firewall};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Runs a command and panics with its stderr when it fails.
fn must(program: &str, args: &[&str]) {
    let output = Command::new(program).args(args).output().expect(program);
    assert!(
        output.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A neighbour on the network: a namespace linked to the host by a veth,
/// routing everything through the host, as another machine on the LAN
/// would. It has a public address (11.213.N.2, stand-in for the internet)
/// and one in 203.0.113.0/24 (a documentation range, reserved), and is
/// removed, veth and all, when dropped.
struct Neighbour {
    name: String,
    public: String,
    reserved: String,
    /// The host's address on the link.
    host: String,
}

impl Neighbour {
    fn new() -> Neighbour {
        let n = std::process::id() % 250 + 1;
        let name = format!("cnclv-t{n}");
        let host_end = format!("cnt{n}h");
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        must("ip", &["netns", "add", &name]);
        let (host, public, reserved) = (
            format!("11.213.{n}.1"),
            format!("11.213.{n}.2"),
            format!("203.0.113.{n}"),
        );
        must(
            "ip",
            &[
                "link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns", &name,
            ],
        );
        must(
            "ip",
            &["addr", "add", &format!("{host}/30"), "dev", &host_end],
        );
        must("ip", &["link", "set", &host_end, "up"]);
        must(
            "ip",
            &["route", "add", &format!("{reserved}/32"), "dev", &host_end],
        );
        for command in [
            format!("addr add {public}/30 dev eth0"),
            format!("addr add {reserved}/32 dev eth0"),
            "link set eth0 up".into(),
            "link set lo up".into(),
            format!("route add default via {host}"),
        ] {
            let words: Vec<&str> = command.split(' ').collect();
            let mut args = vec!["-n", name.as_str()];
            args.extend(words);
            must("ip", &args);
        }
        Neighbour {
            name,
            public,
            reserved,
            host,
        }
    }

    /// A listener on every address of the neighbour that answers
    /// "neighbour" to each connection.
    fn serve(&self, port: u16) -> tokio::process::Child {
        let script = format!(
            "import socket\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
             s.bind(('0.0.0.0',{port}));s.listen()\nprint('up',flush=True)\n\
             while True:\n c,_=s.accept();c.sendall(b'neighbour\\n');c.close()\n"
        );
        tokio::process::Command::new("ip")
            .args(["netns", "exec", &self.name, "python3", "-c", &script])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 in the neighbour")
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["route", "del", &format!("{}/32", self.reserved)])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// The errno of a TCP connect to `addr:port` (0: connected), from network
/// namespace `netns` or, with `None`, from the host.
fn connect_from(netns: Option<&str>, addr: &str, port: u16) -> i32 {
    let script = format!(
        "import socket;s=socket.socket();s.settimeout(3);r=s.connect_ex(('{addr}',{port}));\
         print(110 if r==11 else r)"
    );
    let mut command = match netns {
        Some(name) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", name, "python3"]);
            c
        }
        None => Command::new("python3"),
    };
    let output = command.args(["-c", &script]).output().expect("python3");
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&output.stderr)))
}

fn free_port() -> u16 {
    TcpListener::bind("0.0.0.0:0")
        .expect("a free port")
        .local_addr()
        .expect("its address")
        .port()
}

/// This host's first non-loopback IPv4 address.
fn host_address() -> String {
    let out = Command::new("hostname")
        .arg("-I")
        .output()
        .expect("hostname -I");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find(|a| {
            a.parse::<std::net::Ipv4Addr>()
                .is_ok_and(|ip| !ip.is_loopback())
        })
        .expect("a non-loopback address")
        .to_string()
}

/// The names of the host's interfaces.
fn links() -> Vec<String> {
    std::fs::read_dir("/sys/class/net")
        .expect("/sys/class/net")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_sandbox_listens_on_its_own_interface_only_and_reaches_the_internet_only() {
    assert!(local::is_root(), "these tests need root");
    let hook = local::network_hook();
    tokio::task::spawn_blocking(move || firewall::install(&[], &hook))
        .await
        .expect("join")
        .expect("the firewall installs");
    let neighbour = Neighbour::new();
    let outside_port = free_port();
    let mut outside = neighbour.serve(outside_port);
    let mut up = BufReader::new(outside.stdout.take().expect("stdout")).lines();
    assert_eq!(up.next_line().await.expect("read").as_deref(), Some("up"));
    // The host reaches the neighbour's reserved address, so what stops the
    // sandbox below is the firewall, not routing.
    assert_eq!(connect_from(None, &neighbour.reserved, outside_port), 0);

    let dir = tempfile::tempdir().expect("tempdir");
    let backend = LocalBackend::new(
        LocalConfig {
            uid_base: 1_600_000_000 + (std::process::id() % 1000) * 100,
            uid_count: 100,
            ..LocalConfig::default()
        },
        dir.path().join("sandboxes"),
    )
    .expect("local backend");
    let sandbox = backend
        .create(&SandboxSpec {
            image: "host".into(),
            cpus: 1.0,
            memory_mb: 256,
            pids: 64,
            disk_mb: 64,
            network: true,
            egress: None,
            env: Default::default(),
            labels: Default::default(),
        })
        .await
        .expect("create");

    // In one exec (each is a namespace of its own): reach the neighbour's
    // public and reserved addresses, then listen on every interface and
    // check the listener answers on the sandbox's own address.
    // A service of the host on every interface, as the review's attack used.
    let host_service = TcpListener::bind("0.0.0.0:0").expect("a host service");
    let host_port = host_service.local_addr().expect("its address").port();
    let inside_port = free_port();
    let script = format!(
        "import socket,subprocess,time\n\
         def connect(a,p={outside_port}):\n s=socket.socket();s.settimeout(5)\n r=s.connect_ex((a,p))\n \
         return (s.recv(64).decode().strip() or 'connected') if r==0 and p=={outside_port} else r\n\
         print('public', connect('{public}'), flush=True)\n\
         print('reserved', connect('{reserved}'), flush=True)\n\
         print('host', connect('{host}',{host_port}), connect('127.0.0.1',{host_port}), flush=True)\n\
         addr=subprocess.run(['ip','-4','-o','addr','show','dev','eth0'],capture_output=True,\
         text=True).stdout.split()[3].split('/')[0]\n\
         l=socket.socket();l.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         l.bind(('0.0.0.0',{inside_port}));l.listen()\n\
         socket.create_connection((addr,{inside_port}),timeout=5)\n\
         print('listening', addr, flush=True)\n\
         time.sleep(120)\n",
        public = neighbour.public,
        reserved = neighbour.reserved,
        host = host_address(),
    );
    let (tx, mut rx) = mpsc::channel(64);
    let cancel = CancellationToken::new();
    let exec = {
        let (sandbox, cancel) = (sandbox.clone(), cancel.clone());
        tokio::spawn(async move {
            let mut request = ExecRequest::shell("", Duration::from_secs(150));
            request.command = vec!["python3".into(), "-c".into(), script];
            sandbox.exec(request, tx, cancel).await
        })
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    while !stdout.contains("listening") {
        match tokio::time::timeout(Duration::from_secs(60), rx.recv()).await {
            Ok(Some(ExecChunk::Stdout(bytes))) => stdout.push_str(&String::from_utf8_lossy(&bytes)),
            Ok(Some(ExecChunk::Stderr(bytes))) => stderr.push_str(&String::from_utf8_lossy(&bytes)),
            Ok(None) | Err(_) => panic!("the sandbox stopped: {stdout}{stderr}"),
        }
    }
    let lines: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0], ["public", "neighbour"], "{stdout}{stderr}");
    // REJECT: refused at once (ECONNREFUSED).
    assert_eq!(lines[1], ["reserved", "111"], "{stdout}{stderr}");
    // The host's own address is refused; its 127.0.0.1 is not the
    // sandbox's.
    assert_eq!(lines[2], ["host", "111", "111"], "{stdout}{stderr}");
    let sandbox_addr = lines[3][1].to_string();

    // Another machine with a route to the sandboxes' range, and anyone at
    // the host's addresses, find nothing.
    let dropped = connect_from(Some(&neighbour.name), &sandbox_addr, inside_port);
    assert!(dropped == 110 || dropped == 113, "errno {dropped}");
    for addr in [neighbour.host.as_str(), &host_address()] {
        assert_eq!(
            connect_from(Some(&neighbour.name), addr, inside_port),
            111,
            "{addr}"
        );
        assert_eq!(connect_from(None, addr, inside_port), 111, "{addr}");
    }

    // The host end of the sandbox's veth goes with the exec.
    let host_end = {
        let out = Command::new("ip")
            .args(["-o", "-4", "addr", "show"])
            .output()
            .expect("ip");
        let prefix: String = sandbox_addr.rsplit_once('.').expect("an address").0.into();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.contains(&format!(" {prefix}.")) && l.contains("cnclv-l"))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
            .expect("the host end of the sandbox's veth")
    };
    cancel.cancel();
    let status = exec.await.expect("join").expect("exec");
    assert!(status.cancelled, "{status:?}");
    sandbox.destroy().await.expect("destroy");
    for _ in 0..50 {
        if !links().contains(&host_end) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{host_end} outlived its sandbox");
}

/// The pids of processes whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != std::process::id())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(marker)
            })
        })
        .collect()
}

/// Starts the real binary on `port` with local sandboxes given network,
/// and returns it with its URL once it listens.
async fn serve(cwd: &std::path::Path, port: u16) -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_conclave"))
        .current_dir(cwd)
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--sandbox",
            "local",
        ])
        .env_remove("CONCLAVE_DATA_DIR")
        .env_remove("CONCLAVE_SANDBOX")
        .env("CONCLAVE_SANDBOX__ALLOW_NETWORK", "true")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the conclave binary starts");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next_line().await.expect("read").unwrap_or_default();
    if !first.starts_with("conclave listening on") {
        let output = child.wait_with_output().await.expect("exit");
        panic!(
            "the server did not start ({first:?}): {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    (child, format!("http://127.0.0.1:{port}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_server_takes_its_sandboxes_with_it_and_the_port_is_free_again() {
    assert!(local::is_root(), "these tests need root");
    let cwd = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let (mut server, url) = serve(cwd.path(), port).await;
    let http = reqwest::Client::new();
    let created: Value = http
        .post(format!("{url}/agent/session"))
        .json(&json!({"options": {"sandbox": {"network": true}}}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("json");
    let id = created["session_id"].as_str().expect("an id").to_string();
    let (session, base) = (id.clone(), url.clone());
    // The sandbox listens on the server's own port, on every interface.
    let marker = format!("http.server {port} --bind 0.0.0.0");
    let turn = tokio::spawn({
        let http = http.clone();
        let prompt = format!("$ python3 -m {marker}");
        async move {
            let response = http
                .post(format!("{base}/agent/session/{session}/message"))
                .json(&json!({"prompt": prompt}))
                .send()
                .await;
            if let Ok(response) = response {
                let _ = response.bytes().await;
            }
        }
    });
    let mut running = Vec::new();
    for _ in 0..300 {
        running = processes_with(&marker);
        if !running.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!running.is_empty(), "the sandbox's listener never started");
    // Listening, in the sandbox: its port is not the host's.
    tokio::time::sleep(Duration::from_secs(1)).await;

    server.kill().await.expect("kill -9");
    turn.abort();
    let mut left = processes_with(&marker);
    for _ in 0..50 {
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = processes_with(&marker);
    }
    assert!(
        left.is_empty(),
        "sandbox processes outlived the server: {left:?}"
    );

    let (mut restarted, url) = serve(cwd.path(), port).await;
    let health = http
        .get(format!("{url}/health"))
        .send()
        .await
        .expect("health");
    assert_eq!(health.status(), 200);
    // The session takes its sandbox (and its tmpfs mounts) with it.
    let deleted = http
        .delete(format!("{url}/agent/session/{id}"))
        .send()
        .await
        .expect("delete");
    assert_eq!(deleted.status(), 200);
    restarted.kill().await.expect("kill");
}
