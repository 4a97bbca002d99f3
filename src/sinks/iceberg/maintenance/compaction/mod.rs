//! Data-file compaction in the maintenance cycle: small files and files whose deletion vector
//! deletes many of their rows are rewritten into target-size files without the deleted rows, as
//! one `replace` snapshot that removes the old files and their vectors and carries the table's
//! checkpoint (Iceberg-Java's `RewriteDataFiles`, bin-pack strategy). On a format-v2
//! (equality-delete) table the rewrite applies the table's position and equality deletes to the
//! rows it copies and drops the delete files that then apply to no live file (`equality.rs`).
//!
//! Layout: `pick.rs` (pure: which files, into which outputs), `moves.rs` (pure: where each kept
//! row lands), `summary.rs` (pure: the `replace` summary), `equality.rs` (v2: the deletes a
//! rewrite applies, the delete files it drops), `rewrite.rs` (the worker: read, drop, write,
//! manifests, snapshot), this file (the driver: lock, decide, publish, move the index).
//!
//! # Why no delete is lost: the rewrite holds the table's slot lock
//!
//! Iceberg's rule for a rewrite is that it must fail, or re-apply, when a delete was committed
//! against a file it replaces after it started (Iceberg spec, "Scan Planning"/"Deletion Vectors";
//! Java's `validateNoNewDeletesForDataFiles`): otherwise the rewritten copy of a deleted row would
//! come back. cdcd avoids the race instead of detecting it: the whole compaction — load the
//! current snapshot, read the files and vectors, write, publish, move the index — runs under the
//! table's slot lock, the lock every streaming commit of that table holds from loading its base
//! to publishing. So no cdcd commit lands between the vectors the rewrite read and its own
//! commit, and each streaming commit afterwards builds on the compaction's snapshot (the cached
//! live state advanced to it, `LiveState::apply_rewrite`; the index following the moved rows).
//! The price is that the table's streaming commits wait while its compaction runs;
//! `cdcd.compaction.max-bytes-per-cycle` bounds that.
//! A commit of another writer (another engine) in between makes the publish a conflict (the
//! create-if-absent `v<N+1>`, or the SQL catalog's row swap): nothing is committed, the next
//! cycle decides again from the new snapshot.
//!
//! # The index follows atomically
//!
//! The table commit is the truth, the index is persisted after it naming the snapshot it covers
//! (`sinks/pk_index`, recovery contract). After the compaction's commit the keys of the rewritten
//! rows are upserted at their new file and position and the replaced files are forgotten, then
//! the index is persisted as covering the compaction's snapshot. A crash before the commit leaves
//! the old table and the old index (the written files are orphans for `cdcd cleanup`); a crash
//! after it leaves an index covering the parent, which the next commit catches up by replaying
//! the compaction's added files (live rows only) and forgetting the files that left the table —
//! the same as the in-process update.
//!
//! # Not done
//! - v2: files are picked by size only (how many of a file's rows the equality deletes remove is
//!   known only by reading it), so an equality delete file stays while a file older than it is
//!   not rewritten (a large one).
//! - v3 row lineage: rewritten rows get new row ids (rewrite.rs, `stage`).
//! - Puffin consolidation: each vector stays in its own Puffin file. Several blobs per Puffin
//!   file are what DuckDB 1.5.5 misreads (commit/files.rs); compaction instead removes the
//!   vectors of the files it rewrites.

mod equality;
mod moves;
mod pick;
mod rewrite;
mod summary;

use std::collections::HashSet;
use std::sync::Arc;

use iceberg::spec::{FormatVersion, TableMetadata};

use super::properties::Compaction;
use crate::changelog::TableId;
use crate::checkpoint::Checkpoint;
use crate::failpoints;
use crate::sinks::iceberg::commit::Names;
use crate::sinks::iceberg::index::IndexSlot;
use crate::sinks::iceberg::live::{LiveState, Rewritten};
use crate::sinks::iceberg::maintenance::metadata_log;
use crate::sinks::iceberg::metadata::Loaded;
use crate::sinks::iceberg::IcebergSink;
use crate::sinks::SinkError;
use equality::V2Deletes;
use pick::{Candidate, Choice};
use rewrite::{Rewrite, Written};

/// What one compaction committed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Compacted {
    pub files_rewritten: u64,
    pub bytes_rewritten: u64,
    pub files_written: u64,
    pub bytes_written: u64,
    /// Delete files removed: the vectors of the rewritten files (v3), or the position and
    /// equality delete files that no longer apply to any live file (v2).
    pub vectors_removed: u64,
    /// Rows their deletes deleted, dropped from the table's files.
    pub rows_dropped: u64,
}

impl IcebergSink {
    /// Compacts `table` once if its properties and files call for it; `Ok(None)` when nothing
    /// was rewritten (no table, disabled, nothing worth it). Holds the table's slot lock
    /// throughout (the module doc says why).
    pub(crate) async fn compact_table(
        &self,
        table: &TableId,
    ) -> Result<Option<Compacted>, SinkError> {
        let slot = self.table_slot(table);
        let mut guard = slot.lock().await;
        guard.index.settle().await;
        let Some(base) = self.load(table).await? else {
            return Ok(None);
        };
        let meta = &base.metadata;
        if meta.current_snapshot().is_none() {
            return Ok(None);
        }
        let policy =
            Compaction::from_properties(meta.properties()).map_err(|e| SinkError::Data {
                table: table.clone(),
                detail: format!("compaction skipped: {e}"),
            })?;
        if !policy.enabled {
            return Ok(None);
        }
        if !guard.live.as_ref().is_some_and(|l| l.describes(meta)) {
            guard.live = Some(LiveState::load(&self.warehouse, table, meta).await?);
        }
        // Out of the slot while the rewrite reads it; put back advanced to the `replace`
        // snapshot after a commit (so the next commit reads nothing back), unchanged when
        // nothing is rewritten, and left out after a failure (the next commit rereads it).
        let Some(mut live) = guard.live.take() else {
            return Ok(None);
        };
        let tiered = meta.format_version() >= iceberg::spec::FormatVersion::V3;
        let choice = pick::choose(&policy, &candidates(&live), tiered);
        if choice.is_empty() {
            guard.live = Some(live);
            return Ok(None);
        }
        let (compacted, rewritten) = self
            .rewrite_chosen(table, &mut guard.index, base, &live, choice)
            .await?;
        live.apply_rewrite(rewritten);
        guard.live = Some(live);
        Ok(Some(compacted))
    }

    /// Rewrites `choice` of `live` (the state of `base`'s current snapshot), publishes the
    /// `replace` snapshot and moves the index; returns what `live` must learn.
    async fn rewrite_chosen(
        &self,
        table: &TableId,
        index: &mut IndexSlot,
        base: Arc<Loaded>,
        live: &LiveState,
        choice: Choice,
    ) -> Result<(Compacted, Rewritten), SinkError> {
        let meta = &base.metadata;
        let parent = meta.current_snapshot().map(|s| s.snapshot_id());
        let checkpoint = self.carried_checkpoint(meta)?;
        let (v2, dropped_deletes) = self.v2_deletes(table, meta, live, &choice).await?;
        let rewrite = Rewrite {
            warehouse: &self.warehouse,
            table,
            base: Arc::clone(&base),
            live,
            choice,
            names: Names::new(meta),
            v2,
            dropped_deletes,
        };
        let written = rewrite.write(index.key_names().as_deref()).await?;
        let mut carried = rewrite.carry().await?;
        let staged = rewrite
            .stage(&written, &mut carried, checkpoint.as_ref())
            .await?;
        let location = self.current_location(table);
        let published = self
            .catalog_for(table)
            .commit(
                &self.warehouse,
                &self.table_ref(table, &location),
                &base,
                staged.next,
            )
            .await;
        let after = match published {
            Ok(after) => Arc::new(after),
            Err(e) => {
                // Conflict or unknown outcome: the next load tells; the files are orphans.
                self.remember(table, None);
                return Err(e);
            }
        };
        failpoints::crash_point(failpoints::COMPACT_AFTER_COMMIT);
        self.remember(table, Some(Arc::clone(&after)));
        metadata_log::delete_after_commit(
            &self.warehouse,
            &base,
            &after,
            self.catalog_for(table).names_previous(),
        );
        let removed: Vec<&str> = written.removed_data.iter().map(|f| f.file_path()).collect();
        let outputs: Vec<(&str, &[arrow_array::RecordBatch])> = written
            .outputs
            .iter()
            .map(|o| (o.path.as_str(), o.keys.as_slice()))
            .collect();
        index
            .follow_rewrite(parent, &removed, &outputs, rewrite.names.snapshot_id)
            .await;
        let compacted = Compacted::of(&written, carried.removed_deletes.len());
        let rewritten = Rewritten {
            snapshot_id: rewrite.names.snapshot_id,
            sequence: rewrite.names.sequence,
            manifests: staged.listed,
            added: written.outputs.into_iter().map(|o| o.file).collect(),
            added_manifest: staged.added_manifest,
            rewritten: carried.rewritten,
            removed_data: written
                .removed_data
                .iter()
                .map(|f| f.file_path().to_owned())
                .collect(),
            removed_deletes: rewrite.dropped_deletes,
        };
        Ok((compacted, rewritten))
    }

    /// v2: the deletes the rewrite of `choice` applies and the delete files it drops
    /// (`equality.rs`); nothing on v3, whose vectors are in `live`.
    async fn v2_deletes(
        &self,
        table: &TableId,
        meta: &TableMetadata,
        live: &LiveState,
        choice: &Choice,
    ) -> Result<(Option<V2Deletes>, HashSet<String>), SinkError> {
        if meta.format_version() >= FormatVersion::V3 {
            return Ok((None, HashSet::new()));
        }
        let chosen: HashSet<&str> = choice
            .inputs()
            .filter_map(|i| live.files.data.get(i))
            .map(|f| f.file.file_path())
            .collect();
        let schema = meta.current_schema();
        let file_schema = crate::sinks::iceberg::schema::data_file_schema(schema)?;
        let deletes =
            V2Deletes::load(&self.warehouse, table, live, schema, &file_schema, &chosen).await?;
        let dropped = deletes.droppable(live, &chosen);
        Ok((Some(deletes), dropped))
    }

    /// The checkpoint the compaction's snapshot carries: that of the newest snapshot of `main`
    /// with one of this pipeline (normally the current one).
    fn carried_checkpoint(&self, meta: &TableMetadata) -> Result<Option<Checkpoint>, SinkError> {
        let Some(id) = self.checkpoint_snapshot(meta)? else {
            return Ok(None);
        };
        let Some(snapshot) = meta.snapshot_by_id(id) else {
            return Ok(None);
        };
        Ok(Checkpoint::from_properties(
            &self.pipeline,
            &snapshot.summary().additional_properties,
        )?)
    }
}

impl Compacted {
    fn of(written: &Written, deletes_removed: usize) -> Compacted {
        Compacted {
            files_rewritten: written.removed_data.len() as u64,
            bytes_rewritten: written
                .removed_data
                .iter()
                .map(|f| f.file_size_in_bytes())
                .sum(),
            files_written: written.outputs.len() as u64,
            bytes_written: written
                .outputs
                .iter()
                .map(|o| o.file.file_size_in_bytes())
                .sum(),
            vectors_removed: deletes_removed as u64,
            rows_dropped: written.dropped_rows,
        }
    }
}

/// The picker's view of `live`'s data files (v3: their vectors' cardinality; v2: none known).
fn candidates(live: &LiveState) -> Vec<Candidate> {
    live.files
        .data
        .iter()
        .map(|f| Candidate {
            size_bytes: f.file.file_size_in_bytes(),
            record_count: f.file.record_count(),
            deleted_rows: live
                .dvs
                .get(f.file.file_path())
                .map_or(0, |d| d.dv.cardinality()),
            sequence: f.sequence,
        })
        .collect()
}
