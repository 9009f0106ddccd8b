//! Conclave: a streaming agent server with sandbox isolation.
//!
//! Layout, in the order a request goes: [`api`] takes it, checks its key
//! and hands it to the [`session`] machinery, which runs the session's
//! kind (the [`agent`] is the first) and writes every event to the
//! [`store`]; an agent's model calls go through [`model`] (a model naming
//! a gateway pool goes through the [`gateway`] in process) and its tool
//! calls through [`mcp`] into a [`sandbox`]. Clients of the OpenAI-
//! compatible API reach the [`gateway`] from [`api`] directly.
//!
//! - [`protocol`]: the wire format: events and their kinds, usage, result
//!   status, messages and tool calls, a session's kind, status and record.
//! - [`api`]: every axum and tonic type lives here: router, NDJSON/SSE,
//!   WebSocket and gRPC transport, auth, the state handlers share, and
//!   the error mapping, one place per transport: every part's errors
//!   become HTTP statuses in `api/error.rs` and gRPC statuses in
//!   `api/grpc_error.rs`.
//! - [`session`]: the machinery every session kind shares: the live session
//!   (durable event log, streams with replay, interrupt), the turn lock and
//!   `queue`, the closing `result`, status and usage, turns a crash cut
//!   off; the [`session::SessionTask`] seam a kind implements.
//! - [`agent`]: the agent kind: its options, the turn loop, tool calls and
//!   the `ToolRouter` seam to whatever executes tools.
//! - [`deliberation`]: deliberations (seed 000): N agents in parallel,
//!   their answers collected from the bus, critique rounds, a judge or a
//!   vote; a session kind, with `POST /deliberations` on top.
//! - [`mcp`]: the rmcp server of sandbox tools (`/mcp`, `conclave mcp`) and
//!   the agent's in-process client of it.
//! - [`a2a_client`]: a session's remote A2A agents (`options.a2a_agents`),
//!   each a tool of its agent.
//! - [`model`]: the streaming `ModelProvider` trait and its providers
//!   (OpenAI-compatible, Anthropic, demo, a gateway pool), aliases, prices.
//! - [`gateway`]: the OpenAI-compatible gateway: pools of inference
//!   replicas, balancing strategies, health checks, traces.
//! - [`bus`]: subjects to publish and subscribe to (in process, durable
//!   ones kept in the store) and a KV with revisions, one namespace per
//!   API key; `api` serves it over HTTP, the WebSocket and gRPC.
//! - [`jobs`]: work any replica may do for a turn on another (a
//!   deliberation agent's model call, a test-mode pipeline node): in
//!   process on one server, on a JetStream work queue among replicas.
//! - [`rollout`]: rollouts: prompts dispatched over a gateway pool with
//!   bounded concurrency, each result published on the bus.
//! - [`pipeline`]: pipelines (seed 004): definitions in YAML, routing
//!   with retry limits, state reducers.
//! - [`sim`]: `conclave sim`, a simulated OpenAI-compatible replica for
//!   tests and benchmarks, with its own axum app.
//! - [`sandbox`]: the `Sandbox` trait and its docker, kubernetes and local
//!   backends, with the per-session manager and warm pool.
//! - [`store`]: the durable `Store` trait and its two implementations:
//!   SQLite (the embedded default) and PostgreSQL (shared by replicas).
//! - [`config`]: typed configuration (TOML file, then `CONCLAVE_*` env, then flags).
//! - [`egress`]: the allow rules for connections a request can make the
//!   server open (gateway replicas, HTTP MCP servers, A2A agents), checked
//!   after DNS.
//! - [`server`]: wires the parts (the store, the providers into the model
//!   registry, the gateway, the sandboxes, the session kinds) and serves
//!   them on a listener until a shutdown signal, so tests bind `127.0.0.1:0`.
//! - [`locate`]: the running servers, one record each per user, and which
//!   of them `conclave mcp` relays to.
//! - [`operator`]: `conclave sandboxes list|prune`, across data directories.
//! - [`telemetry`]: logging and the Prometheus metrics registry.
//! - [`upstream`]: what every client of an upstream HTTP server needs
//!   (providers and gateway alike): errors with their causes,
//!   `Retry-After`, bounded error bodies.
//! - [`shutdown`]: the root cancellation token and signal handling.
//! - [`sync`]: the one poison-tolerant lock helper.
//! - [`yaml`]: bounds on YAML's size and nesting, checked before parsing.
//! - [`prefix`]: a prompt as a chain of block hashes, for the sim's prefix
//!   cache and the gateway's `prefix_cache` strategy.

pub mod a2a_client;
pub mod agent;
pub mod api;
pub mod bus;
pub mod config;
pub mod deliberation;
pub mod egress;
pub mod gateway;
pub mod jobs;
pub mod locate;
pub mod mcp;
pub mod model;
pub mod operator;
pub mod permission;
pub mod pipeline;
pub mod prefix;
pub mod protocol;
pub mod quota;
pub mod rollout;
pub mod sandbox;
pub mod server;
pub mod session;
pub mod shutdown;
pub mod sim;
pub mod store;
pub mod sync;
pub mod telemetry;
pub mod upstream;
pub mod usage;
pub mod yaml;
