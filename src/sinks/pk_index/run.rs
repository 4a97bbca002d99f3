//! Sorted runs: the immutable files of the index, their block format, the writer and the point
//! search within a block. The meta section is `meta.rs`; the sequential cursor merges read runs
//! with is `cursor.rs`.
//!
//! A run is `[block]* [meta] [footer]`. Blocks hold entries in key order, ~16 KiB each, with the
//! key prefix shared with the previous entry elided (LevelDB's "prefix compression"; it resets
//! at each block so any block decodes alone). An entry is `varint shared, varint suffix_len,
//! suffix, varint file+1 (0 = tombstone), varint position (absent for tombstones)`; a block
//! ends with its restart points (see `RESTART_INTERVAL`). The meta
//! section is what stays in memory while the run is live: per block its first and last key,
//! length, stats and its own bloom filter (a sparse index: one entry per block, not per row),
//! see `meta.rs`. The 16-byte footer (`meta offset u64, magic "CPKIRUN3"`) lets a run be checked
//! alone; the manifest also records the meta offset so open reads meta and footer with one
//! ranged GET.
//!
//! A block's filter is built when the block closes, from the hashes of its keys collected while
//! it filled: a filter of a few KiB stays in cache while it is written, where one whole-run
//! filter of several MiB cost a cache miss per key. And a block plus its filter and stats is
//! self-contained, so [`RunWriter::add_block`] can append one copied from another run as is.

use std::sync::Arc;

use bytes::Bytes;
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::ObjectStore;
use tokio::io::AsyncWriteExt;

use super::bloom::{blocked_words, insert_blocked, key_hash, PROBES};
use super::memtable::{Slot, TOMBSTONE};
use super::meta::{BlockRef, Filter, RunMeta, MAGIC};
use super::IndexError;
/// Target uncompressed block size: a point lookup reads and scans one block.
const BLOCK_BYTES: usize = 16 * 1024;
/// Encoded blocks are handed to the upload in chunks of this size (bounded write memory).
const UPLOAD_CHUNK: usize = 1024 * 1024;
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn get_varint(buf: &[u8], pos: &mut usize) -> Result<u64, &'static str> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos).ok_or("truncated varint")?;
        *pos += 1;
        v |= u64::from(b & 0x7F) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("varint longer than 10 bytes")
}

pub(crate) fn get_bytes<'a>(
    buf: &'a [u8],
    pos: &mut usize,
    len: u64,
) -> Result<&'a [u8], &'static str> {
    let len = usize::try_from(len).map_err(|_| "length overflows")?;
    let end = pos.checked_add(len).ok_or("length overflows")?;
    let out = buf.get(*pos..end).ok_or("truncated bytes")?;
    *pos = end;
    Ok(out)
}

/// Decodes the entry at `*pos` of `block`, rebuilding its key in `key` (which holds the previous
/// key of the block on entry).
pub(crate) fn decode_entry(
    block: &[u8],
    pos: &mut usize,
    key: &mut Vec<u8>,
) -> Result<Slot, &'static str> {
    let shared = usize::try_from(get_varint(block, pos)?).map_err(|_| "bad shared length")?;
    if shared > key.len() {
        return Err("shared prefix longer than the previous key");
    }
    key.truncate(shared);
    let suffix_len = get_varint(block, pos)?;
    key.extend_from_slice(get_bytes(block, pos, suffix_len)?);
    let file = get_varint(block, pos)?;
    if file == 0 {
        return Ok(Slot::REMOVED);
    }
    let file = u32::try_from(file - 1).map_err(|_| "file id out of range")?;
    let position = get_varint(block, pos)?;
    Ok(Slot { file, position })
}

/// Every this many entries a block stores a full key (shared prefix 0) and records its offset
/// (a "restart point", as in LevelDB's block format), so a lookup binary-searches the restarts
/// and decodes at most this many entries instead of scanning the whole block.
const RESTART_INTERVAL: usize = 16;

fn read_u32(buf: &[u8], at: usize) -> Option<u32> {
    let b = buf.get(at..at.checked_add(4)?)?;
    let mut w = [0u8; 4];
    w.copy_from_slice(b);
    Some(u32::from_le_bytes(w))
}

/// Splits a block into its entries and its restart offsets (trailer: `u32 offset * n, u32 n`).
pub(crate) fn split_block(block: &[u8]) -> Result<(&[u8], &[u8]), &'static str> {
    let n = read_u32(block, block.len().checked_sub(4).ok_or("block too short")?)
        .ok_or("block too short")? as usize;
    let trailer = n
        .checked_mul(4)
        .and_then(|t| t.checked_add(4))
        .ok_or("bad restart count")?;
    let data_len = block
        .len()
        .checked_sub(trailer)
        .ok_or("bad restart count")?;
    let (data, rest) = block.split_at(data_len);
    Ok((data, rest.get(..n * 4).unwrap_or_default()))
}

/// Scans one block for `key`; `scratch` is reused across calls.
pub(crate) fn search_block(
    block: &[u8],
    key: &[u8],
    scratch: &mut Vec<u8>,
) -> Result<Option<Slot>, &'static str> {
    let (data, restarts) = split_block(block)?;
    let count = restarts.len() / 4;
    let restart_at = |i: usize| read_u32(restarts, i * 4).map(|v| v as usize);
    // The last restart whose (full) key is <= key.
    let (mut lo, mut hi) = (0usize, count);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let mut pos = restart_at(mid).ok_or("bad restart")?;
        scratch.clear();
        decode_entry(data, &mut pos, scratch)?;
        if scratch.as_slice() <= key {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let mut pos = if count == 0 {
        0
    } else {
        restart_at(lo).ok_or("bad restart")?
    };
    scratch.clear();
    while pos < data.len() {
        let slot = decode_entry(data, &mut pos, scratch)?;
        match scratch.as_slice().cmp(key) {
            std::cmp::Ordering::Less => {}
            std::cmp::Ordering::Equal => return Ok(Some(slot)),
            std::cmp::Ordering::Greater => return Ok(None),
        }
    }
    Ok(None)
}

/// Writes one run, streaming: at most one block plus one upload chunk is buffered, so a merge of
/// runs of any size writes in bounded memory (multipart upload behind object_store's `BufWriter`).
pub(crate) struct RunWriter {
    out: BufWriter,
    pending: Vec<u8>,
    block: Vec<u8>,
    /// Restart offsets of the block being built, and its entry count.
    restarts: Vec<u32>,
    block_entries: usize,
    /// Key hashes of the block being built (its filter is sized and filled when it closes),
    /// the range of file ids it names, and whether it holds a tombstone.
    block_hashes: Vec<u64>,
    block_files: Option<(u32, u32)>,
    block_tombstones: bool,
    /// The filters of the blocks written so far, concatenated (moved into `meta` at finish).
    filter: Vec<u64>,
    /// False for the index's oldest run ([`RunWriter::without_filters`]).
    filters: bool,
    prev_key: Vec<u8>,
    written: u64,
    meta: RunMeta,
}

impl RunWriter {
    pub(crate) fn new(store: &Arc<dyn ObjectStore>, path: Path, id: u64) -> RunWriter {
        RunWriter {
            out: BufWriter::with_capacity(Arc::clone(store), path.clone(), 2 * UPLOAD_CHUNK),
            pending: Vec::with_capacity(UPLOAD_CHUNK + BLOCK_BYTES),
            block: Vec::with_capacity(BLOCK_BYTES + 256),
            restarts: Vec::new(),
            block_entries: 0,
            block_hashes: Vec::new(),
            block_files: None,
            block_tombstones: false,
            filter: Vec::new(),
            filters: true,
            prev_key: Vec::new(),
            written: 0,
            meta: RunMeta {
                id,
                path,
                entries: 0,
                size: 0,
                meta_offset: 0,
                keys: Vec::new(),
                blocks: Vec::new(),
                last_key: Vec::new(),
                filter: Filter::PerBlock {
                    words: Vec::new(),
                    probes: PROBES,
                },
            },
        }
    }

    /// A writer whose blocks get no bloom filter (each block's `filter_len` is 0, which every
    /// reader takes as "may hold any key"): for the run that becomes the index's oldest.
    ///
    /// Why (RocksDB's `optimize_filters_for_hits` makes the same trade): the sink looks up only
    /// keys it updates or deletes, which have a row, so a key that reaches the oldest run is
    /// nearly always in it and the filter would pass it anyway; its filters would only answer
    /// for keys with no row at all. And the oldest run holds most keys: at 100M keys its filters
    /// are ~120 MiB of the ~130 MiB of run metas, all of the index cache's share, which left the
    /// block cache at its floor (docs/performance.md, "A 100M-row table"). The cost: a lookup of
    /// a key with no row reads one block of the oldest run instead of none.
    pub(crate) fn without_filters(mut self) -> RunWriter {
        self.filters = false;
        self
    }

    fn offset(&self) -> u64 {
        self.written + self.pending.len() as u64
    }

    /// Appends an entry; keys must come in strictly increasing order.
    pub(crate) async fn add(&mut self, key: &[u8], slot: Slot) -> Result<(), IndexError> {
        if self.block.is_empty() {
            self.meta.blocks.push(BlockRef {
                key_off: self.meta.keys.len(),
                key_len: key.len(),
                offset: self.offset(),
                ..BlockRef::default()
            });
            self.meta.keys.extend_from_slice(key);
            self.prev_key.clear();
        }
        let shared = if self.block_entries.is_multiple_of(RESTART_INTERVAL) {
            self.restarts.push(self.block.len() as u32);
            0
        } else {
            self.prev_key
                .iter()
                .zip(key)
                .take_while(|(a, b)| a == b)
                .count()
        };
        self.block_entries += 1;
        put_varint(&mut self.block, shared as u64);
        let suffix = key.get(shared..).unwrap_or_default();
        put_varint(&mut self.block, suffix.len() as u64);
        self.block.extend_from_slice(suffix);
        if slot.file == TOMBSTONE {
            put_varint(&mut self.block, 0);
            self.block_tombstones = true;
        } else {
            put_varint(&mut self.block, u64::from(slot.file) + 1);
            put_varint(&mut self.block, slot.position);
            self.block_files = Some(match self.block_files {
                Some((lo, hi)) => (lo.min(slot.file), hi.max(slot.file)),
                None => (slot.file, slot.file),
            });
        }
        self.prev_key.clear();
        self.prev_key.extend_from_slice(key);
        if self.filters {
            self.block_hashes.push(key_hash(key));
        }
        self.meta.entries += 1;
        if self.block.len() >= BLOCK_BYTES {
            self.end_block().await?;
        }
        Ok(())
    }

    async fn end_block(&mut self) -> Result<(), IndexError> {
        for r in &self.restarts {
            self.block.extend_from_slice(&r.to_le_bytes());
        }
        self.block
            .extend_from_slice(&(self.restarts.len() as u32).to_le_bytes());
        self.restarts.clear();
        let entries = std::mem::take(&mut self.block_entries) as u64;
        let last_off = self.meta.keys.len();
        self.meta.keys.extend_from_slice(&self.prev_key);
        let filter_off = self.filter.len();
        let filter_len = if self.filters {
            blocked_words(entries)
        } else {
            0
        };
        self.filter.resize(filter_off + filter_len, 0);
        if let Some(filter) = self.filter.get_mut(filter_off..) {
            for h in &self.block_hashes {
                insert_blocked(filter, PROBES, *h);
            }
        }
        if let Some(b) = self.meta.blocks.last_mut() {
            b.last_off = last_off;
            b.last_len = self.prev_key.len();
            b.len = self.block.len() as u64;
            b.entries = entries;
            b.filter_off = filter_off;
            b.filter_len = filter_len;
            b.files = self.block_files;
            b.tombstones = self.block_tombstones;
        }
        self.block_hashes.clear();
        self.block_files = None;
        self.block_tombstones = false;
        self.pending.extend_from_slice(&self.block);
        self.block.clear();
        if self.pending.len() >= UPLOAD_CHUNK {
            self.upload_pending().await?;
        }
        Ok(())
    }

    /// Appends block `b` of run `src`, whose bytes are `bytes`, as it is: its entries, filter and
    /// stats do not depend on anything else in the run. Its keys must all sort after every key
    /// added so far (the merge checks that through the block's last key).
    pub(crate) async fn add_block(
        &mut self,
        src: &RunMeta,
        b: &BlockRef,
        bytes: &[u8],
    ) -> Result<(), IndexError> {
        if !self.block.is_empty() {
            self.end_block().await?;
        }
        let key_off = self.meta.keys.len();
        let first = src.first_key(b);
        let last = src.last_key_of(b);
        self.meta.keys.extend_from_slice(first);
        self.meta.keys.extend_from_slice(last);
        let filter = if self.filters {
            src.block_filter(b)
        } else {
            &[]
        };
        let filter_off = self.filter.len();
        self.filter.extend_from_slice(filter);
        self.meta.blocks.push(BlockRef {
            key_off,
            key_len: first.len(),
            last_off: key_off + first.len(),
            last_len: last.len(),
            offset: self.offset(),
            len: bytes.len() as u64,
            entries: b.entries,
            filter_off,
            filter_len: filter.len(),
            files: b.files,
            tombstones: b.tombstones,
        });
        self.meta.entries += b.entries;
        self.prev_key.clear();
        self.prev_key.extend_from_slice(last);
        self.pending.extend_from_slice(bytes);
        if self.pending.len() >= UPLOAD_CHUNK {
            self.upload_pending().await?;
        }
        Ok(())
    }

    async fn upload_pending(&mut self) -> Result<(), IndexError> {
        // Handed over, not copied: a fresh buffer costs one allocation per MiB written.
        let chunk = Bytes::from(std::mem::replace(
            &mut self.pending,
            Vec::with_capacity(UPLOAD_CHUNK + BLOCK_BYTES),
        ));
        self.written += chunk.len() as u64;
        let path = self.meta.path.to_string();
        self.out
            .put(chunk)
            .await
            .map_err(|source| IndexError::Storage { path, source })
    }

    /// Writes meta and footer and completes the upload; the run is durable when this returns.
    pub(crate) async fn finish(mut self) -> Result<RunMeta, IndexError> {
        if !self.block.is_empty() {
            self.end_block().await?;
        }
        self.meta.last_key = std::mem::take(&mut self.prev_key);
        // Held while the run is live: no growth slack.
        self.filter.shrink_to_fit();
        self.meta.keys.shrink_to_fit();
        self.meta.blocks.shrink_to_fit();
        self.meta.filter = Filter::PerBlock {
            words: std::mem::take(&mut self.filter),
            probes: PROBES,
        };
        self.meta.meta_offset = self.offset();
        let mut tail = std::mem::take(&mut self.pending);
        self.meta.encode(&mut tail);
        tail.extend_from_slice(&self.meta.meta_offset.to_le_bytes());
        tail.extend_from_slice(MAGIC);
        self.pending = tail;
        self.upload_pending().await?;
        self.out.shutdown().await.map_err(|e| IndexError::Storage {
            path: self.meta.path.to_string(),
            source: object_store::Error::Generic {
                store: "index run upload",
                source: Box::new(e),
            },
        })?;
        self.meta.size = self.written;
        Ok(self.meta)
    }
}
