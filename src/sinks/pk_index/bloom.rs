//! Key hashing and the per-run bloom filter.
//!
//! A lookup asks every run, newest to oldest, until one holds the key; the bloom filter lets a
//! lookup skip a run without reading a block. Filters are persisted inside the run file, so the
//! hash must be stable across builds and Rust versions: `std`'s `DefaultHasher` is explicitly not
//! ("should not be relied upon over releases"), hence the small hash below. The same hash keys the
//! memtable's buckets; both resolve collisions by comparing the full key bytes, so hash quality
//! only costs speed, never correctness.

/// A stable 64-bit hash of an encoded key: a multiply-xorshift over 8-byte words, then the
/// SplitMix64 finalizer for avalanche.
pub(crate) fn key_hash(key: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = (key.len() as u64).wrapping_mul(K) ^ 0x243F_6A88_85A3_08D3;
    let mut chunks = key.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        h = (h ^ u64::from_le_bytes(word)).wrapping_mul(K);
        h ^= h >> 29;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut word = [0u8; 8];
        for (w, b) in word.iter_mut().zip(rest) {
            *w = *b;
        }
        h = (h ^ u64::from_le_bytes(word)).wrapping_mul(K);
        h ^= h >> 29;
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^ (h >> 31)
}

/// Bits per key: 10 bits with 7 probes give a ~0.8% false-positive rate (Bloom 1970; the usual
/// `(1 - e^{-kn/m})^k` estimate), i.e. 1.25 bytes of memory per key of a run.
const BITS_PER_KEY: u64 = 10;
pub(crate) const PROBES: u32 = 7;

/// Words (of 64 bits) in one block of a [`Layout::Blocked`] filter: 512 bits, one cache line.
const BLOCK_WORDS: usize = 8;

/// How a filter maps a hash to bits. Persisted runs say which (the run file's magic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Every probe anywhere in the filter, by double hashing (Kirsch–Mitzenmacher): runs
    /// written before blocked filters (`CPKIRUN1`). Each probe is a cache miss and a 64-bit
    /// modulo: with 7 probes this was a quarter of the initial copy's CPU (issue 7 profile).
    Spread,
    /// All probes of a key inside one 512-bit block chosen by the hash (a "blocked" bloom filter,
    /// Putze, Sanders and Singler 2007): one cache line per insert or lookup, no division. Costs a
    /// slightly higher false-positive rate (about 1% instead of 0.8% at 10 bits per key).
    Blocked,
}

/// Words of a [`Layout::Blocked`] filter for `keys` keys: 10 bits per key, whole 512-bit blocks.
pub(crate) fn blocked_words(keys: u64) -> usize {
    let bits = keys.saturating_mul(BITS_PER_KEY).max(64);
    let words = usize::try_from(bits.div_ceil(64)).unwrap_or(usize::MAX / 16);
    words.next_multiple_of(BLOCK_WORDS)
}

/// The block of `hash` in a filter of `words` words and the bit masks of its probes, or `None`
/// for a filter too small to hold a block (read from a damaged run: it then filters nothing).
/// The block comes from the hash's high half by multiply-shift; the probes' 9-bit positions from
/// a remix of the whole hash, so the two are not correlated.
fn blocked(
    words: usize,
    probes: u32,
    hash: u64,
) -> Option<(usize, impl Iterator<Item = (usize, u64)>)> {
    let blocks = (words / BLOCK_WORDS) as u64;
    if blocks == 0 {
        return None;
    }
    let block = ((hash >> 32).wrapping_mul(blocks) >> 32) as usize * BLOCK_WORDS;
    let mut bits = (hash ^ (hash >> 33)).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    bits ^= bits >> 33;
    let probes = probes.min(7);
    Some((
        block,
        (0..probes).map(move |i| {
            let bit = (bits >> (9 * i)) & 511;
            ((bit / 64) as usize, 1u64 << (bit % 64))
        }),
    ))
}

/// Sets the bits of `hash` in a [`Layout::Blocked`] filter held in `words`: a whole run's
/// filter (`CPKIRUN2`) or one block's (`CPKIRUN3`, where each data block has its own).
pub(crate) fn insert_blocked(words: &mut [u64], probes: u32, hash: u64) {
    if let Some((block, probes)) = blocked(words.len(), probes, hash) {
        for (word, mask) in probes {
            if let Some(w) = words.get_mut(block + word) {
                *w |= mask;
            }
        }
    }
}

/// False means `hash` was never inserted into the [`Layout::Blocked`] filter `words`.
pub(crate) fn may_contain_blocked(words: &[u64], probes: u32, hash: u64) -> bool {
    match blocked(words.len(), probes, hash) {
        Some((block, mut probes)) => {
            probes.all(|(word, mask)| words.get(block + word).is_none_or(|w| w & mask == mask))
        }
        None => true,
    }
}

/// A bloom filter over [`key_hash`] values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bloom {
    words: Vec<u64>,
    probes: u32,
    layout: Layout,
}

impl Bloom {
    /// An empty whole-run filter sized for `keys` keys, in the [`Layout::Blocked`] layout of
    /// `CPKIRUN2` runs (tests write such runs to check they are still read).
    #[cfg(test)]
    pub(crate) fn with_capacity(keys: u64) -> Bloom {
        Bloom {
            words: vec![0; blocked_words(keys)],
            probes: PROBES,
            layout: Layout::Blocked,
        }
    }

    pub(crate) fn from_parts(words: Vec<u64>, probes: u32, layout: Layout) -> Bloom {
        Bloom {
            words,
            probes,
            layout,
        }
    }

    #[cfg(test)]
    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    pub(crate) fn words(&self) -> &[u64] {
        &self.words
    }

    pub(crate) fn probes(&self) -> u32 {
        self.probes
    }

    fn bits(&self) -> u64 {
        self.words.len() as u64 * 64
    }

    #[cfg(test)]
    pub(crate) fn insert(&mut self, hash: u64) {
        if self.layout == Layout::Blocked {
            insert_blocked(&mut self.words, self.probes, hash);
            return;
        }
        let m = self.bits();
        if m == 0 {
            return;
        }
        let (h1, h2) = (hash & 0xFFFF_FFFF, (hash >> 32) | 1);
        for i in 0..u64::from(self.probes) {
            let bit = h1.wrapping_add(i.wrapping_mul(h2)) % m;
            if let Some(w) = self.words.get_mut((bit / 64) as usize) {
                *w |= 1 << (bit % 64);
            }
        }
    }

    /// False means the key is certainly not in the run.
    pub(crate) fn may_contain(&self, hash: u64) -> bool {
        if self.layout == Layout::Blocked {
            return may_contain_blocked(&self.words, self.probes, hash);
        }
        let m = self.bits();
        if m == 0 {
            return true;
        }
        let (h1, h2) = (hash & 0xFFFF_FFFF, (hash >> 32) | 1);
        (0..u64::from(self.probes)).all(|i| {
            let bit = h1.wrapping_add(i.wrapping_mul(h2)) % m;
            self.words
                .get((bit / 64) as usize)
                .is_none_or(|w| w & (1 << (bit % 64)) != 0)
        })
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.words.capacity() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_stable_across_builds() {
        // Persisted filters depend on these exact values: changing the hash breaks every index.
        assert_eq!(key_hash(b""), key_hash(b""));
        assert_ne!(key_hash(b"a"), key_hash(b"b"));
        assert_ne!(key_hash(b"abcdefgh"), key_hash(b"abcdefgh\0"));
        let pinned = [
            key_hash(b""),
            key_hash(b"k1"),
            key_hash(b"0123456789abcdef!"),
        ];
        assert_eq!(pinned, PINNED);
    }

    const PINNED: [u64; 3] = [
        16852473371444490038,
        8871782265804384867,
        4828811993765939569,
    ];

    #[test]
    fn no_false_negatives_and_few_false_positives() {
        for layout in [Layout::Spread, Layout::Blocked] {
            let mut bloom = Bloom::with_capacity(10_000);
            bloom.layout = layout;
            for i in 0u64..10_000 {
                bloom.insert(key_hash(&i.to_be_bytes()));
            }
            assert!((0u64..10_000).all(|i| bloom.may_contain(key_hash(&i.to_be_bytes()))));
            let fp = (10_000u64..110_000)
                .filter(|i| bloom.may_contain(key_hash(&i.to_be_bytes())))
                .count();
            assert!(fp < 2_000, "{layout:?}: false positives: {fp} of 100000");
        }
    }

    #[test]
    fn a_blocked_filter_too_small_for_a_block_filters_nothing() {
        let bloom = Bloom::from_parts(vec![0; 3], 7, Layout::Blocked);
        assert!(bloom.may_contain(key_hash(b"k")));
        let mut empty = Bloom::from_parts(Vec::new(), 7, Layout::Blocked);
        empty.insert(key_hash(b"k"));
        assert!(empty.may_contain(key_hash(b"k")));
    }

    #[test]
    fn spread_filters_of_old_runs_still_answer() {
        // A `CPKIRUN1` run's filter: bit positions by double hashing over the whole filter,
        // exactly as those runs were written, so their lookups still skip and still find.
        let hash = key_hash(b"k1");
        let mut words = vec![0u64; 4];
        let (h1, h2) = (hash & 0xFFFF_FFFF, (hash >> 32) | 1);
        for i in 0..7u64 {
            let bit = h1.wrapping_add(i.wrapping_mul(h2)) % 256;
            words[(bit / 64) as usize] |= 1 << (bit % 64);
        }
        let old = Bloom::from_parts(words.clone(), 7, Layout::Spread);
        assert!(old.may_contain(hash));
        let mut rebuilt = Bloom::from_parts(vec![0; 4], 7, Layout::Spread);
        rebuilt.insert(hash);
        assert_eq!(rebuilt.words(), words.as_slice());
    }
}
