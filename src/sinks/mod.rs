//! Sinks: table writers. A sink turns a buffer of ordered changes to one table into files and
//! commits them as one table snapshot that carries the pipeline's [`Checkpoint`].
//!
//! - `cdc_columns.rs`: the columns cdcd adds to rows (`_cdc_deleted`, `_cdc_commit_ts`, `_cdc_position`).
//! - `iceberg/`: Apache Iceberg tables (deletion vectors, format v3, by default; equality deletes,
//!   format v2, with `delete_mode = "equality"`).
//! - `index/`: the primary-key index that tells the Iceberg sink where a key's row is.
//! - `lsm/`: Apache Paimon primary-key tables (LSM per bucket, universal compaction).
//!
//! Sinks never import sources: they see only the changelog and checkpoints.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::changelog::{TableChanges, TableId, TableSchema};
use crate::checkpoint::Checkpoint;
use crate::config::SinkConfig;
use crate::storage::cleanup::{CleanupError, TableCleanup};
use crate::storage::Warehouse;

pub mod cdc_columns;
pub mod iceberg;
mod key_prefix;
pub mod lsm;
pub mod pk_index;
pub mod resync;
mod wanted;

pub use wanted::MaintenanceWanted;

/// What a committed snapshot holds, for logs, metrics and `cdcd status`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableStatus {
    /// The newest snapshot id (0: the table has no snapshot yet).
    pub snapshot_id: i64,
    /// The newest checkpoint of this pipeline, if any.
    pub checkpoint: Option<Checkpoint>,
    /// Live rows in the table (data rows minus deleted rows, as far as the metadata tells).
    pub rows: Option<u64>,
    /// Where the table lives.
    pub location: String,
    /// Live files and snapshots (`None` when the sink does not tell).
    pub files: Option<TableFiles>,
    /// The default partition spec and sort order; `None` when the sink does not tell.
    pub layout: Option<TableLayout>,
}

/// A table's default partition spec and sort order in the config's words, for `cdcd status`
/// and `cdcd check`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct TableLayout {
    /// `spec 1: day(created_at), bucket(4, id)`, `spec 0: unpartitioned`.
    pub partition_spec: String,
    /// `order 1: id asc nulls first`, `order 0: unsorted`.
    pub sort_order: String,
}

/// A table's file counts, for `cdcd status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TableFiles {
    /// Data and delete files of the current snapshot.
    pub live_files: u64,
    /// Their bytes.
    pub live_bytes: u64,
    /// Snapshots in the table's metadata.
    pub snapshots: u64,
}

/// What one maintenance cycle did to one table (`Sink::maintain`, `cdcd maintain`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct MaintenanceReport {
    pub table: String,
    pub snapshots_expired: u64,
    pub refs_removed: u64,
    /// Manifest lists, manifests, data, delete and statistics files only expired snapshots reached.
    pub files_deleted: u64,
    /// `vN.metadata.json` files that had left the metadata log.
    pub metadata_files_deleted: u64,
    /// Data files compaction replaced, and their bytes (v3 tables; `replace` snapshots).
    pub files_rewritten: u64,
    pub bytes_rewritten: u64,
    /// Data files compaction wrote in their place.
    pub files_written: u64,
    /// After the cycle: snapshots in the metadata, live files and manifests of the current one.
    pub snapshots: u64,
    pub live_files: u64,
    pub manifests: u64,
    /// The cycle failed for this table (the next one retries); nothing unsafe was done.
    pub error: Option<String>,
}

/// What one commit wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitStats {
    pub snapshot_id: i64,
    pub data_rows: u64,
    pub deleted_rows: u64,
    pub files_written: usize,
    /// This commit ended a resync of its table (`Sink::resync`): the new lineage replaced the
    /// old one in the live table.
    pub resync_swapped: bool,
}

/// When a resync's lineage replaces the live table ([`Sink::resync`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResyncMode {
    /// The lineage is copied by this pipeline before it streams (the table's changes wait):
    /// its first commit at a complete position, the end of its copy, replaces the live table.
    SwapAtCopyEnd,
    /// A copy job beside the streaming pipeline (`pipeline/resync.rs`) fills the lineage and
    /// never replaces the live table, which keeps taking the table's changes meanwhile.
    CopyOnly,
    /// The lineage was filled by a copy job while the live table kept streaming, so the live
    /// table is ahead of it: the lineage replaces it at its first complete commit at or past
    /// the live table's checkpoint, never earlier (readers never see the table go back).
    SwapWhenCaughtUp,
}

/// Where a table's resync stands ([`Sink::resync`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResyncState {
    /// The new lineage is under way (or starts with the table's next commit): until it replaces
    /// the live table, [`Sink::checkpoint`] answers from it and commits go to it. `live` is the
    /// live table's checkpoint: every change at or below it was in the source before the
    /// request, so the lineage's copy holds it.
    UnderWay { live: Option<Checkpoint> },
    /// The live table already is this resync's lineage: nothing to do.
    Done,
}

/// The sink `config` describes, writing checkpoints of `pipeline` into `warehouse` (the one
/// place that knows every kind).
// `SinkError` carries `iceberg::Error` by value (see the Iceberg sink's module doc).
#[allow(clippy::result_large_err)]
pub fn build(
    config: &SinkConfig,
    pipeline: &str,
    warehouse: Warehouse,
    schema_change: crate::config::SchemaChangePolicy,
) -> Result<Arc<dyn Sink>, SinkError> {
    Ok(match config {
        SinkConfig::Iceberg(iceberg) => Arc::new(
            iceberg::IcebergSink::new(iceberg, pipeline)?
                .with_warehouse(warehouse)
                .with_schema_change(schema_change),
        ),
        SinkConfig::Lsm(lsm) => Arc::new(
            lsm::LsmSink::with_warehouse(lsm, pipeline, warehouse)
                .with_schema_change(schema_change),
        ),
    })
}

/// One table's part of [`Sink::commit_tables`].
#[derive(Clone, Copy)]
pub struct TableCommit<'a> {
    pub schema: &'a Arc<TableSchema>,
    pub changes: &'a [TableChanges],
    pub checkpoint: &'a Checkpoint,
}

/// A table writer for one warehouse.
///
/// Ordering: `commit` is called per table with that table's changes in source order; commits of
/// one table are sequential. Durability: when `commit` returns `Ok`, the snapshot (data, deletes
/// and checkpoint) is durable and visible to readers; when it returns `Err`, no snapshot was
/// published (files it wrote may remain as orphans, never referenced). Duplicates: the caller
/// never passes a change twice once its commit returned `Ok`; the checkpoint is how it knows.
/// Cancel safety: dropping a `commit` future publishes nothing unless the final atomic
/// create-if-absent of the metadata already happened, in which case the snapshot is complete.
#[async_trait]
pub trait Sink: Send + Sync {
    /// The newest checkpoint of this pipeline in `table`, or `None` when the table does not exist
    /// or holds no checkpoint of this pipeline.
    async fn checkpoint(&self, table: &TableId) -> Result<Option<Checkpoint>, SinkError>;

    /// Applies `changes` (all for the table `schema` describes, in order) and commits them with
    /// `checkpoint` in one snapshot. Creates the table on first use. Absent columns are completed
    /// from the row's current values before anything is written.
    async fn commit(
        &self,
        schema: &Arc<TableSchema>,
        changes: &[TableChanges],
        checkpoint: &Checkpoint,
    ) -> Result<CommitStats, SinkError>;

    /// Commits several tables' changes, each with its own checkpoint, as [`Sink::commit`] does
    /// for one. A sink whose catalog commits several tables atomically (the Iceberg sink on a
    /// REST catalog offering `transactions/commit`) makes them visible together or not at all;
    /// this default commits them one after another (an error leaves the earlier ones committed).
    /// The stats are in `commits`' order.
    async fn commit_tables(
        &self,
        commits: &[TableCommit<'_>],
    ) -> Result<Vec<CommitStats>, SinkError> {
        let mut stats = Vec::with_capacity(commits.len());
        for c in commits {
            stats.push(self.commit(c.schema, c.changes, c.checkpoint).await?);
        }
        Ok(stats)
    }

    /// Whether [`Sink::commit_tables`] makes several tables' commits visible together or not
    /// at all (one catalog transaction). When not, the pipeline commits a flush table by table
    /// itself, so after an error it knows which commits landed (a table refused for a schema
    /// change may be left to a resync while the others commit: `pipeline/schema_resync.rs`).
    async fn commits_tables_together(&self) -> bool {
        false
    }

    /// At start, before anything is written: makes the existing ones of `tables` follow their
    /// `[sink.tables.*]` settings (the Iceberg sink evolves a table's partition spec and sort
    /// order to the configured ones) and refuses settings this sink cannot apply, naming the
    /// table. A table created later gets its settings when it is created.
    async fn prepare(&self, _tables: &[TableId]) -> Result<(), SinkError> {
        Ok(())
    }

    /// `cdcd check`: for each of `tables`, a line on its settings as the sink applies them (the
    /// Iceberg sink: its partition spec and sort order, and what [`Sink::prepare`] would change),
    /// or the problem [`Sink::prepare`] or the table's creation would refuse. Changes nothing.
    async fn check_tables(&self, _tables: &[TableId]) -> Vec<Result<String, String>> {
        Vec::new()
    }

    /// Whether commits to different tables may run at the same time (the pipeline then commits
    /// up to `pipeline.commit_concurrency` tables of a round at once; one table's commits stay
    /// sequential). Both sinks serialize a table's commit on its own slot (a per-table async
    /// mutex) and share nothing else a commit writes; a sink whose commits of different tables
    /// would race on shared state answers `false`, and the pipeline commits one after another.
    fn commits_tables_concurrently(&self) -> bool {
        true
    }

    /// The state of `table` for `cdcd status`; `None` when it does not exist.
    async fn status(&self, table: &TableId) -> Result<Option<TableStatus>, SinkError>;

    /// Finds the orphan files of every table of this sink's format in the warehouse (files no
    /// live metadata references, older than `grace`) and deletes them unless `dry_run`
    /// (`cdcd cleanup`). A table whose metadata cannot be read is refused whole: nothing of it
    /// is deleted.
    async fn cleanup(&self, grace: Duration, dry_run: bool)
        -> Result<Vec<TableCleanup>, SinkError>;

    /// `cdcd check`'s look at what the sink needs besides the warehouse (the Iceberg sink's SQL
    /// catalog: connects, creates its tables when absent, reads them): the lines to show when
    /// all is well, or one problem line naming what failed and the fix.
    async fn check(&self) -> Result<Vec<String>, String> {
        Ok(Vec::new())
    }

    /// Waits for work a commit left running in the background (the Iceberg sink's update of a
    /// table's primary-key index), so a clean stop leaves nothing for the next start to catch
    /// up. Commits are durable without it; its failures are logged where they happen.
    async fn settle(&self) {}

    /// Runs one maintenance cycle (snapshot expiry, the metadata log; Iceberg) on each of
    /// `tables`, or, with `None`, on every table this sink has read or committed to since it
    /// started (the daemon: the pipeline's tables, read for their checkpoints at start).
    /// Safe beside this sink's own commits (they are serialized per table) and other writers'
    /// (a maintenance commit is create-if-absent like any; files are deleted only after it
    /// landed). A table's failure is in its report; only a broken fence fails the call.
    async fn maintain(
        &self,
        _tables: Option<&[TableId]>,
    ) -> Result<Vec<MaintenanceReport>, SinkError> {
        Ok(Vec::new())
    }

    /// How often the daemon calls [`Sink::maintain`] in the background (`None`: never).
    fn maintenance_interval(&self) -> Option<Duration> {
        None
    }

    /// Tables that ask for a cycle before the next interval (`wanted.rs`); `None`: never.
    fn maintenance_wanted(&self) -> Option<Arc<MaintenanceWanted>> {
        None
    }

    /// Whether `table`'s data files are split by partition (the Iceberg sink: its current spec,
    /// or for a table not created yet the spec it will be created with, has a field). The
    /// pipeline then commits the table's initial copy by bytes alone, past
    /// `pipeline.snapshot_commit_rows`: every copy commit writes about one file per partition
    /// its rows touch, so rows arriving in random partition order need commits as large as the
    /// memory budget allows to make files of more than a few hundred rows.
    fn splits_copy_by_partition(&self, _table: &TableId) -> bool {
        false
    }

    /// Why this sink cannot store a keyless table whose updates and deletes remove one row equal
    /// to a whole before image (a multiset, `KeyOrigin::FullRow`), or `None` when it can. The
    /// pipeline refuses such tables at start on a sink that cannot.
    fn multiset_refusal(&self) -> Option<&'static str> {
        None
    }

    /// Why this sink cannot resync a table (`cdcd resync`: copy it again into a new lineage that
    /// replaces the live one in one commit), with the way out; `None` when it can.
    fn resync_refusal(&self) -> Option<String> {
        Some("this sink cannot copy a table into a new lineage".to_owned())
    }

    /// Gives up resync `id`'s lineage of `table` (it will be copied again under a new id): its
    /// files become orphans for `cdcd cleanup`. Best effort.
    async fn abandon_resync(&self, _table: &TableId, _id: &str) {}

    /// Marks `table` for a resync named `id` ([`crate::checkpoint::resync`]): from now on
    /// [`Sink::checkpoint`] reads the new lineage's checkpoint (none before its first commit,
    /// so the pipeline copies the table as it copies an added one), and [`Sink::commit`] writes
    /// to it; readers keep seeing the live table, unchanged. `mode` says which commit of the
    /// lineage replaces the live table with it, in one atomic metadata commit reported in
    /// [`CommitStats::resync_swapped`]. Idempotent;
    /// after a crash the lineage is found again. `Done` when the live table already is this
    /// lineage (the swap landed before a crash, or the lineage was complete and is swapped now).
    async fn resync(
        &self,
        table: &TableId,
        _id: &str,
        _mode: ResyncMode,
    ) -> Result<ResyncState, SinkError> {
        Err(SinkError::ResyncUnsupported {
            table: table.clone(),
            why: self
                .resync_refusal()
                .unwrap_or_else(|| "this sink cannot resync".to_owned()),
        })
    }
}

/// A sink failed. Each variant names the table or path involved.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("schema of {table} changed ({detail}); this sink cannot apply that change (docs/guarantees.md, \"Schema changes\"), so cdcd stops before the transaction that needs it. Ways out: set source.schema_change = \"resync\" for the table (`{{ \"{table}\" = \"resync\", \"*\" = \"evolve\" }}`) and start cdcd, which then copies the table again under its new schema by itself, online, while the other tables stream on; or do that by hand: `cdcd resync --table {table}`, then start cdcd; when the change is a Postgres RENAME COLUMN (a column dropped while another arrives), the DDL trigger of migrations/postgres/002_ddl_capture.sql makes renames made after it is installed replicate in place; or remove the table from source.tables")]
    SchemaChanged { table: TableId, detail: String },
    #[error("column {column} of {table}: type {data_type} cannot be stored in {sink}")]
    UnsupportedType {
        table: TableId,
        column: String,
        data_type: String,
        sink: &'static str,
    },
    #[error("{table}: {detail}")]
    Data { table: TableId, detail: String },
    #[error("storage error at {path}: {source}")]
    Storage {
        path: String,
        #[source]
        source: object_store::Error,
    },
    #[error("{context}: {source}")]
    Iceberg {
        context: String,
        #[source]
        source: ::iceberg::Error,
    },
    #[error("{context}: {source}")]
    Parquet {
        context: String,
        #[source]
        source: parquet::errors::ParquetError,
    },
    #[error("{context}: {source}")]
    Arrow {
        context: String,
        #[source]
        source: arrow_schema::ArrowError,
    },
    #[error("{path} is not valid table metadata: {detail}")]
    Corrupt { path: String, detail: String },
    #[error("cannot resync {table}: {why}")]
    ResyncUnsupported { table: TableId, why: String },
    #[error("another writer committed version {version} of {table} first; is a second cdcd running on this pipeline?")]
    CommitConflict { table: TableId, version: u64 },
    /// The Iceberg SQL catalog at `uri` (password removed) failed.
    #[error("catalog {uri}: {detail}")]
    Catalog { uri: String, detail: String },
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// The lease's fence refused (or a newer lease holder's commit showed it is gone).
    #[error(transparent)]
    Fenced(#[from] crate::storage::Fenced),
    #[error(transparent)]
    Warehouse(#[from] crate::storage::StorageError),
    #[error(transparent)]
    Cleanup(#[from] CleanupError),
    /// A table's `[sink.tables.*]` settings do not fit the table (a column it lacks, a transform
    /// its type does not take) or this sink (not supported yet).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

impl SinkError {
    /// A short label for `cdcd_errors_total{kind}`.
    pub fn kind(&self) -> &'static str {
        match self {
            SinkError::SchemaChanged { .. } => "schema_changed",
            SinkError::UnsupportedType { .. } => "unsupported_type",
            SinkError::Data { .. } => "data",
            SinkError::Storage { .. } => "storage",
            SinkError::Iceberg { .. } => "iceberg",
            SinkError::Parquet { .. } => "parquet",
            SinkError::Arrow { .. } => "arrow",
            SinkError::Corrupt { .. } => "corrupt",
            SinkError::CommitConflict { .. } => "commit_conflict",
            SinkError::ResyncUnsupported { .. } => "config",
            SinkError::Catalog { .. } => "catalog",
            SinkError::Checkpoint(_) => "checkpoint",
            SinkError::Fenced(_) => "lease_lost",
            SinkError::Warehouse(_) => "storage",
            SinkError::Cleanup(_) => "cleanup",
            SinkError::Config(_) => "config",
        }
    }
}

/// After losing a commit race on `table`: if the winning snapshot carries a newer lease epoch
/// (`winner`, its `cdcd.lease-epoch`) than this daemon's, this daemon lost the lease: its fence
/// is broken for every table (not only this one, and whatever its clock says; Kafka fences a
/// producer the same way when a newer epoch has written) and the error says so. A winner of an
/// older epoch is a fenced holder's commit that landed late (`storage/fence/mod.rs`): logged, and the
/// conflict stands (the pipeline restarts from the table's checkpoint).
pub(crate) fn fenced_by_winner(
    warehouse: &crate::storage::Warehouse,
    table: &TableId,
    winner: Option<u64>,
) -> Option<SinkError> {
    let fence = warehouse.fence()?;
    let theirs = winner?;
    let ours = fence.epoch();
    if theirs > ours {
        fence.break_with(format!(
            "a cdcd holding lease epoch {theirs} committed {table} (this one holds epoch {ours})"
        ));
        return fence.check().err().map(SinkError::Fenced);
    }
    if theirs < ours {
        tracing::warn!(table = %table, theirs, ours, "a commit of an earlier lease holder landed after this daemon took the lease over");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(dead_code)]
    fn _sink_is_object_safe(_: Box<dyn Sink>) {}
}
