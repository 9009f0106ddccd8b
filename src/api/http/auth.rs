//! Bearer-key auth. With no keys configured every caller is anonymous (the
//! server then listens on loopback only); with keys every route needs one,
//! and a caller is identified by the hash of its key, which owns the
//! sessions it creates.
//!
//! A browser cannot set headers on a WebSocket, so a page trades its key
//! for a ticket (`POST /auth/ticket`): single use, valid for
//! [`TICKET_TTL`](crate::api::http::tickets::TICKET_TTL), and taken as `?ticket=` by the WebSocket routes only;
//! the key itself never goes into a URL. The dashboard's files (`/`,
//! `/ui/…`, `/static/…`) need no key: they hold no data.

use std::sync::Arc;

use axum::extract::Request;

use crate::api::http::error::ApiError;
use crate::api::http::state::AppState;
use crate::api::http::tickets::Tickets;
use crate::quota::KeyTable;
use crate::store::{Store, StoreError};

/// Who is calling; handlers read it from the request extensions.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Hash of the caller's key; `None` when auth is off.
    pub owner: Option<String>,
    /// May administer the gateway's pools and read every key's traces:
    /// an admin key, or the one local user when auth is off.
    pub admin: bool,
}

impl Default for Caller {
    /// The caller when auth is off: the one local user, an admin.
    fn default() -> Self {
        Caller {
            owner: None,
            admin: true,
        }
    }
}

impl Caller {
    pub fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }

    /// Refuses a caller that is not an admin, saying what it tried.
    pub fn require_admin(&self, what: &str) -> Result<(), ApiError> {
        if self.admin {
            Ok(())
        } else {
            Err(ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                "forbidden",
                format!("{what} needs an admin key (admin_keys in the config)"),
            ))
        }
    }
}

/// The accepted keys, known only by their hashes, each with its name,
/// whether it administers and its quota; and the WebSocket tickets (in
/// the store, for every replica).
pub struct Keys {
    table: Arc<KeyTable>,
    tickets: Tickets,
}

impl Keys {
    pub fn new(table: Arc<KeyTable>, store: Arc<dyn Store>) -> Keys {
        Keys {
            table,
            tickets: Tickets::new(store),
        }
    }

    /// The keys' names and quotas, by owner id.
    pub fn table(&self) -> &Arc<KeyTable> {
        &self.table
    }

    /// A fresh single-use ticket standing for `caller`; `None` when the
    /// caller had as many as it may lately.
    pub async fn issue_ticket(&self, caller: &Caller) -> Result<Option<String>, StoreError> {
        self.tickets.issue(caller).await
    }

    pub fn enabled(&self) -> bool {
        !self.table.is_empty()
    }

    /// The caller a presented key stands for, if it is one of ours.
    fn check(&self, key: &str) -> Option<Caller> {
        let hashed = hash(key);
        let admin = self.table.get(&hashed)?.admin;
        Some(Caller {
            owner: Some(hashed),
            admin,
        })
    }
}

fn hash(key: &str) -> String {
    crate::config::key_owner(key)
}

/// The token of an `Authorization: Bearer TOKEN` value; the scheme is
/// case-insensitive (RFC 9110).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|token| !token.is_empty())
}

/// A query parameter of a WebSocket route: browsers cannot set headers on
/// a WebSocket, so those routes alone take `?ticket=` (and `?token=`, the
/// key itself, for clients that have no other way).
fn ws_query(req: &Request, param: &str) -> Option<String> {
    if !matches!(req.uri().path(), "/agent/ws" | "/bus/ws") {
        return None;
    }
    req.uri().query()?.split('&').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        (name == param).then(|| value.to_string())
    })
}

/// Paths anyone may read: the dashboard's files hold no data.
fn public(req: &Request) -> bool {
    let path = req.uri().path();
    let dashboard =
        path == "/" || path == "/ui" || path.starts_with("/ui/") || path.starts_with("/static/");
    path == "/health"
        || path == "/ready"
        || (dashboard
            && matches!(
                *req.method(),
                axum::http::Method::GET | axum::http::Method::HEAD
            ))
}

/// A GET of an A2A agent card, which clients read before they have a key.
fn agent_card(req: &Request) -> bool {
    let path = req.uri().path();
    let card = path == "/.well-known/agent-card.json"
        || (path.starts_with("/a2a/") && path.ends_with("/.well-known/agent-card.json"));
    card && matches!(
        *req.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    )
}

/// The request with its caller (and the caller's MCP owner) in its
/// extensions, or why it is refused.
pub async fn identify(state: &AppState, mut req: Request) -> Result<Request, ApiError> {
    // Probes (a kubelet's, a load balancer's) carry no key; liveness and
    // readiness are all `/health` and `/ready` tell.
    if public(&req) || (state.config.a2a.public_cards && agent_card(&req)) {
        return Ok(req);
    }
    let ticket = ws_query(&req, "ticket");
    let caller = if let Some(ticket) = ticket {
        let redeemed = state
            .keys
            .tickets
            .redeem(&ticket)
            .await
            .map_err(ApiError::internal)?;
        redeemed.ok_or_else(|| {
            ApiError::unauthorized(
                "unknown, used or expired ticket: get a fresh one from POST /auth/ticket",
            )
        })?
    } else if state.keys.enabled() {
        let header = req
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .map(str::to_string)
            .or_else(|| langgraph_key(&req));
        let presented = header.or_else(|| ws_query(&req, "token")).ok_or_else(|| {
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
    Ok(req)
}

/// The `x-api-key` header, on the LangGraph routes only: the official
/// `langgraph-sdk` client sends its key there, not as a bearer token.
fn langgraph_key(req: &Request) -> Option<String> {
    if !req.uri().path().starts_with("/langgraph/") {
        return None;
    }
    req.headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_token("Bearer key-1"), Some("key-1"));
        assert_eq!(bearer_token("bearer key-1"), Some("key-1"));
        assert_eq!(bearer_token("BEARER  key-1 "), Some("key-1"));
        assert_eq!(bearer_token("Basic a2V5"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearerkey"), None);
    }
}
