//! How sessions and values are laid out in SQLite: JSON columns, RFC 3339
//! times with nanoseconds, and the `sessions` row.

use chrono::{DateTime, SecondsFormat, Utc};
use rusqlite::{Connection, Row};
use serde::Serialize;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::protocol::{SessionKind, SessionRecord, SessionStatus};
use crate::store::StoreError;

pub(super) fn encode<T: Serialize + ?Sized>(what: &str, value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value)
        .map_err(|err| StoreError::Corrupt(format!("cannot encode {what}: {err}")))
}

pub(super) fn decode<T: DeserializeOwned>(what: &str, json: &str) -> Result<T, StoreError> {
    serde_json::from_str(json).map_err(|err| StoreError::Corrupt(format!("{what}: {err}")))
}

/// RFC 3339 with nanoseconds: exact, and it sorts as text.
pub(super) fn encode_time(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Nanos, true)
}

pub(super) fn decode_time(what: &str, text: &str) -> Result<DateTime<Utc>, StoreError> {
    DateTime::parse_from_rfc3339(text)
        .map(|time| time.with_timezone(&Utc))
        .map_err(|err| StoreError::Corrupt(format!("{what} '{text}': {err}")))
}

/// A `sessions` row as SQLite holds it.
pub(super) struct SessionRow {
    pub(super) id: String,
    pub(super) name: Option<String>,
    pub(super) kind: String,
    pub(super) owner: Option<String>,
    pub(super) options: String,
    pub(super) status: String,
    pub(super) usage: String,
    pub(super) ephemeral: bool,
    pub(super) created_at: String,
    pub(super) updated_at: String,
}

impl SessionRow {
    pub(super) fn encode(session: &SessionRecord) -> Result<SessionRow, StoreError> {
        Ok(SessionRow {
            id: session.id.to_string(),
            name: session.name.clone(),
            kind: session.kind.as_str().to_owned(),
            owner: session.owner.clone(),
            options: encode("session options", &session.options)?,
            status: session.status.as_str().to_owned(),
            usage: encode("session usage", &session.usage)?,
            ephemeral: session.ephemeral,
            created_at: encode_time(session.created_at),
            updated_at: encode_time(session.updated_at),
        })
    }

    pub(super) fn read(row: &Row<'_>) -> rusqlite::Result<SessionRow> {
        Ok(SessionRow {
            id: row.get(0)?,
            name: row.get(1)?,
            kind: row.get(2)?,
            owner: row.get(3)?,
            options: row.get(4)?,
            status: row.get(5)?,
            usage: row.get(6)?,
            ephemeral: row.get(7)?,
            created_at: row.get(8)?,
            updated_at: row.get(9)?,
        })
    }

    pub(super) fn decode(self) -> Result<SessionRecord, StoreError> {
        let id = Uuid::parse_str(&self.id)
            .map_err(|err| StoreError::Corrupt(format!("session id '{}': {err}", self.id)))?;
        let what = |field: &str| format!("session {id}: {field}");
        Ok(SessionRecord {
            id,
            name: self.name,
            kind: SessionKind::new(self.kind),
            owner: self.owner,
            options: decode(&what("options"), &self.options)?,
            status: SessionStatus::parse(&self.status).ok_or_else(|| {
                StoreError::Corrupt(what(&format!("unknown status '{}'", self.status)))
            })?,
            usage: decode(&what("usage"), &self.usage)?,
            ephemeral: self.ephemeral,
            created_at: decode_time(&what("created_at"), &self.created_at)?,
            updated_at: decode_time(&what("updated_at"), &self.updated_at)?,
        })
    }
}

pub(super) fn select_sessions(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<SessionRow>, StoreError> {
    let mut statement = conn.prepare_cached(sql)?;
    let rows = statement.query_map(params, SessionRow::read)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

pub(super) fn decode_sessions(rows: Vec<SessionRow>) -> Result<Vec<SessionRecord>, StoreError> {
    rows.into_iter().map(SessionRow::decode).collect()
}
