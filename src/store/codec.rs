//! How both backends write values as text: JSON documents, RFC 3339 times
//! with nanoseconds (exact, and they sort as text), and an event's body
//! with its `type` beside it.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Expect, StoreError};
use crate::protocol::Event;

pub(crate) fn encode<T: Serialize + ?Sized>(what: &str, value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value)
        .map_err(|err| StoreError::Corrupt(format!("cannot encode {what}: {err}")))
}

pub(crate) fn decode<T: DeserializeOwned>(what: &str, json: &str) -> Result<T, StoreError> {
    serde_json::from_str(json).map_err(|err| StoreError::Corrupt(format!("{what}: {err}")))
}

pub(crate) fn encode_time(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Nanos, true)
}

pub(crate) fn decode_time(what: &str, text: &str) -> Result<DateTime<Utc>, StoreError> {
    DateTime::parse_from_rfc3339(text)
        .map(|time| time.with_timezone(&Utc))
        .map_err(|err| StoreError::Corrupt(format!("{what} '{text}': {err}")))
}

/// An event as a row keeps it: its `type` (the tag its body carries) and
/// its JSON body.
pub(crate) fn encode_event(event: &Event) -> Result<(&'static str, String), StoreError> {
    Ok((event.kind.type_name(), encode("event", event)?))
}

impl Expect {
    /// Whether a key at `current` (`None`: absent) meets the expectation.
    pub(crate) fn allows(self, current: Option<u64>) -> bool {
        match self {
            Expect::Any => true,
            Expect::Absent => current.is_none(),
            Expect::Revision(revision) => current == Some(revision),
        }
    }
}
