//! How a pool picks a replica for a call (after sgl-router's policies):
//! one small file per strategy behind [`Policy`]. The pool has already
//! left out replicas that are not usable, tried, or (when others remain)
//! cooling down; a policy only chooses among the candidates.

mod affinity;
mod least_outstanding;
mod power_of_two;
mod round_robin;
mod shuffle;

use std::sync::Arc;

pub(super) use affinity::Ring;

use super::config::Strategy;
use super::pool::Replica;

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
}

pub(super) trait Policy: Send + Sync {
    fn pick<'a>(&self, pick: &Pick<'a>) -> &'a Arc<Replica>;
}

/// The policy of a configured strategy.
pub(super) fn for_strategy(strategy: Strategy) -> Box<dyn Policy> {
    match strategy {
        Strategy::RoundRobin => Box::new(round_robin::RoundRobin),
        Strategy::Shuffle => Box::new(shuffle::Shuffle),
        Strategy::LeastOutstanding => Box::new(least_outstanding::LeastOutstanding),
        Strategy::SessionAffinity => Box::new(affinity::SessionAffinity),
        Strategy::PowerOfTwo => Box::new(power_of_two::PowerOfTwo),
    }
}
