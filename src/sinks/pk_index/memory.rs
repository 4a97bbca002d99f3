//! The memory the primary-key indexes of one process share: one limit for every table's memtable
//! together, and one LRU block cache whose capacity is what the run metas leave of the indexes'
//! share (issue 37: one budget per process, not per table; a database has hundreds of tables).
//!
//! Why shared and not per table: a per-table budget (64 MiB before this) multiplies by the tables
//! captured. Most tables are small or idle; their blocks are cold and are the first an LRU over
//! every table evicts, so a shared cache serves the busy tables with the memory idle ones would
//! have pinned. The memtables are flushed at every persist (each commit), so what they hold at
//! once is the commits in flight; past the limit, an index whose memtable is a sizeable part of
//! it flushes early (a smaller run, merged later by compaction): [`IndexMemory::should_flush`].
//!
//! Accounting is by deltas: each index reports what its memtable and run metas hold after it
//! changed them, and takes its share back when dropped. Run metas (sparse indexes, ~0.08 bytes
//! per key, and the bloom filters of every run but the oldest, 1.25) cannot be evicted without
//! reading them back at every lookup, so they are counted against the cache: the more rows the
//! process indexes, the smaller the cache, down to a floor that keeps one commit's lookups from
//! thrashing.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::cache::BlockCache;

/// Least block-cache capacity, whatever the run metas take: below this one run's blocks would
/// thrash the cache.
pub(crate) const MIN_CACHE: usize = 256 * 1024;
/// Least memtable limit: a flush per few hundred keys would make runs of a few blocks.
pub(crate) const MIN_MEMTABLES: usize = 256 * 1024;
/// Of the memtable limit, the part an index's memtable must reach before the process being over
/// the limit makes it flush: the smallest memtables are left alone (each is flushed at its
/// commit's persist anyway), so a flush frees a sizeable amount.
const FLUSH_FRACTION: usize = 16;

/// The shared limits and the shared block cache. One per process ([`crate::memory`]); tests and
/// tools make private ones ([`IndexMemory::new`]).
pub struct IndexMemory {
    memtables_limit: usize,
    /// Block cache plus run metas.
    cache_limit: usize,
    memtables: AtomicUsize,
    runs: AtomicUsize,
    cache: Mutex<BlockCache>,
    next_owner: AtomicU64,
}

impl std::fmt::Debug for IndexMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexMemory")
            .field("memtables_limit", &self.memtables_limit)
            .field("cache_limit", &self.cache_limit)
            .field("memtables", &self.memtables())
            .field("runs", &self.runs())
            .finish()
    }
}

impl IndexMemory {
    /// `budget` bytes for every index that shares this: half for the memtables together, half
    /// for the block cache and the run metas (the split a single index always had).
    pub fn new(budget: usize) -> Arc<IndexMemory> {
        IndexMemory::split(budget / 2, budget / 2)
    }

    /// `memtables` bytes for the memtables together, `cache` for the block cache and run metas.
    pub fn split(memtables: usize, cache: usize) -> Arc<IndexMemory> {
        Arc::new(IndexMemory {
            memtables_limit: memtables.max(MIN_MEMTABLES),
            cache_limit: cache.max(MIN_CACHE),
            memtables: AtomicUsize::new(0),
            runs: AtomicUsize::new(0),
            cache: Mutex::new(BlockCache::new()),
            next_owner: AtomicU64::new(1),
        })
    }

    /// A new index's id, which its cached blocks are keyed by.
    pub(crate) fn owner(&self) -> u64 {
        self.next_owner.fetch_add(1, Ordering::Relaxed)
    }

    /// Bytes the memtables of every index hold (buffer capacity counted).
    pub fn memtables(&self) -> usize {
        self.memtables.load(Ordering::Relaxed)
    }

    /// Bytes the run metas of every open index hold.
    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::Relaxed)
    }

    /// Bytes of cached blocks, over every index.
    pub fn cached(&self) -> usize {
        self.cache().used()
    }

    pub fn memtables_limit(&self) -> usize {
        self.memtables_limit
    }

    /// What the block cache may hold now: the cache's share less the run metas, at least
    /// [`MIN_CACHE`].
    pub fn cache_capacity(&self) -> usize {
        self.cache_limit.saturating_sub(self.runs()).max(MIN_CACHE)
    }

    /// Whether an index whose memtable uses `used` bytes must flush before applying more: it
    /// reached the limit on its own, or every memtable together is over it and this one holds at
    /// least 1/[`FLUSH_FRACTION`] of it.
    pub(crate) fn should_flush(&self, used: usize) -> bool {
        used >= self.memtables_limit
            || (self.memtables() > self.memtables_limit
                && used >= self.memtables_limit / FLUSH_FRACTION)
    }

    /// Moves a charge from `*charged` to `now` bytes (an index's memtable or run metas).
    fn recharge(counter: &AtomicUsize, charged: &mut usize, now: usize) {
        if now > *charged {
            counter.fetch_add(now - *charged, Ordering::Relaxed);
        } else {
            counter.fetch_sub(*charged - now, Ordering::Relaxed);
        }
        *charged = now;
    }

    pub(crate) fn cache(&self) -> MutexGuard<'_, BlockCache> {
        // A panic while holding the lock cannot leave the cache inconsistent in a way that
        // matters: at worst its byte count is off until the next eviction.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Caches a block, evicting the least recently used blocks of any index past the capacity.
    pub(crate) fn cache_block(&self, key: super::cache::BlockKey, block: &[u8]) {
        let capacity = self.cache_capacity();
        self.cache().insert(key, block, capacity);
    }
}

/// What one index has charged to its [`IndexMemory`]; taken back when the index is dropped.
#[derive(Debug)]
pub(crate) struct Charges {
    memory: Arc<IndexMemory>,
    owner: u64,
    memtable: usize,
    runs: usize,
}

impl Charges {
    pub(crate) fn new(memory: &Arc<IndexMemory>) -> Charges {
        Charges {
            owner: memory.owner(),
            memory: Arc::clone(memory),
            memtable: 0,
            runs: 0,
        }
    }

    pub(crate) fn memory(&self) -> &IndexMemory {
        &self.memory
    }

    pub(crate) fn owner(&self) -> u64 {
        self.owner
    }

    pub(crate) fn memtable(&mut self, bytes: usize) {
        IndexMemory::recharge(&self.memory.memtables, &mut self.memtable, bytes);
    }

    pub(crate) fn runs(&mut self, bytes: usize) {
        IndexMemory::recharge(&self.memory.runs, &mut self.runs, bytes);
    }
}

impl Drop for Charges {
    fn drop(&mut self) {
        self.memtable(0);
        self.runs(0);
        self.memory.cache().forget_owner(self.owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_add_up_over_indexes_and_are_taken_back_on_drop() {
        let memory = IndexMemory::split(1 << 20, 4 << 20);
        let mut a = Charges::new(&memory);
        let mut b = Charges::new(&memory);
        a.memtable(300_000);
        b.memtable(500_000);
        a.runs(1 << 20);
        assert_eq!(memory.memtables(), 800_000);
        a.memtable(100_000);
        assert_eq!(memory.memtables(), 600_000);
        assert_eq!(
            memory.cache_capacity(),
            3 << 20,
            "run metas shrink the cache"
        );
        b.runs(10 << 20);
        assert_eq!(memory.cache_capacity(), MIN_CACHE, "never below the floor");
        drop(b);
        assert_eq!(memory.memtables(), 100_000);
        assert_eq!(memory.runs(), 1 << 20);
        drop(a);
        assert_eq!((memory.memtables(), memory.runs()), (0, 0));
    }

    #[test]
    fn over_the_limit_sizeable_memtables_flush_and_small_ones_wait() {
        let memory = IndexMemory::split(1 << 20, 1 << 20);
        let limit = memory.memtables_limit();
        assert!(memory.should_flush(limit), "one memtable at the limit");
        assert!(!memory.should_flush(limit / 2));
        let mut others = Charges::new(&memory);
        others.memtable(limit + 1);
        // Together over the limit: this one's 1/16 of it flushes, a tiny one waits.
        assert!(memory.should_flush(limit / FLUSH_FRACTION));
        assert!(!memory.should_flush(limit / FLUSH_FRACTION - 1));
    }

    #[test]
    fn one_lru_over_every_index_stays_within_the_capacity() {
        let memory = IndexMemory::split(0, 0);
        let capacity = memory.cache_capacity();
        let a = Charges::new(&memory);
        let b = Charges::new(&memory);
        let block = vec![7u8; 16 * 1024];
        for i in 0..64 {
            memory.cache_block((a.owner(), 1, i), &block);
            memory.cache_block((b.owner(), 1, i), &block);
            assert!(memory.cached() <= capacity);
        }
        // The newest blocks of both indexes are cached, the oldest of both evicted.
        assert!(memory.cache().get((a.owner(), 1, 63)).is_some());
        assert!(memory.cache().get((b.owner(), 1, 63)).is_some());
        assert!(memory.cache().get((a.owner(), 1, 0)).is_none());
        let gone = a.owner();
        drop(a);
        assert!(
            memory.cache().get((gone, 1, 63)).is_none(),
            "a dropped index's blocks go"
        );
        assert!(memory.cache().get((b.owner(), 1, 63)).is_some());
    }
}
