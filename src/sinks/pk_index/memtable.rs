//! The memtable: the index changes applied since the last flush, in memory.
//!
//! Keys are appended to one byte arena and entries (arena offset, slot) to one vector, so
//! applying a change allocates nothing per row (amortized growth only) and, until a lookup,
//! hashes nothing: the copy never looks keys up, so the lookup structure is built on the first
//! [`MemTable::get`]. It is a map from [`key_hash`] to the newest entry with that hash, plus a
//! `prev` link per entry, forming exact chains: a lookup walks the chain comparing full key
//! bytes, so hash collisions never alias two keys. Once built, each insert extends the chains
//! (one hash per entry over the memtable's life): a streaming sink keeps its changes here for
//! several commits between persists and looks keys up at every commit, and rebuilding the chains
//! from every entry at each commit was the largest single item of its commit thread
//! (docs/performance.md, "Streaming with the changelog on"). A key written twice keeps both
//! entries (the newer shadows the older); [`MemTable::sorted`] keeps the newest per key when
//! flushing.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::OnceLock;

use super::bloom::key_hash;
use crate::sinks::key_prefix::key_prefix;

/// The file id a removed key maps to (a tombstone): it shadows older runs until compaction of the
/// oldest run drops it.
pub(crate) const TOMBSTONE: u32 = u32::MAX;

/// Where a key lives: an interned file id (or [`TOMBSTONE`]) and a row position in that file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) file: u32,
    pub(crate) position: u64,
}

impl Slot {
    pub(crate) const REMOVED: Slot = Slot {
        file: TOMBSTONE,
        position: 0,
    };

    pub(crate) fn is_tombstone(&self) -> bool {
        self.file == TOMBSTONE
    }
}

const NONE: usize = usize::MAX;

/// Bytes of each buffer a cleared memtable keeps for the next commit (a small commit's worth:
/// kept by every table, more would add up over 1,000 tables).
const KEPT_CAPACITY: usize = 4 * 1024;

/// One applied change: its key is `arena[key_off..]` up to the next entry's `key_off` (keys are
/// appended in entry order), which saves a length per entry.
#[derive(Debug, Clone, Copy)]
struct Entry {
    key_off: usize,
    slot: Slot,
}

/// The keys are already hashes: hashing them again would only cost time.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// Hash chains over the entries, built on demand.
#[derive(Default)]
struct Chains {
    heads: HashMap<u64, usize, BuildHasherDefault<PassThrough>>,
    /// Per entry: the previous entry whose key has the same hash (possibly the same key).
    prev: Vec<usize>,
}

impl Chains {
    /// Makes entry `i` (the next one, holding `key`) the head of its hash's chain.
    fn link(&mut self, key: &[u8], i: usize) {
        let prev = self.heads.insert(key_hash(key), i);
        self.prev.push(prev.unwrap_or(NONE));
    }
}

#[derive(Default)]
pub(crate) struct MemTable {
    arena: Vec<u8>,
    entries: Vec<Entry>,
    chains: OnceLock<Chains>,
}

impl MemTable {
    pub(crate) fn insert(&mut self, key: &[u8], slot: Slot) {
        if let Some(chains) = self.chains.get_mut() {
            chains.link(key, self.entries.len());
        }
        self.entries.push(Entry {
            key_off: self.arena.len(),
            slot,
        });
        self.arena.extend_from_slice(key);
    }

    fn key(&self, i: usize) -> &[u8] {
        let start = self.entries.get(i).map_or(0, |e| e.key_off);
        let end = self
            .entries
            .get(i + 1)
            .map_or(self.arena.len(), |e| e.key_off);
        self.arena.get(start..end).unwrap_or_default()
    }

    fn chains(&self) -> &Chains {
        self.chains.get_or_init(|| {
            let mut chains = Chains {
                heads: HashMap::with_capacity_and_hasher(self.entries.len(), Default::default()),
                prev: Vec::with_capacity(self.entries.len()),
            };
            for i in 0..self.entries.len() {
                chains.link(self.key(i), i);
            }
            chains
        })
    }

    /// The newest slot of `key`, if the memtable has one.
    pub(crate) fn get(&self, key: &[u8], hash: u64) -> Option<Slot> {
        if self.entries.is_empty() {
            return None;
        }
        let chains = self.chains();
        let mut idx = *chains.heads.get(&hash)?;
        while let Some(e) = self.entries.get(idx) {
            if self.key(idx) == key {
                return Some(e.slot);
            }
            idx = chains.prev.get(idx).copied().unwrap_or(NONE);
        }
        None
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries inserted since the last clear (a key inserted twice counts twice).
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The newest entry of every key, in key order: what a flush writes.
    pub(crate) fn sorted(&self) -> impl Iterator<Item = (&[u8], Slot)> {
        // Each entry carries its key's prefix (sinks/key_prefix.rs): most comparisons are two
        // integer compares instead of a `memcmp` through the arena.
        let mut order: Vec<([u64; 2], usize)> = (0..self.entries.len())
            .map(|i| (key_prefix(self.key(i)), i))
            .collect();
        // Stable: a commit's keys arrive as long ascending stretches (each source chunk reader
        // walks its key range in order), which the stable sort detects and merges instead of
        // sorting from scratch. Equal keys keep their order, so the last of each is the newest.
        order.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| self.key(a.1).cmp(self.key(b.1))));
        order.dedup_by(|later, first| {
            let same = later.0 == first.0 && self.key(later.1) == self.key(first.1);
            if same {
                // Keep the later (newer) entry in the surviving position.
                *first = *later;
            }
            same
        });
        order
            .into_iter()
            .filter_map(move |(_, i)| self.entries.get(i).map(|e| (self.key(i), e.slot)))
    }

    /// Empties the memtable, keeping its buffers for reuse (the next commit refills them) up to
    /// [`KEPT_CAPACITY`]: a process has one memtable per table, each flushed at every commit,
    /// and a large commit's buffers kept by each of 1,000 mostly idle tables were gigabytes.
    pub(crate) fn clear(&mut self) {
        self.arena.clear();
        self.entries.clear();
        if self.arena.capacity() > KEPT_CAPACITY {
            self.arena = Vec::new();
        }
        if self.entries.capacity() * std::mem::size_of::<Entry>() > KEPT_CAPACITY {
            self.entries = Vec::new();
        }
        self.chains = OnceLock::new();
    }

    /// Bytes in use: what decides a flush. Capacity kept after a clear is not counted, or one
    /// full memtable would ask for a flush after every commit from then on.
    pub(crate) fn used_bytes(&self) -> usize {
        self.arena.len() + self.entries.len() * std::mem::size_of::<Entry>() + self.chains_bytes()
    }

    fn chains_bytes(&self) -> usize {
        self.chains.get().map_or(0, |c| {
            // hashbrown: one control byte per bucket plus the (hash, index) pair.
            c.heads.capacity() * (std::mem::size_of::<(u64, usize)>() + 1) + c.prev.capacity() * 8
        })
    }

    /// Bytes held, counting capacity: what the memory usage reports.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.arena.capacity()
            + self.entries.capacity() * std::mem::size_of::<Entry>()
            + self.chains_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(file: u32, position: u64) -> Slot {
        Slot { file, position }
    }

    #[test]
    fn newest_wins_and_sorted_dedups() {
        let mut m = MemTable::default();
        m.insert(b"b", at(0, 1));
        m.insert(b"a", at(0, 2));
        m.insert(b"b", at(1, 3));
        m.insert(b"c", Slot::REMOVED);
        assert_eq!(m.get(b"b", key_hash(b"b")), Some(at(1, 3)));
        assert_eq!(m.get(b"z", key_hash(b"z")), None);
        let all: Vec<_> = m.sorted().map(|(k, s)| (k.to_vec(), s)).collect();
        assert_eq!(
            all,
            vec![
                (b"a".to_vec(), at(0, 2)),
                (b"b".to_vec(), at(1, 3)),
                (b"c".to_vec(), Slot::REMOVED)
            ]
        );
    }

    #[test]
    fn sorted_orders_like_the_key_bytes() {
        // Keys that pad to equal prefixes, share 16 bytes, or differ past them.
        let mut long = vec![7u8; 20];
        let keys: Vec<Vec<u8>> = vec![
            b"a\0\x01".to_vec(),
            long.clone(),
            b"a".to_vec(),
            Vec::new(),
            b"a\0".to_vec(),
            vec![0],
            {
                long[17] = 6;
                long.clone()
            },
            vec![7u8; 16],
            b"a".to_vec(),
        ];
        let mut m = MemTable::default();
        for (i, k) in keys.iter().enumerate() {
            m.insert(k, at(0, i as u64));
        }
        let mut expected: std::collections::BTreeMap<&[u8], u64> = Default::default();
        for (i, k) in keys.iter().enumerate() {
            expected.insert(k, i as u64);
        }
        let got: Vec<(&[u8], u64)> = m.sorted().map(|(k, s)| (k, s.position)).collect();
        let want: Vec<(&[u8], u64)> = expected.into_iter().collect();
        assert_eq!(got, want);
    }

    #[test]
    fn colliding_hashes_resolve_exactly() {
        // Force two keys into one chain by looking them up under one hash.
        let mut m = MemTable::default();
        m.insert(b"x", at(0, 1));
        let h = key_hash(b"x");
        assert_eq!(m.get(b"y", h), None);
        assert_eq!(m.get(b"x", h), Some(at(0, 1)));
    }

    #[test]
    fn inserts_after_a_lookup_extend_the_chains() {
        let mut m = MemTable::default();
        m.insert(b"a", at(0, 1));
        assert_eq!(m.get(b"a", key_hash(b"a")), Some(at(0, 1)));
        m.insert(b"b", at(0, 2));
        m.insert(b"a", at(1, 3));
        assert_eq!(m.get(b"a", key_hash(b"a")), Some(at(1, 3)));
        assert_eq!(m.get(b"b", key_hash(b"b")), Some(at(0, 2)));
        m.clear();
        assert_eq!(m.get(b"a", key_hash(b"a")), None);
        m.insert(b"a", at(2, 4));
        assert_eq!(m.get(b"a", key_hash(b"a")), Some(at(2, 4)));
    }
}
