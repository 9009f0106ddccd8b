//! `GET /bus/ws?subscribe=a.*,b[&since=…]`: publish and subscribe on one
//! socket. Out: the subscription's messages as `{"type":"message",…}`
//! (and `{"type":"lagged",…}`), and the replies to client frames. In:
//! `{"type":"publish","subject":…,"data":…}`, answered
//! `{"type":"published","subject","seq"}` or `{"type":"error",…}`.

use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::ws::{Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use futures::stream::BoxStream;
use futures::{FutureExt, SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use utoipa::IntoParams;

use crate::api::http::auth::Caller;
use crate::api::http::error::{ApiError, ErrorBody};
use crate::api::http::extract::ApiQuery;
use crate::api::http::state::AppState;
use crate::api::routes::bus::{namespace, subscription};
use crate::bus::{BusError, Delivery, Subject};

const READ_BUFFER: usize = 4 * 1024;
/// Frames written together at most, when a subscriber has many ready.
const WRITE_BATCH: usize = 64;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct BusWsQuery {
    /// Subject patterns separated by commas; none for a socket that only
    /// publishes.
    subscribe: Option<String>,
    /// As `/bus/subscribe`'s `since`.
    since: Option<String>,
    /// The API key, for clients that cannot set headers (read by the auth
    /// layer).
    #[allow(dead_code)]
    token: Option<String>,
    /// A single-use ticket from `POST /auth/ticket` (read by the auth
    /// layer).
    #[allow(dead_code)]
    ticket: Option<String>,
}

/// `{"type":"publish","subject":…,"data":…}` (a struct, not a tagged
/// enum: serde cannot hand a raw value through an enum's tag).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientFrame {
    #[serde(rename = "type")]
    kind: String,
    subject: String,
    data: Box<RawValue>,
}

#[utoipa::path(get, path = "/bus/ws", params(BusWsQuery),
    responses((status = 101, description = "WebSocket to publish and subscribe"), (status = 400, body = ErrorBody)))]
pub async fn upgrade(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(query): ApiQuery<BusWsQuery>,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let ns = namespace(&caller).to_owned();
    let deliveries: BoxStream<'static, Delivery> = match &query.subscribe {
        Some(subjects) => {
            let (patterns, since) = subscription(subjects, query.since.as_deref())?;
            state.bus.subscribe(&ns, patterns, since).await?
        }
        None => futures::stream::pending().boxed(),
    };
    let max = state.bus.max_payload() + 4096;
    Ok(ws
        .read_buffer_size(READ_BUFFER)
        .max_message_size(max)
        .on_upgrade(move |socket| serve(socket, state, ns, deliveries)))
}

async fn serve(
    socket: WebSocket,
    state: AppState,
    ns: String,
    mut deliveries: BoxStream<'static, Delivery>,
) {
    state.metrics.websocket_connections.inc();
    let (mut sink, mut incoming) = socket.split();
    let (replies, mut reply_rx) = mpsc::channel::<Value>(16);
    let stop = state.stop.clone();
    let writer = async move {
        loop {
            let first: Bytes = tokio::select! {
                delivery = deliveries.next() => match delivery {
                    Some(delivery) => delivery.json(),
                    None => break,
                },
                reply = reply_rx.recv() => match reply {
                    Some(reply) => Bytes::from(reply.to_string()),
                    None => break,
                },
                () = stop.cancelled() => break,
            };
            // What else is ready now goes out in the same write.
            let mut frames = vec![first];
            while frames.len() < WRITE_BATCH {
                match deliveries.next().now_or_never() {
                    Some(Some(delivery)) => frames.push(delivery.json()),
                    _ => break,
                }
            }
            if write(&mut sink, frames).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    };
    let reader = async {
        while let Some(Ok(frame)) = incoming.next().await {
            let reply = match frame {
                Message::Text(text) => handle_frame(&state, &ns, &text).await,
                Message::Binary(_) => error(
                    "bad_frame",
                    "binary frames are not read; send JSON as text frames",
                ),
                Message::Close(_) => break,
                _ => continue,
            };
            if replies.send(reply).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        () = writer => {}
        () = reader => {}
    }
    state.metrics.websocket_connections.dec();
}

/// Queues the frames and flushes them once.
async fn write(
    sink: &mut futures::stream::SplitSink<WebSocket, Message>,
    frames: Vec<Bytes>,
) -> Result<(), axum::Error> {
    for json in frames {
        // The JSON is UTF-8 by construction; no copy is made.
        let text = Utf8Bytes::try_from(json).unwrap_or_default();
        sink.feed(Message::Text(text)).await?;
    }
    sink.flush().await
}

fn error(code: &str, message: impl std::fmt::Display) -> Value {
    json!({"type": "error", "code": code, "message": message.to_string()})
}

async fn handle_frame(state: &AppState, ns: &str, text: &str) -> Value {
    let (subject, data) = match serde_json::from_str::<ClientFrame>(text) {
        Ok(frame) if frame.kind == "publish" => (frame.subject, frame.data),
        Ok(frame) => {
            return error(
                "bad_frame",
                format!(
                    "unknown frame type {:?}; the bus socket takes \"publish\"",
                    frame.kind
                ),
            );
        }
        Err(e) => {
            return error(
                "bad_frame",
                format!("expected {{\"type\":\"publish\",\"subject\":…,\"data\":…}}: {e}"),
            );
        }
    };
    let subject = match Subject::parse(&subject) {
        Ok(subject) => subject,
        Err(e) => return error("bad_subject", e),
    };
    let payload = Bytes::from(data.get().to_owned());
    match state.bus.publish(ns, &subject, payload).await {
        Ok(seq) => json!({"type": "published", "subject": subject.as_str(), "seq": seq}),
        Err(e @ BusError::TooLarge { .. }) => error("payload_too_large", e),
        Err(e @ BusError::Closed) => error("shutting_down", e),
        Err(e) => {
            tracing::error!(error = %e, "bus publish failed");
            error("internal", "internal server error; see the server log")
        }
    }
}
