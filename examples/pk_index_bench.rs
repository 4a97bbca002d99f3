//! Benchmark of the primary-key index (`src/sinks/index/`): builds an index of N keys (8- and
//! 16-byte keys) on local disk the way a sink would (commits of 100,000 rows, each applied then
//! persisted), then measures random batched lookups, peak RSS, on-disk size and reopen time.
//! Prints; asserts nothing.
//!
//! `cargo run --release --example pk_index_bench [-- ROWS [BUDGET_MIB]]` (default 10,000,000, 64).
//!
//! `cargo run --release --example pk_index_bench -- copy [ROWS]` (default 5,000,000) instead
//! replays what an initial copy (issue 7, `bench/pg_snapshot.py`) does to the index: int8 keys
//! (`arrow_row` encoding, 9 bytes) from 4 chunk readers, each walking its quarter of the key
//! range in order, arriving as interleaved batches of 8,192 rows; commits of 1,000,000 rows (one
//! data file each) applied in chunks of 16,384 rows with a flush whenever the memtable is full,
//! then persisted, with the sink's 64 MiB budget. Prints wall and CPU seconds of the whole copy.

use std::sync::Arc;
use std::time::Instant;

use cdcd::sinks::pk_index::{IndexChange, IndexOp, PrimaryKeyIndex, RowLocation};
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::ObjectStore;

const COMMIT_ROWS: u64 = 100_000;
const ROWS_PER_FILE: u64 = 1_000_000;
const LOOKUP_BATCH: usize = 10_000;
const LOOKUP_BATCHES: usize = 50;

/// A bijective scramble so keys arrive in random order, as primary keys of a busy table do.
fn scramble(i: u64) -> u64 {
    let mut h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^= h >> 32;
    h.wrapping_mul(0xBF58_476D_1CE4_E5B9)
}

fn key(i: u64, len: usize, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&scramble(i).to_be_bytes());
    if len == 16 {
        out.extend_from_slice(&i.to_be_bytes());
    }
}

fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn reset_hwm() {
    // Writing 5 to clear_refs resets the peak RSS (proc(5)).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

const COPY_COMMIT_ROWS: u64 = 1_000_000;
const COPY_READERS: u64 = 4;
const COPY_BATCH: u64 = 8_192;
const COPY_APPLY_CHUNK: usize = 16 * 1024;

/// User + system CPU seconds of this process so far (proc(5): fields 14 and 15, in ticks).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Fields 14 and 15 counted from 1 with the first two (pid, comm) cut off.
    (ticks(11) + ticks(12)) / 100.0
}

/// The `arrow_row` encoding of a non-null int8: a validity byte, then the value big-endian with
/// the sign bit flipped (so the bytes sort like the numbers).
fn int8_key(v: i64, out: &mut Vec<u8>) {
    out.push(1);
    out.extend_from_slice(&((v as u64) ^ (1 << 63)).to_be_bytes());
}

async fn copy(rows: u64) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(dir.path())?);
    let root = Path::from("_cdcd/p/index/ns/t");
    let mut index = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), 64 << 20).await?;
    let per_reader = rows.div_ceil(COPY_READERS);
    // Each reader's next key; batches are taken round-robin, as the copy's channel delivers them.
    let mut next: Vec<u64> = (0..COPY_READERS).map(|r| r * per_reader).collect();
    let ends: Vec<u64> = (0..COPY_READERS)
        .map(|r| ((r + 1) * per_reader).min(rows))
        .collect();
    let (wall, cpu) = (Instant::now(), cpu_seconds());
    let mut keys: Vec<u8> = Vec::new();
    let mut snapshot = 0i64;
    let mut reader = 0usize;
    let mut done = 0u64;
    while done < rows {
        keys.clear();
        let mut n = 0u64;
        while n < COPY_COMMIT_ROWS && done + n < rows {
            let r = reader % COPY_READERS as usize;
            reader += 1;
            let take = COPY_BATCH.min(ends[r] - next[r]).min(COPY_COMMIT_ROWS - n);
            for v in next[r]..next[r] + take {
                int8_key(v as i64, &mut keys);
            }
            next[r] += take;
            n += take;
        }
        snapshot += 1;
        let file = format!("file:///wh/ns/t/data/{snapshot:05}-00000.parquet");
        let rows_of: Vec<&[u8]> = keys.chunks_exact(9).collect();
        for (c, chunk) in rows_of.chunks(COPY_APPLY_CHUNK).enumerate() {
            let first = (c * COPY_APPLY_CHUNK) as u64;
            index.apply_file(
                &file,
                chunk
                    .iter()
                    .enumerate()
                    .map(|(j, k)| (*k, Some(first + j as u64))),
            )?;
            if index.needs_flush() {
                index.flush().await?;
            }
        }
        index.persist(snapshot).await?;
        done += n;
    }
    let (wall, cpu) = (wall.elapsed().as_secs_f64(), cpu_seconds() - cpu);
    let (runs, files) = index.stats();
    let disk: u64 = store
        .list(Some(&root))
        .map_ok(|m| m.size)
        .try_fold(0, |a, s| async move { Ok(a + s) })
        .await?;
    println!(
        "[copy] {rows} int8 keys, {snapshot} commits: {wall:.2}s wall, {cpu:.2} CPU-s ({:.0} rows/CPU-s); {runs} runs, {files} files, {:.1} MiB on disk, runs in memory {:.2} MiB",
        rows as f64 / cpu.max(1e-9),
        mib(disk as usize),
        mib(index.memory_usage().runs)
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("copy") {
        args.next();
        let rows = args
            .next()
            .map(|a| a.parse())
            .transpose()?
            .unwrap_or(5_000_000);
        return copy(rows).await;
    }
    let rows: u64 = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(10_000_000);
    let budget_mib: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(64);
    let budget = budget_mib << 20;
    println!("rows={rows} budget={budget_mib} MiB commit={COMMIT_ROWS} rows");
    for key_len in [8usize, 16] {
        let dir = tempfile::tempdir()?;
        let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(dir.path())?);
        let root = Path::from("ns/t/metadata/cdcd-index");
        reset_hwm();
        let rss_before = vm_hwm_kib();
        let mut index = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), budget).await?;
        let files: Vec<Arc<str>> = (0..rows.div_ceil(ROWS_PER_FILE))
            .map(|f| Arc::from(format!("file:///wh/ns/t/data/00000-{f}-3f1c9a2e.parquet")))
            .collect();
        let mut keys_buf: Vec<u8> = Vec::new();
        let start = Instant::now();
        let mut snapshot = 0;
        let mut i = 0;
        while i < rows {
            let end = (i + COMMIT_ROWS).min(rows);
            keys_buf.clear();
            let mut k = Vec::new();
            for j in i..end {
                key(j, key_len, &mut k);
                keys_buf.extend_from_slice(&k);
            }
            let changes = keys_buf
                .chunks_exact(key_len)
                .zip(i..end)
                .map(|(k, j)| IndexChange {
                    key: k,
                    op: IndexOp::Upsert(RowLocation {
                        file: Arc::clone(&files[(j / ROWS_PER_FILE) as usize]),
                        position: j % ROWS_PER_FILE,
                    }),
                });
            index.apply(changes)?;
            snapshot += 1;
            index.persist(snapshot).await?;
            i = end;
        }
        let build = start.elapsed();
        let (runs, nfiles) = index.stats();
        println!(
            "[{key_len}-byte keys] apply+persist: {:.1}s, {:.0} rows/s ({snapshot} persists, {runs} runs, {nfiles} data files)",
            build.as_secs_f64(),
            rows as f64 / build.as_secs_f64()
        );

        let mut seed = 0x1234_5678_9ABC_DEF1u64;
        let mut lookup_keys: Vec<u8> = Vec::with_capacity(LOOKUP_BATCH * key_len);
        let mut k = Vec::new();
        let start = Instant::now();
        let mut found = 0usize;
        for _ in 0..LOOKUP_BATCHES {
            lookup_keys.clear();
            for _ in 0..LOOKUP_BATCH {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                key(seed % rows, key_len, &mut k);
                lookup_keys.extend_from_slice(&k);
            }
            let refs: Vec<&[u8]> = lookup_keys.chunks_exact(key_len).collect();
            found += index.get_many(&refs).await?.iter().flatten().count();
        }
        let lookups = (LOOKUP_BATCH * LOOKUP_BATCHES) as f64;
        let t = start.elapsed().as_secs_f64();
        println!(
            "[{key_len}-byte keys] random get_many ({LOOKUP_BATCH}/batch, cold then warm cache): {:.0} keys/s, {found} of {lookups} found",
            lookups / t
        );
        let usage = index.memory_usage();
        println!(
            "[{key_len}-byte keys] index memory: total {:.1} MiB (memtable {:.1}, block cache {:.1}, runs {:.1}, files {:.2})",
            mib(usage.total()),
            mib(usage.memtable),
            mib(usage.block_cache),
            mib(usage.runs),
            mib(usage.files)
        );
        println!(
            "[{key_len}-byte keys] peak RSS (VmHWM) {:.1} MiB (process before open: {:.1} MiB)",
            vm_hwm_kib() as f64 / 1024.0,
            rss_before as f64 / 1024.0
        );
        drop(index);
        let disk: u64 = store
            .list(Some(&root))
            .map_ok(|m| m.size)
            .try_fold(0, |a, s| async move { Ok(a + s) })
            .await?;
        println!(
            "[{key_len}-byte keys] on disk: {:.1} MiB ({:.1} bytes/key)",
            mib(disk as usize),
            disk as f64 / rows as f64
        );
        let start = Instant::now();
        let index = PrimaryKeyIndex::open(Arc::clone(&store), root.clone(), budget).await?;
        let reopen = start.elapsed();
        println!(
            "[{key_len}-byte keys] reopen (restart cost): {:.3}s, {:.1} MiB resident for runs",
            reopen.as_secs_f64(),
            mib(index.memory_usage().runs)
        );
        let start = Instant::now();
        lookup_keys.clear();
        for j in 0..LOOKUP_BATCH as u64 {
            key(scramble(j) % rows, key_len, &mut k);
            lookup_keys.extend_from_slice(&k);
        }
        let refs: Vec<&[u8]> = lookup_keys.chunks_exact(key_len).collect();
        let n = index.get_many(&refs).await?.iter().flatten().count();
        println!(
            "[{key_len}-byte keys] first batch after reopen: {LOOKUP_BATCH} keys in {:.3}s ({n} found)",
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn mib(b: usize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}
