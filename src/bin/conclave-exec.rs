//! `conclave-exec`: the resident exec helper of a docker sandbox.
//!
//! The docker backend runs it as the container's main process (under
//! docker-init) and talks to it over the container's attached stdin and
//! stdout. An exec then costs one line written on a connection that is
//! already open, where a `docker exec` starts a runc process (tens of
//! milliseconds). `build.rs` compiles this file alone, with std only and
//! statically linked, so it runs in any Linux image; the server embeds the
//! result and sends it to each new container (see `sandbox/docker/agent.rs`).
//!
//! The protocol is one message per line, fields separated by one space,
//! every free-form field hex-encoded (nothing but `[0-9a-z -]` on the wire,
//! so docker's detach keys never appear in it). Requests, on stdin:
//!
//! - `h ID`: answer `h ID LANDLOCK` (the server checks the helper is up,
//!   and learns whether runs are sealed off from the channel, see below);
//! - `r ID WORKDIR STDIN ARGC ARG… ENVC KEY=VALUE…`: run a command in its
//!   own process group, `STDIN` being `-` for none;
//! - `k ID`: kill that run's process group and every process carrying its
//!   marker variable (some leave the group). The same happens when a run's
//!   command exits: nothing it started in the background outlives it.
//!
//! Replies, on stdout: `o ID DATA` and `e ID DATA` (a chunk of stdout or
//! stderr), `x ID CODE` (the run ended; 128+N after signal N, like a shell)
//! and `f ID MESSAGE` (it could not start). Each reply is one `write` of
//! less than `PIPE_BUF`, so replies never interleave. A line that does not
//! parse is skipped: a connection that starts mid-line picks up at the next
//! newline.
//!
//! The channel is this process's stdin and stdout, which docker-init and
//! the boot shell hold too; every process in the container runs as the
//! same user, so without more a run could open `/proc/1/fd/1` and write
//! replies the server would take for the helper's (a forged tool result),
//! or read `/proc/1/fd/0` and take the server's requests. So each run's
//! command enters a Landlock domain of its own before it starts (it and
//! everything it starts stay in it): Landlock refuses a process in a
//! domain every ptrace-class access to processes outside it, which
//! includes their `/proc/PID/fd`, `mem` and `environ`. The ruleset handles
//! one access right no process here has anyway (making block devices) and
//! grants nothing else away: the domain only scopes. `LANDLOCK` in the
//! hello answer is the kernel's Landlock ABI version, 0 when the kernel
//! offers none: then runs are not sealed, and the server says so.
//!
//! Nothing here may panic or exit: when this process ends, so does the
//! sandbox. Every failure becomes an `f` reply instead.

use std::collections::HashMap;
use std::ffi::{c_long, c_ulong};
use std::fs::File;
use std::io::{self, BufRead, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;

/// The variable that marks every process of one run.
const MARKER: &str = "CONCLAVE_EXEC";
/// Bytes of output per reply: hex doubles them, and the line must stay
/// under `PIPE_BUF` (4096) to be written atomically.
const CHUNK: usize = 1024;
/// How often a run whose pipes stay open (a background child holds them)
/// checks whether its command has exited.
const POLL_MS: i32 = 50;
/// Rounds of the marker sweep before giving up on a process that keeps
/// forking.
const KILL_ROUNDS: usize = 50;
/// Tries, 10 ms apart, of a run that could not start for lack of
/// processes, once the sandbox's other processes are killed.
const SPAWN_RETRIES: usize = 100;
const SIGKILL: i32 = 9;
const SIGCONT: i32 = 18;
const SIGSTOP: i32 = 19;
/// fork's "try again": a pid limit is reached.
const EAGAIN: i32 = 11;
const POLLIN: i16 = 0x1;

#[repr(C)]
struct PollFd {
    fd: i32,
    events: i16,
    revents: i16,
}

unsafe extern "C" {
    fn kill(pid: i32, signal: i32) -> i32;
    fn poll(fds: *mut PollFd, count: c_ulong, timeout_ms: i32) -> i32;
    fn prctl(option: i32, ...) -> i32;
    fn syscall(number: c_long, ...) -> c_long;
}

/// Landlock's system calls (the same numbers on every architecture) and
/// the constants they take.
const SYS_LANDLOCK_CREATE_RULESET: c_long = 444;
const SYS_LANDLOCK_RESTRICT_SELF: c_long = 446;
const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
const LANDLOCK_ACCESS_FS_MAKE_BLOCK: u64 = 1 << 11;
const PR_SET_NO_NEW_PRIVS: i32 = 38;

/// The Landlock ruleset every run's command enters (see the module docs).
#[derive(Clone, Copy)]
struct Seal {
    ruleset: i32,
    /// The kernel's Landlock ABI version, reported in the hello answer.
    abi: c_long,
}

impl Seal {
    /// Makes the ruleset, or `None` where the kernel (or a seccomp profile)
    /// offers no Landlock. Its descriptor is close-on-exec: no run gets it.
    fn open() -> Option<Seal> {
        // SAFETY: a null attribute with size 0 and the version flag only
        // asks for the ABI version.
        let abi = unsafe {
            syscall(
                SYS_LANDLOCK_CREATE_RULESET,
                std::ptr::null::<u64>(),
                0usize,
                LANDLOCK_CREATE_RULESET_VERSION,
            )
        };
        if abi < 1 {
            return None;
        }
        // `struct landlock_ruleset_attr` as ABI 1 has it: the handled
        // filesystem rights alone.
        let handled: u64 = LANDLOCK_ACCESS_FS_MAKE_BLOCK;
        // SAFETY: the attribute points at a live u64 whose size is given.
        let ruleset = unsafe {
            syscall(
                SYS_LANDLOCK_CREATE_RULESET,
                &handled as *const u64,
                std::mem::size_of::<u64>(),
                0u32,
            )
        };
        Some(Seal {
            ruleset: i32::try_from(ruleset).ok().filter(|fd| *fd >= 0)?,
            abi,
        })
    }

    /// Puts the calling process in the ruleset's domain. Runs in a forked
    /// child before exec, so it only makes system calls.
    fn enter(self) -> io::Result<()> {
        // SAFETY: prctl and landlock_restrict_self take plain integers.
        let entered = unsafe {
            prctl(
                PR_SET_NO_NEW_PRIVS,
                1 as c_ulong,
                0 as c_ulong,
                0 as c_ulong,
                0 as c_ulong,
            ) == 0
                && syscall(SYS_LANDLOCK_RESTRICT_SELF, self.ruleset, 0u32) == 0
        };
        if entered {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// Sends a signal; `pid` below zero names a process group, and -1 every
/// process this one may signal but init and itself.
fn signal(pid: i32, signal: i32) -> bool {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    unsafe { kill(pid, signal) == 0 }
}

/// The replies' writer: the process's stdout, unbuffered, so each line is
/// one `write`.
#[derive(Clone)]
struct Replies(Arc<Mutex<File>>);

impl Replies {
    fn send(&self, line: &str) {
        let mut line = line.to_string();
        line.push('\n');
        // A server that went away is no reason to stop: a new one attaches.
        let _ = lock(&self.0).write_all(line.as_bytes());
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs in flight: id → (process group, marker value).
type Running = Arc<Mutex<HashMap<u64, (i32, String)>>>;

fn hex(data: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(data.len() * 2);
    for byte in data {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    text
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok())
        .collect()
}

fn unhex_text(text: &str) -> Option<String> {
    String::from_utf8(unhex(text)?).ok()
}

struct Run {
    workdir: String,
    stdin: Option<Vec<u8>>,
    argv: Vec<String>,
    env: Vec<(String, String)>,
}

impl Run {
    /// Parses the fields after `r ID`.
    fn parse(fields: &[&str]) -> Option<Run> {
        let (workdir, rest) = fields.split_first()?;
        let (stdin, rest) = rest.split_first()?;
        let (argc, rest) = rest.split_first()?;
        let argc: usize = argc.parse().ok()?;
        let argv = rest
            .get(..argc)?
            .iter()
            .map(|arg| unhex_text(arg))
            .collect::<Option<Vec<_>>>()?;
        let (envc, rest) = rest.get(argc..)?.split_first()?;
        let envc: usize = envc.parse().ok()?;
        if rest.len() != envc || argv.is_empty() {
            return None;
        }
        let env = rest
            .iter()
            .map(|pair| {
                let pair = unhex_text(pair)?;
                let (key, value) = pair.split_once('=')?;
                Some((key.to_string(), value.to_string()))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Run {
            workdir: unhex_text(workdir)?,
            stdin: match *stdin {
                "-" => None,
                data => Some(unhex(data)?),
            },
            argv,
            env,
        })
    }
}

fn main() {
    // SAFETY: fd 1 is this process's stdout, open for its whole life and
    // written only through this handle from here on.
    let replies = Replies(Arc::new(Mutex::new(unsafe { File::from_raw_fd(1) })));
    let running: Running = Arc::default();
    let seal = Seal::open();
    let landlock = seal.map_or(0, |seal| seal.abi);
    let mut input = io::stdin().lock();
    let mut line = Vec::new();
    loop {
        line.clear();
        match input.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let Ok(text) = std::str::from_utf8(&line) else {
            continue;
        };
        let fields: Vec<&str> = text.trim_end_matches('\n').split(' ').collect();
        let Some(id) = fields.get(1).and_then(|id| id.parse::<u64>().ok()) else {
            continue;
        };
        match fields[0] {
            "h" if fields.len() == 2 => replies.send(&format!("h {id} {landlock}")),
            "k" if fields.len() == 2 => kill_run(&running, id),
            "r" => match Run::parse(&fields[2..]) {
                Some(run) => start(id, run, seal, &running, &replies),
                None => replies.send(&format!("f {id} {}", hex(b"malformed run request"))),
            },
            _ => {}
        }
    }
    // Stdin closed: nobody can reach this helper any more, but the sandbox
    // stays up until the server removes it.
    loop {
        thread::park();
    }
}

fn start(id: u64, run: Run, seal: Option<Seal>, running: &Running, replies: &Replies) {
    // Cut to a chunk, so the reply stays one atomic write (a command's
    // name can be long).
    let fail = |message: String| {
        let message = &message.as_bytes()[..message.len().min(CHUNK)];
        replies.send(&format!("f {id} {}", hex(message)));
    };
    if lock(running).contains_key(&id) {
        return fail(format!("run {id} is already running"));
    }
    let mut freed = false;
    for attempt in 0..=SPAWN_RETRIES {
        match launch(id, &run, seal, running, replies) {
            Ok(()) => return,
            // Out of processes: what earlier runs left in the background
            // holds every pid the sandbox may have (a fork bomb whose shell
            // has exited), and nothing might run in it again. Kill it all,
            // say so on the run's stderr, and try again while docker-init
            // reaps the dead.
            Err((_, err)) if err.raw_os_error() == Some(EAGAIN) && attempt < SPAWN_RETRIES => {
                if !freed {
                    kill_all_but_the_sandbox();
                    let notice = "conclave-exec: the sandbox was out of processes; \
                                  every process left running in it was killed\n";
                    replies.send(&format!("e {id} {}", hex(notice.as_bytes())));
                    freed = true;
                }
                thread::sleep(std::time::Duration::from_millis(10));
            }
            Err((what, err)) => return fail(format!("{what}: {err}")),
        }
    }
}

/// Starts a run: the thread that will watch it, then its command. On an
/// error nothing of it is left running, so it may be tried again.
fn launch(
    id: u64,
    run: &Run,
    seal: Option<Seal>,
    running: &Running,
    replies: &Replies,
) -> Result<(), (String, io::Error)> {
    let (hand_over, handed) = std::sync::mpsc::channel::<Child>();
    let (running_here, replies_here) = (running.clone(), replies.clone());
    thread::Builder::new()
        .spawn(move || {
            // No child comes when its command could not start.
            let Ok(mut child) = handed.recv() else {
                return;
            };
            let code = watch(id, &mut child, &replies_here);
            // Nothing a run started outlives it: what it left in the
            // background (its group, and what carries its marker after
            // leaving the group, `setsid` included) goes with it.
            kill_run(&running_here, id);
            lock(&running_here).remove(&id);
            replies_here.send(&format!("x {id} {code}"));
        })
        .map_err(|err| ("cannot watch the run".to_string(), err))?;
    let marker = format!("{}-{id}", std::process::id());
    let mut command = Command::new(&run.argv[0]);
    if let Some(seal) = seal {
        // SAFETY: `enter` only makes system calls, which is what may run
        // between fork and exec.
        unsafe {
            command.pre_exec(move || seal.enter());
        }
    }
    let mut child = command
        .args(&run.argv[1..])
        .current_dir(&run.workdir)
        .envs(run.env.iter().map(|(key, value)| (key, value)))
        .env(MARKER, &marker)
        .process_group(0)
        .stdin(if run.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|err| (format!("cannot run {}", run.argv[0]), err))?;
    let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
    lock(running).insert(id, (pid, marker));
    if let (Some(data), Some(mut pipe)) = (run.stdin.clone(), child.stdin.take()) {
        // A command that exits without reading its input is not an error.
        let fed = thread::Builder::new().spawn(move || {
            let _ = pipe.write_all(&data);
        });
        if fed.is_err() {
            kill_run(running, id);
        }
    }
    // The watcher is waiting for it; it reports how the run ended.
    let _ = hand_over.send(child);
    Ok(())
}

/// Kills every process in the container except docker-init, the boot
/// shell that started this helper (the container ends with it) and this
/// helper. Everything else is stopped first, in one call the kernel makes
/// atomic against fork, so the sweep through `/proc` cannot be outrun.
fn kill_all_but_the_sandbox() {
    let parent = i32::try_from(std::os::unix::process::parent_id()).unwrap_or(1);
    let spared = [1, parent, i32::try_from(std::process::id()).unwrap_or(1)];
    signal(-1, SIGSTOP);
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            if let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|name| name.parse::<i32>().ok())
                .filter(|pid| !spared.contains(pid))
            {
                signal(pid, SIGKILL);
            }
        }
    }
    signal(parent, SIGCONT);
}

/// Streams a run's output until its command has exited and its pipes are
/// drained, and returns its exit code. Pipes a background child keeps open
/// do not hold the run once the command itself has exited.
fn watch(id: u64, child: &mut Child, replies: &Replies) -> i32 {
    let mut pipes: Vec<(char, Box<dyn ReadFd>)> = Vec::new();
    if let Some(out) = child.stdout.take() {
        pipes.push(('o', Box::new(out)));
    }
    if let Some(err) = child.stderr.take() {
        pipes.push(('e', Box::new(err)));
    }
    let mut buffer = [0u8; CHUNK];
    let mut exited = None;
    while !pipes.is_empty() {
        let mut fds: Vec<PollFd> = pipes
            .iter()
            .map(|(_, pipe)| PollFd {
                fd: pipe.fd(),
                events: POLLIN,
                revents: 0,
            })
            .collect();
        // Once the command has exited, only what is already there is read.
        let timeout = if exited.is_some() { 0 } else { POLL_MS };
        // SAFETY: `fds` is a live, correctly sized array of `struct pollfd`.
        let ready = unsafe { poll(fds.as_mut_ptr(), fds.len() as c_ulong, timeout) };
        if ready < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if ready == 0 {
            if exited.is_some() {
                break;
            }
            exited = child.try_wait().ok().flatten();
            continue;
        }
        let mut closed = Vec::new();
        for (at, fd) in fds.iter().enumerate() {
            if fd.revents == 0 {
                continue;
            }
            let (tag, pipe) = &mut pipes[at];
            match pipe.read(&mut buffer) {
                Ok(0) | Err(_) => closed.push(at),
                Ok(n) => replies.send(&format!("{tag} {id} {}", hex(&buffer[..n]))),
            }
        }
        for at in closed.into_iter().rev() {
            pipes.remove(at);
        }
    }
    let status = match exited {
        Some(status) => Ok(status),
        None => child.wait(),
    };
    match status {
        Ok(status) => status
            .code()
            .or_else(|| status.signal().map(|signal| 128 + signal))
            .unwrap_or(-1),
        Err(_) => -1,
    }
}

/// A child's pipe: readable, with a descriptor to poll.
trait ReadFd: Read + Send {
    fn fd(&self) -> i32;
}

impl<T: Read + AsRawFd + Send> ReadFd for T {
    fn fd(&self) -> i32 {
        self.as_raw_fd()
    }
}

/// Kills a run's process group, then sweeps `/proc` for processes that
/// still carry its marker (they left the group) until none is left. Runs
/// on the reading thread and starts no process, so it works while a fork
/// bomb holds every pid the sandbox may have.
fn kill_run(running: &Running, id: u64) {
    let Some((group, marker)) = lock(running).get(&id).cloned() else {
        return;
    };
    signal(-group, SIGKILL);
    let wanted = format!("{MARKER}={marker}");
    for _ in 0..KILL_ROUNDS {
        let mut found = false;
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|name| name.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
                continue;
            };
            if environ
                .split(|byte| *byte == 0)
                .any(|pair| pair == wanted.as_bytes())
                && signal(pid, SIGKILL)
            {
                found = true;
            }
        }
        if !found {
            return;
        }
    }
}
