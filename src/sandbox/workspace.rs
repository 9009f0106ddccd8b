//! A session's workspace in and out, the same way on every backend: an
//! uploaded archive unpacked, one file written, the workspace or one file
//! streamed out, a directory listed.
//!
//! Everything runs inside the sandbox as its own user, confined to
//! `/workspace` as the file tools are ([`super::files`]): the server never
//! reads or writes a sandbox's files on the host. Archives come checked
//! ([`super::archive`]); the unpacking tar replaces an existing file by
//! unlinking it, so it never writes through a link already there.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

use super::files::{ESCAPE_STATUS, run_within, script_request};
use super::{ExecChunk, ExecRequest, ExecStatus, Result, Sandbox, SandboxError, Stdin};

mod staged;

pub use staged::Staged;

/// How long an upload's unpacking or a download may take.
pub const TRANSFER_TIMEOUT: Duration = Duration::from_secs(600);
/// Exit statuses of the scripts below.
const MISSING: i64 = 95;
const NOT_A_DIRECTORY: i64 = 96;
const A_DIRECTORY: i64 = 94;
/// Bytes of a failed command's stderr kept for its error.
const STDERR_KEPT: usize = 4096;

/// Why a transfer did not happen.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The path names nothing.
    #[error("{0}")]
    Missing(String),
    /// The path is outside the workspace, or the wrong kind of file for
    /// the operation.
    #[error("{0}")]
    Path(String),
    /// The sandbox's disk is full.
    #[error("{0}")]
    Full(String),
    /// The tar in the sandbox refused the archive.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Sandbox(SandboxError),
}

impl From<SandboxError> for TransferError {
    fn from(e: SandboxError) -> TransferError {
        match e {
            SandboxError::InvalidPath(m) => TransferError::Path(m),
            SandboxError::File(m) if m.contains("No space left") => TransferError::Full(m),
            SandboxError::File(m) if m.contains("does not exist") => TransferError::Missing(m),
            other => TransferError::Sandbox(other),
        }
    }
}

/// Unpacks the checked archive `archive` into the directory `dir`
/// (absolute, confined), making it first.
pub async fn unpack(sandbox: &dyn Sandbox, dir: &str, archive: Stdin) -> Result<(), TransferError> {
    let script = r#"mkdir -p -- "$p" || exit 1
confined "$(realpath -- "$p")" "$1"
exec tar -C "$p" --no-same-owner -xf -"#;
    let request = script_request(script, &[dir], Some(archive), TRANSFER_TIMEOUT);
    match run_within(sandbox, request, 4096).await {
        Ok(_) => Ok(()),
        Err(SandboxError::File(m)) if !m.contains("No space left") => {
            Err(TransferError::Refused(format!("tar in the sandbox: {m}")))
        }
        Err(e) => Err(e.into()),
    }
}

/// Writes the file at `path` (absolute, confined) from `data`, making its
/// directories.
pub async fn write_file(
    sandbox: &dyn Sandbox,
    path: &str,
    data: Stdin,
) -> Result<(), TransferError> {
    Ok(super::files::write_within(sandbox, path, data, TRANSFER_TIMEOUT).await?)
}

/// The exec that writes a tar of the directory `dir` to stdout.
pub fn pack_request(dir: &str) -> ExecRequest {
    let script = format!(
        r#"[ -e "$p" ] || {{ echo "'$1' does not exist" >&2; exit {MISSING}; }}
[ -d "$p" ] || {{ echo "'$1' is not a directory" >&2; exit {NOT_A_DIRECTORY}; }}
exec tar -C "$p" -cf - ."#
    );
    script_request(&script, &[dir], None, TRANSFER_TIMEOUT)
}

/// A tar of the directory `dir`, when it is at most `limit` bytes; `None`
/// when it is larger.
pub async fn pack_bounded(
    sandbox: &dyn Sandbox,
    dir: &str,
    limit: usize,
) -> Result<Option<Vec<u8>>, TransferError> {
    let (tar, truncated) = run_within(sandbox, pack_request(dir), limit).await?;
    Ok((!truncated).then_some(tar))
}

/// The exec that writes the file at `path` to stdout: the file opened,
/// checked to be inside the workspace (links resolved), then read.
pub fn read_request(path: &str) -> ExecRequest {
    let script = format!(
        r#"[ -e "$p" ] || {{ echo "'$1' does not exist" >&2; exit {MISSING}; }}
[ -d "$p" ] && {{ echo "'$1' is a directory; list it with a trailing /" >&2; exit {A_DIRECTORY}; }}
[ -f "$p" ] || {{ echo "'$1' is not a regular file" >&2; exit {A_DIRECTORY}; }}
exec 3< "$p" || exit 1
confined "$(readlink "/proc/$$/fd/3")" "$1"
exec cat <&3"#
    );
    script_request(&script, &[path], None, TRANSFER_TIMEOUT)
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct DirEntry {
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: &'static str,
    pub size: u64,
    /// Permission bits, in octal (`644`).
    pub mode: String,
    /// Last modified, seconds since the epoch.
    pub mtime: f64,
}

/// The entries of the directory `dir` (absolute, confined), by name;
/// links are listed, not followed.
pub async fn list_dir(sandbox: &dyn Sandbox, dir: &str) -> Result<Vec<DirEntry>, TransferError> {
    let script = format!(
        r#"[ -e "$p" ] || {{ echo "'$1' does not exist" >&2; exit {MISSING}; }}
[ -d "$p" ] || {{ echo "'$1' is not a directory" >&2; exit {NOT_A_DIRECTORY}; }}
exec find "$p" -mindepth 1 -maxdepth 1 -printf '%y\t%s\t%m\t%T@\t%f\0'"#
    );
    let request = script_request(&script, &[dir], None, TRANSFER_TIMEOUT);
    let (status, out, stderr) = collect(sandbox, request, 64 * 1024 * 1024).await?;
    if let Some(e) = failure(&status, &stderr) {
        return Err(e);
    }
    let mut entries: Vec<DirEntry> = out
        .split(|b| *b == 0)
        .filter(|line| !line.is_empty())
        .filter_map(|line| {
            let line = String::from_utf8_lossy(line);
            let mut parts = line.splitn(5, '\t');
            let kind = match parts.next()? {
                "f" => "file",
                "d" => "dir",
                "l" => "symlink",
                _ => "other",
            };
            Some(DirEntry {
                size: parts.next()?.parse().ok()?,
                mode: parts.next()?.to_owned(),
                mtime: parts.next()?.parse().ok()?,
                name: parts.next()?.to_owned(),
                kind,
            })
        })
        .collect();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

/// Runs `request` on the bulk path and streams its stdout. A command that
/// fails before its first byte is the error here; one that fails later
/// ends the stream with an error (a download cut short, never a file
/// that looks whole). `keep` (the sandbox's lease) lives until the stream
/// ends; a receiver dropped (the client went away) stops the command.
pub async fn stream_out<K: Send + 'static>(
    sandbox: Arc<dyn Sandbox>,
    request: ExecRequest,
    keep: K,
) -> Result<mpsc::Receiver<std::io::Result<Bytes>>, TransferError> {
    let (body_tx, body_rx) = mpsc::channel(16);
    let (first_tx, first_rx) = oneshot::channel();
    tokio::spawn(async move {
        let _keep = keep;
        let (tx, mut rx) = mpsc::channel(64);
        let cancel = CancellationToken::new();
        let run = sandbox.exec_bulk(request, tx, cancel.clone());
        tokio::pin!(run);
        let mut first_tx = Some(first_tx);
        let mut stderr = Vec::new();
        let mut take = async |chunk: ExecChunk, rx: &mut mpsc::Receiver<ExecChunk>| match chunk {
            ExecChunk::Stdout(data) => {
                if let Some(first) = first_tx.take() {
                    let _ = first.send(Ok(()));
                }
                let data = gather(data, rx, &mut stderr);
                if body_tx.send(Ok(data)).await.is_err() {
                    cancel.cancel();
                }
            }
            ExecChunk::Stderr(data) => keep_stderr(&mut stderr, &data),
        };
        let status = loop {
            tokio::select! {
                status = &mut run => break status,
                Some(chunk) = rx.recv() => take(chunk, &mut rx).await,
            }
        };
        while let Some(chunk) = rx.recv().await {
            take(chunk, &mut rx).await;
        }
        let failed = match status {
            Ok(status) => failure(&status, &stderr),
            Err(e) => Some(e.into()),
        };
        match (first_tx.take(), failed) {
            (Some(first), failed) => {
                let _ = first.send(failed.map_or(Ok(()), Err));
            }
            (None, Some(e)) => {
                let _ = body_tx
                    .send(Err(std::io::Error::other(e.to_string())))
                    .await;
            }
            (None, None) => {}
        }
    });
    match first_rx.await {
        Ok(Ok(())) => Ok(body_rx),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(TransferError::Sandbox(SandboxError::Backend(
            "the transfer's exec stopped without a word".into(),
        ))),
    }
}

/// The most stdout bytes [`gather`] joins into one piece of a response.
const GATHERED: usize = 256 * 1024;

/// `first` joined with the stdout pieces already queued behind it, up to
/// [`GATHERED`] bytes (stderr met on the way is kept): when the client
/// reads slower than the sandbox writes, the response goes out in a few
/// large writes instead of one per piece of the exec's stream (at most
/// 32 KiB from docker). Nothing is waited for, and a lone piece is passed
/// on without a copy.
fn gather(first: Bytes, rx: &mut mpsc::Receiver<ExecChunk>, stderr: &mut Vec<u8>) -> Bytes {
    let mut joined: Option<bytes::BytesMut> = None;
    let mut size = first.len();
    while size < GATHERED {
        let Ok(chunk) = rx.try_recv() else { break };
        match chunk {
            ExecChunk::Stdout(data) => {
                let buffer = joined.get_or_insert_with(|| {
                    let mut buffer = bytes::BytesMut::with_capacity(GATHERED + 64 * 1024);
                    buffer.extend_from_slice(&first);
                    buffer
                });
                buffer.extend_from_slice(&data);
                size += data.len();
            }
            ExecChunk::Stderr(data) => keep_stderr(stderr, &data),
        }
    }
    joined.map_or(first, bytes::BytesMut::freeze)
}

/// Keeps the start of a command's stderr, up to [`STDERR_KEPT`] bytes.
fn keep_stderr(stderr: &mut Vec<u8>, data: &[u8]) {
    let room = STDERR_KEPT.saturating_sub(stderr.len());
    stderr.extend_from_slice(&data[..data.len().min(room)]);
}

/// Collects an exec's stdout (up to `limit`) and the start of its stderr.
async fn collect(
    sandbox: &dyn Sandbox,
    request: ExecRequest,
    limit: usize,
) -> Result<(ExecStatus, Vec<u8>, Vec<u8>), TransferError> {
    let (status, out) =
        super::exec_collect(sandbox, request, limit, CancellationToken::new(), |_| {}).await?;
    if out.truncated {
        return Err(TransferError::Path(format!(
            "the listing is longer than {limit} bytes"
        )));
    }
    Ok((status, out.stdout, out.stderr))
}

/// The error a script's exit status stands for; `None` for success.
fn failure(status: &ExecStatus, stderr: &[u8]) -> Option<TransferError> {
    let message = String::from_utf8_lossy(stderr).trim().to_owned();
    match status.exit_code {
        Some(0) => None,
        Some(MISSING) => Some(TransferError::Missing(message)),
        Some(ESCAPE_STATUS | NOT_A_DIRECTORY | A_DIRECTORY) => Some(TransferError::Path(message)),
        _ if status.timed_out => Some(TransferError::Sandbox(SandboxError::File(format!(
            "the transfer took longer than {} s",
            TRANSFER_TIMEOUT.as_secs()
        )))),
        _ if message.contains("No space left") => Some(TransferError::Full(message)),
        code => Some(TransferError::Sandbox(SandboxError::File(
            if message.is_empty() {
                format!("the transfer failed with exit status {code:?}")
            } else {
                message
            },
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_joins_queued_stdout_and_keeps_stderr() {
        let (tx, mut rx) = mpsc::channel(8);
        let first = Bytes::from_static(b"abc");
        // Nothing queued: the piece itself, not a copy.
        let alone = gather(first.clone(), &mut rx, &mut Vec::new());
        assert_eq!(alone.as_ptr(), first.as_ptr());

        tx.try_send(ExecChunk::Stdout(Bytes::from_static(b"def")))
            .unwrap();
        tx.try_send(ExecChunk::Stderr(Bytes::from_static(b"warn")))
            .unwrap();
        tx.try_send(ExecChunk::Stdout(Bytes::from_static(b"ghi")))
            .unwrap();
        let mut stderr = Vec::new();
        assert_eq!(&gather(first, &mut rx, &mut stderr)[..], b"abcdefghi");
        assert_eq!(stderr, b"warn");
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn gather_stops_at_its_size() {
        let (tx, mut rx) = mpsc::channel(8);
        let piece = Bytes::from(vec![7u8; GATHERED / 2]);
        for _ in 0..3 {
            tx.try_send(ExecChunk::Stdout(piece.clone())).unwrap();
        }
        let joined = gather(piece.clone(), &mut rx, &mut Vec::new());
        assert_eq!(joined.len(), GATHERED);
        // The rest waits for the next piece of the response.
        assert!(matches!(rx.try_recv(), Ok(ExecChunk::Stdout(_))));
    }
}
