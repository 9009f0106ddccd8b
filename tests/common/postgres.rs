//! Databases of a test's own on the test PostgreSQL server, so that tests
//! (and bench rounds) run side by side. Shared by the store's unit tests,
//! the integration tests and the benches (included by path where
//! `tests/common` is not a module).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::str::FromStr;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};

/// The server's URL in `CONCLAVE_TEST_POSTGRES`; a panic that says how to
/// get one when it is unset.
pub fn test_server() -> String {
    std::env::var("CONCLAVE_TEST_POSTGRES").unwrap_or_else(|_| {
        panic!(
            "CONCLAVE_TEST_POSTGRES is not set: the PostgreSQL tests need a server \
             (postgres://user@host:port/db); scripts/test.sh starts one and sets it"
        )
    })
}

/// A fresh database on `CONCLAVE_TEST_POSTGRES`, as a URL; it outlives the
/// test (see [`TestDatabase`] for one that is dropped after it).
pub async fn database() -> String {
    TestDatabase::create(&test_server()).await.keep()
}

/// `conclave_test_<uuid>` on the server, dropped with this value (even
/// after a panic) together with whatever connections are left on it.
pub struct TestDatabase {
    server: String,
    name: String,
    /// Whether dropping this value leaves the database in place.
    kept: bool,
}

impl TestDatabase {
    /// Creates the database on the server at `server` (a URL).
    pub async fn create(server: &str) -> TestDatabase {
        let name = format!("conclave_test_{}", uuid::Uuid::new_v4().simple());
        let mut admin = PgConnection::connect(server).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .unwrap();
        admin.close().await.unwrap();
        TestDatabase {
            server: server.to_owned(),
            name,
            kept: false,
        }
    }

    /// The database's URL, leaving the database in place when this value
    /// is dropped.
    pub fn keep(mut self) -> String {
        self.kept = true;
        self.url()
    }

    /// The database's URL: the server's with the database's name.
    pub fn url(&self) -> String {
        let mut url = url::Url::parse(&self.server).unwrap();
        url.set_path(&self.name);
        url.to_string()
    }

    pub fn options(&self) -> PgConnectOptions {
        PgConnectOptions::from_str(&self.server)
            .unwrap()
            .database(&self.name)
    }
}

impl Drop for TestDatabase {
    /// On a thread of its own: the test's runtime may be gone (or
    /// panicking) by now.
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        let (server, name) = (self.server.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let mut admin = PgConnection::connect(&server).await?;
                let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .execute(&mut admin)
                    .await?;
                admin.close().await
            })?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        })
        .join();
        if let Ok(Err(e)) = dropped {
            eprintln!("could not drop test database {}: {e}", self.name);
        }
    }
}
