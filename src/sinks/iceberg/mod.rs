//! Iceberg sink: turns one table's ordered changes into Parquet data files plus deletes and
//! publishes them as one row-delta snapshot that carries the pipeline's checkpoint. Deletes are
//! deletion vectors (format v3, the default `delete_mode`), located through the table's
//! primary-key index, or equality + position delete files (format v2, `delete_mode = "equality"`).
//!
//! Sits at the end of the flow: pipeline → [`IcebergSink::commit`] → (durable) → ack to source.
//! iceberg-rust's `Transaction` can only fast-append, so cdcd owns the commit
//! (`docs/architecture.md`, "Decisions, briefly"): it writes manifests, the manifest list and
//! `v<N+1>.metadata.json` itself, create-if-absent.
//!
//! Layout by role. This file keeps [`IcebergSink`]: the [`Sink`] impl and the scheduling (a
//! commit's attempts, which tables of a flush commit together, which tables a cycle maintains).
//! `tables.rs` is the table cache every commit and action shares (`Tables`: where each table is,
//! its newest metadata, its slot of live state and index behind the slot lock). Each way of
//! changing a table is an action type, one per file, taking `Tables` and the slot lock as
//! `RowDelta` does:
//! - `commit/`: one table's changes as a row-delta snapshot (`RowDelta`, one method per step:
//!   locate, files, manifests, summary, manifest list, publish);
//! - `transaction.rs`: several tables' commits in one REST catalog transaction
//!   (`MultiTableCommit`);
//! - `changelog/`: a table's changes also appended to its changelog table `<table>_changelog`
//!   (`ChangelogWrite`, inside the table's commit, before it publishes);
//! - `resync/`: a table copied again into a new lineage (`resync/mod.rs`: begin, abandon) and
//!   swapped in (`resync/swap.rs`: `ResyncSwap`; `resync/rebase.rs`: the swap's metadata);
//! - `maintenance/` (`Sink::maintain`, following the table's properties): one table's cycle
//!   (`maintenance/cycle.rs`: `MaintenanceCycle`), data-file compaction
//!   (`maintenance/compaction/`: `RewriteDataFiles`), snapshot expiry
//!   (`maintenance/expire_snapshots.rs`: `ExpireSnapshots`) and the metadata log.
//!
//! What they use: `schema.rs` (types and field ids), `input.rs` (checks of a commit's batches),
//! `plan.rs` (pure: what to write), `rows/` (where a row is: the snapshot's files and vectors
//! cached between commits in `live.rs`, current rows to complete partial updates in
//! `lookup.rs`, v3's primary-key index in `index.rs` + `index/slot.rs` + `locator.rs`, updated
//! in the background, keyless multiset rows, the upsert window), `files/` (the files' rows in
//! `writer.rs`, Parquet settings and parallel columns in `encode.rs`, Avro manifests and a
//! snapshot's files in `manifest.rs`, the newest metadata in `metadata.rs`), `deletes/`
//! (deletion vectors, their Puffin files, v2 position deletes), `catalog/` (where tables are
//! found and commits published: the filesystem, a SQL or a REST catalog), `cleanup.rs` (orphan
//! files for `cdcd cleanup`). Tables live at
//! `<warehouse>/<namespace>/<table>/` so any engine finds them without cdcd (README, "Where
//! the tables are").

// `SinkError` is large because it carries `iceberg::Error` by value (sinks/mod.rs); boxing it
// there would change the shared seam, so the lint is allowed for this sink.
#![allow(clippy::result_large_err)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use iceberg::spec::TableMetadata;

use crate::changelog::{TableChanges, TableId, TableSchema};
use crate::checkpoint::Checkpoint;
use crate::config::{IcebergConfig, SchemaChangePolicy};
use crate::sinks::{
    CommitStats, MaintenanceReport, ResyncState, Sink, SinkError, TableCommit, TableFiles,
    TableStatus,
};
use crate::storage::cleanup::TableCleanup;
use crate::storage::Warehouse;

pub mod catalog;
mod changelog;
pub mod cleanup;
mod commit;
pub mod config;
pub mod deletes;
mod evolve;
mod files;
mod geometry;
mod input;
mod layout;
pub(crate) mod maintenance;
mod partitioning;
pub mod plan;
mod resync;
mod rows;
mod schema;
mod tables;
mod transaction;
pub(crate) mod variant;
mod variant_shredding;
mod wkb;

use catalog::Catalog;
use changelog::{beside, ChangelogWrite};
use commit::{Input, Staged};
use evolve::EvolveLayout;
use maintenance::MaintenanceCycle;
use plan::FileLimits;
use resync::ResyncSwap;
use tables::Tables;
use transaction::MultiTableCommit;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;

/// Writes Iceberg tables under one warehouse for one pipeline.
///
/// Single writer per table: the newest metadata of each table is cached between commits and
/// reloaded after a conflict (`tables.rs`).
pub struct IcebergSink {
    /// Where the tables are, how they are written, and what is cached of each.
    tables: Tables,
    /// How often the daemon runs a maintenance cycle (`None`: never).
    maintenance_interval: Option<Duration>,
    /// Tables whose commits ask for a cycle before the interval (`Compaction::triggered`).
    maintenance_wanted: Arc<crate::sinks::MaintenanceWanted>,
    /// One maintenance cycle at a time; what cycles keep between them.
    maintenance: tokio::sync::Mutex<maintenance::MaintenanceState>,
    /// The log said once that the REST catalog offers no multi-table commits.
    said_no_transactions: std::sync::atomic::AtomicBool,
}

impl IcebergSink {
    /// A sink for `config`'s warehouse, writing checkpoints of `pipeline`.
    pub fn new(config: &IcebergConfig, pipeline: &str) -> Result<IcebergSink, SinkError> {
        Ok(IcebergSink {
            tables: Tables::new(config, pipeline)?,
            maintenance_interval: (config.maintenance_interval_ms > 0)
                .then(|| Duration::from_millis(config.maintenance_interval_ms)),
            maintenance: tokio::sync::Mutex::default(),
            maintenance_wanted: Arc::default(),
            said_no_transactions: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// `source.schema_change`: with `stop`, a commit that would change a table's schema fails.
    pub fn with_schema_change(mut self, schema_change: SchemaChangePolicy) -> IcebergSink {
        self.tables.schema_change = schema_change;
        self
    }

    /// Writes through `warehouse` (opened with `[sink.s3]` settings) instead of the store opened
    /// from the URL alone.
    pub fn with_warehouse(mut self, warehouse: Warehouse) -> IcebergSink {
        self.tables.warehouse = warehouse;
        self
    }

    /// Rolls data files at other limits than ~128 MiB / 1M rows.
    pub fn with_file_limits(mut self, limits: FileLimits) -> IcebergSink {
        self.tables.limits = limits;
        self
    }

    /// `<warehouse>/<namespace>/<table>`; namespace = the configured one or the source schema.
    pub fn table_location(&self, table: &TableId) -> String {
        self.tables.table_location(table)
    }

    /// Where the primary-key index of `table` lives (pk_index.rs says why there).
    pub fn index_location(&self, table: &TableId) -> String {
        self.tables.index_location(table)
    }

    /// One commit. A commit another writer beat (`CommitConflict`: a Spark or Trino job, an
    /// external compaction or expiry committed to the table since cdcd loaded it) is planned
    /// again on the table as it is now, at most [`COMMIT_ATTEMPTS`] times: the live files and
    /// the primary-key index are caught up from the new snapshot, so deletes are located in the
    /// files that hold the rows now (a rewrite moved them), and nothing of the lost attempt is
    /// referenced. Only when the table is cdcd's last state plus other writers' commits
    /// ([`only_others_committed`]): if a new snapshot carries this pipeline's checkpoint,
    /// another cdcd on this pipeline committed these changes and planning them again would apply
    /// them twice; if `main` no longer descends from cdcd's last snapshot (a rollback), planning
    /// on top would build on rows the checkpoint does not describe. Then the conflict stops the
    /// pipeline, which restarts from the table's checkpoint.
    async fn commit_inner(&self, input: Input<'_>) -> Result<CommitStats, SinkError> {
        let table = &input.schema.id;
        for attempt in 1.. {
            let tables = &self.tables;
            let before = tables.cached(table);
            let conflict = match self.commit_once(input).await {
                Err(e @ SinkError::CommitConflict { .. }) => e,
                other => return other,
            };
            if attempt >= COMMIT_ATTEMPTS {
                return Err(conflict);
            }
            let Some(before) = before else {
                return Err(conflict);
            };
            let Some(now) = tables.load(table).await? else {
                return Err(conflict);
            };
            if !only_others_committed(&tables.pipeline, &before.metadata, &now.metadata)? {
                tracing::warn!(table = %table, "the table moved other than by other engines' commits on top of cdcd's last one (this pipeline's checkpoint, a rollback, or history expired past it); stopping rather than guessing");
                return Err(conflict);
            }
            let winner = now.metadata.current_snapshot();
            tracing::info!(
                table = %table,
                attempt,
                snapshot = winner.map(|s| s.snapshot_id()),
                operation = winner.map(|s| s.summary().operation.as_str()),
                "another writer committed to the table first; planning the commit again on top of it"
            );
            metrics::counter!(crate::metrics::COMMIT_RETRIES_TOTAL, crate::metrics::LABEL_TABLE => table.to_string()).increment(1);
        }
        unreachable!("the loop returns")
    }

    /// One commit attempt, in the steps of the producer (commit/mod.rs); this keeps the table
    /// cache.
    async fn commit_once(&self, input: Input<'_>) -> Result<CommitStats, SinkError> {
        let Input {
            schema, checkpoint, ..
        } = input;
        let table = &schema.id;
        // The table's cached state (live files, vectors, index), held for the whole commit, from
        // before the base is loaded: a maintenance commit in between would take its version.
        let tables = &self.tables;
        let slot = tables.slot(table);
        let mut guard = slot.lock().await;
        let (mut delta, mut cached) = tables.plan(&mut guard, input).await?;
        let changelog = ChangelogWrite::of(tables, schema)?;
        let pending = match &changelog {
            Some(changelog) => changelog.prior(input, &delta, &mut cached).await?,
            None => None,
        };
        // The changelog's rows and file are staged beside the table's (changelog/beside.rs).
        let changelog_slot = changelog.as_ref().map(|c| tables.slot(c.id()));
        let mut changelog_guard = match &changelog_slot {
            Some(slot) if pending.is_some() => Some(slot.lock().await),
            _ => None,
        };
        let mut scratch = changelog::Scratch::default();
        let (staged, changelog) = match (&changelog, pending, changelog_guard.as_deref_mut()) {
            (Some(changelog), Some(pending), Some(slot)) => {
                let scratch = &mut scratch;
                let there = async move {
                    let rows = pending.rows(changelog)?;
                    changelog.stage(rows, checkpoint, slot, scratch).await
                };
                let (staged, changelog) = beside(delta.stage(&mut cached), there).await;
                (staged?, Some(changelog?))
            }
            _ => (delta.stage(&mut cached).await?, None),
        };
        let Staged { next, after } = staged;
        let base = Arc::clone(delta.base_loaded());
        let location = tables.current_location(table);
        let catalog = tables.catalog_for(table);
        let together = match (&changelog, catalog) {
            (Some(_), Catalog::Rest(rest)) if rest.offers_transactions().await? => Some(rest),
            _ => None,
        };
        // With its changelog: in one catalog transaction where offered, else the changelog
        // first, on its own checkpoint (changelog/: why that order).
        let published = match (changelog, together) {
            (Some(changelog), Some(rest)) => {
                let item = (tables.table_ref(table, &location), base.as_ref(), &next);
                changelog.publish_with(rest, item).await
            }
            (Some(changelog), None) => {
                changelog.publish().await?;
                crate::failpoints::crash_point(crate::failpoints::CHANGELOG_BEFORE_TABLE);
                crate::failpoints::pause_point(crate::failpoints::CHANGELOG_BEFORE_TABLE).await;
                delta
                    .publish(catalog, &tables.table_ref(table, &location), next)
                    .await
            }
            (None, _) => {
                delta
                    .publish(catalog, &tables.table_ref(table, &location), next)
                    .await
            }
        };
        let published = match published {
            Ok(published) => {
                maintenance::metadata_log::delete_after_commit(
                    &tables.warehouse,
                    &base,
                    &published,
                    catalog.names_previous(),
                );
                tables.remember(table, Some(Arc::clone(&published)));
                published
            }
            Err(e) => {
                // Conflict or unknown outcome: reload before the next attempt.
                tables.remember(table, None);
                return Err(e);
            }
        };
        let mut stats = delta.finish(after, cached);
        maintenance::ask_if_due(
            &self.maintenance_wanted,
            table,
            &published.metadata,
            guard.live.as_ref(),
        );
        // A resync lineage whose copy is complete replaces the live table now, while the slot
        // is still held, when its mode says this commit is the one (resync/).
        if let Some(lineage) = tables.resync_lineage(table) {
            if lineage.swaps_at(&checkpoint.position) {
                crate::failpoints::crash_point(crate::failpoints::RESYNC_BEFORE_SWAP);
                ResyncSwap::new(tables, table, &lineage.id, &published)
                    .commit(&mut guard)
                    .await?;
                stats.resync_swapped = true;
            }
        }
        Ok(stats)
    }

    /// Commits `commits` in one catalog transaction ([`MultiTableCommit`], `transaction.rs`),
    /// the tables under resync each on its own after it (see that module's doc). The stats are
    /// in `commits`' order.
    async fn commit_together(
        &self,
        rest: &catalog::rest::RestCatalog,
        commits: &[TableCommit<'_>],
    ) -> Result<Vec<CommitStats>, SinkError> {
        // A table with a changelog commits it first, on its own (changelog/).
        let mut by_itself = Vec::new();
        for (i, c) in commits.iter().enumerate() {
            let changelog = self.tables.settings.resolve(&c.schema.id)?.changelog;
            if changelog || self.tables.resync_id(&c.schema.id).is_some() {
                by_itself.push(i);
            }
        }
        let (lineages, live): (Vec<usize>, Vec<usize>) =
            (0..commits.len()).partition(|i| by_itself.contains(i));
        let mut stats: Vec<Option<CommitStats>> = vec![None; commits.len()];
        let one_by_one = if live.len() > 1 {
            let together: Vec<TableCommit<'_>> = live.iter().map(|&i| commits[i]).collect();
            let landed = MultiTableCommit::new(&self.tables, rest, &self.maintenance_wanted)
                .commit(&together)
                .await?;
            for (&i, s) in live.iter().zip(landed) {
                stats[i] = Some(s);
            }
            lineages
        } else {
            live.into_iter().chain(lineages).collect()
        };
        for i in one_by_one {
            let c = &commits[i];
            stats[i] = Some(self.commit_inner(*c).await?);
        }
        stats
            .into_iter()
            .map(|s| {
                s.ok_or_else(|| SinkError::Corrupt {
                    path: "transaction".into(),
                    detail: "a table of the flush has no result".into(),
                })
            })
            .collect()
    }
}

#[async_trait]
impl Sink for IcebergSink {
    async fn checkpoint(&self, table: &TableId) -> Result<Option<Checkpoint>, SinkError> {
        let loaded = match self.tables.load(table).await? {
            Some(loaded) => loaded,
            None => match self.tables.adopt(table).await? {
                Some(loaded) => loaded,
                None => return Ok(None),
            },
        };
        pipeline_checkpoint(&self.tables.pipeline, &loaded.metadata)
    }

    async fn commit(
        &self,
        schema: &Arc<TableSchema>,
        changes: &[TableChanges],
        checkpoint: &Checkpoint,
    ) -> Result<CommitStats, SinkError> {
        let with_cdc_columns = self
            .tables
            .with_cdc_columns(schema, changes, checkpoint)
            .await?;
        let (schema, changes) = match &with_cdc_columns {
            Some((schema, changes)) => (schema, &changes[..]),
            None => (schema, changes),
        };
        self.commit_inner(Input {
            schema,
            changes,
            checkpoint,
        })
        .await
    }

    async fn prepare(&self, tables: &[TableId]) -> Result<(), SinkError> {
        for table in tables {
            EvolveLayout::new(&self.tables, table).commit().await?;
        }
        Ok(())
    }

    async fn check_tables(&self, tables: &[TableId]) -> Vec<Result<String, String>> {
        let mut lines = Vec::new();
        for table in tables {
            match EvolveLayout::new(&self.tables, table).check().await {
                Ok(Some(line)) => lines.push(Ok(line)),
                Ok(None) => {}
                Err(e) => lines.push(Err(e.to_string())),
            }
        }
        lines
    }

    async fn commits_tables_together(&self) -> bool {
        let Catalog::Rest(rest) = &self.tables.catalog else {
            return false;
        };
        // Unknown (the configuration unreadable): table by table, which is always safe.
        let offers = rest.offers_transactions().await.unwrap_or(false);
        if !offers
            && !self
                .said_no_transactions
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::info!(catalog = %rest.uri(), "the REST catalog does not offer multi-table commits (POST /v1/{{prefix}}/transactions/commit); committing table by table, so a source transaction over several tables may be visible in one before the others");
        }
        offers
    }

    async fn commit_tables(
        &self,
        commits: &[TableCommit<'_>],
    ) -> Result<Vec<CommitStats>, SinkError> {
        let mut added = Vec::with_capacity(commits.len());
        for c in commits {
            added.push(
                self.tables
                    .with_cdc_columns(c.schema, c.changes, c.checkpoint)
                    .await?,
            );
        }
        let commits: Vec<TableCommit<'_>> = commits
            .iter()
            .zip(&added)
            .map(|(c, added)| match added {
                Some((schema, changes)) => TableCommit {
                    schema,
                    changes,
                    checkpoint: c.checkpoint,
                },
                None => *c,
            })
            .collect();
        let commits = commits.as_slice();
        if let Catalog::Rest(rest) = &self.tables.catalog {
            if commits.len() > 1 {
                if rest.offers_transactions().await? {
                    return self.commit_together(rest, commits).await;
                }
                if !self
                    .said_no_transactions
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    tracing::info!(catalog = %rest.uri(), "the REST catalog does not offer multi-table commits (POST /v1/{{prefix}}/transactions/commit); committing table by table, so a source transaction over several tables may be visible in one before the others");
                }
            }
        }
        let mut stats = Vec::with_capacity(commits.len());
        for c in commits {
            stats.push(self.commit_inner(*c).await?);
        }
        Ok(stats)
    }

    async fn check(&self) -> Result<Vec<String>, String> {
        match &self.tables.catalog {
            Catalog::Filesystem => Ok(Vec::new()),
            Catalog::Sql(sql) => match sql.tables().await {
                Ok(_) => Ok(vec![match sql.tls_summary() {
                    Some(tls) => format!("catalog sql {}: ok (TLS: {tls})", sql.uri()),
                    None => format!("catalog sql {}: ok", sql.uri()),
                }]),
                Err(e) => Err(format!("{e}; {}", sql.fix())),
            },
            Catalog::Rest(rest) => self.check_rest(rest).await,
        }
    }

    async fn settle(&self) {
        for table in &self.tables.with_slots() {
            self.tables.settle_index(table).await;
        }
    }

    async fn status(&self, table: &TableId) -> Result<Option<TableStatus>, SinkError> {
        let Some(loaded) = self.tables.load(table).await? else {
            return Ok(None);
        };
        let snapshot = loaded.metadata.current_snapshot();
        let props = snapshot.map(|s| &s.summary().additional_properties);
        let checkpoint = match props {
            Some(p) => Checkpoint::from_properties(&self.tables.pipeline, p)?,
            None => None,
        };
        // Approximate: an equality delete may name a key that had no row.
        let rows = props.map(|p| {
            let get = |k: &str| p.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            get("total-records")
                .saturating_sub(get("total-position-deletes"))
                .saturating_sub(get("total-equality-deletes"))
        });
        let files = match (snapshot, props) {
            (Some(snapshot), Some(p)) => {
                let get = |k: &str| p.get(k).and_then(|v| v.parse::<u64>().ok());
                // A snapshot without the total (written before cdcd kept it, or by another
                // engine): counted from its manifests.
                let live_bytes = match get("total-files-size") {
                    Some(bytes) => bytes,
                    None => {
                        let version = loaded.metadata.format_version();
                        let manifests = files::manifest::load_manifests(
                            &self.tables.warehouse,
                            snapshot.manifest_list(),
                            version,
                        )
                        .await?;
                        files::manifest::load_files(&self.tables.warehouse, &manifests)
                            .await?
                            .bytes()
                    }
                };
                Some(TableFiles {
                    live_files: get("total-data-files").unwrap_or(0)
                        + get("total-delete-files").unwrap_or(0),
                    live_bytes,
                    snapshots: loaded.metadata.snapshots().len() as u64,
                })
            }
            _ => None,
        };
        Ok(Some(TableStatus {
            snapshot_id: snapshot.map_or(0, |s| s.snapshot_id()),
            checkpoint,
            rows,
            location: loaded.metadata.location().to_owned(),
            files,
            layout: Some(layout::describe(&loaded.metadata)),
        }))
    }

    async fn maintain(
        &self,
        tables: Option<&[TableId]>,
    ) -> Result<Vec<MaintenanceReport>, SinkError> {
        let mut tables: Vec<TableId> = match tables {
            Some(t) => t.to_vec(),
            None => self.tables.known(),
        };
        // A table's changelog is maintained with it (its retention too).
        for table in tables.clone() {
            // A table whose settings do not resolve is left to its own cycle, which reports it.
            if let Ok(Some(changelog)) = changelog::known_changelog(&self.tables, &table) {
                if !tables.contains(&changelog) {
                    tables.push(changelog);
                }
            }
        }
        let mut reports = Vec::new();
        for table in &tables {
            let cycle = MaintenanceCycle::new(&self.tables, &self.maintenance, table);
            match cycle.run().await {
                Ok(Some(report)) => reports.push(report),
                Ok(None) => {}
                // A fenced daemon must stop, not go on to the next table.
                Err(e @ SinkError::Fenced(_)) => return Err(e),
                Err(e) => {
                    tracing::warn!(table = %table, error = %e, "maintenance cycle failed; the next cycle retries");
                    metrics::counter!(crate::metrics::ERRORS_TOTAL, crate::metrics::LABEL_KIND => "maintenance").increment(1);
                    reports.push(MaintenanceReport {
                        table: table.to_string(),
                        error: Some(e.to_string()),
                        ..MaintenanceReport::default()
                    });
                }
            }
        }
        Ok(reports)
    }

    fn maintenance_interval(&self) -> Option<Duration> {
        self.maintenance_interval
    }

    fn maintenance_wanted(&self) -> Option<Arc<crate::sinks::MaintenanceWanted>> {
        Some(Arc::clone(&self.maintenance_wanted))
    }

    fn resync_refusal(&self) -> Option<String> {
        None
    }

    fn splits_copy_by_partition(&self, table: &TableId) -> bool {
        self.tables.splits_by_partition(table)
    }

    async fn resync(
        &self,
        table: &TableId,
        id: &str,
        mode: crate::sinks::ResyncMode,
    ) -> Result<ResyncState, SinkError> {
        resync::begin(&self.tables, table, id, mode).await
    }

    async fn abandon_resync(&self, table: &TableId, id: &str) {
        resync::abandon(&self.tables, table, id).await;
    }

    async fn cleanup(
        &self,
        grace: std::time::Duration,
        dry_run: bool,
    ) -> Result<Vec<TableCleanup>, SinkError> {
        let mut reports = Vec::new();
        let sql = match &self.tables.catalog {
            Catalog::Sql(sql) => sql,
            Catalog::Rest(rest) => return self.cleanup_rest(rest, grace, dry_run).await,
            Catalog::Filesystem => {
                for table in cleanup::find_tables(&self.tables.warehouse).await? {
                    let report =
                        cleanup::clean_table(&self.tables.warehouse, &table, None, grace, dry_run)
                            .await?;
                    reports.push(report);
                }
                return Ok(reports);
            }
        };
        // The catalog's tables, each from the file its row names: a directory no row names is
        // left alone (it may be a table of another catalog, or a create that never registered).
        for row in sql.tables().await? {
            if !self.in_this_warehouse(&row.namespace, &row.name, &row.metadata_location) {
                continue;
            }
            let metadata =
                files::metadata::read_metadata(&self.tables.warehouse, &row.metadata_location)
                    .await?;
            let (location, file) = (metadata.location(), &row.metadata_location);
            reports.push(self.clean_cataloged(location, file, grace, dry_run).await?);
        }
        Ok(reports)
    }
}

impl IcebergSink {
    /// `cdcd check` on a REST catalog: its configuration (reachable, authenticated), the
    /// namespaces and tables it lets cdcd list, and the configured namespace (created if absent).
    async fn check_rest(&self, rest: &catalog::rest::RestCatalog) -> Result<Vec<String>, String> {
        let fail = |e: SinkError| format!("{e}; {}", rest.fix());
        let transactions = rest.offers_transactions().await.map_err(fail)?;
        let tables = rest.tables().await.map_err(fail)?;
        // The namespace cdcd will create its tables in (when configured; otherwise each source
        // schema's, created at its table's first commit): created now if absent, which proves
        // the permission.
        let namespace = match &self.tables.namespace {
            Some(ns) => {
                rest.create_namespace(ns).await.map_err(fail)?;
                format!("; namespace {ns}: ok")
            }
            None => String::new(),
        };
        let offered = if transactions {
            "offered"
        } else {
            "not offered"
        };
        Ok(vec![format!(
            "catalog rest {}: ok ({}; {} tables; multi-table commits: {offered}{namespace})",
            rest.uri(),
            rest.auth_summary(),
            tables.len(),
        )])
    }

    /// `cdcd cleanup` through a REST catalog: each table under this warehouse, from the metadata
    /// the catalog names (a directory no table names is left alone, as with the SQL catalog).
    async fn cleanup_rest(
        &self,
        rest: &catalog::rest::RestCatalog,
        grace: std::time::Duration,
        dry_run: bool,
    ) -> Result<Vec<TableCleanup>, SinkError> {
        let mut reports = Vec::new();
        for listed in rest.tables().await? {
            let Some(loaded) = rest.load_listed(&listed).await? else {
                continue;
            };
            if !self.in_this_warehouse(&listed.namespace, &listed.name, &loaded.file) {
                continue;
            }
            let location = loaded.metadata.location();
            reports.push(
                self.clean_cataloged(location, &loaded.file, grace, dry_run)
                    .await?,
            );
        }
        Ok(reports)
    }

    /// Whether `file`, the current metadata a catalog names for `namespace.name`, is under this
    /// warehouse; a table elsewhere is not this cleanup's (logged and skipped).
    fn in_this_warehouse(&self, namespace: &str, name: &str, file: &str) -> bool {
        let here = self.tables.warehouse.path(file).is_ok();
        if !here {
            tracing::info!(table = %format!("{namespace}.{name}"), "not under this warehouse; skipped");
        }
        here
    }

    /// `cdcd cleanup` of the table at `location` whose current metadata a catalog names (`file`).
    async fn clean_cataloged(
        &self,
        location: &str,
        file: &str,
        grace: std::time::Duration,
        dry_run: bool,
    ) -> Result<TableCleanup, SinkError> {
        Ok(
            cleanup::clean_table(&self.tables.warehouse, location, Some(file), grace, dry_run)
                .await?,
        )
    }
}

/// Commit attempts when other writers keep committing first (see `commit_inner`).
const COMMIT_ATTEMPTS: u32 = 5;

/// Whether `now` is `before` plus other writers' commits only: walking back from `now`'s
/// current snapshot reaches `before`'s (by parent ids, which outlive an expired parent) without
/// passing a snapshot that carries another checkpoint of `pipeline` than `before` holds (a
/// compaction carries the same one; a commit of this pipeline's changes a newer one). `false`
/// after a rollback (the walk misses `before`'s snapshot) and when the lineage never reaches it.
fn only_others_committed(
    pipeline: &str,
    before: &TableMetadata,
    now: &TableMetadata,
) -> Result<bool, SinkError> {
    let ours = pipeline_checkpoint(pipeline, before)?;
    let head = before.current_snapshot().map(|s| s.snapshot_id());
    let mut id = now.current_snapshot().map(|s| s.snapshot_id());
    // Each step goes to a parent; more steps than snapshots would be a cycle.
    for _ in 0..=now.snapshots().len() {
        if id == head {
            return Ok(true);
        }
        let Some(snapshot) = id.and_then(|i| now.snapshot_by_id(i)) else {
            return Ok(false);
        };
        let props = &snapshot.summary().additional_properties;
        if let Some(cp) = Checkpoint::from_properties(pipeline, props)? {
            if ours.as_ref() != Some(&cp) {
                return Ok(false);
            }
        }
        id = snapshot.parent_snapshot_id();
    }
    Ok(false)
}

/// `pipeline`'s newest checkpoint in `meta`, walking back from the current snapshot: another
/// writer (a compaction, a maintenance job, Spark) may have committed on top of cdcd's newest
/// snapshot without the checkpoint keys, and the newest checkpoint of this pipeline is still the
/// truth about what the table holds.
fn pipeline_checkpoint(
    pipeline: &str,
    meta: &TableMetadata,
) -> Result<Option<Checkpoint>, SinkError> {
    let mut next = meta.current_snapshot();
    while let Some(snapshot) = next {
        let props = &snapshot.summary().additional_properties;
        if let Some(cp) = Checkpoint::from_properties(pipeline, props)? {
            return Ok(Some(cp));
        }
        next = snapshot
            .parent_snapshot_id()
            .and_then(|id| meta.snapshot_by_id(id));
    }
    Ok(None)
}
