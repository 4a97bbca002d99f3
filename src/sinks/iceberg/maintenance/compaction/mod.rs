//! Data-file compaction in the maintenance cycle: small files and files whose deletion vector
//! deletes many of their rows are rewritten into target-size files without the deleted rows, as
//! one `replace` snapshot that removes the old files and their vectors and carries the table's
//! checkpoint (Iceberg-Java's `RewriteDataFiles`, bin-pack strategy). On a format-v2
//! (equality-delete) table the rewrite applies the table's position and equality deletes to the
//! rows it copies and drops the delete files that then apply to no live file (`equality.rs`);
//! the rows those deletes remove from the files it leaves in place become one position delete
//! file in the same snapshot (`convert.rs`), so every equality delete file leaves with it.
//!
//! Partitioned and sorted tables: outputs are written in the table's current spec and sort order;
//! files of older specs are picked too and their rows split into the current spec's partitions
//! (`pick.rs`, `rewrite.rs`), each row's landing place recorded (`moves.rs`).
//!
//! Layout: `pick.rs` (pure: which files, into which outputs), `moves.rs` (pure: where each kept
//! row lands), `redelete.rs` (pure: the deletes committed meanwhile, at their new places),
//! `summary.rs` (pure: the `replace` summary), `equality.rs` (v2: the deletes a rewrite applies,
//! the delete files it drops), `convert.rs` (v2: the deletes of the files left in place, as
//! positions), `rewrite.rs` (the worker's first half: read, drop, write),
//! `replace.rs` (its second half: vectors, manifests, snapshot), this file (the action,
//! [`RewriteDataFiles`]: lock, decide, prepare the index's runs, publish, install them).
//!
//! # Why no delete is lost: re-applied (v3), or no commit in between (v2)
//!
//! Iceberg's rule for a rewrite is that it must fail, or re-apply, when a delete was committed
//! against a file it replaces after it started (Iceberg spec, "Scan Planning"/"Deletion Vectors";
//! Java's `validateNoNewDeletesForDataFiles`): otherwise the rewritten copy of a deleted row would
//! come back. A compaction runs in three steps, the first and the last under the table's slot
//! lock (the lock every streaming commit of that table holds from loading its base to
//! publishing):
//! 1. choose: load the current snapshot, pick the files, copy their deletion vectors;
//! 2. rewrite without the lock, so the table's streaming commits go on: read the files,
//!    drop the rows those vectors delete, write the outputs, note where each row landed;
//! 3. commit: load the current snapshot again. Streaming commits since may have deleted more rows
//!    of the inputs (their vectors grew); each such row is deleted at its new place by a vector
//!    the `replace` snapshot adds (`redelete.rs`), and the snapshot is built on the current one,
//!    its manifests carried without the inputs and their current vectors. An input that left the
//!    table, a vector that lost a position, or a schema change meanwhile make the rewrite stale:
//!    nothing is committed, its files are deleted, the next cycle decides again.
//!
//! On a format-v2 table the outputs keep the data sequence number of the snapshot chosen on (the
//! starting sequence number, as Iceberg-Java's `use-starting-sequence-number` does): equality
//! deletes committed meanwhile have higher ones and so apply to the outputs as they applied to
//! the inputs (`equality.rs`). A position delete committed meanwhile against an input (only a
//! keyless table writes one) makes the rewrite stale.
//! A commit of another writer (another engine) between choosing and publishing makes the publish
//! a conflict (the create-if-absent `v<N+1>`, or the SQL catalog's row swap) or the rewrite stale.
//!
//! # The index follows atomically
//!
//! The table commit is the truth, the index is persisted after it naming the snapshot it covers
//! (`sinks/pk_index`, recovery contract). After the compaction's commit the keys of the rewritten
//! rows are upserted at their new file and position (except the rows deleted meanwhile: their
//! keys already point at their newer rows, or nowhere) and the replaced files are forgotten, then
//! the index is persisted as covering the compaction's snapshot. A crash before the commit leaves
//! the old table and the old index (the written files are orphans for `cdcd cleanup`); a crash
//! after it leaves an index covering the parent, which the next commit catches up by replaying
//! the compaction's added files (live rows only: the carried vectors count) and forgetting the
//! files that left the table — the same as the in-process update.
//!
//! The moved keys' index runs are written between steps 2 and 3, without the lock (run ids and
//! the outputs' file ids reserved under it first: `sinks/pk_index/prepared.rs`), so step 3 only
//! installs them and puts back on top the current entries of the keys deleted meanwhile: moved
//! under the lock, ~2M keys a cycle held a 100M-row table's commits for 1-2.6 s. A compaction
//! that does not commit deletes its prepared runs.
//!
//! # Not done
//! - v2: files are picked by size only (how many of a file's rows the equality deletes remove is
//!   known only by reading it); the files an equality delete applies to that a cycle leaves in
//!   place have their deleted rows converted to positions (`convert.rs`) within a budget, beyond
//!   which an equality delete file stays while a file older than it is not rewritten.
//! - Puffin consolidation: each vector stays in its own Puffin file. Several blobs per Puffin
//!   file are what DuckDB 1.5.5 misreads (commit/files.rs); compaction instead removes the
//!   vectors of the files it rewrites.

mod convert;
mod equality;
mod lineage;
mod moves;
mod pick;
mod redelete;
mod replace;
mod rewrite;
mod summary;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use iceberg::spec::{FormatVersion, TableMetadata};
use object_store::ObjectStoreExt;

use super::expire_snapshots::checkpoint_snapshot;
use super::properties::Compaction;
use crate::changelog::TableId;
use crate::checkpoint::Checkpoint;
use crate::failpoints;
use crate::sinks::iceberg::deletes::deletion_vector::DeletionVector;
use crate::sinks::iceberg::files::manifest::LiveFile;
use crate::sinks::iceberg::files::metadata::Loaded;
use crate::sinks::iceberg::maintenance::metadata_log;
use crate::sinks::iceberg::rows::index::{IndexSlot, RewrittenOutput};
use crate::sinks::iceberg::rows::live::{LiveState, Rewritten};
use crate::sinks::iceberg::tables::{TableSlot, Tables};
use crate::sinks::pk_index::PreparedRuns;
use crate::sinks::SinkError;
use equality::V2Deletes;
use pick::{Candidate, Choice};
use redelete::Carry;
use replace::Replace;
use rewrite::{Input, Rewrite, Written};

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
    /// Rows deleted while the rewrite ran, deleted again in its outputs (v3).
    pub deletes_carried: u64,
    /// v2: rows of files left in place whose equality (and older position) deletes became
    /// one position delete file (`convert.rs`).
    pub positions_converted: u64,
}

/// A rewrite chosen under the table's lock (step 1), to carry out and commit.
struct Chosen<'a> {
    rewrite: Rewrite<'a>,
    /// v2: delete files the rewrite makes useless.
    dropped_deletes: HashSet<String>,
    /// v2: the outputs' data sequence number, the chosen snapshot's (`None`: the new one's).
    data_sequence: Option<i64>,
    /// The key columns the primary-key index keeps (`None`: no index follows).
    key_names: Option<Vec<String>>,
}

/// The compaction of one table's data files; see the module doc.
pub(in crate::sinks::iceberg) struct RewriteDataFiles<'a> {
    tables: &'a Tables,
    table: &'a TableId,
}

impl<'a> RewriteDataFiles<'a> {
    pub(in crate::sinks::iceberg) fn new(
        tables: &'a Tables,
        table: &'a TableId,
    ) -> RewriteDataFiles<'a> {
        RewriteDataFiles { tables, table }
    }

    /// Compacts the table once if its properties and files call for it; `Ok(None)` when nothing
    /// was rewritten (no table, disabled, nothing worth it, or the rewrite went stale). The
    /// module doc has the steps and which of them hold the table's slot lock.
    pub(in crate::sinks::iceberg) async fn commit(&self) -> Result<Option<Compacted>, SinkError> {
        let pause = failpoints::pause_point(failpoints::COMPACT_REWRITTEN);
        self.commit_beside(pause).await
    }

    /// [`commit`](Self::commit), running `meanwhile` between the rewrite and its commit,
    /// without the table's lock: where the tests land their racing commits.
    pub(in crate::sinks::iceberg) async fn commit_beside(
        &self,
        meanwhile: impl std::future::Future<Output = ()>,
    ) -> Result<Option<Compacted>, SinkError> {
        let slot = self.tables.slot(self.table);
        let mut guard = slot.lock().await;
        let started = Instant::now();
        let Some(chosen) = self.choose(&mut guard).await? else {
            return Ok(None);
        };
        let keys = chosen.key_names.as_deref();
        drop(guard);
        let chose = started.elapsed();
        let written = chosen.rewrite.write(keys).await?;
        let rewrote = started.elapsed();
        let mut prepared = match keys {
            Some(_) => self.prepare_index(&written).await,
            None => None,
        };
        let prepared_at = started.elapsed();
        meanwhile.await;
        let mut guard = slot.lock().await;
        let locked = Instant::now();
        let outputs: Vec<String> = written.outputs.iter().map(|o| o.path.clone()).collect();
        let committed = self
            .commit_rewrite(&mut guard, chosen, written, &mut prepared)
            .await;
        if let Some(prepared) = prepared.take() {
            let outputs: Vec<&str> = outputs.iter().map(String::as_str).collect();
            guard.index.forget_rewrite(prepared, &outputs).await;
        }
        let committed = committed?;
        // Where a compaction's time goes, and how long it held the table's commits (the choice,
        // the index runs' reservation, and the commit, which installs them).
        if let Some((_, index_moved)) = &committed {
            tracing::info!(
                table = %self.table,
                choose_ms = chose.as_millis() as u64,
                rewrite_ms = (rewrote - chose).as_millis() as u64,
                index_runs_ms = (prepared_at - rewrote).as_millis() as u64,
                commit_ms = locked.elapsed().as_millis() as u64,
                index_ms = index_moved.as_millis() as u64,
                "compaction phases"
            );
        }
        Ok(committed.map(|(compacted, _)| compacted))
    }

    /// Between steps 2 and 3: the index's runs of the moved keys, reserved under the table's
    /// lock and written without it (`sinks/pk_index/prepared.rs`), so the commit only installs
    /// them. `None` when the index is not open, or on an error (logged: the commit then moves
    /// the keys itself).
    async fn prepare_index(&self, written: &Written) -> Option<PreparedRuns> {
        let paths: Vec<&str> = written.outputs.iter().map(|o| o.path.as_str()).collect();
        let rows = written
            .outputs
            .iter()
            .flat_map(|o| &o.keys)
            .map(|b| b.num_rows() as u64)
            .sum();
        let runs = {
            let slot = self.tables.slot(self.table);
            let mut guard = slot.lock().await;
            guard.index.reserve_rewrite(&paths, rows).await?
        };
        let keys: Vec<&[arrow_array::RecordBatch]> =
            written.outputs.iter().map(|o| o.keys.as_slice()).collect();
        match runs.write(&keys).await {
            Ok(prepared) => Some(prepared),
            Err(e) => {
                tracing::warn!(table = %self.table, error = %e, "cannot write the primary-key index runs of a compaction; its commit moves the keys itself");
                None
            }
        }
    }

    /// Step 1: what to rewrite, from the current snapshot (`None`: nothing).
    async fn choose(&self, slot: &mut TableSlot) -> Result<Option<Chosen<'a>>, SinkError> {
        let (tables, table) = (self.tables, self.table);
        slot.index.settle().await;
        let Some(base) = tables.load(table).await? else {
            return Ok(None);
        };
        let meta = &base.metadata;
        let Some(current) = meta.current_snapshot() else {
            return Ok(None);
        };
        // An initial copy still under way (its checkpoint holds the copy's progress) is left
        // whole until its last commit: it adds a file of `snapshot_commit_rows` rows per commit,
        // and compacting them meanwhile merged the same rows again and again as the tiers grew
        // (a 100M-row copy rewrote a third of its bytes while copying, at the copy's cost in CPU
        // and memory: docs/performance.md, "A 100M-row table").
        if current
            .summary()
            .additional_properties
            .contains_key(crate::checkpoint::SNAPSHOT_KEY)
        {
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
        if !slot.live.as_ref().is_some_and(|l| l.describes(meta)) {
            slot.live = Some(LiveState::load(&tables.warehouse, table, meta).await?);
        }
        let Some(live) = slot.live.as_ref() else {
            return Ok(None);
        };
        let v3 = meta.format_version() >= FormatVersion::V3;
        let files = candidates(live, meta.default_partition_spec_id());
        let mut choice = pick::choose(&policy, &files, true);
        let mut staying = Vec::new();
        if !v3 {
            // Size tiers leave large files in place, which only the conversion lets an
            // equality delete get past (`convert.rs`); beyond its budget, the untiered pick.
            let budget = policy
                .max_bytes_per_cycle
                .saturating_mul(convert::CONVERT_BUDGET_FACTOR);
            match convert::staying_targets(
                live,
                &chosen_paths(live, &choice),
                budget,
                meta.default_partition_spec_id(),
            ) {
                Some(files) => staying = files,
                None => {
                    choice = pick::choose(&policy, &files, false);
                    let chosen = chosen_paths(live, &choice);
                    staying = convert::staying_targets(
                        live,
                        &chosen,
                        budget,
                        meta.default_partition_spec_id(),
                    )
                    .unwrap_or_default();
                }
            }
        }
        if choice.is_empty() && staying.is_empty() {
            return Ok(None);
        }
        let (v2, dropped_deletes) = self.v2_deletes(meta, live, &choice, &staying).await?;
        let inputs = inputs(live, &choice);
        let data_sequence = v2
            .is_some()
            .then(|| meta.current_snapshot().map(|s| s.sequence_number()))
            .flatten();
        let names = crate::sinks::iceberg::commit::Names::new(meta);
        Ok(Some(Chosen {
            rewrite: Rewrite {
                warehouse: &tables.warehouse,
                table,
                base,
                inputs,
                names,
                v2,
                staying,
            },
            dropped_deletes,
            data_sequence,
            key_names: slot.index.key_names(),
        }))
    }

    /// Step 3: commits `written` on the current snapshot, carrying over the deletes committed
    /// since step 1, with the time the index's move after it took; `Ok(None)` when the rewrite
    /// went stale (its files are deleted).
    async fn commit_rewrite(
        &self,
        slot: &mut TableSlot,
        chosen: Chosen<'_>,
        written: Written,
        prepared: &mut Option<PreparedRuns>,
    ) -> Result<Option<(Compacted, Duration)>, SinkError> {
        let (tables, table) = (self.tables, self.table);
        slot.index.settle().await;
        let Some(current) = tables.load(table).await? else {
            return self.stale("the table is gone".into(), &written).await;
        };
        let base = &chosen.rewrite.base.metadata;
        if current.metadata.current_schema_id() != base.current_schema_id() {
            return self
                .stale("the table's schema changed".into(), &written)
                .await;
        }
        // The outputs were laid out in the spec chosen on, and are listed under the current one.
        if current.metadata.default_partition_spec_id() != base.default_partition_spec_id() {
            return self
                .stale("the table's partition spec changed".into(), &written)
                .await;
        }
        if !slot
            .live
            .as_ref()
            .is_some_and(|l| l.describes(&current.metadata))
        {
            slot.live = Some(LiveState::load(&tables.warehouse, table, &current.metadata).await?);
        }
        // Out of the slot while the commit reads it; put back advanced to the `replace`
        // snapshot after a commit (so the next commit reads nothing back), unchanged when the
        // rewrite is stale, and left out after a failure (the next commit rereads it).
        let Some(mut live) = slot.live.take() else {
            return Ok(None);
        };
        // Committing an input that left the table (another writer's rewrite, a truncate) would
        // bring its rows back; a converted file that left was replaced by one the dropped
        // equality deletes may still apply to.
        let gone = {
            let data: HashSet<&str> = live.files.data.iter().map(|f| f.file.file_path()).collect();
            written
                .placed
                .iter()
                .map(|p| p.input.as_str())
                .chain(chosen.rewrite.staying.iter().map(|f| f.file.file_path()))
                .find(|p| !data.contains(p))
                .map(|p| format!("{p} left the table"))
        };
        if let Some(why) = gone {
            slot.live = Some(live);
            return self.stale(why, &written).await;
        }
        let carried = if let Some(since) = chosen.data_sequence {
            let inputs: HashSet<&str> = written.placed.iter().map(|p| p.input.as_str()).collect();
            if equality::inputs_deleted_since(&tables.warehouse, &live, since, &inputs).await? {
                slot.live = Some(live);
                let why = "a position delete was committed against an input".to_owned();
                return self.stale(why, &written).await;
            }
            BTreeMap::new()
        } else {
            let data: HashSet<&str> = live.files.data.iter().map(|f| f.file.file_path()).collect();
            match redelete::carried_deletes(&written.placed, &data, &live.dvs) {
                Carry::Deletes(d) => d,
                Carry::Stale(why) => {
                    slot.live = Some(live);
                    return self.stale(why, &written).await;
                }
            }
        };
        // The live state learns a rewrite's files, not a converted position delete file: after
        // a conversion the next commit reads the state back from the table.
        let converted = written.converted.is_some();
        let (compacted, rewritten, index_moved) = self
            .publish_rewrite(
                &mut slot.index,
                current,
                &live,
                (chosen, written, prepared),
                carried,
            )
            .await?;
        if !converted {
            live.apply_rewrite(rewritten);
            slot.live = Some(live);
        }
        Ok(Some((compacted, index_moved)))
    }

    /// Writes the `replace` snapshot of `written` on `current` (whose state is `live`) with the
    /// `carried` deletes, publishes it and moves the index; returns what `live` must learn.
    async fn publish_rewrite(
        &self,
        index: &mut IndexSlot,
        current: Arc<Loaded>,
        live: &LiveState,
        (chosen, written, prepared): (Chosen<'_>, Written, &mut Option<PreparedRuns>),
        carried: BTreeMap<String, DeletionVector>,
    ) -> Result<(Compacted, Rewritten, Duration), SinkError> {
        let (tables, table) = (self.tables, self.table);
        let meta = &current.metadata;
        let parent = meta.current_snapshot().map(|s| s.snapshot_id());
        let checkpoint = self.carried_checkpoint(meta)?;
        let replace = Replace {
            warehouse: &tables.warehouse,
            table,
            base: Arc::clone(&current),
            live,
            names: chosen.rewrite.names.rebased(meta),
            replaced: written
                .removed_data
                .iter()
                .map(|f| f.file_path().to_owned())
                .collect(),
            dropped_deletes: chosen.dropped_deletes,
            data_sequence: chosen.data_sequence,
        };
        let vectors = replace.write_vectors(carried, &written).await?;
        let mut manifests = replace.carry().await?;
        let staged = replace
            .stage(&written, &vectors, &mut manifests, checkpoint.as_ref())
            .await?;
        // Conflict or unknown outcome: the next load tells; the files are orphans.
        let after = tables.commit_metadata(table, &current, staged.next).await?;
        failpoints::crash_point(failpoints::COMPACT_AFTER_COMMIT);
        metadata_log::delete_after_commit(
            &tables.warehouse,
            &current,
            &after,
            tables.catalog_for(table).names_previous(),
        );
        let removed: Vec<&str> = written.removed_data.iter().map(|f| f.file_path()).collect();
        let outputs: Vec<RewrittenOutput<'_>> = written
            .outputs
            .iter()
            .map(|o| RewrittenOutput {
                path: &o.path,
                keys: &o.keys,
                deleted: vectors.vectors.get(&o.path).map(|(_, dv)| dv),
            })
            .collect();
        // Keys were read only if the index was open when the rewrite was chosen.
        let keyed = chosen.key_names.is_some().then_some(outputs.as_slice());
        let moving = Instant::now();
        index
            .follow_rewrite(
                parent,
                &removed,
                keyed,
                prepared.take(),
                replace.names.snapshot_id,
            )
            .await;
        let index_moved = moving.elapsed();
        let mut compacted = Compacted::of(&written, manifests.removed_deletes.len());
        compacted.deletes_carried = vectors
            .vectors
            .values()
            .map(|(_, dv)| dv.cardinality())
            .sum();
        let rewritten = Rewritten {
            snapshot_id: replace.names.snapshot_id,
            sequence: replace.names.sequence,
            data_sequence: replace.data_sequence(),
            manifests: staged.listed,
            added: written.outputs.into_iter().map(|o| o.file).collect(),
            added_manifest: staged.added_manifest,
            spec_id: meta.default_partition_spec_id(),
            rewritten: manifests.rewritten,
            removed_data: replace.replaced,
            removed_deletes: replace.dropped_deletes,
            vectors: vectors.vectors,
            vectors_manifest: staged.vectors_manifest,
        };
        Ok((compacted, rewritten, index_moved))
    }

    /// Gives up a rewrite that no longer applies (`why`) and deletes its files (best effort:
    /// what is left is an orphan for `cdcd cleanup`).
    async fn stale<T>(&self, why: String, written: &Written) -> Result<Option<T>, SinkError> {
        let warehouse = &self.tables.warehouse;
        tracing::info!(table = %self.table, reason = %why, "compaction went stale; nothing committed, the next cycle decides again");
        let converted = written.converted.iter().map(|f| f.file_path());
        for at in written
            .outputs
            .iter()
            .map(|o| o.path.as_str())
            .chain(converted)
        {
            let Ok(path) = warehouse.path(at) else {
                continue;
            };
            if let Err(e) = warehouse.store().delete(&path).await {
                tracing::debug!(path = %at, error = %e, "cannot delete a stale compaction output; cdcd cleanup will");
            }
        }
        Ok(None)
    }

    /// v2: the deletes the rewrite of `choice` and the conversion of `staying` apply, and the
    /// delete files they drop (`equality.rs`, `convert.rs`); nothing on v3, whose vectors are in
    /// `live`.
    async fn v2_deletes(
        &self,
        meta: &TableMetadata,
        live: &LiveState,
        choice: &Choice,
        staying: &[LiveFile],
    ) -> Result<(Option<V2Deletes>, HashSet<String>), SinkError> {
        if meta.format_version() >= FormatVersion::V3 {
            return Ok((None, HashSet::new()));
        }
        // A converted file's positions carry those of the position delete files naming it, as a
        // rewritten file's rows leave them behind: both kinds of file count as handled.
        let mut chosen = chosen_paths(live, choice);
        chosen.extend(staying.iter().map(|f| f.file.file_path()));
        let schema = meta.current_schema();
        let file_schema = crate::sinks::iceberg::schema::data_file_schema(schema)?;
        let warehouse = &self.tables.warehouse;
        let deletes =
            V2Deletes::load(warehouse, self.table, live, schema, &file_schema, &chosen).await?;
        let dropped = deletes.droppable(live, &chosen);
        Ok((Some(deletes), dropped))
    }

    /// The checkpoint the compaction's snapshot carries: that of the newest snapshot of `main`
    /// with one of this pipeline (normally the current one).
    fn carried_checkpoint(&self, meta: &TableMetadata) -> Result<Option<Checkpoint>, SinkError> {
        let pipeline = &self.tables.pipeline;
        let Some(id) = checkpoint_snapshot(pipeline, meta)? else {
            return Ok(None);
        };
        let Some(snapshot) = meta.snapshot_by_id(id) else {
            return Ok(None);
        };
        Ok(Checkpoint::from_properties(
            pipeline,
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
            deletes_carried: 0,
            positions_converted: written.converted.as_ref().map_or(0, |f| f.record_count()),
        }
    }
}

/// The paths of the files `choice` rewrites.
fn chosen_paths<'a>(live: &'a LiveState, choice: &Choice) -> HashSet<&'a str> {
    choice
        .inputs()
        .filter_map(|i| live.files.data.get(i))
        .map(|f| f.file.file_path())
        .collect()
}

/// The picker's view of `live`'s data files (v3: their vectors' cardinality; v2: none known).
fn candidates(live: &LiveState, default_spec: i32) -> Vec<Candidate> {
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
            partition: pick::Group::of(f, default_spec),
        })
        .collect()
}

/// The chosen files of `live` by output, each with the vector it has now (copied: the rewrite
/// reads it without the lock).
fn inputs(live: &LiveState, choice: &Choice) -> Vec<Vec<Input>> {
    choice
        .outputs
        .iter()
        .map(|output| {
            output
                .iter()
                .filter_map(|&i| live.files.data.get(i))
                .map(|f| Input {
                    file: f.clone(),
                    dv: live.dvs.get(f.file.file_path()).map(|d| d.dv.clone()),
                })
                .collect()
        })
        .collect()
}
