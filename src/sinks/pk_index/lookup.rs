//! Batched lookups: memtable first, then runs newest → oldest, reading each wanted block once.
//!
//! For each run, the keys still unresolved are filtered by the run's bloom filter and placed in
//! their candidate block by the sparse index; cached blocks are searched at once, the rest are
//! read with one ranged GET per span of nearby blocks, a bounded wave of GETs at a time, so the
//! memory a batch needs does not grow with the batch or the table.

use std::ops::Range;

use bytes::Bytes;
use object_store::ObjectStoreExt;

use super::bloom::key_hash;
use super::meta::RunMeta;
use super::run::search_block;
use super::{IndexError, PrimaryKeyIndex, RowLocation, LOOKUP_PARALLEL, LOOKUP_SPAN};

impl PrimaryKeyIndex {
    /// The current locations of `keys`, in order (`None`: the key has no row).
    /// Reads at most one block per run per distinct block wanted; cancel safe (reads only).
    pub async fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<RowLocation>>, IndexError> {
        let mut out = vec![None; keys.len()];
        let hashes: Vec<u64> = keys.iter().map(|k| key_hash(k)).collect();
        let mut pending = Vec::new();
        for (i, (key, hash)) in keys.iter().zip(&hashes).enumerate() {
            match self.memtable.get(key, *hash) {
                Some(slot) => set(&mut out, i, self.files.resolve(slot)),
                None => pending.push(i),
            }
        }
        let mut r = Resolving {
            keys,
            out,
            next: Vec::new(),
            scratch: Vec::new(),
        };
        for run in &self.runs {
            if pending.is_empty() {
                break;
            }
            // (block, key index) of every key this run may hold.
            let mut need = Vec::new();
            r.next = Vec::new();
            for &i in &pending {
                let (Some(key), Some(hash)) = (keys.get(i), hashes.get(i)) else {
                    continue;
                };
                match run.candidate(key, *hash) {
                    Some(block) => need.push((block, i)),
                    None => r.next.push(i),
                }
            }
            need.sort_unstable();
            let mut misses = Vec::new();
            {
                let owner = self.charges.owner();
                let mut cache = self.charges.memory().cache();
                for group in need.chunk_by(|a, b| a.0 == b.0) {
                    let Some(&(block, _)) = group.first() else {
                        continue;
                    };
                    match cache.get((owner, run.id, block)) {
                        Some(bytes) => self.resolve_in(run, &bytes, group, &mut r)?,
                        None => misses.push(group),
                    }
                }
            }
            // Misses: consecutive blocks are read with one GET per span, a wave of spans at a time.
            let spans = spans(run, &misses);
            for wave in spans.chunks(LOOKUP_PARALLEL) {
                let reads = wave
                    .iter()
                    .map(|span| self.store.get_range(&run.path, span.bytes.clone()));
                let fetched = futures::future::try_join_all(reads)
                    .await
                    .map_err(|source| IndexError::Storage {
                        path: run.path.to_string(),
                        source,
                    })?;
                for (span, bytes) in wave.iter().zip(fetched) {
                    for group in misses.get(span.groups.clone()).unwrap_or_default() {
                        let Some(&(block, _)) = group.first() else {
                            continue;
                        };
                        let block_bytes = slice_block(run, block, span.bytes.start, &bytes)?;
                        self.charges
                            .memory()
                            .cache_block((self.charges.owner(), run.id, block), &block_bytes);
                        self.resolve_in(run, &block_bytes, group, &mut r)?;
                    }
                }
            }
            pending = std::mem::take(&mut r.next);
        }
        Ok(r.out)
    }

    /// Searches `block` of `run` for the keys of `group` (block, key index): a found key is
    /// answered, a missing one goes on to the next run.
    fn resolve_in(
        &self,
        run: &RunMeta,
        block: &[u8],
        group: &[(usize, usize)],
        r: &mut Resolving<'_>,
    ) -> Result<(), IndexError> {
        for &(_, i) in group {
            let key = r.keys.get(i).copied().unwrap_or_default();
            let found =
                search_block(block, key, &mut r.scratch).map_err(|detail| IndexError::Corrupt {
                    path: run.path.to_string(),
                    detail: detail.to_owned(),
                })?;
            match found {
                Some(slot) => set(&mut r.out, i, self.files.resolve(slot)),
                None => r.next.push(i),
            }
        }
        Ok(())
    }
}

/// One batch lookup in progress.
struct Resolving<'k> {
    keys: &'k [&'k [u8]],
    /// The answer per key so far.
    out: Vec<Option<RowLocation>>,
    /// Keys the current run does not hold: they go on to the next (older) run.
    next: Vec<usize>,
    /// Reused by block searches.
    scratch: Vec<u8>,
}

fn set(out: &mut [Option<RowLocation>], i: usize, value: Option<RowLocation>) {
    if let Some(slot) = out.get_mut(i) {
        *slot = value;
    }
}

/// One GET of consecutive wanted blocks: its byte range and the `misses` groups it serves.
struct Span {
    bytes: Range<u64>,
    groups: Range<usize>,
}

/// Groups wanted blocks (sorted) into GETs of at most [`LOOKUP_SPAN`] bytes; a gap between two
/// wanted blocks is read too only if the span stays within that size.
fn spans(run: &RunMeta, misses: &[&[(usize, usize)]]) -> Vec<Span> {
    let mut out: Vec<Span> = Vec::new();
    for (g, group) in misses.iter().enumerate() {
        let Some(range) = group.first().and_then(|(b, _)| run.block_range(*b)) else {
            continue;
        };
        match out.last_mut() {
            Some(span) if range.end.saturating_sub(span.bytes.start) <= LOOKUP_SPAN => {
                span.bytes.end = range.end;
                span.groups.end = g + 1;
            }
            _ => out.push(Span {
                bytes: range,
                groups: g..g + 1,
            }),
        }
    }
    out
}

fn slice_block(
    run: &RunMeta,
    block: usize,
    span_start: u64,
    bytes: &Bytes,
) -> Result<Bytes, IndexError> {
    let range = run.block_range(block).unwrap_or(0..0);
    let (s, e) = (
        range.start.saturating_sub(span_start) as usize,
        range.end.saturating_sub(span_start) as usize,
    );
    if e > bytes.len() || s > e {
        return Err(IndexError::Corrupt {
            path: run.path.to_string(),
            detail: format!("short read of block {block}"),
        });
    }
    Ok(bytes.slice(s..e))
}
