//! Usage per key in SQLite: an upsert per add, the day's totals read in
//! the same job.

use async_trait::async_trait;
use chrono::NaiveDate;
use rusqlite::{Connection, params};

use super::SqliteStore;
use crate::store::usage::{count, decode_day, encode_day, signed};
use crate::store::{StoreError, UsageCounts, UsageRow, UsageStore};

/// The counts of a row whose columns 0.. are the seven of [`UsageCounts`].
fn counts(row: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<UsageCounts> {
    Ok(UsageCounts {
        input_tokens: count(row.get(at)?),
        output_tokens: count(row.get(at + 1)?),
        cost_usd: row.get(at + 2)?,
        turns: count(row.get(at + 3)?),
        tool_calls: count(row.get(at + 4)?),
        sandbox_cpu_s: row.get(at + 5)?,
        sandbox_wall_s: row.get(at + 6)?,
    })
}

fn day_totals(conn: &Connection, owner: &str, day: &str) -> Result<UsageCounts, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0),
                COALESCE(SUM(cost_usd), 0.0), COALESCE(SUM(turns), 0),
                COALESCE(SUM(tool_calls), 0), COALESCE(SUM(sandbox_cpu_s), 0.0),
                COALESCE(SUM(sandbox_wall_s), 0.0)
             FROM key_usage WHERE owner = ?1 AND day = ?2",
        )?
        .query_row(params![owner, day], |row| counts(row, 0))?)
}

/// Adds `row`'s counts to the key's row of its day and model, made when
/// missing.
pub(super) fn add_usage(conn: &Connection, row: &UsageRow) -> Result<(), StoreError> {
    let add = &row.counts;
    conn.prepare_cached(
        "INSERT INTO key_usage (owner, day, model, input_tokens, output_tokens,
            cost_usd, turns, tool_calls, sandbox_cpu_s, sandbox_wall_s)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
         ON CONFLICT (owner, day, model) DO UPDATE SET
            input_tokens = input_tokens + excluded.input_tokens,
            output_tokens = output_tokens + excluded.output_tokens,
            cost_usd = cost_usd + excluded.cost_usd,
            turns = turns + excluded.turns,
            tool_calls = tool_calls + excluded.tool_calls,
            sandbox_cpu_s = sandbox_cpu_s + excluded.sandbox_cpu_s,
            sandbox_wall_s = sandbox_wall_s + excluded.sandbox_wall_s",
    )?
    .execute(params![
        row.owner,
        encode_day(row.day),
        row.model,
        signed(add.input_tokens),
        signed(add.output_tokens),
        add.cost_usd,
        signed(add.turns),
        signed(add.tool_calls),
        add.sandbox_cpu_s,
        add.sandbox_wall_s,
    ])?;
    Ok(())
}

#[async_trait]
impl UsageStore for SqliteStore {
    async fn usage_add(
        &self,
        owner: &str,
        day: NaiveDate,
        model: &str,
        add: &UsageCounts,
    ) -> Result<UsageCounts, StoreError> {
        let row = UsageRow {
            owner: owner.to_owned(),
            day,
            model: model.to_owned(),
            counts: *add,
        };
        self.call(move |conn| {
            add_usage(conn, &row)?;
            day_totals(conn, &row.owner, &encode_day(row.day))
        })
        .await
    }

    async fn usage_rows(
        &self,
        from: NaiveDate,
        to: NaiveDate,
        owner: Option<&str>,
    ) -> Result<Vec<UsageRow>, StoreError> {
        let (from, to, owner) = (encode_day(from), encode_day(to), owner.map(str::to_owned));
        let rows: Vec<(String, String, String, UsageCounts)> = self
            .call(move |conn| {
                let mut statement = conn.prepare_cached(
                    "SELECT owner, day, model, input_tokens, output_tokens, cost_usd, turns,
                        tool_calls, sandbox_cpu_s, sandbox_wall_s
                     FROM key_usage
                     WHERE day >= ?1 AND day <= ?2 AND (?3 IS NULL OR owner = ?3)
                     ORDER BY owner, day, model",
                )?;
                let rows = statement
                    .query_map(params![from, to, owner], |row| {
                        Ok((row.get(0)?, row.get(1)?, row.get(2)?, counts(row, 3)?))
                    })?
                    .collect::<rusqlite::Result<_>>()?;
                Ok(rows)
            })
            .await?;
        rows.into_iter()
            .map(|(owner, day, model, counts)| {
                Ok(UsageRow {
                    owner,
                    day: decode_day(&day)?,
                    model,
                    counts,
                })
            })
            .collect()
    }

    async fn usage_day(&self, owner: &str, day: NaiveDate) -> Result<UsageCounts, StoreError> {
        let (owner, day) = (owner.to_owned(), encode_day(day));
        self.call(move |conn| day_totals(conn, &owner, &day)).await
    }
}
