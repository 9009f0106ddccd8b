//! The HTTP engine room: what every request passes through before and
//! after its route, whatever resource it names.
//!
//! - [`serve`]: the listener, with connection caps and header deadlines.
//! - `raw_target`: request targets as clients send them (a raw `>` in a
//!   query).
//! - `refusal`: the JSON error for requests the HTTP/1 parser refuses.
//! - [`guard`]: the one middleware before every route: the checks below,
//!   in order.
//! - [`browser`]: `Host`, `Origin` and content-type checks against web
//!   pages driving the server.
//! - [`auth`]: bearer keys, roles and the caller identity.
//! - [`tickets`]: WebSocket tickets, kept in the store.
//! - [`body`]: request bodies read whole within a deadline.
//! - [`access_log`]: one INFO line per request, with its id.
//! - `traced`: the span of each request that may start work.
//! - [`extract`]: JSON body and query extractors with `ApiError` rejections.
//! - [`error`]: `ApiError`, the one error every handler returns, and the
//!   one place the errors of the parts under it map to HTTP statuses.
//! - [`stream`]: events as NDJSON or SSE.
//! - [`state`]: `AppState`, what every handler shares.

pub mod access_log;
pub mod auth;
pub mod body;
pub mod browser;
pub mod error;
pub mod extract;
pub mod guard;
mod raw_target;
mod refusal;
pub mod serve;
pub mod state;
pub mod stream;
pub mod tickets;
pub(super) mod traced;
