//! `[pipelines]` in the configuration.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PipelineConfig {
    /// Nodes are mock agents that route deterministically, for tests and
    /// demos; no model is called.
    pub test_mode: bool,
    /// Runs at once; the others queue (their status says so).
    pub max_concurrent_pipelines: usize,
    /// Runs of one API key at once, of `max_concurrent_pipelines`: a key
    /// whose runs wait (for approvals, a slow model) leaves the other
    /// places to other keys. Half of them when unset.
    pub max_concurrent_per_key: Option<usize>,
    /// A run's wall-clock limit.
    pub pipeline_timeout_s: u64,
    /// A node whose answer cannot be used runs again this many times.
    pub node_retries: u32,
    /// Counter limits of the built-in connector pipeline, by setting name
    /// (`max_test_retries`, `max_gen_fix_retries`, `max_review_retries`,
    /// `max_research_retries`); [`counter_of`] maps each to its counter.
    pub limits: BTreeMap<String, u32>,
    /// A directory of pipeline definitions (`*.yaml`, `*.yml`), loaded at
    /// start besides the built-in `connector`; relative to the config file.
    pub dir: Option<std::path::PathBuf>,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            test_mode: false,
            max_concurrent_pipelines: 10,
            max_concurrent_per_key: None,
            pipeline_timeout_s: 1200,
            node_retries: 2,
            limits: BTreeMap::new(),
            dir: None,
        }
    }
}

impl PipelineConfig {
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.max_concurrent_pipelines == 0 {
            return Err((
                "pipelines.max_concurrent_pipelines".into(),
                "must be at least 1".into(),
            ));
        }
        if let Some(per_key) = self.max_concurrent_per_key
            && !(1..=self.max_concurrent_pipelines).contains(&per_key)
        {
            return Err((
                "pipelines.max_concurrent_per_key".into(),
                format!(
                    "must be between 1 and max_concurrent_pipelines ({})",
                    self.max_concurrent_pipelines
                ),
            ));
        }
        if self.pipeline_timeout_s == 0 {
            return Err((
                "pipelines.pipeline_timeout_s".into(),
                "must be at least 1".into(),
            ));
        }
        for key in self.limits.keys() {
            if counter_of(key).is_none() {
                return Err((
                    format!("pipelines.limits.{key}"),
                    "known limits: max_test_retries, max_gen_fix_retries, max_review_retries, max_research_retries".into(),
                ));
            }
        }
        Ok(())
    }
}

impl PipelineConfig {
    /// A key's share of the runs at once.
    pub fn max_concurrent_per_key(&self) -> usize {
        self.max_concurrent_per_key
            .unwrap_or(self.max_concurrent_pipelines.div_ceil(2))
    }
}

/// The connector's counter a limit setting names (`max_test_retries` →
/// `test_retries`); `None` for an unknown setting.
pub fn counter_of(setting: &str) -> Option<&'static str> {
    Some(match setting {
        "max_test_retries" => "test_retries",
        "max_gen_fix_retries" => "gen_fix_retries",
        "max_review_retries" => "review_retries",
        "max_research_retries" => "research_retries",
        _ => return None,
    })
}
