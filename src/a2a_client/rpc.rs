//! A2A over HTTP: the agent card, JSON-RPC 2.0 calls, and the SSE stream
//! of `SendStreamingMessage`, every read capped in bytes and time so a
//! remote that answers without end or not at all costs a bounded amount.

use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use eventsource_stream::{Event, Eventsource};
use futures::{Stream, StreamExt};
use http::HeaderMap;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::wire::{AgentCard, RpcResponse, StreamResponse};

/// The protocol version sent in `A2A-Version`.
const VERSION: &str = "1.0";
const MAX_CARD_BYTES: usize = 1024 * 1024;
/// A JSON-RPC answer (a task with its history and artifacts).
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;
/// All the bytes of one stream: what the SSE parser may buffer, so a
/// remote sending one endless event still stops here.
const MAX_STREAM_BYTES: usize = 64 * 1024 * 1024;
/// How much of an error answer's body the error quotes.
const EXCERPT: usize = 300;

/// Where an agent's JSON-RPC calls go, and what they carry.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub url: String,
    /// The interface's tenant, sent in every request's params.
    pub tenant: Option<String>,
    /// The session's headers for this agent (a bearer token).
    pub headers: HeaderMap,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ReadError(String);

/// Reads a body of at most `cap` bytes.
async fn read_capped(response: reqwest::Response, cap: usize) -> Result<Vec<u8>, String> {
    if response.content_length().is_some_and(|n| n > cap as u64) {
        return Err(format!("the answer is larger than {cap} bytes"));
    }
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| format!("the answer broke off: {e}"))?;
        if body.len() + chunk.len() > cap {
            return Err(format!("the answer is larger than {cap} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The response when its status is a success; an error quoting the start
/// of its body otherwise.
async fn success(response: reqwest::Response) -> Result<reqwest::Response, String> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = read_capped(response, MAX_ANSWER_BYTES)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body);
    let excerpt: String = text.chars().take(EXCERPT).collect();
    Err(format!("HTTP {status}: {excerpt}"))
}

fn parse<T: DeserializeOwned>(body: &[u8], what: &str) -> Result<T, String> {
    serde_json::from_slice(body).map_err(|e| format!("{what} is not valid: {e}"))
}

/// Reads the card at `url`.
pub async fn card(
    http: &reqwest::Client,
    url: &str,
    headers: &HeaderMap,
    timeout: Duration,
) -> Result<AgentCard, String> {
    let response = http
        .get(url)
        .headers(headers.clone())
        .header(http::header::ACCEPT, "application/json")
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| format!("reading its card at {url}: {e}"))?;
    let response = success(response)
        .await
        .map_err(|e| format!("reading its card at {url}: {e}"))?;
    let body = tokio::time::timeout(timeout, read_capped(response, MAX_CARD_BYTES))
        .await
        .map_err(|_| format!("its card at {url} took over {}s", timeout.as_secs()))?
        .map_err(|e| format!("reading its card at {url}: {e}"))?;
    parse(&body, "its agent card")
}

/// The result of a JSON-RPC answer, or its error.
fn result_of(answer: RpcResponse) -> Result<Value, String> {
    match (answer.result, answer.error) {
        (_, Some(error)) => Err(format!(
            "it answered with an error: {} (JSON-RPC {})",
            error.message, error.code
        )),
        (Some(result), None) => Ok(result),
        (None, None) => Err("its answer has neither a result nor an error".into()),
    }
}

fn request(
    http: &reqwest::Client,
    endpoint: &Endpoint,
    method: &str,
    mut params: Value,
) -> reqwest::RequestBuilder {
    if let (Some(tenant), Some(map)) = (&endpoint.tenant, params.as_object_mut()) {
        map.insert("tenant".into(), json!(tenant));
    }
    let body = json!({
        "jsonrpc": "2.0",
        "id": uuid::Uuid::new_v4().to_string(),
        "method": method,
        "params": params,
    });
    http.post(&endpoint.url)
        .headers(endpoint.headers.clone())
        .header("A2A-Version", VERSION)
        .json(&body)
}

/// Calls `method` and reads its result as `T`, all within `timeout`.
pub async fn call<T: DeserializeOwned>(
    http: &reqwest::Client,
    endpoint: &Endpoint,
    method: &str,
    params: Value,
    timeout: Duration,
) -> Result<T, String> {
    let exchange = async {
        let response = request(http, endpoint, method, params)
            .header(http::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| format!("{method}: {e}"))?;
        let response = success(response)
            .await
            .map_err(|e| format!("{method}: {e}"))?;
        let body = read_capped(response, MAX_ANSWER_BYTES)
            .await
            .map_err(|e| format!("{method}: {e}"))?;
        let result = result_of(parse(&body, "its JSON-RPC answer")?)?;
        serde_json::from_value(result)
            .map_err(|e| format!("{method}: its result is not valid: {e}"))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("{method}: no answer within {}s", timeout.as_secs()))?
}

type SseStream = Pin<Box<dyn Stream<Item = Result<Event, String>> + Send>>;

/// The events of one `SendStreamingMessage` call.
pub enum Events {
    Sse {
        events: SseStream,
        idle: Duration,
    },
    /// A server that answered with one JSON-RPC response, not a stream.
    One(Option<Box<StreamResponse>>),
}

impl Events {
    /// The next event; `None` once the stream ended.
    pub async fn next(&mut self) -> Option<Result<StreamResponse, String>> {
        let (events, idle) = match self {
            Events::One(one) => return one.take().map(|event| Ok(*event)),
            Events::Sse { events, idle } => (events, *idle),
        };
        loop {
            let event = match tokio::time::timeout(idle, events.next()).await {
                Err(_) => {
                    return Some(Err(format!("it sent nothing for {}s", idle.as_secs())));
                }
                Ok(None) => return None,
                Ok(Some(Err(e))) => return Some(Err(e)),
                Ok(Some(Ok(event))) => event,
            };
            if event.data.is_empty() {
                continue;
            }
            let answer = parse(event.data.as_bytes(), "a streamed event")
                .and_then(result_of)
                .and_then(|result| {
                    serde_json::from_value(result)
                        .map_err(|e| format!("a streamed event is not valid: {e}"))
                });
            return Some(answer);
        }
    }
}

/// Sends `SendStreamingMessage` and opens its stream of events.
pub async fn stream(
    http: &reqwest::Client,
    endpoint: &Endpoint,
    params: Value,
    idle: Duration,
) -> Result<Events, String> {
    let opened = async {
        let response = request(http, endpoint, "SendStreamingMessage", params)
            .header(http::header::ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(|e| e.to_string())?;
        success(response).await
    };
    let response = tokio::time::timeout(idle, opened)
        .await
        .map_err(|_| format!("no answer within {}s", idle.as_secs()))??;
    let is_sse = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !is_sse {
        let body = tokio::time::timeout(idle, read_capped(response, MAX_ANSWER_BYTES))
            .await
            .map_err(|_| format!("no answer within {}s", idle.as_secs()))??;
        let result = result_of(parse(&body, "its JSON-RPC answer")?)?;
        let event =
            serde_json::from_value(result).map_err(|e| format!("its result is not valid: {e}"))?;
        return Ok(Events::One(Some(Box::new(event))));
    }
    let capped = response.bytes_stream().scan(0usize, |seen, chunk| {
        let chunk = chunk
            .map_err(|e| ReadError(format!("the stream broke off: {e}")))
            .and_then(|bytes: Bytes| {
                *seen += bytes.len();
                if *seen > MAX_STREAM_BYTES {
                    Err(ReadError(format!(
                        "the stream passed {MAX_STREAM_BYTES} bytes"
                    )))
                } else {
                    Ok(bytes)
                }
            });
        futures::future::ready(Some(chunk))
    });
    let events = capped.eventsource().map(|event| {
        event.map_err(|e| match e {
            eventsource_stream::EventStreamError::Transport(e) => e.0,
            other => format!("not an SSE stream: {other}"),
        })
    });
    Ok(Events::Sse {
        events: Box::pin(events),
        idle,
    })
}
