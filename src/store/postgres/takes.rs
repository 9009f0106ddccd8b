//! Taking a session's turn: its lease, and its row as the turn starts
//! from it, in one statement. Takes of several sessions waiting at the
//! same time go in one statement ([`super::grouped`]).

use std::future::Future;
use std::sync::LazyLock;
use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, PgConnection, Row};
use uuid::Uuid;

use super::PostgresStore;
use super::conns::Conn;
use super::grouped::{Waiting, Work, failed};
use super::sessions::{AT_END, COLUMNS, session_end};
use crate::store::{StoreError, TurnLease};

/// One take: the session's row is read first, locked for share: that
/// waits for a batch writing it and then reads the row as that batch left
/// it, even when the batch committed after this statement's snapshot (as
/// the one that frees the lease may have). The lease is taken only for a
/// session that exists, and after its row, the order the batches lock
/// them in. Answers the row and whether the lease is `$2`'s (column
/// [`TAKEN`]).
static ONE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH held AS (
             SELECT {COLUMNS}, {AT_END} FROM sessions WHERE id = $4 FOR SHARE
         ), taken AS ({})
         SELECT held.*, (SELECT count(*) > 0 FROM taken WHERE holder = $2) FROM held",
        take_lease!("SELECT $1, $2, now() + $3 * interval '1 microsecond', 1 FROM held")
    )
});

/// Takes of several sessions, bound as arrays: as [`ONE`] for each, the
/// rows locked in the order of their ids. A session not found answers no
/// row.
static GROUP: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH t AS (
             SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::bigint[])
                 AS t(take_id, take_name, take_holder, take_ttl)
         ), held AS (
             SELECT {COLUMNS}, {AT_END}, take_name, take_holder, take_ttl
             FROM sessions JOIN t ON id = take_id ORDER BY id FOR SHARE OF sessions
         ), taken AS ({})
         SELECT {COLUMNS}, {AT_END}, EXISTS (
             SELECT FROM taken WHERE taken.name = held.take_name
                 AND taken.holder = held.take_holder
         ) FROM held",
        take_lease!(
            "SELECT take_name, take_holder, now() + take_ttl * interval '1 microsecond', 1
             FROM held"
        )
    )
});

/// The column after [`COLUMNS`] and [`AT_END`]: whether the lease was
/// taken.
const TAKEN: usize = 15;

/// A turn's lease to take for a session.
pub(super) struct Take {
    name: String,
    holder: String,
    /// Its time to live, in microseconds.
    ttl: i64,
}

/// What the caller that did a take tells the take's own caller.
pub(super) enum Taken {
    Done(Result<TurnLease, StoreError>),
    /// The group was refused: the take is to be done alone.
    Alone(Take),
}

impl Work for Take {
    type Answer = Taken;

    fn write(conn: Conn<'_>, takes: Vec<Waiting<Self>>) -> impl Future<Output = ()> + Send {
        write(conn, takes)
    }

    fn alone(self) -> Taken {
        Taken::Alone(self)
    }

    fn failed(err: StoreError) -> Taken {
        Taken::Done(Err(err))
    }
}

/// [`crate::store::Store::take_turn`], with the takes of other sessions
/// waiting when it is done.
pub(super) async fn take_turn(
    store: &PostgresStore,
    id: Uuid,
    (name, holder): (&str, &str),
    ttl: Duration,
) -> Result<TurnLease, StoreError> {
    let take = Take {
        name: name.to_owned(),
        holder: holder.to_owned(),
        ttl: i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX),
    };
    let answer = (store.takes)
        .submit(&store.pool, id, take, "taking the turn")
        .await?;
    match answer {
        Taken::Done(taken) => taken,
        Taken::Alone(take) => {
            let mut conn = store.pool.get().await?;
            let taken = take_one(&mut conn, id, &take).await?;
            conn.done();
            Ok(taken)
        }
    }
}

/// [`ONE`] on `conn`.
async fn take_one(conn: &mut PgConnection, id: Uuid, take: &Take) -> Result<TurnLease, StoreError> {
    let row = sqlx::query(AssertSqlSafe(ONE.as_str()))
        .bind(&take.name)
        .bind(&take.holder)
        .bind(take.ttl)
        .bind(id)
        .fetch_optional(conn)
        .await?;
    match row {
        Some(row) => taken(&row),
        None => Ok(TurnLease::NoSession),
    }
}

/// A row of [`ONE`] or [`GROUP`].
fn taken(row: &PgRow) -> Result<TurnLease, StoreError> {
    if !row.try_get::<bool, _>(TAKEN)? {
        return Ok(TurnLease::Busy);
    }
    Ok(TurnLease::Held(Box::new(session_end(row)?)))
}

/// Does `takes` on `conn` and answers each one's caller.
async fn write(mut conn: Conn<'_>, takes: Vec<Waiting<Take>>) {
    if takes.len() == 1 {
        let Some(one) = takes.into_iter().next() else {
            return;
        };
        let taken = take_one(&mut conn, one.session, &one.work).await;
        if taken.is_ok() {
            conn.done();
        }
        // A caller gone away wants no answer.
        let _ = one.answer.send(Taken::Done(taken));
        return;
    }
    let rows = sqlx::query(AssertSqlSafe(GROUP.as_str()))
        .bind(takes.iter().map(|t| t.session).collect::<Vec<_>>())
        .bind(
            takes
                .iter()
                .map(|t| t.work.name.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            takes
                .iter()
                .map(|t| t.work.holder.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(takes.iter().map(|t| t.work.ttl).collect::<Vec<_>>())
        .fetch_all(&mut *conn)
        .await;
    match rows {
        Ok(rows) => {
            conn.done();
            for take in takes {
                let row = rows
                    .iter()
                    .find(|row| row.try_get::<Uuid, _>(0).ok() == Some(take.session));
                let taken = row.map_or(Ok(TurnLease::NoSession), taken);
                let _ = take.answer.send(Taken::Done(taken));
            }
        }
        Err(err) => failed(takes, err),
    }
}

#[cfg(test)]
#[path = "takes_tests.rs"]
mod tests;
