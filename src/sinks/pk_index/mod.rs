//! The primary-key index: encoded key → (data file, row position), persisted beside the table,
//! in bounded memory.
//!
//! Where it sits: a sink that writes deletion vectors (Iceberg format v3) must know, for every
//! update or delete of a committed row, which data file holds the row and at which position. The
//! sink encodes primary keys with `arrow_row::RowConverter` (so keys are opaque, order-preserving
//! bytes), asks [`PrimaryKeyIndex::get_many`] for a commit's keys in one batch, commits the table
//! snapshot, then [`PrimaryKeyIndex::apply`]s the new locations and removals and
//! [`PrimaryKeyIndex::persist`]s them, naming the snapshot they cover (a streaming sink every few
//! commits: [`PrimaryKeyIndex::persist_when_due`]).
//!
//! # Design: a small LSM tree of sorted runs
//!
//! A key design decision is that the index never holds the whole key set in memory: a 10M-row
//! table with 16-byte keys would need ~500 MB as a hash map, and tables grow without bound.
//! Instead:
//! - a **memtable** (`memtable.rs`) holds the changes applied since the last flush, in one byte
//!   arena (no allocation and no hashing per row), bounded by the memtables' share of the
//!   process's index memory ([`PrimaryKeyIndex::needs_flush`], `memory.rs`);
//! - a flush writes it as an immutable **sorted run** (`run.rs`) through `object_store`: ~16 KiB
//!   prefix-compressed blocks of (key, file id, position | tombstone), then a meta section
//!   (`meta.rs`) with, per block, its first and last key (a sparse index), stats (entries, file
//!   id range, tombstones) and its own bloom filter (`bloom.rs`, 10 bits/key, built when the
//!   block closes: run format `CPKIRUN3`; runs of the two older formats are still read), except
//!   in the oldest run, which holds most keys and whose filters would pass nearly every key the
//!   sink looks up (`RunWriter::without_filters`);
//! - only run metas stay in memory; a lookup checks the memtable, then runs newest → oldest:
//!   binary search of the sparse index, a probe of that block's filter, one block read (through
//!   an LRU **block cache**, `cache.rs`, one per process over every index, bounded by the other
//!   share less the run metas: `memory.rs`). Keys are
//!   compared in full, never by hash, so there are no false matches;
//! - data file paths are interned as `u32` ids (`files.rs`);
//! - **compaction** (`compaction/`: `pick.rs` chooses, `worker.rs` merges, `background.rs` runs
//!   the merge beside lookups and commits) merges runs size-tiered, so there are O(log n) runs,
//!   and drops tombstones when the oldest run takes part; the merge copies whole blocks with
//!   their filters where runs do not overlap (most of an initial copy's runs), and decodes and
//!   re-encodes entries only where they do;
//! - a **manifest** (`manifest.rs`), written create-if-absent with a rising sequence number, names
//!   the live runs, the file table and the covered table snapshot. Superseded manifests are
//!   deleted by [`PrimaryKeyIndex::open`]; runs no manifest names only once they are proven
//!   dead (below, "Two writers").
//!
//! Memory, over every index of the process ([`IndexMemory`], `memory.rs`): memtables (≤ their
//! share together, if callers flush when told) + one block cache + per run meta (1.25-1.3 bytes
//! per key of bloom filters, none in the oldest run; ~100 bytes plus two keys per 16 KiB block of
//! sparse index) + the file tables, the cache and the metas together ≤ the other share (the
//! cache shrinks as the metas grow, down to a floor). Only the filters and the sparse index grow with the tables;
//! see the numbers below (measured when each index had its own 64 MiB budget).
//!
//! Alternatives rejected: a full in-memory map (unbounded); 8-byte key hashes (collisions would
//! silently delete the wrong row); a per-file key column read at restart (a restart would reread
//! every data file, which is what the index exists to avoid).
//!
//! # Recovery contract
//!
//! The table commit is the truth. The sink persists the index *after* the table commit, with that
//! commit's snapshot id (or a later one); apply only changes of committed snapshots. After a
//! crash between the two,
//! [`PrimaryKeyIndex::covered_snapshot`] is older than the table's current snapshot: the sink
//! reads the key columns of the data files added (and the deletes committed) after the covered
//! snapshot, feeds them to [`PrimaryKeyIndex::apply`] in commit order, and persists. When the
//! covered snapshot is not an ancestor of the table's current one (table recreated, or expired
//! past it) or open reports [`IndexError::Corrupt`], the sink calls [`PrimaryKeyIndex::clear`] and
//! rebuilds from every live data file. A `persist` that fails leaves the in-memory state intact;
//! the next `persist` retries it. A run the manifest names but storage no longer has is
//! corruption too (open reports [`IndexError::Corrupt`]); [`PrimaryKeyIndex::reset_as`] then
//! starts an empty index past the broken manifest, which the sink rebuilds from the table.
//!
//! # Two writers (a fenced holder and its successor)
//!
//! One cdcd writes a pipeline's index at a time (the lease), but a holder that lost the lease
//! may still have a write in flight (`storage/fence/mod.rs` says how small that window is). Two rules
//! keep that from breaking the successor's index:
//! - **a run no manifest names is deleted only after a manifest written by this process is
//!   durable** (it joins the obsolete files of the next `persist`), never at open. An unnamed
//!   run may be an older holder's, written but not yet named; that holder names a run only in
//!   the manifest right after the one it read or wrote, and once the successor's manifest has
//!   that sequence (or a later one) every such attempt fails as a conflict. Until then the
//!   run stays: if the older holder's manifest lands first, the successor's persist conflicts,
//!   and its next open reads that manifest and finds every run it names;
//! - **run ids are allocated per lease epoch**: a holder of epoch `e` allocates from at least
//!   `e * 2^32`, so an older holder (its ids below that) and its successor never write the same
//!   run file.
//!
//! # Measured (examples/pk_index_bench.rs, release, 2 shared cores, local disk)
//!
//! 10,000,000 keys in random order, applied as 100 commits of 100,000 rows (each `apply` then
//! `persist`, compactions included), 10 data files, memory budget 64 MiB:
//!
//! | key   | apply+persist | random get_many (10k/batch) | on disk            | runs | reopen  |
//! |-------|---------------|-----------------------------|--------------------|------|---------|
//! | 8 B   | 623k rows/s   | 154k keys/s                 | 129 MiB (13.5 B/key) | 5  | 9 ms    |
//! | 16 B  | 565k rows/s   | 108k keys/s                 | 205 MiB (21.5 B/key) | 4  | 4 ms    |
//!
//! Memory of a 10M-row table: run metas 12.4 MiB (8 B keys) / 12.9 MiB (16 B keys), i.e. the
//! 1.25 B/key bloom filters plus ~0.5 MiB of sparse index; the rest is the budget (memtable ≤ 32
//! MiB, block cache ≤ 32 MiB, both full at the end of the run). Process peak RSS (VmHWM, whole
//! benchmark) was 145 MiB for 8 B keys and 180 MiB after the 16 B pass: beyond the index's own
//! ~53 MiB come transient merge and lookup buffers (≤ 1 MiB per merged run, ≤ 8 MiB per lookup
//! wave, 2 MiB upload buffer) and glibc arenas that keep freed memory: rerun with
//! `MALLOC_ARENA_MAX=1`, peak RSS was 69.5 MiB (8 B keys) and 84.5 MiB (16 B, after the 8 B
//! pass), lookups ~15-25% slower (clippy ran alongside). The restart cost is the
//! reopen (milliseconds, independent of data files) plus a cold block cache: the first 10,000
//! random lookups after reopen took 67 ms (8 B) / 81 ms (16 B) on local disk. Not measured: S3,
//! where each block miss is a ranged GET (~10-30 ms) and waves of 8 GETs run in parallel.
//!
//! The initial copy (`pk_index_bench -- copy 4000000`: int8 keys from 4 chunk readers, commits
//! of 1M rows, 64 MiB budget; issue 7): whole-run filters, a hashed memtable and entry-by-entry
//! merges took 35.1 CPU-s; per-block filters, verbatim block copies and the unhashed memtable
//! 7.7 CPU-s, same on-disk size (34.4 MiB). Both measured on a *debug* build (load 8-12, the
//! release build was not ready in time for this bench), so read the ratio, not the figures.
//! End to end (`bench/pg_snapshot.py --targets dv`, release, 5M rows, load 0.8): cdcd 7.8 and
//! 8.2 CPU-s, 0.48× the binary COPY's rate, against 11.6-13.7 CPU-s (0.35-0.38×) before.
//! The table above predates `CPKIRUN3` (lookups now probe a block's filter after the sparse
//! index: same work, smaller filter).
//!
//! Where a restart spends: one LIST, one GET of the manifest, one ranged GET per run for its
//! meta (blooms + sparse index); no data file and no run block is read.

mod bloom;
mod cache;
mod compaction;
mod cursor;
mod files;
#[cfg(test)]
mod format_tests;
mod lookup;
mod manifest;
mod memory;
mod memtable;

mod meta;
mod prepared;
mod run;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
#[cfg(test)]
use object_store::PutPayload;
use object_store::{ObjectStore, ObjectStoreExt};

use self::files::FileTable;
pub use self::lookup::BlockReads;
use self::manifest::{classify, manifest_path, run_path, Manifest, Name, RunEntry, FORMAT};
use self::memory::Charges;
pub use self::memory::IndexMemory;
use self::memtable::{MemTable, Slot};
use self::meta::RunMeta;
pub use self::prepared::{InstallError, PreparedRuns, Reservation};
use self::run::RunWriter;
use crate::storage::{put_create, Created};

/// Runs a flush leaves unmerged (a persist starts merging them by the policy). Flushes between two
/// persists are an initial copy's (or a large transaction's): each makes a run of a
/// memtable's worth (~1.3M int8 keys at the default budget), all of one size, and merging
/// them at every flush (the policy is a binary counter) rewrote each key once per doubling of
/// the index: ~3 times over a 10M-row copy, ~6 over 100M rows. Merged 17 at a time, the first
/// four doublings cost one rewrite. The runs stay few enough for a lookup meanwhile (one
/// sparse-index search and filter probe per run), and a merge reads a bounded chunk per run
/// (`cursor.rs`).
pub(crate) const FLUSHED_RUNS: usize = 16;

/// Where a row lives: a data file (as the sink named it) and the row's 0-based position in it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RowLocation {
    pub file: Arc<str>,
    pub position: u64,
}

/// What happened to a key in a committed snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexOp {
    /// The key's current row is now at this location (insert, update, or rewrite).
    Upsert(RowLocation),
    /// The key has no row any more (delete).
    Remove,
}

/// One change to the index; `key` is the `arrow_row` encoding of the primary key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexChange<'a> {
    pub key: &'a [u8],
    pub op: IndexOp,
}

/// Bytes the index holds in memory, by part.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    pub memtable: usize,
    pub block_cache: usize,
    /// Sparse block indexes and bloom filters of the live runs.
    pub runs: usize,
    pub files: usize,
}

impl MemoryUsage {
    pub fn total(&self) -> usize {
        self.memtable + self.block_cache + self.runs + self.files
    }
}

/// The index failed. Storage and corruption errors name the object.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("primary-key index storage error at {path}: {source}")]
    Storage {
        path: String,
        #[source]
        source: object_store::Error,
    },
    #[error("primary-key index file {path} is corrupt: {detail}; clear the index and rebuild it from the table")]
    Corrupt { path: String, detail: String },
    #[error("primary-key index manifest {path} was written by someone else first; is a second cdcd running on this pipeline?")]
    Conflict { path: String },
    #[error("primary-key index ran out of file ids (2^32 - 1 data files); clear and rebuild it")]
    FileIdsExhausted,
}

impl IndexError {
    /// A short label for `cdcd_errors_total{kind}`.
    pub fn kind(&self) -> &'static str {
        match self {
            IndexError::Storage { .. } => "storage",
            IndexError::Corrupt { .. } => "corrupt",
            IndexError::Conflict { .. } => "commit_conflict",
            IndexError::FileIdsExhausted => "index_full",
        }
    }
}

/// Bytes of consecutive blocks one lookup GET may span, and GETs in flight per batch: together
/// they bound the transient memory of a `get_many` (8 MiB) whatever the batch size.
const LOOKUP_SPAN: u64 = 1024 * 1024;
const LOOKUP_PARALLEL: usize = 8;
/// Run ids of lease epoch `e` start at `e * RUN_ID_EPOCH_STRIDE` (module doc, "Two writers").
const RUN_ID_EPOCH_STRIDE: u64 = 1 << 32;

/// The files under an index root, classified, and the newest manifest's sequence.
struct Listing {
    names: Vec<(Path, Name)>,
    latest: Option<u64>,
}

impl Listing {
    async fn read(store: &Arc<dyn ObjectStore>, root: &Path) -> Result<Listing, IndexError> {
        let listed: Vec<_> = store
            .list(Some(root))
            .try_collect()
            .await
            .map_err(|source| IndexError::Storage {
                path: root.to_string(),
                source,
            })?;
        let names: Vec<(Path, Name)> = listed
            .into_iter()
            .map(|meta| {
                let name = meta
                    .location
                    .filename()
                    .map(classify)
                    .unwrap_or(Name::Other);
                (meta.location, name)
            })
            .collect();
        let latest = names
            .iter()
            .filter_map(|(path, n)| match n {
                Name::Manifest(seq) if *path == manifest_path(root, *seq) => Some(*seq),
                _ => None,
            })
            .max();
        Ok(Listing { names, latest })
    }
}

/// The primary-key index of one table. Single writer: one cdcd per pipeline (the lease; see
/// "Two writers" in the module doc for a fenced holder's writes still in flight).
pub struct PrimaryKeyIndex {
    store: Arc<dyn ObjectStore>,
    root: Path,
    memtable: MemTable,
    /// What this index holds of the process's index memory (memtable, run metas, cached blocks).
    charges: Charges,
    /// Newest first; includes runs flushed but not yet named by a manifest.
    runs: Vec<Arc<RunMeta>>,
    files: FileTable,
    /// Sequence number of the newest manifest (0: none yet).
    manifest_seq: u64,
    next_run_id: u64,
    covered: Option<i64>,
    /// Which table snapshot the index holds in memory: `covered`, or a later one recorded by
    /// [`persist_when_due`](Self::persist_when_due) and not persisted yet.
    applied: Option<i64>,
    /// When the newest manifest was written (or the index opened).
    persisted_at: Instant,
    /// Files to delete once a manifest that no longer names them is durable.
    obsolete: Vec<Path>,
    /// What merges did since open (copied blocks vs merged entries).
    merged: compaction::worker::MergeStats,
    /// The merge of runs running beside the index, if any (`compaction/background.rs`).
    merging: Option<compaction::background::Merging>,
    /// How lookups read the blocks they miss (`lookup.rs`).
    block_reads: BlockReads,
    /// The oldest run keeps its bloom filters too ([`keep_oldest_filters`](Self::keep_oldest_filters)).
    oldest_filters: bool,
    /// This index in memory, for the runs prepared beside it (`prepared.rs`).
    owner: prepared::Owner,
}

impl PrimaryKeyIndex {
    /// Opens the index stored under `root` (empty if there is none) with a memory budget of its
    /// own; [`open_as`](Self::open_as) for lease epoch 0 (no lease: tools and tests).
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        root: Path,
        memory_budget_bytes: usize,
    ) -> Result<Self, IndexError> {
        let memory = IndexMemory::new(memory_budget_bytes);
        PrimaryKeyIndex::open_as(store, root, &memory, 0).await
    }

    /// Opens the index stored under `root` (empty if there is none) for the holder of lease
    /// epoch `epoch`, deleting superseded manifests; unnamed runs are deleted after this
    /// index's first manifest (module doc, "Two writers"). Its memtable, block cache and run
    /// metas share `memory` with every other index opened with it. A manifest that cannot be
    /// read, or that names a run storage does not hold, is [`IndexError::Corrupt`].
    pub async fn open_as(
        store: Arc<dyn ObjectStore>,
        root: Path,
        memory: &Arc<IndexMemory>,
        epoch: u64,
    ) -> Result<Self, IndexError> {
        let listing = Listing::read(&store, &root).await?;
        let manifest = match listing.latest {
            Some(seq) => Some(read_manifest(&store, &root, seq).await?),
            None => None,
        };
        let mut index = PrimaryKeyIndex::empty(store, root, memory, epoch);
        let mut live: HashSet<u64> = HashSet::new();
        if let Some(m) = manifest {
            let missing = |path: &Path, seq: u64| {
                let path = path.to_string();
                move |e| match e {
                    IndexError::Storage {
                        source: object_store::Error::NotFound { .. },
                        ..
                    } => IndexError::Corrupt {
                        path,
                        detail: format!("named by manifest {seq} but missing"),
                    },
                    other => other,
                }
            };
            // Collected first: a stream over a closure-carrying `Map` held across `.await` makes
            // the caller's future fail a generic `Send` bound (rust-lang/rust#102211).
            // Newest first: the last is the oldest, held without filters (`run.rs`,
            // `RunWriter::without_filters`), whatever it was written with.
            let oldest = m.runs.len().saturating_sub(1);
            let loads: Vec<_> = m
                .runs
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let path = run_path(&index.root, r.id);
                    let filters = i != oldest;
                    let load = RunMeta::load(
                        &index.store,
                        path.clone(),
                        r.id,
                        r.size,
                        r.meta_offset,
                        filters,
                    );
                    let missing = missing(&path, m.seq);
                    async move { load.await.map_err(missing) }
                })
                .collect();
            index.runs = futures::stream::iter(loads)
                .buffered(8)
                .map_ok(Arc::new)
                .try_collect()
                .await?;
            live = m.runs.iter().map(|r| r.id).collect();
            index.files = FileTable::from_entries(&m.files, m.next_file_id);
            index.manifest_seq = m.seq;
            index.next_run_id = index.next_run_id.max(m.next_run_id);
            index.covered = m.covered_snapshot;
            index.applied = m.covered_snapshot;
        }
        index.sweep(listing, |id| live.contains(&id)).await?;
        index.account_runs();
        Ok(index)
    }

    /// An empty index under `root` that supersedes whatever is there (a corrupt manifest, or one
    /// naming a missing run): its first manifest takes the sequence after the newest one, and
    /// the old runs and manifests are deleted once that manifest is durable. It covers no
    /// snapshot, so the sink rebuilds it from the table.
    pub async fn reset_as(
        store: Arc<dyn ObjectStore>,
        root: Path,
        memory: &Arc<IndexMemory>,
        epoch: u64,
    ) -> Result<Self, IndexError> {
        let listing = Listing::read(&store, &root).await?;
        let mut index = PrimaryKeyIndex::empty(store, root, memory, epoch);
        // Its first manifest supersedes (and then deletes) the newest one.
        index.manifest_seq = listing.latest.unwrap_or(0);
        index.sweep(listing, |_| false).await?;
        Ok(index)
    }

    fn empty(
        store: Arc<dyn ObjectStore>,
        root: Path,
        memory: &Arc<IndexMemory>,
        epoch: u64,
    ) -> PrimaryKeyIndex {
        PrimaryKeyIndex {
            store,
            root,
            memtable: MemTable::default(),
            charges: Charges::new(memory),
            runs: Vec::new(),
            files: FileTable::default(),
            manifest_seq: 0,
            next_run_id: epoch.saturating_mul(RUN_ID_EPOCH_STRIDE).max(1),
            covered: None,
            applied: None,
            persisted_at: Instant::now(),
            obsolete: Vec::new(),
            merged: compaction::worker::MergeStats::default(),
            merging: None,
            block_reads: BlockReads::default(),
            oldest_filters: false,
            owner: prepared::Owner::new_instance(),
        }
    }

    /// Deletes the manifests older than the newest (none can become the newest again), and
    /// queues the runs `live` rejects for deletion after this index's first manifest. New run
    /// ids start past every run listed.
    async fn sweep(
        &mut self,
        listing: Listing,
        live: impl Fn(u64) -> bool,
    ) -> Result<(), IndexError> {
        for (path, name) in listing.names {
            match name {
                Name::Manifest(seq) if path == manifest_path(&self.root, seq) => {
                    if Some(seq) == listing.latest {
                        continue;
                    }
                    tracing::info!(path = %path, "removing a superseded primary-key index manifest");
                    match self.store.delete(&path).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                        Err(source) => {
                            return Err(IndexError::Storage {
                                path: path.to_string(),
                                source,
                            })
                        }
                    }
                }
                Name::Run(id) if path == run_path(&self.root, id) => {
                    self.next_run_id = self.next_run_id.max(id.saturating_add(1));
                    if !live(id) {
                        tracing::info!(path = %path, "a primary-key index run no manifest names; removed after the next manifest");
                        self.obsolete.push(path);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// How lookups read blocks from now on: [`BlockReads::Exact`] for an index on local disk.
    pub fn set_block_reads(&mut self, reads: BlockReads) {
        self.block_reads = reads;
    }

    /// Keeps bloom filters in the oldest run too, for a table whose lookups often ask for keys
    /// with no row (a table with soft deletes looks every insert up, as an upsert): without them
    /// each such key reads a block of the oldest run (`RunWriter::without_filters`). Loads the
    /// oldest run's filters, if it was written with them; merges write the next oldest with them.
    pub async fn keep_oldest_filters(&mut self) -> Result<(), IndexError> {
        if std::mem::replace(&mut self.oldest_filters, true) {
            return Ok(());
        }
        let Some(oldest) = self.runs.last() else {
            return Ok(());
        };
        let reloaded = RunMeta::load(
            &self.store,
            oldest.path.clone(),
            oldest.id,
            oldest.size,
            oldest.meta_offset,
            true,
        )
        .await?;
        // The same run, its filters loaded: its id (and cached blocks) stay.
        if let Some(last) = self.runs.last_mut() {
            *last = Arc::new(reloaded);
        }
        self.account_runs();
        Ok(())
    }

    /// Which table snapshot the persisted index reflects; `None` for a new index.
    pub fn covered_snapshot(&self) -> Option<i64> {
        self.covered
    }

    /// Which table snapshot the index holds in memory: the persisted one, or a later one
    /// [`persist_when_due`](Self::persist_when_due) recorded without persisting.
    pub fn applied_snapshot(&self) -> Option<i64> {
        self.applied
    }

    /// Records committed changes, in commit order (a later change to a key wins). In memory only
    /// until the next [`flush`](Self::flush) or [`persist`](Self::persist).
    pub fn apply<'a>(
        &mut self,
        changes: impl IntoIterator<Item = IndexChange<'a>>,
    ) -> Result<(), IndexError> {
        for change in changes {
            let slot = match &change.op {
                IndexOp::Upsert(loc) => Slot {
                    file: self.files.intern(&loc.file)?,
                    position: loc.position,
                },
                IndexOp::Remove => Slot::REMOVED,
            };
            self.memtable.insert(change.key, slot);
        }
        self.charges.memtable(self.memtable.memory_bytes());
        Ok(())
    }

    /// Records that data file `file` now holds each key of `rows` at the given position, or
    /// (position `None`) that the key has no row: [`apply`](Self::apply) for the rows of one
    /// file, in commit order, without a [`RowLocation`] (and its path) per row.
    pub fn apply_file<'a>(
        &mut self,
        file: &str,
        rows: impl IntoIterator<Item = (&'a [u8], Option<u64>)>,
    ) -> Result<(), IndexError> {
        let id = self.files.intern_str(file)?;
        for (key, position) in rows {
            let slot = match position {
                Some(position) => Slot { file: id, position },
                None => Slot::REMOVED,
            };
            self.memtable.insert(key, slot);
        }
        self.charges.memtable(self.memtable.memory_bytes());
        Ok(())
    }

    /// True when the memtable has reached the memtables' share of the index memory, or the
    /// memtables of every index together are over it and this one holds a sizeable part
    /// ([`IndexMemory`]): call [`flush`](Self::flush) (or `persist`) before applying more.
    pub fn needs_flush(&self) -> bool {
        self.charges
            .memory()
            .should_flush(self.memtable.used_bytes())
    }

    /// Writes the memtable as a new run, then, once more than [`FLUSHED_RUNS`] runs are live,
    /// starts a merge of runs in the background if the policy says so
    /// (`compaction/background.rs`). The new run is durable as part of the index once the next
    /// `persist` names it in a manifest; a crash before leaves an orphan run that open removes.
    pub async fn flush(&mut self) -> Result<(), IndexError> {
        self.write_memtable().await?;
        self.merge_after_flush().await?;
        self.account_runs();
        Ok(())
    }

    async fn write_memtable(&mut self) -> Result<(), IndexError> {
        if self.memtable.is_empty() {
            return Ok(());
        }
        let id = self.next_run_id;
        let mut writer = RunWriter::new(&self.store, run_path(&self.root, id), id);
        // Neighbouring keys mostly live in one file: its liveness is looked up once per stretch.
        let mut live_file = None;
        for (key, slot) in self.memtable.sorted() {
            let slot = if live_file == Some(slot.file) {
                slot
            } else {
                let checked = self.files.live_or_tombstone(slot);
                live_file = (!checked.is_tombstone()).then_some(slot.file);
                checked
            };
            writer.add(key, slot).await?;
        }
        let meta = writer.finish().await?;
        self.next_run_id += 1;
        self.runs.insert(0, Arc::new(meta));
        self.memtable.clear();
        self.charges.memtable(self.memtable.memory_bytes());
        self.account_runs();
        Ok(())
    }

    /// Makes everything applied so far durable, as the index of table snapshot `covers_snapshot`.
    /// Call it after that snapshot's table commit succeeded. A merge of runs that ended since
    /// the last flush or persist is installed (this manifest names its run), and the next merge
    /// starts in the background if the policy says so (`compaction/background.rs`; a merge
    /// failure is logged, not returned: the index is durable without it).
    pub async fn persist(&mut self, covers_snapshot: i64) -> Result<(), IndexError> {
        self.persist_then(covers_snapshot, true).await
    }

    /// [`persist`](Self::persist), starting the next merge only if `merge`.
    async fn persist_then(&mut self, covers_snapshot: i64, merge: bool) -> Result<(), IndexError> {
        self.write_memtable().await?;
        self.take_ended_merge().await;
        // Planned before the manifest, which reserves its run id; started once it is durable
        // (compaction/background.rs).
        let merge = if merge { self.plan_next_merge() } else { None };
        self.write_manifest(Some(covers_snapshot)).await?;
        if let Some(merge) = merge {
            self.start_merge(merge);
        }
        self.applied = Some(covers_snapshot);
        self.persisted_at = Instant::now();
        self.delete_obsolete().await;
        self.account_runs();
        Ok(())
    }

    /// Records that everything applied so far is table snapshot `covers_snapshot` (committed),
    /// and [`persist`](Self::persist)s only when the last manifest is `every` old, the memtable
    /// needs a flush, or the memtables of every index together are over their share (then each
    /// index empties its own at its next commit, however small); returns whether it did. Between persists the changes stay in the memtable
    /// and the manifest names an older snapshot: a crash then replays the table's commits after
    /// it (recovery contract), at most `every` of them, instead of every commit writing a run and
    /// a manifest and deleting the previous manifest (issue 37: requests that grew with commits,
    /// not with data). [`persist_applied`](Self::persist_applied) persists what is pending.
    pub async fn persist_when_due(
        &mut self,
        covers_snapshot: i64,
        every: Duration,
    ) -> Result<bool, IndexError> {
        self.applied = Some(covers_snapshot);
        let memory = self.charges.memory();
        let over = memory.memtables() > memory.memtables_limit();
        if self.persisted_at.elapsed() < every && !over && !self.needs_flush() {
            return Ok(false);
        }
        self.persist(covers_snapshot).await?;
        Ok(true)
    }

    /// Persists the snapshot [`persist_when_due`](Self::persist_when_due) recorded, if the
    /// manifest names an older one (a clean stop). Starts no merge: the process is about to
    /// exit, which would abort it and leave its run for the next open to delete.
    pub async fn persist_applied(&mut self) -> Result<(), IndexError> {
        match self.applied {
            Some(applied) if self.covered != Some(applied) => {
                self.persist_then(applied, false).await
            }
            _ => Ok(()),
        }
    }

    /// Forgets every key located in `files` (data files rewritten by compaction or expired).
    /// Entries naming them read as absent from now on; their file ids are never reused.
    pub fn remove_files<'a>(&mut self, files: impl IntoIterator<Item = &'a str>) {
        for f in files {
            self.files.remove(f);
        }
    }

    /// The data files entries may name (those not removed), so a caller can drop the ones that
    /// left the table while the index was not running (see the recovery contract).
    pub fn data_files(&self) -> Vec<Arc<str>> {
        self.files.paths().cloned().collect()
    }

    /// Forgets every key (table truncated, or a rebuild from scratch). Durable at the next persist.
    pub fn clear(&mut self) {
        // Runs prepared before the clear name files and keys it forgot.
        self.owner.generation += 1;
        // Aborted; its run may be written already (compaction/background.rs).
        if let Some(merging) = self.merging.take() {
            self.obsolete.push(merging.run.clone());
        }
        self.memtable.clear();
        self.files.clear();
        for run in self.runs.drain(..) {
            self.obsolete.push(run.path.clone());
        }
        let owner = self.charges.owner();
        self.charges.memory().cache().forget_owner(owner);
        self.charges.memtable(self.memtable.memory_bytes());
        self.account_runs();
    }

    /// This index's part of the process's index memory ([`IndexMemory`] has the totals).
    pub fn memory_usage(&self) -> MemoryUsage {
        MemoryUsage {
            memtable: self.memtable.memory_bytes(),
            block_cache: self.charges.memory().cache().used_by(self.charges.owner()),
            runs: self.runs.iter().map(|r| r.memory_bytes()).sum(),
            files: self.files.memory_bytes(),
        }
    }

    /// Charges the run metas and the file table to the index memory (they shrink the cache).
    fn account_runs(&mut self) {
        let bytes =
            self.runs.iter().map(|r| r.memory_bytes()).sum::<usize>() + self.files.memory_bytes();
        self.charges.runs(bytes);
    }

    /// Live runs and data files, for logs and tests.
    pub fn stats(&self) -> (usize, usize) {
        (self.runs.len(), self.files.len())
    }

    async fn write_manifest(&mut self, covers: Option<i64>) -> Result<(), IndexError> {
        let seq = self.manifest_seq + 1;
        let manifest = Manifest {
            format: FORMAT,
            seq,
            covered_snapshot: covers,
            next_file_id: self.files.next_id(),
            next_run_id: self.next_run_id,
            files: self.files.entries(),
            runs: self
                .runs
                .iter()
                .map(|r| RunEntry {
                    id: r.id,
                    size: r.size,
                    meta_offset: r.meta_offset,
                    entries: r.entries,
                })
                .collect(),
            write_id: Some(uuid::Uuid::new_v4().to_string()),
        };
        let path = manifest_path(&self.root, seq);
        let body = serde_json::to_vec(&manifest).map_err(|e| IndexError::Corrupt {
            path: path.to_string(),
            detail: format!("cannot encode manifest: {e}"),
        })?;
        match put_create(self.store.as_ref(), &path, Bytes::from(body)).await {
            // AlreadyOurs: a retried put whose first attempt landed; the manifest is ours.
            Ok(Created::Created | Created::AlreadyOurs) => {}
            Ok(Created::Conflict) => {
                return Err(IndexError::Conflict {
                    path: path.to_string(),
                })
            }
            Err(source) => {
                return Err(IndexError::Storage {
                    path: path.to_string(),
                    source,
                })
            }
        }
        if self.manifest_seq > 0 {
            self.obsolete
                .push(manifest_path(&self.root, self.manifest_seq));
        }
        self.manifest_seq = seq;
        self.covered = covers;
        Ok(())
    }

    /// Best effort: a file left behind here is a leftover the next open removes.
    async fn delete_obsolete(&mut self) {
        let obsolete = std::mem::take(&mut self.obsolete);
        delete_files(&self.store, obsolete.iter(), "obsolete").await;
    }
}

/// Deletes index files (`what` they are, for the log), best effort: a file already gone is
/// deleted, and one left behind is an orphan the next open removes.
async fn delete_files(
    store: &Arc<dyn ObjectStore>,
    paths: impl Iterator<Item = &Path>,
    what: &str,
) {
    for path in paths {
        match store.delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(path = %path, error = %e, "cannot delete a primary-key index file ({what})")
            }
        }
    }
}

async fn read_manifest(
    store: &Arc<dyn ObjectStore>,
    root: &Path,
    seq: u64,
) -> Result<Manifest, IndexError> {
    let path = manifest_path(root, seq);
    let storage = |source| IndexError::Storage {
        path: path.to_string(),
        source,
    };
    let bytes = store
        .get(&path)
        .await
        .map_err(storage)?
        .bytes()
        .await
        .map_err(storage)?;
    let corrupt = |detail: String| IndexError::Corrupt {
        path: path.to_string(),
        detail,
    };
    let m: Manifest = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
    if m.format != FORMAT {
        return Err(corrupt(format!(
            "format {} (this cdcd reads {FORMAT})",
            m.format
        )));
    }
    if m.seq != seq {
        return Err(corrupt(format!("names sequence {} in file {seq}", m.seq)));
    }
    Ok(m)
}
