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

/// `body`, ending in an error once it passed `cap` bytes.
fn capped<E: std::fmt::Display>(
    body: impl Stream<Item = Result<Bytes, E>>,
    cap: usize,
) -> impl Stream<Item = Result<Bytes, ReadError>> {
    body.scan(0usize, move |seen, chunk| {
        let chunk = chunk
            .map_err(|e| ReadError(format!("the stream broke off: {e}")))
            .and_then(|bytes| {
                *seen += bytes.len();
                if *seen > cap {
                    Err(ReadError(format!("the stream passed {cap} bytes")))
                } else {
                    Ok(bytes)
                }
            });
        futures::future::ready(Some(chunk))
    })
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
    let capped = capped(response.bytes_stream(), MAX_STREAM_BYTES);
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::body::Body;
    use axum::http::HeaderMap as Headers;
    use axum::routing::{get, post};

    async fn serve(app: Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    fn endpoint(url: String) -> Endpoint {
        Endpoint {
            url,
            tenant: Some("t1".into()),
            headers: HeaderMap::new(),
        }
    }

    fn sse(body: Body) -> axum::response::Response {
        axum::response::Response::builder()
            .header("content-type", "text/event-stream")
            .body(body)
            .unwrap()
    }

    const SECOND: Duration = Duration::from_secs(1);

    async fn open(http: &reqwest::Client, url: &str, path: &str) -> Events {
        stream(http, &endpoint(format!("{url}/{path}")), json!({}), SECOND)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_call_carries_the_version_and_the_tenant() {
        let url = serve(Router::new().route(
            "/",
            post(|headers: Headers, body: axum::Json<Value>| async move {
                axum::Json(json!({"jsonrpc": "2.0", "id": body["id"], "result": {
                    "version": headers["a2a-version"].to_str().unwrap(),
                    "method": body["method"], "params": body["params"]}}))
            }),
        ))
        .await;
        let http = reqwest::Client::new();
        let answer: Value = call(&http, &endpoint(url), "GetTask", json!({"id": "x"}), SECOND)
            .await
            .unwrap();
        assert_eq!(
            answer,
            json!({"version": "1.0", "method": "GetTask", "params": {"id": "x", "tenant": "t1"}})
        );
    }

    #[tokio::test]
    async fn a_card_past_the_cap_is_refused_with_or_without_a_length() {
        let big = || "x".repeat(MAX_CARD_BYTES + 1);
        let url = serve(
            Router::new()
                .route("/sized", get(move || async move { big() }))
                .route(
                    "/chunked",
                    get(|| async {
                        let chunks = (0..=MAX_CARD_BYTES / 1024)
                            .map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; 1024])));
                        Body::from_stream(futures::stream::iter(chunks))
                    }),
                ),
        )
        .await;
        let http = reqwest::Client::new();
        for path in ["sized", "chunked"] {
            let err = card(&http, &format!("{url}/{path}"), &HeaderMap::new(), SECOND)
                .await
                .unwrap_err();
            assert!(
                err.ends_with("the answer is larger than 1048576 bytes"),
                "{err}"
            );
        }
    }

    #[tokio::test]
    async fn a_stream_passes_its_events_and_ends_on_an_error_or_silence() {
        let url = serve(
            Router::new()
                .route(
                    "/error",
                    post(|| async {
                        sse(Body::from(concat!(
                            "data: {\"jsonrpc\": \"2.0\", \"id\": 1, \"result\": {\"message\": {\"parts\": [{\"text\": \"hi\"}]}}}\n\n",
                            "event: error\ndata: {\"jsonrpc\": \"2.0\", \"id\": 1, \"error\": {\"code\": -32603, \"message\": \"boom\"}}\n\n",
                        )))
                    }),
                )
                .route(
                    "/silent",
                    post(|| async {
                        sse(Body::from_stream(futures::stream::pending::<
                            Result<Bytes, std::io::Error>,
                        >()))
                    }),
                )
                .route(
                    "/json",
                    post(|| async {
                        axum::Json(json!({"jsonrpc": "2.0", "id": 1,
                            "result": {"task": {"id": "t", "status": {"state": "TASK_STATE_COMPLETED"}}}}))
                    }),
                ),
        )
        .await;
        let http = reqwest::Client::new();
        let mut events = open(&http, &url, "error").await;
        let first = events.next().await.unwrap().unwrap();
        assert_eq!(
            crate::a2a_client::wire::text_of(&first.message.unwrap().parts),
            "hi"
        );
        assert_eq!(
            events.next().await.unwrap().unwrap_err(),
            "it answered with an error: boom (JSON-RPC -32603)"
        );
        let mut silent = open(&http, &url, "silent").await;
        assert_eq!(
            silent.next().await.unwrap().unwrap_err(),
            "it sent nothing for 1s"
        );
        let mut one = open(&http, &url, "json").await;
        assert_eq!(one.next().await.unwrap().unwrap().task.unwrap().id, "t");
        assert!(one.next().await.is_none());
    }

    #[tokio::test]
    async fn a_body_past_its_cap_ends_in_an_error() {
        let chunks = (0..3).map(|_| Ok::<_, std::io::Error>(Bytes::from_static(b"0123456789")));
        let read: Vec<Result<Bytes, ReadError>> =
            capped(futures::stream::iter(chunks), 25).collect().await;
        assert_eq!(read.len(), 3);
        assert!(read[0].is_ok() && read[1].is_ok());
        assert_eq!(
            read[2].as_ref().unwrap_err().to_string(),
            "the stream passed 25 bytes"
        );
    }
}
