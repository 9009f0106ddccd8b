//! Usage per key in PostgreSQL: one statement adds and reads the day's
//! totals back. A key's row of a day and model is striped by connection
//! (see `stripe!`): adds on different connections do not wait for each
//! other, and every read sums the stripes, with the rows `key_usage`
//! holds from before them (`key_usage_rows`). An add's totals count every
//! add committed before it began and its own; of adds under way at the
//! same moment on other connections, each counts only its own.

use async_trait::async_trait;
use chrono::NaiveDate;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{Postgres, Row};

use super::PostgresStore;
use crate::store::usage::{count, decode_day, encode_day, signed};
use crate::store::{StoreError, UsageCounts, UsageRow, UsageStore};

/// The sums of the seven counts, as the columns 0.. that [`counts`] reads.
macro_rules! sums {
    () => {
        "COALESCE(SUM(input_tokens), 0)::BIGINT, COALESCE(SUM(output_tokens), 0)::BIGINT,
    COALESCE(SUM(cost_usd), 0)::FLOAT8, COALESCE(SUM(turns), 0)::BIGINT,
    COALESCE(SUM(tool_calls), 0)::BIGINT, COALESCE(SUM(sandbox_cpu_s), 0)::FLOAT8,
    COALESCE(SUM(sandbox_wall_s), 0)::FLOAT8"
    };
}

/// Adds `$4`–`$10` to the stripe of (`$1`, `$2`, `$3`) and answers the
/// owner's totals on the day. The statement's snapshot does not see its
/// own upsert: the upserted row comes from `RETURNING`, the day's other
/// rows (the other stripes and models) from the table.
const ADD: &str = concat!(
    "WITH up AS (",
    add_usage!("VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"),
    " RETURNING input_tokens, output_tokens, cost_usd, turns, tool_calls,
            sandbox_cpu_s, sandbox_wall_s
    ), day_rows AS (
        SELECT * FROM up
        UNION ALL
        SELECT input_tokens, output_tokens, cost_usd, turns, tool_calls,
            sandbox_cpu_s, sandbox_wall_s
        FROM key_usage_rows WHERE owner = $1 AND day = $2
            AND NOT (model = $3 AND stripe = ",
    stripe!(),
    ")
    )
    SELECT ",
    sums!(),
    " FROM day_rows"
);

/// [`ADD`] of `add` to `owner`'s usage of `model` on `day`.
fn add_query<'q>(
    owner: &'q str,
    day: NaiveDate,
    model: &'q str,
    add: &UsageCounts,
) -> Query<'q, Postgres, PgArguments> {
    sqlx::query(ADD)
        .bind(owner)
        .bind(encode_day(day))
        .bind(model)
        .bind(signed(add.input_tokens))
        .bind(signed(add.output_tokens))
        .bind(add.cost_usd)
        .bind(signed(add.turns))
        .bind(signed(add.tool_calls))
        .bind(add.sandbox_cpu_s)
        .bind(add.sandbox_wall_s)
}

/// The seven counts from column `at` on.
fn counts(row: &PgRow, at: usize) -> Result<UsageCounts, StoreError> {
    Ok(UsageCounts {
        input_tokens: count(row.try_get(at)?),
        output_tokens: count(row.try_get(at + 1)?),
        cost_usd: row.try_get(at + 2)?,
        turns: count(row.try_get(at + 3)?),
        tool_calls: count(row.try_get(at + 4)?),
        sandbox_cpu_s: row.try_get(at + 5)?,
        sandbox_wall_s: row.try_get(at + 6)?,
    })
}

#[async_trait]
impl UsageStore for PostgresStore {
    async fn usage_add(
        &self,
        owner: &str,
        day: NaiveDate,
        model: &str,
        add: &UsageCounts,
    ) -> Result<UsageCounts, StoreError> {
        let row = add_query(owner, day, model, add)
            .fetch_one(&self.pool)
            .await?;
        counts(&row, 0)
    }

    async fn usage_rows(
        &self,
        from: NaiveDate,
        to: NaiveDate,
        owner: Option<&str>,
    ) -> Result<Vec<UsageRow>, StoreError> {
        let rows = sqlx::query(concat!(
            "SELECT owner, day, model, ",
            sums!(),
            " FROM key_usage_rows
                 WHERE day >= $1 AND day <= $2 AND ($3::TEXT IS NULL OR owner = $3)
                 GROUP BY owner, day, model
                 ORDER BY owner, day, model"
        ))
        .bind(encode_day(from))
        .bind(encode_day(to))
        .bind(owner)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let day: String = row.try_get(1)?;
                Ok(UsageRow {
                    owner: row.try_get(0)?,
                    day: decode_day(&day)?,
                    model: row.try_get(2)?,
                    counts: counts(row, 3)?,
                })
            })
            .collect()
    }

    async fn usage_day(&self, owner: &str, day: NaiveDate) -> Result<UsageCounts, StoreError> {
        let sql = concat!(
            "SELECT ",
            sums!(),
            " FROM key_usage_rows WHERE owner = $1 AND day = $2"
        );
        let row = sqlx::query(sql)
            .bind(owner)
            .bind(encode_day(day))
            .fetch_one(&self.pool)
            .await?;
        counts(&row, 0)
    }
}

#[cfg(test)]
#[path = "usage_tests.rs"]
mod tests;
