//! Batched lookups: memtable first, then runs newest → oldest, reading each wanted block once.
//!
//! For each run, the keys still unresolved are filtered by the run's bloom filter and placed in
//! their candidate block by the sparse index; cached blocks are searched at once, the rest are
//! read a bounded wave at a time, so the memory a batch needs does not grow with the batch or the
//! table. How the missing blocks are read depends on the store ([`BlockReads`]).

use std::ops::Range;
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::ObjectStoreExt;

use super::bloom::key_hash;
use super::meta::RunMeta;
use super::run::search_block;
use super::{IndexError, PrimaryKeyIndex, RowLocation, LOOKUP_PARALLEL, LOOKUP_SPAN};

/// How a lookup reads the blocks it misses in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BlockReads {
    /// Spans of nearby blocks up to [`LOOKUP_SPAN`] bytes, the blocks between wanted ones
    /// included, one ranged GET each and [`LOOKUP_PARALLEL`] at a time: an object store, where a
    /// request costs more than the bytes it returns.
    #[default]
    Spans,
    /// Exactly the wanted blocks (adjacent ones together), a wave of up to
    /// `LOOKUP_SPAN * LOOKUP_PARALLEL` bytes per `get_ranges` call (on local disk: one open and
    /// positioned reads). Local disk, where the bytes cost more than the requests: a batch of
    /// random keys wants about one block in seven of a large run, and spans read the whole run
    /// (~1 GB for 100M keys) at every commit, which took 0.6-1.8 s of a 9,000-row commit
    /// (docs/performance.md, "A 100M-row table"). A wave shared out over 8 calls at once took
    /// 10-15 % off the reads and raised the peak RSS of `postgres::memory_budget` past its margin
    /// (the read buffers spread over more of jemalloc's arenas): not kept.
    Exact,
}

impl PrimaryKeyIndex {
    /// The current locations of `keys`, in order (`None`: the key has no row).
    /// Reads at most one block per run per distinct block wanted; cancel safe (reads only).
    pub async fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<RowLocation>>, IndexError> {
        let mut stats = LookupStats::start();
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
            stats.runs += 1;
            let mut misses = Vec::new();
            {
                let owner = self.charges.owner();
                let mut cache = self.charges.memory().cache();
                for group in need.chunk_by(|a, b| a.0 == b.0) {
                    let Some(&(block, _)) = group.first() else {
                        continue;
                    };
                    match cache.get((owner, run.id, block)) {
                        Some(bytes) => {
                            stats.cached_blocks += 1;
                            self.resolve_in(run, &bytes, group, &mut r)?
                        }
                        None => misses.push(group),
                    }
                }
            }
            let spans = spans(run, &misses, self.block_reads);
            stats.read_blocks += misses.len();
            for wave in waves(&spans, self.block_reads) {
                let reading = Instant::now();
                let fetched =
                    self.read_wave(run, wave)
                        .await
                        .map_err(|source| IndexError::Storage {
                            path: run.path.to_string(),
                            source,
                        })?;
                stats.read(reading);
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
        stats.log(keys.len());
        Ok(r.out)
    }

    /// The bytes of each span of `wave`: a GET each, at once ([`BlockReads::Spans`]), or one
    /// `get_ranges` call ([`BlockReads::Exact`]).
    async fn read_wave(
        &self,
        run: &RunMeta,
        wave: &[Span],
    ) -> Result<Vec<Bytes>, object_store::Error> {
        match self.block_reads {
            BlockReads::Spans => {
                let reads = wave
                    .iter()
                    .map(|span| self.store.get_range(&run.path, span.bytes.clone()));
                futures::future::try_join_all(reads).await
            }
            BlockReads::Exact => {
                let ranges: Vec<Range<u64>> = wave.iter().map(|s| s.bytes.clone()).collect();
                self.store.get_ranges(&run.path, &ranges).await
            }
        }
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

/// What one batch lookup did, logged at debug level (`CDCD_LOG=cdcd::sinks::pk_index::lookup=debug`):
/// the commits of a 100M-row table spent most of their time here (docs/performance.md).
struct LookupStats {
    started: Instant,
    /// Runs visited, newest first, until every key was answered (a key found in a newer run is
    /// not looked for in the older ones).
    runs: usize,
    cached_blocks: usize,
    read_blocks: usize,
    waves: usize,
    reading: Duration,
}

impl LookupStats {
    fn start() -> LookupStats {
        LookupStats {
            started: Instant::now(),
            runs: 0,
            cached_blocks: 0,
            read_blocks: 0,
            waves: 0,
            reading: Duration::ZERO,
        }
    }

    /// A wave read since `since` arrived.
    fn read(&mut self, since: Instant) {
        self.waves += 1;
        self.reading += since.elapsed();
    }

    fn log(&self, keys: usize) {
        tracing::debug!(
            keys,
            runs = self.runs,
            cached_blocks = self.cached_blocks,
            read_blocks = self.read_blocks,
            waves = self.waves,
            read_ms = self.reading.as_secs_f64() * 1000.0,
            total_ms = self.started.elapsed().as_secs_f64() * 1000.0,
            "index lookup"
        );
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

/// Groups wanted blocks (sorted) into reads of at most [`LOOKUP_SPAN`] bytes; a gap between two
/// wanted blocks is read too only if the span stays within that size ([`BlockReads::Spans`]), or
/// never ([`BlockReads::Exact`]: only adjacent blocks share a read).
fn spans(run: &RunMeta, misses: &[&[(usize, usize)]], reads: BlockReads) -> Vec<Span> {
    let mut out: Vec<Span> = Vec::new();
    for (g, group) in misses.iter().enumerate() {
        let Some(range) = group.first().and_then(|(b, _)| run.block_range(*b)) else {
            continue;
        };
        let joins = |span: &Span| {
            range.end.saturating_sub(span.bytes.start) <= LOOKUP_SPAN
                && (reads == BlockReads::Spans || range.start <= span.bytes.end)
        };
        match out.last_mut() {
            Some(span) if joins(span) => {
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

/// The spans read together: [`LOOKUP_PARALLEL`] GETs ([`BlockReads::Spans`]), or spans of up to
/// `LOOKUP_SPAN * LOOKUP_PARALLEL` bytes together ([`BlockReads::Exact`]); either way at most
/// that many bytes at once.
fn waves(spans: &[Span], reads: BlockReads) -> Vec<&[Span]> {
    if reads == BlockReads::Spans {
        return spans.chunks(LOOKUP_PARALLEL).collect();
    }
    let limit = LOOKUP_SPAN * LOOKUP_PARALLEL as u64;
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, span) in spans.iter().enumerate() {
        let len = span.bytes.end.saturating_sub(span.bytes.start);
        if i > start && bytes + len > limit {
            out.extend(spans.get(start..i));
            (start, bytes) = (i, 0);
        }
        bytes += len;
    }
    out.extend(spans.get(start..));
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;
    use object_store::path::Path;
    use object_store::ObjectStore;

    use super::*;
    use crate::sinks::pk_index::IndexChange;
    use crate::sinks::pk_index::IndexOp;

    /// A run of 200,000 keys over many blocks, persisted.
    async fn one_run() -> PrimaryKeyIndex {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let mut index = PrimaryKeyIndex::open(store, Path::from("idx"), 1 << 24)
            .await
            .unwrap();
        let file: Arc<str> = Arc::from("f");
        let keys: Vec<[u8; 8]> = (0..200_000u64).map(|k| k.to_be_bytes()).collect();
        index
            .apply(keys.iter().enumerate().map(|(i, k)| IndexChange {
                key: k,
                op: IndexOp::Upsert(RowLocation {
                    file: Arc::clone(&file),
                    position: i as u64,
                }),
            }))
            .unwrap();
        index.persist(1).await.unwrap();
        index
    }

    /// Looks `keys` up by spans, then by exact reads with the runs' blocks out of the cache, and
    /// checks that both find every key at the same place.
    async fn spans_then_exact(index: &mut PrimaryKeyIndex, keys: &[[u8; 8]]) {
        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
        let by_spans = index.get_many(&refs).await.unwrap();
        index.set_block_reads(BlockReads::Exact);
        let owner = index.charges.owner();
        for run in &index.runs {
            index.charges.memory().cache().forget_run(owner, run.id);
        }
        let exact = index.get_many(&refs).await.unwrap();
        assert_eq!(by_spans, exact);
        assert!(exact.iter().all(|l| l.is_some()));
    }

    /// Blocks 0, 5, 6 and 20 wanted: spans read the blocks between them too, exact reads only
    /// the wanted ones (5 and 6 together), and both find the same keys.
    #[tokio::test]
    async fn exact_reads_skip_the_blocks_between_wanted_ones() {
        let mut index = one_run().await;
        let run = Arc::clone(&index.runs[0]);
        assert!(run.blocks.len() > 20, "{} blocks", run.blocks.len());
        let wanted: Vec<[(usize, usize); 1]> = [0, 5, 6, 20].map(|b| [(b, 0)]).to_vec();
        let misses: Vec<&[(usize, usize)]> = wanted.iter().map(|g| g.as_slice()).collect();
        let range = |b: usize| run.block_range(b).unwrap();
        let read =
            |spans: &[Span]| -> Vec<Range<u64>> { spans.iter().map(|s| s.bytes.clone()).collect() };
        assert_eq!(
            read(&spans(&run, &misses, BlockReads::Spans)),
            vec![range(0).start..range(20).end]
        );
        assert_eq!(
            read(&spans(&run, &misses, BlockReads::Exact)),
            vec![range(0), range(5).start..range(6).end, range(20)]
        );
        let keys: Vec<[u8; 8]> = (0..20_000u64)
            .step_by(97)
            .map(|k| k.to_be_bytes())
            .collect();
        spans_then_exact(&mut index, &keys).await;
    }

    /// Exact waves hold at most `LOOKUP_SPAN * LOOKUP_PARALLEL` bytes (one span alone may be
    /// larger), and every span once, in order.
    #[test]
    fn exact_waves_are_bounded_by_bytes() {
        let span = |start: u64, len: u64| Span {
            bytes: start..start + len,
            groups: 0..1,
        };
        let mib = 1024 * 1024;
        let spans = vec![
            span(0, 3 * mib),
            span(4 * mib, 3 * mib),
            span(8 * mib, 3 * mib),
            span(12 * mib, 9 * mib),
            span(22 * mib, mib),
        ];
        let exact = waves(&spans, BlockReads::Exact);
        let lens: Vec<usize> = exact.iter().map(|w| w.len()).collect();
        assert_eq!(lens, vec![2, 1, 1, 1]);
        assert_eq!(waves(&spans, BlockReads::Spans).len(), 1);
    }
}
