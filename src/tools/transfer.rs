//! `upload` and `download` for MCP clients: a workspace's files in and
//! out as a base64 tar inside the tool call, for archives small enough to
//! travel in a JSON message ([`MAX_TRANSFER_BYTES`]). Larger ones go
//! through `PUT`/`GET /agent/session/{id}/workspace`, which stream.
//!
//! An upload is checked entry by entry as the HTTP route checks it
//! ([`crate::sandbox::archive`]: no absolute paths or `..`, no entry
//! under a link an earlier entry made, no devices, within the sandbox's
//! disk) before the sandbox's own `tar` unpacks any of it.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use tokio::io::AsyncReadExt;

use super::schema::{DownloadArchive, Downloaded, UploadArchive, Uploaded};
use super::{Invocation, ToolError, Toolbox};
use crate::sandbox::archive::ArchiveCheck;
use crate::sandbox::files::confine;
use crate::sandbox::{Stdin, WORKSPACE, workspace};

/// The most an archive may be, compressed or not, in a tool call.
pub const MAX_TRANSFER_BYTES: usize = 16 * 1024 * 1024;

/// Unpacks `archive_base64` (a tar: plain, gzip or zstd) into the
/// directory `path` of the call's workspace.
pub async fn upload(
    tools: &Toolbox,
    call: &Invocation,
    args: UploadArchive,
) -> Result<Uploaded, ToolError> {
    let dir = confine(args.path.as_deref().unwrap_or(WORKSPACE), WORKSPACE)
        .map_err(|e| ToolError(e.to_string()))?;
    if args.archive_base64.len() > MAX_TRANSFER_BYTES / 3 * 4 + 4 {
        return Err(too_large("upload"));
    }
    let packed = STANDARD
        .decode(args.archive_base64.trim())
        .map_err(|e| ToolError(format!("archive_base64 is not base64: {e}")))?;
    let disk_mb = call.place.spec().disk_mb;
    let limit = disk_mb.saturating_mul(1024 * 1024);
    let mut check = ArchiveCheck::new(
        limit,
        format!("the sandbox's disk, sandbox.disk_mb = {disk_mb}"),
    );
    let tar = decode(&packed, &mut check).await?;
    let lease = tools.lease(&call.place).await?;
    workspace::unpack(lease.sandbox.as_ref(), &dir, Stdin::Bytes(tar.into()))
        .await
        .map_err(|e| ToolError(e.to_string()))?;
    Ok(Uploaded {
        path: dir,
        files: check.files,
        bytes: check.bytes,
    })
}

/// The directory `path` of the call's workspace as a base64 gzip tar.
pub async fn download(
    tools: &Toolbox,
    call: &Invocation,
    args: DownloadArchive,
) -> Result<Downloaded, ToolError> {
    let dir = confine(args.path.as_deref().unwrap_or(WORKSPACE), WORKSPACE)
        .map_err(|e| ToolError(e.to_string()))?;
    let lease = tools.lease(&call.place).await?;
    let tar = workspace::pack_bounded(lease.sandbox.as_ref(), &dir, MAX_TRANSFER_BYTES)
        .await
        .map_err(|e| ToolError(e.to_string()))?
        .ok_or_else(|| too_large("download"))?;
    let mut encoder = async_compression::tokio::bufread::GzipEncoder::new(tar.as_slice());
    let mut packed = Vec::new();
    encoder
        .read_to_end(&mut packed)
        .await
        .map_err(|e| ToolError(format!("compressing the archive: {e}")))?;
    Ok(Downloaded {
        path: dir,
        tar_bytes: tar.len() as u64,
        archive_base64: STANDARD.encode(&packed),
    })
}

/// The tar in `packed` (told plain, gzip or zstd by its first bytes),
/// checked entry by entry, with its end-of-archive blocks.
async fn decode(packed: &[u8], check: &mut ArchiveCheck) -> Result<Vec<u8>, ToolError> {
    let mut reader = crate::sandbox::archive::decoder(packed, packed)
        .ok_or_else(|| ToolError(crate::sandbox::archive::UNSUPPORTED_COMPRESSION.into()))?;
    let refused = |e| ToolError(format!("the archive is refused: {e}"));
    let mut tar = Vec::new();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = reader
            .read(&mut buffer)
            .await
            .map_err(|e| ToolError(format!("the archive does not decode: {e}")))?;
        if read == 0 {
            break;
        }
        let passed = check.feed(&buffer[..read]).map_err(refused)?;
        tar.extend_from_slice(&buffer[..passed]);
    }
    tar.extend_from_slice(check.finish().map_err(refused)?);
    Ok(tar)
}

fn too_large(what: &str) -> ToolError {
    ToolError(format!(
        "an archive of more than {} MiB does not fit a tool call; {what} it with \
         PUT or GET /agent/session/{{id}}/workspace, which stream",
        MAX_TRANSFER_BYTES / (1024 * 1024)
    ))
}
