//! `conclave sim` replicas for gateway tests.

use std::process::Stdio;

use conclave::gateway::ReplicaConfig;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A `conclave sim` child process, killed when dropped.
pub struct Sim {
    pub child: Child,
    /// Base URL with `/v1`.
    pub url: String,
    pub id: String,
}

impl Sim {
    pub async fn start(id: &str, extra: &[&str]) -> Sim {
        let mut child = Command::new(env!("CARGO_BIN_EXE_conclave"))
            .args(["sim", "--listen", "127.0.0.1:0", "--id", id])
            .args(extra)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("conclave sim starts");
        let stdout = child.stdout.take().expect("stdout");
        let line = BufReader::new(stdout)
            .lines()
            .next_line()
            .await
            .expect("read")
            .expect("the sim says where it listens");
        let base = line
            .strip_prefix("conclave sim listening on ")
            .expect("listening line")
            .to_string();
        Sim {
            child,
            url: format!("{base}/v1"),
            id: id.to_string(),
        }
    }

    pub fn replica(&self) -> ReplicaConfig {
        ReplicaConfig {
            id: Some(self.id.clone()),
            url: self.url.clone(),
            model: None,
            api_key: None,
        }
    }

    /// `GET /sim/stats`.
    pub async fn stats(&self) -> Value {
        let base = self.url.trim_end_matches("/v1");
        reqwest::get(format!("{base}/sim/stats"))
            .await
            .expect("the sim answers")
            .json()
            .await
            .expect("stats are JSON")
    }

    pub async fn configure(&self, patch: Value) {
        let base = self.url.trim_end_matches("/v1");
        let response = reqwest::Client::new()
            .post(format!("{base}/sim/config"))
            .json(&patch)
            .send()
            .await
            .expect("sim config");
        assert!(response.status().is_success());
    }
}

/// Gateway pools of one sim each: `(name, sim)`; failures are not retried.
pub fn pools(config: &mut conclave::config::Config, sims: &[(&str, &Sim)]) {
    config.gateway = conclave::gateway::GatewayConfig {
        pools: sims
            .iter()
            .map(|(name, sim)| {
                (
                    name.to_string(),
                    conclave::gateway::PoolConfig {
                        replicas: vec![sim.replica()],
                        num_retries: 0,
                        ..conclave::gateway::PoolConfig::default()
                    },
                )
            })
            .collect(),
        ..conclave::gateway::GatewayConfig::default()
    };
}
