//! The HTTP side of the model providers: POSTs with retries and backoff
//! that honour `Retry-After`, error bodies, and the task that pumps a
//! server's SSE events through an [`SseDecoder`] into a [`ModelStream`].

use std::time::{Duration, SystemTime};

use backon::{ExponentialBuilder, Retryable};
use bytes::Bytes;
use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use reqwest::{Response, StatusCode};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{ModelError, ModelStream, StreamEvent};
use crate::upstream::{describe, error_text, retry_after};

/// The first backoff; it doubles (with jitter) per retry up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// A dead host should fail fast even when generations may take minutes.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of an error body [`ModelError::Http`] keeps.
const ERROR_BODY_LIMIT: usize = 2000;
/// Events buffered between the task reading the upstream and the consumer.
const STREAM_BUFFER: usize = 64;

/// POSTs requests to one model server, retrying what is worth retrying.
pub(crate) struct Transport {
    client: reqwest::Client,
    backoff: ExponentialBuilder,
}

/// One failed attempt, and whether another may succeed.
struct Failure {
    error: ModelError,
    retryable: bool,
    retry_after: Option<Duration>,
}

impl Transport {
    /// `headers` go with every request (authentication, API version);
    /// `timeout` bounds the wait for each read, so long generations that
    /// keep streaming are never cut off.
    pub(super) fn new(
        headers: HeaderMap,
        max_retries: u32,
        timeout: Duration,
    ) -> Result<Transport, ModelError> {
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(timeout.min(MAX_CONNECT_TIMEOUT))
            .read_timeout(timeout)
            .build()
            .map_err(|e| ModelError::Upstream(format!("cannot build the HTTP client: {e}")))?;
        let backoff = ExponentialBuilder::default()
            .with_min_delay(MIN_BACKOFF)
            .with_max_delay(MAX_BACKOFF)
            .with_max_times(max_retries as usize)
            .with_jitter();
        Ok(Transport { client, backoff })
    }

    /// POSTs a JSON body and returns the response once its status is a
    /// success. Connection failures, 429 and 5xx are retried with backoff
    /// (or after `Retry-After`); a response that succeeded is never retried,
    /// so no part of a streamed answer is read twice.
    pub(super) async fn post(
        &self,
        url: &str,
        headers: HeaderMap,
        body: Vec<u8>,
    ) -> Result<Response, ModelError> {
        let body = Bytes::from(body);
        // The provider's own traces (a vLLM or a proxy that traces) join
        // the turn's.
        let mut headers = headers;
        crate::telemetry::otel::inject_headers(&mut headers);
        let attempt = || {
            let request = self
                .client
                .post(url)
                .headers(headers.clone())
                .header(CONTENT_TYPE, "application/json")
                .body(body.clone());
            async move { check(url, request.send().await).await }
        };
        attempt
            .retry(self.backoff)
            .when(|failure| failure.retryable)
            .adjust(|failure, backoff| backoff.map(|delay| failure.retry_after.unwrap_or(delay)))
            .notify(|failure, delay| {
                tracing::warn!(
                    url,
                    error = %failure.error,
                    delay_ms = delay.as_millis() as u64,
                    "retrying the model call"
                );
            })
            .await
            .map_err(|failure| failure.error)
    }
}

async fn check(url: &str, sent: reqwest::Result<Response>) -> Result<Response, Failure> {
    let response = sent.map_err(|e| Failure {
        retryable: e.is_connect(),
        retry_after: None,
        error: ModelError::Connect {
            url: url.to_string(),
            message: describe(&e),
        },
    })?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    Err(Failure {
        // 529 (Anthropic's "overloaded") is a 5xx too.
        retryable: status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error(),
        retry_after: retry_after(response.headers(), SystemTime::now()),
        error: ModelError::Http {
            status: status.as_u16(),
            body: error_text(response, ERROR_BODY_LIMIT).await,
        },
    })
}

/// `{base_url}/{path}`, once the base URL is known to be one.
pub(crate) fn endpoint(base_url: &str, path: &str) -> Result<String, ModelError> {
    let url = format!("{}/{path}", base_url.trim_end_matches('/'));
    reqwest::Url::parse(&url).map_err(|e| ModelError::Connect {
        url: base_url.to_string(),
        message: format!("not a valid URL: {e}"),
    })?;
    Ok(url)
}

/// A header holding a key, kept out of debug output.
pub(crate) fn secret_header(value: &str) -> Result<HeaderValue, ModelError> {
    let mut header = HeaderValue::from_str(value).map_err(|_| {
        ModelError::Upstream("the API key holds characters a header cannot carry".into())
    })?;
    header.set_sensitive(true);
    Ok(header)
}

/// The error for an SSE event whose data does not parse.
pub(crate) fn malformed(what: &str, data: &str, error: &serde_json::Error) -> ModelError {
    let excerpt: String = data.chars().take(200).collect();
    ModelError::Protocol(format!("cannot read a {what} ({error}): {excerpt}"))
}

/// Turns upstream SSE events into stream events.
pub(crate) trait SseDecoder: Send + 'static {
    /// Decodes one event into `out`; `Ok(true)` when the event ended the
    /// stream. An error ends the stream too.
    fn decode(&mut self, event: &Event, out: &mut Vec<StreamEvent>) -> Result<bool, ModelError>;

    /// The body ended with no event that ends the stream.
    fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError>;
}

/// Reads `response` as SSE in a task that feeds the returned stream. When
/// the consumer drops the stream the task stops and the connection closes.
pub(crate) fn spawn_sse(response: Response, decoder: impl SseDecoder) -> ModelStream {
    spawn_sse_bytes(response.bytes_stream(), decoder)
}

/// [`spawn_sse`] over any stream of body bytes (the gateway's, in process).
pub(crate) fn spawn_sse_bytes<E: std::error::Error + Send + 'static>(
    body: impl Stream<Item = Result<Bytes, E>> + Send + 'static,
    mut decoder: impl SseDecoder,
) -> ModelStream {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(async move {
        let mut events = std::pin::pin!(body.eventsource());
        loop {
            let next = tokio::select! {
                () = tx.closed() => return,
                next = events.next() => next,
            };
            let mut out = Vec::new();
            let (ended, failure) = match next {
                Some(Ok(event)) => match decoder.decode(&event, &mut out) {
                    Ok(ended) => (ended, None),
                    Err(error) => (true, Some(error)),
                },
                Some(Err(error)) => (true, Some(sse_error(error))),
                None => (true, decoder.finish(&mut out).err()),
            };
            for item in out.into_iter().map(Ok).chain(failure.map(Err)) {
                if tx.send(item).await.is_err() {
                    return;
                }
            }
            if ended {
                return;
            }
        }
    });
    Box::pin(ReceiverStream::new(rx))
}

fn sse_error<E: std::error::Error>(error: EventStreamError<E>) -> ModelError {
    match error {
        EventStreamError::Transport(error) => {
            ModelError::Upstream(format!("the stream broke off: {}", describe(&error)))
        }
        EventStreamError::Utf8(error) => ModelError::Protocol(format!("not UTF-8: {error}")),
        EventStreamError::Parser(error) => ModelError::Protocol(format!("not SSE: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_joins_and_checks() {
        assert_eq!(
            endpoint("http://localhost:8000/v1/", "chat/completions").unwrap(),
            "http://localhost:8000/v1/chat/completions"
        );
        assert!(matches!(
            endpoint("not a url", "chat/completions"),
            Err(ModelError::Connect { .. })
        ));
    }
}
