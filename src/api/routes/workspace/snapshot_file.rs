//! One file of a turn end's snapshot (a tar in the data directory),
//! found and streamed without unpacking the rest.

use axum::body::Body;
use axum::response::Response;

use super::file_response;
use crate::api::http::error::ApiError;
use crate::sandbox::WORKSPACE;

/// One file of a snapshot (a tar on the data directory's disk), streamed.
pub(super) async fn from_snapshot(file: tokio::fs::File, path: &str) -> Result<Response, ApiError> {
    let wanted = path
        .strip_prefix(WORKSPACE)
        .unwrap_or(path)
        .trim_start_matches('/')
        .to_owned();
    let file = file.into_std().await;
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(16);
    let (found_tx, found_rx) = tokio::sync::oneshot::channel::<Result<(), ApiError>>();
    tokio::task::spawn_blocking(move || {
        let mut found_tx = Some(found_tx);
        let mut answer = |result: Result<(), ApiError>| {
            if let Some(found) = found_tx.take() {
                let _ = found.send(result);
            }
        };
        let mut archive = tar::Archive::new(std::io::BufReader::new(file));
        let entries = match archive.entries() {
            Ok(entries) => entries,
            Err(e) => {
                return answer(Err(ApiError::internal(format!(
                    "reading the snapshot: {e}"
                ))));
            }
        };
        for entry in entries {
            let mut entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    return answer(Err(ApiError::internal(format!(
                        "reading the snapshot: {e}"
                    ))));
                }
            };
            let name = entry
                .path()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.trim_start_matches("./").trim_end_matches('/') != wanted {
                continue;
            }
            if entry.header().entry_type() != tar::EntryType::Regular {
                return answer(Err(ApiError::unprocessable(
                    "bad_path",
                    format!("'{wanted}' is not a regular file in that snapshot"),
                )));
            }
            answer(Ok(()));
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match std::io::Read::read(&mut entry, &mut buf) {
                    Ok(0) => return,
                    Ok(n) => {
                        if tx
                            .blocking_send(Ok(bytes::Bytes::copy_from_slice(&buf[..n])))
                            .is_err()
                        {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ = tx.blocking_send(Err(e));
                        return;
                    }
                }
            }
        }
        answer(Err(ApiError::not_found(format!(
            "'{wanted}' is not in the workspace at that turn end"
        ))));
    });
    found_rx
        .await
        .map_err(|_| ApiError::internal("reading the snapshot stopped"))??;
    Ok(file_response(
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
        path,
    ))
}
