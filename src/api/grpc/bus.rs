//! The bus over gRPC (`proto/bus.proto`), served on the HTTP listener
//! (HTTP/2) under `/conclave.bus.v1.Bus/`. The same behaviour as the HTTP
//! routes: the caller's key picks the namespace, errors map to the
//! matching status codes (in `grpc_error`).

use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::api::http::auth::Caller;
use crate::api::http::state::AppState;
use crate::api::routes::bus::namespace;
use crate::bus::{BusError, Delivery, Pattern, Since, Subject};
use crate::rollout::{Input, RolloutRequest};
use crate::store::{Expect, KvWrite};

/// The code generated from `proto/bus.proto`.
#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs
)]
pub mod proto {
    tonic::include_proto!("conclave.bus.v1");
}

use proto::bus_server::{Bus as BusService, BusServer};
use proto::{Delivery as ProtoDelivery, delivery};

/// Longest `wait_s` of a `KVGet`.
const MAX_WAIT_S: f64 = 300.0;

/// The tonic service of the bus.
pub fn service(state: AppState) -> BusServer<GrpcBus> {
    BusServer::new(GrpcBus { state })
}

/// Whether a request speaks gRPC, so its errors take gRPC's form.
pub fn is_grpc(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

pub struct GrpcBus {
    state: AppState,
}

fn caller<T>(request: &Request<T>) -> Result<Caller, Status> {
    request
        .extensions()
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("no caller identity"))
}

fn conflict(key: &str, current: Option<u64>) -> Status {
    let found = current.map_or_else(
        || "does not exist".to_owned(),
        |r| format!("is at revision {r}"),
    );
    Status::failed_precondition(format!("key {key:?} {found}"))
}

/// A gRPC rollout as the HTTP one's request.
fn rollout_request(message: proto::RolloutRequest) -> Result<RolloutRequest, Status> {
    let mut sampling = serde_json::Map::new();
    if let Some(s) = message.sampling {
        let fields = [
            ("max_tokens", s.max_tokens.map(serde_json::Value::from)),
            ("temperature", s.temperature.map(serde_json::Value::from)),
            ("top_p", s.top_p.map(serde_json::Value::from)),
            ("n", s.n.map(serde_json::Value::from)),
            ("logprobs", s.logprobs.map(serde_json::Value::from)),
            (
                "return_token_ids",
                s.return_token_ids.map(serde_json::Value::from),
            ),
        ];
        sampling.extend(
            fields
                .into_iter()
                .filter_map(|(k, v)| Some((k.to_owned(), v?))),
        );
    }
    let response_topic = match message.response_topic.as_str() {
        "" => None,
        topic => Some(
            Subject::parse(topic)
                .map_err(|e| Status::invalid_argument(format!("response_topic: {e}")))?,
        ),
    };
    let metadata = match message.metadata_json.as_str() {
        "" => serde_json::Value::Null,
        text => serde_json::from_str(text)
            .map_err(|e| Status::invalid_argument(format!("metadata_json: not JSON: {e}")))?,
    };
    Ok(RolloutRequest {
        model: message.model,
        inputs: message.prompts.into_iter().map(Input::Prompt).collect(),
        sampling,
        response_topic,
        metadata,
    })
}

type Streamed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn delivery(delivery: Delivery) -> ProtoDelivery {
    let kind = match delivery {
        Delivery::Message(m) => delivery::Kind::Message(proto::BusMessage {
            subject: m.subject.as_str().to_owned(),
            seq: m.seq,
            time_us: m.time.timestamp_micros(),
            payload: m.payload.to_vec(),
        }),
        Delivery::Lagged {
            subject,
            since,
            missed,
        } => delivery::Kind::Lagged(proto::Lagged {
            subject,
            since,
            missed,
        }),
    };
    ProtoDelivery { kind: Some(kind) }
}

#[tonic::async_trait]
impl BusService for GrpcBus {
    async fn publish(
        &self,
        request: Request<proto::PublishRequest>,
    ) -> Result<Response<proto::PublishReply>, Status> {
        let caller = caller(&request)?;
        let message = request.into_inner();
        let subject = Subject::parse(&message.subject).map_err(BusError::from)?;
        let seq = self
            .state
            .bus
            .publish(namespace(&caller), &subject, Bytes::from(message.payload))
            .await?;
        Ok(Response::new(proto::PublishReply {
            subject: message.subject,
            seq,
        }))
    }

    type SubscribeStream = Streamed<ProtoDelivery>;

    async fn subscribe(
        &self,
        request: Request<proto::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let caller = caller(&request)?;
        let message = request.into_inner();
        if message.subjects.is_empty() {
            return Err(Status::invalid_argument("subjects: at least one pattern"));
        }
        let patterns = message
            .subjects
            .iter()
            .map(|s| Pattern::parse(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(BusError::from)?;
        let since = Since::parse(&message.since).map_err(Status::invalid_argument)?;
        let deliveries = self
            .state
            .bus
            .subscribe(namespace(&caller), patterns, since)
            .await?
            .take_until(self.state.stop.clone().cancelled_owned())
            .map(|d| Ok(delivery(d)));
        Ok(Response::new(Box::pin(deliveries)))
    }

    async fn kv_put(
        &self,
        request: Request<proto::KvPutRequest>,
    ) -> Result<Response<proto::KvPutReply>, Status> {
        let caller = caller(&request)?;
        let message = request.into_inner();
        let write = self
            .state
            .kv
            .put(
                namespace(&caller),
                &message.key,
                Bytes::from(message.value),
                Expect::if_revision(message.if_revision),
            )
            .await?;
        match write {
            KvWrite::Done(revision) => Ok(Response::new(proto::KvPutReply {
                key: message.key,
                revision,
            })),
            KvWrite::Conflict { current } => Err(conflict(&message.key, current)),
        }
    }

    async fn kv_get(
        &self,
        request: Request<proto::KvGetRequest>,
    ) -> Result<Response<proto::KvEntry>, Status> {
        let caller = caller(&request)?;
        let message = request.into_inner();
        let ns = namespace(&caller);
        if !(0.0..=MAX_WAIT_S).contains(&message.wait_s) {
            return Err(Status::invalid_argument(format!(
                "wait_s: must be between 0 and {MAX_WAIT_S} seconds"
            )));
        }
        let entry = if message.wait_s > 0.0 {
            let timeout = Duration::from_secs_f64(message.wait_s);
            tokio::select! {
                entry = self.state.kv.wait(ns, &message.key, message.after, timeout) => entry?,
                () = self.state.stop.cancelled() => return Err(BusError::Closed.into()),
            }
        } else {
            self.state.kv.get(ns, &message.key).await?
        };
        let entry = entry.ok_or_else(|| Status::not_found(format!("no key {:?}", message.key)))?;
        Ok(Response::new(proto::KvEntry {
            key: entry.key,
            value: entry.value,
            revision: entry.revision,
            updated_us: entry.updated_at.timestamp_micros(),
        }))
    }

    async fn kv_delete(
        &self,
        request: Request<proto::KvDeleteRequest>,
    ) -> Result<Response<proto::KvDeleteReply>, Status> {
        let caller = caller(&request)?;
        let message = request.into_inner();
        let deleted = self
            .state
            .kv
            .delete(
                namespace(&caller),
                &message.key,
                Expect::if_revision(message.if_revision),
            )
            .await?;
        match deleted {
            Some(KvWrite::Done(revision)) => Ok(Response::new(proto::KvDeleteReply {
                key: message.key,
                revision,
            })),
            Some(KvWrite::Conflict { current }) => Err(conflict(&message.key, current)),
            None => Err(Status::not_found(format!("no key {:?}", message.key))),
        }
    }

    async fn rollout(
        &self,
        request: Request<proto::RolloutRequest>,
    ) -> Result<Response<proto::RolloutReply>, Status> {
        let caller = caller(&request)?;
        let message = request.into_inner();
        let request = rollout_request(message)?;
        let id = self
            .state
            .rollouts
            .start(namespace(&caller), caller.owner.clone(), request)?;
        Ok(Response::new(proto::RolloutReply {
            rollout_id: id.to_string(),
        }))
    }

    type KVWatchStream = Streamed<proto::KvChange>;

    async fn kv_watch(
        &self,
        request: Request<proto::KvWatchRequest>,
    ) -> Result<Response<Self::KVWatchStream>, Status> {
        let caller = caller(&request)?;
        let prefix = request.into_inner().prefix;
        let changes = self
            .state
            .kv
            .watch(namespace(&caller), &prefix)
            .take_until(self.state.stop.clone().cancelled_owned())
            .map(|change| {
                Ok(proto::KvChange {
                    key: change.key.clone(),
                    revision: change.revision,
                    value: change.value.as_ref().map(|v| v.to_vec()),
                })
            });
        Ok(Response::new(Box::pin(changes)))
    }
}
