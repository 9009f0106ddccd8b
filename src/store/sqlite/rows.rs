//! How sessions are laid out in SQLite: the `sessions` row, with the
//! shared text forms of values ([`crate::store::codec`]).

use rusqlite::{Connection, Row};
use uuid::Uuid;

use crate::protocol::{SessionKind, SessionRecord, SessionStatus};
use crate::store::StoreError;
pub(super) use crate::store::codec::{decode, decode_time, encode, encode_time};

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
    pub(super) origin: Option<String>,
    pub(super) metadata: String,
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
            origin: session.origin.clone(),
            metadata: encode("session metadata", &session.metadata)?,
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
            origin: row.get(10)?,
            metadata: row.get(11)?,
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
            origin: self.origin,
            metadata: decode(&what("metadata"), &self.metadata)?,
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
