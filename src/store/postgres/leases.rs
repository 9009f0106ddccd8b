//! Leases in PostgreSQL: one row per name, taken over when expired, every
//! time by the database's clock so that replicas whose clocks differ agree.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::{PostgresStore, unsigned};
use crate::store::{Lease, LeaseStore, StoreError};

fn lease(row: &PgRow) -> Result<Lease, StoreError> {
    let name: String = row.try_get(0)?;
    let fence = unsigned(&format!("lease {name}: fence"), row.try_get(3)?)?;
    Ok(Lease {
        holder: row.try_get(1)?,
        expires_at: row.try_get(2)?,
        fence,
        name,
    })
}

impl PostgresStore {
    /// Runs a statement on the lease `$1` for the holder `$2` until `$3`
    /// microseconds from now, answering the row it returns, if any.
    async fn holding(
        &self,
        sql: &'static str,
        (name, holder, ttl): (&str, &str, Duration),
    ) -> Result<Option<PgRow>, StoreError> {
        let ttl_us = i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX);
        Ok(sqlx::query(sql)
            .bind(name)
            .bind(holder)
            .bind(ttl_us)
            .fetch_optional(&self.pool)
            .await?)
    }
}

#[async_trait]
impl LeaseStore for PostgresStore {
    async fn lease_acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Lease, StoreError> {
        // A holder may release between the two statements below: the lease
        // is free then, and the next round takes it.
        loop {
            let taken = self
                .holding(
                    take_lease!("VALUES ($1, $2, now() + $3 * interval '1 microsecond', 1)"),
                    (name, holder, ttl),
                )
                .await?;
            let row = match taken {
                Some(row) => Some(row),
                None => {
                    sqlx::query(
                        "SELECT name, holder, expires_at, fence FROM leases WHERE name = $1",
                    )
                    .bind(name)
                    .fetch_optional(&self.pool)
                    .await?
                }
            };
            if let Some(row) = row {
                return lease(&row);
            }
        }
    }

    async fn lease_renew(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let row = self
            .holding(
                "UPDATE leases SET expires_at = now() + $3 * interval '1 microsecond'
                 WHERE name = $1 AND holder = $2
                 RETURNING name, holder, expires_at, fence",
                (name, holder, ttl),
            )
            .await?;
        row.as_ref().map(lease).transpose()
    }

    async fn lease_release(&self, name: &str, holder: &str) -> Result<bool, StoreError> {
        // Removed, so that only leases whose holders died are left to
        // expire (and to be listed by `leases_expired`).
        let changed = sqlx::query("DELETE FROM leases WHERE name = $1 AND holder = $2")
            .bind(name)
            .bind(holder)
            .execute(&self.pool)
            .await?;
        Ok(changed.rows_affected() > 0)
    }

    async fn leases_expired(&self, prefix: &str) -> Result<Vec<Lease>, StoreError> {
        let rows = sqlx::query(
            "SELECT name, holder, expires_at, fence FROM leases
             WHERE expires_at <= now() AND starts_with(name, $1)
             ORDER BY expires_at",
        )
        .bind(prefix)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(lease).collect()
    }
}
