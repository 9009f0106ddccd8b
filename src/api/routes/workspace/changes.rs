//! `GET /agent/session/{id}/changes`: what changed in the workspace between
//! two turn ends (by default the last turn), from their snapshots.

use std::collections::BTreeMap;
use std::path::PathBuf;

use axum::Extension;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::Target;
use crate::api::http::auth::Caller;
use crate::api::http::error::{ApiError, ErrorBody};
use crate::api::http::extract::ApiQuery;
use crate::api::http::state::AppState;
use crate::sandbox::changes::{self, FileChange};
use crate::sandbox::snapshots::{AtTurn, Snapshots};

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ChangesQuery {
    /// The earlier turn end (default: the one before `to_seq`, or the
    /// workspace the session started with).
    from_seq: Option<u64>,
    /// The later turn end (default: the latest with a snapshot).
    to_seq: Option<u64>,
    /// `json` (default) or `patch`, a unified diff `git apply` takes.
    format: Option<String>,
}

/// The files that differ between two turn ends.
#[derive(Serialize, ToSchema)]
pub struct Changes {
    /// None: the workspace the session started with.
    pub from_seq: Option<u64>,
    pub to_seq: u64,
    pub files: Vec<FileChange>,
}

/// What changed in the session's workspace between two turn ends (or an
/// upload's point): the files added, modified and deleted, as JSON or as
/// a patch. Directories, permission-only changes and `.git/` are not
/// listed; binary files are named, not inlined.
#[utoipa::path(get, path = "/agent/session/{session_id}/changes",
    params(("session_id" = Uuid, Path), ChangesQuery),
    responses((status = 200, description = "JSON, or text/x-diff with format=patch",
            content((Changes = "application/json"), (String = "text/x-diff"))),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub async fn changes(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<ChangesQuery>,
) -> Result<Response, ApiError> {
    let as_patch = match query.format.as_deref() {
        None | Some("json") => false,
        Some("patch") | Some("diff") => true,
        Some(other) => {
            return Err(ApiError::unprocessable(
                "bad_format",
                format!("format '{other}': use json or patch"),
            ));
        }
    };
    let target = Target::of(&state, &caller, &id).await?;
    let snapshots = target.snapshots()?;
    target.tools.snapshots_settled(target.session.id).await;
    let mut ends: BTreeMap<u64, ()> = BTreeMap::new();
    for snapshot in snapshots
        .of_session(target.session.id)
        .await
        .map_err(ApiError::internal)?
    {
        ends.extend(snapshot.turns.iter().map(|seq| (*seq, ())));
    }
    let to = match query.to_seq {
        Some(seq) => seq,
        None => *ends.keys().next_back().ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                "no_snapshot",
                format!(
                    "session {} has no turn end with a workspace yet (no tool call, and no upload)",
                    target.session.id
                ),
            )
        })?,
    };
    let from = match query.from_seq {
        Some(seq) if seq > to => {
            return Err(ApiError::unprocessable(
                "bad_range",
                format!("from_seq {seq} is after to_seq {to}"),
            ));
        }
        Some(seq) => Some(seq),
        None => ends.range(..to).next_back().map(|(seq, _)| *seq),
    };
    let after = side(&target, snapshots, Some(to)).await?;
    let before = side(&target, snapshots, from).await?;
    let computed = tokio::task::spawn_blocking(move || {
        let files = changes::changes(before.as_deref(), after.as_deref())?;
        let patch = if as_patch {
            Some(changes::patch(before.as_deref(), after.as_deref(), &files)?)
        } else {
            None
        };
        Ok::<_, std::io::Error>((files, patch))
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(|e| ApiError::internal(format!("comparing the snapshots: {e}")))?;
    // The dashboard shows these: the session's secrets go as from a tool.
    let scrubber = target.place.scrubber();
    let (mut files, patch) = computed;
    for file in &mut files {
        file.path = scrubber.scrub(&file.path);
    }
    Ok(match (files, patch.map(|p| scrubber.scrub(&p))) {
        (_, Some(patch)) => {
            let mut response = patch.into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/x-diff; charset=utf-8"),
            );
            response
        }
        (files, None) => Json(Changes {
            from_seq: from,
            to_seq: to,
            files,
        })
        .into_response(),
    })
}

/// The snapshot file of the workspace at `seq` (`None`: before the first
/// turn end); `None` for an empty workspace.
async fn side(
    target: &Target<'_>,
    snapshots: &Snapshots,
    seq: Option<u64>,
) -> Result<Option<PathBuf>, ApiError> {
    let at = match seq {
        Some(seq) => snapshots
            .at_turn(target.session.id, seq)
            .await
            .map_err(ApiError::internal)?,
        None => AtTurn::Before,
    };
    let snapshot = match at {
        AtTurn::Kept(snapshot) => snapshot,
        AtTurn::Before => {
            // The workspace it started with: empty, or its own seed.
            let seed = target
                .options
                .sandbox
                .as_ref()
                .and_then(|s| s.from_snapshot.as_deref());
            let Some(seed) = seed else { return Ok(None) };
            match snapshots.get(seed).await.map_err(ApiError::internal)? {
                Some(snapshot) => snapshot,
                None => {
                    return Err(ApiError::new(
                        StatusCode::CONFLICT,
                        "snapshot_dropped",
                        format!("the snapshot {seed} the session started from is gone"),
                    ));
                }
            }
        }
        AtTurn::Dropped(kept) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "snapshot_dropped",
                format!(
                    "the workspace at seq {} is no longer kept; kept turn ends: {kept:?}",
                    seq.unwrap_or_default()
                ),
            ));
        }
    };
    snapshots
        .local_path(&snapshot)
        .await
        .map(Some)
        .map_err(ApiError::internal)
}
