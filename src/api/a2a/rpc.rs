//! The JSON-RPC 2.0 binding: one POST per call, its answer a JSON-RPC
//! response, or an SSE stream of them for the streaming methods.

use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use serde_json::{Value, json};

use super::{VERSION, agent, push, send};
use crate::api::http::auth::Caller;
use crate::api::http::error::ApiError;
use crate::api::http::state::AppState;

/// An A2A error: its JSON-RPC code and what was wrong.
#[derive(Debug)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

pub const TASK_NOT_FOUND: i64 = -32001;
pub const TASK_NOT_CANCELABLE: i64 = -32002;
pub const UNSUPPORTED: i64 = -32004;
pub const CONTENT_TYPE: i64 = -32005;
pub const VERSION_NOT_SUPPORTED: i64 = -32009;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL: i64 = -32603;
pub const PARSE_ERROR: i64 = -32700;

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }

    pub fn params(message: impl Into<String>) -> RpcError {
        RpcError::new(INVALID_PARAMS, message)
    }

    pub fn task_not_found(id: &str) -> RpcError {
        RpcError::new(TASK_NOT_FOUND, format!("task {id} not found"))
    }
}

/// The server's own errors keep their message; a 404 is a task (or
/// context) that is not the caller's, a 409 an operation the task's state
/// does not allow.
impl From<ApiError> for RpcError {
    fn from(e: ApiError) -> RpcError {
        let code = match e.status {
            StatusCode::NOT_FOUND => TASK_NOT_FOUND,
            StatusCode::CONFLICT => UNSUPPORTED,
            s if s.is_client_error() => INVALID_PARAMS,
            _ => INTERNAL,
        };
        RpcError::new(code, e.message)
    }
}

impl From<crate::session::SessionError> for RpcError {
    fn from(e: crate::session::SessionError) -> RpcError {
        ApiError::from(e).into()
    }
}

/// What a method answers.
pub enum RpcAnswer {
    One(Value),
    Stream(BoxStream<'static, Value>),
}

fn response(id: &Value, outcome: Result<Value, RpcError>) -> Value {
    match outcome {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(e) => json!({"jsonrpc": "2.0", "id": id,
            "error": {"code": e.code, "message": e.message}}),
    }
}

/// `POST /a2a/{agent}`.
pub async fn handle(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let agent = agent(&state, &name)?;
    let request: Value = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => {
            let e = RpcError::new(PARSE_ERROR, format!("the body is not JSON: {e}"));
            return Ok(Json(response(&Value::Null, Err(e))).into_response());
        }
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let outcome = match checked(&request, &headers) {
        Ok((method, params)) => {
            let call = send::RpcCall {
                state: &state,
                caller: &caller,
                agent: &agent,
            };
            dispatch(&call, method, params).await
        }
        Err(e) => Err(e),
    };
    Ok(match outcome {
        Ok(RpcAnswer::One(result)) => Json(response(&id, Ok(result))).into_response(),
        Ok(RpcAnswer::Stream(results)) => sse(id, results),
        Err(e) => Json(response(&id, Err(e))).into_response(),
    })
}

/// The method and params of a well-formed JSON-RPC 2.0 request of this
/// protocol version.
fn checked<'a>(request: &'a Value, headers: &HeaderMap) -> Result<(&'a str, Value), RpcError> {
    let invalid = |m: &str| RpcError::new(INVALID_REQUEST, m);
    if !request.is_object() {
        return Err(invalid(
            "a request is one JSON-RPC 2.0 object (batches are not served)",
        ));
    }
    if request.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(invalid("`jsonrpc` must be \"2.0\""));
    }
    if request
        .get("id")
        .is_some_and(|id| !(id.is_string() || id.is_number() || id.is_null()))
    {
        return Err(invalid("`id` must be a string, a number or null"));
    }
    let Some(method) = request.get("method").and_then(Value::as_str) else {
        return Err(invalid("`method` must be a string"));
    };
    let version = headers.get("a2a-version").and_then(|v| v.to_str().ok());
    if version.map(str::trim) != Some(VERSION) {
        return Err(RpcError::new(
            VERSION_NOT_SUPPORTED,
            format!(
                "A2A version {}: this server speaks {VERSION} only; send the header A2A-Version: {VERSION}",
                version.unwrap_or("0.3 (no A2A-Version header)")
            ),
        ));
    }
    let params = match request.get("params") {
        None | Some(Value::Null) => json!({}),
        Some(params @ Value::Object(_)) => params.clone(),
        Some(_) => return Err(RpcError::params("`params` must be an object")),
    };
    Ok((method, params))
}

async fn dispatch(
    call: &send::RpcCall<'_>,
    method: &str,
    params: Value,
) -> Result<RpcAnswer, RpcError> {
    let one = |v: Value| Ok(RpcAnswer::One(v));
    match method {
        "SendMessage" => one(send::send_message(call, &params).await?),
        "SendStreamingMessage" => Ok(RpcAnswer::Stream(
            send::send_streaming(call, &params).await?,
        )),
        "GetTask" => one(send::get_task(call, &params).await?),
        "ListTasks" => one(send::list_tasks(call, &params).await?),
        "CancelTask" => one(send::cancel_task(call, &params).await?),
        "SubscribeToTask" => Ok(RpcAnswer::Stream(send::subscribe(call, &params).await?)),
        "CreateTaskPushNotificationConfig" => one(push::create(call, &params).await?),
        "GetTaskPushNotificationConfig" => one(push::get(call, &params).await?),
        "ListTaskPushNotificationConfigs" => one(push::list(call, &params).await?),
        "DeleteTaskPushNotificationConfig" => one(push::delete(call, &params).await?),
        // The card says `extendedAgentCard: false`: the operation is not
        // supported (A2A §3.3.4), rather than a card that is not set up.
        "GetExtendedAgentCard" => Err(RpcError::new(
            UNSUPPORTED,
            "this agent has no extended card (capabilities.extendedAgentCard is false): its \
             public card is all there is",
        )),
        other => Err(RpcError::new(
            METHOD_NOT_FOUND,
            format!("no method {other:?} in A2A {VERSION}"),
        )),
    }
}

/// Each result a JSON-RPC response of the request's id, one SSE `data:`
/// each.
fn sse(id: Value, results: impl Stream<Item = Value> + Send + 'static) -> Response {
    let events = results.map(move |result| {
        Ok::<_, Infallible>(SseEvent::default().data(response(&id, Ok(result)).to_string()))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// A string field of `params`, required.
pub fn text<'a>(params: &'a Value, field: &str) -> Result<&'a str, RpcError> {
    params
        .get(field)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| RpcError::params(format!("`{field}` must be a non-empty string")))
}

/// An optional non-negative integer field of `params`.
pub fn count(params: &Value, field: &str) -> Result<Option<usize>, RpcError> {
    match params.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| RpcError::params(format!("`{field}` must be a non-negative integer"))),
    }
}
