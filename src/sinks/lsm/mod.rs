//! LSM sink: Apache Paimon primary-key tables (fixed buckets, `deduplicate` merge engine), with
//! universal compaction in the background and snapshot expiry; keyless tables as Paimon append
//! tables (`append.rs`).
//!
//! Sits at the end of the flow: pipeline → [`LsmSink::commit`] → (durable) → ack to source. Each
//! commit writes, per touched bucket, one level-0 Parquet file holding the last state of every key
//! the commit changed (`plan.rs`), and publishes it as one `APPEND` snapshot whose `properties`
//! carry the checkpoint (`commit.rs`, the steps; `publish.rs`, the commit point). An initial
//! copy's commits (checkpoint with copy progress, or after a TRUNCATE) put blocks of keys no live
//! file's range holds straight into the bottom level instead, so the copy is not rewritten by
//! compaction (`placement.rs` says when and why). A background task per table merges sorted runs
//! (`compaction/`: `pick.rs` decides, `worker.rs` does it, `schedule.rs` says when) and publishes
//! `COMPACT` snapshots that carry the same checkpoint; readers see either the runs before or the
//! merged file after. Commits wait while a bucket has `stop_trigger` runs or more, so compaction
//! can never fall behind for good. Old snapshots and the files only they reference are deleted
//! (`expire.rs`).
//!
//! Why cdcd completes partial rows itself instead of relying on Paimon's `partial-update` merge
//! engine: that engine reads a NULL field as "unchanged", so an UPDATE that sets a column to NULL
//! would be lost. With `deduplicate`, cdcd fills absent columns (unchanged TOAST values) from the
//! row's current value and every file holds whole rows. `merge_engine = "partial-update"` is
//! offered for users who accept that: absent columns are then written NULL without a lookup.
//!
//! On storage (`<warehouse>/<namespace>.db/<table>/`, Paimon's filesystem catalog):
//! `schema/schema-N`, `snapshot/snapshot-N` + `LATEST` + `EARLIEST`, `manifest/`,
//! `bucket-<n>/data-*.parquet`, or `<col>=<value>/bucket-<n>/…` in a partitioned table
//! (`partition.rs`: what a partition is; `locate.rs`: the partition a key's row is in, so a row
//! whose partition changes is deleted where it was; docs/internals.md, "Partitioned Paimon
//! tables").
//!
//! # Modules
//! The bottom floor, which every other module imports and which imports none of them:
//! - `table.rs`: `TableState`, a table as of its newest snapshot, loaded from storage; the schema
//!   files; `Change`, the files one snapshot adds and deletes.
//! - `tables.rs`: `Tables`, what the sink's tasks share (warehouse, config, resyncs), and each
//!   table's `Handle` (its state behind the lock, its compactor's flags).
//! - `store.rs` (object I/O), `snapshot.rs` (reading snapshots, hints, manifests), `files.rs`
//!   (putting and reading data files).
//!
//! Pure formats and decisions: `schema.rs` (types, schema JSON, data file shape, evolution),
//! `binary_row.rs` (Paimon's `BinaryRow` and bucket hash), `manifest.rs` (Avro), `writer.rs`
//! (Parquet runs and their `DataFileMeta`), `plan.rs` (changes → one row per key),
//! `changelog_rows.rs` (changes → the changelog's `+I`/`-U`/`+U`/`-D` rows, `changelog = true`),
//! `placement.rs` (level 0 or bottom-level files for a copy commit's rows), `append.rs` (keyless
//! tables: format and plan), `compaction/pick.rs` and `compaction/merge.rs`.
//!
//! Operations on a table, each a room of its own: `commit.rs` (the commit producer;
//! `commit/evolve.rs` brings the schema to the changes', `commit/append.rs` commits a keyless
//! table, `commit/changelog.rs` writes the changelog files), `lookup.rs` (current rows for
//! partial updates and changelog images), `publish.rs` (the one way any operation publishes a
//! snapshot), `compaction/` (worker and scheduling), `expire.rs`,
//! `resync.rs` (`cdcd resync`: a lineage table beside the live one, swapped in by one `OVERWRITE`
//! snapshot), `cleanup.rs` (orphans). This file keeps [`LsmSink`]: the `Sink` impl and the calls
//! benchmarks and tests make.
//!
//! The Iceberg sink's planner and row lookup are not shared on purpose: Iceberg deletes rows by
//! key across files, whereas an LSM commit folds the changes of a key into one upsert or delete,
//! so the two planners have little in common beyond Arrow `interleave`, and the Parquet writing
//! shared would be a few lines.
//!
//! Deletion-vector mode (`deletion_vectors = true`, Paimon `deletion-vectors.enabled`): readers
//! skip level 0 and read the higher levels without merging. cdcd keeps that valid without
//! writing deletion-vector index files: every compaction merges a bucket's level-0 runs with its
//! single bottom run into a new bottom run (deletes dropped), so each key is in one file. Rows
//! become visible to readers when the background compaction after their commit has published
//! (an initial copy's bottom-level files at once: each holds keys no other file has).
//!
//! Concurrency: each table has one handle (`tables.rs`) whose state sits behind a tokio mutex,
//! held across the awaits of one commit (a commit is read-modify-write of the table's newest
//! snapshot; the writer and the compactor take turns). The compactor does its reading and merging
//! without the lock and re-checks, under it, that its inputs are still live before publishing. A copy commit
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
use crate::config::LsmConfig;
use crate::sinks::cdc_columns::CdcColumns;
use crate::sinks::{CommitStats, Sink, SinkError, TableFiles, TableStatus};
use crate::storage::cleanup::TableCleanup;
use crate::storage::Warehouse;

mod append;
pub mod binary_row;
mod changelog_rows;
pub mod cleanup;
mod commit;
pub mod compaction;
pub mod config;
mod expire;
mod files;
mod locate;
mod lookup;
pub mod manifest;
pub mod partition;
mod placement;
pub mod plan;
mod publish;
mod resync;
pub mod schema;
mod snapshot;
mod store;
mod table;
mod tables;
mod variant;
mod writer;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;

pub use compaction::CompactStats;
use tables::Tables;

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

    /// Live data files per bucket, over all partitions (for the benchmark and tests).
    pub async fn files_per_bucket(
        &self,
        table: &TableId,
    ) -> Result<BTreeMap<i32, usize>, SinkError> {
        let handle = self.tables.handle(table);
        let mut guard = handle.state.lock().await;
        self.tables.ensure_loaded(table, &mut guard).await?;
        let mut out = BTreeMap::new();
        for (slot, files) in guard.iter().flat_map(|s| &s.files) {
            *out.entry(slot.bucket).or_default() += files.len();
        }
        Ok(out)
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
        let added = self
            .tables
            .with_cdc_columns(schema, changes, checkpoint)
            .await?;
        let (schema, changes) = match &added {
            Some((schema, changes)) => (schema, changes.as_slice()),
            None => (schema, changes),
        };
        let settings = self.tables.config.tables.resolve(&schema.id)?;
        let variants = variant::with_variants(&settings, schema, changes)?;
        let (schema, changes) = match &variants {
            Some((schema, changes)) => (schema, changes.as_slice()),
            None => (schema, changes),
        };
        let input = commit::Input {
            schema: schema.as_ref(),
            changes,
            checkpoint,
        };
        let mut stats = commit::commit(&self.tables, input).await?;
        stats.resync_swapped = self
            .tables
            .swap_if_due(&schema.id, &checkpoint.position)
            .await?;
        Ok(stats)
    }

    /// Resolves every table's settings (refusing equally specific globs), and checks each
    /// existing table's `partition_by` against the table (`Tables::partition_keys`: its columns,
    /// and the partitioning it has, which Paimon cannot change). A new table is checked against
    /// the source's columns at its first commit, before it is created.
    async fn prepare(&self, tables: &[TableId]) -> Result<(), SinkError> {
        for table in tables {
            if self
                .tables
                .config
                .tables
                .resolve(table)?
                .partition_by
                .is_none()
            {
                continue;
            }
            let handle = self.tables.handle(table);
            let existing = {
                let mut guard = handle.state.lock().await;
                self.tables.ensure_loaded(table, &mut guard).await?;
                guard
                    .as_ref()
                    .map(|s| (s.location.clone(), s.schema.clone()))
            };
            if let Some((location, paimon)) = existing {
                let schema =
                    schema::table_schema(table, &paimon).map_err(|detail| SinkError::Corrupt {
                        path: location,
                        detail,
                    })?;
                self.tables.partition_keys(&handle, &schema).await?;
            }
        }
        Ok(())
    }

    async fn check_tables(&self, tables: &[TableId]) -> Vec<Result<String, String>> {
        let mut lines = Vec::new();
        for table in tables {
            if let Err(e) = self.prepare(std::slice::from_ref(table)).await {
                lines.push(Err(e.to_string()));
                continue;
            }
            // The columns the table's settings add, as the Iceberg sink's line says them.
            match self.tables.config.tables.resolve(table) {
                Ok(settings) => lines.extend(
                    CdcColumns::of(&settings, false)
                        .describe()
                        .map(|cdc| Ok(format!("table {table}: {cdc}"))),
                ),
                Err(e) => lines.push(Err(e.to_string())),
            }
        }
        lines
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
            // A Paimon table's layout: its partition keys and buckets; files sorted by key.
            layout: Some(crate::sinks::TableLayout {
                partition_spec: match state.schema.partition_keys.as_slice() {
                    [] => format!("unpartitioned, bucket {}", state.buckets(0)),
                    keys => format!(
                        "partition keys: {}, bucket {}",
                        keys.join(", "),
                        state.buckets(0)
                    ),
                },
                sort_order: format!("primary key: {}", state.schema.primary_keys.join(", ")),
            }),
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
