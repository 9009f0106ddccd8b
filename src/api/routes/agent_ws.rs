//! `GET /agent/ws?session_id=ID[&since=SEQ]`: the session's events out,
//! `{"type":"message","prompt":…}`, `{"type":"interrupt"}` and
//! `{"type":"approval","call_id":…,"decision":…}` in (answered
//! `{"type":"interrupted","interrupted":bool}` and `{"type":
//! "approval_sent",…}`, or an `error` frame).
//!
//! A reader loop and a writer task under `select!`; the writer forwards the
//! session's events (replayed from `since`, then live) and the replies to
//! client frames. Closing the socket does not stop a turn: the session goes
//! on, and a new socket with `since` picks up where this one left off.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use utoipa::IntoParams;

use crate::api::http::auth::Caller;
use crate::api::http::error::{ApiError, ErrorBody};
use crate::api::http::extract::ApiQuery;
use crate::api::http::state::AppState;
use crate::api::routes::agent::parse_id;
use crate::session::{Session, SessionError};

/// Per-connection buffers stay small: idle sockets are the common case.
const READ_BUFFER: usize = 4 * 1024;
const MAX_MESSAGE: usize = 1024 * 1024;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WsQuery {
    pub session_id: Option<String>,
    /// Replay events after this `seq` first; without it only new events come.
    pub since: Option<u64>,
    /// The API key, for browsers that cannot set headers.
    #[allow(dead_code)]
    pub token: Option<String>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum ClientFrame {
    Message {
        prompt: String,
        #[serde(default)]
        queue: bool,
    },
    Interrupt,
}

#[utoipa::path(get, path = "/agent/ws", params(WsQuery),
    responses((status = 101, description = "WebSocket of session events"), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn upgrade(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(query): ApiQuery<WsQuery>,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let id = query.session_id.ok_or_else(|| {
        ApiError::bad_request("session_id is required; create one with POST /agent/session")
    })?;
    let session = state.sessions.get(parse_id(&id)?, caller.owner()).await?;
    let since = query.since.unwrap_or_else(|| session.last_seq());
    Ok(ws
        .read_buffer_size(READ_BUFFER)
        .write_buffer_size(0)
        .max_message_size(MAX_MESSAGE)
        .on_upgrade(move |socket| serve(socket, state, caller, session, since)))
}

/// What the reader hands the writer besides the session's events.
enum Outgoing {
    Frame(Value),
    /// A last frame, then a close with this code.
    Close(Value, u16),
}

/// RFC 6455: a message too big to process.
const CLOSE_TOO_BIG: u16 = 1009;

async fn serve(
    socket: WebSocket,
    state: AppState,
    caller: Caller,
    session: Arc<Session>,
    since: u64,
) {
    state.metrics.websocket_connections.inc();
    let (mut sink, mut incoming) = socket.split();
    let (replies, mut reply_rx) = mpsc::channel::<Outgoing>(16);
    let mut events = Box::pin(session.subscribe(since, false));
    let writer = async move {
        let mut close = None;
        loop {
            let text = tokio::select! {
                event = events.next() => match event {
                    Some(event) => serde_json::to_string(&*event).unwrap_or_default(),
                    None => break,
                },
                reply = reply_rx.recv() => match reply {
                    Some(Outgoing::Frame(reply)) => reply.to_string(),
                    Some(Outgoing::Close(reply, code)) => {
                        close = Some(code);
                        reply.to_string()
                    }
                    None => break,
                },
            };
            if sink.send(Message::Text(text.into())).await.is_err() || close.is_some() {
                break;
            }
        }
        match close {
            Some(code) => {
                let frame = CloseFrame {
                    code,
                    reason: "message too big".into(),
                };
                let _ = sink.send(Message::Close(Some(frame))).await;
            }
            None => {
                let _ = sink.close().await;
            }
        }
    };
    let session_id = session.id;
    let reader = async {
        while let Some(frame) = incoming.next().await {
            let reply = match frame {
                Ok(Message::Text(text)) => handle_frame(&state, &caller, &session, &text)
                    .await
                    .map(Outgoing::Frame),
                Ok(Message::Binary(_)) => Some(Outgoing::Frame(bad_frame(
                    session_id,
                    "binary frames are not read; send JSON as text frames".into(),
                ))),
                Ok(Message::Close(_)) => break,
                Ok(_) => None,
                Err(e) => {
                    // A message over the limit: say so, and close with
                    // the code for it; any other error ends the socket.
                    let too_big = matches!(
                        std::error::Error::source(&e)
                            .and_then(|s| s.downcast_ref::<tungstenite::Error>()),
                        Some(tungstenite::Error::Capacity(_))
                    );
                    if too_big {
                        let reply = bad_frame(
                            session_id,
                            format!("a message is at most {MAX_MESSAGE} bytes"),
                        );
                        let _ = replies.send(Outgoing::Close(reply, CLOSE_TOO_BIG)).await;
                        std::future::pending::<()>().await;
                    }
                    break;
                }
            };
            if let Some(reply) = reply
                && replies.send(reply).await.is_err()
            {
                break;
            }
        }
    };
    tokio::select! {
        _ = writer => {}
        _ = reader => {}
    }
    state.metrics.websocket_connections.dec();
}

fn bad_frame(session_id: uuid::Uuid, message: String) -> Value {
    json!({"type": "error", "session_id": session_id, "code": "bad_frame", "message": message})
}

/// Acts on one client frame; returns a reply frame when there is one to send.
/// Replies are not part of the event log, so they carry no `seq`.
async fn handle_frame(
    state: &AppState,
    caller: &Caller,
    session: &Arc<Session>,
    text: &str,
) -> Option<Value> {
    let error = |code: &str, message: String| {
        Some(json!({"type": "error", "session_id": session.id, "code": code, "message": message}))
    };
    if let Ok(Value::Object(mut frame)) = serde_json::from_str::<Value>(text)
        && frame.get("type").and_then(Value::as_str) == Some("approval")
    {
        frame.remove("type");
        let Some(Value::String(call_id)) = frame.remove("call_id") else {
            return error("invalid_request", "call_id: a string is required".into());
        };
        let decided = match crate::api::routes::approvals::parse_decision(Value::Object(frame)) {
            Ok(decision) => {
                let verdict = decision.decision;
                crate::api::routes::approvals::decide(state, caller, session, &call_id, decision)
                    .await
                    .map(|_| verdict)
            }
            Err(e) => Err(e),
        };
        // Answered as `POST …/approvals/{call_id}` is.
        return match decided {
            Ok(verdict) => Some(json!({
                "type": "approval_sent",
                "session_id": session.id,
                "call_id": call_id,
                "decision": verdict,
            })),
            Err(e) => error(e.code, e.message),
        };
    }
    let frame: ClientFrame = match serde_json::from_str(text) {
        Ok(frame) => frame,
        Err(e) => {
            return error(
                "bad_frame",
                format!(
                    "expected {{\"type\":\"message\",\"prompt\":…}}, {{\"type\":\"interrupt\"}} \
                     or {{\"type\":\"approval\",\"call_id\":…,\"decision\":…}}: {e}"
                ),
            );
        }
    };
    match frame {
        ClientFrame::Message { prompt, .. } if prompt.trim().is_empty() => {
            error("invalid_request", "prompt: must not be empty".into())
        }
        ClientFrame::Message { prompt, queue } => {
            // The turn's events reach this socket through the subscription.
            match state
                .sessions
                .start_turn(session.clone(), prompt, queue)
                .await
            {
                Ok(_) => None,
                Err(e @ SessionError::Busy(_)) => error("session_busy", e.to_string()),
                Err(e) => {
                    let api = ApiError::from(e);
                    error(api.code, api.message)
                }
            }
        }
        // Answered as `POST …/interrupt` is: whether a turn was stopped.
        ClientFrame::Interrupt => match state.sessions.interrupt(session).await {
            Ok(interrupted) => Some(json!({
                "type": "interrupted",
                "session_id": session.id,
                "interrupted": interrupted,
            })),
            Err(e) => {
                let api = ApiError::from(e);
                error(api.code, api.message)
            }
        },
    }
}
