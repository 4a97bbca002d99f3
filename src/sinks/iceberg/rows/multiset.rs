//! Locating the rows a commit to a keyless multiset table deletes (issue 23; the plan is
//! `plan/multiset.rs`): for each delete of a row of an earlier snapshot, one distinct live row
//! equal to the deleted image, as (data file, position) — the deletion vector (v3) or position
//! delete (v2) that removes exactly that copy.
//!
//! How: one pass over the snapshot's live data files, decoding whole rows and comparing them
//! through `arrow_row`'s encoding with the deleted images; a row is live unless its file's
//! deletion vector or a v2 position delete names it. Each wanted image takes as many distinct
//! rows as it has deletes; the pass stops once every delete has its row. Fewer live copies than
//! deletes stops the commit naming the row: the replica is then not the source's multiset, and
//! skipping the delete would hide that.
//!
//! Why a scan and not the primary-key index: the answer is computed from the snapshot the commit
//! builds on and nothing else, so it is exact by construction — after a crash and a replay from
//! the checkpoint there is no occurrence count or index entry that could be ahead of or behind
//! the table. The cost is a read of the table's live files for each commit that deletes rows of
//! an earlier snapshot (commits of inserts only read nothing); docs/guarantees.md says so.

use std::collections::{HashMap, HashSet};

use arrow_array::{Array, RecordBatch};
use arrow_schema::{ArrowError, SchemaRef};
use iceberg::spec::DataFileFormat;

use super::locator::RowAddress;
use super::lookup::key_text;
use super::row_converter;
use crate::changelog::{TableChanges, TableId, TableSchema};
use crate::sinks::iceberg::deletes::commit_vectors::LiveDvs;
use crate::sinks::iceberg::deletes::position_deletes::read_pairs;
use crate::sinks::iceberg::files::decode::{decode, project_filled};
use crate::sinks::iceberg::files::manifest::{read, LiveFiles};
use crate::sinks::iceberg::plan::RowRef;
use crate::sinks::iceberg::schema::Projection;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// One live row per entry of `deletes` (rows of `changes`), distinct, in `deletes` order.
pub(crate) async fn locate(
    warehouse: &Warehouse,
    schema: &TableSchema,
    files: &LiveFiles,
    dvs: &LiveDvs,
    changes: &[TableChanges],
    deletes: &[RowRef],
    projection: &Projection,
) -> Result<Vec<RowAddress>, SinkError> {
    let table = &schema.id;
    let arrow = |context: &str| {
        let context = format!("{context} of {table}");
        move |source: ArrowError| SinkError::Arrow { context, source }
    };
    refuse_equality_deletes(files, table)?;
    let rows_schema = TableChanges::rows_schema(schema);
    let wanted_batch =
        gather(changes, deletes, &rows_schema).map_err(arrow("gathering deleted rows"))?;
    let converter = row_converter(&rows_schema).map_err(arrow("encoding rows"))?;
    let wanted_rows = converter
        .convert_columns(wanted_batch.columns())
        .map_err(arrow("encoding rows"))?;
    // Per distinct image: the deletes still without a row (indexes into `deletes`), last first.
    let mut waiting: HashMap<Vec<u8>, Vec<usize>> = HashMap::new();
    for (i, row) in wanted_rows.iter().enumerate().rev() {
        waiting.entry(row.as_ref().to_vec()).or_default().push(i);
    }
    let mut open = deletes.len();
    let pos_deleted = position_deletes(warehouse, files).await?;
    let mut found: Vec<Option<RowAddress>> = vec![None; deletes.len()];
    for f in &files.data {
        if open == 0 {
            break;
        }
        let path = f.file.file_path();
        let dv = dvs.get(path).map(|d| &d.dv);
        let bytes = read(warehouse, path).await?;
        let mut pos = 0u64;
        for batch in decode(&bytes, path, None)? {
            let cols = project_filled(&batch, &rows_schema, projection).map_err(arrow(path))?;
            let rows = converter.convert_columns(&cols).map_err(arrow(path))?;
            for row in rows.iter() {
                let here = pos;
                pos += 1;
                let Some(slots) = waiting.get_mut(row.as_ref()) else {
                    continue;
                };
                if dv.is_some_and(|d| d.contains(here))
                    || pos_deleted.contains(&(path.to_owned(), here))
                {
                    continue;
                }
                if let Some(i) = slots.pop() {
                    if let Some(slot) = found.get_mut(i) {
                        *slot = Some(RowAddress {
                            file: path.into(),
                            pos: here,
                        });
                    }
                    open -= 1;
                }
                if slots.is_empty() {
                    waiting.remove(row.as_ref());
                }
            }
        }
    }
    every_row_located(found, &wanted_batch, table)
}

/// An equality delete file is refused: cdcd cannot tell which rows of a keyless table it removes.
fn refuse_equality_deletes(files: &LiveFiles, table: &TableId) -> Result<(), SinkError> {
    if let Some(f) = files.equality_deletes.first() {
        // cdcd never writes one to a keyless table, and one written by another engine could
        // remove rows this scan counts as live.
        return Err(SinkError::Data {
            table: table.clone(),
            detail: format!(
                "the table has an equality delete file ({}), which cdcd does not write to a table without a key; cannot locate the rows to delete",
                f.file.file_path()
            ),
        });
    }
    Ok(())
}

/// The located rows, or an error naming the first delete without one.
fn every_row_located(
    found: Vec<Option<RowAddress>>,
    wanted_batch: &RecordBatch,
    table: &TableId,
) -> Result<Vec<RowAddress>, SinkError> {
    let mut out = Vec::with_capacity(found.len());
    for (i, at) in found.into_iter().enumerate() {
        match at {
            Some(at) => out.push(at),
            None => {
                return Err(SinkError::Data {
                    table: table.clone(),
                    detail: format!(
                        "a DELETE or UPDATE of a table without a key removes a row {} that the table does not hold (as many times as the source deleted it): the replica is not the source's multiset; copy the table anew",
                        key_text(wanted_batch, i)
                    ),
                })
            }
        }
    }
    Ok(out)
}

/// The (data file, position) pairs v2 position delete files name (deletion vectors are checked
/// per row from `dvs`).
async fn position_deletes(
    warehouse: &Warehouse,
    files: &LiveFiles,
) -> Result<HashSet<(String, u64)>, SinkError> {
    let mut out = HashSet::new();
    for f in files
        .position_deletes
        .iter()
        .filter(|f| f.file.file_format() != DataFileFormat::Puffin)
    {
        out.extend(read_pairs(warehouse, f.file.file_path()).await?);
    }
    Ok(out)
}

/// The whole rows `rows` of `changes`, in that order, as one batch of `schema`.
pub(crate) fn gather(
    changes: &[TableChanges],
    rows: &[RowRef],
    schema: &SchemaRef,
) -> Result<RecordBatch, ArrowError> {
    let indices: Vec<(usize, usize)> = rows
        .iter()
        .map(|r| (r.batch as usize, r.row as usize))
        .collect();
    let mut columns = Vec::with_capacity(schema.fields().len());
    for (col, field) in schema.fields().iter().enumerate() {
        let arrays = changes
            .iter()
            .map(|c| {
                c.rows
                    .columns()
                    .get(col)
                    .map(|a| a.as_ref())
                    .ok_or_else(|| {
                        ArrowError::SchemaError(format!("a change batch lacks column {col}"))
                    })
            })
            .collect::<Result<Vec<&dyn Array>, _>>()?;
        let gathered = arrow_select::interleave::interleave(&arrays, &indices)?;
        columns.push(crate::sinks::iceberg::geometry::cast(&gathered, field)?);
    }
    RecordBatch::try_new(schema.clone(), columns)
}
