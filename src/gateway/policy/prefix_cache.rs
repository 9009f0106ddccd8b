//! Each call to the replica that most likely holds its prompt's prefix in
//! its cache (after sgl-router's cache-aware policy): the prompt (each
//! message's role and words, or `prompt`) in blocks of [`BLOCK`] words,
//! each named by a hash of everything up to its end; the pool remembers
//! which replica was last sent each block. The call goes to the candidate
//! sharing the longest run of leading blocks with it, unless the pool is
//! out of balance (the busiest candidate has more than
//! `cache_balance_abs` calls in flight above the idlest, and more than
//! `cache_balance_rel` times as many), or no candidate shares a block:
//! then to the least loaded. What is remembered is bounded by
//! `cache_tree_tokens` and the least recently sent blocks go first.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};
use xxhash_rust::xxh3::Xxh3;

use super::least_outstanding::least_outstanding;
use super::{Pick, Policy};
use crate::gateway::pool::Replica;
use crate::sync::lock;

/// Words per block.
pub(super) const BLOCK: usize = 16;

/// The prompt's block hashes, each over everything before its end.
pub(super) fn blocks(body: &Map<String, Value>) -> Vec<u64> {
    let mut hashes = Vec::new();
    let mut hasher = Xxh3::with_seed(0);
    let mut words = 0;
    let mut add = |word: &str| {
        hasher.update(word.as_bytes());
        hasher.update(b" ");
        words += 1;
        if words == BLOCK {
            let hash = hasher.digest();
            hashes.push(hash);
            hasher = Xxh3::with_seed(hash);
            words = 0;
        }
    };
    match body.get("messages").and_then(Value::as_array) {
        Some(messages) => {
            for message in messages {
                add(message["role"].as_str().unwrap_or("user"));
                match &message["content"] {
                    Value::String(text) => text.split_whitespace().for_each(&mut add),
                    Value::Null => {}
                    other => other.to_string().split_whitespace().for_each(&mut add),
                }
            }
        }
        None => {
            let prompt = body.get("prompt").and_then(Value::as_str).unwrap_or("");
            prompt.split_whitespace().for_each(&mut add);
        }
    }
    hashes
}

/// Which replica was last sent each block, oldest forgotten first.
#[derive(Default)]
struct Tree {
    tick: u64,
    /// Block hash → (replica id, when).
    owner: HashMap<u64, (Arc<str>, u64)>,
    /// When → block hash.
    by_age: BTreeMap<u64, u64>,
}

impl Tree {
    /// Leading blocks `replica` was sent.
    fn matched(&self, blocks: &[u64], replica: &str) -> usize {
        blocks
            .iter()
            .take_while(|b| self.owner.get(b).is_some_and(|(r, _)| &**r == replica))
            .count()
    }

    /// Remembers the blocks as sent to `replica`, within `capacity` blocks.
    fn record(&mut self, blocks: &[u64], replica: &Arc<str>, capacity: usize) {
        // Last block first, so a prompt's tail is forgotten before its head.
        for block in blocks.iter().rev() {
            self.tick += 1;
            if let Some((_, before)) = self.owner.insert(*block, (replica.clone(), self.tick)) {
                self.by_age.remove(&before);
            }
            self.by_age.insert(self.tick, *block);
        }
        while self.owner.len() > capacity {
            let Some((_, oldest)) = self.by_age.pop_first() else {
                break;
            };
            self.owner.remove(&oldest);
        }
    }
}

pub(super) struct PrefixCache {
    tree: Mutex<Tree>,
    /// Blocks remembered at most.
    capacity: usize,
}

impl PrefixCache {
    pub(super) fn new(tree_tokens: u64) -> PrefixCache {
        PrefixCache {
            tree: Mutex::default(),
            capacity: (usize::try_from(tree_tokens).unwrap_or(usize::MAX) / BLOCK).max(1),
        }
    }

    /// Blocks remembered now.
    #[cfg(test)]
    pub(super) fn remembered(&self) -> usize {
        lock(&self.tree).owner.len()
    }
}

impl Policy for PrefixCache {
    fn reads_body(&self) -> bool {
        true
    }

    fn pick<'a>(&self, pick: &Pick<'a>) -> &'a Arc<Replica> {
        let candidates = pick.candidates;
        let idlest = least_outstanding(candidates, pick.turn);
        let Some(body) = pick.body else {
            return idlest;
        };
        let blocks = blocks(body);
        let loads = candidates.iter().map(|r| r.outstanding());
        let (low, high) = (loads.clone().min().unwrap_or(0), loads.max().unwrap_or(0));
        let unbalanced =
            high - low > pick.balance_abs && high as f64 > low as f64 * pick.balance_rel;
        let mut tree = lock(&self.tree);
        let chosen = if unbalanced || blocks.is_empty() {
            idlest
        } else {
            let count = candidates.len();
            // Ties (no match anywhere included) go round from the turn.
            let (best, matched) = (0..count)
                .map(|offset| candidates[(pick.turn + offset) % count])
                .map(|r| (r, tree.matched(&blocks, &r.id)))
                .max_by_key(|(r, matched)| (*matched, std::cmp::Reverse(r.outstanding())))
                .unwrap_or((idlest, 0));
            if matched == 0 { idlest } else { best }
        };
        let id: Arc<str> = chosen.id.as_str().into();
        tree.record(&blocks, &id, self.capacity);
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::config::Strategy;
    use crate::gateway::pool::{Pool, test_pool};

    fn pool() -> Pool {
        test_pool(Strategy::PrefixCache, 4)
    }

    /// A chat body: a system prompt of `words` words named by `topic`,
    /// then `question`.
    fn chat(topic: &str, words: usize, question: &str) -> Map<String, Value> {
        let system: Vec<String> = (0..words).map(|i| format!("{topic}{i}")).collect();
        let body = serde_json::json!({"model": "m", "messages": [
            {"role": "system", "content": system.join(" ")},
            {"role": "user", "content": question}]});
        body.as_object().cloned().unwrap_or_default()
    }

    fn pick(pool: &Pool, body: &Map<String, Value>) -> String {
        pool.pick(None, Some(body), &[])
            .map(|r| r.id.clone())
            .unwrap_or_default()
    }

    #[test]
    fn a_repeated_prefix_goes_where_it_went_and_new_ones_spread() {
        let pool = pool();
        let home = pick(&pool, &chat("law", 200, "first question"));
        for question in ["second question", "third, longer question than before"] {
            assert_eq!(pick(&pool, &chat("law", 200, question)), home);
        }
        // Prompts sharing nothing are placed as the least loaded policy
        // would: in turn while all are idle.
        let others: std::collections::BTreeSet<String> = (0..4)
            .map(|i| pick(&pool, &chat(&format!("topic{i}-"), 200, "q")))
            .collect();
        assert_eq!(others.len(), 4, "{others:?}");
    }

    #[test]
    fn a_busy_replica_loses_its_prefixes_to_the_least_loaded() {
        let pool = pool();
        let body = chat("law", 200, "q");
        let home = pick(&pool, &body);
        let replicas = pool.replicas();
        let at_home = replicas.iter().find(|r| r.id == home).cloned();
        let at_home = at_home.into_iter().collect::<Vec<_>>();
        // 32 more in flight than the idlest: still in balance.
        let mut busy: Vec<_> = (0..32).map(|_| at_home[0].start_call()).collect();
        assert_eq!(pick(&pool, &body), home);
        // 33: out of balance, the call goes to an idle replica.
        busy.push(at_home[0].start_call());
        assert_ne!(pick(&pool, &body), home);
    }

    #[test]
    fn what_the_pool_remembers_stays_within_its_bound() {
        let pool = pool();
        let policy = PrefixCache::new(16 * 10);
        assert_eq!(policy.capacity, 10);
        let replicas = pool.replicas();
        let candidates: Vec<&Arc<Replica>> = replicas.iter().collect();
        let ring = super::super::Ring::new(&replicas);
        for i in 0..50 {
            let body = chat(&format!("t{i}-"), 100, "q");
            policy.pick(&Pick {
                candidates: &candidates,
                session: None,
                turn: i,
                ring: &ring,
                load_factor: 1.25,
                body: Some(&body),
                balance_abs: 32,
                balance_rel: 1.5,
            });
            assert!(policy.remembered() <= 10);
        }
        assert_eq!(policy.remembered(), 10);
    }
}
