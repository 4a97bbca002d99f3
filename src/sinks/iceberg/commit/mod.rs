//! The Iceberg commit: one table's changes become one row-delta snapshot, produced in steps by
//! [`RowDelta`], one method per step (iceberg-rust's `SnapshotProducer` is the model: the new
//! snapshot's identity and file names in one place, manifests, summary, manifest list, commit).
//!
//! `IcebergSink::commit` (`mod.rs`; the table cache is `tables.rs`) drives the steps:
//! 1. [`RowDelta::new`]: the table's schema must be the changes' or evolve to it (`schema.rs`,
//!    `evolve`: the new schema joins the metadata this commit publishes; `SchemaChanged` for any
//!    other change), the
//!    batches are checked (`input.rs`) and planned (`plan.rs`: what to write; pure).
//! 2. [`RowDelta::stage`] writes every file the snapshot names; none is visible yet:
//!    - `locate.rs`: current rows that complete partial updates (`rows/lookup.rs`, through the
//!      primary-key index on v3) — a partial update of a row deleted later inside an upsert
//!      window is dropped (`rows/window.rs`) — and, v3, where the rows this commit deletes are;
//!    - `files.rs`: the data files, then the deletes: v3 deletion vectors merged with the live
//!      ones (one Puffin file each), v2 position and equality delete files;
//!    - `manifests.rs`: the parent's manifests carried over (rewritten where they list a replaced
//!      vector) and merged as the table's properties say (`merge.rs` plans which), this commit's
//!      data and delete manifests, the manifest list (`manifest_list.rs`);
//!      the summary with the checkpoint (`summary.rs`); then the snapshot and the next metadata.
//! 3. [`RowDelta::publish`]: the commit point, through the catalog (`catalog/`): the
//!    filesystem catalog's `v<N+1>.metadata.json` create-if-absent, or the SQL catalog's row
//!    update naming the new file. Before it a failure leaves only unreferenced files (`cdcd
//!    cleanup` removes them); after it the snapshot is durable.
//! 4. [`RowDelta::finish`]: the cached live state advances to the new snapshot and the index gets
//!    its update, both from what the commit wrote; nothing here can fail the commit.
//!
//! iceberg-rust's `Transaction` can only fast-append, which is why cdcd produces the snapshot
//! itself (`docs/architecture.md`, "Decisions, briefly").

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{ArrowError, SchemaRef};
use iceberg::spec::{DataFile, FormatVersion, ManifestFile, Schema, Snapshot, TableMetadata};

use super::catalog::{Catalog, TableRef};
use super::deletes::deletion_vector::DeletionVector;
use super::files::metadata::Loaded;
use super::files::writer::Placement;
use super::input::{check_batches, plan_error};
use super::maintenance::reachable::ManifestCache;
use super::plan::{self, FileLimits, Plan};
use super::rows::index::IndexSlot;
use super::rows::live::{LiveState, Published};
use super::rows::locator::RowAddress;
use super::schema;
use crate::changelog::TableId;
use crate::sinks::{CommitStats, SinkError};
use crate::storage::Warehouse;

mod files;
mod layout;
mod locate;
pub(super) mod manifest_list;
mod manifests;
pub(crate) mod merge;
pub(super) mod publish;
mod steps;
pub(super) mod summary;

/// What the pipeline hands to one commit.
pub(super) use crate::sinks::TableCommit as Input;

/// Where a commit writes: the warehouse, the table's primary-key index, the file size limits.
pub(super) struct Target<'a> {
    pub warehouse: &'a Warehouse,
    pub index_location: String,
    pub limits: FileLimits,
    /// `source.schema_change`: with `stop`, a commit that would change the schema fails.
    pub schema_change: crate::config::SchemaChange,
    /// `deletes = "soft"`: a key change keeps the old key's flagged row (`sinks/cdc_columns.rs`).
    pub soft_deletes: bool,
    /// Where the commit records what its manifests and manifest list list, for the table's
    /// expiry (`maintenance/reachable.rs`).
    pub contents: Arc<ManifestCache>,
}

/// The table's state cached between commits, as one commit reads and advances it (the sink's
/// per-table slot, locked for the whole commit).
pub(super) struct Cached<'s> {
    pub index: &'s mut IndexSlot,
    /// Describes the current snapshot of the metadata the commit builds on.
    pub live: &'s mut LiveState,
}

/// What [`RowDelta::stage`] wrote: the metadata to publish, and what [`RowDelta::finish`] needs.
pub(super) struct Staged {
    pub next: TableMetadata,
    pub after: After,
}

/// What the cached state and the index learn from a published commit (a few entries per commit).
pub(super) struct After {
    found: Found,
    data: DataFiles,
    deletes: Deletes,
    carried: Carried,
    /// Paths of this commit's data manifest and delete manifests, when written.
    added: Added,
    /// The new snapshot's manifest list as written.
    manifests: Vec<ManifestFile>,
}

/// What the commit found in earlier snapshots (`locate.rs`).
struct Found {
    /// Current rows completing partial updates, in `plan.lookups` order.
    lookup: Option<RecordBatch>,
    /// v3: keys whose row in an earlier snapshot this commit removes (told to the index after).
    removed_keys: Option<RecordBatch>,
    /// v3: where those rows are (`None`: no live row).
    located: Vec<Option<RowAddress>>,
}

/// The data files written (`files.rs`).
struct DataFiles {
    files: Vec<DataFile>,
    /// Where each sits (all under the default spec).
    placements: Vec<Placement>,
    /// Their locations, in plan order (position deletes name files by index into it).
    paths: Vec<String>,
    /// The Arrow schema of the table's data files.
    schema: SchemaRef,
}

/// The delete files written (`files.rs`).
#[derive(Default)]
struct Deletes {
    files: Vec<DataFile>,
    /// The spec of each file: its data file's (vectors, position deletes), or the one equality
    /// deletes go under (`layout.rs`).
    spec_ids: Vec<i32>,
    /// Rows this commit deletes.
    deleted_rows: u64,
    /// v3: data files whose live vector this commit replaces with a merged one.
    replaced: HashSet<String>,
    /// v3: the vectors written, merged with the ones they replace, by data file.
    vectors: BTreeMap<String, DeletionVector>,
}

/// The manifests a commit adds (`manifests.rs`): its data files' (all of the default spec) and
/// its delete files', one per spec (a delete file takes its data file's spec).
#[derive(Default)]
pub(super) struct Added {
    data: Option<Arc<str>>,
    deletes: HashMap<i32, Arc<str>>,
    /// The entries of each delete manifest written, by path.
    delete_entries: crate::sinks::iceberg::files::manifest::KnownEntries,
}

/// The parent's manifests as the new snapshot keeps them (`manifests.rs`).
#[derive(Default)]
struct Carried {
    manifests: Vec<ManifestFile>,
    /// Delete files left out of rewritten manifests (replaced vectors).
    removed_deletes: Vec<DataFile>,
    /// Rewritten manifests: old path → new path (`None`: nothing was left).
    rewritten: HashMap<String, Option<Arc<str>>>,
    /// Delete manifests that list a replaced vector, by spec: their other entries join this
    /// commit's delete manifest of that spec instead of a rewrite of each (also in `rewritten`).
    folded: BTreeMap<i32, Vec<ManifestFile>>,
}

impl Carried {
    fn folded_count(&self) -> usize {
        self.folded.values().map(Vec::len).sum()
    }
}

/// The manifest list written (`manifests.rs`).
struct Listed {
    path: String,
    /// v3: row ids this snapshot assigns, from `first_row_id`.
    added_rows: u64,
    first_row_id: u64,
    manifests: Vec<ManifestFile>,
}

/// The new snapshot's identity and the names of the files it writes, all under the table's
/// location and carrying a fresh commit id, so no two commits' files collide.
pub(crate) struct Names {
    pub snapshot_id: i64,
    pub sequence: i64,
    commit_id: uuid::Uuid,
    location: String,
}

impl Names {
    pub(crate) fn new(meta: &TableMetadata) -> Names {
        Names {
            snapshot_id: fresh_snapshot_id(meta),
            sequence: meta.last_sequence_number() + 1,
            commit_id: uuid::Uuid::new_v4(),
            location: meta.location().to_owned(),
        }
    }

    /// The same files' names for a snapshot built on `meta` instead (a compaction whose
    /// rewrite ran while other commits landed: its data files keep their names).
    pub(crate) fn rebased(&self, meta: &TableMetadata) -> Names {
        Names {
            snapshot_id: fresh_snapshot_id(meta),
            sequence: meta.last_sequence_number() + 1,
            commit_id: self.commit_id,
            location: self.location.clone(),
        }
    }

    pub(crate) fn data_file(&self, i: usize) -> String {
        format!("{}/data/{}-{i:05}.parquet", self.location, self.commit_id)
    }

    pub(crate) fn vector_file(&self, i: usize) -> String {
        format!("{}/data/{}-dv-{i:05}.puffin", self.location, self.commit_id)
    }

    pub(crate) fn position_deletes(&self) -> String {
        format!(
            "{}/data/{}-pos-deletes.parquet",
            self.location, self.commit_id
        )
    }

    /// The `n`-th position delete file of a commit (one per partition); the first is
    /// [`position_deletes`](Self::position_deletes).
    pub(crate) fn position_deletes_in(&self, n: usize) -> String {
        if n == 0 {
            return self.position_deletes();
        }
        format!(
            "{}/data/{}-pos-deletes-{n:05}.parquet",
            self.location, self.commit_id
        )
    }

    fn equality_deletes(&self) -> String {
        format!(
            "{}/data/{}-eq-deletes.parquet",
            self.location, self.commit_id
        )
    }

    /// The rewrite of the parent's `i`-th manifest.
    pub(crate) fn rewritten_manifest(&self, i: usize) -> String {
        format!("{}/metadata/{}-r{i}.avro", self.location, self.commit_id)
    }

    /// The `n`-th manifest this commit merges from carried-over ones.
    fn merged_manifest(&self, n: usize) -> String {
        format!("{}/metadata/{}-g{n}.avro", self.location, self.commit_id)
    }

    /// This commit's data (`n` = 0) or delete (`n` ≥ 1, one per partition spec) manifest.
    pub(crate) fn added_manifest(&self, n: usize) -> String {
        format!("{}/metadata/{}-m{n}.avro", self.location, self.commit_id)
    }

    pub(crate) fn manifest_list(&self) -> String {
        format!(
            "{}/metadata/snap-{}-1-{}.avro",
            self.location, self.snapshot_id, self.commit_id
        )
    }
}

/// A positive snapshot id not used by the table yet.
fn fresh_snapshot_id(meta: &TableMetadata) -> i64 {
    loop {
        let (hi, _) = uuid::Uuid::new_v4().as_u64_pair();
        let id = (hi & i64::MAX as u64) as i64;
        if id != 0 && meta.snapshot_by_id(id).is_none() {
            return id;
        }
    }
}

/// One commit of one table; see the module doc for the steps.
pub(super) struct RowDelta<'a> {
    target: Target<'a>,
    input: Input<'a>,
    /// The metadata this commit builds on (its current snapshot is the parent), with the
    /// evolved schema when the commit evolves it.
    base: Arc<Loaded>,
    /// The table's metadata as the catalog gave it: what the catalog commit replaces (a REST
    /// catalog is sent the difference from it, the schema change included).
    loaded: Arc<Loaded>,
    plan: Plan,
    names: Names,
    /// The table is format v3: deletion vectors, located through the primary-key index.
    v3: bool,
    steps: steps::Steps,
}

impl<'a> RowDelta<'a> {
    /// Checks `input` against the table (`wanted`: the schema the changes need) and plans it.
    pub(super) fn new(
        target: Target<'a>,
        input: Input<'a>,
        base: Arc<Loaded>,
        wanted: &Schema,
    ) -> Result<RowDelta<'a>, SinkError> {
        let loaded = Arc::clone(&base);
        let base = match schema::schema_difference(base.metadata.current_schema(), wanted) {
            None => base,
            Some(detail) if target.schema_change == crate::config::SchemaChange::Stop => {
                return Err(SinkError::SchemaChanged {
                    table: input.schema.id.clone(),
                    detail: format!(
                        "{detail}; source.schema_change = \"stop\" (for this table) keeps the lake's schema as it is (change it by hand, or set schema_change = \"evolve\" for it)"
                    ),
                });
            }
            Some(detail) => match schema::evolve(&base.metadata, wanted, input.schema) {
                Some(next) => {
                    tracing::info!(table = %input.schema.id, change = %detail, schema_id = next.schema_id(), "evolving the table's schema");
                    Arc::new(publish::with_schema(&input.schema.id, &base, next)?)
                }
                None => {
                    let v2_default = base.metadata.format_version() < FormatVersion::V3
                        && wanted.as_struct().fields().iter().any(|f| {
                            f.initial_default.is_some()
                                && base
                                    .metadata
                                    .current_schema()
                                    .field_by_name(&f.name)
                                    .is_none()
                        });
                    let renamed = detail.contains(" added") && detail.contains(" removed");
                    let detail = if renamed {
                        format!("{detail}: a column left while another arrived, which may be a rename; cdcd never guesses (drop and add in separate steps, with a change to the table between them)")
                    } else if v2_default {
                        format!("{detail}, with a default the table's existing rows must read: format v2 tables cannot store one (Iceberg v3 initial-default); tables of delete_mode = \"deletion-vectors\" (v3) can")
                    } else {
                        detail
                    };
                    return Err(SinkError::SchemaChanged {
                        table: input.schema.id.clone(),
                        detail,
                    });
                }
            },
        };
        let meta = &base.metadata;
        check_batches(input.schema, input.changes)?;
        let plan = if target.soft_deletes {
            plan::plan_keeping_old_keys(input.changes, &input.schema.primary_key, target.limits)
        } else {
            plan::plan(input.changes, &input.schema.primary_key, target.limits)
        }
        .map_err(|e| plan_error(input.schema, input.changes, e))?;
        let names = Names::new(meta);
        let v3 = meta.format_version() >= FormatVersion::V3;
        Ok(RowDelta {
            target,
            input,
            base,
            loaded,
            plan,
            names,
            v3,
            steps: steps::Steps::start(),
        })
    }

    /// The metadata this commit builds on.
    pub(super) fn base(&self) -> &TableMetadata {
        &self.base.metadata
    }

    /// The table's metadata as the catalog gave it (before this commit's schema change): the
    /// catalog commit's base.
    pub(super) fn base_loaded(&self) -> &Arc<Loaded> {
        &self.loaded
    }

    fn table(&self) -> &TableId {
        &self.input.schema.id
    }

    fn arrow(&self, what: &str) -> impl FnOnce(ArrowError) -> SinkError {
        let context = format!("{what} of {}", self.table());
        move |source| SinkError::Arrow { context, source }
    }

    /// Writes the files, manifests and manifest list of the new snapshot and returns the
    /// metadata that names it; nothing is published.
    pub(super) async fn stage(&mut self, cached: &mut Cached<'_>) -> Result<Staged, SinkError> {
        // The index is needed before the files are written only to locate keys: rows to
        // complete (lookups) or to delete from earlier snapshots. Otherwise it is readied after
        // the files, overlapping the last commit's index update with this commit's encoding.
        let index_first = self.indexed()
            && (!self.plan.lookups.is_empty() || !self.plan.equality_deletes.is_empty());
        self.steps.lap("plan");
        if index_first {
            self.ready_index(cached).await?;
            self.steps.lap("index");
        }
        let found = self.locate(cached).await?;
        self.steps.lap("locate");
        let placements = self.lay_out(found.lookup.as_ref())?;
        let data = self.write_data(found.lookup.as_ref(), &placements).await?;
        self.steps.lap("data");
        self.steps.wrote("data", data.files.len());
        let equality_spec = self.equality_spec()?;
        let deletes = self
            .write_deletes(cached.live, &found, &data, equality_spec)
            .await?;
        self.steps.lap("deletes");
        self.steps.wrote("deletes", deletes.files.len());
        if self.indexed() && !index_first {
            self.ready_index(cached).await?;
            self.steps.lap("index");
        }
        let mut carried = self.carry_manifests(cached.live, &deletes).await?;
        self.steps.lap("carry");
        self.steps.wrote(
            "rewritten",
            carried.rewritten.len() - carried.folded_count(),
        );
        let merged = self.merge_carried(&mut carried).await?;
        self.steps.lap("merge");
        self.steps.wrote("merged", merged.created);
        let (mut manifests, added) = self
            .write_added_manifests(&data, &deletes, &mut carried, &cached.live.delete_entries)
            .await?;
        self.steps.lap("manifests");
        self.steps.wrote("manifests", manifests.len());
        let mut summary = summary::summary(
            &summary::Changes {
                truncate: self.plan.truncate,
                data: &data.files,
                deletes: &deletes.files,
                removed_deletes: &carried.removed_deletes,
                base_bytes: cached.live.files.bytes(),
            },
            self.base().current_snapshot().map(|s| s.as_ref()),
            self.input.checkpoint,
        );
        let epoch = self.target.warehouse.lease_epoch();
        if epoch > 0 {
            summary.additional_properties.insert(
                crate::checkpoint::LEASE_EPOCH_KEY.to_owned(),
                epoch.to_string(),
            );
        }
        summary::record_merge(&mut summary, merged.created, merged.replaced);
        manifests.append(&mut carried.manifests);
        let listed = self.write_list(manifests).await?;
        let snapshot = self.snapshot(&listed, summary);
        let next = publish::with_snapshot(self.table(), &self.base, snapshot)?;
        self.steps.lap("list");
        Ok(Staged {
            next,
            after: After {
                found,
                data,
                deletes,
                carried,
                added,
                manifests: listed.manifests,
            },
        })
    }

    /// Whether the table keeps a primary-key index: v3 with a key (a keyless table is an append
    /// table: nothing is ever located in it).
    fn indexed(&self) -> bool {
        self.v3 && !self.input.schema.primary_key.is_empty()
    }

    /// Makes the primary-key index ready now, when the table keeps one, for a reader of the
    /// base's rows beside [`stage`](Self::stage) (the changelog); the stage finds it ready.
    pub(super) async fn ready_index_now(&self, cached: &mut Cached<'_>) -> Result<(), SinkError> {
        if self.indexed() {
            self.ready_index(cached).await?;
        }
        Ok(())
    }

    /// Makes the primary-key index ready for a commit on the base snapshot (rows/index/slot.rs).
    async fn ready_index(&self, cached: &mut Cached<'_>) -> Result<(), SinkError> {
        let (files, dvs) = (&cached.live.files, &cached.live.dvs);
        cached
            .index
            .ready(
                self.target.warehouse,
                &self.target.index_location,
                self.input.schema,
                self.base(),
                files,
                dvs,
            )
            .await?;
        if self.target.soft_deletes {
            // Its inserts are looked up, as upserts: mostly keys with no row.
            cached.index.keep_oldest_filters().await?;
        }
        Ok(())
    }

    /// The new snapshot on top of the base's current one. v3 row lineage: it assigns row ids
    /// [first_row_id, first_row_id + added_rows) (Iceberg spec, "Row Lineage"); the metadata
    /// builder advances `next-row-id`.
    fn snapshot(&self, listed: &Listed, summary: iceberg::spec::Summary) -> Snapshot {
        let meta = self.base();
        let base = Snapshot::builder()
            .with_snapshot_id(self.names.snapshot_id)
            .with_parent_snapshot_id(meta.current_snapshot().map(|s| s.snapshot_id()))
            .with_sequence_number(self.names.sequence)
            .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
            .with_manifest_list(listed.path.clone())
            .with_summary(summary)
            .with_schema_id(meta.current_schema_id());
        if self.v3 {
            base.with_row_range(listed.first_row_id, listed.added_rows)
                .build()
        } else {
            base.build()
        }
    }

    /// The commit point: the catalog makes `next` current in place of the base (`catalog/`).
    /// `Ok` means the snapshot is durable; `CommitConflict` that another writer committed first;
    /// any other error leaves the outcome unknown. Either way the caller reloads before the next
    /// attempt.
    pub(super) async fn publish(
        &self,
        catalog: &Catalog,
        table: &TableRef<'_>,
        next: TableMetadata,
    ) -> Result<Arc<Loaded>, SinkError> {
        catalog
            .commit(self.target.warehouse, table, &self.loaded, next)
            .await
            .map(Arc::new)
    }

    /// After a successful publish: advances the cached live state to the new snapshot and hands
    /// the index this commit's rows and removed keys.
    pub(super) fn finish(mut self, after: After, cached: Cached<'_>) -> CommitStats {
        self.steps.lap("publish");
        let After {
            found,
            data,
            deletes,
            carried,
            added,
            manifests,
        } = after;
        let snapshot_id = self.names.snapshot_id;
        let files_written = data.files.len() + deletes.files.len();
        // Per commit as well as per maintenance cycle: merging changes it at commit.
        metrics::gauge!(crate::metrics::TABLE_MANIFESTS, crate::metrics::LABEL_TABLE => self.table().to_string())
            .set(manifests.len() as f64);
        cached.live.advance(Published {
            snapshot_id,
            sequence: self.names.sequence,
            truncate: self.plan.truncate,
            manifests,
            data: data.files,
            data_spec: self.base.metadata.default_partition_spec_id(),
            data_manifest: added.data,
            deletes: deletes.files.into_iter().zip(deletes.spec_ids).collect(),
            delete_manifests: added.deletes,
            delete_entries: added.delete_entries,
            rewritten: carried.rewritten,
            replaced: &deletes.replaced,
            vectors: deletes.vectors,
        });
        // The snapshot is durable: a failure from here on must not fail the commit (the caller
        // would retry changes the table already holds). The index is dropped instead, and the
        // next commit reopens it and replays this snapshot (pk_index.rs, recovery). The update
        // runs in the background until the next commit readies the index (rows/index/slot.rs).
        let data_rows = self.plan.data_rows() as u64;
        let indexed = self.indexed();
        if indexed {
            cached.index.record_in_background(
                Arc::clone(self.input.schema),
                self.input.changes.to_vec(),
                self.plan,
                data.paths,
                found.removed_keys,
                snapshot_id,
            );
        }
        self.steps.lap("finish");
        self.steps.log(&self.input.schema.id);
        CommitStats {
            snapshot_id,
            data_rows,
            deleted_rows: deletes.deleted_rows,
            files_written,
            resync_swapped: false,
        }
    }
}
