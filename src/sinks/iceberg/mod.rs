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
//! Layout by role: `commit/` (the commit as a row-delta producer, one method per step: locate,
//! files, manifests, summary, manifest list, publish), `schema.rs` (types and field ids),
//! `input.rs` (checks of a commit's batches), `plan.rs` (pure: what to write), `rows/` (where a
//! row is: the snapshot's files and vectors cached between commits in `live.rs`, current rows to
//! complete partial updates in `lookup.rs`, v3's primary-key index in `index.rs` +
//! `index/slot.rs` + `locator.rs`, updated in the background, keyless multiset rows, the upsert
//! window), `files/` (the files' rows in `writer.rs`, Parquet settings and parallel columns in
//! `encode.rs`, Avro manifests and a snapshot's files in `manifest.rs`, the newest metadata in
//! `metadata.rs`), `deletes/` (deletion vectors, their Puffin files, v2 position deletes),
//! `catalog/` (where tables are found and commits published: the filesystem, a SQL or a REST
//! catalog), `transaction.rs` (several tables in one REST transaction), `resync/` (a table copied
//! again into a new lineage and swapped in),
//! `cleanup.rs` (orphan files for `cdcd cleanup`), `maintenance/` (snapshot expiry and the
//! metadata log, following the table's properties; `Sink::maintain`). This
//! file keeps the [`Sink`] impl and the table cache. Tables live at
//! `<warehouse>/<namespace>/<table>/` so any engine finds them without cdcd (README, "Where
//! the tables are").

// `SinkError` is large because it carries `iceberg::Error` by value (sinks/mod.rs); boxing it
// there would change the shared seam, so the lint is allowed for this sink.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use iceberg::spec::{FormatVersion, TableMetadata};

use crate::changelog::{TableChanges, TableId, TableSchema};
use crate::checkpoint::Checkpoint;
use crate::config::{DeleteMode, IcebergConfig, SchemaChangePolicy};
use crate::sinks::{
    CommitStats, MaintenanceReport, ResyncState, Sink, SinkError, TableCommit, TableFiles,
    TableStatus,
};
use crate::storage::cleanup::TableCleanup;
use crate::storage::Warehouse;

pub mod catalog;
pub mod cleanup;
mod commit;
pub mod config;
pub mod deletes;
mod evolve;
mod files;
mod input;
mod layout;
pub(crate) mod maintenance;
pub mod plan;
mod resync;
mod rows;
mod schema;
mod transaction;

use catalog::{Catalog, TableRef};
use commit::{publish, Cached, Input, RowDelta, Staged, Target};
use files::metadata::Loaded;
use plan::FileLimits;
use rows::index::IndexSlot;
use rows::live::LiveState;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;

/// Writes Iceberg tables under one warehouse for one pipeline.
///
/// Single writer per table: the newest metadata of each table is cached between commits and
/// reloaded after a conflict.
pub struct IcebergSink {
    warehouse: Warehouse,
    /// Where tables are found and commits published (`[sink.catalog]`, catalog/).
    catalog: Catalog,
    namespace: Option<String>,
    pipeline: String,
    limits: FileLimits,
    /// Format of tables this sink creates: v3 (deletion vectors) or v2 (equality deletes). An
    /// existing table keeps its format: the commit path follows the table's, not the config's.
    format: FormatVersion,
    tables: Mutex<HashMap<TableId, Arc<Loaded>>>,
    /// What each table's commits keep between them (rows/live.rs, pk_index.rs). The async mutex is
    /// held for a whole commit of that table (commits of one table are sequential anyway), and
    /// by a maintenance commit (maintenance/cycle.rs), so the two never race for a version.
    slots: Mutex<HashMap<TableId, Slot>>,
    /// `[sink.table_properties]`: set on the tables this sink creates.
    table_properties: BTreeMap<String, String>,
    /// `[sink.tables.*]`: each table's spec, sort order and properties (layout.rs, evolve.rs).
    settings: crate::config::TablesConfig,
    /// `source.schema_change`.
    schema_change: SchemaChangePolicy,
    /// How often the daemon runs a maintenance cycle (`None`: never).
    maintenance_interval: Option<Duration>,
    /// Tables whose commits ask for a cycle before the interval (`Compaction::triggered`).
    maintenance_wanted: Arc<crate::sinks::MaintenanceWanted>,
    /// One maintenance cycle at a time; what cycles keep between them.
    maintenance: tokio::sync::Mutex<maintenance::MaintenanceState>,
    /// The log said once that the REST catalog offers no multi-table commits.
    said_no_transactions: std::sync::atomic::AtomicBool,
    /// Tables under resync ([`Sink::resync`]) and their request ids: their commits go to the new
    /// lineage at `<table>/resync-<id>` (resync.rs) until it replaces the live table.
    resyncs: Mutex<HashMap<TableId, crate::sinks::resync::Lineage>>,
    /// The catalog of resync lineages: always the filesystem (a lineage is cdcd's own until
    /// the swap publishes it through [`IcebergSink::catalog`]).
    lineage_catalog: Catalog,
}

type Slot = Arc<tokio::sync::Mutex<TableSlot>>;

/// A table's state cached between commits; each part is reread when it does not describe the
/// snapshot a commit builds on.
#[derive(Default)]
struct TableSlot {
    /// Primary-key index of a v3 table (rows/index/slot.rs: ready, or updated in the background).
    index: IndexSlot,
    /// Manifests, live files and vectors of the snapshot the last commit made or read.
    live: Option<LiveState>,
}

impl IcebergSink {
    /// A sink for `config`'s warehouse, writing checkpoints of `pipeline`.
    pub fn new(config: &IcebergConfig, pipeline: &str) -> Result<IcebergSink, SinkError> {
        Ok(IcebergSink {
            warehouse: Warehouse::from_url(&config.warehouse)?,
            catalog: Catalog::new(&config.catalog),
            namespace: config.namespace.clone(),
            pipeline: pipeline.to_owned(),
            limits: FileLimits::default(),
            format: match config.delete_mode {
                DeleteMode::DeletionVectors => FormatVersion::V3,
                DeleteMode::Equality => FormatVersion::V2,
            },
            tables: Mutex::new(HashMap::new()),
            slots: Mutex::new(HashMap::new()),
            table_properties: config.table_properties.clone(),
            settings: config.tables.clone(),
            maintenance_interval: (config.maintenance_interval_ms > 0)
                .then(|| Duration::from_millis(config.maintenance_interval_ms)),
            maintenance: tokio::sync::Mutex::default(),
            maintenance_wanted: Arc::default(),
            said_no_transactions: std::sync::atomic::AtomicBool::new(false),
            resyncs: Mutex::new(HashMap::new()),
            lineage_catalog: Catalog::Filesystem,
            schema_change: SchemaChangePolicy::default(),
        })
    }

    /// `source.schema_change`: with `stop`, a commit that would change a table's schema fails.
    pub fn with_schema_change(mut self, schema_change: SchemaChangePolicy) -> IcebergSink {
        self.schema_change = schema_change;
        self
    }

    /// Writes through `warehouse` (opened with `[sink.s3]` settings) instead of the store opened
    /// from the URL alone.
    pub fn with_warehouse(mut self, warehouse: Warehouse) -> IcebergSink {
        self.warehouse = warehouse;
        self
    }

    /// Rolls data files at other limits than ~128 MiB / 1M rows.
    pub fn with_file_limits(mut self, limits: FileLimits) -> IcebergSink {
        self.limits = limits;
        self
    }

    /// `<warehouse>/<namespace>/<table>`; namespace = the configured one or the source schema.
    pub fn table_location(&self, table: &TableId) -> String {
        let ns = self.namespace.as_deref().unwrap_or(&table.namespace);
        self.warehouse.location(&[ns, &table.name])
    }

    /// Where `table`'s commits go now: its resync lineage while one is under way (resync.rs),
    /// else [`IcebergSink::table_location`].
    fn current_location(&self, table: &TableId) -> String {
        match self.resync_id(table) {
            Some(id) => resync::lineage_location(&self.table_location(table), &id),
            None => self.table_location(table),
        }
    }

    /// The catalog `table`'s commits go through now: the filesystem for a resync lineage, else
    /// the configured one.
    fn catalog_for(&self, table: &TableId) -> &Catalog {
        if self.resync_id(table).is_some() {
            &self.lineage_catalog
        } else {
            &self.catalog
        }
    }

    /// `table` as the catalog names it; `location` is [`IcebergSink::current_location`]'s.
    fn table_ref<'a>(&'a self, table: &'a TableId, location: &'a str) -> TableRef<'a> {
        TableRef {
            id: table,
            namespace: self.namespace.as_deref().unwrap_or(&table.namespace),
            name: &table.name,
            location,
        }
    }

    fn cached(&self, table: &TableId) -> Option<Arc<Loaded>> {
        self.tables.lock().ok()?.get(table).cloned()
    }

    fn remember(&self, table: &TableId, loaded: Option<Arc<Loaded>>) {
        if let Ok(mut t) = self.tables.lock() {
            match loaded {
                Some(l) => t.insert(table.clone(), l),
                None => t.remove(table),
            };
        }
    }

    fn table_slot(&self, table: &TableId) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(slots.entry(table.clone()).or_default())
    }

    /// Waits for `table`'s background index update, if one runs.
    async fn settle_index(&self, table: &TableId) {
        let slot = self.table_slot(table);
        slot.lock().await.index.settle().await;
    }

    /// Where the primary-key index of `table` lives (pk_index.rs says why there).
    pub fn index_location(&self, table: &TableId) -> String {
        let ns = self.namespace.as_deref().unwrap_or(&table.namespace);
        rows::index::location(&self.warehouse, &self.pipeline, ns, &table.name)
    }

    /// Where the index of `table` as of `meta` lives: a resync lineage has its own (it is
    /// written beside the live table's, by a copy job's sink while the pipeline's commits the
    /// live table: `resync.rs`), and keeps it once it is the live table (its `cdcd.resync-id`
    /// names it), so the swap needs no rebuild.
    fn index_location_for(&self, table: &TableId, meta: &TableMetadata) -> String {
        let id = self
            .resync_id(table)
            .or_else(|| meta.properties().get(resync::RESYNC_ID_PROPERTY).cloned());
        self.index_location_of(table, id.as_deref())
    }

    /// The index location of `table`'s lineage `resync_id` (`None`: the table as first created).
    fn index_location_of(&self, table: &TableId, resync_id: Option<&str>) -> String {
        match resync_id {
            Some(id) => {
                let ns = self.namespace.as_deref().unwrap_or(&table.namespace);
                let name = format!("{}.resync-{id}", table.name);
                rows::index::location(&self.warehouse, &self.pipeline, ns, &name)
            }
            None => self.index_location(table),
        }
    }

    /// The current metadata, through the catalog (refreshing the cache).
    async fn load(&self, table: &TableId) -> Result<Option<Arc<Loaded>>, SinkError> {
        let location = self.current_location(table);
        let loaded = self
            .catalog_for(table)
            .load(&self.warehouse, &self.table_ref(table, &location))
            .await?
            .map(Arc::new);
        self.remember(table, loaded.clone());
        Ok(loaded)
    }

    /// A table the catalog does not know but whose directory holds metadata (the pipeline ran
    /// with the filesystem catalog before): registered in the catalog as it is, so its
    /// checkpoint holds and nothing is copied again. `None` when there is nothing to adopt.
    async fn adopt(&self, table: &TableId) -> Result<Option<Arc<Loaded>>, SinkError> {
        if matches!(self.catalog_for(table), Catalog::Filesystem) {
            return Ok(None);
        }
        let location = self.current_location(table);
        let Some(existing) = catalog::filesystem::load(&self.warehouse, &location).await? else {
            return Ok(None);
        };
        let registered = self
            .catalog_for(table)
            .create(
                &self.warehouse,
                &self.table_ref(table, &location),
                existing.metadata,
            )
            .await;
        match registered {
            Ok(loaded) => {
                let loaded = Arc::new(loaded);
                self.remember(table, Some(loaded.clone()));
                Ok(Some(loaded))
            }
            // Registered meanwhile by another writer: theirs.
            Err(SinkError::CommitConflict { .. }) => self.load(table).await,
            Err(e) => Err(e),
        }
    }

    /// The cached or stored metadata, creating the table (v1) when it does not exist.
    async fn load_or_create(
        &self,
        table: &TableId,
        schema: iceberg::spec::Schema,
    ) -> Result<Arc<Loaded>, SinkError> {
        if let Some(l) = self.cached(table) {
            return Ok(l);
        }
        if let Some(l) = self.load(table).await? {
            return Ok(l);
        }
        let location = self.current_location(table);
        // The table's settings are checked against its schema before anything is written.
        let settings = self.settings.resolve(table)?;
        let layout = layout::bind(table, &settings, &schema, None)?;
        let mut properties = self.table_properties.clone();
        properties.extend(settings.properties);
        let properties = maintenance::properties::for_new_table(&properties);
        let metadata = publish::new_table_with(
            table,
            &location,
            schema,
            self.format,
            properties,
            layout.for_new_table(),
        )?;
        let created = self
            .catalog_for(table)
            .create(&self.warehouse, &self.table_ref(table, &location), metadata)
            .await;
        match created {
            Ok(loaded) => {
                tracing::info!(table = %table, location = %location, "created Iceberg table");
                let loaded = Arc::new(loaded);
                self.remember(table, Some(loaded.clone()));
                Ok(loaded)
            }
            // Someone created it first: use theirs (the schema check follows).
            Err(SinkError::CommitConflict { .. }) => {
                self.load(table).await?.ok_or_else(|| SinkError::Corrupt {
                    path: files::metadata::metadata_location(&location, 1),
                    detail: "exists but cannot be loaded".into(),
                })
            }
            Err(e) => Err(e),
        }
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
    async fn commit_inner(
        &self,
        schema: &Arc<TableSchema>,
        changes: &[TableChanges],
        checkpoint: &Checkpoint,
    ) -> Result<CommitStats, SinkError> {
        let table = &schema.id;
        for attempt in 1.. {
            let before = self.cached(table);
            let conflict = match self.commit_once(schema, changes, checkpoint).await {
                Err(e @ SinkError::CommitConflict { .. }) => e,
                other => return other,
            };
            if attempt >= COMMIT_ATTEMPTS {
                return Err(conflict);
            }
            let Some(before) = before else {
                return Err(conflict);
            };
            let Some(now) = self.load(table).await? else {
                return Err(conflict);
            };
            if !only_others_committed(&self.pipeline, &before.metadata, &now.metadata)? {
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

    /// Stages one table's commit while its slot is held: the base loaded (or the table
    /// created), the changes planned, every file the snapshot names written (commit/mod.rs,
    /// steps 1–2). Nothing is visible yet; the caller publishes.
    async fn stage<'a>(
        &'a self,
        slot: &'a mut TableSlot,
        input: Input<'a>,
    ) -> Result<(RowDelta<'a>, Staged, Cached<'a>), SinkError> {
        let table = &input.schema.id;
        let wanted = schema::iceberg_schema(input.schema)?;
        let base = self.load_or_create(table, wanted.clone()).await?;
        let target = Target {
            warehouse: &self.warehouse,
            index_location: self.index_location_for(table, &base.metadata),
            limits: self.limits,
            schema_change: self.schema_change.for_table(table),
        };
        let mut delta = RowDelta::new(target, input, base, &wanted)?;
        let mut cached = slot
            .for_commit(&self.warehouse, table, delta.base())
            .await?;
        let staged = delta.stage(&mut cached).await?;
        Ok((delta, staged, cached))
    }

    /// One commit attempt, in the steps of the producer (commit/mod.rs); this keeps the table
    /// cache.
    async fn commit_once(
        &self,
        schema: &Arc<TableSchema>,
        changes: &[TableChanges],
        checkpoint: &Checkpoint,
    ) -> Result<CommitStats, SinkError> {
        let table = &schema.id;
        // The table's cached state (live files, vectors, index), held for the whole commit, from
        // before the base is loaded: a maintenance commit in between would take its version.
        let slot = self.table_slot(table);
        let mut guard = slot.lock().await;
        let input = Input {
            schema,
            changes,
            checkpoint,
        };
        let (delta, Staged { next, after }, cached) = self.stage(&mut guard, input).await?;
        let base = Arc::clone(delta.base_loaded());
        let location = self.current_location(table);
        let catalog = self.catalog_for(table);
        let published = delta
            .publish(catalog, &self.table_ref(table, &location), next)
            .await;
        let published = match published {
            Ok(published) => {
                maintenance::metadata_log::delete_after_commit(
                    &self.warehouse,
                    &base,
                    &published,
                    catalog.names_previous(),
                );
                self.remember(table, Some(Arc::clone(&published)));
                published
            }
            Err(e) => {
                // Conflict or unknown outcome: reload before the next attempt.
                self.remember(table, None);
                return Err(e);
            }
        };
        let mut stats = delta.finish(after, cached);
        self.ask_maintenance_if_due(table, &published.metadata, guard.live.as_ref());
        // A resync lineage whose copy is complete replaces the live table now, while the slot
        // is still held, when its mode says this commit is the one (resync.rs).
        if let Some(lineage) = self.resync_lineage(table) {
            if lineage.swaps_at(&checkpoint.position) {
                crate::failpoints::crash_point(crate::failpoints::RESYNC_BEFORE_SWAP);
                self.swap(table, &lineage.id, &published).await?;
                stats.resync_swapped = true;
            }
        }
        Ok(stats)
    }
}

impl TableSlot {
    /// The index and the live state of `meta`'s current snapshot, for one commit: the cached
    /// state when it describes that snapshot, else reread.
    async fn for_commit(
        &mut self,
        warehouse: &Warehouse,
        table: &TableId,
        meta: &TableMetadata,
    ) -> Result<Cached<'_>, SinkError> {
        let TableSlot { index, live } = self;
        if !live.as_ref().is_some_and(|state| state.describes(meta)) {
            *live = Some(LiveState::load(warehouse, table, meta).await?);
        }
        // Always `Some` here (loaded just above when it was not).
        let live = live.get_or_insert_with(LiveState::default);
        Ok(Cached { index, live })
    }
}

#[async_trait]
impl Sink for IcebergSink {
    async fn checkpoint(&self, table: &TableId) -> Result<Option<Checkpoint>, SinkError> {
        let loaded = match self.load(table).await? {
            Some(loaded) => loaded,
            None => match self.adopt(table).await? {
                Some(loaded) => loaded,
                None => return Ok(None),
            },
        };
        pipeline_checkpoint(&self.pipeline, &loaded.metadata)
    }

    async fn commit(
        &self,
        schema: &Arc<TableSchema>,
        changes: &[TableChanges],
        checkpoint: &Checkpoint,
    ) -> Result<CommitStats, SinkError> {
        self.commit_inner(schema, changes, checkpoint).await
    }

    async fn prepare(&self, tables: &[TableId]) -> Result<(), SinkError> {
        for table in tables {
            self.evolve_layout(table).await?;
        }
        Ok(())
    }

    async fn check_tables(&self, tables: &[TableId]) -> Vec<Result<String, String>> {
        let mut lines = Vec::new();
        for table in tables {
            match self.check_layout(table).await {
                Ok(Some(line)) => lines.push(Ok(line)),
                Ok(None) => {}
                Err(e) => lines.push(Err(e.to_string())),
            }
        }
        lines
    }

    async fn commits_tables_together(&self) -> bool {
        let Catalog::Rest(rest) = &self.catalog else {
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
        if let Catalog::Rest(rest) = &self.catalog {
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
            stats.push(self.commit_inner(c.schema, c.changes, c.checkpoint).await?);
        }
        Ok(stats)
    }

    async fn check(&self) -> Result<Vec<String>, String> {
        match &self.catalog {
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
        let tables: Vec<TableId> = {
            let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.keys().cloned().collect()
        };
        for table in &tables {
            self.settle_index(table).await;
        }
    }

    async fn status(&self, table: &TableId) -> Result<Option<TableStatus>, SinkError> {
        let Some(loaded) = self.load(table).await? else {
            return Ok(None);
        };
        let snapshot = loaded.metadata.current_snapshot();
        let props = snapshot.map(|s| &s.summary().additional_properties);
        let checkpoint = match props {
            Some(p) => Checkpoint::from_properties(&self.pipeline, p)?,
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
                            &self.warehouse,
                            snapshot.manifest_list(),
                            version,
                        )
                        .await?;
                        files::manifest::load_files(&self.warehouse, &manifests)
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
        let tables: Vec<TableId> = match tables {
            Some(t) => t.to_vec(),
            None => {
                let mut t: Vec<TableId> = {
                    let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
                    slots.keys().cloned().collect()
                };
                if let Ok(loaded) = self.tables.lock() {
                    t.extend(loaded.keys().cloned());
                }
                t.sort_by_key(|t| t.to_string());
                t.dedup();
                t
            }
        };
        let mut reports = Vec::new();
        for table in &tables {
            match self.maintain_table(table).await {
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

    async fn resync(
        &self,
        table: &TableId,
        id: &str,
        mode: crate::sinks::ResyncMode,
    ) -> Result<ResyncState, SinkError> {
        self.begin_resync(table, id, mode).await
    }

    async fn abandon_resync(&self, table: &TableId, id: &str) {
        self.abandon_lineage(table, id).await;
    }

    async fn cleanup(
        &self,
        grace: std::time::Duration,
        dry_run: bool,
    ) -> Result<Vec<TableCleanup>, SinkError> {
        let mut reports = Vec::new();
        let sql = match &self.catalog {
            Catalog::Sql(sql) => sql,
            Catalog::Rest(rest) => return self.cleanup_rest(rest, grace, dry_run).await,
            Catalog::Filesystem => {
                for table in cleanup::find_tables(&self.warehouse).await? {
                    let report =
                        cleanup::clean_table(&self.warehouse, &table, None, grace, dry_run).await?;
                    reports.push(report);
                }
                return Ok(reports);
            }
        };
        // The catalog's tables, each from the file its row names: a directory no row names is
        // left alone (it may be a table of another catalog, or a create that never registered).
        for row in sql.tables().await? {
            if self.warehouse.path(&row.metadata_location).is_err() {
                tracing::info!(table = %format!("{}.{}", row.namespace, row.name), "not under this warehouse; skipped");
                continue;
            }
            let metadata =
                files::metadata::read_metadata(&self.warehouse, &row.metadata_location).await?;
            let location = metadata.location().to_owned();
            let report = cleanup::clean_table(
                &self.warehouse,
                &location,
                Some(&row.metadata_location),
                grace,
                dry_run,
            )
            .await?;
            reports.push(report);
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
        let namespace = match &self.namespace {
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
            if self.warehouse.path(&loaded.file).is_err() {
                tracing::info!(table = %format!("{}.{}", listed.namespace, listed.name), "not under this warehouse; skipped");
                continue;
            }
            let location = loaded.metadata.location().to_owned();
            let report = cleanup::clean_table(
                &self.warehouse,
                &location,
                Some(&loaded.file),
                grace,
                dry_run,
            )
            .await?;
            reports.push(report);
        }
        Ok(reports)
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
