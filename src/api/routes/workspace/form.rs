//! `POST /agent/session` and `POST /agent/run` with a
//! `multipart/form-data` body: the JSON request and the user's files in
//! one request, for a run on the user's code.
//!
//! The first part, named `request`, is the JSON body the route takes
//! otherwise. Every later part goes into the new session's workspace
//! before its first turn: one named `workspace` is a tar archive (plain,
//! gzip or zstd) unpacked into `/workspace`; any other part with a
//! filename is written as that file, its filename a path under
//! `/workspace` (`-F 'file=@main.py;filename=src/main.py'`). Each is
//! checked, spooled and unpacked as the workspace routes do it, and logged
//! as `workspace_uploaded`. A part that is refused deletes the session:
//! the request leaves nothing behind.

use axum::Extension;
use axum::body::Body as HttpBody;
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::{Target, Uploaded, unpack_into, write_one};
use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::api::http::extract::Body;
use crate::api::http::state::AppState;
use crate::api::routes::agent::{self, CreateSessionRequest, RunRequest};
use crate::protocol::SessionKind;
use crate::sandbox::WORKSPACE;
use crate::sandbox::files::confine;

/// Whether a request is a form these routes read.
pub fn is_form(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|kind| {
            kind.split(';')
                .next()
                .is_some_and(|e| e.trim().eq_ignore_ascii_case("multipart/form-data"))
        })
}

/// Whether a request's form body streams to its handler (it carries
/// files; `max_body_bytes` holds for its `request` part).
pub fn streams_form(method: &axum::http::Method, path: &str, headers: &HeaderMap) -> bool {
    method == axum::http::Method::POST
        && matches!(path, "/agent/session" | "/agent/run")
        && is_form(headers)
}

/// `POST /agent/session`: JSON as ever, or a form with files.
pub async fn create_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    request: Request,
) -> Result<Response, ApiError> {
    if !is_form(request.headers()) {
        let body = Body::<CreateSessionRequest>::from_request(request, &state).await?;
        return agent::create_session(State(state), Extension(caller), body)
            .await
            .map(IntoResponse::into_response);
    }
    let mut form = Form::read(request)?;
    let body: CreateSessionRequest = form.request(&state).await?;
    if body
        .kind
        .as_deref()
        .is_some_and(|k| k != SessionKind::AGENT.as_str())
    {
        return Err(ApiError::unprocessable(
            "no_workspace",
            "only agent sessions have a workspace to upload into",
        ));
    }
    let mut created = agent::create_session_from(&state, &caller, body).await?;
    created.uploaded = form.upload_all(&state, &caller, created.session_id).await?;
    Ok((StatusCode::CREATED, axum::Json(created)).into_response())
}

/// `POST /agent/run`: JSON as ever, or a form with files, which go into
/// the run's workspace before its turn starts.
pub async fn run(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    if !is_form(request.headers()) {
        let body = Body::<RunRequest>::from_request(request, &state).await?;
        return agent::run(State(state), Extension(caller), headers, body).await;
    }
    let mut form = Form::read(request)?;
    let body: RunRequest = form.request(&state).await?;
    let (new, prompt) = agent::prepare_run(&state, &caller, body).await?;
    // Stored now, unlike a JSON run's: the uploads write to its log first.
    let session = state.sessions.create(new).await?;
    form.upload_all(&state, &caller, session.id).await?;
    let turn = match state
        .sessions
        .start_turn(session.clone(), prompt, false)
        .await
    {
        Ok(turn) => turn,
        Err(e) => {
            let _ = state.sessions.delete(session.id, caller.owner()).await;
            return Err(e.into());
        }
    };
    agent::answer_run(&headers, turn).await
}

/// A form body, read part by part.
struct Form(multer::Multipart<'static>);

impl Form {
    fn read(request: Request) -> Result<Form, ApiError> {
        let boundary = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|kind| multer::parse_boundary(kind).ok())
            .ok_or_else(|| {
                ApiError::bad_request("a multipart/form-data body needs its boundary parameter")
            })?;
        let stream = request.into_body().into_data_stream();
        Ok(Form(multer::Multipart::new(stream, boundary)))
    }

    /// The first part, `request`: the JSON body, within `max_body_bytes`.
    async fn request<T: DeserializeOwned>(&mut self, state: &AppState) -> Result<T, ApiError> {
        let first = self.0.next_field().await.map_err(form_error)?;
        let Some(mut field) = first.filter(|f| f.name() == Some("request")) else {
            return Err(ApiError::unprocessable(
                "bad_form",
                "the form's first part must be `request`, the JSON body (then the files)",
            ));
        };
        let mut bytes = Vec::new();
        while let Some(chunk) = field.chunk().await.map_err(form_error)? {
            if bytes.len() + chunk.len() > state.config.max_body_bytes {
                return Err(ApiError::body_too_large(Some(state.config.max_body_bytes)));
            }
            bytes.extend_from_slice(&chunk);
        }
        let request = Request::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(HttpBody::from(bytes))
            .map_err(ApiError::internal)?;
        Ok(Body::<T>::from_request(request, &()).await?.0)
    }

    /// Puts every later part into session `id`'s workspace; the first
    /// refused one deletes the session.
    async fn upload_all(
        &mut self,
        state: &AppState,
        caller: &Caller,
        id: uuid::Uuid,
    ) -> Result<Vec<Uploaded>, ApiError> {
        let mut uploaded = Vec::new();
        let result = async {
            let target = Target::of(state, caller, &id.to_string()).await?;
            while let Some(field) = self.0.next_field().await.map_err(form_error)? {
                let name = field.name().unwrap_or_default().to_string();
                let file = field.file_name().map(str::to_string);
                let body = HttpBody::from_stream(field);
                let done = match (name.as_str(), file) {
                    ("workspace", _) => unpack_into(state, &target, WORKSPACE.into(), body).await?,
                    (_, Some(file)) => {
                        let path = confine(&file, WORKSPACE).map_err(|e| {
                            ApiError::unprocessable("bad_path", format!("part {name:?}: {e}"))
                        })?;
                        write_one(state, &target, path, body).await?
                    }
                    (_, None) => {
                        return Err(ApiError::unprocessable(
                            "bad_form",
                            format!(
                                "part {name:?} has no filename: later parts are `workspace` (a tar) or files"
                            ),
                        ));
                    }
                };
                uploaded.push(done);
            }
            Ok(())
        }
        .await;
        match result {
            Ok(()) => Ok(uploaded),
            Err(e) => {
                if let Err(gone) = state.sessions.delete(id, caller.owner()).await {
                    tracing::warn!(session = %id, error = %gone, "cannot delete the session of a refused form");
                }
                Err(e)
            }
        }
    }
}

fn form_error(e: multer::Error) -> ApiError {
    ApiError::bad_request(format!("reading the multipart/form-data body: {e}"))
}
