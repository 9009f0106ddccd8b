//! The model provider of agent sessions whose model names a gateway pool:
//! the call goes through [`Gateway::forward`] in process, carrying the
//! session id, so the pool's strategy (a session stays on one replica under
//! `session_affinity`), retries and traces apply as to any client.
//!
//! A pool's context window is the least its replicas report (vLLM's
//! `max_model_len`, llama-server's `n_ctx`), asked of the replicas of the
//! configuration only: one added by a request is reached only through the
//! gateway's `allowed_upstreams` checks, which the probe does not make.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::StreamExt;
use http_body_util::BodyDataStream;
use serde_json::{Map, Value, json};

use super::http::spawn_sse_bytes;
use super::openai::{ChunkDecoder, wire_request};
use super::window::ReportedWindows;
use super::{ChatRequest, ModelError, ModelProvider, ModelStream};
use crate::gateway::json::Object;
use crate::gateway::{Endpoint, Gateway, GatewayCall, GatewayError};
use crate::sync::lock;
use crate::telemetry::otel::Parent;

pub struct GatewayProvider {
    gateway: Arc<Gateway>,
    /// What each replica reports, by its base URL.
    windows: Mutex<HashMap<String, Arc<ReportedWindows>>>,
}

impl GatewayProvider {
    pub fn new(gateway: Arc<Gateway>) -> GatewayProvider {
        GatewayProvider {
            gateway,
            windows: Mutex::default(),
        }
    }

    fn reported(&self, url: &str, api_key: Option<&str>) -> Option<Arc<ReportedWindows>> {
        let mut windows = lock(&self.windows);
        if let Some(known) = windows.get(url) {
            return Some(known.clone());
        }
        let made = Arc::new(ReportedWindows::new(url, api_key).ok()?);
        windows.insert(url.to_owned(), made.clone());
        Some(made)
    }
}

#[async_trait]
impl ModelProvider for GatewayProvider {
    fn provider_name(&self) -> &'static str {
        "conclave.gateway"
    }

    /// The least window the pool's configured replicas report: a request
    /// that fits it fits whichever replica serves it.
    async fn context_window(&self, model: &str) -> Option<u64> {
        let pool = self.gateway.pool(model)?;
        let asked: Vec<(String, String, Option<String>)> = pool
            .replicas()
            .iter()
            .filter(|replica| !replica.guarded)
            .map(|r| (r.url.clone(), r.model.clone(), r.api_key.clone()))
            .collect();
        let mut least: Option<u64> = None;
        for (url, served, api_key) in asked {
            let Some(windows) = self.reported(&url, api_key.as_deref()) else {
                continue;
            };
            if let Some(window) = windows.of(&served).await {
                least = Some(least.map_or(window, |l| l.min(window)));
            }
        }
        least
    }

    async fn stream(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        let body = match serde_json::to_value(wire_request(&request)) {
            Ok(Value::Object(body)) => body,
            _ => return Err(ModelError::Protocol("cannot encode the request".into())),
        };
        let mut metadata = Map::new();
        if let Some(id) = &request.session_id {
            metadata.insert("session_id".into(), json!(id));
        }
        let call = GatewayCall {
            endpoint: Endpoint::Chat,
            body: Object::from_map(body),
            metadata,
            session_id: request.session_id.clone(),
            owner: request.owner.clone(),
            parent: Parent::Current,
        };
        let upstream = self.gateway.forward(call).await.map_err(|e| match e {
            GatewayError::Unreachable { .. }
            | GatewayError::NoReplica(_)
            | GatewayError::EmptyPool(_) => ModelError::Connect {
                url: format!("gateway pool {}", request.model),
                message: e.to_string(),
            },
            other => ModelError::Upstream(other.to_string()),
        })?;
        if !upstream.status.is_success() {
            let status = upstream.status.as_u16();
            let mut body = Vec::new();
            let mut stream = BodyDataStream::new(upstream.body);
            while let Some(Ok(chunk)) = stream.next().await {
                body.extend_from_slice(&chunk);
            }
            return Err(ModelError::Http {
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        Ok(spawn_sse_bytes(
            BodyDataStream::new(upstream.body),
            ChunkDecoder::new(request),
        ))
    }
}
