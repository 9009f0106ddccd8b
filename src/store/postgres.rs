//! The shared store: one PostgreSQL database for every replica.
//!
//! A pool of connections (sqlx) serves every call; PostgreSQL groups the
//! commits of concurrent callers itself, so each call is one transaction
//! of its own. Writes that read before they write (KV compare-and-set,
//! message indices, bus positions) lock what they read in the database,
//! not in this process, so that several replicas writing at once stay
//! correct. Lease times are the database's `now()`: one clock for all.
//!
//! The schema is migrated at open by sqlx's migrator, whose own advisory
//! lock keeps two replicas starting at once from migrating twice.

use std::borrow::Cow;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};
use sqlx::{Connection, SqlSafeStr};

use super::{Store, StoreError};

/// The stripe of `key_usage_stripes` the connection running a statement
/// adds to: its backend's process id, modulo the stripes. Two
/// transactions add to the same row of a key, day and model only when
/// their backends share a stripe, so turns of one key on several
/// connections (and replicas) do not queue for one row's lock and each
/// other's commits; readers sum the rows of `key_usage_rows`.
macro_rules! stripe {
    () => {
        "(pg_backend_pid() % 64)::smallint"
    };
}

/// Inserts a key's usage rows (from `$source`, a `VALUES` or a `SELECT`
/// of owner, day, model and the seven counts) into `key_usage_stripes`,
/// in the order of their owner, day and model, adding to the row of the
/// same owner, day, model and [`stripe!`] where there is one.
macro_rules! add_usage {
    ($source:expr) => {
        concat!(
            "INSERT INTO key_usage_stripes (owner, day, model, input_tokens, output_tokens,
                cost_usd, turns, tool_calls, sandbox_cpu_s, sandbox_wall_s, stripe)
             SELECT *, ",
            stripe!(),
            " FROM (",
            $source,
            ") AS added ORDER BY 1, 2, 3
             ON CONFLICT (owner, day, model, stripe) DO UPDATE SET
                input_tokens = key_usage_stripes.input_tokens + excluded.input_tokens,
                output_tokens = key_usage_stripes.output_tokens + excluded.output_tokens,
                cost_usd = key_usage_stripes.cost_usd + excluded.cost_usd,
                turns = key_usage_stripes.turns + excluded.turns,
                tool_calls = key_usage_stripes.tool_calls + excluded.tool_calls,
                sandbox_cpu_s = key_usage_stripes.sandbox_cpu_s + excluded.sandbox_cpu_s,
                sandbox_wall_s = key_usage_stripes.sandbox_wall_s + excluded.sandbox_wall_s"
        )
    };
}

/// Takes the lease `$1` for the holder `$2` until `$3` microseconds from
/// now when it is free, expired or already the holder's (a new holder
/// raises the fence), for each row of `$source` (a `VALUES` or a
/// `SELECT`); a lease held by another is left as it is and not returned.
macro_rules! take_lease {
    ($source:expr) => {
        concat!(
            "INSERT INTO leases (name, holder, expires_at, fence) ",
            $source,
            " ON CONFLICT (name) DO UPDATE SET
                fence = leases.fence + (leases.holder <> excluded.holder)::int,
                holder = excluded.holder,
                expires_at = excluded.expires_at
             WHERE leases.holder = excluded.holder OR leases.expires_at <= now()
             RETURNING name, holder, expires_at, fence"
        )
    };
}

mod batches;
mod bus;
mod checkpoints;
mod conns;
mod events;
mod grouped;
mod kv;
mod leases;
mod quota;
mod sessions;
mod takes;
mod usage;

/// Connections a store opened without a size holds at most (a replica's
/// is `cluster.store_connections`): few enough that several fit in
/// PostgreSQL's default `max_connections` of 100.
const MAX_CONNECTIONS: u32 = 16;
use conns::{ALIVE_WITHOUT_PING, Conns};
/// How long a call waits for a free connection before it fails.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// The schema, one entry per version; a released entry is never edited
/// (the migrator refuses a database whose applied SQL changed).
///
/// Times the caller chooses and reads back exactly (sessions, checkpoints)
/// are RFC 3339 text with nanoseconds in the `C` collation, which sorts
/// them by time; PostgreSQL's `timestamptz` keeps microseconds only. Times
/// the store sets itself (KV writes, leases, bus messages) are
/// `timestamptz`. Keys compare bytewise (`C`), as SQLite's do.
const MIGRATIONS: &[(&str, &str)] = &[
    (
        "sessions, messages and events",
        "CREATE TABLE sessions (
            id UUID PRIMARY KEY,
            ord BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
            name TEXT,
            kind TEXT NOT NULL,
            owner TEXT,
            options JSON NOT NULL,
            status TEXT NOT NULL,
            usage JSON NOT NULL,
            ephemeral BOOLEAN NOT NULL,
            created_at TEXT COLLATE \"C\" NOT NULL,
            updated_at TEXT COLLATE \"C\" NOT NULL
        );
        CREATE INDEX sessions_by_owner ON sessions (owner, created_at, ord);
        CREATE INDEX sessions_by_created ON sessions (created_at, ord);
        CREATE INDEX sessions_by_status ON sessions (status);
        CREATE INDEX sessions_ephemeral ON sessions (ephemeral, status, updated_at);
        CREATE TABLE messages (
            session_id UUID NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
            idx INTEGER NOT NULL,
            body JSON NOT NULL,
            PRIMARY KEY (session_id, idx)
        );
        CREATE TABLE events (
            session_id UUID NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
            seq BIGINT NOT NULL,
            type TEXT NOT NULL,
            ts TIMESTAMPTZ NOT NULL,
            body JSON NOT NULL,
            PRIMARY KEY (session_id, seq)
        );",
    ),
    (
        "kv and checkpoints",
        "CREATE TABLE kv (
            namespace TEXT COLLATE \"C\" NOT NULL,
            key TEXT COLLATE \"C\" NOT NULL,
            value BYTEA NOT NULL,
            revision BIGINT NOT NULL,
            updated_at TIMESTAMPTZ NOT NULL,
            PRIMARY KEY (namespace, key)
        );
        CREATE TABLE kv_revisions (
            namespace TEXT COLLATE \"C\" PRIMARY KEY,
            revision BIGINT NOT NULL
        );
        CREATE TABLE checkpoints (
            session_id UUID NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
            step BIGINT NOT NULL,
            name TEXT NOT NULL,
            state JSON NOT NULL,
            created_at TEXT COLLATE \"C\" NOT NULL,
            PRIMARY KEY (session_id, step)
        );",
    ),
    (
        "bus retention",
        // An identity is never handed out twice, even after a prune, so a
        // reader's cursor holds.
        "CREATE TABLE bus_messages (
            position BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            namespace TEXT NOT NULL,
            stream TEXT NOT NULL,
            subject TEXT NOT NULL,
            seq BIGINT NOT NULL,
            time TIMESTAMPTZ NOT NULL,
            payload BYTEA NOT NULL,
            UNIQUE (namespace, stream, seq)
        );
        CREATE INDEX bus_by_namespace ON bus_messages (namespace, position);
        CREATE INDEX bus_by_time ON bus_messages (namespace, time);
        CREATE TABLE bus_streams (
            namespace TEXT NOT NULL,
            stream TEXT NOT NULL,
            last_seq BIGINT NOT NULL,
            PRIMARY KEY (namespace, stream)
        );",
    ),
    (
        "leases",
        "CREATE TABLE leases (
            name TEXT COLLATE \"C\" PRIMARY KEY,
            holder TEXT NOT NULL,
            expires_at TIMESTAMPTZ NOT NULL,
            fence BIGINT NOT NULL
        );
        CREATE INDEX leases_by_expiry ON leases (expires_at);",
    ),
    (
        "quotas",
        // A row per sandbox or turn held, renewed by its replica so that a
        // dead one's expire; a counter per key and minute.
        "CREATE TABLE quota_slots (
            pool TEXT COLLATE \"C\" NOT NULL,
            holder TEXT NOT NULL,
            replica TEXT NOT NULL,
            expires_at TIMESTAMPTZ NOT NULL,
            PRIMARY KEY (pool, holder)
        );
        CREATE INDEX quota_slots_by_replica ON quota_slots (replica);
        CREATE TABLE quota_windows (
            name TEXT COLLATE \"C\" PRIMARY KEY,
            started BIGINT NOT NULL,
            count BIGINT NOT NULL
        );",
    ),
    (
        "usage per key",
        // Days are `YYYY-MM-DD` text in the `C` collation, as in SQLite.
        "CREATE TABLE key_usage (
            owner TEXT COLLATE \"C\" NOT NULL,
            day TEXT COLLATE \"C\" NOT NULL,
            model TEXT COLLATE \"C\" NOT NULL,
            input_tokens BIGINT NOT NULL,
            output_tokens BIGINT NOT NULL,
            cost_usd DOUBLE PRECISION NOT NULL,
            turns BIGINT NOT NULL,
            tool_calls BIGINT NOT NULL,
            sandbox_cpu_s DOUBLE PRECISION NOT NULL,
            sandbox_wall_s DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (owner, day, model)
        );
        CREATE INDEX key_usage_by_day ON key_usage (day);",
    ),
    (
        "the next message index on the session",
        // Appending takes the session's row and its next index in one
        // statement, where it took a transaction of four round trips.
        "ALTER TABLE sessions ADD COLUMN next_message BIGINT NOT NULL DEFAULT 0;
        UPDATE sessions SET next_message = m.next
            FROM (SELECT session_id, MAX(idx) + 1 AS next FROM messages GROUP BY session_id) AS m
            WHERE sessions.id = m.session_id;",
    ),
    (
        "the last seq on the session",
        // Kept by every batch: a replica taking a turn reads it with the
        // session's row, locked, so that it sees the batch that freed the
        // lease (a `MAX(seq)` in the same statement would read the
        // statement's older snapshot).
        "ALTER TABLE sessions ADD COLUMN last_seq BIGINT NOT NULL DEFAULT 0;
        UPDATE sessions SET last_seq = e.last
            FROM (SELECT session_id, MAX(seq) AS last FROM events GROUP BY session_id) AS e
            WHERE sessions.id = e.session_id;",
    ),
    (
        "the history's cuts on the session",
        // Raised by every rewind: a replica whose copy of the conversation
        // predates a cut made elsewhere reads the conversation again.
        "ALTER TABLE sessions ADD COLUMN history_cuts BIGINT NOT NULL DEFAULT 0;",
    ),
    (
        "KV writes in one round trip",
        // The transaction a KV write was (lock the namespace's counter,
        // read the key, compare, count, write: five round trips) as one
        // function. Each of its statements takes a new snapshot, so the
        // read after the lock sees what the writer before committed, as
        // in the transaction. `expected`: NULL writes unconditionally, 0
        // wants the key absent, n wants it at revision n. A refused write
        // answers `done` false and the key's revision, and counts nothing.
        "CREATE FUNCTION kv_put(ns TEXT, k TEXT, v BYTEA, expected BIGINT, at TIMESTAMPTZ,
                OUT done BOOLEAN, OUT rev BIGINT)
            LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO kv_revisions AS r (namespace, revision) VALUES (ns, 0)
                    ON CONFLICT (namespace) DO UPDATE SET revision = r.revision;
                SELECT kv.revision INTO rev FROM kv WHERE kv.namespace = ns AND kv.key = k;
                IF expected IS NOT NULL AND rev IS DISTINCT FROM NULLIF(expected, 0) THEN
                    done := false;
                    RETURN;
                END IF;
                UPDATE kv_revisions AS r SET revision = r.revision + 1
                    WHERE r.namespace = ns RETURNING r.revision INTO rev;
                INSERT INTO kv AS e (namespace, key, value, revision, updated_at)
                    VALUES (ns, k, v, rev, at)
                    ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,
                        revision = excluded.revision, updated_at = excluded.updated_at;
                done := true;
            END $$;
        CREATE FUNCTION kv_delete(ns TEXT, k TEXT, expected BIGINT,
                OUT done BOOLEAN, OUT rev BIGINT)
            LANGUAGE plpgsql AS $$
            DECLARE
                counted BIGINT;
            BEGIN
                INSERT INTO kv_revisions AS r (namespace, revision) VALUES (ns, 0)
                    ON CONFLICT (namespace) DO UPDATE SET revision = r.revision
                    RETURNING r.revision INTO counted;
                SELECT kv.revision INTO rev FROM kv WHERE kv.namespace = ns AND kv.key = k;
                IF expected IS NOT NULL AND (rev IS NULL OR rev <> expected) THEN
                    done := false;
                    RETURN;
                END IF;
                done := true;
                IF rev IS NULL THEN
                    rev := counted;
                    RETURN;
                END IF;
                UPDATE kv_revisions AS r SET revision = r.revision + 1
                    WHERE r.namespace = ns RETURNING r.revision INTO rev;
                DELETE FROM kv WHERE kv.namespace = ns AND kv.key = k;
            END $$;",
    ),
    (
        "the ephemeral sessions' index on their creation",
        // Every batch of a turn writes its session's `updated_at`. While an
        // index covered it, each of those writes put a new entry in every
        // index of the table (six), where an update that changes no
        // indexed column is a heap-only (HOT) one and adds none. The
        // retention finds the expired among the ephemeral sessions made
        // before its cutoff: an ephemeral session is made by its one turn.
        "DROP INDEX sessions_ephemeral;
        CREATE INDEX sessions_ephemeral ON sessions (created_at) WHERE ephemeral;",
    ),
    (
        "usage added to stripes by connection",
        // Every turn's last batch adds to its key's usage of the day and
        // model. With one row for that, the turns of one key (every turn,
        // without keys) waited in line for its lock, each until the one
        // before had committed, on every replica: on 16 cores, most of
        // the busy backends of a busy store waited there. Each connection
        // now adds to the row of its stripe (see `stripe!`), in a table of
        // its own, so that replicas of the version before, still running
        // during an upgrade, keep adding to `key_usage` as they did; the
        // view is what every read sums.
        "CREATE TABLE key_usage_stripes (LIKE key_usage);
        ALTER TABLE key_usage_stripes ADD COLUMN stripe SMALLINT NOT NULL,
            ADD PRIMARY KEY (owner, day, model, stripe);
        CREATE INDEX key_usage_stripes_by_day ON key_usage_stripes (day);
        CREATE VIEW key_usage_rows AS
            SELECT owner, day, model, (-1)::smallint AS stripe, input_tokens, output_tokens,
                cost_usd, turns, tool_calls, sandbox_cpu_s, sandbox_wall_s
            FROM key_usage
            UNION ALL
            SELECT owner, day, model, stripe, input_tokens, output_tokens,
                cost_usd, turns, tool_calls, sandbox_cpu_s, sandbox_wall_s
            FROM key_usage_stripes;",
    ),
    (
        "event bytes per session",
        // The bytes of a session's events, counted in its key's
        // `storage_mb` without reading its log: each batch adds to them in
        // the statement that already updates the session's row (no
        // index reads the column, so the update stays heap-only).
        "ALTER TABLE sessions ADD COLUMN event_bytes BIGINT NOT NULL DEFAULT 0;
        UPDATE sessions s SET event_bytes = e.bytes
            FROM (SELECT session_id, sum(octet_length(body::text)) AS bytes
                  FROM events GROUP BY session_id) e
            WHERE s.id = e.session_id;",
    ),
    (
        "origin and metadata of sessions",
        // The protocol adapter that made a session (NULL: none) and a
        // client's own labels on it.
        "ALTER TABLE sessions ADD COLUMN origin TEXT;
        ALTER TABLE sessions ADD COLUMN metadata JSON NOT NULL DEFAULT '{}';",
    ),
];

fn migrator() -> Migrator {
    Migrator::with_migrations(
        (1..)
            .zip(MIGRATIONS)
            .map(|(version, (description, sql))| {
                Migration::new(
                    version,
                    Cow::Borrowed(*description),
                    MigrationType::Simple,
                    SqlSafeStr::into_sql_str(*sql),
                    false,
                )
            })
            .collect(),
    )
}

/// The PostgreSQL [`Store`].
pub struct PostgresStore {
    pool: Conns,
    /// Log batches waiting to be written with others.
    batches: grouped::Queue<events::Encoded>,
    /// Turn takes waiting to be done with others.
    takes: grouped::Queue<takes::Take>,
}

impl PostgresStore {
    /// Connects to the database at `url` (`postgres://user:password@host/db`)
    /// and migrates it to the current schema.
    pub async fn open(url: &str) -> Result<PostgresStore, StoreError> {
        PostgresStore::open_sized(url, MAX_CONNECTIONS).await
    }

    /// [`PostgresStore::open`] holding at most `connections` connections.
    pub async fn open_sized(url: &str, connections: u32) -> Result<PostgresStore, StoreError> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|err| StoreError::Io(format!("{}: {err}", redact(url))))?;
        PostgresStore::connect(options, connections).await
    }

    /// [`PostgresStore::open`] with the connection already described.
    pub async fn open_with(options: PgConnectOptions) -> Result<PostgresStore, StoreError> {
        PostgresStore::connect(options, MAX_CONNECTIONS).await
    }

    async fn connect(
        options: PgConnectOptions,
        connections: u32,
    ) -> Result<PostgresStore, StoreError> {
        let options = options.application_name("conclave");
        // One connection first: a pool that cannot connect says only that
        // it timed out, this says why.
        let probe = tokio::time::timeout(ACQUIRE_TIMEOUT, PgConnection::connect_with(&options))
            .await
            .map_err(|_| StoreError::Io(format!("no answer in {ACQUIRE_TIMEOUT:?}")))??;
        probe.close().await?;
        let pool = PgPoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            // sqlx pings every idle connection before handing it out by
            // default: a round trip before each statement.
            .test_before_acquire(false)
            .before_acquire(|connection, meta| {
                Box::pin(async move {
                    if meta.idle_for >= ALIVE_WITHOUT_PING {
                        connection.ping().await?;
                    }
                    Ok(true)
                })
            })
            .connect_lazy_with(options);
        migrator()
            .run(&pool)
            .await
            .map_err(|err| StoreError::Io(format!("migrating the schema: {err}")))?;
        Ok(PostgresStore {
            pool: Conns::new(pool),
            batches: grouped::Queue::new(connections),
            takes: grouped::Queue::new(connections),
        })
    }
}

/// `url` with its password, if any, replaced by `***`: fit for logs and
/// error messages.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let Some((credentials, host)) = authority.rsplit_once('@') else {
        return url.to_owned();
    };
    match credentials.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}{path}"),
        None => url.to_owned(),
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> StoreError {
        let unreachable = match &err {
            sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Tls(_) => true,
            // Class 08 (connection exception), and the server shutting
            // down or starting (57P01, 57P02, 57P03).
            err => sql_state(err)
                .is_some_and(|state| state.starts_with("08") || state.starts_with("57P0")),
        };
        match err {
            sqlx::Error::PoolClosed => StoreError::Closed,
            err if unreachable => StoreError::Unavailable(err.to_string()),
            err => StoreError::Io(err.to_string()),
        }
    }
}

/// A count or position as PostgreSQL's `BIGINT` holds it; past its range
/// means "everything", as it does for the bounds the callers pass.
fn bigint(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A `BIGINT` read back as the unsigned value it was written from.
fn unsigned(what: &str, value: i64) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("{what}: {value}")))
}

/// The SQLSTATE of a database error, if `err` is one.
fn sql_state(err: &sqlx::Error) -> Option<String> {
    match err {
        sqlx::Error::Database(db) => db.code().map(Cow::into_owned),
        _ => None,
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Waits for the calls under way, closes every connection; every call
    /// after it, `close` included, fails with [`StoreError::Closed`].
    async fn close(&self) -> Result<(), StoreError> {
        if self.pool.is_closed() {
            return Err(StoreError::Closed);
        }
        self.pool.close().await;
        Ok(())
    }

    async fn session_at_end(
        &self,
        id: uuid::Uuid,
    ) -> Result<Option<crate::store::SessionEnd>, StoreError> {
        sessions::session_at_end(self, id).await
    }

    async fn take_turn(
        &self,
        session: uuid::Uuid,
        lease: (&str, &str),
        ttl: std::time::Duration,
    ) -> Result<crate::store::TurnLease, StoreError> {
        takes::take_turn(self, session, lease, ttl).await
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redact_hides_only_the_password() {
        assert_eq!(
            redact("postgres://conclave:s3cret@db:5432/conclave?sslmode=require"),
            "postgres://conclave:***@db:5432/conclave?sslmode=require"
        );
        assert_eq!(
            redact("postgres://conclave@db/conclave"),
            "postgres://conclave@db/conclave"
        );
        assert_eq!(redact("postgres://db/x"), "postgres://db/x");
        assert_eq!(redact("postgres://u:p@ss@db/x"), "postgres://u:***@db/x");
    }
}
