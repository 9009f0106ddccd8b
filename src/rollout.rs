//! Rollouts: a batch of prompts sent to one model in one request
//! (`POST /rollouts`), the results coming back on the bus. Every prompt
//! of a rollout goes through the gateway pool of its model with bounded
//! concurrency (the pool's strategy, retries, traces and weight gate
//! apply); each completion is published on the response topic as it
//! finishes, tagged with the replica and the weights version it ran under,
//! a failed prompt with its error; `rollout.completed` ends the rollout.
//!
//! The response topic is the request's, or else the value of the KV key
//! `inference_response_topic`, waited for (not polled) for a bounded time,
//! so a trainer that names its topic in the KV after sending the request
//! still gets every result.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::Serialize;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::bus::{Bus, Kv, Subject};
use crate::gateway::{Endpoint, Gateway, GatewayCall, GatewayError};
use crate::sync::lock;
use crate::telemetry::Metrics;

/// The KV key naming the default response topic.
pub const RESPONSE_TOPIC_KEY: &str = "inference_response_topic";
/// Where the end of a rollout is announced.
pub const COMPLETED: &str = "rollout.completed";
/// Prompts of one rollout at most.
pub const MAX_PROMPTS: usize = 100_000;
/// The largest completion body read from a replica.
const MAX_COMPLETION_BYTES: usize = 16 * 1024 * 1024;

/// One prompt: text for `/v1/completions`, or chat messages.
#[derive(Debug, Clone)]
pub enum Input {
    Prompt(String),
    Messages(Vec<Value>),
}

impl Input {
    fn json(&self) -> Value {
        match self {
            Input::Prompt(text) => Value::String(text.clone()),
            Input::Messages(messages) => Value::Array(messages.clone()),
        }
    }
}

/// A rollout as asked for.
#[derive(Debug, Clone)]
pub struct RolloutRequest {
    pub model: String,
    pub inputs: Vec<Input>,
    /// Sampling parameters sent with every prompt (`max_tokens`,
    /// `temperature`, `top_p`, `n`, `logprobs`, `return_token_ids`).
    pub sampling: Map<String, Value>,
    pub response_topic: Option<Subject>,
    pub metadata: Value,
}

/// A rollout's progress, for `GET /rollouts/{id}`.
#[derive(Debug, Serialize)]
pub struct Progress {
    pub rollout_id: Uuid,
    pub model: String,
    pub total: u64,
    pub completed: u64,
    pub failed: u64,
    /// `waiting_for_topic`, `running`, `completed` or `failed`.
    pub state: &'static str,
    pub response_topic: Option<String>,
    pub started_at: DateTime<Utc>,
    pub duration_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

struct Run {
    id: Uuid,
    namespace: String,
    model: String,
    total: u64,
    completed: AtomicU64,
    failed: AtomicU64,
    started_at: DateTime<Utc>,
    started: Instant,
    status: Mutex<Status>,
}

#[derive(Default)]
struct Status {
    state: &'static str,
    topic: Option<String>,
    duration_ms: Option<u64>,
    error: Option<String>,
}

impl Run {
    fn progress(&self) -> Progress {
        let status = lock(&self.status);
        Progress {
            rollout_id: self.id,
            model: self.model.clone(),
            total: self.total,
            completed: self.completed.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            state: status.state,
            response_topic: status.topic.clone(),
            started_at: self.started_at,
            duration_ms: status.duration_ms,
            error: status.error.clone(),
        }
    }

    fn set(&self, change: impl FnOnce(&mut Status)) {
        change(&mut lock(&self.status));
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("no pool serves model {0:?}")]
    UnknownModel(String),
    #[error("the server is shutting down")]
    ShuttingDown,
}

/// Runs the rollouts of every tenant.
pub struct Rollouts {
    gateway: Arc<Gateway>,
    bus: Arc<dyn Bus>,
    kv: Arc<Kv>,
    metrics: Arc<Metrics>,
    concurrency: usize,
    topic_wait: Duration,
    runs: Mutex<HashMap<Uuid, Arc<Run>>>,
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl Rollouts {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gateway: Arc<Gateway>,
        bus: Arc<dyn Bus>,
        kv: Arc<Kv>,
        metrics: Arc<Metrics>,
        concurrency: usize,
        topic_wait: Duration,
        stop: CancellationToken,
    ) -> Rollouts {
        Rollouts {
            gateway,
            bus,
            kv,
            metrics,
            concurrency: concurrency.max(1),
            topic_wait,
            runs: Mutex::default(),
            tasks: TaskTracker::new(),
            stop,
        }
    }

    /// Starts a rollout in `namespace` (the caller's bus) and answers its
    /// id at once. `owner` is the caller's key hash for the traces.
    pub fn start(
        self: &Arc<Self>,
        namespace: &str,
        owner: Option<String>,
        request: RolloutRequest,
    ) -> Result<Uuid, RolloutError> {
        if self.stop.is_cancelled() {
            return Err(RolloutError::ShuttingDown);
        }
        if request.inputs.is_empty() {
            return Err(RolloutError::Invalid {
                field: "prompts",
                message: "at least one prompt (or messages) is needed".into(),
            });
        }
        if request.inputs.len() > MAX_PROMPTS {
            return Err(RolloutError::Invalid {
                field: "prompts",
                message: format!("at most {MAX_PROMPTS} per rollout"),
            });
        }
        if self.gateway.pool(&request.model).is_none() {
            return Err(RolloutError::UnknownModel(request.model));
        }
        let run = Arc::new(Run {
            id: Uuid::new_v4(),
            namespace: namespace.to_owned(),
            model: request.model.clone(),
            total: request.inputs.len() as u64,
            completed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            started_at: Utc::now(),
            started: Instant::now(),
            status: Mutex::new(Status {
                state: "waiting_for_topic",
                ..Status::default()
            }),
        });
        lock(&self.runs).insert(run.id, run.clone());
        let this = self.clone();
        let id = run.id;
        self.tasks.spawn(async move {
            this.metrics.rollouts_running.inc();
            tokio::select! {
                () = this.clone().run(run.clone(), owner, request) => {}
                () = this.stop.cancelled() => run.set(|s| {
                    s.state = "failed";
                    s.error = Some("the server shut down".into());
                }),
            }
            this.metrics.rollouts_running.dec();
        });
        Ok(id)
    }

    /// The progress of the caller's rollout; `None` for another's.
    pub fn progress(&self, namespace: &str, id: Uuid) -> Option<Progress> {
        lock(&self.runs)
            .get(&id)
            .filter(|run| run.namespace == namespace)
            .map(|run| run.progress())
    }

    /// Waits for the rollouts still running (after the stop token).
    pub async fn shutdown(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }

    async fn topic(&self, run: &Run, given: Option<Subject>) -> Result<Subject, String> {
        if let Some(topic) = given {
            return Ok(topic);
        }
        let entry = self
            .kv
            .wait(&run.namespace, RESPONSE_TOPIC_KEY, None, self.topic_wait)
            .await
            .map_err(|e| format!("reading {RESPONSE_TOPIC_KEY}: {e}"))?
            .ok_or_else(|| {
                format!(
                    "no response_topic given and the KV key {RESPONSE_TOPIC_KEY} did not appear within {} s",
                    self.topic_wait.as_secs()
                )
            })?;
        let text = serde_json::from_slice::<String>(&entry.value)
            .or_else(|_| String::from_utf8(entry.value.clone()))
            .map_err(|_| format!("the KV key {RESPONSE_TOPIC_KEY} is not text"))?;
        Subject::parse(&text).map_err(|e| format!("the KV key {RESPONSE_TOPIC_KEY}: {e}"))
    }

    async fn run(self: Arc<Self>, run: Arc<Run>, owner: Option<String>, request: RolloutRequest) {
        let topic = match self.topic(&run, request.response_topic.clone()).await {
            Ok(topic) => topic,
            Err(error) => {
                run.set(|s| {
                    s.state = "failed";
                    s.error = Some(error);
                });
                return;
            }
        };
        run.set(|s| {
            s.state = "running";
            s.topic = Some(topic.as_str().to_owned());
        });
        let request = Arc::new(request);
        let results = futures::stream::iter(0..request.inputs.len())
            .map(|index| {
                let this = self.clone();
                let (run, request, owner, topic) =
                    (run.clone(), request.clone(), owner.clone(), topic.clone());
                async move {
                    let result = this.complete(&run, &request, index, owner).await;
                    let failed = result.get("error").is_some();
                    let payload = Bytes::from(result.to_string());
                    if let Err(e) = this.bus.publish(&run.namespace, &topic, payload).await {
                        tracing::warn!(error = %e, rollout = %run.id, index, "cannot publish a rollout result");
                    }
                    let counter = if failed { &run.failed } else { &run.completed };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            })
            .buffer_unordered(self.concurrency);
        results.collect::<()>().await;
        let duration_ms = run.started.elapsed().as_millis() as u64;
        let done = json!({
            "rollout_id": run.id,
            "count": run.total,
            "failed": run.failed.load(Ordering::Relaxed),
            "duration_ms": duration_ms,
        });
        if let Ok(subject) = Subject::parse(COMPLETED) {
            let _ = self
                .bus
                .publish(&run.namespace, &subject, Bytes::from(done.to_string()))
                .await;
        }
        run.set(|s| {
            s.state = "completed";
            s.duration_ms = Some(duration_ms);
        });
    }

    /// One prompt through the gateway: the result to publish, with its
    /// outputs or its error.
    async fn complete(
        &self,
        run: &Run,
        request: &RolloutRequest,
        index: usize,
        owner: Option<String>,
    ) -> Value {
        let input = &request.inputs[index];
        let mut result = json!({
            "rollout_id": run.id,
            "index": index,
            "prompt": input.json(),
            "metadata": request.metadata,
        });
        match self.call(request, input, owner, run.id, index).await {
            Ok(done) => {
                for (key, value) in done {
                    result[key] = value;
                }
            }
            Err(error) => result["error"] = Value::String(error),
        }
        result
    }

    async fn call(
        &self,
        request: &RolloutRequest,
        input: &Input,
        owner: Option<String>,
        rollout: Uuid,
        index: usize,
    ) -> Result<Vec<(&'static str, Value)>, String> {
        let mut body = request.sampling.clone();
        body.insert("model".into(), Value::String(request.model.clone()));
        body.insert("stream".into(), Value::Bool(false));
        let endpoint = match input {
            Input::Prompt(text) => {
                body.insert("prompt".into(), Value::String(text.clone()));
                Endpoint::Completions
            }
            Input::Messages(messages) => {
                body.insert("messages".into(), Value::Array(messages.clone()));
                Endpoint::Chat
            }
        };
        let mut metadata = Map::new();
        metadata.insert("rollout_id".into(), Value::String(rollout.to_string()));
        metadata.insert("index".into(), Value::from(index));
        let upstream = self
            .gateway
            .forward(GatewayCall {
                endpoint,
                body: crate::gateway::json::Object::from_map(body),
                metadata,
                session_id: None,
                owner,
                parent: crate::telemetry::otel::Parent::Current,
            })
            .await
            .map_err(|e: GatewayError| e.to_string())?;
        let status = upstream.status;
        let (replica, weights_version) =
            (upstream.replica.clone(), upstream.weights_version.clone());
        let mut bytes = Vec::new();
        let mut body = http_body_util::BodyDataStream::new(upstream.body);
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| format!("reading the replica's answer: {e}"))?;
            if bytes.len() + chunk.len() > MAX_COMPLETION_BYTES {
                return Err(format!(
                    "the replica's answer is over {MAX_COMPLETION_BYTES} bytes"
                ));
            }
            bytes.extend_from_slice(&chunk);
        }
        let answer: Value = serde_json::from_slice(&bytes)
            .map_err(|e| format!("the replica's answer is not JSON: {e}"))?;
        if !status.is_success() {
            let message = answer["error"]["message"]
                .as_str()
                .map_or_else(|| answer.to_string(), str::to_owned);
            return Err(format!(
                "replica {replica} answered HTTP {}: {message}",
                status.as_u16()
            ));
        }
        let outputs: Vec<Value> = answer["choices"]
            .as_array()
            .map(|choices| choices.iter().map(output).collect())
            .unwrap_or_default();
        Ok(vec![
            ("outputs", Value::Array(outputs)),
            ("replica", Value::String(replica)),
            ("weights_version", weights_version.unwrap_or(Value::Null)),
            ("usage", answer["usage"].clone()),
        ])
    }
}

/// One choice as a rollout output: `{text, token_ids, logprobs,
/// finish_reason}`.
fn output(choice: &Value) -> Value {
    let text = choice["text"]
        .as_str()
        .or_else(|| choice["message"]["content"].as_str())
        .unwrap_or_default();
    json!({
        "text": text,
        "token_ids": choice["token_ids"],
        "logprobs": choice["logprobs"],
        "finish_reason": choice["finish_reason"],
    })
}
