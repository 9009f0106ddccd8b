//! Agent sessions (being written).

pub mod events;
