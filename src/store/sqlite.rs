//! SQLite store (being written).

pub struct SqliteStore;
