//! The gRPC services, served on the HTTP listener (HTTP/2).
//!
//! - [`bus`]: the bus (`proto/bus.proto`, `/conclave.bus.v1.Bus/`).
//! - [`deliberations`]: deliberations (`proto/orchestrator.proto`).
//! - [`error`]: errors in gRPC's form, for both.

pub mod bus;
pub mod deliberations;
pub mod error;
