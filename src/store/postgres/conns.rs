//! The store's connections: sqlx's pool, with the connections a statement
//! is done with kept here instead of going back to it.
//!
//! sqlx returns a dropped pool connection from a task of its own that
//! pings it first: a round trip (and a task) after every statement, which
//! no statistics of PostgreSQL count. A statement that completed leaves
//! its connection fit for the next one, so it is kept here: handed at once
//! to the caller that has waited longest, or else kept idle for the next
//! one, without that ping. A connection whose statement failed, or whose
//! caller went away in the middle, is dropped the sqlx way, ping and all.
//! A kept connection idle for [`ALIVE_WITHOUT_PING`] or more is pinged
//! before use and dropped when it does not answer. A caller takes a
//! connection from the pool (a new one, or one sqlx holds) only while
//! fewer than its maximum are out here; otherwise it waits its turn for
//! one a statement is done with, or for the place of one that went back
//! to sqlx (it then takes one from the pool), up to the pool's acquire
//! timeout.

use std::collections::VecDeque;
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
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::sync::lock;

/// A connection used this recently is handed out without a ping, as
/// HikariCP does (its `aliveBypassWindowMs`): one that has been idle
/// longer is pinged first, and replaced if it does not answer (the
/// database restarted, a proxy dropped it). A connection that died within
/// this window fails the statement that takes it, and is then dropped.
pub(super) const ALIVE_WITHOUT_PING: Duration = Duration::from_millis(500);

/// What a waiting caller is handed: a connection a statement is done
/// with, or (`None`) the place of one that went back to sqlx, to take a
/// connection from the pool with.
type Handed = oneshot::Sender<Option<PoolConnection<Postgres>>>;

pub(super) struct Conns {
    pool: PgPool,
    /// The most connections out of the pool at once: its maximum.
    most: u32,
    /// How long a caller waits for a connection: the pool's acquire
    /// timeout.
    patience: Duration,
    kept: Mutex<Kept>,
}

struct Kept {
    /// Most recently used last.
    idle: Vec<(PoolConnection<Postgres>, Instant)>,
    /// Connections taken from the pool and not given back: idle here or
    /// running a statement.
    out: u32,
    /// Callers waiting for a connection while `most` are out, the longest
    /// waiting first; a connection a statement is done with goes to the
    /// first still waiting.
    waiting: VecDeque<Handed>,
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
    /// Its place out of the pool, given back unless the connection is
    /// kept.
    place: Place<'a>,
}

/// What a caller of [`Conns::get`] goes on with.
enum Next {
    Kept(PoolConnection<Postgres>, Instant),
    /// A place out of the pool is the caller's: it takes a connection.
    FromPool,
    Wait(oneshot::Receiver<Option<PoolConnection<Postgres>>>),
}

impl Conns {
    pub fn new(pool: PgPool) -> Conns {
        Conns {
            most: pool.options().get_max_connections(),
            patience: pool.options().get_acquire_timeout(),
            pool,
            kept: Mutex::new(Kept {
                idle: Vec::new(),
                out: 0,
                waiting: VecDeque::new(),
                closed: false,
            }),
        }
    }

    /// A connection: the one kept most recently, one from the pool while
    /// fewer than its maximum are out, or the next one a statement is done
    /// with.
    pub async fn get(&self) -> Result<Conn<'_>, sqlx::Error> {
        loop {
            let next = {
                let mut kept = lock(&self.kept);
                if let Some((conn, since)) = kept.idle.pop() {
                    Next::Kept(conn, since)
                } else if kept.closed || kept.out < self.most {
                    // Closed, the pool answers that it is.
                    kept.out += 1;
                    Next::FromPool
                } else {
                    let (handed, taken) = oneshot::channel();
                    kept.waiting.push_back(handed);
                    Next::Wait(taken)
                }
            };
            match next {
                Next::Kept(conn, since) => {
                    let mut conn = self.conn(conn);
                    if since.elapsed() >= ALIVE_WITHOUT_PING && conn.ping().await.is_err() {
                        // Dropped, its place given back.
                        conn.conn.close_on_drop();
                        continue;
                    }
                    return Ok(conn);
                }
                Next::FromPool => return self.take_from_pool().await,
                Next::Wait(taken) => {
                    let mut wait = Waiter { taken, home: self };
                    let handed = match tokio::time::timeout(self.patience, &mut wait.taken).await {
                        Ok(Ok(handed)) => handed,
                        // Closed: the pool says so.
                        Ok(Err(_)) => continue,
                        Err(_) => match wait.stop() {
                            Some(handed) => handed,
                            None => return Err(sqlx::Error::PoolTimedOut),
                        },
                    };
                    return match handed {
                        Some(conn) => Ok(self.conn(conn)),
                        None => self.take_from_pool().await,
                    };
                }
            }
        }
    }

    /// A connection from the pool, in a place out of it that is the
    /// caller's.
    async fn take_from_pool(&self) -> Result<Conn<'_>, sqlx::Error> {
        let place = Place(Some(self));
        let conn = self.pool.acquire().await?;
        Ok(Conn { conn, place })
    }

    fn conn(&self, conn: PoolConnection<Postgres>) -> Conn<'_> {
        Conn {
            conn,
            place: Place(Some(self)),
        }
    }

    /// Keeps a connection fit for the next statement: to the first caller
    /// still waiting, else idle.
    fn keep(&self, mut conn: PoolConnection<Postgres>) {
        let mut kept = lock(&self.kept);
        if kept.closed {
            kept.out -= 1;
            // Dropped outside the lock: back to the pool, which closes it.
            drop(kept);
            drop(conn);
            return;
        }
        while let Some(handed) = kept.waiting.pop_front() {
            // Sent, or (never) bounced without it.
            let Err(Some(back)) = handed.send(Some(conn)) else {
                return;
            };
            // That caller went away.
            conn = back;
        }
        kept.idle.push((conn, Instant::now()));
    }

    /// Gives up a place out of the pool whose connection went back to
    /// sqlx: to the first caller still waiting, who takes a connection
    /// from the pool in it, else back to the pool. (A caller waiting only
    /// for connections that statements are done with would wait out its
    /// timeout once the others' statements failed.)
    fn give_up_place(&self) {
        let mut kept = lock(&self.kept);
        while let Some(handed) = kept.waiting.pop_front() {
            if handed.send(None).is_ok() {
                return;
            }
        }
        kept.out -= 1;
    }

    /// A transaction on a connection from [`Conns::get`]; its connection
    /// goes back to sqlx when it ends.
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        let conn = self.get().await?.detach();
        // sqlx's own `Pool::begin` does the same with a connection it
        // acquired.
        Transaction::begin(conn, None).await
    }

    pub fn is_closed(&self) -> bool {
        self.pool.is_closed()
    }

    /// Closes every connection, waiting for those in use.
    pub async fn close(&self) {
        let (idle, waiting) = {
            let mut kept = lock(&self.kept);
            kept.closed = true;
            let idle = std::mem::take(&mut kept.idle);
            kept.out -= u32::try_from(idle.len()).unwrap_or(u32::MAX);
            (idle, std::mem::take(&mut kept.waiting))
        };
        drop(idle);
        // The callers waiting try again, and the closed pool refuses them.
        drop(waiting);
        self.pool.close().await;
    }
}

impl Conn<'_> {
    /// Keeps the connection for the next statement: what it ran is over.
    pub fn done(self) {
        let Conn { conn, mut place } = self;
        if let Some(home) = place.0.take() {
            home.keep(conn);
        }
    }

    /// The connection, out of this module's hands (its place given back):
    /// it goes back to sqlx when dropped.
    fn detach(self) -> PoolConnection<Postgres> {
        self.conn
    }
}

/// A place out of the pool, given back when dropped: the caller got no
/// connection (an error, or it went away), or its connection went back to
/// sqlx (a statement that failed or was given up; sqlx pings it).
struct Place<'a>(Option<&'a Conns>);

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if let Some(conns) = self.0 {
            conns.give_up_place();
        }
    }
}

/// A caller waiting for a connection a statement is done with. One handed
/// over just as the caller went away is kept for the next.
struct Waiter<'a> {
    taken: oneshot::Receiver<Option<PoolConnection<Postgres>>>,
    home: &'a Conns,
}

impl Waiter<'_> {
    /// Stops waiting: answers what was handed over meanwhile.
    fn stop(&mut self) -> Option<Option<PoolConnection<Postgres>>> {
        self.taken.close();
        self.taken.try_recv().ok()
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        match self.stop() {
            Some(Some(conn)) => self.home.keep(conn),
            Some(None) => self.home.give_up_place(),
            None => {}
        }
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
    use std::sync::atomic::{AtomicUsize, Ordering};

    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

    use super::*;

    fn server() -> PgConnectOptions {
        let url = std::env::var("CONCLAVE_TEST_POSTGRES").expect(
            "CONCLAVE_TEST_POSTGRES is not set: scripts/test.sh starts PostgreSQL and sets it",
        );
        PgConnectOptions::from_str(&url).unwrap()
    }

    /// A pool of `most` that counts the connections given back to it
    /// (each of which sqlx pings: a round trip).
    fn counted_pool(most: u32, timeout: Duration) -> (PgPool, Arc<AtomicUsize>) {
        let released = Arc::new(AtomicUsize::new(0));
        let count = released.clone();
        let pool = PgPoolOptions::new()
            .max_connections(most)
            .acquire_timeout(timeout)
            .after_release(move |_, _| {
                count.fetch_add(1, Ordering::SeqCst);
                Box::pin(async { Ok(true) })
            })
            .connect_lazy_with(server());
        (pool, released)
    }

    /// Callers waiting on a full pool take the connections others keep,
    /// handed over directly: none goes back to the pool (and its ping)
    /// until a statement fails.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_waiting_for_a_connection_get_the_ones_kept() {
        let (pool, released) = counted_pool(2, Duration::from_secs(2));
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
        assert_eq!(
            released.load(Ordering::SeqCst),
            0,
            "connections went back to the pool"
        );
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

    /// A connection whose statement failed goes back to sqlx; its place
    /// goes to the caller waiting, who takes a connection from the pool
    /// in it instead of waiting out its timeout for one a statement is
    /// done with.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_statements_place_goes_to_the_caller_waiting() {
        let (pool, released) = counted_pool(1, Duration::from_secs(30));
        let conns = Arc::new(Conns::new(pool));
        let mut held = conns.get().await.unwrap();
        let waiting = tokio::spawn({
            let conns = conns.clone();
            async move {
                let mut conn = conns.get().await?;
                let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&mut *conn).await?;
                conn.done();
                Ok::<_, sqlx::Error>(one)
            }
        });
        while lock(&conns.kept).waiting.is_empty() {
            tokio::task::yield_now().await;
        }
        assert!(sqlx::query("SELECT 1/0").execute(&mut *held).await.is_err());
        // Not kept: the connection goes back to sqlx.
        drop(held);
        assert_eq!(waiting.await.unwrap().unwrap(), 1);
        assert_eq!(released.load(Ordering::SeqCst), 1);
        let counts = {
            let kept = lock(&conns.kept);
            (kept.out, kept.idle.len(), kept.waiting.len())
        };
        assert_eq!(counts, (1, 1, 0));
        conns.close().await;
    }

    /// A caller that gives up waiting (its own timeout, or it went away)
    /// holds no place: the connection goes to the next caller, and the
    /// pool is never counted short.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_caller_that_stops_waiting_leaves_the_connection_to_the_next() {
        let (pool, released) = counted_pool(1, Duration::from_millis(300));
        let conns = Arc::new(Conns::new(pool));
        let held = conns.get().await.unwrap();
        let timed_out = sqlx::query("SELECT 1").execute(&*conns).await;
        assert!(
            matches!(timed_out, Err(sqlx::Error::PoolTimedOut)),
            "the one connection is held: {timed_out:?}"
        );
        // One waiting caller goes away before the connection is free.
        let waiting = tokio::spawn({
            let conns = conns.clone();
            async move { conns.get().await.map(|conn| conn.done()) }
        });
        while lock(&conns.kept).waiting.is_empty() {
            tokio::task::yield_now().await;
        }
        waiting.abort();
        assert!(waiting.await.unwrap_err().is_cancelled());
        held.done();
        let one: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&*conns)
            .await
            .unwrap();
        assert_eq!(one, 1);
        let counts = {
            let kept = lock(&conns.kept);
            (kept.out, kept.idle.len())
        };
        assert_eq!(counts, (1, 1));
        assert_eq!(released.load(Ordering::SeqCst), 0);
        conns.close().await;
    }
}
