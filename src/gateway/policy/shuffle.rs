//! Each call to a candidate drawn at random.

use std::sync::Arc;

use super::{Pick, Policy};
use crate::gateway::pool::Replica;

pub(super) struct Shuffle;

impl Policy for Shuffle {
    fn pick<'a>(&self, pick: &Pick<'a>) -> &'a Arc<Replica> {
        pick.candidates[fastrand::usize(..pick.candidates.len())]
    }
}
