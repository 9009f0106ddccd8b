//! Conclave: a streaming agent server with sandbox isolation.
//!
//! Layout, in the order a request goes: [`api`] takes it, checks its key
//! and hands it to the [`session`] machinery, which runs the session's
//! kind (the [`agent`] is the first) and writes every event to the
//! [`store`]; an agent's model calls go through [`model`] (a model naming
//! a gateway pool goes through the [`gateway`] in process) and its tool
//! calls run in a [`sandbox`]. Clients of the OpenAI-compatible API reach
//! the [`gateway`] from [`api`] directly. [`server`] builds all of it
//! from the [`config`] and serves it on one listener.
//!
//! # Protocol surfaces
//!
//! Every surface a client calls is served on the one HTTP listener,
//! except `conclave mcp`'s stdio.
//!
//! - REST with NDJSON or SSE streams: sessions and their events, sandboxes
//!   and snapshots, the bus and KV, deliberations, pipelines, rollouts,
//!   usage, health, and the OpenAPI document at `/openapi.json`
//!   ([`api::routes`]).
//! - WebSocket: a session at `/agent/ws`, the bus at `/bus/ws`.
//! - MCP: streamable HTTP at `/mcp`, and stdio by `conclave mcp`, which
//!   relays to a running server or serves the tools itself ([`mcp`]).
//! - The OpenAI-compatible gateway: `/v1/chat/completions`,
//!   `/v1/completions`, `/v1/responses`, `/v1/embeddings`, `/v1/models`,
//!   `/tokenize`, `/detokenize`, the same under `/meta/{slug}/`, and
//!   `/gateway/…` to administer pools ([`gateway`]).
//! - gRPC over HTTP/2: the bus (`proto/bus.proto`) and deliberations
//!   (`proto/orchestrator.proto`) ([`api::grpc`]).
//! - A2A 1.0: an agent card and a JSON-RPC endpoint per named agent under
//!   `/a2a/{agent}` ([`api::a2a`]); a session may call remote A2A agents
//!   as tools ([`a2a_client`]).
//! - AG-UI: `POST /ag-ui/{agent}`, a run answered as AG-UI events over
//!   SSE ([`api::agui`]).
//! - The LangGraph Platform API under `/langgraph`, as the official
//!   `langgraph-sdk` client uses it ([`api::langgraph`]).
//! - OpenTelemetry: traces of turns and gateway calls exported over
//!   OTLP/HTTP when `[telemetry]` sets an endpoint ([`telemetry::otel`]).
//! - Prometheus metrics at `/metrics` ([`telemetry::Metrics`]).
//!
//! # Layers
//!
//! [`config`], [`protocol`] and [`telemetry`] are the ground floor:
//! features import them, and they import no feature, only each other and
//! leaf modules that import nothing ([`sync`], [`yaml`], [`words`],
//! [`egress`], [`permission`]). [`store`] holds the durable state the features share.
//! Features (sessions, agents, the gateway, the bus, sandboxes and the
//! rest) sit above them; [`api`] and [`mcp`] are the surfaces over the
//! features, and [`server`] assembles everything. `tests/structure.rs` fails on any import loop
//! between top-level modules.
//!
//! # Modules
//!
//! Ground floor and helpers:
//!
//! - [`protocol`]: the wire format: events and their kinds, usage, result
//!   status, messages and tool calls, a session's kind, status and record,
//!   and the results of deliberations.
//! - [`config`]: typed configuration (TOML file, then `CONCLAVE_*` env,
//!   then flags); data only, one type per section (gateway, pipelines,
//!   bus, sandbox, keys, telemetry, the LiteLLM import and export).
//! - [`telemetry`]: logging, the Prometheus metrics registry, and
//!   OpenTelemetry spans and their export.
//! - [`store`]: the durable `Store` traits and their two implementations:
//!   SQLite (the embedded default) and PostgreSQL (shared by replicas).
//! - [`permission`]: whether a tool call is allowed, denied or asked about:
//!   a session's mode and rules, tightened by its key's policy.
//! - [`egress`]: the allow rules for connections a request can make the
//!   server open (gateway replicas, HTTP MCP servers, A2A agents), checked
//!   after DNS.
//! - [`upstream`]: what every client of an upstream HTTP server needs
//!   (providers and gateway alike): errors with their causes,
//!   `Retry-After`, bounded error bodies.
//! - [`sync`]: poison-tolerant lock helpers, and `KeyedSlots` (places
//!   taken overall and per key).
//! - [`yaml`]: bounds on YAML's size and nesting, checked before parsing.
//! - [`words`]: the name a typo meant, and serde's Rust type names in
//!   words, for the configuration's and the requests' errors.
//! - [`prefix`]: a prompt as a chain of block hashes, for the sim's prefix
//!   cache and the gateway's `prefix_cache` strategy.
//! - [`shutdown`]: the root cancellation token and signal handling.
//!
//! Features:
//!
//! - [`session`]: the machinery every session kind shares: the live session
//!   (durable event log, streams with replay, interrupt), the turn lock and
//!   `queue`, the closing `result`, status and usage, approvals, turns a
//!   crash cut off; the [`session::SessionTask`] seam a kind implements.
//! - [`agent`]: the agent kind: its options, the turn loop, tool calls,
//!   approvals and harnesses, forks, and named agents.
//! - [`deliberation`]: deliberations: N agents in parallel, their answers
//!   collected from the bus, critique rounds, a judge or a vote; a session
//!   kind, with `POST /deliberations` on top.
//! - [`pipeline`]: pipelines: definitions in YAML, graphs of agent nodes
//!   with routing, retry limits, state reducers and a checkpoint after
//!   each node; a session kind, with `/orchestrator/…` on top.
//! - [`a2a_client`]: a session's remote A2A agents (`options.a2a_agents`),
//!   each a tool of its agent.
//! - [`model`]: the streaming `ModelProvider` trait and its providers
//!   (OpenAI-compatible, Anthropic, demo, a gateway pool), aliases, prices.
//! - [`gateway`]: the OpenAI-compatible gateway: pools of inference
//!   replicas, balancing strategies, retries, health checks, weight
//!   updates, traces.
//! - [`rollout`]: rollouts: prompts dispatched over a gateway pool with
//!   bounded concurrency, each result published on the bus.
//! - [`bus`]: subjects to publish and subscribe to (in process or on NATS
//!   JetStream, durable ones kept) and a KV with revisions, one namespace
//!   per API key.
//! - [`jobs`]: work any replica may do for a turn on another (a
//!   deliberation agent's model call, a test-mode pipeline node): in
//!   process on one server, on a JetStream work queue among replicas.
//! - [`sandbox`]: the `Sandbox` trait and its docker, kubernetes and local
//!   backends, with the per-session manager, the warm pool and snapshots,
//!   and a workspace in and out (uploads checked as they stream, downloads,
//!   what changed between two turn ends).
//! - [`tools`]: the sandbox's tools (exec, files, background runs) as
//!   functions called directly; the agent's router over them (Claude
//!   Code's built-ins, a session's own MCP servers and A2A agents), and
//!   among replicas the call carried to the replica holding the sandbox.
//! - [`quota`]: who each API key is (its name, whether it administers, its
//!   quota) and the error a caller gets past a quota.
//! - [`usage`]: what each key spent (turns, tool calls, gateway calls,
//!   sandboxes) per day and model, its metrics, and its daily budgets.
//! - [`sim`]: `conclave sim`, a simulated OpenAI-compatible replica for
//!   tests and benchmarks, with its own axum app.
//!
//! Surfaces and assembly:
//!
//! - [`api`]: every axum and tonic type lives here. `api/http/` is the
//!   engine room every request passes through (listener, guard, auth,
//!   body, errors, NDJSON/SSE streams, the shared state); `api/routes/`
//!   holds one file per resource, named after its path; `api/grpc/` the
//!   gRPC services; `api/a2a/`, `api/agui/` and `api/langgraph/` the
//!   protocol adapters. Errors of the parts below become HTTP statuses in
//!   `api/http/error.rs` and gRPC statuses in `api/grpc/error.rs`.
//! - [`mcp`]: the MCP server (`/mcp`, `conclave mcp`): an adapter over
//!   [`tools`], plus the tools that start sessions and the sessions as
//!   resources.
//! - [`server`]: wires the parts (the store, the providers into the model
//!   registry, the gateway, the sandboxes, the session kinds) and serves
//!   them on a listener until a shutdown signal, so tests bind `127.0.0.1:0`.
//! - [`locate`]: the running servers, one record each per user, and which
//!   of them `conclave mcp` relays to.
//! - [`operator`]: `conclave sandboxes list|prune`, across data directories.

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
pub mod tools;
pub mod upstream;
pub mod usage;
pub mod words;
pub mod yaml;
