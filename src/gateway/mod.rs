//! The OpenAI-compatible gateway: model pools of inference replicas behind
//! one endpoint, with strategies, retries on another replica, cooldowns,
//! health checks, run-time membership, and a trace of every call.
//!
//! - `[gateway]` and its pools are [`crate::config::GatewayConfig`].
//! - [`endpoint`]: the endpoints balanced (chat, completions, responses,
//!   embeddings, tokenize, detokenize), where each lives on a replica, and
//!   the checks a body passes before one is called.
//! - [`responses`]: which replica made each Responses API response, so a
//!   follow-up goes there.
//! - [`pool`]: replicas, their states and figures.
//! - `policy`: how a pool picks a replica, one file per strategy behind
//!   one trait.
//! - `health`: the checks that take replicas out and bring them back.
//! - [`trace`]: the trace log and the recorder that fills it from a
//!   response as it streams to the client.
//! - [`slug`]: the `/meta/{slug}/v1/…` metadata codec.

mod attempt;
pub mod body;
pub mod client;
pub mod endpoint;
mod health;
pub mod json;
pub mod params;
mod policy;
pub mod pool;
pub mod responses;
pub mod slug;
pub mod trace;
mod trace_read;
pub mod weights;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use serde_json::{Map, Value};

pub use crate::config::litellm;
pub use crate::config::{GatewayConfig, HealthConfig, PoolConfig, ReplicaConfig, Strategy};
use attempt::Failure;
use body::TracedBody;
pub use endpoint::Endpoint;
use params::shape_request;
use pool::{Pool, Replica, ReplicaState, ReplicaView};
use responses::ResponseRoutes;
use trace::{Recorder, TraceLog, TraceStart};

/// The most of a replica's error body kept to pass on to the client.
const PASSED_ON_ERROR_BODY: usize = 64 * 1024;

use crate::sync::{read, write};
use crate::telemetry::call::CallSpan;
use crate::telemetry::{Metrics, ReplicaLabel};

/// A call for the gateway: the client's JSON body and who it is for.
pub struct GatewayCall {
    pub endpoint: Endpoint,
    pub body: json::Object,
    /// From the `/meta/{slug}` path, else empty.
    pub metadata: Map<String, Value>,
    /// From the metadata, else the `x-session-id` header.
    pub session_id: Option<String>,
    /// The key hash of the caller, which alone reads the call's trace;
    /// `None` when auth is off.
    pub owner: Option<String>,
    /// Where the call's span hangs in its trace.
    pub parent: crate::telemetry::otel::Parent,
}

/// Why a call got no upstream response to pass on.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("{0}")]
    BadRequest(String),
    #[error("no pool serves model {model:?}; known models: {known}")]
    UnknownModel { model: String, known: String },
    #[error("pool {0:?} has no replica that can take calls (all paused, draining or unhealthy)")]
    NoReplica(String),
    #[error("pool {0:?} has no replicas; add one with POST /gateway/replicas, or delete the pool")]
    EmptyPool(String),
    #[error("no pool {0:?}")]
    UnknownPool(String),
    #[error("no replica of pool {pool:?} answered after {attempts} attempt(s): {last}")]
    Unreachable {
        pool: String,
        attempts: u32,
        last: String,
    },
    #[error("no replica {0:?}")]
    UnknownReplica(String),
    #[error("{0}")]
    Conflict(String),
    /// A `previous_response_id` another key's call made.
    #[error("no response {0:?}")]
    UnknownResponse(String),
    #[error(
        "replica {replica:?} of pool {pool:?} does not serve /{path} (it answered 404); \
         vLLM and SGLang serve it"
    )]
    NotServed {
        pool: String,
        replica: String,
        path: &'static str,
    },
    #[error("pool {pool:?} is paused for a weight update and was not resumed within {waited_s} s")]
    Paused { pool: String, waited_s: u64 },
    #[error(
        "pool {pool:?} still had {in_flight} call(s) in flight after {waited_s} s; it stays paused until a commit"
    )]
    StillBusy {
        pool: String,
        in_flight: u64,
        waited_s: u64,
    },
}

/// An upstream response to pass on: status, headers and a body that
/// records the call's trace as it streams.
pub struct Upstream {
    pub status: StatusCode,
    pub content_type: Option<HeaderValue>,
    /// The body's length when the replica said it (not for streams): passed
    /// on, so the answer goes out whole rather than in chunks.
    pub content_length: Option<u64>,
    pub replica: String,
    /// The weights version the call ran under.
    pub weights_version: Option<Value>,
    pub body: TracedBody,
}

/// The gateway: pools by model name, HTTP clients, the traces.
pub struct Gateway {
    pools: RwLock<BTreeMap<String, Arc<Pool>>>,
    /// hyper for `http://` replicas, reqwest for `https://`; those added
    /// by requests connect only where `gateway.allowed_upstreams` allows,
    /// after DNS.
    clients: client::Clients,
    upstreams: Arc<crate::egress::Rules>,
    pub traces: Arc<TraceLog>,
    metrics: Arc<Metrics>,
    /// Which replica made each Responses API response.
    responses: Arc<ResponseRoutes>,
}

impl Gateway {
    /// The gateway of `config`, whose replicas added at run time must be
    /// where `allowed_upstreams` says.
    pub fn new(
        config: &GatewayConfig,
        allowed_upstreams: &[String],
        metrics: Arc<Metrics>,
    ) -> Result<Gateway, String> {
        config.validate()?;
        let upstreams = Arc::new(
            crate::egress::Rules::parse(allowed_upstreams)
                .map_err(|e| format!("gateway.allowed_upstreams: {e}"))?,
        );
        let clients = client::Clients::new(&upstreams)?;
        let pools = config
            .pools
            .iter()
            .map(|(name, pool)| {
                let replicas = pool
                    .replicas
                    .iter()
                    .enumerate()
                    .map(|(index, r)| {
                        Arc::new(Replica::new(
                            crate::config::replica_id(name, index, r),
                            &r.url,
                            r.model.clone().unwrap_or_else(|| name.clone()),
                            r.api_key.clone(),
                        ))
                    })
                    .collect();
                (
                    name.clone(),
                    Arc::new(Pool::new(name.clone(), pool.clone(), replicas)),
                )
            })
            .collect();
        Ok(Gateway {
            pools: RwLock::new(pools),
            clients,
            upstreams,
            traces: Arc::new(TraceLog::new(config.trace_limit, config.trace_max_bytes)),
            metrics,
            responses: Arc::default(),
        })
    }

    pub fn pool(&self, model: &str) -> Option<Arc<Pool>> {
        read(&self.pools).get(model).cloned()
    }

    pub fn pools(&self) -> Vec<Arc<Pool>> {
        read(&self.pools).values().cloned().collect()
    }

    pub fn is_empty(&self) -> bool {
        read(&self.pools).is_empty()
    }

    /// The pools as config, replicas as they are now (for export).
    pub fn config(&self) -> GatewayConfig {
        let pools = self
            .pools()
            .iter()
            .map(|pool| {
                let mut config = pool.config.clone();
                config.replicas = pool
                    .replicas()
                    .iter()
                    .map(|r| ReplicaConfig {
                        id: Some(r.id.clone()),
                        url: r.url.clone(),
                        model: Some(r.model.clone()),
                        api_key: r.api_key.clone(),
                    })
                    .collect();
                (pool.name.clone(), config)
            })
            .collect();
        GatewayConfig {
            pools,
            ..GatewayConfig::default()
        }
    }

    fn find_replica(&self, id: &str) -> Option<(Arc<Pool>, Arc<Replica>)> {
        self.pools().into_iter().find_map(|pool| {
            let replica = pool.replicas().iter().find(|r| r.id == id).cloned()?;
            Some((pool, replica))
        })
    }

    /// Checks a replica URL from a request against
    /// `gateway.allowed_upstreams`, after resolving its host.
    pub async fn check_upstream(&self, url: &str) -> Result<(), crate::egress::EgressError> {
        self.upstreams.check_url(url).await
    }

    /// Adds a replica to a pool, making the pool (with default settings)
    /// when there is none of that name. Its connections pass
    /// `gateway.allowed_upstreams`; callers check the URL first
    /// ([`Gateway::check_upstream`]) to refuse it up front.
    pub fn add_replica(
        &self,
        pool_name: &str,
        replica: ReplicaConfig,
    ) -> Result<ReplicaView, GatewayError> {
        crate::config::gateway::check_url(&replica.url).map_err(GatewayError::BadRequest)?;
        let mut pools = write(&self.pools);
        let taken: HashSet<String> = pools
            .values()
            .flat_map(|p| {
                p.replicas()
                    .iter()
                    .map(|r| r.id.clone())
                    .collect::<Vec<_>>()
            })
            .collect();
        let pool = pools
            .entry(pool_name.to_string())
            .or_insert_with(|| {
                Arc::new(Pool::new(
                    pool_name.to_string(),
                    PoolConfig::default(),
                    Vec::new(),
                ))
            })
            .clone();
        let id = match replica.id {
            Some(id) if taken.contains(&id) => {
                return Err(GatewayError::Conflict(format!(
                    "a replica {id:?} already exists"
                )));
            }
            Some(id) => id,
            None => (0..)
                .map(|n| format!("{pool_name}-{n}"))
                .find(|id| !taken.contains(id))
                .unwrap_or_default(),
        };
        let mut added = Replica::new(
            id,
            &replica.url,
            replica.model.unwrap_or_else(|| pool_name.to_string()),
            replica.api_key,
        );
        added.guarded = true;
        let added = Arc::new(added);
        pool.add(added.clone());
        tracing::info!(pool = pool_name, replica = %added.id, url = %added.url, "replica added");
        Ok(added.view())
    }

    /// Removes a pool and its replicas now; calls in flight finish.
    pub fn remove_pool(&self, name: &str) -> Result<(), GatewayError> {
        let removed = write(&self.pools).remove(name);
        match removed {
            Some(_) => {
                tracing::info!(pool = name, "pool removed");
                Ok(())
            }
            None => Err(GatewayError::UnknownPool(name.to_string())),
        }
    }

    /// Removes a replica now; its calls in flight finish.
    pub fn remove_replica(&self, id: &str) -> Result<(), GatewayError> {
        let (pool, _) = self
            .find_replica(id)
            .ok_or_else(|| GatewayError::UnknownReplica(id.to_string()))?;
        pool.remove(id);
        tracing::info!(pool = %pool.name, replica = id, "replica removed");
        Ok(())
    }

    /// Sets a replica's state; a draining one is removed once idle.
    pub fn set_state(&self, id: &str, state: ReplicaState) -> Result<ReplicaView, GatewayError> {
        let (pool, replica) = self
            .find_replica(id)
            .ok_or_else(|| GatewayError::UnknownReplica(id.to_string()))?;
        replica.set_state(state);
        tracing::info!(pool = %pool.name, replica = id, ?state, "replica state set");
        let view = replica.view();
        pool.remove_drained();
        Ok(view)
    }

    /// Pauses the pool for a weight update: new calls wait, and this
    /// returns once the calls in flight have ended (or `timeout` passed).
    pub async fn begin_weights(&self, model: &str, timeout: Duration) -> Result<(), GatewayError> {
        let pool = self
            .pool(model)
            .ok_or_else(|| GatewayError::UnknownPool(model.to_owned()))?;
        pool.weights
            .begin(timeout)
            .await
            .map_err(|busy| GatewayError::StillBusy {
                pool: pool.name.clone(),
                in_flight: busy.in_flight,
                waited_s: timeout.as_secs(),
            })
    }

    /// Records `version` on each replica of the pool and resumes it;
    /// answers the replicas' ids.
    pub fn commit_weights(&self, model: &str, version: Value) -> Result<Vec<String>, GatewayError> {
        let pool = self
            .pool(model)
            .ok_or_else(|| GatewayError::UnknownPool(model.to_owned()))?;
        let replicas = pool.replicas();
        for replica in replicas.iter() {
            replica.set_weights_version(version.clone());
        }
        pool.weights.commit(version);
        Ok(replicas.iter().map(|r| r.id.clone()).collect())
    }

    /// Runs a call: picks a replica, retries on another after a connect
    /// error, a 5xx or a 429 (up to the pool's `num_retries`), and returns
    /// the first response worth passing on. [`Gateway::forward`] wraps it
    /// in the call's span.
    async fn forward_call(
        &self,
        call: GatewayCall,
        model: Option<String>,
        span: &mut CallSpan,
    ) -> Result<Upstream, GatewayError> {
        let GatewayCall {
            endpoint,
            mut body,
            metadata,
            session_id,
            owner,
            parent: _,
        } = call;
        let model = model.ok_or_else(|| {
            GatewayError::BadRequest("the request needs a \"model\" string".into())
        })?;
        endpoint.check(&body)?;
        let pinned = match endpoint {
            Endpoint::Responses => self.pinned(&body, owner.as_deref())?,
            _ => None,
        };
        let pool = self
            .pool(&model)
            .ok_or_else(|| GatewayError::UnknownModel {
                model: model.clone(),
                known: match self.pools().as_slice() {
                    [] => "none (add replicas with POST /gateway/replicas or \
                           [gateway.pools] in the config)"
                        .into(),
                    pools => pools
                        .iter()
                        .map(|p| p.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                },
            })?;
        shape_request(endpoint, &pool.config, &mut body);
        let wait = pool.config.weights_wait_s;
        let admitted = pool
            .weights
            .admit(Duration::from_secs(wait))
            .await
            .ok_or_else(|| GatewayError::Paused {
                pool: pool.name.clone(),
                waited_s: wait,
            })?;
        let start = TraceStart {
            owner,
            session_id,
            metadata,
            model: model.clone(),
            endpoint: endpoint.path(),
            weights_version: admitted.version.clone(),
        };
        let streamed = endpoint.generates() && body.get::<bool>("stream").unwrap_or(false);
        let started = Instant::now();
        let mut tried: Vec<Arc<Replica>> = Vec::new();
        let mut last_failure: Option<Failure> = None;
        let attempts = pool.config.num_retries + 1;
        for attempt in 0..attempts {
            // A follow-up goes where its previous response is, while it can.
            let pinned = pinned.as_deref().and_then(|id| pool.pinned(id, &tried));
            let Some(replica) =
                pinned.or_else(|| pool.pick(start.session_id.as_deref(), Some(&body), &tried))
            else {
                break;
            };
            tried.push(replica.clone());
            body.set("model", replica.model.as_str());
            // Shared by the request and its trace, not copied for it.
            let payload = body.to_bytes();
            let guard = replica.start_call();
            let sent = self.send(
                &pool,
                &replica,
                endpoint,
                payload.clone(),
                attempt + 1,
                span,
            );
            match sent.await {
                Ok(response)
                    if endpoint.at_root() && response.status() == StatusCode::NOT_FOUND =>
                {
                    let mut trace = start.attempt(Some((&replica.id, &replica.model)), payload);
                    trace.http_status = Some(404);
                    trace.status = "error";
                    let error = GatewayError::NotServed {
                        pool: pool.name.clone(),
                        replica: replica.id.clone(),
                        path: endpoint.path(),
                    };
                    trace.error = Some(error.to_string());
                    self.traces.push(trace);
                    self.count(&pool.name, &replica.id, "error");
                    return Err(error);
                }
                Ok(response) => {
                    let status = response.status();
                    let content_type = response.headers().get(CONTENT_TYPE).cloned();
                    let content_length = hyper::body::Body::size_hint(response.body()).exact();
                    let mut trace = start.attempt(Some((&replica.id, &replica.model)), payload);
                    trace.http_status = Some(status.as_u16());
                    trace.retries = attempt;
                    let streamed = streamed && status.is_success();
                    let mut recorder =
                        Recorder::new(trace, started, streamed).with_length(content_length);
                    if endpoint == Endpoint::Responses {
                        recorder = recorder.remembering(self.responses.clone());
                    }
                    return Ok(Upstream {
                        status,
                        content_type,
                        content_length,
                        replica: replica.id.clone(),
                        weights_version: admitted.version.clone(),
                        body: TracedBody {
                            inner: response.into_body(),
                            recorder: Some(recorder),
                            call: Some(guard),
                            traces: Some(self.traces.clone()),
                            metrics: Some(self.metrics.clone()),
                            pool: Some(pool.clone()),
                            _admitted: Some(admitted),
                            on_done: None,
                        },
                    });
                }
                Err(failure) => {
                    drop(guard);
                    replica.cool_down(
                        failure
                            .cooldown
                            .unwrap_or(Duration::from_secs(pool.config.cooldown_s)),
                    );
                    self.count(&pool.name, &replica.id, "retried");
                    tracing::warn!(pool = %pool.name, replica = %replica.id, attempt, error = %failure.message, "gateway call failed; trying another replica");
                    last_failure = Some(failure);
                }
            }
        }
        let Some(failure) = last_failure else {
            return Err(if pool.replicas().is_empty() {
                GatewayError::EmptyPool(pool.name.clone())
            } else {
                GatewayError::NoReplica(pool.name.clone())
            });
        };
        // Every attempt failed: pass the last upstream answer on as it was,
        // or say why none came.
        let last = tried.last().map(|r| (r.id.as_str(), r.model.as_str()));
        let request = body.to_bytes();
        let mut trace = start.attempt(last, request);
        trace.latency_ms = started.elapsed().as_secs_f64() * 1000.0;
        trace.status = "error";
        trace.http_status = failure
            .response
            .as_ref()
            .map(|(status, _, _)| status.as_u16());
        trace.retries = tried.len().saturating_sub(1) as u32;
        trace.error = Some(failure.message.clone());
        self.traces.push(trace);
        if let Some(replica) = tried.last() {
            self.count(&pool.name, &replica.id, "error");
        }
        match failure.response {
            Some((status, content_type, body)) => Ok(Upstream {
                status,
                content_length: None,
                content_type,
                weights_version: start.weights_version.clone(),
                replica: tried.last().map(|r| r.id.clone()).unwrap_or_default(),
                body: TracedBody::ready(body),
            }),
            None => Err(GatewayError::Unreachable {
                pool: pool.name.clone(),
                attempts: tried.len() as u32,
                last: failure.message,
            }),
        }
    }

    /// The replica that made the response a Responses API call follows
    /// on from, if known. A response another key's call made is refused
    /// as unknown: its id alone must not let a caller read on from
    /// another's conversation.
    fn pinned(
        &self,
        body: &json::Object,
        owner: Option<&str>,
    ) -> Result<Option<String>, GatewayError> {
        let Some(id) = body.get::<String>("previous_response_id") else {
            return Ok(None);
        };
        match self.responses.find(&id) {
            Some(route) if route.owner.as_deref() == owner => Ok(Some(route.replica)),
            Some(_) => Err(GatewayError::UnknownResponse(id)),
            None => Ok(None),
        }
    }

    fn count(&self, pool: &str, replica: &str, outcome: &'static str) {
        self.metrics
            .gateway_calls
            .get_or_create(&ReplicaLabel {
                pool: pool.to_string(),
                replica: replica.to_string(),
                outcome,
            })
            .inc();
    }
}
