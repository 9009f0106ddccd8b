//! Each call to the next candidate in turn.

use std::sync::Arc;

use super::{Pick, Policy};
use crate::gateway::pool::Replica;

pub(super) struct RoundRobin;

impl Policy for RoundRobin {
    fn pick<'a>(&self, pick: &Pick<'a>) -> &'a Arc<Replica> {
        pick.candidates[pick.turn % pick.candidates.len()]
    }
}
