//! `conclave sim` replicas for gateway tests.

use std::process::Stdio;

use conclave::gateway::{GatewayConfig, HealthConfig, PoolConfig, ReplicaConfig, Strategy};

use super::TestServer;
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

/// A pool of `sims` on `strategy`, with health checks every 100 ms and
/// cooldowns of 1 s, so that tests see replicas leave and come back soon.
pub fn checked_pool(strategy: Strategy, sims: &[&Sim]) -> PoolConfig {
    PoolConfig {
        strategy,
        cooldown_s: 1,
        health: HealthConfig {
            interval_ms: 100,
            timeout_ms: 500,
            failure_threshold: 2,
            success_threshold: 2,
            ..HealthConfig::default()
        },
        replicas: sims.iter().map(|s| s.replica()).collect(),
        ..PoolConfig::default()
    }
}

/// A test server with these pools (and replicas on loopback allowed to be
/// added at run time).
pub async fn gateway(pools: Vec<(&str, PoolConfig)>) -> TestServer {
    gateway_with(pools, |_| {}).await
}

/// [`gateway`], with the rest of the config set by `configure`.
pub async fn gateway_with(
    pools: Vec<(&str, PoolConfig)>,
    configure: impl FnOnce(&mut conclave::config::Config),
) -> TestServer {
    TestServer::start_with(move |config| {
        config.gateway = GatewayConfig {
            pools: pools
                .into_iter()
                .map(|(name, pool)| (name.to_string(), pool))
                .collect(),
            // The sim replicas added at run time listen on loopback.
            allowed_upstreams: Some(vec!["127.0.0.0/8".into()]),
            ..GatewayConfig::default()
        };
        configure(config);
    })
    .await
}

/// Runs `tests/gateway/{script}` (an OpenAI SDK client) with the
/// gateway's `/v1` base URL, its `/meta/{slug}/v1` one (the slug holds
/// `session_id`) and `args`; returns the JSON it printed, or fails with
/// its output.
pub async fn sdk_script(
    server: &TestServer,
    script: &str,
    session_id: &str,
    args: &[&str],
) -> Value {
    let python = std::env::var("CONCLAVE_TEST_PYTHON").expect(
        "CONCLAVE_TEST_PYTHON must name a python with the openai package (scripts/test.sh sets it)",
    );
    let metadata = serde_json::json!({ "session_id": session_id });
    let slug = conclave::gateway::slug::encode(metadata.as_object().expect("an object"));
    let script = format!("{}/tests/gateway/{script}", env!("CARGO_MANIFEST_DIR"));
    let output = Command::new(python)
        .arg(script)
        .arg(server.url("/v1"))
        .arg(server.url(&format!("/meta/{slug}/v1")))
        .args(args)
        .output()
        .await
        .expect("python runs");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the script prints JSON")
}
