//! Recovers tool calls written loosely into the content (being written).
