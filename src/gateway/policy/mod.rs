//! How a pool picks a replica for a call (after sgl-router's policies):
//! one small file per strategy behind [`Policy`]. The pool has already
//! left out replicas that are not usable, tried, or (when others remain)
//! cooling down; a policy only chooses among the candidates.

mod affinity;
mod least_outstanding;
mod power_of_two;
mod prefix_cache;
mod round_robin;
mod shuffle;

use std::sync::Arc;

pub(super) use affinity::Ring;

use super::json::Object;

use super::pool::Replica;
use crate::config::{PoolConfig, Strategy};

/// What a policy sees of one call.
pub(super) struct Pick<'a> {
    /// Never empty.
    pub candidates: &'a [&'a Arc<Replica>],
    /// The session the call belongs to, if it says.
    pub session: Option<&'a str>,
    /// A counter that grows by one per call to the pool.
    pub turn: usize,
    /// The pool's consistent-hash ring over all its replicas.
    pub ring: &'a Ring,
    /// `affinity_load_factor` of the pool.
    pub load_factor: f64,
    /// The call's body, when the policy reads it (`prefix_cache`).
    pub body: Option<&'a Object>,
    /// `cache_balance_abs` and `cache_balance_rel` of the pool.
    pub balance_abs: u64,
    pub balance_rel: f64,
}

pub(super) trait Policy: Send + Sync {
    fn pick<'a>(&self, pick: &Pick<'a>) -> &'a Arc<Replica>;

    /// Whether it reads the call's body (the others are not given it).
    fn reads_body(&self) -> bool {
        false
    }
}

/// The policy of a pool's strategy.
pub(super) fn for_pool(config: &PoolConfig) -> Box<dyn Policy> {
    match config.strategy {
        Strategy::RoundRobin => Box::new(round_robin::RoundRobin),
        Strategy::Shuffle => Box::new(shuffle::Shuffle),
        Strategy::LeastOutstanding => Box::new(least_outstanding::LeastOutstanding),
        Strategy::SessionAffinity => Box::new(affinity::SessionAffinity),
        Strategy::PowerOfTwo => Box::new(power_of_two::PowerOfTwo),
        Strategy::PrefixCache => Box::new(prefix_cache::PrefixCache::new(config.cache_tree_tokens)),
    }
}
