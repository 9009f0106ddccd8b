//! Replicas as tests/cluster.rs starts them: `conclave serve` processes on
//! local sandboxes, each in a directory of its own, sharing a PostgreSQL
//! database and a nats-server.

use tokio::process::Child;

use super::binary::{serve_command, spawn_server};
use super::nats::NatsServer;
use super::postgres::TestDatabase;

/// One replica: its process, its URL and its working directory.
pub type Replica = (Child, String, tempfile::TempDir);

/// `count` replicas on `database` and `nats`, with no warm sandboxes and
/// `env` set.
pub async fn local_replicas(
    count: usize,
    database: &TestDatabase,
    nats: &NatsServer,
    env: &[(&str, &str)],
) -> Vec<Replica> {
    let mut replicas = Vec::new();
    for _ in 0..count {
        let dir = tempfile::tempdir().unwrap();
        let store = database.url();
        let mut command =
            serve_command(&["--sandbox", "local", "--store", &store, "--bus", &nats.url]);
        command
            .current_dir(dir.path())
            .env("CONCLAVE_SANDBOX__WARM_POOL", "0")
            .envs(env.iter().copied());
        let (child, url) = spawn_server(&mut command).await;
        replicas.push((child, url, dir));
    }
    replicas
}
