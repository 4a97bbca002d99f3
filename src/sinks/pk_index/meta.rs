//! The meta section of a sorted run: what stays in memory while the run is live (its sparse block
//! index and bloom filters), how it is encoded at the end of the run file, and how it is read
//! back, for the current format and the two before it.
//!
//! Formats, told apart by the footer's magic (`meta offset u64, magic`):
//! - `CPKIRUN3` (written now): per block its first and last key, byte length, entry count, the
//!   range of live file ids it names, whether it holds a tombstone, and its own bloom filter
//!   ("partitioned" filter: one per ~16 KiB data block, sized by that block's entry count). A
//!   lookup finds the candidate block through the sparse index first, then probes only that
//!   block's filter; a merge can copy a block and its filter verbatim (`compaction/worker.rs`),
//!   because neither depends on anything else in the run. A block's filter may be empty (length
//!   0: it filters nothing): the index's oldest run has none (`RunWriter::without_filters`).
//! - `CPKIRUN2`: per block first key and length; one blocked filter for the whole run.
//! - `CPKIRUN1`: as `CPKIRUN2`, with a "spread" filter (`bloom::Layout::Spread`).
//!
//! Old runs are still looked up and merged (their blocks are always re-encoded, into a
//! `CPKIRUN3` run). An older cdcd finds a bad footer in a `CPKIRUN3` run, reports the index
//! corrupt and rebuilds it from the table: a downgrade costs a rebuild, never a wrong answer.

use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use super::bloom::{may_contain_blocked, Bloom, Layout};
use super::run::{get_bytes, get_varint, put_varint};
use super::IndexError;

pub(crate) const MAGIC: &[u8; 8] = b"CPKIRUN3";
/// Runs with one [`Layout::Blocked`] filter for the whole run: still read.
const MAGIC_RUN_FILTER: &[u8; 8] = b"CPKIRUN2";
/// Runs with one [`Layout::Spread`] filter for the whole run: still read.
const MAGIC_SPREAD: &[u8; 8] = b"CPKIRUN1";
pub(crate) const FOOTER_LEN: u64 = 16;

/// One data block of a run, as the sparse index knows it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BlockRef {
    /// First and last key, in the run's key arena (an empty last key in old formats).
    pub(crate) key_off: usize,
    pub(crate) key_len: usize,
    pub(crate) last_off: usize,
    pub(crate) last_len: usize,
    pub(crate) offset: u64,
    pub(crate) len: u64,
    /// The rest is known for `CPKIRUN3` runs only (zero otherwise).
    pub(crate) entries: u64,
    /// The block's filter: `filter_len` words from `filter_off` of the run's filter words.
    pub(crate) filter_off: usize,
    pub(crate) filter_len: usize,
    /// Smallest and largest file id of the block's non-tombstone entries, if it has any.
    pub(crate) files: Option<(u32, u32)>,
    pub(crate) tombstones: bool,
}

/// How a run's keys are filtered before a block is read.
#[derive(Debug)]
pub(crate) enum Filter {
    /// One filter for the whole run (`CPKIRUN1`, `CPKIRUN2`).
    Run(Bloom),
    /// One [`Layout::Blocked`] filter per block, concatenated (`CPKIRUN3`).
    PerBlock { words: Vec<u64>, probes: u32 },
}

/// What is kept in memory of a live run: sparse block index, last key, bloom filters.
#[derive(Debug)]
pub(crate) struct RunMeta {
    pub(crate) id: u64,
    pub(crate) path: Path,
    pub(crate) entries: u64,
    /// Bytes of the whole file.
    pub(crate) size: u64,
    pub(crate) meta_offset: u64,
    pub(crate) keys: Vec<u8>,
    pub(crate) blocks: Vec<BlockRef>,
    pub(crate) last_key: Vec<u8>,
    pub(crate) filter: Filter,
}

impl RunMeta {
    pub(crate) fn first_key(&self, b: &BlockRef) -> &[u8] {
        self.keys
            .get(b.key_off..b.key_off + b.key_len)
            .unwrap_or_default()
    }

    pub(crate) fn last_key_of(&self, b: &BlockRef) -> &[u8] {
        self.keys
            .get(b.last_off..b.last_off + b.last_len)
            .unwrap_or_default()
    }

    /// The filter words of block `b` (empty for runs with one filter).
    pub(crate) fn block_filter(&self, b: &BlockRef) -> &[u64] {
        match &self.filter {
            Filter::PerBlock { words, .. } => words
                .get(b.filter_off..b.filter_off + b.filter_len)
                .unwrap_or_default(),
            Filter::Run(_) => &[],
        }
    }

    /// True when blocks carry their own filter and stats, so a merge may copy them verbatim.
    pub(crate) fn has_block_stats(&self) -> bool {
        matches!(self.filter, Filter::PerBlock { .. })
    }

    /// The only block that can hold `key` (whose [`key_hash`](super::bloom::key_hash) is
    /// `hash`), if the sparse index and the filter allow one.
    pub(crate) fn candidate(&self, key: &[u8], hash: u64) -> Option<usize> {
        if self.blocks.is_empty() || key > self.last_key.as_slice() {
            return None;
        }
        let after = self.blocks.partition_point(|b| self.first_key(b) <= key);
        let block = after.checked_sub(1)?;
        let b = self.blocks.get(block)?;
        let may = match &self.filter {
            Filter::Run(bloom) => bloom.may_contain(hash),
            Filter::PerBlock { probes, .. } => {
                key <= self.last_key_of(b)
                    && may_contain_blocked(self.block_filter(b), *probes, hash)
            }
        };
        may.then_some(block)
    }

    pub(crate) fn block_range(&self, block: usize) -> Option<std::ops::Range<u64>> {
        self.blocks.get(block).map(|b| b.offset..b.offset + b.len)
    }

    /// Bytes this run keeps in memory.
    pub(crate) fn memory_bytes(&self) -> usize {
        let filter = match &self.filter {
            Filter::Run(bloom) => bloom.memory_bytes(),
            Filter::PerBlock { words, .. } => words.capacity() * 8,
        };
        self.keys.capacity()
            + self.blocks.capacity() * std::mem::size_of::<BlockRef>()
            + self.last_key.capacity()
            + filter
    }

    /// Encodes the meta section in the `CPKIRUN3` format (the writer's runs always have
    /// per-block filters).
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, self.blocks.len() as u64);
        for b in &self.blocks {
            let first = self.first_key(b);
            put_varint(out, first.len() as u64);
            out.extend_from_slice(first);
            let last = self.last_key_of(b);
            put_varint(out, last.len() as u64);
            out.extend_from_slice(last);
            put_varint(out, b.len);
            put_varint(out, b.entries);
            put_varint(out, b.filter_len as u64);
            match b.files {
                Some((lo, hi)) => {
                    put_varint(out, u64::from(lo) + 1);
                    put_varint(out, u64::from(hi) + 1);
                }
                None => {
                    put_varint(out, 0);
                    put_varint(out, 0);
                }
            }
            out.push(u8::from(b.tombstones));
        }
        put_varint(out, self.last_key.len() as u64);
        out.extend_from_slice(&self.last_key);
        put_varint(out, self.entries);
        let (words, probes) = match &self.filter {
            Filter::PerBlock { words, probes } => (words.as_slice(), *probes),
            Filter::Run(bloom) => (bloom.words(), bloom.probes()),
        };
        put_varint(out, u64::from(probes));
        for w in words {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }

    /// Reads the meta section of a run (any of the three formats); without its filters when
    /// `filters` is false (the index's oldest run: `RunWriter::without_filters` says why).
    pub(crate) async fn load(
        store: &Arc<dyn ObjectStore>,
        path: Path,
        id: u64,
        size: u64,
        meta_offset: u64,
        filters: bool,
    ) -> Result<RunMeta, IndexError> {
        let corrupt = |detail: &str| IndexError::Corrupt {
            path: path.to_string(),
            detail: detail.to_owned(),
        };
        if meta_offset.saturating_add(FOOTER_LEN) > size {
            return Err(corrupt("meta offset beyond the end of the run"));
        }
        let bytes = store
            .get_range(&path, meta_offset..size)
            .await
            .map_err(|source| IndexError::Storage {
                path: path.to_string(),
                source,
            })?;
        let footer_at = bytes.len().saturating_sub(FOOTER_LEN as usize);
        let (meta, footer) = bytes.split_at(footer_at);
        let format = match footer.get(8..16) {
            Some(m) if m == MAGIC.as_slice() => None,
            Some(m) if m == MAGIC_RUN_FILTER.as_slice() => Some(Layout::Blocked),
            Some(m) if m == MAGIC_SPREAD.as_slice() => Some(Layout::Spread),
            _ => return Err(corrupt("bad footer (not a cdcd index run, or truncated)")),
        };
        if footer.get(..8) != Some(meta_offset.to_le_bytes().as_slice()) {
            return Err(corrupt("bad footer (not a cdcd index run, or truncated)"));
        }
        let mut run = RunMeta {
            id,
            path: path.clone(),
            entries: 0,
            size,
            meta_offset,
            keys: Vec::new(),
            blocks: Vec::new(),
            last_key: Vec::new(),
            filter: Filter::PerBlock {
                words: Vec::new(),
                probes: 0,
            },
        };
        decode(meta, meta_offset, format, filters, &mut run).map_err(corrupt)?;
        Ok(run)
    }
}

fn words_from(raw: &[u8]) -> Vec<u64> {
    raw.chunks_exact(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect()
}

/// Decodes a meta section; `run_filter` is the layout of the whole-run filter of the old formats
/// (`None`: `CPKIRUN3`). With `filters` false the filters are checked for length and skipped: the
/// run answers as if it had none.
fn decode(
    meta: &[u8],
    meta_offset: u64,
    run_filter: Option<Layout>,
    filters: bool,
    run: &mut RunMeta,
) -> Result<(), &'static str> {
    let mut pos = 0;
    let count = get_varint(meta, &mut pos)?;
    let mut offset = 0u64;
    let mut filter_words = 0usize;
    for _ in 0..count {
        let mut b = BlockRef {
            offset,
            ..BlockRef::default()
        };
        let key_len = get_varint(meta, &mut pos)?;
        let key = get_bytes(meta, &mut pos, key_len)?;
        b.key_off = run.keys.len();
        b.key_len = key.len();
        run.keys.extend_from_slice(key);
        if run_filter.is_none() {
            let last_len = get_varint(meta, &mut pos)?;
            let last = get_bytes(meta, &mut pos, last_len)?;
            if last < key {
                return Err("a block's last key sorts before its first");
            }
            b.last_off = run.keys.len();
            b.last_len = last.len();
            run.keys.extend_from_slice(last);
        }
        b.len = get_varint(meta, &mut pos)?;
        if run_filter.is_none() {
            b.entries = get_varint(meta, &mut pos)?;
            b.filter_off = filter_words;
            b.filter_len =
                usize::try_from(get_varint(meta, &mut pos)?).map_err(|_| "bad filter length")?;
            filter_words = filter_words
                .checked_add(b.filter_len)
                .ok_or("bad filter length")?;
            if !filters {
                (b.filter_off, b.filter_len) = (0, 0);
            }
            let lo = get_varint(meta, &mut pos)?;
            let hi = get_varint(meta, &mut pos)?;
            b.files = match (lo.checked_sub(1), hi.checked_sub(1)) {
                (Some(lo), Some(hi)) => Some((
                    u32::try_from(lo).map_err(|_| "file id out of range")?,
                    u32::try_from(hi).map_err(|_| "file id out of range")?,
                )),
                _ => None,
            };
            b.tombstones = match get_bytes(meta, &mut pos, 1)? {
                [0] => false,
                [1] => true,
                _ => return Err("bad block flags"),
            };
        }
        run.blocks.push(b);
        offset = offset.checked_add(b.len).ok_or("block lengths overflow")?;
    }
    if offset != meta_offset {
        return Err("block lengths do not add up to the meta offset");
    }
    let last_len = get_varint(meta, &mut pos)?;
    run.last_key = get_bytes(meta, &mut pos, last_len)?.to_vec();
    run.entries = get_varint(meta, &mut pos)?;
    let probes = u32::try_from(get_varint(meta, &mut pos)?).map_err(|_| "bad probe count")?;
    run.filter = match run_filter {
        Some(layout) => {
            let words = get_varint(meta, &mut pos)?;
            let raw = get_bytes(
                meta,
                &mut pos,
                words.checked_mul(8).ok_or("bad bloom size")?,
            )?;
            let words = if filters { words_from(raw) } else { Vec::new() };
            Filter::Run(Bloom::from_parts(words, probes, layout))
        }
        None => {
            let bytes = u64::try_from(filter_words)
                .ok()
                .and_then(|w| w.checked_mul(8))
                .ok_or("bad bloom size")?;
            let raw = get_bytes(meta, &mut pos, bytes)?;
            let words = if filters { words_from(raw) } else { Vec::new() };
            Filter::PerBlock { words, probes }
        }
    };
    Ok(())
}
