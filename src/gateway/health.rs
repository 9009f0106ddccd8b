//! Health checks: each pool's replicas probed on its interval, taken out
//! after `failure_threshold` failures and back after `success_threshold`
//! passes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::header::AUTHORIZATION;
use tokio_util::sync::CancellationToken;

use super::Gateway;
use super::pool::Pool;

impl Gateway {
    /// Checks every replica of every pool with health checks enabled, one
    /// round; the health task calls it on each pool's interval.
    async fn check(&self, pool: &Pool) {
        let health = &pool.config.health;
        let replicas = pool.replicas();
        let checks = replicas.iter().cloned().map(|replica| {
            let url = format!("{}{}", replica.url, health.path);
            let mut request = self.clients.reqwest_for(&replica).get(&url).timeout(Duration::from_millis(health.timeout_ms));
            if let Some(key) = &replica.api_key {
                request = request.header(AUTHORIZATION, format!("Bearer {key}"));
            }
            async move {
                let passed = matches!(request.send().await, Ok(r) if r.status().is_success());
                if let Some(healthy) = replica.record_check(passed, health.failure_threshold, health.success_threshold) {
                    if healthy {
                        tracing::info!(pool = %pool.name, replica = %replica.id, "replica healthy again");
                    } else {
                        tracing::warn!(pool = %pool.name, replica = %replica.id, url, "replica unhealthy; taken out");
                    }
                }
            }
        });
        futures::future::join_all(checks).await;
        pool.remove_drained();
    }

    /// Runs the health checks of every pool until `stop`.
    pub async fn run_health_checks(self: Arc<Self>, stop: CancellationToken) {
        let mut next_due: BTreeMap<String, Instant> = BTreeMap::new();
        // Probes in flight, awaited (cut short by `stop`) before returning.
        let probes = tokio_util::task::TaskTracker::new();
        loop {
            let now = Instant::now();
            let pools = self.pools();
            // A pool removed (or its checks turned off) leaves no deadline
            // behind: a past one would wake this loop at once, for ever.
            next_due.retain(|name, _| {
                pools
                    .iter()
                    .any(|p| &p.name == name && p.config.health.enabled)
            });
            for pool in pools {
                if !pool.config.health.enabled {
                    continue;
                }
                let due = next_due.entry(pool.name.clone()).or_insert(now);
                if *due <= now {
                    *due = now + Duration::from_millis(pool.config.health.interval_ms);
                    let gateway = self.clone();
                    let stop = stop.clone();
                    probes.spawn(async move {
                        tokio::select! {
                            () = gateway.check(&pool) => {}
                            () = stop.cancelled() => {}
                        }
                    });
                }
            }
            let wake = next_due
                .values()
                .min()
                .copied()
                .unwrap_or(now + Duration::from_secs(1));
            // Pools added at run time are seen within a second.
            let wake = wake.min(now + Duration::from_secs(1));
            tokio::select! {
                () = stop.cancelled() => {
                    probes.close();
                    probes.wait().await;
                    return;
                }
                () = tokio::time::sleep_until(wake.into()) => {}
            }
        }
    }
}
