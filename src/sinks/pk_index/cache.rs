//! A least-recently-used cache of run blocks, bounded by bytes.
//!
//! Lookups of hot keys (rows updated again and again) hit the same blocks; caching them keeps a
//! commit's lookups off the object store without letting memory grow with the table. Blocks are
//! copied in on insert: a ranged GET may return a slice of a larger buffer (object_store's
//! `InMemory` returns a slice of the whole object), which would otherwise be kept alive unseen.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;

/// (run id, block number).
pub(crate) type BlockKey = (u64, usize);

pub(crate) struct BlockCache {
    capacity: usize,
    used: usize,
    tick: u64,
    blocks: HashMap<BlockKey, (Bytes, u64)>,
    by_age: BTreeMap<u64, BlockKey>,
}

impl BlockCache {
    pub(crate) fn new(capacity: usize) -> BlockCache {
        BlockCache {
            capacity,
            used: 0,
            tick: 0,
            blocks: HashMap::new(),
            by_age: BTreeMap::new(),
        }
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

    pub(crate) fn insert(&mut self, key: BlockKey, block: &[u8]) {
        if block.len() > self.capacity {
            return;
        }
        self.remove(key);
        while self.used + block.len() > self.capacity {
            let Some((_, oldest)) = self.by_age.pop_first() else {
                break;
            };
            if let Some((b, _)) = self.blocks.remove(&oldest) {
                self.used -= b.len();
            }
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

    /// Drops every block of `run` (the run was compacted away or cleared).
    pub(crate) fn forget_run(&mut self, run: u64) {
        let keys: Vec<BlockKey> = self.blocks.keys().filter(|k| k.0 == run).copied().collect();
        for k in keys {
            self.remove(k);
        }
    }

    pub(crate) fn clear(&mut self) {
        self.blocks.clear();
        self.by_age.clear();
        self.used = 0;
    }

    /// Bytes of cached blocks (the bookkeeping maps add ~80 bytes per block).
    pub(crate) fn used(&self) -> usize {
        self.used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used_within_capacity() {
        let mut c = BlockCache::new(10);
        c.insert((1, 0), b"aaaa");
        c.insert((1, 1), b"bbbb");
        assert!(c.get((1, 0)).is_some());
        c.insert((2, 0), b"cccc");
        assert!(c.get((1, 1)).is_none(), "least recently used goes first");
        assert!(c.get((1, 0)).is_some());
        assert!(c.used() <= 10);
        c.forget_run(1);
        assert!(c.get((1, 0)).is_none());
        assert_eq!(c.used(), 4);
        c.insert((3, 0), &[0; 11]);
        assert!(
            c.get((3, 0)).is_none(),
            "a block larger than the cache is not kept"
        );
    }
}
