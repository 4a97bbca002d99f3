//! Iceberg sink: turns one table's ordered changes into Parquet data files plus deletes and
//! publishes them as one row-delta snapshot that carries the pipeline's checkpoint. Deletes are
//! deletion vectors (format v3, the default `delete_mode`), located through the table's
//! primary-key index, or equality + position delete files (format v2, `delete_mode = "equality"`).
//!
//! Sits at the end of the flow: pipeline → [`IcebergSink::commit`] → (durable) → ack to source.
//! iceberg-rust's `Transaction` can only fast-append, so cdcd owns the commit (DESIGN.md): it
//! writes manifests, the manifest list and `v<N+1>.metadata.json` itself, create-if-absent.
//!
//! Layout by role: `schema.rs` (types and field ids), `input.rs` (checks of a commit's batches),
//! `plan.rs` (pure: what to write), `live.rs` (the snapshot's files and vectors, cached between
//! commits), `lookup.rs` (current rows to complete partial updates), `index.rs` +
//! `index/slot.rs` + `locator.rs` (v3: where each key's row is, updated in the background),
//! `deletes/` (deletion vectors, their Puffin files), `writer.rs` (the files' rows), `encode.rs` (Parquet settings,
//! columns encoded in parallel), `manifest.rs` (Avro manifests and lists), `metadata.rs` (find
//! the newest metadata), `commit.rs` (publish). Tables live at `<warehouse>/<namespace>/<table>/`
//! so any engine finds them without cdcd (DESIGN.md, "Where tables live").

// `SinkError` is large because it carries `iceberg::Error` by value (sinks/mod.rs); boxing it
// there would change the shared seam, so the lint is allowed for this sink.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use iceberg::spec::{DataContentType, FormatVersion, Snapshot};

use crate::changelog::{TableChanges, TableId, TableSchema};
use crate::checkpoint::Checkpoint;
use crate::config::{DeleteMode, IcebergConfig};
use crate::sinks::{CommitStats, Sink, SinkError, TableStatus};
use crate::storage::cleanup::TableCleanup;
use crate::storage::Warehouse;

pub mod cleanup;
mod commit;
pub mod config;
pub mod deletes;
mod encode;
mod index;
mod input;
mod live;
mod locator;
mod lookup;
mod manifest;
mod metadata;
pub mod plan;
mod schema;
mod summary;
mod window;
mod writer;

use deletes::commit_vectors;
use index::IndexSlot;
use input::{check_batches, plan_error};
use live::{LiveState, Published};
use locator::{IndexLocator, RowLocator};
use metadata::Loaded;
use plan::FileLimits;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;

/// Writes Iceberg tables under one warehouse for one pipeline.
///
/// Single writer per table: the newest metadata of each table is cached between commits and
/// reloaded after a conflict.
pub struct IcebergSink {
    warehouse: Warehouse,
    namespace: Option<String>,
    pipeline: String,
    limits: FileLimits,
    /// Format of tables this sink creates: v3 (deletion vectors) or v2 (equality deletes). An
    /// existing table keeps its format: the commit path follows the table's, not the config's.
    format: FormatVersion,
    tables: Mutex<HashMap<TableId, Arc<Loaded>>>,
    /// What each table's commits keep between them (live.rs, pk_index.rs). The async mutex is
    /// held for a whole commit of that table (commits of one table are sequential anyway).
    slots: Mutex<HashMap<TableId, Slot>>,
}

type Slot = Arc<tokio::sync::Mutex<TableSlot>>;

/// A table's state cached between commits; each part is reread when it does not describe the
/// snapshot a commit builds on.
#[derive(Default)]
struct TableSlot {
    /// Primary-key index of a v3 table (index/slot.rs: ready, or updated in the background).
    index: IndexSlot,
    /// Manifests, live files and vectors of the snapshot the last commit made or read.
    live: Option<LiveState>,
}

impl IcebergSink {
    /// A sink for `config`'s warehouse, writing checkpoints of `pipeline`.
    pub fn new(config: &IcebergConfig, pipeline: &str) -> Result<IcebergSink, SinkError> {
        Ok(IcebergSink {
            warehouse: Warehouse::from_url(&config.warehouse)?,
            namespace: config.namespace.clone(),
            pipeline: pipeline.to_owned(),
            limits: FileLimits::default(),
            format: match config.delete_mode {
                DeleteMode::DeletionVectors => FormatVersion::V3,
                DeleteMode::Equality => FormatVersion::V2,
            },
            tables: Mutex::new(HashMap::new()),
            slots: Mutex::new(HashMap::new()),
        })
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
        index::location(&self.warehouse, &self.pipeline, ns, &table.name)
    }

    /// The newest metadata from storage (refreshing the cache).
    async fn load(&self, table: &TableId) -> Result<Option<Arc<Loaded>>, SinkError> {
        let loaded = metadata::load_latest(&self.warehouse, &self.table_location(table))
            .await?
            .map(Arc::new);
        self.remember(table, loaded.clone());
        Ok(loaded)
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
        let location = self.table_location(table);
        let metadata = commit::new_table(table, &location, schema, self.format)?;
        match commit::publish(&self.warehouse, table, 1, &metadata).await {
            Ok(()) => {
                tracing::info!(table = %table, location = %location, "created Iceberg table");
                let loaded = Arc::new(Loaded {
                    version: 1,
                    metadata,
                });
                self.remember(table, Some(loaded.clone()));
                Ok(loaded)
            }
            // Someone created it first: use theirs (the schema check follows).
            Err(SinkError::CommitConflict { .. }) => {
                self.load(table).await?.ok_or_else(|| SinkError::Corrupt {
                    path: metadata::metadata_location(&location, 1),
                    detail: "exists but cannot be loaded".into(),
                })
            }
            Err(e) => Err(e),
        }
    }

    async fn commit_inner(
        &self,
        schema: &Arc<TableSchema>,
        changes: &[TableChanges],
        checkpoint: &Checkpoint,
    ) -> Result<CommitStats, SinkError> {
        let table = &schema.id;
        let wanted = schema::iceberg_schema(schema)?;
        let loaded = self.load_or_create(table, wanted.clone()).await?;
        let meta = &loaded.metadata;
        if let Some(detail) = schema::schema_difference(meta.current_schema(), &wanted) {
            return Err(SinkError::SchemaChanged {
                table: table.clone(),
                detail,
            });
        }
        check_batches(schema, changes)?;
        let mut plan = plan::plan(changes, &schema.primary_key, self.limits)
            .map_err(|e| plan_error(schema, changes, e))?;

        let parent = meta.current_snapshot().cloned();
        let version = meta.format_version();
        let v3 = version >= FormatVersion::V3;
        // The table's cached state (live files, vectors, index), held for the whole commit.
        let slot = self.table_slot(table);
        let mut guard = slot.lock().await;
        let TableSlot { index, live } = &mut *guard;
        let state = match live {
            Some(state) if state.describes(meta) => state,
            _ => live.insert(LiveState::load(&self.warehouse, table, meta).await?),
        };
        // The index is needed before the files are written only to locate keys: rows to
        // complete (lookups) or to delete from earlier snapshots. Otherwise it is readied after
        // the files, overlapping the last commit's index update with this commit's encoding.
        let index_first = v3 && (!plan.lookups.is_empty() || !plan.equality_deletes.is_empty());
        let index_location = self.index_location(table);
        if index_first {
            let (files, dvs) = (&state.files, &state.dvs);
            index
                .ready(&self.warehouse, &index_location, schema, meta, files, dvs)
                .await?;
        }
        let files = &state.files;
        let live_dvs = &state.dvs;
        let table_index = index.get();
        let arrow = |what: &str| {
            let context = format!("{what} of {table}");
            move |source| SinkError::Arrow { context, source }
        };
        let keys_schema = TableChanges::keys_schema(schema);
        let droppable = window::droppable(changes, &plan.lookups);
        let lookup = match (plan.lookups.is_empty(), table_index) {
            (true, _) => None,
            (false, Some(ti)) => {
                let keys =
                    writer::key_batch(changes, &plan.lookups, &schema.primary_key, &keys_schema)
                        .map_err(arrow("gathering lookup keys"))?;
                let at = IndexLocator::new(ti, files, live_dvs).locate(&keys).await?;
                Some(lookup::fetch(&self.warehouse, schema, &keys, &at, &droppable).await?)
            }
            (false, None) => Some(
                lookup::lookup(
                    &self.warehouse,
                    schema,
                    files,
                    live_dvs,
                    changes,
                    &plan.lookups,
                    &droppable,
                )
                .await?,
            ),
        };
        let lookup = match lookup {
            Some((rows, missing)) if missing.contains(&true) => {
                let dropped = window::drop_unfillable(&mut plan, changes, &missing)
                    .map_err(|row| window::key_change_error(schema, changes, row))?;
                if dropped > 0 {
                    tracing::info!(table = %table, rows = dropped, "dropped partial updates of rows deleted later inside the upsert window");
                }
                Some(rows)
            }
            other => other.map(|(rows, _)| rows),
        };
        // Keys whose row in an earlier snapshot this commit removes (v3: located, then told to
        // the index after the commit).
        let removed_keys = match table_index {
            Some(_) if !plan.equality_deletes.is_empty() => Some(
                writer::key_batch(
                    changes,
                    &plan.equality_deletes,
                    &schema.primary_key,
                    &keys_schema,
                )
                .map_err(arrow("gathering keys to locate"))?,
            ),
            _ => None,
        };
        let located = match (table_index, &removed_keys) {
            (Some(ti), Some(keys)) => IndexLocator::new(ti, files, live_dvs).locate(keys).await?,
            _ => Vec::new(),
        };

        let sequence = meta.last_sequence_number() + 1;
        let snapshot_id = fresh_snapshot_id(meta);
        let commit_id = uuid::Uuid::new_v4();
        let location = meta.location().to_owned();
        let file_schema = schema::data_file_schema(meta.current_schema())?;

        let mut data_files = Vec::with_capacity(plan.files.len());
        let mut paths = Vec::with_capacity(plan.files.len());
        for (i, f) in plan.files.iter().enumerate() {
            let path = format!("{location}/data/{commit_id}-{i:05}.parquet");
            let batches = writer::data_batches(changes, f, lookup.as_ref(), &file_schema)
                .map_err(arrow("gathering data rows"))?;
            let file = writer::write_file(
                &self.warehouse,
                table,
                path.clone(),
                batches,
                DataContentType::Data,
                None,
            )
            .await?;
            data_files.push(file);
            paths.push(path);
        }
        let mut delete_files = Vec::new();
        let deleted_rows;
        // Data files whose live DV this commit replaces with a merged one.
        let mut replaced: HashSet<String> = HashSet::new();
        let mut vectors = BTreeMap::new();
        if v3 {
            let mut new_dvs = commit_vectors::NewDvs::default();
            for addr in located.iter().flatten() {
                new_dvs.delete(table, &addr.file, addr.pos, live_dvs)?;
            }
            for &(f, pos) in &plan.position_deletes {
                if let Some(path) = paths.get(f as usize) {
                    new_dvs.delete(table, path, u64::from(pos), live_dvs)?;
                }
            }
            new_dvs.merge_live(live_dvs);
            deleted_rows = new_dvs.deleted;
            replaced.extend(
                new_dvs
                    .dvs
                    .keys()
                    .filter(|f| live_dvs.contains_key(*f))
                    .cloned(),
            );
            // One Puffin file per vector. With several blobs in one Puffin file (as Iceberg-Java
            // writes, and as the spec allows: each entry names its blob by `content_offset` and
            // `content_size_in_bytes`), DuckDB 1.5.5 applies a neighbouring blob to the wrong
            // data file after some commits (seen again in tests/s3_crash and s3_standby; Spark
            // and pyiceberg read the same tables right). One blob per file sidesteps it at the
            // cost of more small files.
            for (i, (file, vector)) in new_dvs.dvs.iter().enumerate() {
                let path = format!("{location}/data/{commit_id}-dv-{i:05}.puffin");
                let one = std::collections::BTreeMap::from([(file.clone(), vector.clone())]);
                delete_files.extend(
                    commit_vectors::write_puffin(&self.warehouse, table, &path, &one).await?,
                );
            }
            vectors = new_dvs.dvs;
        } else {
            deleted_rows = (plan.position_deletes.len() + plan.equality_deletes.len()) as u64;
            writer::write_v2_deletes(
                &self.warehouse,
                &mut delete_files,
                schema,
                changes,
                &plan,
                &paths,
                &file_schema,
                &location,
                commit_id,
            )
            .await?;
        }

        if v3 && !index_first {
            let (files, dvs) = (&state.files, &state.dvs);
            index
                .ready(&self.warehouse, &index_location, schema, meta, files, dvs)
                .await?;
        }
        let files_written = data_files.len() + delete_files.len();
        let target = |deletes: bool| manifest::ManifestTarget {
            version,
            schema: meta.current_schema().clone(),
            spec: meta.default_partition_spec().clone(),
            snapshot_id,
            deletes,
        };
        let mut new_manifests = Vec::new();
        let mut removed_deletes = Vec::new();
        // Manifests that list a replaced DV are rewritten without that entry.
        let rewrite: HashSet<&str> = replaced
            .iter()
            .filter_map(|f| live_dvs.get(f).map(|d| &*d.entry.manifest))
            .collect();
        let mut rewritten = HashMap::new();
        if !plan.truncate {
            for (i, m) in state.manifests.iter().enumerate() {
                if !rewrite.contains(m.manifest_path.as_str()) {
                    // A manifest left with no live entry is dropped, not carried forward.
                    if m.has_added_files() || m.has_existing_files() {
                        new_manifests.push(m.clone());
                    }
                    continue;
                }
                let path = format!("{location}/metadata/{commit_id}-r{i}.avro");
                let (kept, removed) =
                    manifest::rewrite_manifest(&self.warehouse, path, &target(true), m, |f| {
                        f.content_type() == DataContentType::PositionDeletes
                            && f.referenced_data_file()
                                .is_some_and(|r| replaced.contains(&r))
                    })
                    .await?;
                removed_deletes.extend(removed);
                rewritten.insert(
                    m.manifest_path.clone(),
                    kept.as_ref().map(|k| Arc::from(k.manifest_path.as_str())),
                );
                new_manifests.extend(kept);
            }
        }
        let mut summary = summary::summary(
            &summary::Changes {
                truncate: plan.truncate,
                data: &data_files,
                deletes: &delete_files,
                removed_deletes: &removed_deletes,
            },
            parent.as_deref(),
            checkpoint,
        );
        let epoch = self.warehouse.lease_epoch();
        if epoch > 0 {
            summary.additional_properties.insert(
                crate::checkpoint::LEASE_EPOCH_KEY.to_owned(),
                epoch.to_string(),
            );
        }
        // What the cached state needs after the publish (a few entries per commit).
        let (added_data, added_deletes) = (data_files.clone(), delete_files.clone());
        let mut added_paths: [Option<Arc<str>>; 2] = [None, None];
        // New manifests first: readers see this commit's files before the carried-over ones.
        let mut added = Vec::new();
        for (n, (files, deletes)) in [(data_files, false), (delete_files, true)]
            .into_iter()
            .enumerate()
        {
            if files.is_empty() {
                continue;
            }
            let path = format!("{location}/metadata/{commit_id}-m{n}.avro");
            if let Some(p) = added_paths.get_mut(n) {
                *p = Some(Arc::from(path.as_str()));
            }
            added.push(
                manifest::write_manifest(&self.warehouse, path, &target(deletes), sequence, files)
                    .await?,
            );
        }
        added.extend(new_manifests);
        let list = format!("{location}/metadata/snap-{snapshot_id}-1-{commit_id}.avro");
        let first_row_id = meta.next_row_id();
        let (added_rows, list_manifests) = manifest::write_manifest_list(
            &self.warehouse,
            &list,
            version,
            snapshot_id,
            parent.as_ref().map(|s| s.snapshot_id()),
            sequence,
            first_row_id,
            added,
        )
        .await?;

        let base = Snapshot::builder()
            .with_snapshot_id(snapshot_id)
            .with_parent_snapshot_id(parent.as_ref().map(|s| s.snapshot_id()))
            .with_sequence_number(sequence)
            .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
            .with_manifest_list(list)
            .with_summary(summary)
            .with_schema_id(meta.current_schema_id());
        // v3 row lineage: this snapshot assigns row ids [first_row_id, first_row_id + added_rows)
        // (Iceberg spec, "Row Lineage"); the metadata builder advances `next-row-id`.
        let snapshot = if v3 {
            base.with_row_range(first_row_id, added_rows).build()
        } else {
            base.build()
        };
        let next = commit::with_snapshot(table, &loaded, snapshot)?;
        let version = loaded.version + 1;
        match commit::publish(&self.warehouse, table, version, &next).await {
            Ok(()) => {}
            Err(e) => {
                // Conflict or unknown outcome: reload before the next attempt.
                self.remember(table, None);
                return Err(e);
            }
        }
        self.remember(
            table,
            Some(Arc::new(Loaded {
                version,
                metadata: next,
            })),
        );
        let [data_manifest, delete_manifest] = added_paths;
        state.advance(Published {
            snapshot_id,
            sequence,
            truncate: plan.truncate,
            manifests: list_manifests,
            data: added_data,
            data_manifest,
            deletes: added_deletes,
            delete_manifest,
            rewritten,
            replaced: &replaced,
            vectors,
        });
        // The snapshot is durable: a failure from here on must not fail the commit (the caller
        // would retry changes the table already holds). The index is dropped instead, and the
        // next commit reopens it and replays this snapshot (pk_index.rs, recovery). The update
        // runs in the background until the next commit readies the index (index/slot.rs).
        let data_rows = plan.data_rows() as u64;
        index.record_in_background(
            Arc::clone(schema),
            changes.to_vec(),
            plan,
            paths,
            removed_keys,
            snapshot_id,
        );
        Ok(CommitStats {
            snapshot_id,
            data_rows,
            deleted_rows,
            files_written,
        })
    }
}

#[async_trait]
impl Sink for IcebergSink {
    async fn checkpoint(&self, table: &TableId) -> Result<Option<Checkpoint>, SinkError> {
        let Some(loaded) = self.load(table).await? else {
            return Ok(None);
        };
        // Walk back from the current snapshot: another writer (a compaction, a maintenance job)
        // may have committed on top of cdcd's newest snapshot without the checkpoint keys, and
        // the newest checkpoint of this pipeline is still the truth about what the table holds.
        let meta = &loaded.metadata;
        let mut next = meta.current_snapshot();
        while let Some(snapshot) = next {
            let props = &snapshot.summary().additional_properties;
            if let Some(cp) = Checkpoint::from_properties(&self.pipeline, props)? {
                return Ok(Some(cp));
            }
            next = snapshot
                .parent_snapshot_id()
                .and_then(|id| meta.snapshot_by_id(id));
        }
        Ok(None)
    }

    async fn commit(
        &self,
        schema: &Arc<TableSchema>,
        changes: &[TableChanges],
        checkpoint: &Checkpoint,
    ) -> Result<CommitStats, SinkError> {
        self.commit_inner(schema, changes, checkpoint).await
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
        Ok(Some(TableStatus {
            snapshot_id: snapshot.map_or(0, |s| s.snapshot_id()),
            checkpoint,
            rows,
            location: loaded.metadata.location().to_owned(),
        }))
    }

    async fn cleanup(
        &self,
        grace: std::time::Duration,
        dry_run: bool,
    ) -> Result<Vec<TableCleanup>, SinkError> {
        let mut reports = Vec::new();
        for table in cleanup::find_tables(&self.warehouse).await? {
            reports.push(cleanup::clean_table(&self.warehouse, &table, grace, dry_run).await?);
        }
        Ok(reports)
    }
}

/// A positive snapshot id not used by the table yet.
fn fresh_snapshot_id(meta: &iceberg::spec::TableMetadata) -> i64 {
    loop {
        let (hi, _) = uuid::Uuid::new_v4().as_u64_pair();
        let id = (hi & i64::MAX as u64) as i64;
        if id != 0 && meta.snapshot_by_id(id).is_none() {
            return id;
        }
    }
}
