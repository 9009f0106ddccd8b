//! The model provider of agent sessions whose model names a gateway pool:
//! the call goes through [`Gateway::forward`] in process, carrying the
//! session id, so the pool's strategy (a session stays on one replica under
//! `session_affinity`), retries and traces apply as to any client.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use http_body_util::BodyDataStream;
use serde_json::{Map, Value, json};

use super::http::spawn_sse_bytes;
use super::openai::{ChunkDecoder, wire_request};
use super::{ChatRequest, ModelError, ModelProvider, ModelStream};
use crate::gateway::json::Object;
use crate::gateway::{Endpoint, Gateway, GatewayCall, GatewayError};
use crate::telemetry::otel::Parent;

pub struct GatewayProvider {
    gateway: Arc<Gateway>,
}

impl GatewayProvider {
    pub fn new(gateway: Arc<Gateway>) -> GatewayProvider {
        GatewayProvider { gateway }
    }
}

#[async_trait]
impl ModelProvider for GatewayProvider {
    fn provider_name(&self) -> &'static str {
        "conclave.gateway"
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
