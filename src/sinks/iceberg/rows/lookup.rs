//! Table lookup: the current values of the rows whose keys a commit needs to complete partial
//! updates (absent columns), read from the live files of the current snapshot in one pass.
//!
//! A data file's row is current unless an equality delete with a higher data sequence number
//! names its key, or a position delete or deletion vector names (file, pos) (Iceberg spec, "Scan
//! Planning"). A key with no current row is an error: an absent value is never replaced by a
//! placeholder. The one exception is a key the caller marks droppable (a partial update inside an
//! upsert window, `window.rs`): its row is all NULL and reported missing, and the caller drops
//! every planned row that takes a value from it.
//!
//! Two ways: [`fetch`] (format v3) reads rows at the positions the primary-key index gives,
//! only the files that hold them, one read per file with a Parquet row selection; [`lookup`]
//! (format v2, no index) fetches every live data file and decodes its key columns, then whole
//! rows only of the files holding a wanted key. All keys of one commit share the pass.

use std::collections::{BTreeMap, HashMap, HashSet};

use arrow_array::{Array, RecordBatch, UInt32Array};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_row::{Row, RowConverter};
use arrow_schema::{ArrowError, SchemaRef};
use bytes::Bytes;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReaderBuilder, RowSelection, RowSelector};

use iceberg::spec::DataFileFormat;

use super::live::LiveState;
use super::locator::RowAddress;
use super::{column_names, row_converter};
use crate::changelog::{TableChanges, TableId, TableSchema};
use crate::sinks::iceberg::deletes::commit_vectors::LiveDvs;
use crate::sinks::iceberg::deletes::position_deletes::read_pairs;
use crate::sinks::iceberg::files::decode::{decode, project, project_filled};
use crate::sinks::iceberg::files::manifest::{read, LiveFile, LiveFiles};
use crate::sinks::iceberg::files::writer::key_batch;
use crate::sinks::iceberg::plan::KeyRef;
use crate::sinks::iceberg::schema::Projection;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// Reads the current rows of `keys` (in that order), typed like the change rows, and which keys
/// have none (only keys `droppable` marks may lack one; any other is an error).
pub(crate) async fn lookup(
    warehouse: &Warehouse,
    schema: &TableSchema,
    live: &LiveState,
    changes: &[TableChanges],
    keys: &[KeyRef],
    droppable: &[bool],
    projection: &Projection,
) -> Result<(RecordBatch, Vec<bool>), SinkError> {
    let (files, dvs) = (&live.files, &live.dvs);
    let arrow = |context: String| arrow_error(&schema.id, context);
    let rows_schema = TableChanges::rows_schema(schema);
    let keys_schema = TableChanges::keys_schema(schema);
    let wanted_batch = key_batch(changes, keys, &schema.primary_key, &keys_schema)
        .map_err(arrow("gathering lookup keys".into()))?;
    let converter = row_converter(&keys_schema).map_err(arrow("encoding keys".into()))?;
    let wanted_rows = converter
        .convert_columns(wanted_batch.columns())
        .map_err(arrow("encoding keys".into()))?;
    let wanted = Wanted {
        table: &schema.id,
        keys_schema: &keys_schema,
        converter: &converter,
        index: wanted_rows
            .iter()
            .enumerate()
            .map(|(i, r)| (r, i))
            .collect(),
        count: keys.len(),
    };

    let deleted_at = wanted
        .equality_deleted_at(warehouse, &files.equality_deletes)
        .await?;
    let (candidates, mut found) = wanted
        .candidates(warehouse, &files.data, &rows_schema, projection)
        .await?;
    let pos_deleted = position_deleted(warehouse, files, &candidates).await?;
    let best = newest_live(
        files,
        dvs,
        &candidates,
        &deleted_at,
        &pos_deleted,
        keys.len(),
    );
    let mut indices = Vec::with_capacity(keys.len());
    let mut missing = vec![false; keys.len()];
    for (i, b) in best.iter().enumerate() {
        match b {
            Some((_, b, r)) => indices.push((*b, *r)),
            None if droppable.get(i).copied().unwrap_or(false) => {
                missing[i] = true;
                let null =
                    null_row(&mut found, &rows_schema).map_err(arrow("a stand-in row".into()))?;
                indices.push((null, 0));
            }
            None => {
                return Err(SinkError::Data {
                    table: schema.id.clone(),
                    detail: format!(
                        "cannot complete a partial update: row not in table (key {})",
                        key_text(&wanted_batch, i)
                    ),
                })
            }
        }
    }
    let rows = gather(&found, &indices, rows_schema, &schema.id)?;
    Ok((rows, missing))
}

/// A row of a data file that holds a wanted key: (wanted index, data file index, position,
/// found batch, row in it).
type Candidate = (usize, usize, u64, usize, usize);

/// The keys a [`lookup`] wants, row-encoded, so that a file's key columns are matched by hash.
struct Wanted<'a> {
    table: &'a TableId,
    keys_schema: &'a SchemaRef,
    converter: &'a RowConverter,
    index: HashMap<Row<'a>, usize>,
    count: usize,
}

impl Wanted<'_> {
    /// The sequence number of the newest equality delete per wanted key (`i64::MIN` for none).
    async fn equality_deleted_at(
        &self,
        warehouse: &Warehouse,
        equality_deletes: &[LiveFile],
    ) -> Result<Vec<i64>, SinkError> {
        let arrow = |context: String| arrow_error(self.table, context);
        let mut deleted_at = vec![i64::MIN; self.count];
        for f in equality_deletes {
            for batch in read_parquet(warehouse, f.file.file_path()).await? {
                let cols =
                    project(&batch, self.keys_schema).map_err(arrow(f.file.file_path().into()))?;
                let rows = self
                    .converter
                    .convert_columns(&cols)
                    .map_err(arrow(f.file.file_path().into()))?;
                for r in rows.iter() {
                    if let Some(&i) = self.index.get(&r) {
                        if let Some(d) = deleted_at.get_mut(i) {
                            *d = (*d).max(f.sequence);
                        }
                    }
                }
            }
        }
        Ok(deleted_at)
    }

    /// The rows of `data` that hold a wanted key, and the batches (`found`) they were taken into.
    async fn candidates(
        &self,
        warehouse: &Warehouse,
        data: &[LiveFile],
        rows_schema: &SchemaRef,
        projection: &Projection,
    ) -> Result<(Vec<Candidate>, Vec<RecordBatch>), SinkError> {
        let arrow = |context: String| arrow_error(self.table, context);
        let mut candidates: Vec<Candidate> = Vec::new();
        let mut found: Vec<RecordBatch> = Vec::new();
        for (fi, f) in data.iter().enumerate() {
            let path = f.file.file_path();
            let bytes = read(warehouse, path).await?;
            let positions = self.positions(&bytes, path)?;
            if positions.is_empty() {
                continue;
            }
            // Second pass: whole rows, only for files with a match.
            let mut offset = 0u64;
            let mut next = 0usize;
            for batch in decode(&bytes, path, None)? {
                let end = offset + batch.num_rows() as u64;
                let mut take = Vec::new();
                while let Some(&(i, pos)) = positions.get(next) {
                    if pos >= end {
                        break;
                    }
                    candidates.push((i, fi, pos, found.len(), take.len()));
                    take.push((pos - offset) as u32);
                    next += 1;
                }
                if !take.is_empty() {
                    let cols = project_filled(&batch, rows_schema, projection)
                        .map_err(arrow(path.to_owned()))?;
                    let idx = UInt32Array::from(take);
                    let taken = cols
                        .iter()
                        .map(|c| arrow_select::take::take(c.as_ref(), &idx, None))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(arrow(path.to_owned()))?;
                    found.push(
                        RecordBatch::try_new(rows_schema.clone(), taken)
                            .map_err(arrow(path.to_owned()))?,
                    );
                }
                offset = end;
            }
        }
        Ok((candidates, found))
    }

    /// The (wanted index, position) of each row of a data file that holds a wanted key.
    fn positions(&self, bytes: &Bytes, path: &str) -> Result<Vec<(usize, u64)>, SinkError> {
        let arrow = |context: String| arrow_error(self.table, context);
        let key_names = column_names(self.keys_schema);
        // First pass decodes only the key columns: most files hold none of the wanted keys.
        let mut positions: Vec<(usize, u64)> = Vec::new();
        let mut offset = 0u64;
        for batch in decode(bytes, path, Some(&key_names))? {
            let cols = project(&batch, self.keys_schema).map_err(arrow(path.to_owned()))?;
            let rows = self
                .converter
                .convert_columns(&cols)
                .map_err(arrow(path.to_owned()))?;
            for (r, row) in rows.iter().enumerate() {
                if let Some(&i) = self.index.get(&row) {
                    positions.push((i, offset + r as u64));
                }
            }
            offset += batch.num_rows() as u64;
        }
        Ok(positions)
    }
}

/// The (data file index, position) pairs that position delete files name in the files holding
/// candidates.
async fn position_deleted(
    warehouse: &Warehouse,
    files: &LiveFiles,
    candidates: &[Candidate],
) -> Result<HashSet<(usize, u64)>, SinkError> {
    let candidate_files: HashSet<usize> = candidates.iter().map(|c| c.1).collect();
    let by_path: HashMap<&str, usize> = candidate_files
        .iter()
        .filter_map(|&fi| files.data.get(fi).map(|f| (f.file.file_path(), fi)))
        .collect();
    let mut pos_deleted: HashSet<(usize, u64)> = HashSet::new();
    if !by_path.is_empty() {
        // Deletion vectors (v3) are checked per candidate below, from `dvs`.
        for f in files
            .position_deletes
            .iter()
            .filter(|f| f.file.file_format() != DataFileFormat::Puffin)
        {
            for (p, n) in read_pairs(warehouse, f.file.file_path()).await? {
                if let Some(&fi) = by_path.get(p.as_str()) {
                    pos_deleted.insert((fi, n));
                }
            }
        }
    }
    Ok(pos_deleted)
}

/// The live candidate per key (the newest, should a key somehow have two): (sequence number,
/// found batch, row in it).
fn newest_live(
    files: &LiveFiles,
    dvs: &LiveDvs,
    candidates: &[Candidate],
    deleted_at: &[i64],
    pos_deleted: &HashSet<(usize, u64)>,
    count: usize,
) -> Vec<Option<(i64, usize, usize)>> {
    let mut best: Vec<Option<(i64, usize, usize)>> = vec![None; count];
    for &(i, fi, pos, b, r) in candidates {
        let seq = files.data.get(fi).map_or(i64::MIN, |f| f.sequence);
        let eq_deleted = deleted_at.get(i).is_some_and(|&d| d > seq);
        let dv_deleted = files
            .data
            .get(fi)
            .and_then(|f| dvs.get(f.file.file_path()))
            .is_some_and(|d| d.dv.contains(pos));
        if eq_deleted || dv_deleted || pos_deleted.contains(&(fi, pos)) {
            continue;
        }
        if let Some(slot) = best.get_mut(i) {
            if slot.is_none_or(|(s, _, _)| seq >= s) {
                *slot = Some((seq, b, r));
            }
        }
    }
    best
}

/// The rows at `indices` ((batch, row) in `found`) as one batch.
fn gather(
    found: &[RecordBatch],
    indices: &[(usize, usize)],
    rows_schema: SchemaRef,
    table: &TableId,
) -> Result<RecordBatch, SinkError> {
    let arrow = || arrow_error(table, "gathering looked-up rows".into());
    let mut columns = Vec::with_capacity(rows_schema.fields().len());
    for c in 0..rows_schema.fields().len() {
        let arrays: Vec<&dyn Array> = found.iter().map(|b| b.column(c).as_ref()).collect();
        columns.push(arrow_select::interleave::interleave(&arrays, indices).map_err(arrow())?);
    }
    RecordBatch::try_new(rows_schema, columns).map_err(arrow())
}

/// The error of an Arrow step (`context`) on the rows of `table`.
fn arrow_error(table: &TableId, context: String) -> impl FnOnce(ArrowError) -> SinkError {
    let table = table.clone();
    move |e: ArrowError| SinkError::Arrow {
        context: format!("{context} of {table}"),
        source: e,
    }
}

/// The index in `found` of a one-row all-NULL batch (added on first use): the stand-in row of a
/// missing droppable key, whose dependent rows are never written. A looked-up row is never all
/// NULL: its key is not.
fn null_row(found: &mut Vec<RecordBatch>, rows_schema: &SchemaRef) -> Result<usize, ArrowError> {
    let is_null_row =
        |b: &RecordBatch| b.num_rows() == 1 && b.columns().iter().all(|c| c.null_count() == 1);
    if let Some(i) = found.iter().position(is_null_row) {
        return Ok(i);
    }
    let columns = rows_schema
        .fields()
        .iter()
        .map(|f| arrow_array::new_null_array(f.data_type(), 1))
        .collect();
    found.push(RecordBatch::try_new(rows_schema.clone(), columns)?);
    Ok(found.len() - 1)
}

/// Reads the rows at `at` (one per key of `keys`, the located current rows), typed like the
/// change rows, in that order, and which keys have none. A key without a row is an error naming
/// it, unless `droppable` marks it.
pub(crate) async fn fetch(
    warehouse: &Warehouse,
    schema: &TableSchema,
    keys: &RecordBatch,
    at: &[Option<RowAddress>],
    droppable: &[bool],
    projection: &Projection,
) -> Result<(RecordBatch, Vec<bool>), SinkError> {
    let rows_schema = TableChanges::rows_schema(schema);
    let mut missing = vec![false; at.len()];
    if at.is_empty() {
        return Ok((RecordBatch::new_empty(rows_schema), missing));
    }
    // Wanted rows by file: (position, key index), sorted by position below.
    let mut by_file: BTreeMap<&str, Vec<(u64, usize)>> = BTreeMap::new();
    for (i, a) in at.iter().enumerate() {
        let Some(a) = a else {
            if droppable.get(i).copied().unwrap_or(false) {
                missing[i] = true;
                continue;
            }
            return Err(SinkError::Data {
                table: schema.id.clone(),
                detail: format!(
                    "cannot complete a partial update: row not in table (key {})",
                    key_text(keys, i)
                ),
            });
        };
        by_file.entry(&a.file).or_default().push((a.pos, i));
    }
    let mut found = Vec::with_capacity(by_file.len());
    let mut indices = vec![(0usize, 0usize); at.len()];
    for (path, mut wanted) in by_file {
        wanted.sort_unstable();
        let (rows, row_of) =
            read_positions(warehouse, schema, path, &wanted, &rows_schema, projection).await?;
        for (i, row) in row_of {
            if let Some(slot) = indices.get_mut(i) {
                *slot = (found.len(), row);
            }
        }
        found.push(rows);
    }
    if missing.contains(&true) {
        let null = null_row(&mut found, &rows_schema)
            .map_err(arrow_error(&schema.id, "a stand-in row".into()))?;
        for (slot, _) in indices.iter_mut().zip(&missing).filter(|(_, m)| **m) {
            *slot = (null, 0);
        }
    }
    let rows = gather(&found, &indices, rows_schema, &schema.id)?;
    Ok((rows, missing))
}

/// Reads the rows at the `wanted` positions (ascending, with their key index) of the data file
/// `path`, one read with a Parquet row selection, and the row of each key index in the result.
async fn read_positions(
    warehouse: &Warehouse,
    schema: &TableSchema,
    path: &str,
    wanted: &[(u64, usize)],
    rows_schema: &SchemaRef,
    projection: &Projection,
) -> Result<(RecordBatch, RowOfKey), SinkError> {
    let arrow = |source| SinkError::Arrow {
        context: format!("reading rows of {path}"),
        source,
    };
    let bytes = read(warehouse, path).await?;
    let parquet = |source| SinkError::Parquet {
        context: format!("reading {path}"),
        source,
    };
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(parquet)?;
    let total = u64::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0);
    let (selectors, row_of, out_row) = select_positions(schema, path, total, wanted)?;
    let batches = builder
        .with_row_selection(RowSelection::from(selectors))
        .build()
        .map_err(parquet)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(arrow)?;
    let all = arrow_select::concat::concat_batches(
        &batches
            .first()
            .map_or_else(|| rows_schema.clone(), |b| b.schema()),
        &batches,
    )
    .map_err(arrow)?;
    let cols = project_filled(&all, rows_schema, projection).map_err(arrow)?;
    if cols.first().map_or(0, |c| c.len()) != out_row {
        return Err(SinkError::Corrupt {
            path: path.to_owned(),
            detail: format!("asked for {out_row} rows, read {}", all.num_rows()),
        });
    }
    let rows = RecordBatch::try_new(rows_schema.clone(), cols).map_err(arrow)?;
    Ok((rows, row_of))
}

/// (key index, row) pairs: where each key's row is in what a read selects.
type RowOfKey = Vec<(usize, usize)>;

/// The row selection of the `wanted` positions of a file of `total` rows, the row of each key
/// index in what it selects, and how many rows it selects.
fn select_positions(
    schema: &TableSchema,
    path: &str,
    total: u64,
    wanted: &[(u64, usize)],
) -> Result<(Vec<RowSelector>, RowOfKey, usize), SinkError> {
    // Select the wanted positions (deduplicated, ascending) and skip the gaps between them.
    let mut selectors = Vec::new();
    let mut row_of = Vec::with_capacity(wanted.len());
    let mut next = 0u64;
    let mut out_row = 0usize;
    for &(pos, i) in wanted {
        if pos >= total {
            return Err(SinkError::Corrupt {
                path: path.to_owned(),
                detail: format!(
                    "the primary-key index places a row of {} at position {pos}, but the file has {total} rows",
                    schema.id
                ),
            });
        }
        if pos + 1 == next {
            // Same position as the previous key (cannot happen for unique keys).
            row_of.push((i, out_row.saturating_sub(1)));
            continue;
        }
        if pos > next {
            selectors.push(RowSelector::skip((pos - next) as usize));
        }
        selectors.push(RowSelector::select(1));
        next = pos + 1;
        row_of.push((i, out_row));
        out_row += 1;
    }
    Ok((selectors, row_of, out_row))
}

async fn read_parquet(
    warehouse: &Warehouse,
    location: &str,
) -> Result<Vec<RecordBatch>, SinkError> {
    let bytes = read(warehouse, location).await?;
    decode(&bytes, location, None)
}

/// Row `row` of a key batch as text, e.g. `(42, "a")`, for error messages.
pub(crate) fn key_text(keys: &RecordBatch, row: usize) -> String {
    let options = FormatOptions::default();
    let parts: Vec<String> = keys
        .columns()
        .iter()
        .map(|c| match ArrayFormatter::try_new(c.as_ref(), &options) {
            Ok(f) if row < c.len() => f.value(row).to_string(),
            _ => "?".to_owned(),
        })
        .collect();
    if parts.len() == 1 {
        parts.concat()
    } else {
        format!("({})", parts.join(", "))
    }
}
