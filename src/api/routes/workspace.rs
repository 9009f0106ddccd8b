//! A session's workspace in and out: `PUT`/`GET
//! /agent/session/{id}/workspace` (a tar archive) and `PUT`/`GET
//! /agent/session/{id}/files/{*path}` (one file; a path ending in `/`
//! lists a directory).
//!
//! Uploads stream: the body is decoded (plain, gzip or zstd, told by its
//! magic bytes) and checked ([`crate::sandbox::archive`]) as it arrives,
//! each checked piece unpacked at once into a staging directory of the
//! workspace, which moves into place only once all of it passed, so a
//! refused archive changes nothing ([`workspace::Staged`]); one file is
//! spooled to the data directory first. An upload holds
//! the session between turns ([`crate::session::manager::BetweenTurns`]): it is a
//! 409 while a turn runs, and a turn waits for it. Downloads stream from
//! the sandbox (or from a turn end's snapshot with `at_seq`) to the client.
//! Among replicas the live workspace is the one holding the session's
//! sandbox: another passes such a request on to it ([`forward`]).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use tokio::io::BufReader;
use tokio_util::io::{ReaderStream, StreamReader};
use utoipa::{IntoParams, ToSchema};

use crate::agent::{AgentOptions, ToolRouter};
use crate::api::http::auth::Caller;
use crate::api::http::error::{ApiError, ErrorBody};
use crate::api::http::extract::ApiQuery;
use crate::api::http::state::AppState;
use crate::api::routes::agent::parse_id;
use crate::protocol::EventKind;
use crate::sandbox::files::confine;
use crate::sandbox::snapshots::{AtTurn, Snapshots};
use crate::sandbox::workspace::{self, DirEntry, TransferError};
use crate::sandbox::{SandboxError, SandboxManager, Stdin, WORKSPACE};
use crate::session::Session;
use crate::tools::place::Place;

pub mod changes;
pub mod form;
pub mod forward;
mod snapshot_file;
mod spool;

use forward::{Asked, elsewhere, pass_on};
use snapshot_file::from_snapshot;
use spool::{Limit, check_into, spool_raw, spooling_place};

/// Uploads the server receives at once; one more waits for a place up to
/// `http.body_timeout_s`, then is a 503. At most this many times
/// `sandbox.disk_mb` is spooled on the data directory's disk (files).
pub const MAX_SPOOLING: usize = 4;
/// The size of the pieces a snapshot file or a gzip stream is read in
/// for a response: `ReaderStream`'s default of 4 KiB made a 100 MB
/// snapshot 25,600 reads, each a hop to tokio's blocking pool.
const READ_PIECE: usize = 256 * 1024;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct UploadQuery {
    /// The directory to unpack into; relative paths are under
    /// `/workspace`, and it must be inside it. Default `/workspace`.
    path: Option<String>,
}

/// What an upload put into the workspace.
#[derive(Serialize, ToSchema)]
pub struct Uploaded {
    pub path: String,
    /// Files and links (directories are not counted).
    pub files: u64,
    /// The bytes of the files' contents.
    pub bytes: u64,
    /// The `seq` of the `workspace_uploaded` event in the session's log.
    pub seq: u64,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DownloadQuery {
    /// The directory to download, inside `/workspace` (default the whole).
    path: Option<String>,
    /// A turn end whose snapshot to download, instead of the live sandbox.
    at_seq: Option<u64>,
    /// `tar` (default) or `tar.gz`.
    format: Option<String>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct FileQuery {
    /// A turn end whose snapshot to read, instead of the live sandbox.
    at_seq: Option<u64>,
}

/// A directory's entries.
#[derive(Serialize, ToSchema)]
pub struct Listing {
    pub path: String,
    pub entries: Vec<DirEntry>,
}

/// Whether a request's body streams to its handler rather than being read
/// whole first (`max_body_bytes` does not apply; the sandbox's disk does).
pub fn streams_body(method: &axum::http::Method, path: &str) -> bool {
    if method != axum::http::Method::PUT {
        return false;
    }
    let Some(rest) = path.strip_prefix("/agent/session/") else {
        return false;
    };
    let mut parts = rest.splitn(3, '/');
    let (_, kind) = (parts.next(), parts.next());
    match kind {
        Some("workspace") => parts.next().is_none(),
        Some("files") => parts.next().is_some_and(|p| !p.is_empty()),
        _ => false,
    }
}

/// Unpacks a tar archive (plain, gzip or zstd) into the session's
/// workspace, between turns. Before the session's first tool call its
/// sandbox is made now. Refused entries are a 422 naming the entry, an
/// archive past the sandbox's disk a 413, a running turn a 409; nothing is
/// unpacked unless all of it passed.
#[utoipa::path(put, path = "/agent/session/{session_id}/workspace",
    params(("session_id" = Uuid, Path), UploadQuery),
    request_body(content = Vec<u8>, content_type = "application/x-tar"),
    responses((status = 200, body = Uploaded), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 502, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn upload(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<UploadQuery>,
    asked: Asked,
    body: Body,
) -> Result<Response, ApiError> {
    let target = Target::of(&state, &caller, &id).await?;
    let dir = confine(query.path.as_deref().unwrap_or(WORKSPACE), WORKSPACE)
        .map_err(|e| ApiError::unprocessable("bad_path", e.to_string()))?;
    if let Some(holder) = elsewhere(&state, &target, &asked).await? {
        return pass_on(&state, &holder, asked, body).await;
    }
    let uploaded = unpack_into(&state, &target, dir, body).await?;
    Ok(Json(uploaded).into_response())
}

/// Spools an archive and unpacks it into `dir` of the target's
/// workspace, holding the session between turns.
async fn unpack_into(
    state: &AppState,
    target: &Target<'_>,
    dir: String,
    body: Body,
) -> Result<Uploaded, ApiError> {
    let _place = spooling_place(state).await?;
    let held = target.hold(state).await?;
    let result = async {
        let limit = target.disk_limit();
        let lease = target.live_lease().await?;
        // Unpacked as it is checked, into a staging directory moved into
        // place once all of it passed.
        let mut staged = workspace::Staged::start(lease.sandbox.clone());
        let (files, bytes) = match check_into(state, body, limit, &mut staged).await {
            Ok(counts) => counts,
            Err(e) => {
                staged.abandon().await;
                return Err(e);
            }
        };
        staged.commit(&dir).await.map_err(transfer_error)?;
        target
            .uploaded(&held.session, dir.clone(), files, bytes)
            .await
    }
    .await;
    held.release().await;
    result
}

/// Writes one file of the session's workspace from the raw body, making
/// its directories; between turns, as an archive upload.
#[utoipa::path(put, path = "/agent/session/{session_id}/files/{path}",
    params(("session_id" = Uuid, Path), ("path" = String, Path)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, body = Uploaded), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 502, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub async fn put_file(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, path)): Path<(String, String)>,
    asked: Asked,
    body: Body,
) -> Result<Response, ApiError> {
    let target = Target::of(&state, &caller, &id).await?;
    if path.ends_with('/') {
        return Err(ApiError::unprocessable(
            "bad_path",
            format!("'{path}' names a directory; upload a tar to …/workspace?path= instead"),
        ));
    }
    let file = confine(&path, WORKSPACE)
        .map_err(|e| ApiError::unprocessable("bad_path", e.to_string()))?;
    if let Some(holder) = elsewhere(&state, &target, &asked).await? {
        return pass_on(&state, &holder, asked, body).await;
    }
    let uploaded = write_one(&state, &target, file, body).await?;
    Ok(Json(uploaded).into_response())
}

/// Spools one file and writes it at `file` of the target's workspace,
/// holding the session between turns.
async fn write_one(
    state: &AppState,
    target: &Target<'_>,
    file: String,
    body: Body,
) -> Result<Uploaded, ApiError> {
    let _place = spooling_place(state).await?;
    let held = target.hold(state).await?;
    let result = async {
        let limit = target.disk_limit();
        let spooled = spool_raw(state, body, limit).await?;
        let lease = target.live_lease().await?;
        workspace::write_file(
            lease.sandbox.as_ref(),
            &file,
            Stdin::File(spooled.path.clone()),
        )
        .await
        .map_err(transfer_error)?;
        target
            .uploaded(&held.session, file.clone(), 1, spooled.counts.1)
            .await
    }
    .await;
    held.release().await;
    result
}

/// Streams the session's workspace (or a directory of it) as a tar, from
/// its live sandbox, or from the snapshot of the turn end `at_seq`.
#[utoipa::path(get, path = "/agent/session/{session_id}/workspace",
    params(("session_id" = Uuid, Path), DownloadQuery),
    responses((status = 200, description = "a tar archive (gzip with format=tar.gz)",
            content_type = "application/x-tar"),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 502, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub async fn download(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<DownloadQuery>,
    asked: Asked,
) -> Result<Response, ApiError> {
    let gzip = match query.format.as_deref() {
        None | Some("tar") => false,
        Some("tar.gz") | Some("tgz") => true,
        Some(other) => {
            return Err(ApiError::unprocessable(
                "bad_format",
                format!("format '{other}': use tar or tar.gz"),
            ));
        }
    };
    let target = Target::of(&state, &caller, &id).await?;
    let dir = confine(query.path.as_deref().unwrap_or(WORKSPACE), WORKSPACE)
        .map_err(|e| ApiError::unprocessable("bad_path", e.to_string()))?;
    let name = format!("{}.tar", target.session.id);
    let stream: Body = match query.at_seq {
        Some(seq) => {
            if dir != WORKSPACE {
                return Err(ApiError::unprocessable(
                    "bad_path",
                    "a turn end's snapshot downloads whole: leave out path with at_seq",
                ));
            }
            let file = target.snapshot_file(seq).await?;
            Body::from_stream(ReaderStream::with_capacity(file, READ_PIECE))
        }
        None => {
            if let Some(holder) = elsewhere(&state, &target, &asked).await? {
                return pass_on(&state, &holder, asked, Body::empty()).await;
            }
            let lease = target.live_lease().await?;
            let sandbox = lease.sandbox.clone();
            let rx = workspace::stream_out(sandbox, workspace::pack_request(&dir), lease)
                .await
                .map_err(transfer_error)?;
            Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        }
    };
    Ok(archive_response(stream, &name, gzip))
}

/// Streams one file of the session's workspace (from the live sandbox, or
/// the snapshot of the turn end `at_seq`); a path ending in `/` lists that
/// directory of the live sandbox.
#[utoipa::path(get, path = "/agent/session/{session_id}/files/{path}",
    params(("session_id" = Uuid, Path), ("path" = String, Path), FileQuery),
    responses((status = 200, description = "the file's bytes, or a Listing for a path ending in /",
            content_type = "application/octet-stream"),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn get_file(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, path)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<FileQuery>,
    asked: Asked,
) -> Result<Response, ApiError> {
    let target = Target::of(&state, &caller, &id).await?;
    let listing = path.ends_with('/');
    let file = confine(&path, WORKSPACE)
        .map_err(|e| ApiError::unprocessable("bad_path", e.to_string()))?;
    if let Some(seq) = query.at_seq {
        if listing {
            return Err(ApiError::unprocessable(
                "bad_path",
                "listing a turn end's snapshot is not offered; download it with …/workspace?at_seq=",
            ));
        }
        let snapshot = target.snapshot_file(seq).await?;
        return from_snapshot(snapshot, &file).await;
    }
    if let Some(holder) = elsewhere(&state, &target, &asked).await? {
        return pass_on(&state, &holder, asked, Body::empty()).await;
    }
    let lease = target.live_lease().await?;
    if listing {
        let entries = workspace::list_dir(lease.sandbox.as_ref(), &file)
            .await
            .map_err(transfer_error)?;
        return Ok(Json(Listing {
            path: file,
            entries,
        })
        .into_response());
    }
    let sandbox = lease.sandbox.clone();
    let rx = workspace::stream_out(sandbox, workspace::read_request(&file), lease)
        .await
        .map_err(transfer_error)?;
    Ok(file_response(
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
        &file,
    ))
}

/// Lists the workspace's top directory (`…/files/`).
#[utoipa::path(get, path = "/agent/session/{session_id}/files/",
    params(("session_id" = Uuid, Path)),
    responses((status = 200, body = Listing), (status = 404, body = ErrorBody)))]
pub async fn list_root(
    state: State<AppState>,
    caller: Extension<Caller>,
    Path(id): Path<String>,
    asked: Asked,
) -> Result<Response, ApiError> {
    get_file(
        state,
        caller,
        Path((id, "/workspace/".to_owned())),
        ApiQuery(FileQuery { at_seq: None }),
        asked,
    )
    .await
}

/// The session a workspace route acts on, checked against the caller.
struct Target<'a> {
    session: Arc<Session>,
    sandboxes: &'a SandboxManager,
    tools: &'a Arc<dyn ToolRouter>,
    place: Place,
    options: AgentOptions,
}

impl<'a> Target<'a> {
    async fn of(state: &'a AppState, caller: &Caller, id: &str) -> Result<Target<'a>, ApiError> {
        let session = state.sessions.get(parse_id(id)?, caller.owner()).await?;
        if session.kind != crate::protocol::SessionKind::AGENT {
            return Err(ApiError::unprocessable(
                "no_workspace",
                format!(
                    "session {} is a {} session; only agent sessions have a workspace",
                    session.id,
                    session.kind.as_str()
                ),
            ));
        }
        let sandboxes = state.sandboxes.as_deref().ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "no_sandboxes",
                "this server runs no sandboxes, so sessions have no workspace",
            )
        })?;
        let options = AgentOptions::deserialize(session.options.as_ref()).map_err(|e| {
            ApiError::unprocessable("no_workspace", format!("session {}: {e}", session.id))
        })?;
        let place = Place::session(sandboxes, session.id, &options, session.owner.clone())
            .map_err(|e| ApiError::unprocessable("no_workspace", e.0))?;
        Ok(Target {
            session,
            sandboxes,
            tools: &state.tools,
            place,
            options,
        })
    }

    /// The session held between turns; 409 while a turn runs. What the
    /// next turn changes is told from its own start, not the last turn's
    /// end: this write comes between.
    async fn hold(
        &self,
        state: &AppState,
    ) -> Result<crate::session::manager::BetweenTurns, ApiError> {
        if let Some(mcp) = &state.mcp {
            mcp.tools.baselines.forget(self.session.id);
        }
        state
            .sessions
            .hold_between_turns(self.session.clone())
            .await
            .map_err(|e| match e {
                crate::session::SessionError::Busy(id) => ApiError::new(
                    StatusCode::CONFLICT,
                    "session_busy",
                    format!(
                        "session {id} is running a turn (its log is at seq {}); upload when its result has come",
                        self.session.last_seq()
                    ),
                ),
                other => ApiError::from(other),
            })
    }

    /// The most an upload may unpack: the sandbox's disk.
    fn disk_limit(&self) -> Limit {
        let disk_mb = self.place.spec().disk_mb;
        Limit {
            bytes: disk_mb.saturating_mul(1024 * 1024),
            name: format!("the sandbox's disk, sandbox.disk_mb = {disk_mb}"),
        }
    }

    /// The session's live sandbox, made if it has none yet (then its
    /// workspace is empty, or its `from_snapshot`). Among replicas only
    /// the one holding it reaches it: on another this is a 409 naming it,
    /// and a session nobody holds yet becomes this replica's, as with its
    /// first tool call.
    async fn live_lease(&self) -> Result<crate::sandbox::Lease, ApiError> {
        if let Err(why) = self.tools.hold_workspace(self.session.id).await {
            return Err(forward::not_held(self.session.id, why));
        }
        self.place.lease(self.sandboxes).await.map_err(lease_error)
    }

    /// Logs the upload in `session` (as the hold between turns has it,
    /// up to date with other replicas); its answer.
    async fn uploaded(
        &self,
        session: &Session,
        path: String,
        files: u64,
        bytes: u64,
    ) -> Result<Uploaded, ApiError> {
        let seq = session
            .emit(EventKind::WorkspaceUploaded {
                path: path.clone(),
                files,
                bytes,
                source: None,
            })
            .map_err(ApiError::internal)?;
        session.flush().await.map_err(ApiError::internal)?;
        // The workspace as the upload left it: a point to fork at and to
        // compare the next turn's changes with.
        self.sandboxes
            .snapshot_turn(session.id, session.owner.as_deref(), seq);
        Ok(Uploaded {
            path,
            files,
            bytes,
            seq,
        })
    }

    /// The server's snapshots; a 409 where it keeps none.
    fn snapshots(&self) -> Result<&'a Snapshots, ApiError> {
        self.sandboxes
            .snapshots()
            .map(|s| s.as_ref())
            .filter(|s| s.keep_last() > 0)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::CONFLICT,
                    "no_snapshots",
                    "this server keeps no workspace snapshots (sandbox.snapshots.keep_last = 0)",
                )
            })
    }

    /// The snapshot file of the turn end `seq`, opened.
    async fn snapshot_file(&self, seq: u64) -> Result<tokio::fs::File, ApiError> {
        let snapshots = self.snapshots()?;
        self.tools.snapshots_settled(self.session.id).await;
        match snapshots
            .at_turn(self.session.id, seq)
            .await
            .map_err(ApiError::internal)?
        {
            AtTurn::Kept(snapshot) => snapshots.open(&snapshot).await.map_err(ApiError::internal),
            AtTurn::Before => Err(ApiError::new(
                StatusCode::CONFLICT,
                "no_snapshot",
                format!(
                    "session {} had no workspace at seq {seq} (no snapshot before its first tool call, or seq is not a turn end)",
                    self.session.id
                ),
            )),
            AtTurn::Dropped(kept) => Err(ApiError::new(
                StatusCode::CONFLICT,
                "snapshot_dropped",
                format!("the workspace at seq {seq} is no longer kept; kept turn ends: {kept:?}"),
            )),
        }
    }
}

fn transfer_error(e: TransferError) -> ApiError {
    match e {
        TransferError::Missing(m) => ApiError::not_found(m),
        TransferError::Path(m) => ApiError::unprocessable("bad_path", m),
        TransferError::Full(m) => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "sandbox_disk_full",
            format!("the sandbox's disk is full (sandbox.disk_mb): {m}"),
        ),
        TransferError::Refused(m) => ApiError::unprocessable("bad_archive", m),
        TransferError::Sandbox(e) => lease_error(e),
    }
}

fn lease_error(e: SandboxError) -> ApiError {
    match e {
        SandboxError::Quota(e) => ApiError::from(e),
        SandboxError::Capacity(_) | SandboxError::Unavailable(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "sandbox_unavailable",
            e.to_string(),
        ),
        SandboxError::InvalidPath(m) => ApiError::unprocessable("bad_path", m),
        other => ApiError::internal(other),
    }
}

fn archive_response(body: Body, name: &str, gzip: bool) -> Response {
    let (body, content_type, name) = if gzip {
        let reader = StreamReader::new(body.into_data_stream().map_err(std::io::Error::other));
        let encoder = async_compression::tokio::bufread::GzipEncoder::new(BufReader::new(reader));
        (
            Body::from_stream(ReaderStream::with_capacity(encoder, READ_PIECE)),
            "application/gzip",
            format!("{name}.gz"),
        )
    } else {
        (body, "application/x-tar", name.to_owned())
    };
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Ok(value) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    response
}

fn file_response(body: Body, path: &str) -> Response {
    let mime = mime_guess::from_path(path).first_or_octet_stream();
    let mut response = body.into_response();
    if let Ok(value) = HeaderValue::from_str(mime.as_ref()) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response
}
