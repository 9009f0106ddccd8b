//! Session listings: the filtered, paged list and the retention's query.

use chrono::{DateTime, Utc};
use rusqlite::Connection;
use rusqlite::types::Value as SqlValue;

use super::rows::{SessionRow, encode_time};
use crate::protocol::SessionStatus;
use crate::store::{SessionFilter, StoreError};

/// The `SELECT` for `filter`, with its parameters. Each condition is
/// present or not, so the statement cache holds at most one statement per
/// combination.
fn list_query(filter: &SessionFilter) -> (String, Vec<SqlValue>) {
    let mut conditions = Vec::new();
    let mut params = Vec::new();
    if let Some(owner) = &filter.owner {
        params.push(SqlValue::Text(owner.clone()));
        conditions.push(format!("owner = ?{}", params.len()));
    }
    if let Some(status) = filter.status {
        params.push(SqlValue::Text(status.as_str().into()));
        conditions.push(format!("status = ?{}", params.len()));
    }
    if let Some(kind) = &filter.kind {
        params.push(SqlValue::Text(kind.as_str().into()));
        conditions.push(format!("kind = ?{}", params.len()));
    }
    if let Some(ephemeral) = filter.ephemeral {
        params.push(SqlValue::Integer(i64::from(ephemeral)));
        conditions.push(format!("ephemeral = ?{}", params.len()));
    }
    match &filter.origin {
        None => {}
        Some(None) => conditions.push("origin IS NULL".to_owned()),
        Some(Some(origin)) => {
            params.push(SqlValue::Text(origin.clone()));
            conditions.push(format!("origin = ?{}", params.len()));
        }
    }
    // Values compare with their JSON type (`true` is no `1`): scalars as
    // SQL values, objects and arrays as their JSON text.
    for (key, value) in &filter.metadata {
        params.push(SqlValue::Text(key.clone()));
        params.push(SqlValue::Text(value.to_string()));
        let n = params.len();
        conditions.push(format!(
            "EXISTS (SELECT 1 FROM json_each(sessions.metadata) AS m \
             WHERE m.key = ?{} AND m.type = json_type(?{n}) \
             AND m.value IS json_extract(?{n}, '$'))",
            n - 1
        ));
    }
    if let Some(before) = filter.before {
        params.push(SqlValue::Text(before.to_string()));
        let n = params.len();
        conditions.push(format!(
            "(created_at, rowid) < (SELECT created_at, rowid FROM sessions WHERE id = ?{n})"
        ));
    }
    let mut sql = format!("SELECT {} FROM sessions", session_columns!());
    if !conditions.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&conditions.join(" AND "));
    }
    sql.push_str(" ORDER BY created_at DESC, rowid DESC");
    if let Some(limit) = filter.limit {
        params.push(SqlValue::Integer(i64::try_from(limit).unwrap_or(i64::MAX)));
        sql.push_str(&format!(" LIMIT ?{}", params.len()));
    }
    (sql, params)
}

pub(super) fn list(
    conn: &Connection,
    filter: &SessionFilter,
) -> Result<Vec<SessionRow>, StoreError> {
    let (sql, params) = list_query(filter);
    let mut statement = conn.prepare_cached(&sql)?;
    let rows = statement.query_map(rusqlite::params_from_iter(params), SessionRow::read)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// The closed ephemeral sessions made and last updated before `?2`, at
/// most `?3`. `+status` keeps the planner (which has no statistics) off
/// `sessions_by_status`: every closed session is an ephemeral one within
/// its retention, while the ephemeral sessions made before the cutoff are
/// mostly those that expired.
pub(super) const EXPIRED_EPHEMERAL: &str = "SELECT id FROM sessions WHERE ephemeral = 1 AND created_at < ?2 AND +status = ?1 \
     AND updated_at < ?2 ORDER BY updated_at LIMIT ?3";

pub(super) fn expired_ephemeral(
    conn: &Connection,
    cutoff: DateTime<Utc>,
    limit: usize,
) -> Result<Vec<String>, StoreError> {
    let mut statement = conn.prepare_cached(EXPIRED_EPHEMERAL)?;
    let rows = statement.query_map(
        rusqlite::params![
            SessionStatus::Closed.as_str(),
            encode_time(cutoff),
            i64::try_from(limit).unwrap_or(i64::MAX)
        ],
        |row| row.get(0),
    )?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SessionKind;

    #[test]
    fn conditions_number_their_parameters_in_order() {
        let (sql, params) = list_query(&SessionFilter {
            owner: Some("o".into()),
            status: None,
            kind: Some(SessionKind::AGENT),
            ephemeral: Some(false),
            before: Some(uuid::Uuid::nil()),
            limit: Some(5),
            ..SessionFilter::default()
        });
        assert!(
            sql.contains("owner = ?1 AND kind = ?2 AND ephemeral = ?3 AND (created_at, rowid) <"),
            "{sql}"
        );
        assert!(sql.contains("WHERE id = ?4"), "{sql}");
        assert!(sql.ends_with("LIMIT ?5"), "{sql}");
        assert_eq!(params.len(), 5);
        let (sql, params) = list_query(&SessionFilter::default());
        assert!(!sql.contains("WHERE"), "{sql}");
        assert!(params.is_empty());
    }
}
