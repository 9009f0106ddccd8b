//! Extractors whose rejections are [`ApiError`]s: malformed JSON is 400, a
//! body over the limit 413, a field of the wrong type 422 naming the field.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::api::http::error::ApiError;
use crate::gateway::json::Object;

/// A JSON object body.
pub struct JsonObject(pub Map<String, Value>);

/// A JSON object body with its top-level values kept as written: what the
/// gateway forwards (`gateway::json`).
pub struct RawJsonObject(pub Object);

/// The whole body; a body over the limit is 413.
async fn body_bytes<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    // The Content-Type was checked before routing (`browser::check`), and
    // the body read whole within max_body_bytes (`body::read_whole`, which
    // names the limit): a rejection here is axum's own limit.
    Bytes::from_request(req, state).await.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::body_too_large(None)
        } else {
            ApiError::bad_request(format!("cannot read the request body: {rejection}"))
        }
    })
}

fn malformed(error: serde_json::Error) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "malformed_json",
        format!("malformed JSON: {error}"),
    )
}

fn not_an_object() -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_request",
        "the body must be a JSON object",
    )
}

impl<S: Send + Sync> FromRequest<S> for JsonObject {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = body_bytes(req, state).await?;
        match serde_json::from_slice(&bytes).map_err(malformed)? {
            Value::Object(map) => Ok(JsonObject(map)),
            _ => Err(not_an_object()),
        }
    }
}

impl<S: Send + Sync> FromRequest<S> for RawJsonObject {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = body_bytes(req, state).await?;
        Object::parse(&bytes).map(RawJsonObject).map_err(|e| {
            if e.classify() == serde_json::error::Category::Data {
                // Valid JSON of another type (a nested value that is not
                // JSON is a syntax error).
                not_an_object()
            } else {
                malformed(e)
            }
        })
    }
}

impl JsonObject {
    /// Takes a field out, typed; a wrong type is a 422 naming it.
    pub fn take<T: DeserializeOwned>(&mut self, field: &str) -> Result<Option<T>, ApiError> {
        match self.0.remove(field) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => serde_json::from_value(value)
                .map(Some)
                .map_err(|e| ApiError::invalid(field, e)),
        }
    }

    /// A required non-empty string field.
    pub fn take_text(&mut self, field: &str) -> Result<String, ApiError> {
        let text = self.take::<String>(field)?;
        required_text(field, text)
    }

    /// Refuses whatever fields are left.
    pub fn deny_rest(&self) -> Result<(), ApiError> {
        deny_rest(&self.0)
    }
}

/// A typed JSON object body, parsed once: malformed JSON is 400, another
/// JSON value than an object 422, a field of the wrong type 422 naming it.
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let JsonObject(object) = JsonObject::from_request(req, state).await?;
        serde_path_to_error::deserialize(Value::Object(object))
            .map(Body)
            .map_err(|e| {
                let field = e.path().to_string();
                let message = crate::words::plain_types(&e.into_inner().to_string());
                ApiError::invalid(&field, message)
            })
    }
}

/// Refuses the first of `rest`, the fields a typed body did not name.
pub fn deny_rest(rest: &Map<String, Value>) -> Result<(), ApiError> {
    match rest.keys().next() {
        Some(field) => Err(ApiError::invalid(field, "unknown field")),
        None => Ok(()),
    }
}

/// A required non-empty text field of a typed body.
pub fn required_text(field: &str, value: Option<String>) -> Result<String, ApiError> {
    match value {
        Some(text) if !text.trim().is_empty() => Ok(text),
        Some(_) => Err(ApiError::invalid(field, "must not be empty")),
        None => Err(ApiError::invalid(field, "is required")),
    }
}

/// Query parameters; a bad one is a 400 that says which.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| ApiQuery(q))
            .map_err(|e| ApiError::bad_request(e.body_text()))
    }
}
