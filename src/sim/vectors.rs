//! The simulator's `/v1/embeddings`, `/tokenize` and `/detokenize`, all
//! deterministic so tests and benches can check them offline: an
//! embedding is a unit vector made from a hash of its input, and the
//! tokenizer is byte-level (a token is a byte of the UTF-8 text), so a
//! detokenized prompt comes back as it was.

use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Value, json};

use super::{Sim, error};

/// Components of an embedding unless the request asks for `dimensions`.
const DIMENSIONS: usize = 8;
/// The most `dimensions` a request may ask for.
const MAX_DIMENSIONS: u64 = 4096;
/// What `/tokenize` says the model's context holds.
const MAX_MODEL_LEN: u64 = 4096;

/// FNV-1a: stable across builds and platforms, unlike std's hasher.
fn fnv(bytes: &[u8], seed: u64) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325 ^ seed;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// The unit vector of `text`: each component from a hash of the text and
/// its place.
pub fn embedding(text: &str, dimensions: usize) -> Vec<f32> {
    let raw: Vec<f32> = (0..dimensions as u64)
        .map(|i| (fnv(text.as_bytes(), i) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let norm = raw
        .iter()
        .map(|x| x * x)
        .sum::<f32>()
        .sqrt()
        .max(f32::EPSILON);
    raw.iter().map(|x| x / norm).collect()
}

/// The inputs of an embeddings request, as texts: a string, a list of
/// strings, a list of token ids or a list of such lists (tokens as their
/// JSON text).
fn inputs(input: &Value) -> Option<Vec<String>> {
    match input {
        Value::String(text) => Some(vec![text.clone()]),
        Value::Array(items) if items.is_empty() => None,
        Value::Array(items) if items.iter().all(Value::is_u64) => Some(vec![input.to_string()]),
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::String(text) => Some(text.clone()),
                Value::Array(tokens) if tokens.iter().all(Value::is_u64) => Some(item.to_string()),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

/// The body, when it is a JSON object.
fn object(body: &Bytes) -> Option<serde_json::Map<String, Value>> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(map)) => Some(map),
        _ => None,
    }
}

const NOT_AN_OBJECT: &str = "the body must be a JSON object";

pub(super) async fn embeddings(State(sim): State<Sim>, body: Bytes) -> Response {
    sim.stats.requests.fetch_add(1, Ordering::Relaxed);
    let config = sim.config();
    let Some(request) = object(&body) else {
        return error(StatusCode::BAD_REQUEST, NOT_AN_OBJECT);
    };
    let Some(texts) = request.get("input").and_then(inputs) else {
        return error(
            StatusCode::BAD_REQUEST,
            "\"input\" must be a string, a non-empty list of strings, or token lists",
        );
    };
    let dimensions = match request.get("dimensions") {
        None | Some(Value::Null) => DIMENSIONS,
        Some(n) => match n.as_u64().filter(|n| (1..=MAX_DIMENSIONS).contains(n)) {
            Some(n) => n as usize,
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!("\"dimensions\" must be from 1 to {MAX_DIMENSIONS}"),
                );
            }
        },
    };
    let base64 = match request.get("encoding_format").and_then(Value::as_str) {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("unknown encoding_format {other:?}: use float or base64"),
            );
        }
    };
    let data: Vec<Value> = texts
        .iter()
        .enumerate()
        .map(|(index, text)| {
            let vector = embedding(text, dimensions);
            // As OpenAI sends it: the little-endian bytes of the float32s.
            let encoded = if base64 {
                let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(vector)
            };
            json!({"object": "embedding", "index": index, "embedding": encoded})
        })
        .collect();
    let tokens: usize = texts.iter().map(|t| t.split_whitespace().count()).sum();
    let model = request.get("model").and_then(Value::as_str);
    Json(
        json!({"object": "list", "data": data, "model": model.unwrap_or(&config.model),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}),
    )
    .into_response()
}

pub(super) async fn tokenize(State(sim): State<Sim>, body: Bytes) -> Response {
    sim.stats.requests.fetch_add(1, Ordering::Relaxed);
    let Some(request) = object(&body) else {
        return error(StatusCode::BAD_REQUEST, NOT_AN_OBJECT);
    };
    let text = match (request.get("prompt"), request.get("messages")) {
        (Some(Value::String(prompt)), _) => prompt.clone(),
        (None, Some(Value::Array(_))) => {
            super::rendered(&Value::Object(request.clone()), true).join(" ")
        }
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "the request needs a \"prompt\" string or chat \"messages\"",
            );
        }
    };
    let tokens: Vec<u8> = text.into_bytes();
    Json(json!({"tokens": tokens, "count": tokens.len(), "max_model_len": MAX_MODEL_LEN}))
        .into_response()
}

pub(super) async fn detokenize(State(sim): State<Sim>, body: Bytes) -> Response {
    sim.stats.requests.fetch_add(1, Ordering::Relaxed);
    let Some(request) = object(&body) else {
        return error(StatusCode::BAD_REQUEST, NOT_AN_OBJECT);
    };
    let bytes: Option<Vec<u8>> =
        request
            .get("tokens")
            .and_then(Value::as_array)
            .and_then(|tokens| {
                tokens
                    .iter()
                    .map(|t| t.as_u64().and_then(|t| u8::try_from(t).ok()))
                    .collect()
            });
    match bytes {
        Some(bytes) => Json(json!({"prompt": String::from_utf8_lossy(&bytes)})).into_response(),
        None => error(
            StatusCode::BAD_REQUEST,
            "\"tokens\" must be a list of token ids from 0 to 255 (the sim's tokens are bytes)",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embeddings_are_unit_vectors_fixed_by_their_text() {
        let a = embedding("hello", 8);
        assert_eq!(a, embedding("hello", 8));
        assert_ne!(a, embedding("hullo", 8));
        let norm: f32 = a.iter().map(|x| x * x).sum();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        assert_eq!(embedding("x", 3).len(), 3);
    }

    #[test]
    fn inputs_take_the_shapes_openai_allows() {
        assert_eq!(inputs(&json!("a")), Some(vec!["a".to_string()]));
        assert_eq!(inputs(&json!(["a", "b"])).map(|v| v.len()), Some(2));
        assert_eq!(inputs(&json!([1, 2])).map(|v| v.len()), Some(1));
        assert_eq!(inputs(&json!([[1], [2]])).map(|v| v.len()), Some(2));
        assert_eq!(inputs(&json!([])), None);
        assert_eq!(inputs(&json!([{"a": 1}])), None);
    }
}
