//! The primary-key index of a format-v3 table, wired into the commit: opened (and caught up with
//! the table) before a commit locates rows, told after the commit which rows it wrote and which
//! keys it removed, and persisted naming the snapshot it covers at most every [`PERSIST_EVERY`].
//!
//! Where it sits: the commit (`commit/`) → [`TableIndex::open`] (first commit of the table in this
//! process) → `IndexLocator` (locator.rs) for DV positions and `lookup::fetch` for partial rows →
//! table commit → [`TableIndex::record`]. The index itself (an LSM of sorted runs with bounded
//! memory) is `sinks/pk_index/`; this file only maps Iceberg commits onto its changes.
//!
//! Where it lives: `<warehouse>/_cdcd/<pipeline>/index/<namespace>/<table>/`, with the pipeline's
//! other state (`docs/internals.md`, "The primary-key index"), not under the table's own
//! folder: Iceberg's orphan-file removal (Spark `remove_orphan_files`, pyiceberg maintenance)
//! deletes every file under a table location that no metadata names, and would delete the index.
//!
//! Recovery (the contract in `sinks/pk_index/mod.rs`): the table commit is the truth, and the index
//! is persisted after it. On open, if the index covers an older snapshot that is an ancestor of
//! the current one, the key columns of the data files added by the snapshots after it are read
//! and upserted (rows already in a deletion vector skipped), and data files that left the table
//! are forgotten; otherwise (no index, a corrupt one or one naming a missing run, a recreated
//! table) it is rebuilt from every live data file, in a fresh index past the broken one
//! (`PrimaryKeyIndex::reset_as`: nothing is deleted before its first manifest is durable).
//! Run ids carry the sink's lease epoch (`Warehouse::lease_epoch`). Keys the index still maps to a row deleted after the covered snapshot are not
//! removed by the replay: the locator checks every answer against the snapshot's live files and
//! deletion vectors, so such an entry reads as no row.

use std::collections::HashSet;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_row::{RowConverter, Rows};
use arrow_schema::{ArrowError, SchemaRef};
use iceberg::spec::TableMetadata;

use super::{column_names, row_converter};
use crate::changelog::{TableChanges, TableId, TableSchema};
use crate::sinks::iceberg::deletes::commit_vectors::LiveDvs;
use crate::sinks::iceberg::deletes::deletion_vector::DeletionVector;
use crate::sinks::iceberg::files::decode::{decode, project};
use crate::sinks::iceberg::files::manifest::{read, LiveFile, LiveFiles};
use crate::sinks::iceberg::plan::{encode_keys, Plan};
use crate::sinks::pk_index::{
    BlockReads, IndexChange, IndexError, IndexOp, PrimaryKeyIndex, RowLocation,
};
use crate::sinks::SinkError;
use crate::storage::Warehouse;

mod moved;
mod slot;
pub(crate) use moved::RewriteRuns;
pub(crate) use slot::IndexSlot;

/// Changes handed to the index between checks of its memtable budget.
const APPLY_CHUNK: usize = 16 * 1024;

/// How often a streaming commit's changes are persisted (a run and a manifest, and the previous
/// manifest deleted): at most this often per table, plus whenever the memtable is full, a
/// compaction, a catch-up and a clean stop. Persisting every commit cost 2 PUTs and 1 DELETE
/// (and the merges of one run per commit) per table and commit (issue 37); a crash now replays at
/// most this long of the table's commits from their data files (the recovery contract), which
/// the 10-minute snapshot expiry cdcd sets on its tables keeps reachable.
pub(crate) const PERSIST_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// One file a compaction wrote, as the index follows it: its path, the key columns of its rows
/// in position order, and the positions deleted in the same snapshot (deletes committed while
/// the rewrite ran: those keys already point at their newer rows, or nowhere).
pub(crate) struct RewrittenOutput<'a> {
    pub path: &'a str,
    pub keys: &'a [RecordBatch],
    pub deleted: Option<&'a DeletionVector>,
}

/// The index of one table and the key encoding it was built with.
pub(crate) struct TableIndex {
    index: PrimaryKeyIndex,
    /// `arrow_row` encoding of the key columns in the change rows' types; the same types are
    /// used when reading keys back from data files (cast), so the bytes match.
    codec: RowConverter,
    keys_schema: SchemaRef,
    table: TableId,
}

/// `<warehouse>/_cdcd/<pipeline>/index/<namespace>/<table>` as a location.
pub(crate) fn location(warehouse: &Warehouse, pipeline: &str, ns: &str, table: &str) -> String {
    warehouse.location(&["_cdcd", pipeline, "index", ns, table])
}

impl TableIndex {
    /// Opens the index stored at `location` and catches it up with the current snapshot of
    /// `meta`, whose live files are `files` (and DVs `dvs`), persisting it if anything changed.
    pub async fn open(
        warehouse: &Warehouse,
        location: &str,
        schema: &TableSchema,
        meta: &TableMetadata,
        files: &LiveFiles,
        dvs: &LiveDvs,
    ) -> Result<TableIndex, SinkError> {
        let table = schema.id.clone();
        let root = warehouse.path(location)?;
        let store = Arc::clone(warehouse.store());
        let epoch = warehouse.lease_epoch();
        // Every table's index shares the process's index memory (`memory_budget.rs`).
        let memory = crate::memory_budget::index_memory();
        let opened =
            PrimaryKeyIndex::open_as(Arc::clone(&store), root.clone(), &memory, epoch).await;
        let mut index = match opened {
            Ok(index) => index,
            // Also a run the manifest names that is gone: rebuilt like any corruption, never
            // a standing error for every later commit.
            Err(IndexError::Corrupt { path, detail }) => {
                tracing::warn!(table = %table, path = %path, detail = %detail, "primary-key index is corrupt; rebuilding it from the table");
                PrimaryKeyIndex::reset_as(store, root, &memory, epoch)
                    .await
                    .map_err(|e| index_error(&table, e))?
            }
            Err(e) => return Err(index_error(&table, e)),
        };
        if warehouse.is_local_disk() {
            index.set_block_reads(BlockReads::Exact);
        }
        let keys_schema = TableChanges::keys_schema(schema);
        let codec = row_converter(&keys_schema).map_err(|source| SinkError::Arrow {
            context: format!("encoding the keys of {table}"),
            source,
        })?;
        let mut this = TableIndex {
            index,
            codec,
            keys_schema,
            table,
        };
        this.catch_up(warehouse, meta, files, dvs).await?;
        Ok(this)
    }

    async fn catch_up(
        &mut self,
        warehouse: &Warehouse,
        meta: &TableMetadata,
        files: &LiveFiles,
        dvs: &LiveDvs,
    ) -> Result<(), SinkError> {
        let covered = self.index.covered_snapshot();
        let Some(current) = meta.current_snapshot() else {
            if covered.is_some() {
                // The table was recreated: nothing the index holds is in it.
                self.index.clear();
            }
            return Ok(());
        };
        if covered == Some(current.snapshot_id()) {
            return Ok(());
        }
        let after = covered.and_then(|c| snapshots_after(meta, current.snapshot_id(), c));
        let replay: Vec<&LiveFile> = match &after {
            Some(ids) => {
                let live: HashSet<&str> = files.data.iter().map(|f| f.file.file_path()).collect();
                let gone: Vec<Arc<str>> = self
                    .index
                    .data_files()
                    .into_iter()
                    .filter(|f| !live.contains(&**f))
                    .collect();
                self.index.remove_files(gone.iter().map(|f| &**f));
                files
                    .data
                    .iter()
                    .filter(|f| ids.contains(&f.snapshot_id))
                    .collect()
            }
            None => {
                self.index.clear();
                files.data.iter().collect()
            }
        };
        let started = std::time::Instant::now();
        let mut rows = 0u64;
        for f in &replay {
            rows += self.replay_file(warehouse, f, dvs).await?;
        }
        tracing::info!(
            table = %self.table,
            covered = ?covered,
            snapshot = current.snapshot_id(),
            rebuilt = after.is_none(),
            files = replay.len(),
            rows,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "primary-key index caught up with the table"
        );
        self.index
            .persist(current.snapshot_id())
            .await
            .map_err(|e| index_error(&self.table, e))
    }

    /// Upserts the live rows of one data file; returns how many.
    async fn replay_file(
        &mut self,
        warehouse: &Warehouse,
        f: &LiveFile,
        dvs: &LiveDvs,
    ) -> Result<u64, SinkError> {
        let path = f.file.file_path();
        let dv = dvs.get(path).map(|d| &d.dv);
        let bytes = read(warehouse, path).await?;
        let names = column_names(&self.keys_schema);
        let mut offset = 0u64;
        let mut upserted = 0u64;
        for batch in decode(&bytes, path, Some(&names))? {
            let arrow = |source| SinkError::Arrow {
                context: format!("reading the keys of {path}"),
                source,
            };
            let cols = project(&batch, &self.keys_schema).map_err(arrow)?;
            let keys = self.codec.convert_columns(&cols).map_err(arrow)?;
            let live: Vec<(&[u8], Option<u64>)> = keys
                .iter()
                .enumerate()
                .filter_map(|(r, key)| {
                    let position = offset + r as u64;
                    let deleted = dv.is_some_and(|d| d.contains(position));
                    (!deleted).then_some((key.data(), Some(position)))
                })
                .collect();
            for chunk in live.chunks(APPLY_CHUNK) {
                apply_file_rows(&mut self.index, &self.table, path, chunk).await?;
            }
            upserted += live.len() as u64;
            offset += batch.num_rows() as u64;
        }
        Ok(upserted)
    }

    /// The table snapshot the index reflects in memory (`None`: a table without snapshots);
    /// the persisted one may be older ([`PERSIST_EVERY`]).
    pub fn covers(&self) -> Option<i64> {
        self.index.applied_snapshot()
    }

    /// Persists what [`record`](Self::record) left unpersisted (a clean stop).
    pub async fn persist_applied(&mut self) -> Result<(), SinkError> {
        self.index
            .persist_applied()
            .await
            .map_err(|e| index_error(&self.table, e))
    }

    /// The index's answer for each key row of `keys` (a batch in the key schema), unchecked
    /// against the snapshot (`IndexLocator` does that).
    pub async fn get_many(
        &self,
        keys: &RecordBatch,
    ) -> Result<Vec<Option<RowLocation>>, SinkError> {
        let rows = self
            .codec
            .convert_columns(keys.columns())
            .map_err(|source| SinkError::Arrow {
                context: format!("encoding keys of {} to locate", self.table),
                source,
            })?;
        let wanted: Vec<&[u8]> = rows.iter().map(|r| r.data()).collect();
        self.index
            .get_many(&wanted)
            .await
            .map_err(|e| index_error(&self.table, e))
    }

    /// Records committed snapshot `snapshot_id`: `removed` holds the keys whose earlier row it
    /// deleted (`Plan::equality_deletes`, key schema), `paths` the locations of `plan.files`.
    /// Then persists if the last persist is [`PERSIST_EVERY`] old (or the memtable is full).
    /// On error the in-memory index may be ahead of what is persisted but never
    /// ahead of the table; the caller drops it and the next open replays. `changes` are dropped
    /// once their keys are encoded: this runs beside the next commit, which holds its own rows.
    pub async fn record(
        &mut self,
        schema: &TableSchema,
        changes: Vec<TableChanges>,
        plan: &Plan,
        paths: &[String],
        removed: Option<&RecordBatch>,
        snapshot_id: i64,
    ) -> Result<(), SinkError> {
        let arrow = |source: ArrowError| SinkError::Arrow {
            context: format!("encoding keys of {} for the index", self.table),
            source,
        };
        if plan.truncate {
            self.index.clear();
        }
        // Removals first: a key removed from an earlier snapshot is only ever written again
        // later in the same commit (the planner sees it first), so the upsert below wins.
        if let Some(keys) = removed {
            let rows = self.codec.convert_columns(keys.columns()).map_err(arrow)?;
            let removals: Vec<IndexChange> = rows
                .iter()
                .map(|r| IndexChange {
                    key: r.data(),
                    op: IndexOp::Remove,
                })
                .collect();
            apply_chunked(&mut self.index, &self.table, &removals).await?;
        }
        let encoded: Vec<Rows> = changes
            .iter()
            .map(|c| encode_keys(&self.codec, &c.rows, &schema.primary_key))
            .collect::<Result<_, _>>()
            .map_err(arrow)?;
        drop(changes);
        // One chunk of rows at a time (reused), so a 1M-row commit does not hold 1M of them,
        // and the memtable is flushed whenever it reaches its budget.
        let mut chunk: Vec<(&[u8], Option<u64>)> = Vec::with_capacity(APPLY_CHUNK);
        for (i, (f, path)) in plan.files.iter().zip(paths).enumerate() {
            for (n, rows) in f.rows.chunks(APPLY_CHUNK).enumerate() {
                chunk.clear();
                for (j, r) in rows.iter().enumerate() {
                    let pos = n * APPLY_CHUNK + j;
                    let Some(keys) = encoded.get(r.batch as usize) else {
                        continue;
                    };
                    let row = r.row as usize;
                    if row >= keys.num_rows() {
                        continue;
                    }
                    // A written row a later change superseded (position-deleted) no longer
                    // locates its key; the superseding row, later in this or a following file,
                    // does.
                    let superseded = u32::try_from(pos).ok().is_some_and(|p| {
                        plan.position_deletes.binary_search(&(i as u32, p)).is_ok()
                    });
                    chunk.push((keys.row(row).data(), (!superseded).then_some(pos as u64)));
                }
                apply_file_rows(&mut self.index, &self.table, path, &chunk).await?;
            }
        }
        self.index
            .persist_when_due(snapshot_id, PERSIST_EVERY)
            .await
            .map(drop)
            .map_err(|e| index_error(&self.table, e))
    }
}

impl TableIndex {
    /// Keeps the bloom filters of the index's oldest run (a table with soft deletes, whose
    /// inserts are looked up: `PrimaryKeyIndex::keep_oldest_filters`).
    pub async fn keep_oldest_filters(&mut self) -> Result<(), SinkError> {
        self.index
            .keep_oldest_filters()
            .await
            .map_err(|e| index_error(&self.table, e))
    }

    /// The names of the key columns, as data files hold them.
    pub fn key_names(&self) -> Vec<String> {
        self.keys_schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    /// Records committed compaction snapshot `snapshot_id`: the keys of each output file
    /// (`outputs`: its location and the key columns of its rows in position order) now locate
    /// their row there, and every entry naming a `removed` file is forgotten (the rows it still
    /// names were deleted: a rewrite keeps only live rows). Then persists. Same error contract as
    /// [`record`](Self::record): the caller drops the index and the next open replays.
    pub async fn record_rewrite(
        &mut self,
        removed: &[&str],
        outputs: &[RewrittenOutput<'_>],
        snapshot_id: i64,
    ) -> Result<(), SinkError> {
        self.index.remove_files(removed.iter().copied());
        for RewrittenOutput {
            path,
            keys: batches,
            deleted,
        } in outputs
        {
            let mut offset = 0u64;
            for batch in *batches {
                let arrow = |source| SinkError::Arrow {
                    context: format!("encoding the keys of {path}"),
                    source,
                };
                let cols = project(batch, &self.keys_schema).map_err(arrow)?;
                let keys = self.codec.convert_columns(&cols).map_err(arrow)?;
                let rows: Vec<(&[u8], Option<u64>)> = keys
                    .iter()
                    .enumerate()
                    .map(|(r, key)| (key.data(), offset + r as u64))
                    .filter(|(_, at)| !deleted.is_some_and(|d| d.contains(*at)))
                    .map(|(key, at)| (key, Some(at)))
                    .collect();
                for chunk in rows.chunks(APPLY_CHUNK) {
                    apply_file_rows(&mut self.index, &self.table, path, chunk).await?;
                }
                offset += batch.num_rows() as u64;
            }
        }
        self.index
            .persist(snapshot_id)
            .await
            .map_err(|e| index_error(&self.table, e))
    }
}

/// Applies `changes` a chunk at a time, flushing the memtable whenever it reaches its budget, so
/// a large commit or a rebuild does not grow memory past it. Returns how many were applied.
/// (A slice, not an iterator: a closure-carrying iterator held across the flush's `.await`
/// makes the commit future fail the `Send` bound the `Sink` trait needs.)
async fn apply_chunked(
    index: &mut PrimaryKeyIndex,
    table: &TableId,
    changes: &[IndexChange<'_>],
) -> Result<u64, SinkError> {
    for chunk in changes.chunks(APPLY_CHUNK) {
        index
            .apply(chunk.iter().cloned())
            .map_err(|e| index_error(table, e))?;
        if index.needs_flush() {
            index.flush().await.map_err(|e| index_error(table, e))?;
        }
    }
    Ok(changes.len() as u64)
}

/// [`PrimaryKeyIndex::apply_file`] for one chunk of a data file's rows, then a flush if the
/// memtable reached its budget.
async fn apply_file_rows(
    index: &mut PrimaryKeyIndex,
    table: &TableId,
    path: &str,
    rows: &[(&[u8], Option<u64>)],
) -> Result<(), SinkError> {
    index
        .apply_file(path, rows.iter().copied())
        .map_err(|e| index_error(table, e))?;
    if index.needs_flush() {
        index.flush().await.map_err(|e| index_error(table, e))?;
    }
    Ok(())
}

/// The ids of the snapshots after `covered` up to and including `current`, if `covered` is an
/// ancestor of `current` (else the index must be rebuilt).
fn snapshots_after(meta: &TableMetadata, current: i64, covered: i64) -> Option<HashSet<i64>> {
    let mut ids = HashSet::new();
    let mut next = meta.snapshot_by_id(current);
    while let Some(s) = next {
        if s.snapshot_id() == covered {
            return Some(ids);
        }
        ids.insert(s.snapshot_id());
        next = s.parent_snapshot_id().and_then(|p| meta.snapshot_by_id(p));
    }
    None
}

/// An index error as a sink error naming the table or the index object.
pub(crate) fn index_error(table: &TableId, e: IndexError) -> SinkError {
    match e {
        IndexError::Storage { path, source } => SinkError::Storage { path, source },
        IndexError::Corrupt { path, detail } => SinkError::Corrupt { path, detail },
        other => SinkError::Data {
            table: table.clone(),
            detail: other.to_string(),
        },
    }
}
