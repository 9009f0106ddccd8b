//! Each call to the candidate with the fewest calls in flight.

use std::sync::Arc;

use super::{Pick, Policy};
use crate::gateway::pool::Replica;

pub(super) struct LeastOutstanding;

impl Policy for LeastOutstanding {
    fn pick<'a>(&self, pick: &Pick<'a>) -> &'a Arc<Replica> {
        least_outstanding(pick.candidates, pick.turn)
    }
}

/// The replica with the fewest calls in flight; ties go round in turn.
pub(super) fn least_outstanding<'a>(
    candidates: &[&'a Arc<Replica>],
    turn: usize,
) -> &'a Arc<Replica> {
    let count = candidates.len();
    (0..count)
        .map(|offset| candidates[(turn + offset) % count])
        .min_by_key(|r| r.outstanding())
        .unwrap_or(candidates[0])
}
