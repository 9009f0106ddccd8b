//! What a deployment's backends did over a measure (issue 42): the
//! PostgreSQL statements its replicas ran and the WAL they wrote (from
//! `pg_stat_statements`, reset for the deployment's database before the
//! measure), the messages its nats-server took in and sent out (its
//! monitoring endpoint's `/varz`), and the CPU time of every PostgreSQL
//! process on the machine (`/proc`).
//!
//! sqlx sends each statement with its own Sync, so the statements are also
//! the round trips (`BEGIN` and `COMMIT` included; preparing a statement a
//! connection has not seen costs one more, once per connection; so does
//! the ping of a connection idle for 500 ms or more, which no counter
//! sees. sqlx also pinged every connection before handing it out, and
//! again when it went back to the pool after each statement: until the
//! store stopped the first (`19948bc`) and kept its connections out of
//! the pool between statements (`store/postgres/conns.rs`), the real
//! round trips were up to three times the statements).

use std::time::Duration;

use serde_json::Value;
use sqlx::{Connection, PgConnection, Row};

/// The counters read at one moment.
pub struct Counters {
    statements: u64,
    brackets: u64,
    /// Bytes of WAL the statements wrote: what PostgreSQL has to write,
    /// flush and (with replicas of its own) ship for them.
    wal_bytes: u64,
    nats_in: u64,
    nats_out: u64,
    postgres_cpu: PostgresCpu,
}

/// CPU time of PostgreSQL's processes: the backends serving client
/// connections (the replicas' and the bench's), and its own (postmaster,
/// WAL writer, checkpointer, background writer, autovacuum), with how many
/// backends there were when read.
#[derive(Default, Clone, Copy)]
struct PostgresCpu {
    backends: Duration,
    own: Duration,
    connections: usize,
}

impl Counters {
    pub fn statements(&self) -> u64 {
        self.statements
    }

    pub fn wal_bytes(&self) -> u64 {
        self.wal_bytes
    }

    /// Messages in and out of nats-server.
    pub fn nats_messages(&self) -> u64 {
        self.nats_in + self.nats_out
    }
}

/// Reads a deployment's counters: its database (`None` when embedded) and
/// its nats-server's monitoring URL.
pub struct Backends {
    database: Option<PgConnection>,
    nats_monitor: Option<String>,
}

/// Only the deployment's database, and not the bench's own reads.
const OURS: &str = "dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                    AND query NOT LIKE '%pg_stat_statements%'";

impl Backends {
    pub async fn connect(
        database_url: Option<&str>,
        nats_monitor: Option<String>,
    ) -> Result<Self, String> {
        let database = match database_url {
            None => None,
            Some(url) => {
                let mut connection = PgConnection::connect(url)
                    .await
                    .map_err(|e| format!("cannot connect to {url}: {e}"))?;
                sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                    .execute(&mut connection)
                    .await
                    .map_err(|e| {
                        format!(
                            "pg_stat_statements: {e} (start PostgreSQL with \
                             shared_preload_libraries = pg_stat_statements, as scripts/lib.sh does)"
                        )
                    })?;
                Some(connection)
            }
        };
        Ok(Backends {
            database,
            nats_monitor,
        })
    }

    /// Forgets the statements run so far in the deployment's database.
    pub async fn reset(&mut self) -> Result<(), String> {
        if let Some(connection) = &mut self.database {
            sqlx::query(
                "SELECT pg_stat_statements_reset(0, \
                 (SELECT oid FROM pg_database WHERE datname = current_database()), 0)",
            )
            .execute(connection)
            .await
            .map_err(|e| format!("pg_stat_statements_reset: {e}"))?;
        }
        Ok(())
    }

    pub async fn read(&mut self) -> Result<Counters, String> {
        let (mut statements, mut brackets, mut wal_bytes) = (0, 0, 0);
        if let Some(connection) = &mut self.database {
            let row = sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT coalesce(sum(calls), 0)::int8, \
                 coalesce(sum(calls) FILTER (WHERE query IN ('BEGIN', 'COMMIT', 'ROLLBACK')), 0)::int8, \
                 coalesce(sum(wal_bytes), 0)::int8 \
                 FROM pg_stat_statements WHERE {OURS}"
            )))
            .fetch_one(connection)
            .await
            .map_err(|e| format!("reading pg_stat_statements: {e}"))?;
            statements = row.get::<i64, _>(0) as u64;
            brackets = row.get::<i64, _>(1) as u64;
            wal_bytes = row.get::<i64, _>(2) as u64;
        }
        let (mut nats_in, mut nats_out) = (0, 0);
        if let Some(monitor) = &self.nats_monitor {
            let varz: Value = reqwest::get(format!("{monitor}/varz"))
                .await
                .and_then(reqwest::Response::error_for_status)
                .map_err(|e| format!("{monitor}/varz: {e}"))?
                .json()
                .await
                .map_err(|e| format!("{monitor}/varz: {e}"))?;
            nats_in = varz["in_msgs"].as_u64().unwrap_or(0);
            nats_out = varz["out_msgs"].as_u64().unwrap_or(0);
        }
        Ok(Counters {
            statements,
            brackets,
            wal_bytes,
            nats_in,
            nats_out,
            postgres_cpu: postgres_cpu(),
        })
    }

    /// The statements run most often since the reset, per turn.
    pub async fn top_statements(&mut self, turns: f64) -> Result<Vec<String>, String> {
        let Some(connection) = &mut self.database else {
            return Ok(Vec::new());
        };
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT calls, regexp_replace(query, '\\s+', ' ', 'g') FROM pg_stat_statements \
             WHERE {OURS} ORDER BY calls DESC LIMIT 15"
        )))
        .fetch_all(connection)
        .await
        .map_err(|e| format!("reading pg_stat_statements: {e}"))?;
        Ok(rows
            .iter()
            .map(|row| {
                let query: String = row.get(1);
                let shown: String = query.chars().take(110).collect();
                format!("{:>6.2}  {shown}", row.get::<i64, _>(0) as f64 / turns)
            })
            .collect())
    }
}

/// Prints what happened between `before` and `after`, per turn.
pub fn print_per_turn(before: &Counters, after: &Counters, turns: f64) -> Duration {
    let per = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / turns;
    let (a, b) = (&after.postgres_cpu, &before.postgres_cpu);
    let backends = a.backends.saturating_sub(b.backends);
    let own = a.own.saturating_sub(b.own);
    let micros = |d: Duration| d.as_secs_f64() * 1e6 / turns;
    println!(
        "  per turn     PostgreSQL {:.2} statements = round trips ({:.2} of them BEGIN/COMMIT), \
         {:.0} bytes of WAL, {:.0} µs CPU ({:.0} µs in the backends of {} connections, {:.0} µs in its own \
         processes); NATS {:.2} messages in, {:.2} out",
        per(before.statements, after.statements),
        per(before.brackets, after.brackets),
        per(before.wal_bytes, after.wal_bytes),
        micros(backends + own),
        micros(backends),
        a.connections,
        micros(own),
        per(before.nats_in, after.nats_in),
        per(before.nats_out, after.nats_out),
    );
    backends + own
}

/// User plus system CPU time of every process named `postgres`, split by
/// its title: a backend's names its client's address (`127.0.0.1(port)`
/// or `[local]`).
fn postgres_cpu() -> PostgresCpu {
    let mut cpu = PostgresCpu::default();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return cpu;
    };
    for entry in entries.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if !head.ends_with("(postgres") {
            continue;
        }
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = fields
            .get(11..13)
            .map_or(0, |f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum());
        let time = Duration::from_millis(ticks * 10);
        let title = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let title = String::from_utf8_lossy(&title);
        if (title.starts_with("postgres: ") && title.contains('(')) || title.contains("[local]") {
            cpu.backends += time;
            cpu.connections += 1;
        } else {
            cpu.own += time;
        }
    }
    cpu
}
