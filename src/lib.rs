//! Conclave: a streaming agent server with sandbox isolation.
//!
//! Layout:
//!
//! - [`config`]: typed configuration (TOML file, then `CONCLAVE_*` env, then flags).
//! - [`events`]: the wire events of a session's log, which the agent
//!   writes and the store keeps.
//! - [`egress`]: the allow rules for connections a request can make the
//!   server open (gateway replicas, HTTP MCP servers), checked after DNS.
//! - [`locate`]: the running server's data directory, recorded per user for
//!   `conclave mcp` started without `--data-dir`.
//! - [`server`]: builds the application state and serves it on a listener until
//!   a shutdown signal, so tests can bind `127.0.0.1:0`.
//! - [`api`]: every axum type lives here: router, error mapping, NDJSON/SSE and
//!   WebSocket transport, auth.
//! - [`agent`]: sessions, the turn loop, the tool router and the wire events.
//! - [`mcp`]: the rmcp server of sandbox tools (`/mcp`, `conclave mcp`) and the
//!   agent's in-process client of it.
//! - [`model`]: the streaming `ModelProvider` trait and its providers
//!   (OpenAI-compatible, Anthropic, demo), aliases and prices.
//! - [`operator`]: `conclave sandboxes list|prune`, across data directories.
//! - [`sandbox`]: the `Sandbox` trait and its docker, kubernetes and local
//!   backends, with the per-session manager and warm pool.
//! - [`store`]: the durable `Store` trait and its SQLite implementation.
//! - [`telemetry`]: logging and the Prometheus metrics registry.
//! - [`shutdown`]: the root cancellation token and signal handling.

pub mod agent;
pub mod api;
pub mod config;
pub mod egress;
pub mod events;
pub mod gateway;
pub mod locate;
pub mod mcp;
pub mod model;
pub mod operator;
pub mod sandbox;
pub mod server;
pub mod shutdown;
pub mod store;
pub mod telemetry;
