//! A prompt as a chain of blocks: its words in blocks of [`BLOCK`], each
//! named by a hash of every word up to the block's end, so two prompts share
//! a block only when they share everything before it. `conclave sim` models
//! an engine's prefix cache on these blocks, and the gateway's
//! `prefix_cache` strategy guesses at the replicas' caches with them.

use xxhash_rust::xxh3::Xxh3;

/// Words per block.
pub const BLOCK: usize = 16;

/// Hashes words into blocks as they come; a last partial block is left out.
pub struct Blocks {
    hashes: Vec<u64>,
    hasher: Xxh3,
    in_block: usize,
}

impl Default for Blocks {
    fn default() -> Self {
        Blocks {
            hashes: Vec::new(),
            hasher: Xxh3::with_seed(0),
            in_block: 0,
        }
    }
}

impl Blocks {
    pub fn add(&mut self, word: &str) {
        self.hasher.update(word.as_bytes());
        self.hasher.update(b" ");
        self.in_block += 1;
        if self.in_block == BLOCK {
            let hash = self.hasher.digest();
            self.hashes.push(hash);
            self.hasher = Xxh3::with_seed(hash);
            self.in_block = 0;
        }
    }

    /// Adds each whitespace-separated word of `text`.
    pub fn add_words(&mut self, text: &str) {
        text.split_whitespace().for_each(|word| self.add(word));
    }

    /// The whole blocks' hashes, first to last.
    pub fn hashes(self) -> Vec<u64> {
        self.hashes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(text: &str) -> Vec<u64> {
        let mut blocks = Blocks::default();
        blocks.add_words(text);
        blocks.hashes()
    }

    #[test]
    fn a_block_names_everything_before_it() {
        let words = |from: usize| {
            (from..from + 40)
                .map(|i| format!("w{i}"))
                .collect::<Vec<_>>()
        };
        let a = of(&words(0).join(" "));
        assert_eq!(a.len(), 40 / BLOCK);
        // The same second block after a different first one is another block.
        let mut b = words(100)[..BLOCK].to_vec();
        b.extend_from_slice(&words(0)[BLOCK..]);
        let b = of(&b.join(" "));
        assert_ne!(a[1], b[1]);
        // A shared start shares its blocks.
        let c = of(&words(0)[..BLOCK + 3].join(" "));
        assert_eq!(c, a[..1]);
    }
}
