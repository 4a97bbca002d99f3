//! Sorted runs: the immutable files of the index, their format, writer, point search and the
//! sequential cursor compaction merges with.
//!
//! A run is `[block]* [meta] [footer]`. Blocks hold entries in key order, ~16 KiB each, with the
//! key prefix shared with the previous entry elided (LevelDB's "prefix compression"; it resets
//! at each block so any block decodes alone). An entry is `varint shared, varint suffix_len,
//! suffix, varint file+1 (0 = tombstone), varint position (absent for tombstones)`; a block
//! ends with its restart points (see `RESTART_INTERVAL`). The meta
//! section is what stays in memory while the run is live: each block's first key and length (a
//! sparse index: one key per block, not per row), the run's last key and its bloom filter. The
//! 16-byte footer (`meta offset u64, magic "CPKIRUN1"`) lets a run be checked alone; the manifest
//! also records the meta offset so open reads meta and footer with one ranged GET.

use std::sync::Arc;

use bytes::Bytes;
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::io::AsyncWriteExt;

use super::bloom::{key_hash, Bloom, Layout};
use super::memtable::{Slot, TOMBSTONE};
use super::IndexError;

/// Runs written with [`Layout::Blocked`] bloom filters. An older cdcd finds a bad footer in them
/// and rebuilds the index (a downgrade costs a rebuild, never a wrong answer).
const MAGIC: &[u8; 8] = b"CPKIRUN2";
/// Runs written before, with [`Layout::Spread`] filters: still read.
const MAGIC_SPREAD: &[u8; 8] = b"CPKIRUN1";
const FOOTER_LEN: u64 = 16;
/// Target uncompressed block size: a point lookup reads and scans one block.
const BLOCK_BYTES: usize = 16 * 1024;
/// Encoded blocks are handed to the upload in chunks of this size (bounded write memory).
const UPLOAD_CHUNK: usize = 1024 * 1024;
/// A compaction cursor reads this many bytes of consecutive blocks per GET.
const READ_CHUNK: u64 = 1024 * 1024;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(buf: &[u8], pos: &mut usize) -> Result<u64, &'static str> {
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

fn get_bytes<'a>(buf: &'a [u8], pos: &mut usize, len: u64) -> Result<&'a [u8], &'static str> {
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

#[derive(Debug, Clone, Copy)]
struct BlockRef {
    key_off: usize,
    key_len: usize,
    offset: u64,
    len: u64,
}

/// What is kept in memory of a live run: sparse block index, last key, bloom filter.
#[derive(Debug)]
pub(crate) struct RunMeta {
    pub(crate) id: u64,
    pub(crate) path: Path,
    pub(crate) entries: u64,
    /// Bytes of the whole file.
    pub(crate) size: u64,
    pub(crate) meta_offset: u64,
    first_keys: Vec<u8>,
    blocks: Vec<BlockRef>,
    last_key: Vec<u8>,
    bloom: Bloom,
}

impl RunMeta {
    fn first_key(&self, b: &BlockRef) -> &[u8] {
        self.first_keys
            .get(b.key_off..b.key_off + b.key_len)
            .unwrap_or_default()
    }

    pub(crate) fn may_contain(&self, hash: u64) -> bool {
        self.bloom.may_contain(hash)
    }

    /// The only block that can hold `key`, if any.
    pub(crate) fn candidate_block(&self, key: &[u8]) -> Option<usize> {
        if self.blocks.is_empty() || key > self.last_key.as_slice() {
            return None;
        }
        let after = self.blocks.partition_point(|b| self.first_key(b) <= key);
        after.checked_sub(1)
    }

    pub(crate) fn block_range(&self, block: usize) -> Option<std::ops::Range<u64>> {
        self.blocks.get(block).map(|b| b.offset..b.offset + b.len)
    }

    /// Bytes this run keeps in memory.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.first_keys.capacity()
            + self.blocks.capacity() * std::mem::size_of::<BlockRef>()
            + self.last_key.capacity()
            + self.bloom.memory_bytes()
    }

    fn encode_meta(&self, out: &mut Vec<u8>) {
        put_varint(out, self.blocks.len() as u64);
        for b in &self.blocks {
            put_varint(out, b.key_len as u64);
            out.extend_from_slice(self.first_key(b));
            put_varint(out, b.len);
        }
        put_varint(out, self.last_key.len() as u64);
        out.extend_from_slice(&self.last_key);
        put_varint(out, self.entries);
        put_varint(out, u64::from(self.bloom.probes()));
        put_varint(out, self.bloom.words().len() as u64);
        for w in self.bloom.words() {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }

    /// Reads the meta section of a run written by [`RunWriter`].
    pub(crate) async fn load(
        store: &Arc<dyn ObjectStore>,
        path: Path,
        id: u64,
        size: u64,
        meta_offset: u64,
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
        let layout = match footer.get(8..16) {
            Some(m) if m == MAGIC.as_slice() => Layout::Blocked,
            Some(m) if m == MAGIC_SPREAD.as_slice() => Layout::Spread,
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
            first_keys: Vec::new(),
            blocks: Vec::new(),
            last_key: Vec::new(),
            bloom: Bloom::from_parts(Vec::new(), 0, layout),
        };
        decode_meta(meta, meta_offset, &mut run).map_err(corrupt)?;
        Ok(run)
    }
}

fn decode_meta(meta: &[u8], meta_offset: u64, run: &mut RunMeta) -> Result<(), &'static str> {
    let mut pos = 0;
    let count = get_varint(meta, &mut pos)?;
    let mut offset = 0u64;
    for _ in 0..count {
        let key_len = get_varint(meta, &mut pos)?;
        let key = get_bytes(meta, &mut pos, key_len)?;
        let len = get_varint(meta, &mut pos)?;
        run.blocks.push(BlockRef {
            key_off: run.first_keys.len(),
            key_len: key.len(),
            offset,
            len,
        });
        run.first_keys.extend_from_slice(key);
        offset = offset.checked_add(len).ok_or("block lengths overflow")?;
    }
    if offset != meta_offset {
        return Err("block lengths do not add up to the meta offset");
    }
    let last_len = get_varint(meta, &mut pos)?;
    run.last_key = get_bytes(meta, &mut pos, last_len)?.to_vec();
    run.entries = get_varint(meta, &mut pos)?;
    let probes = u32::try_from(get_varint(meta, &mut pos)?).map_err(|_| "bad probe count")?;
    let words = get_varint(meta, &mut pos)?;
    let raw = get_bytes(
        meta,
        &mut pos,
        words.checked_mul(8).ok_or("bad bloom size")?,
    )?;
    let words = raw
        .chunks_exact(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect();
    run.bloom = Bloom::from_parts(words, probes, run.bloom.layout());
    Ok(())
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
    prev_key: Vec<u8>,
    written: u64,
    meta: RunMeta,
}

impl RunWriter {
    pub(crate) fn new(
        store: &Arc<dyn ObjectStore>,
        path: Path,
        id: u64,
        expected_keys: u64,
    ) -> RunWriter {
        RunWriter {
            out: BufWriter::with_capacity(Arc::clone(store), path.clone(), 2 * UPLOAD_CHUNK),
            pending: Vec::with_capacity(UPLOAD_CHUNK + BLOCK_BYTES),
            block: Vec::with_capacity(BLOCK_BYTES + 256),
            restarts: Vec::new(),
            block_entries: 0,
            prev_key: Vec::new(),
            written: 0,
            meta: RunMeta {
                id,
                path,
                entries: 0,
                size: 0,
                meta_offset: 0,
                first_keys: Vec::new(),
                blocks: Vec::new(),
                last_key: Vec::new(),
                bloom: Bloom::with_capacity(expected_keys),
            },
        }
    }

    /// Appends an entry; keys must come in strictly increasing order.
    pub(crate) async fn add(&mut self, key: &[u8], slot: Slot) -> Result<(), IndexError> {
        if self.block.is_empty() {
            self.meta.blocks.push(BlockRef {
                key_off: self.meta.first_keys.len(),
                key_len: key.len(),
                offset: self.written + self.pending.len() as u64,
                len: 0,
            });
            self.meta.first_keys.extend_from_slice(key);
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
        } else {
            put_varint(&mut self.block, u64::from(slot.file) + 1);
            put_varint(&mut self.block, slot.position);
        }
        self.prev_key.clear();
        self.prev_key.extend_from_slice(key);
        self.meta.bloom.insert(key_hash(key));
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
        self.block_entries = 0;
        if let Some(b) = self.meta.blocks.last_mut() {
            b.len = self.block.len() as u64;
        }
        self.pending.extend_from_slice(&self.block);
        self.block.clear();
        if self.pending.len() >= UPLOAD_CHUNK {
            self.upload_pending().await?;
        }
        Ok(())
    }

    async fn upload_pending(&mut self) -> Result<(), IndexError> {
        let chunk = Bytes::copy_from_slice(&self.pending);
        self.written += chunk.len() as u64;
        self.pending.clear();
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
        self.meta.meta_offset = self.written + self.pending.len() as u64;
        let mut tail = std::mem::take(&mut self.pending);
        self.meta.encode_meta(&mut tail);
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

/// Reads a run's entries in key order, a chunk of consecutive blocks per GET.
pub(crate) struct RunCursor {
    store: Arc<dyn ObjectStore>,
    run: Arc<RunMeta>,
    next_block: usize,
    /// Blocks fetched and not yet decoded, as (bytes of one block).
    queued: std::collections::VecDeque<Bytes>,
    block: Bytes,
    pos: usize,
    key: Vec<u8>,
    slot: Slot,
}

impl RunCursor {
    pub(crate) fn new(store: Arc<dyn ObjectStore>, run: Arc<RunMeta>) -> RunCursor {
        RunCursor {
            store,
            run,
            next_block: 0,
            queued: Default::default(),
            block: Bytes::new(),
            pos: 0,
            key: Vec::new(),
            slot: Slot::REMOVED,
        }
    }

    pub(crate) fn key(&self) -> &[u8] {
        &self.key
    }

    pub(crate) fn slot(&self) -> Slot {
        self.slot
    }

    /// Moves to the next entry; false at the end of the run.
    pub(crate) async fn advance(&mut self) -> Result<bool, IndexError> {
        loop {
            if self.pos < self.block.len() {
                let path = &self.run.path;
                self.slot =
                    decode_entry(&self.block, &mut self.pos, &mut self.key).map_err(|detail| {
                        IndexError::Corrupt {
                            path: path.to_string(),
                            detail: detail.to_owned(),
                        }
                    })?;
                return Ok(true);
            }
            if let Some(next) = self.queued.pop_front() {
                let data_len = split_block(&next)
                    .map_err(|detail| IndexError::Corrupt {
                        path: self.run.path.to_string(),
                        detail: detail.to_owned(),
                    })?
                    .0
                    .len();
                self.block = next.slice(..data_len);
                self.pos = 0;
                self.key.clear();
                continue;
            }
            if !self.fetch().await? {
                return Ok(false);
            }
        }
    }

    async fn fetch(&mut self) -> Result<bool, IndexError> {
        let Some(first) = self.run.block_range(self.next_block) else {
            return Ok(false);
        };
        let mut end = first.end;
        let mut last = self.next_block;
        while let Some(r) = self.run.block_range(last + 1) {
            if r.end - first.start > READ_CHUNK {
                break;
            }
            end = r.end;
            last += 1;
        }
        let bytes = self
            .store
            .get_range(&self.run.path, first.start..end)
            .await
            .map_err(|source| IndexError::Storage {
                path: self.run.path.to_string(),
                source,
            })?;
        for b in self.next_block..=last {
            let r = self.run.block_range(b).unwrap_or(0..0);
            let (s, e) = (
                (r.start - first.start) as usize,
                (r.end - first.start) as usize,
            );
            if e > bytes.len() || s > e {
                return Err(IndexError::Corrupt {
                    path: self.run.path.to_string(),
                    detail: "short read of a block".into(),
                });
            }
            self.queued.push_back(bytes.slice(s..e));
        }
        self.next_block = last + 1;
        Ok(true)
    }
}
