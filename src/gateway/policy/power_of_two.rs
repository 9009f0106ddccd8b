//! Each call to the less loaded of two candidates drawn at random: nearly
//! the balance of `least_outstanding` without every call reading every
//! replica's count, and no herd on the one replica that looks idle.

use std::sync::Arc;

use super::{Pick, Policy};
use crate::gateway::pool::Replica;

pub(super) struct PowerOfTwo;

impl Policy for PowerOfTwo {
    fn pick<'a>(&self, pick: &Pick<'a>) -> &'a Arc<Replica> {
        let count = pick.candidates.len();
        if count == 1 {
            return pick.candidates[0];
        }
        let first = fastrand::usize(..count);
        // A second draw among the others, so the two always differ.
        let second = (first + 1 + fastrand::usize(..count - 1)) % count;
        let (a, b) = (pick.candidates[first], pick.candidates[second]);
        if b.outstanding() < a.outstanding() {
            b
        } else {
            a
        }
    }
}
