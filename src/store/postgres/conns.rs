//! The store's connections: sqlx's pool, with the connections a statement
//! is done with kept here instead of going back to it.
//!
//! sqlx returns a dropped pool connection from a task of its own that
//! pings it first: a round trip (and a task) after every statement, which
//! no statistics of PostgreSQL count. A statement that completed leaves
//! its connection fit for the next one, so it is kept here and handed out
//! again without that ping. A connection whose statement failed, or whose
//! caller went away in the middle, is dropped the sqlx way, ping and all.
//! A kept connection idle for [`ALIVE_WITHOUT_PING`] or more is pinged
//! before use and dropped when it does not answer. While callers wait for
//! the pool (every connection in use), connections go back to it as
//! before, and it hands them out in turn.

use std::sync::Mutex;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{self, BoxStream};
use futures::{StreamExt, TryStreamExt};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{
    Connection, Either, Execute, Executor, PgConnection, PgPool, Postgres, SqlStr, Transaction,
};
use tokio::time::Instant;

use crate::sync::lock;

/// A connection used this recently is handed out without a ping, as
/// HikariCP does (its `aliveBypassWindowMs`): one that has been idle
/// longer is pinged first, and replaced if it does not answer (the
/// database restarted, a proxy dropped it). A connection that died within
/// this window fails the statement that takes it, and is then dropped.
pub(super) const ALIVE_WITHOUT_PING: Duration = Duration::from_millis(500);

pub(super) struct Conns {
    pool: PgPool,
    kept: Mutex<Kept>,
}

struct Kept {
    /// Most recently used last.
    idle: Vec<(PoolConnection<Postgres>, Instant)>,
    /// Callers waiting for the pool to hand them a connection: while
    /// there are any, a connection a statement is done with goes back to
    /// the pool, which hands it to the first of them.
    waiting: usize,
    /// Set by [`Conns::close`]: connections go back to the pool, which
    /// closes them.
    closed: bool,
}

impl std::fmt::Debug for Conns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conns").field("pool", &self.pool).finish()
    }
}

/// A connection taken from [`Conns`]; [`Conn::done`] keeps it for the
/// next statement, dropping it gives it back to sqlx.
pub(super) struct Conn<'a> {
    conn: PoolConnection<Postgres>,
    home: &'a Conns,
}

impl Conns {
    pub fn new(pool: PgPool) -> Conns {
        Conns {
            pool,
            kept: Mutex::new(Kept {
                idle: Vec::new(),
                waiting: 0,
                closed: false,
            }),
        }
    }

    /// A connection: the one kept most recently, or one from the pool.
    pub async fn get(&self) -> Result<Conn<'_>, sqlx::Error> {
        loop {
            let taken = {
                let mut kept = lock(&self.kept);
                let taken = kept.idle.pop();
                // Counted under the same lock as the connections kept: one
                // kept from now on goes to the pool, and so to this caller.
                if taken.is_none() {
                    kept.waiting += 1;
                }
                taken
            };
            let Some((mut conn, since)) = taken else {
                let _waiting = Waiting(&self.kept);
                let conn = self.pool.acquire().await?;
                return Ok(Conn { conn, home: self });
            };
            if since.elapsed() >= ALIVE_WITHOUT_PING && conn.ping().await.is_err() {
                conn.close_on_drop();
                continue;
            }
            return Ok(Conn { conn, home: self });
        }
    }

    /// A transaction on a connection from [`Conns::get`]; its connection
    /// goes back to sqlx when it ends.
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        let Conn { conn, .. } = self.get().await?;
        // sqlx's own `Pool::begin` does the same with a connection it
        // acquired.
        Transaction::begin(conn, None).await
    }

    pub fn is_closed(&self) -> bool {
        self.pool.is_closed()
    }

    /// Closes every connection, waiting for those in use.
    pub async fn close(&self) {
        let idle = {
            let mut kept = lock(&self.kept);
            kept.closed = true;
            std::mem::take(&mut kept.idle)
        };
        drop(idle);
        self.pool.close().await;
    }
}

impl Conn<'_> {
    /// Keeps the connection for the next statement: what it ran is over.
    pub fn done(self) {
        let Conn { conn, home } = self;
        let mut kept = lock(&home.kept);
        if kept.closed || kept.waiting > 0 {
            // Dropped outside the lock: back to the pool.
            drop(kept);
            drop(conn);
            return;
        }
        kept.idle.push((conn, Instant::now()));
    }
}

/// One caller waiting on the pool, counted until it has a connection or
/// gives up.
struct Waiting<'a>(&'a Mutex<Kept>);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        lock(self.0).waiting -= 1;
    }
}

impl std::ops::Deref for Conn<'_> {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for Conn<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}

/// Statements run on `&conns` as on a pool: each on a connection of its
/// own, kept when the statement completed.
impl<'p> Executor<'p> for &'p Conns {
    type Database = Postgres;

    /// Reads every result before yielding the first: the connection is
    /// kept only once the statement is over. (The store's reads are
    /// bounded: pages, single rows.)
    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        stream::once(async move {
            let mut conn = self.get().await?;
            let all: Vec<_> = conn.fetch_many(query).try_collect().await?;
            conn.done();
            Ok::<_, sqlx::Error>(stream::iter(all.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        Box::pin(async move {
            let mut conn = self.get().await?;
            let row = conn.fetch_optional(query).await?;
            conn.done();
            Ok(row)
        })
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, sqlx::Error>>
    where
        'p: 'e,
    {
        Box::pin(async move {
            let mut conn = self.get().await?;
            let statement = conn.prepare_with(sql, parameters).await?;
            conn.done();
            Ok(statement)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;
    use std::sync::Arc;

    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

    use super::*;

    fn server() -> PgConnectOptions {
        let url = std::env::var("CONCLAVE_TEST_POSTGRES").expect(
            "CONCLAVE_TEST_POSTGRES is not set: scripts/test.sh starts PostgreSQL and sets it",
        );
        PgConnectOptions::from_str(&url).unwrap()
    }

    /// Callers waiting on a full pool take the connections others keep:
    /// the pool never learns they are free, and would time them out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_waiting_for_a_connection_get_the_ones_kept() {
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(2))
            .connect_lazy_with(server());
        let conns = Arc::new(Conns::new(pool));
        let calls = (0..20).map(|_| {
            let conns = conns.clone();
            tokio::spawn(async move {
                sqlx::query_scalar::<_, i32>("SELECT pg_backend_pid() FROM pg_sleep(0.2)")
                    .fetch_one(&*conns)
                    .await
            })
        });
        let mut backends = std::collections::HashSet::new();
        for call in futures::future::join_all(calls).await {
            backends.insert(call.unwrap().expect("every call got a connection"));
        }
        assert!(backends.len() <= 2, "{backends:?}");
        // A statement that failed gives its connection back to sqlx; the
        // next ones still run.
        assert!(sqlx::query("SELECT 1/0").execute(&*conns).await.is_err());
        let one: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&*conns)
            .await
            .unwrap();
        assert_eq!(one, 1);
        conns.close().await;
        assert!(sqlx::query("SELECT 1").execute(&*conns).await.is_err());
    }
}
