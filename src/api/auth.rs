//! Bearer-key auth. With no keys configured every caller is anonymous (the
//! server then listens on loopback only); with keys every route needs one,
//! and a caller is identified by the hash of its key, which owns the
//! sessions it creates.

use std::collections::HashSet;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};

use super::error::ApiError;
use crate::state::AppState;

/// Who is calling; handlers read it from the request extensions.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    /// Hash of the caller's key; `None` when auth is off.
    pub owner: Option<String>,
}

impl Caller {
    pub fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }
}

/// The accepted keys, stored only as hashes.
pub struct Keys {
    hashes: HashSet<String>,
}

impl Keys {
    pub fn new(keys: &[String]) -> Keys {
        Keys {
            hashes: keys.iter().map(|k| hash(k.trim())).collect(),
        }
    }

    pub fn enabled(&self) -> bool {
        !self.hashes.is_empty()
    }

    /// The caller a presented key stands for, if it is one of ours.
    fn check(&self, key: &str) -> Option<Caller> {
        let hashed = hash(key);
        self.hashes.contains(&hashed).then_some(Caller {
            owner: Some(hashed),
        })
    }
}

fn hash(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// Browsers cannot set headers on a WebSocket, so that route alone also
/// takes `?token=`.
fn query_token(req: &Request) -> Option<String> {
    if req.uri().path() != "/agent/ws" {
        return None;
    }
    req.uri().query()?.split('&').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        (name == "token").then(|| value.to_string())
    })
}

pub async fn require_key(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let caller = if state.keys.enabled() {
        let header = req
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|v| v.trim().to_string());
        let presented = header.or_else(|| query_token(&req)).ok_or_else(|| {
            ApiError::unauthorized("missing API key: send Authorization: Bearer KEY")
        })?;
        state
            .keys
            .check(&presented)
            .ok_or_else(|| ApiError::unauthorized("invalid API key"))?
    } else {
        Caller::default()
    };
    // `/mcp` answers only about the caller's own sessions too.
    req.extensions_mut()
        .insert(crate::mcp::McpOwner(caller.owner().map(str::to_string)));
    req.extensions_mut().insert(caller);
    Ok(next.run(req).await)
}
