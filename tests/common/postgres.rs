//! Databases of a test's own on the test PostgreSQL server.

use sqlx::Connection;

/// A fresh database on `CONCLAVE_TEST_POSTGRES`, as a URL.
pub async fn database() -> String {
    let server = std::env::var("CONCLAVE_TEST_POSTGRES").unwrap_or_else(|_| {
        panic!(
            "CONCLAVE_TEST_POSTGRES is not set: this test needs a PostgreSQL server to make \
             databases in (scripts/test.sh starts one and sets it)"
        )
    });
    let name = format!("conclave_test_{}", uuid::Uuid::new_v4().simple());
    let mut admin = sqlx::PgConnection::connect(&server).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .unwrap();
    let mut url = url::Url::parse(&server).unwrap();
    url.set_path(&name);
    url.to_string()
}
