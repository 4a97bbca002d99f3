//! [`ChangelogWrite`]: one table commit's changes appended to the table's changelog table (see
//! the module doc of `changelog/` for when, and why first).

use std::sync::Arc;

use arrow_array::{
    new_null_array, ArrayRef, Int64Array, RecordBatch, RecordBatchOptions, StringArray,
    TimestampMicrosecondArray,
};
use iceberg::spec::TableMetadata;

use super::changelog_schema;
use super::images::{images, key_ids, prior_keys, Images, KeyIds, Prior};
use crate::changelog::{Op, TableChanges, TableId, TableSchema};
use crate::checkpoint::Checkpoint;
use crate::sinks::iceberg::catalog::rest::RestCatalog;
use crate::sinks::iceberg::catalog::TableRef;
use crate::sinks::iceberg::commit::{Cached, Input, RowDelta, Staged};
use crate::sinks::iceberg::files::metadata::Loaded;
use crate::sinks::iceberg::files::writer;
use crate::sinks::iceberg::maintenance::metadata_log;
use crate::sinks::iceberg::pipeline_checkpoint;
use crate::sinks::iceberg::resync::RESYNC_ID_PROPERTY;
use crate::sinks::iceberg::rows::locator::{IndexLocator, RowLocator};
use crate::sinks::iceberg::rows::lookup;
use crate::sinks::iceberg::schema::Projection;
use crate::sinks::iceberg::tables::{TableSlot, Tables};
use crate::sinks::SinkError;

/// One commit's changelog rows, and the last `_cdc_seq` they give (the changelog's counter
/// after them, `cdcd.changelog_seq`).
pub(in crate::sinks::iceberg) struct ChangelogRows {
    rows: TableChanges,
    last_seq: i64,
    /// The last resync the changelog has marked (`cdcd.changelog_resync`).
    resync: Option<String>,
}

/// A resync of the table the changelog has not marked yet: its `resync` row, before the first
/// change committed after the swap. See the module doc of `changelog/`.
struct Marker {
    /// The resync's id (`cdcd.resync-id` of the table), as `_cdc_tx`.
    id: String,
    /// The table's `cdcd.position` before this commit: the resynced table is complete there.
    position: String,
    /// When the table's snapshot at `position` was committed.
    micros: i64,
}

/// One commit's changelog rows to build ([`ChangelogWrite::prior`]): what they need from the
/// table is read; what is left ([`Pending::rows`]) is the image walk, CPU only, which runs beside
/// the table's stage (`IcebergSink::commit_once`).
pub(in crate::sinks::iceberg) struct Pending<'i> {
    changes: &'i [TableChanges],
    /// The key columns.
    key: &'i [usize],
    ids: KeyIds,
    /// The table's rows of [`prior_keys`], and which keys it has none of.
    prior: Option<(RecordBatch, Vec<bool>)>,
    /// Per run of `changes`: whether its changes go to the changelog.
    emit: Vec<bool>,
    keep_old_keys: bool,
    /// The changelog's counter before these rows.
    last_seq: i64,
    marker: Option<Marker>,
    /// The last resync the changelog has marked, with these rows.
    resync: Option<String>,
}

/// The changelog of one table, for one commit of the table.
pub(in crate::sinks::iceberg) struct ChangelogWrite<'a> {
    tables: &'a Tables,
    /// The changelog's schema for the commit's schema.
    schema: Arc<TableSchema>,
}

impl<'a> ChangelogWrite<'a> {
    /// The changelog of `table`'s commit, `None` when its settings do not ask for one.
    pub(in crate::sinks::iceberg) fn of(
        tables: &'a Tables,
        table: &TableSchema,
    ) -> Result<Option<ChangelogWrite<'a>>, SinkError> {
        if super::known_changelog(tables, &table.id)?.is_none() {
            return Ok(None);
        }
        let schema = Arc::new(changelog_schema(table));
        Ok(Some(ChangelogWrite { tables, schema }))
    }

    pub(in crate::sinks::iceberg) fn id(&self) -> &TableId {
        &self.schema.id
    }

    /// What the changelog rows of `input` need from the table (`None`: the changelog holds every
    /// change of `input` already): which of its streamed changes are in transactions past the
    /// changelog's own checkpoint, and the table's rows before the commit that complete them,
    /// read through `cached` (the table's slot, describing the current snapshot of `delta`'s
    /// base, the commit's parent; its index readied here when rows are read, as the table's
    /// stage does first when it locates keys). [`Pending::rows`] builds the rows from it.
    pub(in crate::sinks::iceberg) async fn prior<'i>(
        &self,
        input: Input<'i>,
        delta: &RowDelta<'_>,
        cached: &mut Cached<'_>,
    ) -> Result<Option<Pending<'i>>, SinkError> {
        let base = delta.base();
        if input.changes.iter().all(|c| c.source_tx.is_none()) {
            // Initial-copy rows only: nothing for the changelog, nothing to read.
            return Ok(None);
        }
        let tables = self.tables;
        let changelog = match tables.cached(self.id()) {
            Some(loaded) => Some(loaded),
            None => tables.load(self.id()).await?,
        };
        let (held, last_seq) = match &changelog {
            Some(loaded) => {
                let held = pipeline_checkpoint(&tables.pipeline, &loaded.metadata)?;
                let last_seq = last_seq(held.as_ref(), &loaded.metadata);
                (held, last_seq)
            }
            None => (None, 0),
        };
        let marked = held.as_ref().and_then(|cp| cp.changelog_resync.clone());
        let resynced = base.properties().get(RESYNC_ID_PROPERTY).cloned();
        // A changelog created after the table's last resync starts after it: nothing to mark.
        let marker = match (&resynced, &changelog) {
            (Some(id), Some(_)) if marked.as_ref() != Some(id) => Some(self.marker(id, base)?),
            _ => None,
        };
        let emit: Vec<bool> = input
            .changes
            .iter()
            .map(|c| match (&c.source_tx, &held) {
                (None, _) => false,
                (Some(tx), Some(held)) => !held.position.covers(&tx.position),
                (Some(_), None) => true,
            })
            .collect();
        if !emit.contains(&true) {
            return Ok(None);
        }
        let (schema, changes) = (input.schema, input.changes);
        let key = &schema.primary_key;
        let arrow = |context: &str| {
            let context = format!("{context} of {}", self.id());
            move |source| SinkError::Arrow { context, source }
        };
        // Soft deletes: a key change keeps its old key's row (sinks/cdc_columns.rs).
        let keep_old_keys =
            tables.settings.resolve(&schema.id)?.deletes == crate::config::Deletes::Soft;
        let ids = key_ids(changes, key).map_err(arrow("the changelog's keys"))?;
        let wanted = prior_keys(changes, &ids, keep_old_keys);
        let prior = if wanted.is_empty() {
            None
        } else {
            delta.ready_index_now(cached).await?;
            Some(
                self.prior_rows(schema, changes, &wanted, base, cached)
                    .await?,
            )
        };
        Ok(Some(Pending {
            changes,
            key,
            ids,
            prior,
            emit,
            keep_old_keys,
            last_seq,
            marker,
            resync: resynced.or(marked),
        }))
    }

    /// The `resync` row owed for resync `id` of the table at `base`.
    fn marker(&self, id: &str, base: &TableMetadata) -> Result<Marker, SinkError> {
        let position = pipeline_checkpoint(&self.tables.pipeline, base)?
            .map(|cp| cp.position.to_string())
            .unwrap_or_default();
        let micros = base
            .current_snapshot()
            .map_or(0, |s| s.timestamp_ms().saturating_mul(1000));
        Ok(Marker {
            id: id.to_owned(),
            position,
            micros,
        })
    }

    /// The table's rows of `keys` before the commit, and which keys it has none of.
    async fn prior_rows(
        &self,
        schema: &TableSchema,
        changes: &[TableChanges],
        keys: &[crate::sinks::iceberg::plan::KeyRef],
        base: &TableMetadata,
        cached: &Cached<'_>,
    ) -> Result<(RecordBatch, Vec<bool>), SinkError> {
        let warehouse = &self.tables.warehouse;
        let projection = Projection::of(base.current_schema());
        // A key without a row is not an error here: its before image is the key alone.
        let droppable = vec![true; keys.len()];
        let (files, dvs) = (&cached.live.files, &cached.live.dvs);
        match cached.index.get() {
            Some(index) => {
                let keys_schema = TableChanges::keys_schema(schema);
                let keys = writer::key_batch(changes, keys, &schema.primary_key, &keys_schema)
                    .map_err(|source| SinkError::Arrow {
                        context: format!("the changelog's keys of {}", schema.id),
                        source,
                    })?;
                let at = IndexLocator::new(index, files, dvs).locate(&keys).await?;
                lookup::fetch(warehouse, schema, &keys, &at, &droppable, &projection).await
            }
            None => {
                lookup::lookup(
                    warehouse,
                    schema,
                    cached.live,
                    changes,
                    keys,
                    &droppable,
                    &projection,
                )
                .await
            }
        }
    }

    /// The changelog's rows as one run of inserts into the changelog table.
    fn batch(
        &self,
        changes: &[TableChanges],
        images: Images,
        last_seq: i64,
        marker: Option<&Marker>,
    ) -> Result<TableChanges, arrow_schema::ArrowError> {
        let first = last_seq + i64::from(marker.is_some());
        let n = images.kinds.len();
        let runs: Vec<Option<(String, i64, String)>> = changes
            .iter()
            .map(|c| {
                c.source_tx
                    .as_ref()
                    .map(|tx| (tx.position.to_string(), tx.commit_micros, tx.id.to_string()))
            })
            .collect();
        let tx_of = |row: usize| images.runs.get(row).and_then(|&r| runs.get(r)?.as_ref());
        let op = StringArray::from_iter_values(images.kinds.iter().map(|k| k.as_str()));
        let position = StringArray::from_iter((0..n).map(|i| tx_of(i).map(|(p, _, _)| p.as_str())));
        let commit_ts = TimestampMicrosecondArray::from_iter((0..n).map(|i| tx_of(i).map(|t| t.1)))
            .with_timezone("UTC");
        let tx = StringArray::from_iter((0..n).map(|i| tx_of(i).map(|(_, _, t)| t.as_str())));
        let seq = Int64Array::from_iter_values((1..=n as i64).map(|i| first + i));
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(op),
            Arc::new(position),
            Arc::new(commit_ts),
            Arc::new(tx),
            Arc::new(seq),
        ];
        columns.extend(images.columns);
        let options = RecordBatchOptions::new().with_row_count(Some(n));
        let schema = TableChanges::rows_schema(&self.schema);
        let mut rows = RecordBatch::try_new_with_options(Arc::clone(&schema), columns, &options)?;
        if let Some(m) = marker {
            let mut columns: Vec<ArrayRef> = vec![
                Arc::new(StringArray::from_iter_values(["resync"])),
                Arc::new(StringArray::from_iter_values([m.position.as_str()])),
                Arc::new(
                    TimestampMicrosecondArray::from_iter_values([m.micros]).with_timezone("UTC"),
                ),
                Arc::new(StringArray::from_iter_values([m.id.as_str()])),
                Arc::new(Int64Array::from_iter_values([last_seq + 1])),
            ];
            columns.extend(
                schema
                    .fields()
                    .iter()
                    .skip(columns.len())
                    .map(|f| new_null_array(f.data_type(), 1)),
            );
            let marker = RecordBatch::try_new(Arc::clone(&schema), columns)?;
            rows = arrow_select::concat::concat_batches(&schema, [&marker, &rows])?;
        }
        let n = rows.num_rows();
        let options = RecordBatchOptions::new().with_row_count(Some(n));
        let old_keys = RecordBatch::try_new_with_options(
            TableChanges::keys_schema(&self.schema),
            Vec::new(),
            &options,
        )?;
        Ok(TableChanges {
            schema: Arc::clone(&self.schema),
            ops: vec![Op::Insert; n],
            rows,
            present: vec![None; self.schema.columns.len()],
            old_keys,
            key_changed: vec![false; n],
            upsert_window: false,
            copy_chunk: None,
            source_tx: None,
        })
    }

    /// Stages `rows` on the changelog table with `checkpoint` (the table's commit's) while
    /// `slot` (the changelog's slot, locked) is held: its files written, nothing visible yet.
    /// `scratch` keeps what the staged commit refers to until it is published.
    pub(in crate::sinks::iceberg) async fn stage<'g>(
        &'g self,
        rows: ChangelogRows,
        checkpoint: &Checkpoint,
        slot: &'g mut TableSlot,
        scratch: &'g mut Scratch,
    ) -> Result<StagedChangelog<'g>, SinkError> {
        let Scratch {
            changes,
            checkpoint: held,
        } = scratch;
        let checkpoint = &*held.insert(rows.checkpoint(checkpoint));
        let changes = &*changes.insert([rows.rows]);
        let input = Input {
            schema: &self.schema,
            changes,
            checkpoint,
        };
        let (delta, staged, cached) = self.tables.stage(slot, input).await?;
        Ok(StagedChangelog {
            tables: self.tables,
            id: self.id(),
            delta,
            staged,
            cached,
        })
    }
}

impl Pending<'_> {
    /// The changelog rows: every change to emit as complete images (`images.rs`), with its
    /// `_cdc_*` columns.
    pub(in crate::sinks::iceberg) fn rows(
        self,
        changelog: &ChangelogWrite<'_>,
    ) -> Result<ChangelogRows, SinkError> {
        let arrow = |context: &str| {
            let context = format!("{context} of {}", changelog.id());
            move |source| SinkError::Arrow { context, source }
        };
        let images = images(
            self.changes,
            self.key,
            &self.ids,
            self.prior
                .as_ref()
                .map(|(rows, missing)| Prior { rows, missing }),
            &self.emit,
            self.keep_old_keys,
        )
        .map_err(arrow("the changelog's images"))?;
        let rows = changelog
            .batch(self.changes, images, self.last_seq, self.marker.as_ref())
            .map_err(arrow("the changelog's rows"))?;
        let last_seq = self.last_seq + rows.rows.num_rows() as i64;
        Ok(ChangelogRows {
            rows,
            last_seq,
            resync: self.resync,
        })
    }
}

/// What a staged changelog commit refers to: its one run of rows and its checkpoint.
#[derive(Default)]
pub(in crate::sinks::iceberg) struct Scratch {
    changes: Option<[TableChanges; 1]>,
    checkpoint: Option<Checkpoint>,
}

/// The changelog's commit, staged ([`ChangelogWrite::stage`]): published on its own or with its
/// table's.
pub(in crate::sinks::iceberg) struct StagedChangelog<'g> {
    tables: &'g Tables,
    id: &'g TableId,
    delta: RowDelta<'g>,
    staged: Staged,
    cached: Cached<'g>,
}

impl StagedChangelog<'_> {
    /// Publishes the changelog's commit through the catalog on its own: durable when this
    /// returns.
    pub(in crate::sinks::iceberg) async fn publish(self) -> Result<(), SinkError> {
        let (tables, id) = (self.tables, self.id);
        let location = tables.current_location(id);
        let published = self
            .delta
            .publish(
                tables.catalog_for(id),
                &tables.table_ref(id, &location),
                self.staged.next,
            )
            .await;
        match published {
            Ok(published) => {
                metadata_log::delete_after_commit(
                    &tables.warehouse,
                    self.delta.base_loaded(),
                    &published,
                    tables.catalog_for(id).names_previous(),
                );
                tables.remember(id, Some(published));
                self.delta.finish(self.staged.after, self.cached);
                Ok(())
            }
            Err(e) => {
                tables.remember(id, None);
                Err(e)
            }
        }
    }

    /// Publishes the changelog's commit and `table`'s (its reference, the metadata its commit
    /// builds on, the metadata it publishes) in one catalog transaction: both or neither.
    /// Returns the table's published metadata.
    pub(in crate::sinks::iceberg) async fn publish_with(
        self,
        rest: &RestCatalog,
        table: (TableRef<'_>, &Loaded, &TableMetadata),
    ) -> Result<Arc<Loaded>, SinkError> {
        let (tables, id, next) = (self.tables, self.id, &self.staged.next);
        let location = tables.current_location(id);
        let items = [
            (
                tables.table_ref(id, &location),
                self.delta.base_loaded().as_ref(),
                next,
            ),
            table,
        ];
        let published = rest.commit_many(&tables.warehouse, &items).await;
        let mut published = match published {
            Ok(published) => published.into_iter(),
            Err(e) => {
                tables.remember(id, None);
                return Err(e);
            }
        };
        let (Some(changelog), Some(table)) = (published.next(), published.next()) else {
            tables.remember(id, None);
            return Err(SinkError::Corrupt {
                path: "transaction".into(),
                detail: "the catalog transaction answered for fewer tables than it was sent".into(),
            });
        };
        let changelog = Arc::new(changelog);
        metadata_log::delete_after_commit(
            &tables.warehouse,
            self.delta.base_loaded(),
            &changelog,
            tables.catalog_for(id).names_previous(),
        );
        tables.remember(id, Some(changelog));
        self.delta.finish(self.staged.after, self.cached);
        Ok(Arc::new(table))
    }
}

impl ChangelogRows {
    /// The changelog's checkpoint for these rows: the table's commit's, with the counter.
    fn checkpoint(&self, table: &Checkpoint) -> Checkpoint {
        Checkpoint {
            changelog_seq: Some(self.last_seq),
            changelog_resync: self.resync.clone(),
            ..table.clone()
        }
    }
}

/// The last `_cdc_seq` the changelog gave: its checkpoint's counter (`cdcd.changelog_seq`, on the
/// newest snapshot with this pipeline's checkpoint, so commits of other engines on top do not
/// hide it). A changelog written before the counter has dropped no rows (retention came with
/// it), so there it is the rows it holds (`total-records` of its current snapshot).
fn last_seq(held: Option<&Checkpoint>, meta: &TableMetadata) -> i64 {
    if let Some(seq) = held.and_then(|cp| cp.changelog_seq) {
        return seq;
    }
    meta.current_snapshot()
        .and_then(|s| s.summary().additional_properties.get("total-records"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
