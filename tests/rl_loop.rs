//! An RL training loop end to end with real clients: the example's
//! trainer and dispatcher (`examples/rl_loop/`, Python with grpcio and
//! stubs generated from `proto/bus.proto` at run time) against a server
//! with three `conclave sim` replicas. Three iterations of 64 prompts: the
//! trainer receives every result with token ids, each under the version it
//! committed, and a call it sends while the pool is paused waits and
//! completes after the commit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::TestServer;
use common::sim::Sim;
use conclave::gateway::{GatewayConfig, PoolConfig};
use serde_json::Value;
use tokio::process::Command;

const KEY: &str = "trainer-admin-key";

fn python() -> String {
    std::env::var("CONCLAVE_TEST_PYTHON").expect(
        "CONCLAVE_TEST_PYTHON must name a python with grpcio and grpcio-tools (scripts/test.sh sets it)",
    )
}

fn example(script: &str, server: &TestServer) -> Command {
    let mut command = Command::new(python());
    command
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/rl_loop"))
        .arg(script)
        .args(["--url", &server.url(""), "--key", KEY, "--model", "policy"])
        .args(["--iterations", "3", "--prompts", "64"])
        .kill_on_drop(true);
    command
}

#[tokio::test]
async fn the_seed_training_loop_runs_over_the_bus_with_real_grpc_clients() {
    let sims = [
        Sim::start("r1", &[]).await,
        Sim::start("r2", &[]).await,
        Sim::start("r3", &[]).await,
    ];
    let server = TestServer::start_with(|config| {
        config.api_keys = vec![KEY.into()];
        config.admin_keys = vec![KEY.into()];
        config.gateway = GatewayConfig {
            pools: [(
                "policy".to_string(),
                PoolConfig {
                    replicas: sims.iter().map(Sim::replica).collect(),
                    ..PoolConfig::default()
                },
            )]
            .into(),
            ..GatewayConfig::default()
        };
    })
    .await;
    let dispatcher = example("dispatcher.py", &server).output();
    let trainer = example("trainer.py", &server).output();
    let (dispatcher, trainer) = tokio::time::timeout(Duration::from_secs(300), async {
        tokio::join!(dispatcher, trainer)
    })
    .await
    .expect("the loop ends within 5 minutes");
    let (dispatcher, trainer) = (dispatcher.unwrap(), trainer.unwrap());
    let stderr = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        dispatcher.status.success(),
        "dispatcher: {}",
        stderr(&dispatcher)
    );
    assert!(
        trainer.status.success(),
        "trainer: {}\n{}",
        stderr(&trainer),
        String::from_utf8_lossy(&trainer.stdout)
    );
    let summary: Value = serde_json::from_slice(&trainer.stdout).unwrap();
    assert_eq!(summary["ok"], true, "{summary}");
    let iterations = summary["iterations"].as_array().unwrap();
    assert_eq!(iterations.len(), 3);
    for (i, iteration) in iterations.iter().enumerate() {
        let version = i as u64 + 1;
        assert_eq!(iteration["results"], 64, "{iteration}");
        assert_eq!(iteration["with_token_ids"], 64, "{iteration}");
        assert_eq!(
            iteration["weights_versions"],
            serde_json::json!([version]),
            "{iteration}"
        );
        assert_eq!(iteration["completed"]["count"], 64);
        assert_eq!(
            iteration["replicas"].as_array().unwrap().len(),
            3,
            "{iteration}"
        );
    }
    server.stop().await;
}
