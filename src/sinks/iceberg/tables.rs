//! The Iceberg sink's tables: what its commits and its actions (maintenance, compaction, the
//! resync swap, the multi-table commit) share, in one [`Tables`]: where each table lives and
//! which catalog names it, the settings a commit writes with, the resyncs under way, and the
//! per-table cache they read and advance:
//! - each table's newest metadata ([`Tables::cached`]), reloaded from the catalog after a
//!   conflict or an unknown outcome ([`Tables::load`], [`Tables::remember`]);
//! - each table's [`TableSlot`] (the live state of its current snapshot, its primary-key index)
//!   behind the table's slot lock ([`Tables::slot`]).
//!
//! The slot lock is the one order of a table's commits in this process: a streaming commit holds
//! it from loading its base to publishing, and so does every other commit of the table (an
//! expiry, a compaction's choice and commit, a resync's mark and swap, a multi-table commit, each
//! table's slot taken in table order), so no two of them race for a version. An action takes
//! `&Tables` and the locked slot, as `commit::RowDelta` takes its `Target` and `Cached`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use iceberg::spec::{FormatVersion, TableMetadata};

use super::catalog::{self, Catalog, TableRef};
use super::commit::{publish, Cached, Input, RowDelta, Staged, Target};
use super::files::metadata::Loaded;
use super::maintenance::reachable::ManifestCache;
use super::plan::FileLimits;
use super::rows::index::IndexSlot;
use super::rows::live::LiveState;
use super::{changelog, files, layout, maintenance, resync, rows, schema};
use crate::changelog::{TableChanges, TableId, TableSchema};
use crate::checkpoint::Checkpoint;
use crate::config::{DeleteMode, IcebergConfig, SchemaChangePolicy};
use crate::sinks::cdc_columns::{self, CdcColumns};
use crate::sinks::resync::Lineage;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// What the sink's commits and actions share, and the per-table cache (see the module doc).
pub(super) struct Tables {
    pub(super) warehouse: Warehouse,
    /// Where tables are found and commits published (`[sink.catalog]`, catalog/).
    pub(super) catalog: Catalog,
    pub(super) namespace: Option<String>,
    pub(super) pipeline: String,
    pub(super) limits: FileLimits,
    /// Format of tables this sink creates: v3 (deletion vectors) or v2 (equality deletes). An
    /// existing table keeps its format: the commit path follows the table's, not the config's.
    format: FormatVersion,
    /// The newest metadata of each table, cached between commits.
    metadata: Mutex<HashMap<TableId, Arc<Loaded>>>,
    /// What each table's commits keep between them (rows/live.rs, pk_index.rs). The async mutex is
    /// held for a whole commit of that table (commits of one table are sequential anyway), and
    /// by a maintenance commit (maintenance/cycle.rs), so the two never race for a version.
    slots: Mutex<HashMap<TableId, Slot>>,
    /// What each table's manifests and manifest lists list, recorded by the commits that write
    /// them and read by its maintenance (`maintenance/reachable.rs`).
    manifest_contents: Mutex<HashMap<TableId, Arc<ManifestCache>>>,
    /// `[sink.table_properties]`: set on the tables this sink creates.
    table_properties: BTreeMap<String, String>,
    /// `source.schema_change`.
    pub(super) schema_change: SchemaChangePolicy,
    /// `[sink.tables.*]`: each table's spec, sort order and properties (layout.rs, evolve.rs).
    pub(super) settings: crate::config::TablesConfig,
    /// Tables under resync ([`crate::sinks::Sink::resync`]) and their request ids: their commits
    /// go to the new lineage at `<table>/resync-<id>` (resync/) until it replaces the live table.
    pub(super) resyncs: Mutex<HashMap<TableId, Lineage>>,
    /// The catalog of resync lineages: always the filesystem (a lineage is cdcd's own until
    /// the swap publishes it through [`Tables::catalog`]).
    lineage_catalog: Catalog,
    /// Changelog tables written so far (`changelog/`), each with its table: a changelog table
    /// is created with settings of its own, not its table's.
    pub(super) changelogs: Mutex<HashMap<TableId, TableId>>,
}

/// A table's slot behind its lock (see the module doc).
pub(super) type Slot = Arc<tokio::sync::Mutex<TableSlot>>;

/// A table's state cached between commits; each part is reread when it does not describe the
/// snapshot a commit builds on.
#[derive(Default)]
pub(super) struct TableSlot {
    /// Primary-key index of a v3 table (rows/index/slot.rs: ready, or updated in the background).
    pub(super) index: IndexSlot,
    /// Manifests, live files and vectors of the snapshot the last commit made or read.
    pub(super) live: Option<LiveState>,
}

impl Tables {
    /// The tables of `config`'s warehouse, written by `pipeline`.
    pub(super) fn new(config: &IcebergConfig, pipeline: &str) -> Result<Tables, SinkError> {
        Ok(Tables {
            warehouse: Warehouse::from_url(&config.warehouse)?,
            catalog: Catalog::new(&config.catalog),
            namespace: config.namespace.clone(),
            pipeline: pipeline.to_owned(),
            limits: FileLimits::default(),
            format: match config.delete_mode {
                DeleteMode::DeletionVectors => FormatVersion::V3,
                DeleteMode::Equality => FormatVersion::V2,
            },
            metadata: Mutex::new(HashMap::new()),
            slots: Mutex::new(HashMap::new()),
            manifest_contents: Mutex::new(HashMap::new()),
            table_properties: config.table_properties.clone(),
            resyncs: Mutex::new(HashMap::new()),
            lineage_catalog: Catalog::Filesystem,
            schema_change: SchemaChangePolicy::default(),
            settings: config.tables.clone(),
            changelogs: Mutex::new(HashMap::new()),
        })
    }

    /// `<warehouse>/<namespace>/<table>`; namespace = the configured one or the source schema.
    pub(super) fn table_location(&self, table: &TableId) -> String {
        let ns = self.namespace.as_deref().unwrap_or(&table.namespace);
        self.warehouse.location(&[ns, &table.name])
    }

    /// Where `table`'s commits go now: its resync lineage while one is under way (resync/),
    /// else [`Tables::table_location`].
    pub(super) fn current_location(&self, table: &TableId) -> String {
        match self.resync_id(table) {
            Some(id) => resync::lineage_location(&self.table_location(table), &id),
            None => self.table_location(table),
        }
    }

    /// The catalog `table`'s commits go through now: the filesystem for a resync lineage, else
    /// the configured one.
    pub(super) fn catalog_for(&self, table: &TableId) -> &Catalog {
        if self.resync_id(table).is_some() {
            &self.lineage_catalog
        } else {
            &self.catalog
        }
    }

    /// `table` as the catalog names it; `location` is [`Tables::current_location`]'s.
    pub(super) fn table_ref<'a>(&'a self, table: &'a TableId, location: &'a str) -> TableRef<'a> {
        TableRef {
            id: table,
            namespace: self.namespace.as_deref().unwrap_or(&table.namespace),
            name: &table.name,
            location,
        }
    }

    /// The id of `table`'s resync under way in this sink, if any.
    pub(super) fn resync_id(&self, table: &TableId) -> Option<String> {
        self.resync_lineage(table).map(|l| l.id)
    }

    /// `table`'s resync under way in this sink, if any.
    pub(super) fn resync_lineage(&self, table: &TableId) -> Option<Lineage> {
        self.resyncs.lock().ok()?.get(table).cloned()
    }

    /// `table`'s newest metadata as cached (`None`: not cached, or forgotten after a failure).
    pub(super) fn cached(&self, table: &TableId) -> Option<Arc<Loaded>> {
        self.metadata.lock().ok()?.get(table).cloned()
    }

    /// Caches `loaded` as `table`'s newest metadata; `None` forgets it, so the next
    /// [`Tables::load`] asks the catalog.
    pub(super) fn remember(&self, table: &TableId, loaded: Option<Arc<Loaded>>) {
        if let Ok(mut t) = self.metadata.lock() {
            match loaded {
                Some(l) => t.insert(table.clone(), l),
                None => t.remove(table),
            };
        }
    }

    /// `table`'s slot, made on first use; lock it for as long as a commit of the table runs.
    pub(super) fn slot(&self, table: &TableId) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(slots.entry(table.clone()).or_default())
    }

    /// What `table`'s manifests and manifest lists list, as far as this process knows.
    pub(super) fn manifest_contents(&self, table: &TableId) -> Arc<ManifestCache> {
        let mut all = self
            .manifest_contents
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        Arc::clone(all.entry(table.clone()).or_default())
    }

    /// The tables that have a slot (committed to, or maintained, by this sink).
    pub(super) fn with_slots(&self) -> Vec<TableId> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.keys().cloned().collect()
    }

    /// Every table this sink knows, with a slot or cached metadata, in name order.
    pub(super) fn known(&self) -> Vec<TableId> {
        let mut t = self.with_slots();
        if let Ok(loaded) = self.metadata.lock() {
            t.extend(loaded.keys().cloned());
        }
        t.sort_by_key(|t| t.to_string());
        t.dedup();
        t
    }

    /// Waits for `table`'s background index update, if one runs, and persists what it left
    /// unpersisted (`rows/index/mod.rs`, `PERSIST_EVERY`).
    pub(super) async fn settle_index(&self, table: &TableId) {
        let slot = self.slot(table);
        slot.lock().await.index.persist().await;
    }

    /// Where the primary-key index of `table` lives (pk_index.rs says why there).
    pub(super) fn index_location(&self, table: &TableId) -> String {
        let ns = self.namespace.as_deref().unwrap_or(&table.namespace);
        rows::index::location(&self.warehouse, &self.pipeline, ns, &table.name)
    }

    /// Where the index of `table` as of `meta` lives: a resync lineage has its own (it is
    /// written beside the live table's, by a copy job's sink while the pipeline's commits the
    /// live table: `resync/mod.rs`), and keeps it once it is the live table (its
    /// `cdcd.resync-id` names it), so the swap needs no rebuild.
    pub(super) fn index_location_for(&self, table: &TableId, meta: &TableMetadata) -> String {
        let id = self
            .resync_id(table)
            .or_else(|| meta.properties().get(resync::RESYNC_ID_PROPERTY).cloned());
        self.index_location_of(table, id.as_deref())
    }

    /// The index location of `table`'s lineage `resync_id` (`None`: the table as first created).
    pub(super) fn index_location_of(&self, table: &TableId, resync_id: Option<&str>) -> String {
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
    pub(super) async fn load(&self, table: &TableId) -> Result<Option<Arc<Loaded>>, SinkError> {
        let location = self.current_location(table);
        let loaded = self
            .catalog_for(table)
            .load(&self.warehouse, &self.table_ref(table, &location))
            .await?
            .map(Arc::new);
        self.remember(table, loaded.clone());
        Ok(loaded)
    }

    /// Commits `next` on `base` through `table`'s catalog and remembers the outcome: the
    /// published metadata, or nothing after a conflict or an unknown outcome (the next load
    /// tells).
    pub(super) async fn commit_metadata(
        &self,
        table: &TableId,
        base: &Loaded,
        next: TableMetadata,
    ) -> Result<Arc<Loaded>, SinkError> {
        let location = self.current_location(table);
        let published = self
            .catalog_for(table)
            .commit(
                &self.warehouse,
                &self.table_ref(table, &location),
                base,
                next,
            )
            .await;
        match published {
            Ok(after) => {
                let after = Arc::new(after);
                self.remember(table, Some(Arc::clone(&after)));
                Ok(after)
            }
            Err(e) => {
                self.remember(table, None);
                Err(e)
            }
        }
    }

    /// [`commit_metadata`](Self::commit_metadata), then the metadata files that left the log
    /// are deleted in the background (`maintenance/metadata_log.rs`).
    pub(super) async fn commit_metadata_and_sweep(
        &self,
        table: &TableId,
        base: &Loaded,
        next: TableMetadata,
    ) -> Result<Arc<Loaded>, SinkError> {
        let after = self.commit_metadata(table, base, next).await?;
        let keep_previous = self.catalog_for(table).names_previous();
        maintenance::metadata_log::delete_after_commit(
            &self.warehouse,
            base,
            &after,
            keep_previous,
        );
        Ok(after)
    }

    /// A table the catalog does not know but whose directory holds metadata (the pipeline ran
    /// with the filesystem catalog before): registered in the catalog as it is, so its
    /// checkpoint holds and nothing is copied again. `None` when there is nothing to adopt.
    pub(super) async fn adopt(&self, table: &TableId) -> Result<Option<Arc<Loaded>>, SinkError> {
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
    pub(super) async fn load_or_create(
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
        let settings = self.settings_of(table)?;
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
        let metadata = match self.resync_id(table) {
            // A lineage takes the live table's specs and orders, so the swap carries its
            // manifests under specs that mean the same there (resync/layout.rs).
            Some(_) => {
                let live_location = self.table_location(table);
                let live = self
                    .catalog
                    .load(&self.warehouse, &self.table_ref(table, &live_location))
                    .await?;
                match live {
                    Some(live) => resync::layout::like_live(table, metadata, &live.metadata)?,
                    None => metadata,
                }
            }
            None => metadata,
        };
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

    /// Whether `table`'s data files are split by partition: its cached metadata's default spec
    /// has a field, or, not loaded yet (a copy into a table its first commit creates), its
    /// settings set a `partition_by` with a field.
    pub(super) fn splits_by_partition(&self, table: &TableId) -> bool {
        match self.cached(table) {
            Some(loaded) => !loaded.metadata.default_partition_spec().fields().is_empty(),
            None => self
                .settings_of(table)
                .ok()
                .and_then(|s| s.partition_by)
                .is_some_and(|p| !p.value.is_empty()),
        }
    }

    /// `table`'s settings: its sections', or, for a changelog table, those it is created with.
    fn settings_of(
        &self,
        table: &TableId,
    ) -> Result<crate::config::tables::TableSettings, SinkError> {
        let source = self
            .changelogs
            .lock()
            .ok()
            .and_then(|c| c.get(table).cloned());
        match source {
            Some(source) => Ok(changelog::changelog_settings(
                &self.settings.resolve(&source)?,
            )),
            None => Ok(self.settings.resolve(table)?),
        }
    }

    /// Stages one table's commit while its slot is held: the base loaded (or the table
    /// created), the changes planned, every file the snapshot names written (commit/mod.rs,
    /// steps 1–2). Nothing is visible yet; the caller publishes.
    pub(super) async fn stage<'a>(
        &'a self,
        slot: &'a mut TableSlot,
        input: Input<'a>,
    ) -> Result<(RowDelta<'a>, Staged, Cached<'a>), SinkError> {
        let (mut delta, mut cached) = self.plan(slot, input).await?;
        let staged = delta.stage(&mut cached).await?;
        Ok((delta, staged, cached))
    }

    /// [`stage`](Self::stage) up to the files: the base loaded (or the table created), the
    /// changes planned, the slot's state for the commit.
    pub(super) async fn plan<'a>(
        &'a self,
        slot: &'a mut TableSlot,
        input: Input<'a>,
    ) -> Result<(RowDelta<'a>, Cached<'a>), SinkError> {
        let table = &input.schema.id;
        let settings = self.settings.resolve(table)?;
        let wanted = schema::iceberg_schema_for(input.schema, &settings)?;
        let base = self.load_or_create(table, wanted.clone()).await?;
        let soft_deletes = self.settings.resolve(table)?.deletes == crate::config::Deletes::Soft;
        let has_deleted = base
            .metadata
            .current_schema()
            .field_by_name(cdc_columns::DELETED)
            .is_some();
        cdc_columns::refuse_unflagging(table, has_deleted, soft_deletes, input.schema)?;
        let target = Target {
            warehouse: &self.warehouse,
            index_location: self.index_location_for(table, &base.metadata),
            limits: self.limits,
            schema_change: self.schema_change.for_table(table),
            soft_deletes,
            contents: self.manifest_contents(table),
        };
        let delta = RowDelta::new(target, input, base, &wanted)?;
        let cached = slot
            .for_commit(&self.warehouse, table, delta.base())
            .await?;
        Ok((delta, cached))
    }
}

impl Tables {
    /// `changes` with the columns `[sink.tables."…"]` adds to the table's rows
    /// (`sinks/cdc_columns.rs`); `None` when it adds none.
    pub(super) async fn with_cdc_columns(
        &self,
        schema: &Arc<TableSchema>,
        changes: &[TableChanges],
        checkpoint: &Checkpoint,
    ) -> Result<Option<cdc_columns::WithColumns>, SinkError> {
        let table = &schema.id;
        let settings = self.settings.resolve(table)?;
        // Rows from before `_cdc_deleted` was added read false where the format stores
        // initial defaults (v3).
        let cdc = CdcColumns::of(&settings, false);
        if cdc.is_none() {
            return Ok(None);
        }
        let loaded = match self.cached(table) {
            Some(loaded) => Some(loaded),
            None => self.load(table).await?,
        };
        let v3 = match &loaded {
            Some(loaded) => loaded.metadata.format_version() >= FormatVersion::V3,
            None => self.format >= FormatVersion::V3,
        };
        let existing: Option<Vec<String>> = loaded.map(|l| {
            let schema = l.metadata.current_schema();
            schema
                .as_struct()
                .fields()
                .iter()
                .map(|f| f.name.clone())
                .collect()
        });
        CdcColumns::of(&settings, v3).apply_to_commit(
            schema,
            changes,
            checkpoint,
            existing.as_deref(),
        )
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
