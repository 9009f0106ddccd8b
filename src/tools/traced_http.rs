//! The HTTP client of external MCP servers, with each call's trace
//! context in its HTTP headers too: rmcp sends from a task of its own,
//! where the turn's span is not current, so the context rides in the
//! message's `_meta` (where MCP carries it) and is copied to
//! `traceparent`/`tracestate` headers here for servers and proxies that
//! read only those.

use std::collections::HashMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
};

use crate::telemetry::otel;

/// `reqwest::Client` as rmcp uses it, plus the trace headers.
#[derive(Clone)]
pub struct TracedHttp(pub reqwest::Client);

type Headers = HashMap<HeaderName, HeaderValue>;

/// `headers` with the trace context of `message`'s `_meta`, if any.
fn with_trace(message: &ClientJsonRpcMessage, mut headers: Headers) -> Headers {
    if !otel::exporting() {
        return headers;
    }
    let Ok(serde_json::Value::Object(value)) = serde_json::to_value(message) else {
        return headers;
    };
    let meta = value
        .get("params")
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.as_object());
    if let Some(meta) = meta {
        let mut carried = http::HeaderMap::new();
        otel::copy_json_to_headers(meta, &mut carried);
        for (name, value) in carried.iter() {
            headers.insert(name.clone(), value.clone());
        }
    }
    headers
}

impl StreamableHttpClient for TracedHttp {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: Headers,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let headers = with_trace(&message, custom_headers);
        self.0
            .post_message(uri, message, session_id, auth_header, headers)
            .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: Headers,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let headers = with_trace(&message, custom_headers);
        self.0
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                headers,
                max_sse_event_size,
            )
            .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: Headers,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.0
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: Headers,
    ) -> Result<
        BoxStream<'static, Result<sse_stream::Sse, SseError>>,
        StreamableHttpError<Self::Error>,
    > {
        self.0
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: Headers,
        max_sse_event_size: usize,
    ) -> Result<
        BoxStream<'static, Result<sse_stream::Sse, SseError>>,
        StreamableHttpError<Self::Error>,
    > {
        self.0
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}
