//! `conclave sim`: an OpenAI-compatible upstream simulator for tests and
//! benchmarks. It answers `/v1/chat/completions`, `/v1/completions` and
//! `/v1/responses` (streamed or not, [`responses`]), `/v1/embeddings`,
//! `/tokenize` and `/detokenize` ([`vectors`]), `/v1/models` and
//! `/health`, with a configurable time
//! to first token, tokens per second, extra latency, failure rate and a
//! scripted tool call. `POST /sim/config` changes any of it while it runs
//! (a test can make a replica fail its health checks, then recover), and
//! `GET /sim/stats` counts what it served. With `prefix_cache_tokens` it
//! models a serving engine's prefix cache ([`cache`]): the time to first
//! token grows with the part of the prompt not cached, so how well a
//! router keeps a conversation on the replica that has it shows as
//! latency.

mod cache;
mod responses;
mod vectors;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::sync::{read, write};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// What the simulator does; every field can be changed at run time.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// Named in every answer (`system_fingerprint` and the text), so a
    /// client sees which replica served it.
    pub id: String,
    /// The model `/v1/models` lists.
    pub model: String,
    /// Tokens in each completion.
    pub tokens: u32,
    /// Before the first token.
    pub ttft_ms: u64,
    /// Pace of the following tokens; 0 sends them at once.
    pub tokens_per_s: f64,
    /// Added before a non-streamed answer.
    pub latency_ms: u64,
    /// Share of calls answered with `failure_status` (0.0–1.0).
    pub failure_rate: f64,
    pub failure_status: u16,
    /// When false, `/health` and `/v1/models` answer 503.
    pub healthy: bool,
    /// A tool call made when the request offers tools and the last message
    /// is not a tool result: `{"name": …, "arguments": {…}}`.
    pub tool_call: Option<Value>,
    /// The completion's text, sent word by word, instead of the replica's
    /// id and numbered tokens (`tokens` is then ignored).
    pub reply: Option<String>,
    /// Prompt tokens (whitespace-separated words of the rendered prompt)
    /// kept as cached prefixes; 0 models no cache and no prefill time.
    pub prefix_cache_tokens: u64,
    /// With a cache, microseconds of prefill per prompt token not cached,
    /// added to `ttft_ms`.
    pub prefill_us_per_token: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            id: "sim".into(),
            model: "sim-model".into(),
            tokens: 16,
            ttft_ms: 0,
            tokens_per_s: 0.0,
            latency_ms: 0,
            failure_rate: 0.0,
            failure_status: 500,
            healthy: true,
            tool_call: None,
            reply: None,
            prefix_cache_tokens: 0,
            prefill_us_per_token: 50,
        }
    }
}

#[derive(Default)]
struct Stats {
    requests: AtomicU64,
    failures: AtomicU64,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
}

#[derive(Clone)]
struct Sim {
    config: Arc<RwLock<SimConfig>>,
    stats: Arc<Stats>,
    /// The prefix cache of `prefix_cache_tokens`, made anew when that
    /// changes.
    cache: Arc<std::sync::Mutex<Option<cache::PrefixCache>>>,
    /// The ids of the Responses API responses it made.
    responses: Arc<responses::Stored>,
}

impl Sim {
    fn config(&self) -> SimConfig {
        read(&self.config).clone()
    }
}

/// The simulator's routes.
pub fn router(config: SimConfig) -> Router {
    let cache = (config.prefix_cache_tokens > 0)
        .then(|| cache::PrefixCache::new(config.prefix_cache_tokens));
    let sim = Sim {
        config: Arc::new(RwLock::new(config)),
        stats: Arc::default(),
        cache: Arc::new(std::sync::Mutex::new(cache)),
        responses: Arc::default(),
    };
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/responses", post(responses::responses))
        .route("/v1/embeddings", post(vectors::embeddings))
        .route("/tokenize", post(vectors::tokenize))
        .route("/detokenize", post(vectors::detokenize))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/sim/config", get(show_config).post(set_config))
        .route("/sim/stats", get(stats))
        .with_state(sim)
}

/// Serves until the process ends, saying where it listens on stdout.
pub async fn serve(listen: SocketAddr, config: SimConfig) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!(
        "conclave sim listening on http://{}",
        listener.local_addr()?
    );
    // Small streamed writes go out at once (Nagle plus delayed ACKs would
    // hold each token for 40 ms).
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router(config)).await?;
    Ok(())
}

async fn show_config(State(sim): State<Sim>) -> Json<SimConfig> {
    Json(sim.config())
}

/// Merges the given fields into the config.
/// The body is read as JSON whatever its `Content-Type`, as a test's
/// `curl -d` sends it.
async fn set_config(State(sim): State<Sim>, body: Bytes) -> Response {
    let patch: Value = match serde_json::from_slice(&body) {
        Ok(patch) => patch,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("malformed JSON: {e}")),
    };
    let mut current = serde_json::to_value(sim.config()).unwrap_or_default();
    if let (Some(current), Some(patch)) = (current.as_object_mut(), patch.as_object()) {
        current.extend(patch.clone());
    }
    match serde_json::from_value::<SimConfig>(current) {
        Ok(config) => {
            let resized = {
                let mut current = write(&sim.config);
                let resized = current.prefix_cache_tokens != config.prefix_cache_tokens;
                *current = config.clone();
                resized
            };
            if resized {
                *crate::sync::lock(&sim.cache) = (config.prefix_cache_tokens > 0)
                    .then(|| cache::PrefixCache::new(config.prefix_cache_tokens));
            }
            Json(config).into_response()
        }
        Err(e) => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("bad sim config: {e}"),
        ),
    }
}

async fn stats(State(sim): State<Sim>) -> Json<Value> {
    let kept = crate::sync::lock(&sim.cache)
        .as_ref()
        .map_or(0, cache::PrefixCache::tokens);
    Json(json!({
        "cache_tokens": kept,
        "requests": sim.stats.requests.load(Ordering::Relaxed),
        "failures": sim.stats.failures.load(Ordering::Relaxed),
        "prompt_tokens": sim.stats.prompt_tokens.load(Ordering::Relaxed),
        "cached_tokens": sim.stats.cached_tokens.load(Ordering::Relaxed),
    }))
}

async fn health(State(sim): State<Sim>) -> Response {
    if sim.config().healthy {
        Json(json!({"status": "ok"})).into_response()
    } else {
        error(StatusCode::SERVICE_UNAVAILABLE, "unhealthy (sim)")
    }
}

async fn models(State(sim): State<Sim>) -> Response {
    let config = sim.config();
    if !config.healthy {
        return error(StatusCode::SERVICE_UNAVAILABLE, "unhealthy (sim)");
    }
    Json(json!({"object": "list", "data": [
        {"id": config.model, "object": "model", "owned_by": config.id}
    ]}))
    .into_response()
}

fn error(status: StatusCode, message: &str) -> Response {
    (
        status,
        Json(json!({"error": {"message": message, "type": "sim_error", "code": status.as_u16()}})),
    )
        .into_response()
}

async fn chat(State(sim): State<Sim>, body: Bytes) -> Response {
    answer(sim, body, true).await
}

async fn completions(State(sim): State<Sim>, body: Bytes) -> Response {
    answer(sim, body, false).await
}

/// What one call asked for.
struct Ask {
    chat: bool,
    stream: bool,
    usage_in_stream: bool,
    logprobs: bool,
    token_ids: bool,
    prompt_tokens: u64,
    /// Leading prompt tokens the prefix cache had.
    cached_tokens: u64,
    /// Before the first token: `ttft_ms`, and the prefill of what the
    /// cache did not have.
    ttft: Duration,
    /// The tool call to make, if this call makes one.
    tool_call: Option<Value>,
    model: String,
}

async fn answer(sim: Sim, body: Bytes, chat: bool) -> Response {
    sim.stats.requests.fetch_add(1, Ordering::Relaxed);
    let config = sim.config();
    let request: Value = match serde_json::from_slice(&body) {
        Ok(Value::Object(map)) => Value::Object(map),
        _ => return error(StatusCode::BAD_REQUEST, "the body must be a JSON object"),
    };
    if config.failure_rate > 0.0 && fastrand::f64() < config.failure_rate {
        sim.stats.failures.fetch_add(1, Ordering::Relaxed);
        let status = StatusCode::from_u16(config.failure_status)
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return error(status, "simulated failure");
    }
    let mut ask = read_ask(&request, &config, chat);
    if let Some(cache) = crate::sync::lock(&sim.cache).as_mut() {
        let tokens = rendered(&request, chat);
        let cached = cache.serve(tokens.iter().map(String::as_str)) as u64;
        let uncached = (tokens.len() as u64).saturating_sub(cached);
        ask.cached_tokens = cached;
        ask.ttft += Duration::from_micros(uncached * config.prefill_us_per_token);
        sim.stats
            .prompt_tokens
            .fetch_add(tokens.len() as u64, Ordering::Relaxed);
        sim.stats.cached_tokens.fetch_add(cached, Ordering::Relaxed);
    }
    if ask.stream {
        stream_answer(config, ask)
    } else {
        tokio::time::sleep(Duration::from_millis(config.latency_ms) + ask.ttft).await;
        if config.tokens_per_s > 0.0 {
            let seconds = f64::from(config.tokens) / config.tokens_per_s;
            tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        }
        Json(whole_answer(&config, &ask)).into_response()
    }
}

fn read_ask(request: &Value, config: &SimConfig, chat: bool) -> Ask {
    let prompt_tokens = if chat {
        request["messages"]
            .as_array()
            .map(|messages| {
                messages
                    .iter()
                    .map(|m| {
                        m["content"]
                            .as_str()
                            .unwrap_or_default()
                            .split_whitespace()
                            .count()
                    })
                    .sum::<usize>()
            })
            .unwrap_or(0)
    } else {
        request["prompt"]
            .as_str()
            .unwrap_or_default()
            .split_whitespace()
            .count()
    } as u64;
    let offers_tools = request["tools"].as_array().is_some_and(|t| !t.is_empty());
    let after_tool = request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .is_some_and(|m| m["role"] == "tool");
    Ask {
        chat,
        stream: request["stream"].as_bool().unwrap_or(false),
        usage_in_stream: request["stream_options"]["include_usage"]
            .as_bool()
            .unwrap_or(false),
        logprobs: request["logprobs"].as_bool().unwrap_or(false)
            || request["logprobs"].as_u64().is_some(),
        token_ids: request["return_token_ids"].as_bool().unwrap_or(false),
        prompt_tokens,
        cached_tokens: 0,
        ttft: Duration::from_millis(config.ttft_ms),
        tool_call: config
            .tool_call
            .clone()
            .filter(|_| chat && offers_tools && !after_tool),
        model: request["model"]
            .as_str()
            .unwrap_or(&config.model)
            .to_string(),
    }
}

/// The prompt as the cache sees it: each message's role and the words of
/// its content, in order (or the completion's prompt).
fn rendered(request: &Value, chat: bool) -> Vec<String> {
    let words =
        |text: &str| -> Vec<String> { text.split_whitespace().map(str::to_owned).collect() };
    if !chat {
        return words(request["prompt"].as_str().unwrap_or_default());
    }
    let mut tokens = Vec::new();
    for message in request["messages"].as_array().into_iter().flatten() {
        tokens.push(format!("<{}>", message["role"].as_str().unwrap_or("user")));
        match &message["content"] {
            Value::String(text) => tokens.extend(words(text)),
            Value::Null => {}
            other => tokens.extend(words(&other.to_string())),
        }
    }
    tokens
}

/// The completion's words: the replica's id, then numbered tokens.
fn words(config: &SimConfig) -> Vec<String> {
    if let Some(reply) = &config.reply {
        return reply.split_inclusive(' ').map(str::to_owned).collect();
    }
    (0..config.tokens)
        .map(|i| {
            if i == 0 {
                config.id.clone()
            } else {
                format!(" t{i}")
            }
        })
        .collect()
}

fn logprob(word: &str, i: usize) -> Value {
    json!({"token": word, "logprob": -0.25 - (i % 4) as f64 * 0.125, "bytes": word.as_bytes(), "top_logprobs": []})
}

fn usage(ask: &Ask, completion: u64) -> Value {
    json!({"prompt_tokens": ask.prompt_tokens, "completion_tokens": completion,
           "total_tokens": ask.prompt_tokens + completion,
           "prompt_tokens_details": {"cached_tokens": ask.cached_tokens}})
}

fn tool_call_value(call: &Value) -> Value {
    json!({"id": "call_sim_1", "type": "function", "function": {
        "name": call["name"].as_str().unwrap_or("tool"),
        "arguments": call.get("arguments").map(Value::to_string).unwrap_or_else(|| "{}".into()),
    }})
}

fn whole_answer(config: &SimConfig, ask: &Ask) -> Value {
    let id = format!("cmpl-sim-{}", uuid::Uuid::new_v4().simple());
    let created = chrono::Utc::now().timestamp();
    if let Some(call) = &ask.tool_call {
        return json!({"id": id, "object": "chat.completion", "created": created, "model": ask.model,
            "system_fingerprint": config.id,
            "choices": [{"index": 0, "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": null, "tool_calls": [tool_call_value(call)]}}],
            "usage": usage(ask, 8)});
    }
    let words = words(config);
    let text: String = words.concat();
    let mut choice = if ask.chat {
        json!({"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}})
    } else {
        json!({"index": 0, "finish_reason": "stop", "text": text})
    };
    if ask.logprobs {
        choice["logprobs"] = json!({"content": words.iter().enumerate().map(|(i, w)| logprob(w, i)).collect::<Vec<_>>()});
    }
    if ask.token_ids {
        choice["token_ids"] = json!((0..words.len()).collect::<Vec<_>>());
    }
    json!({"id": id, "object": if ask.chat { "chat.completion" } else { "text_completion" },
        "created": created, "model": ask.model, "system_fingerprint": config.id,
        "choices": [choice], "usage": usage(ask, words.len() as u64)})
}

fn stream_answer(config: SimConfig, ask: Ask) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(16);
    tokio::spawn(async move {
        let id = format!("cmpl-sim-{}", uuid::Uuid::new_v4().simple());
        let created = chrono::Utc::now().timestamp();
        let object = if ask.chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let frame = |choices: Value, usage: Option<Value>| {
            let mut chunk = json!({"id": id, "object": object, "created": created,
                "model": ask.model, "system_fingerprint": config.id, "choices": choices});
            if let Some(usage) = usage {
                chunk["usage"] = usage;
            }
            Bytes::from(format!("data: {chunk}\n\n"))
        };
        tokio::time::sleep(ask.ttft).await;
        let pause =
            (config.tokens_per_s > 0.0).then(|| Duration::from_secs_f64(1.0 / config.tokens_per_s));
        let mut sent = 0u64;
        let finish;
        if let Some(call) = &ask.tool_call {
            // The arguments in two pieces, as real servers split them.
            let call = tool_call_value(call);
            let arguments = call["function"]["arguments"]
                .as_str()
                .unwrap_or("{}")
                .to_string();
            let half = arguments.len() / 2;
            let first = json!([{"index": 0, "delta": {"role": "assistant", "tool_calls": [{"index": 0,
                "id": call["id"], "type": "function",
                "function": {"name": call["function"]["name"], "arguments": &arguments[..half]}}]}}]);
            let second = json!([{"index": 0, "delta": {"tool_calls": [{"index": 0,
                "function": {"arguments": &arguments[half..]}}]}}]);
            if tx.send(Ok(frame(first, None))).await.is_err()
                || tx.send(Ok(frame(second, None))).await.is_err()
            {
                return;
            }
            sent = 8;
            finish = "tool_calls";
        } else {
            for (i, word) in words(&config).iter().enumerate() {
                if let (Some(pause), true) = (pause, i > 0) {
                    tokio::time::sleep(pause).await;
                }
                let mut choice = if ask.chat {
                    let mut delta = json!({"content": word});
                    if i == 0 {
                        delta["role"] = json!("assistant");
                    }
                    json!({"index": 0, "delta": delta, "finish_reason": null})
                } else {
                    json!({"index": 0, "text": word, "finish_reason": null})
                };
                if ask.logprobs {
                    choice["logprobs"] = json!({"content": [logprob(word, i)]});
                }
                if ask.token_ids {
                    choice["token_ids"] = json!([i]);
                }
                if tx.send(Ok(frame(json!([choice]), None))).await.is_err() {
                    return;
                }
                sent += 1;
            }
            finish = "stop";
        }
        let last = if ask.chat {
            json!([{"index": 0, "delta": {}, "finish_reason": finish}])
        } else {
            json!([{"index": 0, "text": "", "finish_reason": finish}])
        };
        let _ = tx.send(Ok(frame(last, None))).await;
        if ask.usage_in_stream {
            let _ = tx.send(Ok(frame(json!([]), Some(usage(&ask, sent))))).await;
        }
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
    });
    sse(rx)
}

/// An SSE response of what `rx` receives.
fn sse(rx: tokio::sync::mpsc::Receiver<Result<Bytes, Infallible>>) -> Response {
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
