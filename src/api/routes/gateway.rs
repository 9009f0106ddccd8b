//! The OpenAI-compatible gateway's routes: `/v1/…` (chat, completions,
//! responses, embeddings), `/tokenize`, `/detokenize` and their
//! `/meta/{slug}/…` forms pass calls to a pool's replicas; `/gateway/replicas` and
//! `/gateway/traces` show and steer them.

use axum::body::Body;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::api::http::auth::Caller;
use crate::api::http::error::{ApiError, ErrorBody};
use crate::api::http::extract::{ApiQuery, JsonObject, RawJsonObject};
use crate::gateway::pool::ReplicaState;
use crate::gateway::trace::{OwnerFilter, Trace};
use crate::gateway::{Endpoint, GatewayCall, ReplicaConfig, slug};
use crate::telemetry::otel::Parent;

/// Longest pool, replica or upstream model name accepted.
const MAX_NAME_BYTES: usize = 256;
use crate::api::http::state::AppState;

/// The two handlers of a balanced endpoint: its own path and its
/// `/meta/{slug}/…` form, each with its OpenAPI attributes.
macro_rules! balanced {
    ($(#[$plain:meta])* $name:ident, $(#[$meta:meta])* $meta_name:ident, $endpoint:expr) => {
        $(#[$plain])*
        pub async fn $name(
            state: State<AppState>,
            Extension(caller): Extension<Caller>,
            headers: CallHeaders,
            body: RawJsonObject,
        ) -> Result<Response, ApiError> {
            forward(state, &caller, $endpoint, Map::new(), headers, body).await
        }

        $(#[$meta])*
        pub async fn $meta_name(
            state: State<AppState>,
            Extension(caller): Extension<Caller>,
            Path(slug): Path<String>,
            headers: CallHeaders,
            body: RawJsonObject,
        ) -> Result<Response, ApiError> {
            meta_forward(state, &caller, $endpoint, &slug, headers, body).await
        }
    };
}

balanced!(
    #[utoipa::path(post, path = "/v1/chat/completions", request_body(content = Object, description = "An OpenAI chat completion request; `model` names a pool"),
        responses((status = 200, description = "The replica's answer, JSON or SSE, passed on"), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 502, body = ErrorBody), (status = 503, body = ErrorBody)))]
    chat,
    #[utoipa::path(post, path = "/meta/{slug}/v1/chat/completions", params(("slug" = String, Path, description = "`conclave1:` or `rllm1:` + base64url JSON metadata")),
        request_body(content = Object), responses((status = 200, description = "As /v1/chat/completions"), (status = 400, body = ErrorBody)))]
    meta_chat,
    Endpoint::Chat
);

balanced!(
    #[utoipa::path(post, path = "/v1/completions", request_body(content = Object, description = "An OpenAI completion request; `model` names a pool"),
        responses((status = 200, description = "The replica's answer, JSON or SSE, passed on"), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 502, body = ErrorBody), (status = 503, body = ErrorBody)))]
    completions,
    #[utoipa::path(post, path = "/meta/{slug}/v1/completions", params(("slug" = String, Path)),
        request_body(content = Object), responses((status = 200, description = "As /v1/completions"), (status = 400, body = ErrorBody)))]
    meta_completions,
    Endpoint::Completions
);

balanced!(
    #[utoipa::path(post, path = "/v1/responses", request_body(content = Object, description = "An OpenAI Responses API request; `model` names a pool, and a `previous_response_id` goes to the replica that made that response (404 when another key's call made it)"),
        responses((status = 200, description = "The replica's answer, JSON or SSE events, passed on"), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 502, body = ErrorBody), (status = 503, body = ErrorBody)))]
    responses,
    #[utoipa::path(post, path = "/meta/{slug}/v1/responses", params(("slug" = String, Path)),
        request_body(content = Object), responses((status = 200, description = "As /v1/responses"), (status = 400, body = ErrorBody)))]
    meta_responses,
    Endpoint::Responses
);

balanced!(
    #[utoipa::path(post, path = "/v1/embeddings", request_body(content = Object, description = "An OpenAI embeddings request; `model` names a pool"),
        responses((status = 200, description = "The replica's answer, passed on"), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 502, body = ErrorBody), (status = 503, body = ErrorBody)))]
    embeddings,
    #[utoipa::path(post, path = "/meta/{slug}/v1/embeddings", params(("slug" = String, Path)),
        request_body(content = Object), responses((status = 200, description = "As /v1/embeddings"), (status = 400, body = ErrorBody)))]
    meta_embeddings,
    Endpoint::Embeddings
);

balanced!(
    #[utoipa::path(post, path = "/tokenize", request_body(content = Object, description = "`{model, prompt}` (vLLM's and SGLang's `/tokenize`); `model` names a pool"),
        responses((status = 200, description = "`{tokens, count, max_model_len}` from the replica"), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody, description = "No such pool, or the replica does not serve /tokenize"), (status = 502, body = ErrorBody)))]
    tokenize,
    #[utoipa::path(post, path = "/meta/{slug}/tokenize", params(("slug" = String, Path)),
        request_body(content = Object), responses((status = 200, description = "As /tokenize"), (status = 400, body = ErrorBody)))]
    meta_tokenize,
    Endpoint::Tokenize
);

balanced!(
    #[utoipa::path(post, path = "/detokenize", request_body(content = Object, description = "`{model, tokens}`; `model` names a pool"),
        responses((status = 200, description = "`{prompt}` from the replica"), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody, description = "No such pool, or the replica does not serve /detokenize"), (status = 502, body = ErrorBody)))]
    detokenize,
    #[utoipa::path(post, path = "/meta/{slug}/detokenize", params(("slug" = String, Path)),
        request_body(content = Object), responses((status = 200, description = "As /detokenize"), (status = 400, body = ErrorBody)))]
    meta_detokenize,
    Endpoint::Detokenize
);

/// A `/meta/{slug}/…` call: the slug's metadata goes with it.
async fn meta_forward(
    state: State<AppState>,
    caller: &Caller,
    endpoint: Endpoint,
    slug: &str,
    headers: CallHeaders,
    body: RawJsonObject,
) -> Result<Response, ApiError> {
    let metadata = slug::decode(slug).map_err(ApiError::bad_request)?;
    forward(state, caller, endpoint, metadata, headers, body).await
}

/// What a gateway call reads of its request's headers: the
/// `x-session-id` header and the trace context, read without copying the
/// other headers (as a `HeaderMap` argument would, for every call).
pub struct CallHeaders {
    session: Option<String>,
    parent: Parent,
}

impl<S: Send + Sync> FromRequestParts<S> for CallHeaders {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let header = parts.headers.get("x-session-id");
        Ok(CallHeaders {
            session: header.and_then(|v| v.to_str().ok()).map(str::to_string),
            // The call's span is the request's: the routes that forward
            // calls make no request span of their own.
            parent: Parent::of_request(&parts.headers),
        })
    }
}

async fn forward(
    State(state): State<AppState>,
    caller: &Caller,
    endpoint: Endpoint,
    metadata: Map<String, Value>,
    CallHeaders { session, parent }: CallHeaders,
    RawJsonObject(body): RawJsonObject,
) -> Result<Response, ApiError> {
    state.quotas.admit_request(caller.owner.as_deref()).await?;
    let session_id = metadata
        .get("session_id")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or(session);
    // Only a key with a daily budget pays a store read here.
    state.usage.check_budget(caller.owner()).await?;
    let mut upstream = state
        .gateway
        .forward(GatewayCall {
            endpoint,
            body,
            metadata,
            session_id,
            owner: caller.owner.clone(),
            parent,
        })
        .await?;
    count_usage(&state, &mut upstream.body);
    let mut response = Response::builder().status(upstream.status.as_u16()).header(
        HeaderName::from_static("x-conclave-replica"),
        upstream.replica.as_str(),
    );
    if let Some(content_type) = upstream.content_type {
        response = response.header(header::CONTENT_TYPE, content_type.as_bytes());
    }
    if let Some(length) = upstream.content_length {
        response = response.header(header::CONTENT_LENGTH, length);
    }
    response
        .body(Body::new(upstream.body))
        .map_err(ApiError::internal)
}

/// Adds the tokens the replica reported to the calling key's usage once
/// the response has passed, off the response's path (written behind, see
/// [`crate::usage::Recorder::add_later`]).
fn count_usage(state: &AppState, body: &mut crate::gateway::body::TracedBody) {
    let usage = state.usage.clone();
    body.on_done(Box::new(move |trace| {
        let Some((input_tokens, output_tokens)) = trace.reported_tokens() else {
            return;
        };
        let add = crate::store::UsageCounts {
            input_tokens,
            output_tokens,
            ..Default::default()
        };
        usage.add_later(trace.owner.as_deref(), &trace.model, add);
    }));
}

#[utoipa::path(get, path = "/v1/models", responses((status = 200, description = "The pools, OpenAI list format")))]
pub async fn models(State(state): State<AppState>) -> Json<Value> {
    let data: Vec<Value> = state
        .gateway
        .pools()
        .iter()
        .map(|pool| {
            json!({"id": pool.name, "object": "model", "owned_by": "conclave",
                   "replicas": pool.replicas().len()})
        })
        .collect();
    Json(json!({"object": "list", "data": data}))
}

#[utoipa::path(get, path = "/meta/{slug}/v1/models", params(("slug" = String, Path)), responses((status = 200, description = "The pools"), (status = 400, body = ErrorBody)))]
pub async fn meta_models(
    state: State<AppState>,
    Path(slug): Path<String>,
) -> Result<Json<Value>, ApiError> {
    slug::decode(&slug).map_err(ApiError::bad_request)?;
    Ok(models(state).await)
}

/// Every pool with its replicas' states and figures (admin keys only: it
/// shows where the replicas are).
#[utoipa::path(get, path = "/gateway/replicas", responses((status = 200, description = "Pools, strategies and per-replica state and figures"), (status = 403, body = ErrorBody)))]
pub async fn replicas(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Value>, ApiError> {
    caller.require_admin("listing the gateway's replicas")?;
    let pools: Vec<Value> = state
        .gateway
        .pools()
        .iter()
        .map(|pool| {
            let replicas: Vec<_> = pool.replicas().iter().map(|r| r.view()).collect();
            json!({"model": pool.name, "strategy": pool.config.strategy.as_str(),
                   "num_retries": pool.config.num_retries, "weights": pool.weights.view(),
                   "replicas": replicas})
        })
        .collect();
    Ok(Json(json!({"pools": pools})))
}

/// `{model, url, id?, upstream_model?, api_key?}`: adds a replica (and its
/// pool, with default settings, when there is none). Admin keys only; the
/// URL must pass `gateway.allowed_upstreams`.
#[utoipa::path(post, path = "/gateway/replicas", request_body(content = Object, description = "{model, url, id?, upstream_model?, api_key?}"),
    responses((status = 201, description = "The replica added"), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn add_replica(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    mut body: JsonObject,
) -> Result<Response, ApiError> {
    caller.require_admin("adding a replica")?;
    let model = body.take_text("model")?;
    let url = body.take_text("url")?;
    let id = body.take::<String>("id")?;
    let upstream = body.take::<String>("upstream_model")?;
    let api_key = body.take::<String>("api_key")?;
    body.deny_rest()?;
    for (field, value) in [
        ("model", Some(&model)),
        ("id", id.as_ref()),
        ("upstream_model", upstream.as_ref()),
    ] {
        if value.is_some_and(|v| v.len() > MAX_NAME_BYTES) {
            return Err(ApiError::invalid(
                field,
                format!("must be at most {MAX_NAME_BYTES} bytes"),
            ));
        }
    }
    state
        .gateway
        .check_upstream(&url)
        .await
        .map_err(|e| ApiError::invalid("url", format!("{e} (gateway.allowed_upstreams)")))?;
    let view = state.gateway.add_replica(
        &model,
        ReplicaConfig {
            id,
            url,
            model: upstream,
            api_key,
        },
    )?;
    Ok((StatusCode::CREATED, Json(json!(view))).into_response())
}

#[utoipa::path(delete, path = "/gateway/replicas/{id}", params(("id" = String, Path)), responses((status = 200, description = "Removed"), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn remove_replica(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require_admin("removing a replica")?;
    state.gateway.remove_replica(&id)?;
    Ok(Json(json!({"id": id, "status": "removed"})))
}

/// Removes a pool and its replicas (admin keys only).
#[utoipa::path(delete, path = "/gateway/pools/{model}", params(("model" = String, Path)), responses((status = 200, description = "Removed"), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn remove_pool(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(model): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require_admin("removing a pool")?;
    state.gateway.remove_pool(&model)?;
    Ok(Json(json!({"model": model, "status": "removed"})))
}

/// `drain` (no new calls, removed once idle), `pause`, `resume`.
#[utoipa::path(post, path = "/gateway/replicas/{id}/{action}", params(("id" = String, Path), ("action" = String, Path, description = "drain, pause or resume")),
    responses((status = 200, description = "The replica's new state"), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn replica_action(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, action)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    caller.require_admin("changing a replica's state")?;
    let target = match action.as_str() {
        "drain" => ReplicaState::Draining,
        "pause" => ReplicaState::Paused,
        "resume" => ReplicaState::Active,
        other => {
            return Err(ApiError::not_found(format!(
                "no replica action {other:?}; use drain, pause or resume"
            )));
        }
    };
    let view = state.gateway.set_state(&id, target)?;
    Ok(Json(json!(view)))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TraceQuery {
    session_id: Option<String>,
    model: Option<String>,
    limit: Option<usize>,
    /// Every key's traces (admin keys only).
    all: Option<bool>,
}

/// The caller's own traces, newest first: `?session_id=`, `?model=`,
/// `?limit=` (default 100), `?all=true` for an admin to see every key's.
#[utoipa::path(get, path = "/gateway/traces", params(TraceQuery), responses((status = 200, description = "Traces, newest first"), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn traces(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(query): ApiQuery<TraceQuery>,
) -> Result<Json<TraceList>, ApiError> {
    let owner = if query.all == Some(true) {
        caller.require_admin("reading every key's traces")?;
        OwnerFilter::Any
    } else {
        OwnerFilter::Only(caller.owner())
    };
    let traces = state.gateway.traces.query(
        owner,
        query.session_id.as_deref(),
        query.model.as_deref(),
        query.limit.unwrap_or(100).min(10_000),
    );
    // Serialized straight to text: a request kept as its JSON text goes
    // out as it came, however deep it nests (a `Value` would parse it
    // again, and fail past serde_json's depth limit).
    Ok(Json(TraceList { traces }))
}

/// `{traces: [...]}`.
#[derive(Serialize)]
pub struct TraceList {
    traces: Vec<Trace>,
}
