//! An upload's body, decoded and checked as it arrives: an archive's
//! checked pieces go to the sandbox's tar in a staging directory at once
//! ([`Staged`]); one file is written to the data directory (`uploads/`)
//! before it reaches the sandbox.

use std::path::PathBuf;
use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use futures::TryStreamExt;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio_util::io::StreamReader;

use crate::api::http::error::ApiError;
use crate::api::http::state::AppState;
use crate::sandbox::archive::{ArchiveCheck, Refusal};
use crate::sandbox::workspace::Staged;
use bytes::BytesMut;

/// The most an upload may hold, and what the error names.
pub(super) struct Limit {
    pub(super) bytes: u64,
    pub(super) name: String,
}

/// An upload written to the data directory, removed when dropped.
pub(super) struct Spooled {
    pub(super) path: PathBuf,
    /// Files and bytes of their contents.
    pub(super) counts: (u64, u64),
}

impl Drop for Spooled {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Bytes of an archive handed to the sandbox's tar at once.
const PIECE: usize = 512 * 1024;

/// How long an upload's body may stall between two pieces.
fn idle(state: &AppState) -> Duration {
    Duration::from_secs(state.config.http.body_timeout_s)
}

/// Decodes and checks an archive body, handing each checked piece to the
/// sandbox's tar as it comes ([`Staged`]); the files and bytes it holds.
/// Nothing is moved into place here: the caller commits or abandons.
pub(super) async fn check_into(
    state: &AppState,
    body: Body,
    limit: Limit,
    staged: &mut Staged,
) -> Result<(u64, u64), ApiError> {
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    let mut reader = BufReader::with_capacity(64 * 1024, StreamReader::new(stream));
    let head = read_head(&mut reader, idle(state)).await?;
    let mut decoded = crate::sandbox::archive::decoder(&head, reader).ok_or_else(|| {
        ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_compression",
            crate::sandbox::archive::UNSUPPORTED_COMPRESSION,
        )
    })?;
    let mut check = ArchiveCheck::new(limit.bytes, limit.name);
    let mut buf = vec![0u8; 256 * 1024];
    // A client's body comes in pieces as small as a few KiB: checked bytes
    // are gathered into large ones, each a write to the sandbox's tar.
    let mut gathered = BytesMut::with_capacity(PIECE);
    loop {
        let n = read_within(&mut decoded, &mut buf, idle(state)).await?;
        if n == 0 {
            break;
        }
        let pass = check.feed(&buf[..n]).map_err(refusal_error)?;
        gathered.extend_from_slice(&buf[..pass]);
        if gathered.len() >= PIECE {
            let piece = gathered.split().freeze();
            staged.send(piece).await.map_err(super::transfer_error)?;
            gathered.reserve(PIECE);
        }
    }
    let end = check.finish().map_err(refusal_error)?;
    gathered.extend_from_slice(end);
    staged
        .send(gathered.freeze())
        .await
        .map_err(super::transfer_error)?;
    Ok((check.files, check.bytes))
}

/// A raw body into a file of the data directory, within `limit`.
pub(super) async fn spool_raw(
    state: &AppState,
    body: Body,
    limit: Limit,
) -> Result<Spooled, ApiError> {
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    let mut reader = StreamReader::new(stream);
    let (spooled, mut file) = spool_file(state).await?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        let n = read_within(&mut reader, &mut buf, idle(state)).await?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if total > limit.bytes {
            return Err(refusal_error(Refusal::TooLarge {
                limit: limit.bytes,
                what: limit.name,
            }));
        }
        file.write_all(&buf[..n]).await.map_err(spool_error)?;
    }
    file.flush().await.map_err(spool_error)?;
    let mut spooled = spooled;
    spooled.counts = (1, total);
    Ok(spooled)
}

async fn spool_file(
    state: &AppState,
) -> Result<(Spooled, tokio::io::BufWriter<tokio::fs::File>), ApiError> {
    let dir = state.config.data_dir.join("uploads");
    tokio::fs::create_dir_all(&dir).await.map_err(spool_error)?;
    let path = dir.join(format!("{}.part", uuid::Uuid::new_v4().simple()));
    let file = tokio::fs::File::create(&path).await.map_err(spool_error)?;
    // Large writes: each write of a tokio file is a hop to the blocking pool.
    let file = tokio::io::BufWriter::with_capacity(1 << 20, file);
    Ok((
        Spooled {
            path,
            counts: (0, 0),
        },
        file,
    ))
}

/// The first bytes of the body (up to 4), for its magic number.
async fn read_head<R>(reader: &mut BufReader<R>, idle: Duration) -> Result<Vec<u8>, ApiError>
where
    R: AsyncRead + Unpin,
{
    let filled = tokio::time::timeout(idle, reader.fill_buf())
        .await
        .map_err(|_| body_timeout(idle))?
        .map_err(body_error)?;
    Ok(filled[..filled.len().min(4)].to_vec())
}

async fn read_within<R>(reader: &mut R, buf: &mut [u8], idle: Duration) -> Result<usize, ApiError>
where
    R: AsyncRead + Unpin + ?Sized,
{
    tokio::time::timeout(idle, reader.read(buf))
        .await
        .map_err(|_| body_timeout(idle))?
        .map_err(body_error)
}

fn body_timeout(idle: Duration) -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "body_timeout",
        format!(
            "the upload stalled for {} s (http.body_timeout_s)",
            idle.as_secs()
        ),
    )
}

/// A body that cannot be read or decoded.
fn body_error(e: std::io::Error) -> ApiError {
    let message = e.to_string();
    if e.kind() == std::io::ErrorKind::InvalidData || e.kind() == std::io::ErrorKind::UnexpectedEof
    {
        ApiError::unprocessable(
            "bad_archive",
            format!("the archive cannot be decoded: {message}"),
        )
    } else {
        ApiError::bad_request(format!("cannot read the request body: {message}"))
    }
}

fn spool_error(e: std::io::Error) -> ApiError {
    ApiError::internal(format!("spooling the upload: {e}"))
}

pub(super) fn refusal_error(refusal: Refusal) -> ApiError {
    match &refusal {
        Refusal::Entry { .. } => ApiError::unprocessable("unsafe_entry", refusal.to_string()),
        Refusal::TooLarge { .. } => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            refusal.to_string(),
        ),
        Refusal::Malformed(_) => ApiError::unprocessable("bad_archive", refusal.to_string()),
    }
}

/// A place among the uploads spooled at once, waited for up to
/// `http.body_timeout_s`.
pub(super) async fn spooling_place(
    state: &AppState,
) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    let wait = std::time::Duration::from_secs(state.config.http.body_timeout_s);
    match tokio::time::timeout(wait, state.uploads.clone().acquire_owned()).await {
        Ok(Ok(permit)) => Ok(permit),
        _ => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "uploads_busy",
            format!(
                "{} uploads are being received already; retry when one has finished",
                super::MAX_SPOOLING
            ),
        )),
    }
}
