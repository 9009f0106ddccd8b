//! A session's calls to the same replica (consistent hashing, so a replica
//! that joins or leaves moves only its share of sessions), unless that
//! replica carries more than its share of the load; calls without a
//! session go to the least loaded.

use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64;

use super::least_outstanding::least_outstanding;
use super::{Pick, Policy};
use crate::gateway::pool::Replica;

/// Points per replica on the hash ring: enough that sessions spread evenly.
const RING_POINTS: usize = 160;

pub(super) struct SessionAffinity;

impl Policy for SessionAffinity {
    /// The first replica on the ring from the session's point that is a
    /// candidate and under the load bound.
    fn pick<'a>(&self, pick: &Pick<'a>) -> &'a Arc<Replica> {
        let candidates = pick.candidates;
        let Some(session) = pick.session else {
            return least_outstanding(candidates, pick.turn);
        };
        let total: u64 = candidates.iter().map(|r| r.outstanding()).sum();
        let bound = ((total + 1) as f64 * pick.load_factor / candidates.len() as f64).ceil() as u64;
        pick.ring
            .walk(session)
            .filter_map(|id| candidates.iter().find(|r| r.id == id))
            .find(|r| r.outstanding() < bound.max(1))
            .copied()
            .unwrap_or_else(|| least_outstanding(candidates, 0))
    }
}

/// The consistent-hash ring of a pool: points sorted by hash, each naming
/// a replica id.
pub(in crate::gateway) struct Ring {
    points: Vec<(u64, Arc<str>)>,
}

impl Ring {
    pub(in crate::gateway) fn new(replicas: &[Arc<Replica>]) -> Ring {
        let mut points: Vec<(u64, Arc<str>)> = replicas
            .iter()
            .flat_map(|replica| {
                let id: Arc<str> = replica.id.as_str().into();
                (0..RING_POINTS)
                    .map(move |point| (xxh3_64(format!("{id}#{point}").as_bytes()), id.clone()))
            })
            .collect();
        points.sort_unstable();
        Ring { points }
    }

    /// Replica ids in ring order from the session's point, each once.
    fn walk(&self, session: &str) -> impl Iterator<Item = &str> {
        let start = self
            .points
            .partition_point(|(hash, _)| *hash < xxh3_64(session.as_bytes()));
        let mut seen: Vec<&str> = Vec::new();
        self.points[start..]
            .iter()
            .chain(&self.points[..start])
            .filter_map(move |(_, id)| {
                if seen.contains(&id.as_ref()) {
                    None
                } else {
                    seen.push(id);
                    Some(id.as_ref())
                }
            })
    }
}
