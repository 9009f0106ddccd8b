//! The tar that moves a workspace in and out of its sandbox, run in the
//! sandbox on its bulk path (`Sandbox::exec_bulk`), never reading the
//! sandbox's files on the host.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::sandbox::{
    ExecChunk, ExecRequest, ExecStatus, Result, Sandbox, SandboxError, Stdin, WORKSPACE,
};

/// Bytes of a failed tar's stderr kept for its error.
const STDERR_KEPT: usize = 4096;

/// Streams `tar -c` of the workspace into a new file at `path`; its size.
pub(super) async fn pack(sandbox: &dyn Sandbox, path: &Path, timeout: Duration) -> Result<u64> {
    let mut file = tokio::fs::File::create(path)
        .await
        .map_err(|e| SandboxError::File(format!("creating {}: {e}", path.display())))?;
    let request = tar_request(&["-cf", "-", "."], None, timeout);
    let out = bulk(sandbox, request, Some(&mut file)).await?;
    let written = match out.failed {
        Some(e) => Err(e),
        None => file.flush().await,
    };
    written.map_err(|e| SandboxError::File(format!("writing {}: {e}", path.display())))?;
    check(&out.status, &out.stderr, "tar -c")?;
    Ok(out.written)
}

/// Unpacks the archive `data` into the workspace.
pub(super) async fn unpack(sandbox: &dyn Sandbox, data: Bytes, timeout: Duration) -> Result<()> {
    let request = tar_request(&["-xf", "-"], Some(data), timeout);
    let out = bulk(sandbox, request, None).await?;
    check(&out.status, &out.stderr, "tar -x")
}

/// How a tar on the bulk path ended.
struct Bulk {
    status: ExecStatus,
    /// The start of its stderr.
    stderr: Vec<u8>,
    /// Bytes of stdout written to the sink, and the first write error.
    written: u64,
    failed: Option<std::io::Error>,
}

/// Runs a tar on the sandbox's bulk path, writing its stdout to `sink`
/// as it comes (dropped without one).
async fn bulk(
    sandbox: &dyn Sandbox,
    request: ExecRequest,
    mut sink: Option<&mut tokio::fs::File>,
) -> Result<Bulk> {
    let (tx, mut rx) = mpsc::channel(64);
    let run = sandbox.exec_bulk(request, tx, CancellationToken::new());
    tokio::pin!(run);
    let mut stderr = Vec::new();
    let (mut written, mut failed) = (0u64, None);
    let mut take = async |chunk: ExecChunk| match chunk {
        ExecChunk::Stdout(data) => {
            if let Some(file) = sink.as_deref_mut()
                && failed.is_none()
            {
                match file.write_all(&data).await {
                    Ok(()) => written += data.len() as u64,
                    Err(e) => failed = Some(e),
                }
            }
        }
        ExecChunk::Stderr(data) => {
            let room = STDERR_KEPT.saturating_sub(stderr.len());
            stderr.extend_from_slice(&data[..data.len().min(room)]);
        }
    };
    let status = loop {
        tokio::select! {
            status = &mut run => break status?,
            Some(chunk) = rx.recv() => take(chunk).await,
        }
    };
    while let Ok(chunk) = rx.try_recv() {
        take(chunk).await;
    }
    Ok(Bulk {
        status,
        stderr,
        written,
        failed,
    })
}

/// `tar -C /workspace ARGS`, run in the workspace.
fn tar_request(args: &[&str], stdin: Option<Bytes>, timeout: Duration) -> ExecRequest {
    let mut command = vec!["tar".to_owned(), "-C".to_owned(), WORKSPACE.to_owned()];
    command.extend(args.iter().map(|a| (*a).to_owned()));
    ExecRequest {
        command,
        stdin: stdin.map(Stdin::Bytes),
        timeout,
        workdir: WORKSPACE.into(),
        env: Default::default(),
    }
}

fn check(status: &ExecStatus, stderr: &[u8], what: &str) -> Result<()> {
    if status.exit_code == Some(0) {
        return Ok(());
    }
    let why = if status.timed_out {
        "timed out".to_owned()
    } else {
        format!("exited {:?}", status.exit_code)
    };
    Err(SandboxError::File(format!(
        "{what} of the workspace {why}: {}",
        String::from_utf8_lossy(stderr).trim()
    )))
}
