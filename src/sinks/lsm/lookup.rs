//! Current rows for completing partial updates: the newest version of each looked-up key in
//! the table's live files.
//!
//! Only updates with absent columns (Postgres sends an unchanged TOASTed value as "unchanged")
//! whose key was not written earlier in the same commit need this, so it is rare. It reads the
//! data files of the buckets those keys hash to and keeps, per key, the row with the highest
//! sequence number, exactly as the deduplicate merge would. The files of one bucket are held in
//! memory while it runs; compaction keeps that to a few sorted runs.

use std::collections::{BTreeSet, HashMap};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, Int8Type};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_row::{RowConverter, Rows};
use arrow_schema::ArrowError;

use super::files::read_file_at;
use super::plan::{Plan, Src};
use super::schema::{FileSchemas, KIND_DELETE};
use super::table::TableState;
use crate::changelog::{TableChanges, TableId};
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// The looked-up rows (data file shape) and, per `plan.lookups` entry, its row in that batch.
///
/// A key without a current row is an error, except for a partial update with its key unchanged
/// replayed inside an upsert window (`TableChanges::upsert_window`): its entry is `None`, and
/// the caller writes the key's row as a delete (the row is deleted later inside the window; the
/// argument is in `sources/mysql/copy.rs` and `sinks/iceberg/rows/window.rs`).
pub async fn lookup(
    w: &Warehouse,
    table: &TableId,
    state: &TableState,
    schemas: &FileSchemas,
    plan: &Plan,
    changes: &[TableChanges],
) -> Result<(Option<RecordBatch>, Vec<Option<u32>>), SinkError> {
    if plan.lookups.is_empty() {
        return Ok((None, Vec::new()));
    }
    let keys = plan
        .key_batch(schemas)
        .map_err(arrow(table, "gathering keys to look up"))?;
    let converter = schemas
        .key_converter()
        .map_err(arrow(table, "key encoding"))?;
    let wanted = converter
        .convert_columns(&keys)
        .map_err(arrow(table, "key encoding"))?;
    let buckets: BTreeSet<i32> = plan.lookups.iter().map(|l| l.bucket as i32).collect();
    let newest = Newest::find(w, table, state, schemas, &buckets, &converter, &wanted).await?;
    let mut idx = Vec::new();
    let mut found = Vec::with_capacity(newest.best.len());
    for (i, b) in newest.best.iter().enumerate() {
        match b {
            Some((batch, row, _, false)) => {
                found.push(Some(idx.len() as u32));
                idx.push((*batch, *row));
            }
            _ if droppable(plan, changes, i) => found.push(None),
            _ => return Err(no_current_row(table, &keys, i)),
        }
    }
    if idx.is_empty() {
        // Every looked-up key was missing (and droppable): no rows to gather.
        return Ok((None, found));
    }
    let batch =
        gather(schemas, &newest.batches, &idx).map_err(arrow(table, "gathering current rows"))?;
    Ok((Some(batch), found))
}

/// The current rows of `keys` (key columns, stored types) in the table's live files, whose
/// buckets are `buckets`: the rows (data file shape) and, per key, its row in that batch (`None`:
/// the table holds no row with that key). The changelog's before images (`commit/changelog.rs`).
pub async fn current_rows(
    w: &Warehouse,
    table: &TableId,
    state: &TableState,
    schemas: &FileSchemas,
    keys: &[ArrayRef],
    buckets: &BTreeSet<i32>,
) -> Result<(Option<RecordBatch>, Vec<Option<u32>>), SinkError> {
    let converter = schemas
        .key_converter()
        .map_err(arrow(table, "key encoding"))?;
    let wanted = converter
        .convert_columns(keys)
        .map_err(arrow(table, "key encoding"))?;
    let newest = Newest::find(w, table, state, schemas, buckets, &converter, &wanted).await?;
    let mut idx = Vec::new();
    let mut found = Vec::with_capacity(newest.best.len());
    for b in &newest.best {
        match b {
            Some((batch, row, _, false)) => {
                found.push(Some(idx.len() as u32));
                idx.push((*batch, *row));
            }
            _ => found.push(None),
        }
    }
    if idx.is_empty() {
        return Ok((None, found));
    }
    let batch =
        gather(schemas, &newest.batches, &idx).map_err(arrow(table, "gathering current rows"))?;
    Ok((Some(batch), found))
}

fn arrow(table: &TableId, what: &str) -> impl FnOnce(ArrowError) -> SinkError {
    let context = format!("{what} of {table}");
    move |source| SinkError::Arrow { context, source }
}

/// The newest row of each wanted key in the table's live files.
struct Newest {
    /// Per wanted key: (batch, row, sequence, is delete).
    best: Vec<Option<(usize, usize, i64, bool)>>,
    /// The data files that hold a newest row.
    batches: Vec<RecordBatch>,
}

impl Newest {
    /// Reads the live files of `buckets` (those the wanted keys hash to), keeping per key the
    /// row with the highest sequence number (`wanted`: the keys, encoded by `converter`).
    async fn find(
        w: &Warehouse,
        table: &TableId,
        state: &TableState,
        schemas: &FileSchemas,
        buckets: &BTreeSet<i32>,
        converter: &RowConverter,
        wanted: &Rows,
    ) -> Result<Newest, SinkError> {
        let index: HashMap<&[u8], usize> = (0..wanted.num_rows())
            .map(|i| (wanted.row(i).data(), i))
            .collect();
        let nk = schemas.key.len();
        let mut newest = Newest {
            best: vec![None; wanted.num_rows()],
            batches: Vec::new(),
        };
        // A partitioned table's key may be in any partition: the files of every partition's
        // bucket are read, and the newest row wins (cdcd deletes a row from the partition it
        // leaves, under the same sequence number as its insert in the new one, and writes
        // sequence numbers across the table's partitions from one counter).
        let slots = state
            .files
            .iter()
            .filter(|(slot, _)| buckets.contains(&slot.bucket));
        for (slot, files) in slots {
            for f in files {
                let batch = read_file_at(w, table, &state.location, schemas, slot, f).await?;
                let rows = converter
                    .convert_columns(batch.columns().get(..nk).unwrap_or_default())
                    .map_err(arrow(table, "key encoding"))?;
                let (Some(seq), Some(kind)) = (
                    batch.column(nk).as_primitive_opt::<Int64Type>(),
                    batch.column(nk + 1).as_primitive_opt::<Int8Type>(),
                ) else {
                    continue;
                };
                let mut hit = false;
                for r in 0..batch.num_rows() {
                    let Some(&i) = index.get(rows.row(r).data()) else {
                        continue;
                    };
                    let s = seq.value(r);
                    let held = newest.batches.len();
                    if let Some(slot) = newest.best.get_mut(i) {
                        let delete = kind.value(r) == KIND_DELETE;
                        // At one sequence number, a row's insert in the partition it moved to
                        // wins over its delete in the one it left.
                        let newer = slot.is_none_or(|(_, _, old, was_delete)| {
                            s > old || (s == old && was_delete && !delete)
                        });
                        if newer {
                            *slot = Some((held, r, s, delete));
                            hit = true;
                        }
                    }
                }
                if hit {
                    newest.batches.push(batch);
                }
            }
        }
        // A key wanted twice (soft deletes: a kept old key's own row and the new key completed
        // from it) was found under one of its places: each takes that one's row.
        for i in 0..wanted.num_rows() {
            let at = index.get(wanted.row(i).data()).copied();
            if let Some(row) = at.filter(|&at| at != i).and_then(|at| newest.best.get(at)) {
                let row = *row;
                if let Some(slot) = newest.best.get_mut(i) {
                    *slot = row;
                }
            }
        }
        Ok(newest)
    }
}

/// The error for lookup `i`, whose key has no current row to complete its partial update from.
fn no_current_row(table: &TableId, keys: &[ArrayRef], i: usize) -> SinkError {
    let key = keys
        .iter()
        .map(|k| arrow_cast::display::array_value_to_string(k, i).unwrap_or_default())
        .collect::<Vec<_>>()
        .join(", ");
    SinkError::Data {
        table: table.clone(),
        detail: format!(
            "an update of key ({key}) leaves columns unchanged (absent) but the table holds no row with that key to take them from"
        ),
    }
}

/// Rows `idx` (`(batch, row)`) of `batches`, as one batch of the data file shape.
fn gather(
    schemas: &FileSchemas,
    batches: &[RecordBatch],
    idx: &[(usize, usize)],
) -> Result<RecordBatch, ArrowError> {
    let mut cols = Vec::with_capacity(schemas.file.fields().len());
    for c in 0..schemas.file.fields().len() {
        let arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(c).as_ref()).collect();
        cols.push(arrow_select::interleave::interleave(&arrays, idx)?);
    }
    RecordBatch::try_new(schemas.file.clone(), cols)
}

/// Whether lookup `i` may find no row: it completes a partial update inside an upsert window
/// whose key did not change (neither the looked-up change nor the key's final row moved a key).
fn droppable(plan: &Plan, changes: &[TableChanges], i: usize) -> bool {
    let unchanged_key = |src: Src| match src {
        Src::Row(b, r) => changes.get(b as usize).is_some_and(|c| {
            c.upsert_window && !c.key_changed.get(r as usize).copied().unwrap_or(true)
        }),
        _ => false,
    };
    plan.lookups.get(i).is_some_and(|l| {
        unchanged_key(l.key) && plan.rows.get(l.row).is_some_and(|r| unchanged_key(r.key))
    })
}
