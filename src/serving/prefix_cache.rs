//! The prefix state cache: a prompt's state (and next-token logits) after each whole block of
//! its tokens, kept on the device and keyed by the tokens before it, least recently used out
//! first within a byte budget. A state-space model's state after a prefix is one fixed-size
//! row however long the prefix (plus the attention layers' cache rows for a hybrid), so a
//! cached prefix costs the same whatever its length.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// A cached state.
struct Entry<S> {
    /// The prefix it is the state after (compared on lookup: the hash only finds it).
    tokens: Vec<u32>,
    snapshot: S,
    bytes: usize,
    /// When it was last used, on the cache's clock.
    used: u64,
}

/// What the cache has done, since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CacheCounts {
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    pub(crate) evictions: u64,
    pub(crate) bytes: usize,
    pub(crate) entries: usize,
}

/// States after prefixes of whole blocks, within `budget` bytes.
pub(crate) struct PrefixCache<S> {
    block: usize,
    budget: usize,
    entries: HashMap<u64, Entry<S>>,
    clock: u64,
    counts: CacheCounts,
}

/// The key of each whole-block prefix of `tokens`, in one pass: a block's key hashes the key
/// of the prefix before it with the block's tokens.
fn block_keys(tokens: &[u32], block: usize) -> Vec<u64> {
    let mut before = 0u64;
    tokens
        .chunks_exact(block)
        .map(|chunk| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (before, chunk).hash(&mut h);
            before = h.finish();
            before
        })
        .collect()
}

impl<S> PrefixCache<S> {
    /// An empty cache of prefixes of whole `block`s of tokens, holding at most `budget` bytes
    /// (0: off).
    pub(crate) fn new(block: usize, budget: usize) -> Self {
        PrefixCache {
            block: block.max(1),
            budget,
            entries: HashMap::new(),
            clock: 0,
            counts: CacheCounts::default(),
        }
    }

    /// Whether the cache keeps anything.
    pub(crate) fn is_on(&self) -> bool {
        self.budget > 0
    }

    /// The key of `prefix` (whole blocks) when it is cached.
    fn find(&self, prefix: &[u32]) -> Option<u64> {
        let k = *block_keys(prefix, self.block).last()?;
        let e = self.entries.get(&k)?;
        (e.tokens == prefix).then_some(k)
    }

    /// The longest cached prefix of `prompt` (whole blocks, up to all of it) and its key,
    /// without counting or touching it.
    fn longest(&self, prompt: &[u32]) -> Option<(usize, u64)> {
        if !self.is_on() {
            return None;
        }
        let keys = block_keys(prompt, self.block);
        keys.iter().enumerate().rev().find_map(|(b, &k)| {
            let len = (b + 1) * self.block;
            let e = self.entries.get(&k)?;
            (e.tokens == prompt[..len]).then_some((len, k))
        })
    }

    /// The length of the longest cached prefix of `prompt` (whole blocks, up to all of it),
    /// without counting or touching it.
    pub(crate) fn peek(&self, prompt: &[u32]) -> Option<usize> {
        self.longest(prompt).map(|(len, _)| len)
    }

    /// The longest cached prefix of `prompt`: its length and state, marked as just used and
    /// counted as a hit; `None` (counted as a miss when the prompt has a whole block) else.
    pub(crate) fn lookup(&mut self, prompt: &[u32]) -> Option<(usize, &S)> {
        let Some((len, k)) = self.longest(prompt) else {
            self.miss(prompt.len());
            return None;
        };
        self.counts.hits += 1;
        self.clock += 1;
        let e = self.entries.get_mut(&k)?;
        e.used = self.clock;
        Some((len, &e.snapshot))
    }

    /// Counts a miss for a prompt of `len` tokens known to start with no cached prefix (none
    /// when it has no whole block).
    pub(crate) fn miss(&mut self, len: usize) {
        if self.is_on() && len >= self.block {
            self.counts.misses += 1;
        }
    }

    /// Whether `prefix` is worth a snapshot: a whole number of blocks not cached yet (a cached
    /// one is marked as just used).
    pub(crate) fn wants(&mut self, prefix: &[u32]) -> bool {
        if !self.is_on() || prefix.is_empty() || !prefix.len().is_multiple_of(self.block) {
            return false;
        }
        self.clock += 1;
        match self.find(prefix) {
            Some(k) => {
                if let Some(e) = self.entries.get_mut(&k) {
                    e.used = self.clock;
                }
                false
            }
            None => true,
        }
    }

    /// Keeps `snapshot` (of `bytes` bytes) as the state after `prefix`, evicting the least
    /// recently used states until it fits; a state larger than the whole budget, or a prefix
    /// of no whole block, is dropped.
    pub(crate) fn insert(&mut self, prefix: &[u32], snapshot: S, bytes: usize) {
        let whole = prefix.len().is_multiple_of(self.block);
        let Some(&k) = block_keys(prefix, self.block).last().filter(|_| whole) else {
            return;
        };
        if bytes > self.budget {
            return;
        }
        while self.counts.bytes + bytes > self.budget {
            let Some((&old, _)) = self.entries.iter().min_by_key(|(_, e)| e.used) else {
                break;
            };
            if let Some(e) = self.entries.remove(&old) {
                self.counts.bytes -= e.bytes;
                self.counts.evictions += 1;
            }
        }
        self.clock += 1;
        let entry = Entry {
            tokens: prefix.to_vec(),
            snapshot,
            bytes,
            used: self.clock,
        };
        if let Some(old) = self.entries.insert(k, entry) {
            self.counts.bytes -= old.bytes;
        }
        self.counts.bytes += bytes;
    }

    /// The counts and what the cache holds now.
    pub(crate) fn counts(&self) -> CacheCounts {
        CacheCounts {
            entries: self.entries.len(),
            ..self.counts
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_cached_whole_block_prefix_is_found() {
        let mut c = PrefixCache::new(4, 100);
        let p: Vec<u32> = (0..10).collect();
        assert!(c.lookup(&p).is_none());
        assert!(c.wants(&p[..4]) && c.wants(&p[..8]) && !c.wants(&p[..6]));
        c.insert(&p[..4], "four", 10);
        c.insert(&p[..8], "eight", 10);
        assert_eq!(c.lookup(&p).map(|(n, s)| (n, *s)), Some((8, "eight")));
        // Another prompt sharing the first block only.
        let q: Vec<u32> = [0, 1, 2, 3, 9, 9, 9, 9, 9].to_vec();
        assert_eq!(c.lookup(&q).map(|(n, s)| (n, *s)), Some((4, "four")));
        let counts = c.counts();
        assert_eq!((counts.hits, counts.misses, counts.bytes), (2, 1, 20));
    }

    #[test]
    fn the_least_recently_used_state_goes_first() {
        let mut c = PrefixCache::new(2, 30);
        c.insert(&[1, 1], 'a', 10);
        c.insert(&[2, 2], 'b', 10);
        c.insert(&[3, 3], 'c', 10);
        assert!(c.lookup(&[1, 1, 5]).is_some());
        c.insert(&[4, 4], 'd', 10);
        assert!(c.peek(&[2, 2]).is_none(), "b was least recently used");
        assert!(c.peek(&[1, 1]).is_some() && c.peek(&[4, 4]).is_some());
        assert_eq!(c.counts().evictions, 1);
        // Larger than the budget: not kept, nothing evicted.
        c.insert(&[5, 5], 'e', 31);
        assert_eq!((c.counts().entries, c.counts().bytes), (3, 30));
    }

    #[test]
    fn off_keeps_nothing() {
        let mut c = PrefixCache::<u8>::new(2, 0);
        assert!(!c.wants(&[1, 2]));
        assert!(c.lookup(&[1, 2]).is_none());
        assert_eq!(c.counts().misses, 0);
    }
}
