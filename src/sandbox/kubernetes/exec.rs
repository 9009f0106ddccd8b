//! Commands in a Pod: the wrapper that gives exec a workdir, an environment
//! and a kill switch, the pump that streams its output, and its exit code.
//!
//! The exec API takes only an argv: no workdir, no environment, no timeout,
//! and closing the connection does not stop the process. So every command
//! runs under a small `sh` wrapper that exports the environment, changes
//! directory and `exec`s the command, and the environment carries a marker
//! (`CONCLAVE_EXEC=<random>`) that every descendant inherits. A timeout or
//! cancel then runs a second exec that SIGKILLs each process whose
//! environment holds the marker, repeating until none is left so children
//! forked meanwhile die too. This catches what a process group would miss
//! (a `setsid` daemon, a double fork) and needs only `sh`, `tr` and `grep`
//! in the image; a process that wipes its own environment (`env -i`)
//! escapes it, and is still ended with the Pod.
//!
//! Stdin relies on the `v5.channel.k8s.io` protocol (Kubernetes 1.30 and
//! later) to close it alone; over v4 kube can only close the whole
//! connection, and such an exec ends as a lost connection.

use std::collections::BTreeMap;

use bytes::Bytes;
use futures::FutureExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::AttachedProcess;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

use crate::sandbox::{EXEC_MARKER, ExecChunk, ExecRequest, SandboxError, Stdin};

/// `$1` workdir, `$2` how many `NAME=value` words follow, then those words,
/// then the command. `export` takes each word whole, so values need no
/// quoting; `exec` keeps the command's pid and its exit code.
const WRAPPER: &str = r#"dir=$1; n=$2; shift 2
while [ "$n" -gt 0 ]; do export "$1" || exit 125; shift; n=$((n - 1)); done
cd "$dir" || exit 126
exec "$@""#;

/// cgroup files, v2 then v1, for memory, pids and CPU time; `grep -Hs .`
/// prints `path:line` for each that exists and is silent about the rest.
const CGROUP_FILES: [&str; 6] = [
    "/sys/fs/cgroup/memory.current",
    "/sys/fs/cgroup/memory/memory.usage_in_bytes",
    "/sys/fs/cgroup/pids.current",
    "/sys/fs/cgroup/pids/pids.current",
    "/sys/fs/cgroup/cpu.stat",
    "/sys/fs/cgroup/cpuacct/cpuacct.usage",
];

/// Size of one read from the exec's output pipes, so one chunk.
pub(super) const CHUNK: usize = 64 * 1024;

/// A fresh marker value for one exec.
pub(super) fn new_marker() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The argv the exec API gets for `request`.
pub(super) fn wrap(request: &ExecRequest, marker: &str) -> Result<Vec<String>, SandboxError> {
    if request.command.is_empty() {
        return Err(SandboxError::Backend("exec needs a command".into()));
    }
    if let Some(name) = request.env.keys().find(|name| !is_env_name(name)) {
        return Err(SandboxError::Backend(format!(
            "exec environment variable name '{name}' is not a valid shell name"
        )));
    }
    let mut argv = vec![
        "/bin/sh".to_string(),
        "-c".into(),
        WRAPPER.into(),
        "conclave-exec".into(),
        request.workdir.clone(),
        (request.env.len() + 1).to_string(),
        format!("{EXEC_MARKER}={marker}"),
    ];
    argv.extend(request.env.iter().map(|(k, v)| format!("{k}={v}")));
    argv.extend(request.command.iter().cloned());
    Ok(argv)
}

/// The argv that kills every process of the exec marked `marker`.
pub(super) fn kill_command(marker: &str) -> Vec<String> {
    crate::sandbox::kill_by_marker(marker)
}

/// The argv that reads the sandbox's cgroup counters.
pub(super) fn stats_command() -> Vec<String> {
    let mut argv = vec!["grep".to_string(), "-Hs".into(), ".".into()];
    argv.extend(CGROUP_FILES.iter().map(|f| f.to_string()));
    argv
}

fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Feeds `stdin`, forwards stdout and stderr to `output` as they come, and
/// returns the process's status; `None` when the connection ended without
/// one.
///
/// kube's message loop ends the moment it reads the status and only then
/// closes the output pipes; if it fails instead, it drops them unclosed and
/// a read would wait forever. So the pipes are read until the status
/// future resolves (the loop has ended either way, and everything it wrote
/// is buffered by then), and then drained without waiting.
pub(super) async fn pump(
    attached: &mut AttachedProcess,
    stdin: Option<Stdin>,
    output: &mpsc::Sender<ExecChunk>,
) -> Option<Status> {
    let status = attached.take_status();
    let status = async {
        match status {
            Some(status) => status.await,
            None => None,
        }
    };
    let writer = attached.stdin();
    let feed = async {
        if let (Some(mut writer), Some(data)) = (writer, stdin) {
            // A process that exits without reading its input breaks the
            // pipe; that is its business, not an exec failure.
            let _ = data.write_to(&mut writer).await;
        }
    };
    let mut stdout = attached.stdout();
    let mut stderr = attached.stderr();
    let mut out_buf = vec![0; CHUNK];
    let mut err_buf = vec![0; CHUNK];
    tokio::pin!(status, feed);
    let mut feeding = true;
    let status = loop {
        tokio::select! {
            status = &mut status => break status,
            () = &mut feed, if feeding => feeding = false,
            read = read_some(&mut stdout, &mut out_buf) => {
                forward(read, &mut stdout, &out_buf, ExecChunk::Stdout, output).await;
            }
            read = read_some(&mut stderr, &mut err_buf) => {
                forward(read, &mut stderr, &err_buf, ExecChunk::Stderr, output).await;
            }
        }
    };
    drain(&mut stdout, &mut out_buf, ExecChunk::Stdout, output).await;
    drain(&mut stderr, &mut err_buf, ExecChunk::Stderr, output).await;
    status
}

/// Reads from `pipe`, or never resolves once it has ended.
async fn read_some<R: AsyncRead + Unpin>(
    pipe: &mut Option<R>,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    match pipe {
        Some(pipe) => pipe.read(buf).await,
        None => std::future::pending().await,
    }
}

/// Sends what a read got; ends the pipe at EOF or on an error. A closed
/// `output` is ignored: the command runs on whether or not anyone listens.
async fn forward<R>(
    read: std::io::Result<usize>,
    pipe: &mut Option<R>,
    buf: &[u8],
    chunk: fn(Bytes) -> ExecChunk,
    output: &mpsc::Sender<ExecChunk>,
) {
    match read {
        Ok(n) if n > 0 => {
            let _ = output.send(chunk(Bytes::copy_from_slice(&buf[..n]))).await;
        }
        _ => *pipe = None,
    }
}

/// Sends whatever `pipe` holds now, without waiting for more.
async fn drain<R: AsyncRead + Unpin>(
    pipe: &mut Option<R>,
    buf: &mut [u8],
    chunk: fn(Bytes) -> ExecChunk,
    output: &mpsc::Sender<ExecChunk>,
) {
    while let Some(read) = read_some(pipe, buf).now_or_never() {
        forward(read, pipe, buf, chunk, output).await;
    }
}

/// The exit code a finished exec's status carries, or the API's reason
/// why the command did not run.
pub(super) fn exit_code(status: &Status) -> Result<i64, String> {
    if status.status.as_deref() == Some("Success") {
        return Ok(0);
    }
    if status.reason.as_deref() == Some("NonZeroExitCode") {
        let code = status
            .details
            .iter()
            .flat_map(|d| d.causes.iter().flatten())
            .find(|c| c.reason.as_deref() == Some("ExitCode"))
            .and_then(|c| c.message.as_deref()?.parse().ok());
        if let Some(code) = code {
            return Ok(code);
        }
    }
    Err(format!(
        "{} ({})",
        status.message.as_deref().unwrap_or("no message"),
        status.reason.as_deref().unwrap_or("no reason")
    ))
}

/// Counters read from the sandbox's cgroup.
#[derive(Debug, Default, PartialEq)]
pub(super) struct CgroupReading {
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
    /// CPU time used since the container started.
    pub cpu_usec: Option<u64>,
}

/// Parses the `path:line` output of [`stats_command`].
pub(super) fn parse_cgroup(text: &str) -> CgroupReading {
    let values = text.lines().filter_map(|line| line.split_once(':')).fold(
        BTreeMap::<&str, Vec<&str>>::new(),
        |mut map, (path, line)| {
            map.entry(path).or_default().push(line.trim());
            map
        },
    );
    let number = |path: &str| values.get(path)?.first()?.parse::<u64>().ok();
    let cpu_v2 = values
        .get("/sys/fs/cgroup/cpu.stat")
        .into_iter()
        .flatten()
        .find_map(|line| line.strip_prefix("usage_usec ")?.parse().ok());
    CgroupReading {
        memory_bytes: number(CGROUP_FILES[0]).or_else(|| number(CGROUP_FILES[1])),
        pids: number(CGROUP_FILES[2]).or_else(|| number(CGROUP_FILES[3])),
        cpu_usec: cpu_v2.or_else(|| number(CGROUP_FILES[5]).map(|ns| ns / 1000)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn wrap_puts_marker_and_env_before_the_command() {
        let mut request = ExecRequest::shell("echo hi", Duration::from_secs(1));
        request.workdir = "/workspace/sub dir".into();
        request.env.insert("A_B".into(), "x y".into());
        let argv = wrap(&request, "m1").unwrap();
        assert_eq!(
            argv[3..],
            [
                "conclave-exec",
                "/workspace/sub dir",
                "2",
                "CONCLAVE_EXEC=m1",
                "A_B=x y",
                "/bin/sh",
                "-c",
                "echo hi"
            ]
        );
    }

    #[test]
    fn wrap_refuses_names_the_shell_cannot_export() {
        let mut request = ExecRequest::shell("true", Duration::from_secs(1));
        request.env.insert("1BAD".into(), "x".into());
        assert!(matches!(
            wrap(&request, "m"),
            Err(SandboxError::Backend(msg)) if msg.contains("1BAD")
        ));
    }

    #[test]
    fn parse_cgroup_reads_v2_and_v1() {
        let v2 = "/sys/fs/cgroup/memory.current:1048576\n\
                  /sys/fs/cgroup/pids.current:3\n\
                  /sys/fs/cgroup/cpu.stat:usage_usec 2500\n\
                  /sys/fs/cgroup/cpu.stat:user_usec 2000\n";
        assert_eq!(
            parse_cgroup(v2),
            CgroupReading {
                memory_bytes: Some(1_048_576),
                pids: Some(3),
                cpu_usec: Some(2500)
            }
        );
        let v1 = "/sys/fs/cgroup/memory/memory.usage_in_bytes:42\n\
                  /sys/fs/cgroup/cpuacct/cpuacct.usage:7000\n";
        assert_eq!(
            parse_cgroup(v1),
            CgroupReading {
                memory_bytes: Some(42),
                pids: None,
                cpu_usec: Some(7)
            }
        );
    }
}
