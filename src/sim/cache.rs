//! A model of a serving engine's prefix cache (after vLLM's automatic
//! prefix caching): a prompt's tokens in blocks of [`BLOCK`], each block
//! named by a hash of every token up to its end, so two prompts share a
//! block only when they share everything before it. Blocks are kept up to
//! a budget of tokens and the least recently used go first; a prompt's
//! blocks are touched last to first, so its tail goes before its head
//! (a cut prefix keeps the part that can still be reused). A prompt's
//! cached part is its run of leading blocks found.

use std::collections::{BTreeMap, HashMap};

use crate::prefix::{BLOCK, Blocks};

pub struct PrefixCache {
    /// Blocks kept at most.
    capacity: usize,
    tick: u64,
    /// Block hash → when it was last used.
    used: HashMap<u64, u64>,
    /// When → block hash, oldest first.
    by_age: BTreeMap<u64, u64>,
}

impl PrefixCache {
    /// A cache of about `tokens` tokens (whole blocks).
    pub fn new(tokens: u64) -> PrefixCache {
        PrefixCache {
            capacity: usize::try_from(tokens).unwrap_or(usize::MAX) / BLOCK,
            tick: 0,
            used: HashMap::new(),
            by_age: BTreeMap::new(),
        }
    }

    /// Serves a prompt: answers how many of its leading tokens were
    /// cached, then keeps its blocks (evicting the oldest past the budget).
    pub fn serve<'a>(&mut self, tokens: impl IntoIterator<Item = &'a str>) -> usize {
        let mut blocks = Blocks::default();
        tokens.into_iter().for_each(|token| blocks.add(token));
        let hashes = blocks.hashes();
        let cached = hashes
            .iter()
            .take_while(|h| self.used.contains_key(h))
            .count();
        for hash in hashes.iter().rev() {
            self.touch(*hash);
        }
        while self.used.len() > self.capacity {
            let Some((_, oldest)) = self.by_age.pop_first() else {
                break;
            };
            self.used.remove(&oldest);
        }
        cached * BLOCK
    }

    /// Tokens kept now.
    pub fn tokens(&self) -> usize {
        self.used.len() * BLOCK
    }

    fn touch(&mut self, hash: u64) {
        self.tick += 1;
        if let Some(before) = self.used.insert(hash, self.tick) {
            self.by_age.remove(&before);
        }
        self.by_age.insert(self.tick, hash);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(head: &str, words: usize) -> Vec<String> {
        (0..words).map(|i| format!("{head}{i}")).collect()
    }

    fn serve(cache: &mut PrefixCache, tokens: &[String]) -> usize {
        cache.serve(tokens.iter().map(String::as_str))
    }

    #[test]
    fn a_repeated_prefix_is_cached_by_whole_blocks() {
        let mut cache = PrefixCache::new(10_000);
        let first = prompt("a", 100);
        assert_eq!(serve(&mut cache, &first), 0);
        // The same 100 tokens: 6 whole blocks (96 tokens) are cached.
        assert_eq!(serve(&mut cache, &first), 96);
        // A longer prompt with the same start reuses those blocks.
        let mut longer = first.clone();
        longer.extend(prompt("b", 50));
        assert_eq!(serve(&mut cache, &longer), 96);
        // A prompt differing in its first token shares nothing.
        let mut other = first.clone();
        other[0] = "z".into();
        assert_eq!(serve(&mut cache, &other), 0);
    }

    #[test]
    fn the_cache_stays_within_its_budget_and_drops_tails_first() {
        let mut cache = PrefixCache::new(160);
        let old = prompt("old", 160);
        serve(&mut cache, &old);
        assert_eq!(cache.tokens(), 160);
        // 64 tokens of another prompt push out 4 blocks of the old one,
        // its tail: its first 96 tokens are still cached.
        serve(&mut cache, &prompt("new", 64));
        assert_eq!(cache.tokens(), 160);
        assert_eq!(serve(&mut cache, &old), 96);
        for i in 0..100 {
            serve(&mut cache, &prompt(&format!("p{i}-"), 48));
            assert!(cache.tokens() <= 160);
        }
    }
}
