//! A least-recently-used cache of run blocks, bounded by bytes: one per process, over the runs of
//! every index (`memory.rs` says why and sets the capacity).
//!
//! Lookups of hot keys (rows updated again and again) hit the same blocks; caching them keeps a
//! commit's lookups off the object store without letting memory grow with the table. Blocks are
//! copied in on insert: a ranged GET may return a slice of a larger buffer (object_store's
//! `InMemory` returns a slice of the whole object), which would otherwise be kept alive unseen.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;

/// (owning index, run id, block number): run ids are unique only within one index.
pub(crate) type BlockKey = (u64, u64, usize);

#[derive(Default)]
pub(crate) struct BlockCache {
    used: usize,
    tick: u64,
    blocks: HashMap<BlockKey, (Bytes, u64)>,
    by_age: BTreeMap<u64, BlockKey>,
}

impl BlockCache {
    pub(crate) fn new() -> BlockCache {
        BlockCache::default()
    }

    pub(crate) fn get(&mut self, key: BlockKey) -> Option<Bytes> {
        self.tick += 1;
        let tick = self.tick;
        let (bytes, age) = self.blocks.get_mut(&key)?;
        self.by_age.remove(age);
        *age = tick;
        self.by_age.insert(tick, key);
        Some(bytes.clone())
    }

    /// Caches `block`, evicting the least recently used blocks until everything fits in
    /// `capacity` (which may have shrunk since the last insert).
    pub(crate) fn insert(&mut self, key: BlockKey, block: &[u8], capacity: usize) {
        self.remove(key);
        let fits = block.len() <= capacity;
        let keep = if fits {
            capacity - block.len()
        } else {
            capacity
        };
        while self.used > keep {
            let Some((_, oldest)) = self.by_age.pop_first() else {
                break;
            };
            if let Some((b, _)) = self.blocks.remove(&oldest) {
                self.used -= b.len();
            }
        }
        if !fits {
            return;
        }
        self.tick += 1;
        self.used += block.len();
        self.blocks
            .insert(key, (Bytes::copy_from_slice(block), self.tick));
        self.by_age.insert(self.tick, key);
    }

    fn remove(&mut self, key: BlockKey) {
        if let Some((b, age)) = self.blocks.remove(&key) {
            self.used -= b.len();
            self.by_age.remove(&age);
        }
    }

    /// Drops every block of `owner`'s `run` (the run was compacted away).
    pub(crate) fn forget_run(&mut self, owner: u64, run: u64) {
        self.forget(|k| k.0 == owner && k.1 == run);
    }

    /// Drops every block of `owner`'s runs (the index was cleared or dropped).
    pub(crate) fn forget_owner(&mut self, owner: u64) {
        self.forget(|k| k.0 == owner);
    }

    fn forget(&mut self, which: impl Fn(&BlockKey) -> bool) {
        let keys: Vec<BlockKey> = self.blocks.keys().filter(|k| which(k)).copied().collect();
        for k in keys {
            self.remove(k);
        }
    }

    /// Bytes of cached blocks (the bookkeeping maps add ~80 bytes per block).
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    /// Bytes of `owner`'s cached blocks (a walk over every block: for reports, not lookups).
    pub(crate) fn used_by(&self, owner: u64) -> usize {
        self.blocks
            .iter()
            .filter(|(k, _)| k.0 == owner)
            .map(|(_, (b, _))| b.len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used_within_capacity() {
        let mut c = BlockCache::new();
        c.insert((9, 1, 0), b"aaaa", 10);
        c.insert((9, 1, 1), b"bbbb", 10);
        assert!(c.get((9, 1, 0)).is_some());
        c.insert((9, 2, 0), b"cccc", 10);
        assert!(c.get((9, 1, 1)).is_none(), "least recently used goes first");
        assert!(c.get((9, 1, 0)).is_some());
        assert!(c.used() <= 10);
        c.forget_run(9, 1);
        assert!(c.get((9, 1, 0)).is_none());
        assert_eq!(c.used(), 4);
        c.insert((9, 3, 0), &[0; 11], 10);
        assert!(
            c.get((9, 3, 0)).is_none(),
            "a block larger than the cache is not kept"
        );
        c.insert((8, 1, 0), b"dd", 10);
        c.insert((8, 1, 1), b"ee", 3);
        assert_eq!(c.used(), 2, "a shrunk capacity evicts down to it");
        c.forget_owner(8);
        assert_eq!(c.used(), 0);
    }
}
