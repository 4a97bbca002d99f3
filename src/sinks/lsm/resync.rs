//! Resync on the LSM sink (`cdcd resync --table T`): the table is copied again into a new
//! lineage, a Paimon table of its own at `<table>/resync-<id>/`, and the complete lineage
//! replaces the live table in one `OVERWRITE` snapshot.
//!
//! Where it sits: as on the Iceberg sink (`sinks/iceberg/resync/`), the pipeline marks the table
//! ([`Tables::begin_resync`]) before it reads its checkpoint; from then on this sink loads,
//! commits to, compacts and expires the lineage instead of the live table (`Tables::table_location`
//! answers with the lineage's). Who fills it is the pipeline's business (`pipeline/resync.rs`).
//! Readers (pypaimon, Flink, Spark) read the live table until the swap.
//!
//! The swap ([`Tables::swap`]), after the lineage's commit that the shared rule
//! ([`Lineage::swaps_at`]) names, under the table's lock:
//! 1. the lineage's schemas are written as the live table's next ones (`schema-(L+1+i)` for the
//!    lineage's `schema-i`), as an evolution of the live table's newest schema would be: a
//!    column of the same name and a type it widens to keeps its field id, any other gets a new
//!    one. A Paimon reader maps a file's columns by the field ids of the schema its
//!    `_SCHEMA_ID` names, so the live table's older files still read right under these schemas:
//!    written before the snapshot that uses them (as Paimon commits a schema change), they are
//!    the live table's newest schemas at once, and a crash, or a commit of another writer in
//!    between, must find them a schema like any other;
//! 2. the lineage's live data files are copied into the live table's `bucket-N/` (a server-side
//!    copy on S3, a hard link on local disk): a Paimon manifest names a data file by its name
//!    under the table's own bucket directory, so the files must be there;
//! 3. one `OVERWRITE` snapshot of the live table deletes every file it held and adds the copies
//!    (schema ids moved as in 1), carrying the lineage's checkpoint and the marks
//!    `cdcd.resync-id` and `cdcd.lineage-first-schema` (the first schema of 1), which every later
//!    snapshot keeps (`publish::publish`): what Paimon's own `INSERT OVERWRITE` of a whole table
//!    commits, so readers see the old table or the new one, and expiry later deletes the old
//!    files as it deletes any file a snapshot removed.
//!
//! Why this is exactly once: the lineage is an ordinary table with its own checkpoint, so a crash
//! before the snapshot's create-if-absent put resumes the lineage (its copies in the live table
//! are orphans for `cdcd cleanup`), and the next commit of the lineage (or the next start's
//! [`Tables::begin_resync`]) swaps again. A crash after it finds `cdcd.resync-id = <id>` on the
//! live table's newest snapshot: the resync is done. The lineage's directory is deleted after
//! the swap (best effort; a leftover is a table of its own to `cdcd cleanup`, never read).
//!
//! Later schema changes compare names only with the schemas from the swap on
//! (`TableState::lineage_start`): a column the old table had dropped may come back in the copy.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;

use futures::{StreamExt, TryStreamExt};

use super::manifest::DataFileMeta;
use super::partition::Slot;
use super::publish;
use super::schema::{same_column, PaimonSchema};
use super::snapshot;
use super::store;
use super::table::{self, Change, TableState, LINEAGE_SCHEMA_PROPERTY};
use super::tables::Tables;
use crate::changelog::{Position, TableId};
use crate::checkpoint::Checkpoint;
use crate::sinks::resync::{lineage_location, Lineage, RESYNC_ID_PROPERTY};
use crate::sinks::{ResyncMode, ResyncState, SinkError};

/// Data files copied at once during a swap.
const COPY_CONCURRENCY: usize = 16;

impl Tables {
    /// [`crate::sinks::Sink::resync`]: `Done` when the live table already is lineage `id`, else
    /// the table is marked so its checkpoint and commits go to the lineage (and the lineage swaps
    /// now when it already may: its copy completed before a crash).
    pub(super) async fn begin_resync(
        &self,
        table: &TableId,
        id: &str,
        mode: ResyncMode,
    ) -> Result<ResyncState, SinkError> {
        let handle = self.handle(table);
        let mut guard = handle.state.lock().await;
        let live_location = self.live_location(table);
        let live = table::load(&self.warehouse, &live_location).await?;
        if let Some(live) = &live {
            if Self::is_lineage(live, id) {
                if self.lineage(table).is_some_and(|l| l.id == id) {
                    self.forget(table);
                    *guard = None;
                }
                self.remove_lineage(table, &lineage_location(&live_location, id))
                    .await;
                return Ok(ResyncState::Done);
            }
        }
        let live_checkpoint = match &live {
            Some(state) => self.checkpoint_in(state).await?,
            None => None,
        };
        let lineage = Lineage::new(
            id,
            mode,
            live_checkpoint.as_ref().map(|cp| cp.position.clone()),
        );
        if let Ok(mut resyncs) = self.resyncs.lock() {
            resyncs.insert(table.clone(), lineage.clone());
        }
        // The cached state was the live table's (or an older mark's); expiry counts afresh.
        *guard = None;
        handle.expiry_tried.store(0, Ordering::Release);
        self.ensure_loaded(table, &mut guard).await?;
        let complete = match guard.as_ref() {
            Some(state) => self
                .checkpoint_in(state)
                .await?
                .is_some_and(|cp| lineage.swaps_at(&cp.position)),
            None => false,
        };
        if complete {
            self.swap(table, &lineage, &mut guard).await?;
            return Ok(ResyncState::Done);
        }
        tracing::info!(table = %table, lineage = %lineage_location(&live_location, id), "resync: the table's commits go to a new lineage until its copy is complete");
        Ok(ResyncState::UnderWay {
            live: live_checkpoint,
        })
    }

    /// After a commit of `table` at `position`: swaps its lineage in when the commit was the
    /// one that replaces the live table. `Ok(true)`: swapped. Never `CommitConflict`: the
    /// lineage's commit is durable, so the pipeline must not plan it again; a failed swap stops
    /// the pipeline and the next start swaps.
    pub(super) async fn swap_if_due(
        &self,
        table: &TableId,
        position: &Position,
    ) -> Result<bool, SinkError> {
        let Some(lineage) = self.lineage(table).filter(|l| l.swaps_at(position)) else {
            return Ok(false);
        };
        crate::failpoints::crash_point(crate::failpoints::RESYNC_BEFORE_SWAP);
        let handle = self.handle(table);
        let mut guard = handle.state.lock().await;
        match self.swap(table, &lineage, &mut guard).await {
            Ok(()) => Ok(true),
            Err(SinkError::CommitConflict { version, .. }) => Err(SinkError::Data {
                table: table.clone(),
                detail: format!("resync: another writer took snapshot {version} of the live table during the swap; the lineage is complete and durable, the next start replaces the table with it"),
            }),
            Err(e) => Err(e),
        }
    }

    /// Replaces the live table with `lineage`, whose state is in `slot` (the table's lock is
    /// held). Afterwards `slot` holds the live table and the sink no longer knows the lineage.
    async fn swap(
        &self,
        table: &TableId,
        lineage: &Lineage,
        slot: &mut Option<TableState>,
    ) -> Result<(), SinkError> {
        self.ensure_loaded(table, slot).await?;
        let Some(from) = slot.as_ref() else {
            return Err(SinkError::Data {
                table: table.clone(),
                detail: "resync: the lineage to swap in has no schema".into(),
            });
        };
        let live_location = self.live_location(table);
        let swapped = Swap {
            tables: self,
            table,
            id: &lineage.id,
            lineage: from,
            live_location: &live_location,
        }
        .run()
        .await;
        let live = match swapped {
            Ok(live) => live,
            Err(e) => {
                // What is durable is reloaded by the next commit.
                *slot = None;
                return Err(e);
            }
        };
        let lineage_dir = from.location.clone();
        tracing::info!(table = %table, snapshot = live.snapshot_id(), files = live.files.values().map(Vec::len).sum::<usize>(), "resync: the new lineage replaced the live table");
        *slot = Some(live);
        self.forget(table);
        self.handle(table).expiry_tried.store(0, Ordering::Release);
        self.remove_lineage(table, &lineage_dir).await;
        Ok(())
    }

    /// [`crate::sinks::Sink::abandon_resync`]: lineage `id` will be copied again under a new id;
    /// its directory is deleted (nothing else references its files before a swap).
    pub(super) async fn abandon_lineage(&self, table: &TableId, id: &str) {
        if self.lineage(table).is_some_and(|l| l.id == id) {
            self.forget(table);
            *self.handle(table).state.lock().await = None;
        }
        let location = lineage_location(&self.live_location(table), id);
        self.remove_lineage(table, &location).await;
    }

    fn forget(&self, table: &TableId) {
        if let Ok(mut resyncs) = self.resyncs.lock() {
            resyncs.remove(table);
        }
    }

    /// Whether the table in `live` is resync `id`'s lineage: its newest snapshot carries the
    /// mark the swap of `id` set (kept by every later one).
    fn is_lineage(live: &TableState, id: &str) -> bool {
        live.snapshot
            .as_ref()
            .and_then(|s| s.properties.as_ref()?.get(RESYNC_ID_PROPERTY))
            .is_some_and(|done| done == id)
    }

    /// The newest checkpoint of this pipeline in the table `state` holds, walking back past
    /// snapshots of other writers.
    pub(super) async fn checkpoint_in(
        &self,
        state: &TableState,
    ) -> Result<Option<Checkpoint>, SinkError> {
        let mut next = state.snapshot.clone();
        let location = &state.location;
        let earliest = match &next {
            Some(s) => snapshot::earliest_id(&self.warehouse, location, s.id)
                .await?
                .unwrap_or(1),
            None => 1,
        };
        while let Some(s) = next {
            if let Some(props) = &s.properties {
                let props: HashMap<String, String> = props.clone().into_iter().collect();
                if let Some(cp) = Checkpoint::from_properties(&self.pipeline, &props)? {
                    return Ok(Some(cp));
                }
            }
            if s.id <= earliest {
                break;
            }
            next = snapshot::read_snapshot(&self.warehouse, location, s.id - 1).await?;
        }
        Ok(None)
    }

    /// Deletes the lineage directory at `location`. Best effort: a leftover is a table of its
    /// own to `cdcd cleanup`, and never read again.
    async fn remove_lineage(&self, table: &TableId, location: &str) {
        let Ok(prefix) = self.warehouse.path(location) else {
            return;
        };
        let store = self.warehouse.store();
        let listed = store.list(Some(&prefix)).map_ok(|o| o.location).boxed();
        let failed = store
            .delete_stream(listed)
            .filter(|r| {
                std::future::ready(
                    r.as_ref()
                        .is_err_and(|e| !matches!(e, object_store::Error::NotFound { .. })),
                )
            })
            .count()
            .await;
        if failed > 0 {
            tracing::warn!(table = %table, lineage = location, failed, "resync: some files of the lineage were not deleted; `cdcd cleanup` sees it as a table of its own");
        }
    }
}

/// One swap of a complete lineage into the live table (steps in the module doc).
struct Swap<'a> {
    tables: &'a Tables,
    table: &'a TableId,
    id: &'a str,
    lineage: &'a TableState,
    live_location: &'a str,
}

impl Swap<'_> {
    async fn run(&self) -> Result<TableState, SinkError> {
        let w = &self.tables.warehouse;
        let live = table::load(w, self.live_location).await?;
        let schema_ids = self.write_schemas(live.as_ref()).await?;
        self.copy_files().await?;
        crate::failpoints::crash_point(crate::failpoints::LSM_SWAP_BEFORE_SNAPSHOT);
        let Some(mut live) = table::load(w, self.live_location).await? else {
            return Err(self.failed("the live table's schemas vanished"));
        };
        let moved_current = schema_ids.get(&self.lineage.schema.id).copied();
        if moved_current != Some(live.schema.id) {
            return Err(self.failed(format!(
                "another writer changed the live table's schema during the swap (schema {} is newest, the swap wrote {moved_current:?})",
                live.schema.id
            )));
        }
        let deleted: Vec<(Slot, DataFileMeta)> = live
            .files
            .iter()
            .flat_map(|(b, files)| files.iter().map(move |f| (b.clone(), f.clone())))
            .collect();
        let mut added = Vec::new();
        for (b, files) in &self.lineage.files {
            for f in files {
                let Some(&schema_id) = schema_ids.get(&f.schema_id) else {
                    return Err(self.failed(format!(
                        "data file {} names schema {}, which the lineage does not have",
                        f.file_name, f.schema_id
                    )));
                };
                added.push((
                    b.clone(),
                    DataFileMeta {
                        schema_id,
                        ..f.clone()
                    },
                ));
            }
        }
        let mut properties: BTreeMap<String, String> = self
            .lineage
            .snapshot
            .as_ref()
            .and_then(|s| s.properties.clone())
            .unwrap_or_default();
        properties.insert(RESYNC_ID_PROPERTY.to_owned(), self.id.to_owned());
        let first_schema = schema_ids.values().min().copied().unwrap_or(live.schema.id);
        properties.insert(LINEAGE_SCHEMA_PROPERTY.to_owned(), first_schema.to_string());
        let buckets = if self.lineage.schema.primary_keys.is_empty() {
            super::append::UNAWARE_BUCKETS
        } else {
            self.lineage
                .buckets(self.tables.config.buckets_for(self.table)) as i32
        };
        publish::publish(
            w,
            self.table,
            &mut live,
            Change {
                added,
                deleted,
                ..Change::default()
            },
            "OVERWRITE",
            properties,
            buckets,
        )
        .await?;
        Ok(live)
    }

    fn failed(&self, detail: impl std::fmt::Display) -> SinkError {
        SinkError::Data {
            table: self.table.clone(),
            detail: format!("resync: swapping the lineage in: {detail}"),
        }
    }

    /// Writes the lineage's schemas as the live table's next ones; returns the lineage's schema
    /// ids to the live table's.
    async fn write_schemas(
        &self,
        live: Option<&TableState>,
    ) -> Result<HashMap<i64, i64>, SinkError> {
        let w = &self.tables.warehouse;
        let mut schemas = Vec::new();
        for id in 0..=self.lineage.schema.id {
            if let Some(schema) = table::read_schema(w, &self.lineage.location, id).await? {
                schemas.push(schema);
            }
        }
        let fields = FieldIds::new(live.map(|l| &l.schema), &self.lineage.schema, &schemas);
        let first = live.map_or(0, |l| l.schema.id + 1);
        let mut ids = HashMap::new();
        for schema in &schemas {
            let moved = fields.moved(schema, first + schema.id);
            table::create_schema(w, self.live_location, &moved).await?;
            // Create-if-absent keeps a file already there: it must be this one.
            let written = table::read_schema(w, self.live_location, moved.id).await?;
            if !written.is_some_and(|s| s.fields == moved.fields) {
                return Err(self.failed(format!(
                    "schema {} of the live table was written by another writer",
                    moved.id
                )));
            }
            ids.insert(schema.id, moved.id);
        }
        Ok(ids)
    }

    /// Copies the lineage's live data files into the live table's (partition and) bucket
    /// directories.
    async fn copy_files(&self) -> Result<(), SinkError> {
        let w = &self.tables.warehouse;
        let mut copies = Vec::new();
        for (b, files) in &self.lineage.files {
            for f in files {
                let name = format!("{}/{}", b.dir(), f.file_name);
                copies.push((
                    format!("{}/{name}", self.lineage.location),
                    format!("{}/{name}", self.live_location),
                ));
            }
        }
        futures::stream::iter(copies)
            .map(|(from, to)| async move { store::copy(w, &from, &to).await })
            .buffer_unordered(COPY_CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }
}

/// The field ids the lineage's columns take in the live table: a column of the live table's
/// newest schema with the same name and a type it widens to (`schema::same_column`) keeps its id,
/// every other field of the lineage gets a new one past every id the live table used.
struct FieldIds {
    ids: HashMap<i32, i32>,
    highest: i32,
}

impl FieldIds {
    fn new(live: Option<&PaimonSchema>, current: &PaimonSchema, all: &[PaimonSchema]) -> FieldIds {
        let mut ids = HashMap::new();
        let Some(live) = live else {
            // No live table to agree with: the lineage's own ids.
            let fields = all.iter().chain([current]).flat_map(|s| s.fields.iter());
            for f in fields {
                ids.insert(f.id, f.id);
            }
            let highest = all
                .iter()
                .chain([current])
                .map(|s| s.highest_field_id)
                .max();
            return FieldIds {
                ids,
                highest: highest.unwrap_or(-1),
            };
        };
        let mut highest = live.highest_field_id;
        // The lineage's current columns first (they are what readers read from the swap on),
        // then the fields only its older schemas had.
        let fields = current
            .fields
            .iter()
            .chain(all.iter().flat_map(|s| s.fields.iter()));
        for field in fields {
            if ids.contains_key(&field.id) {
                continue;
            }
            let kept = live
                .fields
                .iter()
                .find(|f| same_column(f, field))
                .filter(|f| !ids.values().any(|&taken| taken == f.id))
                .map(|f| f.id);
            let id = kept.unwrap_or_else(|| {
                highest += 1;
                highest
            });
            ids.insert(field.id, id);
        }
        FieldIds { ids, highest }
    }

    /// `schema` as the live table's schema `id`.
    fn moved(&self, schema: &PaimonSchema, id: i64) -> PaimonSchema {
        let mut moved = schema.clone();
        moved.id = id;
        for f in &mut moved.fields {
            f.id = self.ids.get(&f.id).copied().unwrap_or(f.id);
        }
        moved.highest_field_id = self.highest;
        moved
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn schema(id: i64, highest: i32, fields: &[(i32, &str, &str)]) -> PaimonSchema {
        serde_json::from_value(serde_json::json!({
            "version": 3, "id": id, "highestFieldId": highest,
            "fields": fields.iter().map(|(i, n, t)| serde_json::json!({"id": i, "name": n, "type": t})).collect::<Vec<_>>(),
            "partitionKeys": [], "primaryKeys": ["id"],
            "options": {"bucket": "2"}, "timeMillis": 1
        }))
        .unwrap()
    }

    fn ids(s: &PaimonSchema) -> Vec<(i32, &str)> {
        s.fields.iter().map(|f| (f.id, f.name.as_str())).collect()
    }

    #[test]
    fn the_lineages_columns_keep_the_live_tables_field_ids_where_they_read_the_same() {
        // The live table: `v` dropped (id 1) and re-added as text (id 4), `w` int (id 2),
        // `x` (id 3) dropped.
        let live = schema(
            3,
            4,
            &[
                (0, "id", "BIGINT NOT NULL"),
                (2, "w", "INT"),
                (4, "v", "STRING"),
            ],
        );
        // The lineage (copied under the source's schema): `v` is an int again, `w` widened to
        // bigint, a new `y`; its older schema had a column `z` it dropped since.
        let older = schema(
            0,
            3,
            &[
                (0, "id", "BIGINT NOT NULL"),
                (1, "v", "INT"),
                (2, "w", "BIGINT"),
                (3, "z", "INT"),
            ],
        );
        let current = schema(
            1,
            4,
            &[
                (0, "id", "BIGINT NOT NULL"),
                (1, "v", "INT"),
                (2, "w", "BIGINT"),
                (4, "y", "INT"),
            ],
        );
        let fields = FieldIds::new(Some(&live), &current, &[older.clone(), current.clone()]);
        let moved = fields.moved(&current, 5);
        assert_eq!(moved.id, 5);
        assert_eq!(ids(&moved), [(0, "id"), (5, "v"), (2, "w"), (6, "y")]);
        assert_eq!(
            ids(&fields.moved(&older, 4)),
            [(0, "id"), (5, "v"), (2, "w"), (7, "z")]
        );
        assert_eq!(moved.highest_field_id, 7);
        assert_eq!(moved.primary_keys, current.primary_keys);
        // No live table: the lineage's ids stay as they are.
        let fields = FieldIds::new(None, &current, &[older, current.clone()]);
        assert_eq!(ids(&fields.moved(&current, 0)), ids(&current));
    }
}
