//! Each call to the replica that most likely holds its prompt's prefix in
//! its cache (after sgl-router's cache-aware policy): the prompt (each
//! message's role and words, or `prompt`) in blocks of [`BLOCK`] words,
//! each named by a hash of everything up to its end; the pool remembers
//! which replicas were sent each block. The call goes to the candidate
//! sharing the longest run of leading blocks with it, unless the pool is
//! out of balance (the busiest candidate has more than
//! `cache_balance_abs` calls in flight above the idlest, and more than
//! `cache_balance_rel` times as many): then to the least loaded. Ties go to
//! the less loaded. A call that shares no block, or only a prefix prompts
//! have gone on from in several ways (a common system prompt), starts a
//! new conversation: it goes to the least loaded, ties to the replica the
//! pool remembers least of. What is remembered is bounded by
//! `cache_tree_tokens` (a block sent to two replicas counts twice) and the
//! least recently sent go first.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::least_outstanding::least_outstanding;
use super::{Pick, Policy};
use crate::gateway::json::Object;
use crate::gateway::pool::Replica;
use crate::prefix::{BLOCK, Blocks};
use crate::sync::lock;

/// The prompt's block hashes: each message's role and words, or `prompt`
/// (a Responses API call's `input`, a string or items, is read as either).
pub(super) fn blocks(body: &Object) -> Vec<u64> {
    let mut blocks = Blocks::default();
    let messages = body
        .get::<Vec<Value>>("messages")
        .or_else(|| body.get::<Vec<Value>>("input"));
    match messages {
        Some(messages) => {
            for message in messages {
                blocks.add(message["role"].as_str().unwrap_or("user"));
                match &message["content"] {
                    Value::String(text) => blocks.add_words(text),
                    Value::Null => {}
                    other => blocks.add_words(&other.to_string()),
                }
            }
        }
        None => {
            let prompt = body
                .get::<String>("prompt")
                .or_else(|| body.get::<String>("input"))
                .unwrap_or_default();
            blocks.add_words(&prompt);
        }
    }
    blocks.hashes()
}

/// Which replicas were sent each block, and when; the least recently
/// sent (block, replica) pairs are forgotten first. A block shared by many
/// prompts (a common system prompt) is remembered for every replica that
/// got it, so each can still match the blocks after it.
#[derive(Default)]
struct Tree {
    tick: u64,
    /// [`pair`] of a block and a replica → what is known of it there.
    sent: HashMap<u64, Sent>,
    /// When → the pair and its replica.
    by_age: BTreeMap<u64, (u64, u64)>,
    /// Pairs remembered per replica: how much of its cache the pool
    /// believes it fills.
    per_replica: HashMap<u64, usize>,
}

struct Sent {
    /// When it was last sent.
    tick: u64,
    /// The block that followed it last time, and how often that changed:
    /// a block that many prompts continue differently from is a shared
    /// prefix (a common system prompt), not a conversation's own.
    next: Option<u64>,
    forks: u32,
}

/// Forks after which a block counts as a shared prefix.
const SHARED: u32 = 2;

/// A block and a replica as one key: the block's hash rehashed with the
/// replica's (64 bits: a collision is not worth a thought).
fn pair(block: u64, replica: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(&block.to_le_bytes(), replica)
}

/// A replica's part of its pairs.
fn replica_key(id: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(id.as_bytes())
}

impl Tree {
    /// Leading blocks the replica was sent.
    fn matched(&self, blocks: &[u64], replica: u64) -> usize {
        blocks
            .iter()
            .take_while(|b| self.sent.contains_key(&pair(**b, replica)))
            .count()
    }

    /// Whether prompts went on from `block` in several ways, on any of
    /// `replicas`.
    fn shared(&self, block: u64, replicas: impl Iterator<Item = u64>) -> bool {
        let mut forks = 0;
        for replica in replicas {
            forks += self.sent.get(&pair(block, replica)).map_or(0, |s| s.forks);
        }
        forks >= SHARED
    }

    fn remembered(&self, replica: u64) -> usize {
        self.per_replica.get(&replica).copied().unwrap_or(0)
    }

    /// Remembers the blocks as sent to the replica, within `capacity` pairs.
    fn record(&mut self, blocks: &[u64], replica: u64, capacity: usize) {
        // Last block first, so a prompt's tail is forgotten before its head.
        for (i, block) in blocks.iter().enumerate().rev() {
            self.tick += 1;
            let key = pair(*block, replica);
            let next = blocks.get(i + 1).copied();
            match self.sent.get_mut(&key) {
                Some(sent) => {
                    self.by_age.remove(&sent.tick);
                    sent.tick = self.tick;
                    if next.is_some() && sent.next != next {
                        sent.forks += u32::from(sent.next.is_some());
                        sent.next = next;
                    }
                }
                None => {
                    let sent = Sent {
                        tick: self.tick,
                        next,
                        forks: 0,
                    };
                    self.sent.insert(key, sent);
                    *self.per_replica.entry(replica).or_default() += 1;
                }
            }
            self.by_age.insert(self.tick, (key, replica));
        }
        while self.sent.len() > capacity {
            let Some((_, (oldest, replica))) = self.by_age.pop_first() else {
                break;
            };
            self.sent.remove(&oldest);
            if let Some(count) = self.per_replica.get_mut(&replica) {
                *count -= 1;
            }
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
        lock(&self.tree).sent.len()
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
        // The least loaded, ties to the one the pool believes has the
        // most room in its cache.
        let roomiest = || {
            let count = candidates.len();
            (0..count)
                .map(|offset| candidates[(pick.turn + offset) % count])
                .min_by_key(|r| (r.outstanding(), tree.remembered(replica_key(&r.id))))
                .unwrap_or(idlest)
        };
        let chosen = if unbalanced || blocks.is_empty() {
            idlest
        } else {
            let count = candidates.len();
            // Ties go to the less loaded, then round from the turn.
            let (best, matched) = (0..count)
                .map(|offset| candidates[(pick.turn + offset) % count])
                .map(|r| (r, tree.matched(&blocks, replica_key(&r.id))))
                .max_by_key(|(r, matched)| (*matched, std::cmp::Reverse(r.outstanding())))
                .unwrap_or((idlest, 0));
            // Matching nothing, or only a prefix many prompts share: a new
            // conversation, placed where there is room.
            let keys = || candidates.iter().map(|r| replica_key(&r.id));
            if matched == 0 || tree.shared(blocks[matched - 1], keys()) {
                roomiest()
            } else {
                best
            }
        };
        tree.record(&blocks, replica_key(&chosen.id), self.capacity);
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Strategy;
    use crate::gateway::pool::{Pool, test_pool};

    fn pool() -> Pool {
        test_pool(Strategy::PrefixCache, 4)
    }

    /// A chat body: a system prompt of `words` words named by `topic`,
    /// then `question`.
    fn chat(topic: &str, words: usize, question: &str) -> Object {
        let system: Vec<String> = (0..words).map(|i| format!("{topic}{i}")).collect();
        let body = serde_json::json!({"model": "m", "messages": [
            {"role": "system", "content": system.join(" ")},
            {"role": "user", "content": question}]});
        Object::from_map(body.as_object().cloned().unwrap_or_default())
    }

    fn pick(pool: &Pool, body: &Object) -> String {
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
        // Prompts sharing nothing go where the pool remembers least: each
        // to a replica that has had nothing yet.
        let others: std::collections::BTreeSet<String> = (0..3)
            .map(|i| pick(&pool, &chat(&format!("topic{i}-"), 200, "q")))
            .collect();
        assert_eq!(others.len(), 3, "{others:?}");
        assert!(!others.contains(&home), "{others:?}");
    }

    #[test]
    fn conversations_on_a_shared_system_prompt_spread_and_each_comes_back() {
        let pool = pool();
        let system = chat("rules", 200, "")
            .get::<Value>("messages")
            .unwrap_or_default();
        // Eight conversations, each a turn at a time, all after one system
        // prompt: every replica holds it, so new ones go to the least
        // loaded (in turn while idle), and each later turn goes where the
        // conversation's own words went.
        let turn = |conversation: usize, turns: usize| {
            let mut messages = system.as_array().cloned().unwrap_or_default();
            messages.pop();
            for t in 0..turns {
                let words: Vec<String> = (0..40)
                    .map(|w| format!("c{conversation}t{t}w{w}"))
                    .collect();
                messages.push(serde_json::json!({"role": "user", "content": words.join(" ")}));
            }
            let body = serde_json::json!({"model": "m", "messages": messages});
            Object::from_map(body.as_object().cloned().unwrap_or_default())
        };
        let homes: Vec<String> = (0..8).map(|c| pick(&pool, &turn(c, 1))).collect();
        let spread: std::collections::BTreeSet<&String> = homes.iter().collect();
        assert_eq!(spread.len(), 4, "{homes:?}");
        for turns in 2..=4 {
            for (c, home) in homes.iter().enumerate() {
                assert_eq!(&pick(&pool, &turn(c, turns)), home, "conversation {c}");
            }
        }
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
    fn a_responses_input_is_read_as_messages_or_a_prompt() {
        let parse = |text: &str| Object::parse(text.as_bytes()).unwrap();
        let words = "w ".repeat(40);
        let chat = parse(&format!(
            r#"{{"messages": [{{"role": "user", "content": "{words}"}}]}}"#
        ));
        let items = parse(&format!(
            r#"{{"input": [{{"role": "user", "content": "{words}"}}]}}"#
        ));
        assert!(!blocks(&chat).is_empty());
        assert_eq!(blocks(&chat), blocks(&items));
        let prompt = parse(r#"{"prompt": "a b c d e f g h i j k l m n o p q"}"#);
        let input = parse(r#"{"input": "a b c d e f g h i j k l m n o p q"}"#);
        assert!(!blocks(&prompt).is_empty());
        assert_eq!(blocks(&prompt), blocks(&input));
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
