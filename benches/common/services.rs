//! What a deployment shares: a fresh database on the bench's PostgreSQL
//! server and a nats-server of its own.
#![allow(dead_code)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use sqlx::Connection;
use tokio::process::{Child, Command};

pub fn required(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} must be set: CONCLAVE_BENCH_POSTGRES to a PostgreSQL server URL the bench \
             may create databases in, CONCLAVE_BENCH_NATS_SERVER to the nats-server binary"
        )
    })
}

/// A fresh database on the bench's PostgreSQL server, dropped (with its
/// connections) when the deployment is done.
pub struct Database {
    admin: String,
    name: String,
    pub url: String,
}

impl Database {
    pub async fn create() -> Result<Database, String> {
        let admin = required("CONCLAVE_BENCH_POSTGRES");
        let name = format!("conclave_bench_cluster_{}", uuid::Uuid::new_v4().simple());
        Database::execute(&admin, format!("CREATE DATABASE {name}")).await?;
        let mut url = url::Url::parse(&admin).map_err(|e| format!("{admin}: {e}"))?;
        url.set_path(&name);
        Ok(Database {
            admin,
            name,
            url: url.to_string(),
        })
    }

    async fn execute(admin: &str, statement: String) -> Result<(), String> {
        let mut connection = sqlx::PgConnection::connect(admin)
            .await
            .map_err(|e| format!("cannot connect to {admin}: {e}"))?;
        sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
            .execute(&mut connection)
            .await
            .map_err(|e| format!("{statement}: {e}"))?;
        Ok(())
    }

    pub async fn drop_it(self) -> Result<(), String> {
        let statement = format!("DROP DATABASE {} WITH (FORCE)", self.name);
        Database::execute(&self.admin, statement).await
    }
}

/// A nats-server with JetStream of the deployment's own; killed on drop.
pub struct Nats {
    pub child: Child,
    _dir: tempfile::TempDir,
    pub url: String,
    /// Its monitoring endpoint (`/varz`).
    pub monitor: String,
}

impl Nats {
    pub async fn start() -> Result<Nats, String> {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .map_err(|e| format!("cannot make nats-server's directory: {e}"))?;
        let free_port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|listener| listener.local_addr())
                .map(|addr| addr.port())
                .map_err(|e| format!("cannot pick a port: {e}"))
        };
        let (port, monitor) = (free_port()?, free_port()?);
        let binary = required("CONCLAVE_BENCH_NATS_SERVER");
        let child = Command::new(&binary)
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-m"])
            .args([monitor.to_string().as_str(), "-js", "-sd"])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {binary}: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            if Instant::now() > deadline {
                return Err(format!("nats-server did not listen on port {port} in 10 s"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Nats {
            child,
            _dir: dir,
            url: format!("nats://127.0.0.1:{port}"),
            monitor: format!("http://127.0.0.1:{monitor}"),
        })
    }
}
