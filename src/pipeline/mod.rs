//! Pipelines (seed 004): graphs of agent nodes with conditional routing,
//! retry counters with limits, state reducers and a checkpoint per node.
//!
//! - [`definition`]: a pipeline read from YAML and checked (errors name
//!   the file, line and place), its routing, and the built-in `connector`
//!   pipeline of the seed.
//! - [`state`]: the run's state fields and their reducers.

pub mod definition;
pub mod state;

pub use definition::{CONNECTOR_YAML, Definition, DefinitionError, Route};
pub use state::{FieldSpec, Reducer};
