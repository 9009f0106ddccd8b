//! The resource routes, one file per resource, named after its path.
//!
//! - [`agent`] serves `/agent/run`, `/agent/session…`, `/agent/sessions`.
//! - [`agent_ws`] serves `/agent/ws`, a session over a WebSocket.
//! - [`approvals`] serves `/agent/approvals` and the decisions on waiting calls.
//! - [`fork`] serves `/agent/session/{id}/fork`, `…/snapshots`,
//!   `/sandboxes/snapshots`.
//! - [`agents`] serves `/agents`, the agents offered by name.
//! - [`sandboxes`] serves `/sandboxes`.
//! - [`workspace`] serves `/agent/session/{id}/workspace` and
//!   `…/files/{*path}`: a session's files in and out.
//! - [`deliberations`] serves `/deliberations`.
//! - [`orchestrator`] serves `/orchestrator/…`, pipeline runs by `thread_id`.
//! - [`gateway`]: the OpenAI-compatible `/v1/…`, `/meta/{slug}/…`,
//!   `/tokenize`, `/detokenize` and `/gateway/…` administration.
//! - [`gateway_weights`] serves `/gateway/pools/{model}/weights/…`.
//! - [`rollouts`] serves `/rollouts`.
//! - [`bus`] serves `/bus/…` and `/kv…`; [`bus_ws`] serves `/bus/ws`.
//! - [`usage`] serves `/usage`.
//! - [`mcp`] serves `/mcp`.
//! - [`dashboard`] serves `/`, the dashboard's files, `/auth/me`, `/auth/ticket`.
//! - [`health`] serves `/health`, `/ready`, `/metrics`, `/openapi.json`.

pub mod agent;
pub mod agent_sessions;
pub mod agent_ws;
pub mod agents;
pub mod approvals;
pub mod bus;
pub mod bus_ws;
pub mod dashboard;
pub mod deliberations;
pub mod fork;
pub mod gateway;
pub mod gateway_weights;
pub mod health;
pub mod mcp;
pub mod orchestrator;
pub mod rollouts;
pub mod sandboxes;
pub mod usage;
pub mod workspace;
