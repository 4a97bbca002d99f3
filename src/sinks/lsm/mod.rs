//! LSM sink: Apache Paimon primary-key tables (fixed buckets, `deduplicate` merge engine), with
//! universal compaction in the background and snapshot expiry; keyless tables as Paimon append
//! tables (`append.rs`).
//!
//! Sits at the end of the flow: pipeline → [`LsmSink::commit`] → (durable) → ack to source. Each
//! commit writes, per touched bucket, one level-0 Parquet file holding the last state of every key
//! the commit changed (`plan.rs`), and publishes it as one `APPEND` snapshot whose `properties`
//! carry the checkpoint (`commit.rs`). An initial copy's commits (checkpoint with copy progress,
//! or after a TRUNCATE) put blocks of keys no live file's range holds straight into the bottom
//! level instead, so the copy is not rewritten by compaction (`placement.rs` says when and why).
//! A background task per table merges sorted runs
//! (`compaction/pick.rs` decides, `compaction/worker.rs` does it) and publishes `COMPACT` snapshots that carry
//! the same checkpoint; readers see either the runs before or the merged file after. Commits wait
//! while a bucket has `stop_trigger` runs or more, so compaction can never fall behind for good.
//! Old snapshots and the files only they reference are deleted (`expire.rs`).
//!
//! Why cdcd completes partial rows itself instead of relying on Paimon's `partial-update` merge
//! engine: that engine reads a NULL field as "unchanged", so an UPDATE that sets a column to NULL
//! would be lost. With `deduplicate`, cdcd fills absent columns (unchanged TOAST values) from the
//! row's current value and every file holds whole rows. `merge_engine = "partial-update"` is
//! offered for users who accept that: absent columns are then written NULL without a lookup.
//!
//! Layout (`<warehouse>/<namespace>.db/<table>/`, Paimon's filesystem catalog): `schema/schema-0`,
//! `snapshot/snapshot-N` + `LATEST` + `EARLIEST`, `manifest/`, `bucket-<n>/data-*.parquet`.
//!
//! Files by role: `schema.rs` (types, schema JSON, data file shape), `binary_row.rs` (Paimon's
//! `BinaryRow` and bucket hash), `plan.rs` (pure: changes → one row per key), `placement.rs`
//! (pure: level 0 or bottom-level files for a copy commit's rows), `lookup.rs`
//! (current rows for partial updates), `writer.rs` (Parquet runs and their `DataFileMeta`),
//! `manifest.rs` (Avro), `commit.rs` (load and publish snapshots), `append.rs` (keyless tables), `compaction/pick.rs` (pure:
//! pick and merge), `compaction/worker.rs` (the worker), `expire.rs`, `resync.rs` (`cdcd resync`: a lineage table
//! beside the live one, swapped in by one `OVERWRITE` snapshot). The Iceberg sink's planner and row
//! lookup are not shared on purpose: Iceberg deletes rows by key across files, whereas an LSM
//! commit folds the changes of a key into one upsert or delete, so the two planners have little
//! in common beyond Arrow `interleave`, and the Parquet writing shared would be a few lines.
//!
//! Deletion-vector mode (`deletion_vectors = true`, Paimon `deletion-vectors.enabled`): readers
//! skip level 0 and read the higher levels without merging. cdcd keeps that valid without
//! writing deletion-vector index files: every compaction merges a bucket's level-0 runs with its
//! single bottom run into a new bottom run (deletes dropped), so each key is in one file. Rows
//! become visible to readers when the background compaction after their commit has published
//! (an initial copy's bottom-level files at once: each holds keys no other file has).
//!
//! Concurrency: each table has one handle whose state sits behind a tokio mutex, held across the
//! awaits of one commit (a commit is read-modify-write of the table's newest snapshot; the
//! writer and the compactor take turns). The compactor does its reading and merging without the
//! lock and re-checks, under it, that its inputs are still live before publishing. A copy commit
//! puts files at the bottom level only while no compaction runs (`Handle::compacting`, read under
//! the lock): a compaction's output goes to a level chosen from the inputs it read, and could
//! otherwise overlap the new files' key ranges there.

// `SinkError` is large (it carries `iceberg::Error`); see sinks/iceberg/mod.rs.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::changelog::{TableChanges, TableId, TableSchema};
use crate::checkpoint::Checkpoint;
use crate::config::{LsmConfig, MergeEngine};
use crate::sinks::{CommitStats, Sink, SinkError, TableFiles, TableStatus};
use crate::storage::cleanup::TableCleanup;
use crate::storage::Warehouse;

mod append;
pub mod binary_row;
pub mod cleanup;
pub mod compaction;
pub mod config;
mod expire;
mod files;
mod lookup;
pub mod manifest;
mod placement;
pub mod plan;
mod publish;
mod resync;
pub mod schema;
mod snapshot;
mod store;
mod table;
mod tables;
mod writer;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;

pub use compaction::CompactStats;
use schema::FileSchemas;
use table::{Change, TableState};
use tables::{Handle, Tables};

/// How long a clean stop waits for background compactions ([`Sink::settle`]).
const SETTLE_GRACE: Duration = Duration::from_secs(10);

/// Writes Paimon primary-key tables under one warehouse for one pipeline.
#[derive(Clone)]
pub struct LsmSink {
    tables: Arc<Tables>,
}

impl LsmSink {
    pub fn new(config: &LsmConfig, pipeline: &str) -> Result<LsmSink, SinkError> {
        Ok(LsmSink::with_warehouse(
            config,
            pipeline,
            Warehouse::from_url(&config.warehouse)?,
        ))
    }

    /// Writes through `warehouse` (opened with `[sink.s3]` settings) instead of the store opened
    /// from the URL alone.
    pub fn with_warehouse(config: &LsmConfig, pipeline: &str, warehouse: Warehouse) -> LsmSink {
        LsmSink {
            tables: Arc::new(Tables::new(config, pipeline, warehouse)),
        }
    }

    /// `source.schema_change`: with `stop`, a commit that would change a table's schema fails.
    /// Set before the sink is shared.
    pub fn with_schema_change(
        mut self,
        schema_change: crate::config::SchemaChangePolicy,
    ) -> LsmSink {
        if let Some(tables) = Arc::get_mut(&mut self.tables) {
            tables.schema_change = schema_change;
        }
        self
    }

    /// `<warehouse>/<namespace>.db/<table>`; namespace = the configured one or the source schema.
    pub fn table_location(&self, table: &TableId) -> String {
        self.tables.live_location(table)
    }

    /// Live data files per bucket (for the benchmark and tests).
    pub async fn files_per_bucket(
        &self,
        table: &TableId,
    ) -> Result<BTreeMap<i32, usize>, SinkError> {
        let handle = self.tables.handle(table);
        let mut guard = handle.state.lock().await;
        self.tables.ensure_loaded(table, &mut guard).await?;
        Ok(guard
            .as_ref()
            .map(|s| s.files.iter().map(|(b, f)| (*b, f.len())).collect())
            .unwrap_or_default())
    }

    /// Compacts `table` now, in the caller's task: `full` merges every bucket into one bottom
    /// run (deletes dropped); otherwise only what the universal picker asks for.
    pub async fn compact(&self, table: &TableId, full: bool) -> Result<CompactStats, SinkError> {
        let handle = self.tables.handle(table);
        // Marked as running, so commits meanwhile write level 0 only (see "Concurrency").
        let marked = !handle.compacting.swap(true, Ordering::AcqRel);
        let result = compaction::worker::run(&self.tables, &handle, full).await;
        if marked {
            handle.compacting.store(false, Ordering::Release);
            handle.progress.notify_waiters();
        }
        result
    }

    /// Expires old snapshots of `table` now (commits also do it every 10 snapshots); returns how
    /// many were removed.
    pub async fn expire(&self, table: &TableId) -> Result<usize, SinkError> {
        let handle = self.tables.handle(table);
        {
            let mut guard = handle.state.lock().await;
            self.tables.ensure_loaded(table, &mut guard).await?;
        }
        expire::expire(&self.tables, &handle).await
    }

    /// What the background compactor of `table` did so far, and the time it spent.
    pub fn background_compaction(&self, table: &TableId) -> (CompactStats, Duration) {
        let handle = self.tables.handle(table);
        let totals = handle.totals.lock().map(|t| t.clone());
        totals.unwrap_or_default()
    }

    /// Waits until no background compaction of `table` is running.
    pub async fn wait_compaction(&self, table: &TableId) {
        let handle = self.tables.handle(table);
        while handle.compacting.load(Ordering::Acquire) {
            let _ =
                tokio::time::timeout(Duration::from_millis(200), handle.progress.notified()).await;
        }
    }

    async fn commit_inner(
        &self,
        schema: &TableSchema,
        changes: &[TableChanges],
        checkpoint: &Checkpoint,
    ) -> Result<CommitStats, SinkError> {
        let tables = &self.tables;
        let table = &schema.id;
        let handle = tables.handle(table);
        let widened = tables.behind(schema, changes, &handle).await?;
        let (schema, changes) = match &widened {
            Some((newer, widened)) => (newer.as_ref(), widened.as_slice()),
            None => (schema, changes),
        };
        if schema.primary_key.is_empty() {
            return tables
                .commit_append(&handle, schema, changes, checkpoint)
                .await;
        }
        tables.stall(&handle).await?;
        let wanted = schema::paimon_schema(schema, tables.table_options())?;
        let mut guard = handle.state.lock().await;
        tables.refuse_added_defaults(schema, &mut guard).await?;
        let state = tables.ensure_created(schema, &mut guard, &wanted).await?;
        let schemas = FileSchemas::new(schema)
            .with_schema_id(state.schema.id)
            .with_aliases(state.aliases.clone());
        let buckets = state.buckets(tables.config.buckets);
        let complete = tables.config.merge_engine == MergeEngine::Deduplicate;
        let mut plan =
            plan::plan(changes, &schemas, buckets, complete).map_err(|e| SinkError::Data {
                table: table.clone(),
                detail: format!("planning the commit: {e}"),
            })?;
        let (lookup_batch, found) =
            lookup::lookup(&tables.warehouse, table, state, &schemas, &plan, changes).await?;
        // A key whose partial updates found no row inside an upsert window ends deleted
        // (lookup.rs): the row is deleted later inside the window anyway.
        for (i, f) in found.iter().enumerate() {
            let row = plan.lookups.get(i).map(|l| l.row).filter(|_| f.is_none());
            if let Some(out) = row.and_then(|r| plan.rows.get_mut(r)) {
                out.delete = true;
            }
        }
        let base = state.next_sequence;
        let batch = plan
            .build(&schemas, base, lookup_batch.as_ref(), &found)
            .map_err(|e| SinkError::Data {
                table: table.clone(),
                detail: format!("building data files: {e}"),
            })?;
        // An initial copy's key blocks go straight to the bottom level (placement.rs), unless
        // a compaction is running: its output, placed by the inputs it read, could then
        // overlap them on its level.
        let copying = checkpoint.snapshot.is_some() || plan.truncate;
        let to_bottom = copying && !handle.compacting.load(Ordering::Acquire);
        let chunks: Vec<Option<u32>> = changes.iter().map(|c| c.copy_chunk).collect();
        let mut files = Vec::new();
        for (bucket, first, len) in plan.bucket_ranges() {
            let part = batch.slice(first, len);
            let bottom = if to_bottom {
                let live = if plan.truncate {
                    &[][..]
                } else {
                    state
                        .files
                        .get(&(bucket as i32))
                        .map_or(&[][..], Vec::as_slice)
                };
                placement::for_bucket(&plan, &chunks, &schemas, first, &part, live)
            } else {
                None
            };
            match bottom {
                Some(cuts) => {
                    let level = tables.compaction.max_level;
                    for (start, rows) in cuts {
                        files.push((bucket as i32, part.slice(start, rows), level));
                    }
                }
                None => files.push((bucket as i32, part, 0)),
            }
        }
        let written =
            futures::future::try_join_all(files.into_iter().map(|(bucket, part, level)| {
                let location = &state.location;
                let schemas = &schemas;
                async move {
                    let file = files::write_file(
                        &tables.warehouse,
                        table,
                        location,
                        schemas,
                        bucket,
                        part,
                        level,
                        0,
                    )
                    .await?;
                    Ok::<_, SinkError>((bucket, file))
                }
            }))
            .await?;
        let change = Change {
            added: written,
            ..Change::default()
        };
        let files_written = change.added.len();
        let (snapshot_id, truncated) = tables
            .publish_commit(
                table,
                &mut guard,
                change,
                plan.truncate,
                checkpoint,
                buckets as i32,
            )
            .await?;
        let deleted_rows = plan.rows.iter().filter(|r| r.delete).count() as u64 + truncated;
        let Some(state) = guard.as_mut() else {
            return Err(SinkError::Corrupt {
                path: tables.table_location(table),
                detail: "the table's state vanished during a commit".into(),
            });
        };
        state.next_sequence = state.next_sequence.max(base + plan.changes as i64 + 1);
        handle
            .copying
            .store(checkpoint.snapshot.is_some(), Ordering::Release);
        let needs_compaction = tables.needs_compaction(state, &handle);
        drop(guard);
        if needs_compaction {
            tables.spawn_compaction(&handle);
        }
        tables.expire_if_due(&handle, snapshot_id).await;
        Ok(CommitStats {
            snapshot_id,
            data_rows: plan.rows.len() as u64
                - plan.rows.iter().filter(|r| r.delete).count() as u64,
            deleted_rows,
            files_written,
            resync_swapped: false,
        })
    }
}

impl Tables {
    /// `None` when the changes can be committed as they are.
    async fn behind(
        &self,
        schema: &TableSchema,
        changes: &[TableChanges],
        handle: &Arc<Handle>,
    ) -> Result<Option<(Arc<TableSchema>, Vec<TableChanges>)>, SinkError> {
        let table = &schema.id;
        let wanted = schema::paimon_schema(schema, self.table_options())?;
        let mut guard = handle.state.lock().await;
        self.ensure_loaded(table, &mut guard).await?;
        let Some(state) = guard.as_ref() else {
            return Ok(None);
        };
        let forward = renames(schema, &state.schema);
        let behind = match schema::evolution(&state.schema, &wanted, &forward) {
            schema::Evolution::Behind => true,
            // A rename whose schema file landed before the crash: the table's older names
            // lead back to the changes' ones.
            schema::Evolution::Incompatible(_) => {
                schema::behind_by_renames(&state.schema, &wanted, &state.aliases)
            }
            schema::Evolution::Same | schema::Evolution::To(_) => false,
        };
        if !behind {
            return Ok(None);
        }
        // Only a schema the table really had is a replay; anything else (a narrowing on the
        // source) is left to `ensure_created`, which refuses it.
        let mut had = false;
        for id in (state.lineage_start..state.schema.id).rev() {
            let older = table::read_schema(&self.warehouse, &state.location, id).await?;
            if older.is_some_and(|older| schema::difference(&older, &wanted).is_none()) {
                had = true;
                break;
            }
        }
        if !had {
            return Ok(None);
        }
        let mut newer =
            schema::table_schema(table, &state.schema).map_err(|detail| SinkError::Corrupt {
                path: state.location.clone(),
                detail,
            })?;
        for column in &mut newer.columns {
            column.former_names = state
                .aliases
                .iter()
                .filter(|(_, now)| **now == column.name)
                .map(|(old, _)| old.clone())
                .collect();
        }
        let newer = Arc::new(newer);
        let widened = changes
            .iter()
            .map(|c| c.evolve(&newer))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| SinkError::Arrow {
                context: format!("widening the changes of {table} to the table's schema"),
                source,
            })?;
        tracing::info!(table = %table, schema_id = state.schema.id, "the table is already at a newer schema: committing the older changes widened to it");
        Ok(Some((newer, widened)))
    }

    /// Refuses changes that add a column with a default the table's existing rows must read:
    /// Paimon has no initial default (a column added to a Paimon table reads NULL in older
    /// files), so they would read NULL where the source holds the default.
    async fn refuse_added_defaults(
        &self,
        schema: &TableSchema,
        slot: &mut Option<TableState>,
    ) -> Result<(), SinkError> {
        if schema.columns.iter().all(|c| c.initial_default.is_none()) {
            return Ok(());
        }
        self.ensure_loaded(&schema.id, slot).await?;
        let Some(state) = slot.as_ref() else {
            return Ok(());
        };
        let added: Vec<&str> = schema
            .columns
            .iter()
            .filter(|c| c.initial_default.is_some())
            .filter(|c| !state.schema.fields.iter().any(|f| f.name == c.name))
            .map(|c| c.name.as_str())
            .collect();
        if added.is_empty() {
            return Ok(());
        }
        Err(SinkError::SchemaChanged {
            table: schema.id.clone(),
            detail: format!(
                "column {} is added with a default the existing rows hold; a Paimon table has no initial default (they would read NULL)",
                added.join(", ")
            ),
        })
    }

    /// The table's state in `slot`, loaded, or created with schema `wanted` when it does not
    /// exist; evolved to `wanted` when that adds columns or widens types (a new `schema-N`
    /// file before the commit that first writes under it); refused otherwise.
    async fn ensure_created<'a>(
        &self,
        changes_schema: &TableSchema,
        slot: &'a mut Option<TableState>,
        wanted: &schema::PaimonSchema,
    ) -> Result<&'a mut TableState, SinkError> {
        let table = &changes_schema.id;
        self.ensure_loaded(table, slot).await?;
        if slot.is_none() {
            let location = self.table_location(table);
            table::create_schema(&self.warehouse, &location, wanted).await?;
            tracing::info!(table = %table, location = %location, "created Paimon table");
            self.ensure_loaded(table, slot).await?;
        }
        let evolution = match slot.as_ref() {
            Some(state) => schema::evolution(
                &state.schema,
                wanted,
                &renames(changes_schema, &state.schema),
            ),
            None => {
                return Err(SinkError::Corrupt {
                    path: self.table_location(table),
                    detail: "schema/schema-0 exists but cannot be loaded".into(),
                })
            }
        };
        if let schema::Evolution::To(next) = &evolution {
            if self.schema_change.for_table(table) == crate::config::SchemaChange::Stop {
                let detail = slot
                    .as_ref()
                    .and_then(|state| schema::difference(&state.schema, next))
                    .unwrap_or_default();
                return Err(SinkError::SchemaChanged {
                    table: table.clone(),
                    detail: format!(
                        "{detail}; source.schema_change = \"stop\" (for this table) keeps the lake's schema as it is (change it by hand, or set schema_change = \"evolve\" for it)"
                    ),
                });
            }
            let location = self.table_location(table);
            // A name an earlier schema had: cdcd reads older files by name (lookups,
            // compaction), so a dropped column's old values would show through.
            let current = slot.as_ref().map(|s| (s.schema.clone(), s.lineage_start));
            if let Some((current, lineage_start)) = current {
                // Added columns, and columns renamed to a new name.
                let added: Vec<&str> = next
                    .fields
                    .iter()
                    .filter(|f| {
                        f.id > current.highest_field_id
                            || current
                                .fields
                                .iter()
                                .any(|c| c.id == f.id && c.name != f.name)
                    })
                    .map(|f| f.name.as_str())
                    .collect();
                for id in lineage_start..current.id {
                    let older = table::read_schema(&self.warehouse, &location, id).await?;
                    if let Some(name) = older.and_then(|o| {
                        added
                            .iter()
                            .find(|a| o.fields.iter().any(|f| f.name == **a))
                            .map(|a| a.to_string())
                    }) {
                        return Err(SinkError::SchemaChanged {
                            table: table.clone(),
                            detail: format!(
                                "column {name} is added (or a column renamed to it) after an earlier column of that name was dropped or renamed, which cdcd does not apply"
                            ),
                        });
                    }
                }
            }
            // A schema file left by an attempt whose commit did not land, or another writer's,
            // may hold this id already: it wins, and must then be this evolution.
            table::create_schema(&self.warehouse, &location, next).await?;
            crate::failpoints::crash_point(crate::failpoints::LSM_SCHEMA_WRITTEN);
            *slot = None;
            self.ensure_loaded(table, slot).await?;
        }
        let Some(state) = slot.as_mut() else {
            return Err(SinkError::Corrupt {
                path: self.table_location(table),
                detail: "the table vanished while its schema evolved".into(),
            });
        };
        match evolution {
            schema::Evolution::Same => Ok(state),
            schema::Evolution::To(_) => {
                if let Some(detail) = schema::difference(&state.schema, wanted) {
                    return Err(SinkError::SchemaChanged {
                        table: table.clone(),
                        detail,
                    });
                }
                tracing::info!(table = %table, schema_id = state.schema.id, "evolved the Paimon table's schema");
                Ok(state)
            }
            schema::Evolution::Behind | schema::Evolution::Incompatible(_) => {
                Err(SinkError::SchemaChanged {
                    table: table.clone(),
                    detail: schema::difference(&state.schema, wanted).unwrap_or_default(),
                })
            }
        }
    }

    /// Publishes `change` as one snapshot of the table in `slot` carrying `checkpoint`: an
    /// `APPEND`, or after a TRUNCATE an `OVERWRITE` that also deletes every live file. On failure
    /// the cached state is dropped (the next commit reloads what is durable). Returns the new
    /// snapshot id and the rows the truncate removed.
    async fn publish_commit(
        &self,
        table: &TableId,
        slot: &mut Option<TableState>,
        mut change: Change,
        truncate: bool,
        checkpoint: &Checkpoint,
        buckets: i32,
    ) -> Result<(i64, u64), SinkError> {
        let Some(state) = slot.as_mut() else {
            return Err(SinkError::Corrupt {
                path: self.table_location(table),
                detail: "a commit to a table that is not loaded".into(),
            });
        };
        let mut truncated = 0u64;
        if truncate {
            for (b, files) in &state.files {
                truncated += files.iter().map(|f| f.row_count as u64).sum::<u64>();
                change.deleted.extend(files.iter().map(|f| (*b, f.clone())));
            }
        }
        let kind = if truncate { "OVERWRITE" } else { "APPEND" };
        let props: BTreeMap<String, String> = checkpoint.to_properties().into_iter().collect();
        let published =
            publish::publish(&self.warehouse, table, state, change, kind, props, buckets).await;
        match published {
            Ok(id) => Ok((id, truncated)),
            Err(e) => {
                *slot = None;
                Err(e)
            }
        }
    }

    /// Expires old snapshots after the commit of `snapshot_id` when due (`expire::due`); a
    /// failure is logged and retried after a later commit (the commit itself stands).
    async fn expire_if_due(&self, handle: &Arc<Handle>, snapshot_id: i64) {
        let due = {
            let guard = handle.state.lock().await;
            guard.as_ref().is_some_and(|state| {
                expire::due(
                    state,
                    &self.config,
                    handle.expiry_tried.load(Ordering::Acquire),
                )
            })
        };
        if !due {
            return;
        }
        handle.expiry_tried.store(snapshot_id, Ordering::Release);
        if let Err(e) = expire::expire(self, handle).await {
            tracing::warn!(table = %handle.table, error = %e, "snapshot expiry failed; retried after a later commit");
        }
    }
}

#[async_trait]
impl Sink for LsmSink {
    fn multiset_refusal(&self) -> Option<&'static str> {
        // A Paimon primary-key table cannot hold two equal rows, and an append table has no
        // row-level delete that readers (pypaimon) apply reliably (sinks/lsm/append.rs).
        Some("a Paimon primary-key table cannot hold duplicate rows, and Paimon append tables have no row-level delete its readers apply")
    }

    fn resync_refusal(&self) -> Option<String> {
        None
    }

    async fn resync(
        &self,
        table: &TableId,
        id: &str,
        mode: crate::sinks::ResyncMode,
    ) -> Result<crate::sinks::ResyncState, SinkError> {
        self.tables.begin_resync(table, id, mode).await
    }

    async fn abandon_resync(&self, table: &TableId, id: &str) {
        self.tables.abandon_lineage(table, id).await;
    }

    /// Lets the tables' background compactions end, for up to [`SETTLE_GRACE`] in all: a clean
    /// stop then leaves no compaction cut off between its snapshot create and the retry of a
    /// lost answer to it (harmless, the snapshot is whole, but nobody then knows it landed) and
    /// fewer orphans. A longer one is left to the process's exit (crash-safe at every await).
    async fn settle(&self) {
        let handles = self.tables.handles();
        let deadline = tokio::time::Instant::now() + SETTLE_GRACE;
        for handle in handles {
            while handle.compacting.load(Ordering::Acquire) {
                if tokio::time::Instant::now() >= deadline {
                    tracing::info!(table = %handle.table, "stopping with a compaction still running (its files become orphans for `cdcd cleanup`)");
                    return;
                }
                let _ =
                    tokio::time::timeout(Duration::from_millis(100), handle.progress.notified())
                        .await;
            }
        }
    }

    async fn checkpoint(&self, table: &TableId) -> Result<Option<Checkpoint>, SinkError> {
        let handle = self.tables.handle(table);
        let mut guard = handle.state.lock().await;
        // Always from storage: a restart must see what is durable, not a cache.
        *guard = table::load(&self.tables.warehouse, &self.tables.table_location(table)).await?;
        match guard.as_ref() {
            // Walk back: a snapshot by another writer carries no checkpoint of this pipeline.
            Some(state) => self.tables.checkpoint_in(state).await,
            None => Ok(None),
        }
    }

    async fn commit(
        &self,
        schema: &Arc<TableSchema>,
        changes: &[TableChanges],
        checkpoint: &Checkpoint,
    ) -> Result<CommitStats, SinkError> {
        let mut stats = self.commit_inner(schema, changes, checkpoint).await?;
        stats.resync_swapped = self
            .tables
            .swap_if_due(&schema.id, &checkpoint.position)
            .await?;
        Ok(stats)
    }

    async fn status(&self, table: &TableId) -> Result<Option<TableStatus>, SinkError> {
        let handle = self.tables.handle(table);
        let mut guard = handle.state.lock().await;
        *guard = table::load(&self.tables.warehouse, &self.tables.table_location(table)).await?;
        let Some(state) = guard.as_ref() else {
            return Ok(None);
        };
        let checkpoint = match state.snapshot.as_ref().and_then(|s| s.properties.as_ref()) {
            Some(p) => {
                let p: HashMap<String, String> = p.clone().into_iter().collect();
                Checkpoint::from_properties(&self.tables.pipeline, &p)?
            }
            None => None,
        };
        // Snapshots kept: from EARLIEST (moved first by expiry) to the newest.
        let snapshots = match &state.snapshot {
            Some(s) => {
                let earliest = snapshot::earliest_id(&self.tables.warehouse, &state.location, s.id)
                    .await?
                    .unwrap_or(1);
                (s.id - earliest + 1).max(1) as u64
            }
            None => 0,
        };
        let live = state.files.values().flatten();
        let files = TableFiles {
            live_files: live.clone().count() as u64,
            live_bytes: live.map(|f| f.file_size.max(0) as u64).sum(),
            snapshots,
        };
        Ok(Some(TableStatus {
            snapshot_id: state.snapshot_id(),
            checkpoint,
            // Rows in live files: counts a key once per sorted run holding it until compaction.
            rows: Some(state.live_rows().max(0) as u64),
            location: state.location.clone(),
            files: Some(files),
        }))
    }

    async fn cleanup(
        &self,
        grace: std::time::Duration,
        dry_run: bool,
    ) -> Result<Vec<TableCleanup>, SinkError> {
        let warehouse = &self.tables.warehouse;
        let mut reports = Vec::new();
        for table in cleanup::find_tables(warehouse).await? {
            reports.push(cleanup::clean_table(warehouse, &table, grace, dry_run).await?);
        }
        Ok(reports)
    }
}

/// The renames `changes_schema` declares (its columns' former names) from the table's current
/// column names.
fn renames(changes_schema: &TableSchema, table: &schema::PaimonSchema) -> Vec<(String, String)> {
    changes_schema.renames_from(table.fields.iter().map(|f| f.name.as_str()))
}
