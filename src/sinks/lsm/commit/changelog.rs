//! The commit's changelog files, for a table with `changelog = true` (Paimon
//! `changelog-producer = input`): every change of the commit as `+I`, `-U`/`+U`, `-D` rows with
//! whole images (`changelog_rows.rs` decides them), written per (partition, bucket) as level-0
//! `changelog-*.parquet` files that the snapshot lists in its `changelogManifestList`
//! (`publish.rs`). Like the data files, none is visible before the snapshot is published: a crash
//! leaves orphans, and the redelivered changes write the same rows again, so the changelog has no
//! gap and no duplicate.
//!
//! Each file holds its rows sorted by key, a key's rows in source order: a stream reader reads a
//! bucket's changes of one key in order (Paimon orders nothing across keys), and the file's key
//! range and statistics are those of its rows, as for a data file.

use std::collections::BTreeSet;

use arrow_array::{Array, RecordBatch, UInt32Array};

use super::super::binary_row;
use super::super::changelog_rows::{self, EncodedKeys, Walk};
use super::super::files;
use super::super::lookup;
use super::super::manifest::DataFileMeta;
use super::super::partition::Slot;
use super::super::plan::Src;
use super::{Commit, Planned};
use crate::sinks::SinkError;

impl Commit<'_> {
    /// Writes the commit's changelog files (none when the changes write no rows); they become
    /// visible with the snapshot that lists them.
    pub(super) async fn changelog(
        &self,
        planned: &Planned,
    ) -> Result<Vec<(Slot, DataFileMeta)>, SinkError> {
        let state = self.state()?;
        let table = self.table();
        let (schemas, plan) = (&planned.schemas, &planned.plan);
        let arrow = |what: &'static str| {
            move |source| SinkError::Arrow {
                context: format!("{what} of {table}"),
                source,
            }
        };
        let (rows, current) = if changelog_rows::insert_only(self.input.changes) {
            let rows = changelog_rows::inserts(self.input.changes, plan.changes, schemas.columns);
            (rows, None)
        } else {
            self.walk(planned).await?
        };
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let batch = rows
            .build(
                schemas,
                state.next_sequence,
                &plan.cast,
                &plan.old_cast,
                current.as_ref(),
            )
            .map_err(arrow("building the changelog"))?;
        let parts = self.by_slot(planned, &batch)?;
        let (warehouse, location) = (&self.tables.warehouse, &state.location);
        futures::future::try_join_all(parts.into_iter().map(|(slot, part)| async move {
            let name = files::new_changelog_file_name();
            let file = files::NewFile::Changelog { name: &name };
            let file =
                files::write_file(warehouse, table, location, schemas, &slot, part, file).await?;
            Ok::<_, SinkError>((slot, file))
        }))
        .await
    }

    /// The changelog rows of a commit with updates or deletes, and the current rows their
    /// images start from (`changelog_rows.rs`).
    async fn walk(
        &self,
        planned: &Planned,
    ) -> Result<(changelog_rows::Changelog, Option<RecordBatch>), SinkError> {
        let state = self.state()?;
        let table = self.table();
        let (schemas, plan) = (&planned.schemas, &planned.plan);
        let arrow = |what: &'static str| {
            move |source| SinkError::Arrow {
                context: format!("{what} of {table}"),
                source,
            }
        };
        let keys = EncodedKeys::new(schemas, &plan.cast, &plan.old_cast)
            .map_err(arrow("encoding the changelog's keys"))?;
        let reads = changelog_rows::reads(self.input.changes, &keys, planned.keep_old_keys);
        let (current, found) = if reads.is_empty() {
            (None, Vec::new())
        } else {
            let key_columns = read_keys(planned, &reads).map_err(arrow("gathering keys"))?;
            let mut buf = Vec::new();
            let mut buckets = BTreeSet::new();
            let refs: Vec<&dyn Array> = key_columns.iter().map(|a| a.as_ref()).collect();
            for row in 0..reads.len() {
                binary_row::encode(&mut buf, &refs, row).map_err(|e| SinkError::Data {
                    table: table.clone(),
                    detail: format!("the bucket of a changelog key: {e}"),
                })?;
                buckets.insert(binary_row::bucket(&buf, planned.buckets) as i32);
            }
            lookup::current_rows(
                &self.tables.warehouse,
                table,
                state,
                schemas,
                &key_columns,
                &buckets,
            )
            .await?
        };
        let rows = changelog_rows::rows(&Walk {
            changes: self.input.changes,
            keys: &keys,
            schemas,
            reads: &reads,
            found: &found,
            counted: plan.changes,
            keep_old_keys: planned.keep_old_keys,
        });
        Ok((rows, current))
    }

    /// `batch` (changelog rows in source order) cut by (partition, bucket) of each row's own
    /// values, each part sorted by key with a key's rows kept in source order. An update that
    /// moves its row to another partition becomes `-D` in the one it leaves and `+I` in the one
    /// it enters: each partition's stream stays whole, and a reader reads partitions in no
    /// order relative to each other.
    fn by_slot(
        &self,
        planned: &Planned,
        batch: &RecordBatch,
    ) -> Result<Vec<(Slot, RecordBatch)>, SinkError> {
        let table = self.table();
        let state = self.state()?;
        let schemas = &planned.schemas;
        let nk = schemas.key.len();
        let data = |detail: String| SinkError::Data {
            table: table.clone(),
            detail,
        };
        let arrow = |source| SinkError::Arrow {
            context: format!("cutting the changelog of {table}"),
            source,
        };
        let key_arrays: Vec<&dyn Array> = batch
            .columns()
            .get(..nk)
            .unwrap_or_default()
            .iter()
            .map(|a| a.as_ref())
            .collect();
        let partitions = &state.partitions;
        let values: Vec<&dyn Array> = partitions
            .names
            .iter()
            .map(|name| {
                let column = batch.schema().index_of(name).map_err(arrow)?;
                Ok(batch.column(column).as_ref())
            })
            .collect::<Result<_, SinkError>>()?;
        let converter = schemas.key_converter().map_err(arrow)?;
        let encoded = converter
            .convert_columns(batch.columns().get(..nk).unwrap_or_default())
            .map_err(arrow)?;
        let mut buf = Vec::new();
        let mut rows: Vec<(Slot, u32)> = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            binary_row::encode(&mut buf, &key_arrays, row)
                .map_err(|e| data(format!("the bucket of a changelog row: {e}")))?;
            let bucket = binary_row::bucket(&buf, planned.buckets) as i32;
            let slot = if partitions.is_empty() {
                Slot::unpartitioned(bucket)
            } else {
                let partition = partitions
                    .partition_of(&values, row)
                    .map_err(|e| data(format!("the partition of a changelog row: {e}")))?;
                Slot { partition, bucket }
            };
            rows.push((slot, row as u32));
        }
        let batch = &moved_as_delete_insert(batch, &rows, nk).map_err(arrow)?;
        // Stable: a key's rows keep source order.
        rows.sort_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| encoded.row(a.1 as usize).cmp(&encoded.row(b.1 as usize)))
        });
        let mut out = Vec::new();
        for group in rows.chunk_by(|a, b| a.0 == b.0) {
            let Some((slot, _)) = group.first() else {
                continue;
            };
            let take = UInt32Array::from_iter_values(group.iter().map(|g| g.1));
            let part = arrow_select::take::take_record_batch(batch, &take).map_err(arrow)?;
            out.push((slot.clone(), part));
        }
        Ok(out)
    }
}

/// `batch` with each `-U`/`+U` pair whose rows lie in different slots (`slots[i]`, in row order)
/// made `-D`/`+I` (the kind column follows the `nk` key columns and the sequence number).
fn moved_as_delete_insert(
    batch: &RecordBatch,
    slots: &[(Slot, u32)],
    nk: usize,
) -> Result<RecordBatch, arrow_schema::ArrowError> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int8Type;
    let column = nk + 1;
    let Some(kinds) = batch.column(column).as_primitive_opt::<Int8Type>() else {
        return Ok(batch.clone());
    };
    let mut out: Vec<i8> = kinds.values().to_vec();
    let mut changed = false;
    for i in 1..out.len() {
        let pair = out[i - 1] == changelog_rows::KIND_UPDATE_BEFORE
            && out[i] == changelog_rows::KIND_UPDATE_AFTER;
        if pair && slots.get(i - 1).map(|s| &s.0) != slots.get(i).map(|s| &s.0) {
            out[i - 1] = super::super::schema::KIND_DELETE;
            out[i] = super::super::schema::KIND_INSERT;
            changed = true;
        }
    }
    if !changed {
        return Ok(batch.clone());
    }
    let mut columns = batch.columns().to_vec();
    if let Some(c) = columns.get_mut(column) {
        *c = std::sync::Arc::new(arrow_array::Int8Array::from(out));
    }
    RecordBatch::try_new(batch.schema(), columns)
}

/// The key columns (stored types) of `reads`.
fn read_keys(
    planned: &Planned,
    reads: &[Src],
) -> Result<Vec<arrow_array::ArrayRef>, arrow_schema::ArrowError> {
    let plan = &planned.plan;
    let schemas = &planned.schemas;
    let nb = plan.cast.len();
    let mut out = Vec::with_capacity(schemas.key.len());
    for (kp, &k) in schemas.key.iter().enumerate() {
        let mut arrays: Vec<&dyn Array> = Vec::with_capacity(2 * nb);
        for b in &plan.cast {
            if let Some(a) = b.get(k) {
                arrays.push(a.as_ref());
            }
        }
        for b in &plan.old_cast {
            if let Some(a) = b.get(kp) {
                arrays.push(a.as_ref());
            }
        }
        let idx: Vec<(usize, usize)> = reads
            .iter()
            .map(|src| match src {
                Src::Old(b, row) => (nb + *b as usize, *row as usize),
                Src::Row(b, row) => (*b as usize, *row as usize),
                _ => (0, 0),
            })
            .collect();
        out.push(arrow_select::interleave::interleave(&arrays, &idx)?);
    }
    Ok(out)
}
