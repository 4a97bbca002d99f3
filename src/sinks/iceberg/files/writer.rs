//! File writer: carries out a [`Plan`](crate::sinks::iceberg::plan::Plan) — materializes each
//! planned data file from the change batches (absent cells filled from earlier changes or the
//! table lookup), and builds the equality delete file (key columns) and the position delete file
//! (`file_path`, `pos`), each encoded as Parquet with Iceberg field ids and put through the
//! warehouse store.
//!
//! Rows are gathered column by column with `interleave` over the change batches, so no row is
//! copied one value at a time; types are then cast to the file schema (Int16 → int, time zones →
//! `+00:00`, list element field ids). A file whose rows are long runs of consecutive rows of one
//! batch with nothing to fill (an initial copy, an insert-only commit) skips the gather: each run
//! is a zero-copy slice handed to the Parquet encoder as it is ([`data_batches`]).
//!
//! Encoding is CPU work of a second or more for a large file, so it runs on tokio's blocking pool
//! ([`write_file`]), not on a runtime worker the source's connections need at the same time; how
//! a file is encoded (its Parquet settings, columns in parallel) is in `encode.rs`.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{ArrowError, SchemaRef};
use iceberg::spec::{DataContentType, DataFile, DataFileBuilder, DataFileFormat, Struct};
use object_store::{ObjectStoreExt, PutPayload};
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;

use super::encode;
use crate::changelog::{TableChanges, TableId, TableSchema};
use crate::sinks::iceberg::plan::{CellSource, KeyRef, Plan, PlannedFile};
use crate::sinks::iceberg::rows::locator::RowAddress;
use crate::sinks::iceberg::schema;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// A run shorter than this (rows) is not worth its own slice: the file is gathered instead.
const MIN_SLICE_RUN: usize = 1024;

/// The rows of one planned data file, in the file's schema, as batches to encode in order.
///
/// When the file has no cells to fill and its rows are runs of at least [`MIN_SLICE_RUN`]
/// consecutive rows of one batch (on average), each run is a slice of its change batch: no
/// value is copied. Otherwise the rows are gathered into one batch ([`data_batch`]).
pub(crate) fn data_batches(
    changes: &[TableChanges],
    file: &PlannedFile,
    lookup: Option<&RecordBatch>,
    file_schema: &SchemaRef,
) -> Result<Vec<RecordBatch>, ArrowError> {
    let runs = consecutive_runs(file);
    let sliceable = file.fills.is_empty()
        && !runs.is_empty()
        && runs.len().saturating_mul(MIN_SLICE_RUN) <= file.rows.len();
    if !sliceable {
        return Ok(vec![data_batch(changes, file, lookup, file_schema)?]);
    }
    let mut batches = Vec::with_capacity(runs.len());
    for run in runs {
        let Some(source) = changes.get(run.batch) else {
            return Err(ArrowError::InvalidArgumentError(format!(
                "planned rows name change batch {} of {}",
                run.batch,
                changes.len()
            )));
        };
        if run.start + run.len > source.rows.num_rows() {
            return Err(ArrowError::InvalidArgumentError(format!(
                "planned rows {}..{} of a change batch of {} rows",
                run.start,
                run.start + run.len,
                source.rows.num_rows()
            )));
        }
        let mut columns = Vec::with_capacity(file_schema.fields().len());
        for (col, field) in file_schema.fields().iter().enumerate() {
            let Some(column) = source.rows.columns().get(col) else {
                return Err(ArrowError::InvalidArgumentError(format!(
                    "a change batch has {} columns, the file {}",
                    source.rows.num_columns(),
                    file_schema.fields().len()
                )));
            };
            let slice = column.slice(run.start, run.len);
            columns.push(arrow_cast::cast(&slice, field.data_type())?);
        }
        batches.push(RecordBatch::try_new(file_schema.clone(), columns)?);
    }
    Ok(batches)
}

/// `len` consecutive rows of change batch `batch` from row `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    batch: usize,
    start: usize,
    len: usize,
}

/// The file's rows as runs of consecutive rows of one batch, in file order.
fn consecutive_runs(file: &PlannedFile) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for r in &file.rows {
        let (batch, row) = (r.batch as usize, r.row as usize);
        match runs.last_mut() {
            Some(last) if last.batch == batch && last.start + last.len == row => last.len += 1,
            _ => runs.push(Run {
                batch,
                start: row,
                len: 1,
            }),
        }
    }
    runs
}

/// Gathers the rows of one planned data file, in the file's schema.
pub(crate) fn data_batch(
    changes: &[TableChanges],
    file: &PlannedFile,
    lookup: Option<&RecordBatch>,
    file_schema: &SchemaRef,
) -> Result<RecordBatch, ArrowError> {
    let lookup_index = changes.len();
    let mut columns = Vec::with_capacity(file_schema.fields().len());
    let mut indices: Vec<(usize, usize)> = Vec::with_capacity(file.rows.len());
    for (col, field) in file_schema.fields().iter().enumerate() {
        let mut arrays: Vec<&dyn Array> = Vec::with_capacity(changes.len() + 1);
        for c in changes {
            arrays.push(c.rows.column(col).as_ref());
        }
        if let Some(l) = lookup {
            arrays.push(l.column(col).as_ref());
        }
        indices.clear();
        indices.extend(file.rows.iter().map(|r| (r.batch as usize, r.row as usize)));
        for fill in file.fills.iter().filter(|f| f.column as usize == col) {
            let source = match fill.source {
                CellSource::Change(r) => (r.batch as usize, r.row as usize),
                CellSource::Table(n) => (lookup_index, n as usize),
            };
            if let Some(slot) = indices.get_mut(fill.pos as usize) {
                *slot = source;
            }
        }
        let gathered = arrow_select::interleave::interleave(&arrays, &indices)?;
        columns.push(arrow_cast::cast(&gathered, field.data_type())?);
    }
    RecordBatch::try_new(file_schema.clone(), columns)
}

/// Gathers the keys of an equality delete file, in `key_schema` (the key fields of the file schema).
pub(crate) fn key_batch(
    changes: &[TableChanges],
    keys: &[KeyRef],
    key: &[usize],
    key_schema: &SchemaRef,
) -> Result<RecordBatch, ArrowError> {
    let n = changes.len();
    let indices: Vec<(usize, usize)> = keys
        .iter()
        .map(|k| (k.batch as usize + if k.old { n } else { 0 }, k.row as usize))
        .collect();
    let mut columns = Vec::with_capacity(key.len());
    for ((i, &col), field) in key.iter().enumerate().zip(key_schema.fields()) {
        let mut arrays: Vec<&dyn Array> = Vec::with_capacity(2 * n);
        for c in changes {
            arrays.push(c.rows.column(col).as_ref());
        }
        for c in changes {
            arrays.push(c.old_keys.column(i).as_ref());
        }
        let gathered = arrow_select::interleave::interleave(&arrays, &indices)?;
        columns.push(arrow_cast::cast(&gathered, field.data_type())?);
    }
    RecordBatch::try_new(key_schema.clone(), columns)
}

/// A position delete file's rows: `deletes` are (file index, pos) into `paths`, already sorted by
/// file index then position; file indexes follow path order, so the rows are sorted by path then
/// position as the spec requires.
pub(crate) fn position_batch(
    paths: &[String],
    deletes: &[(u32, u32)],
    schema: &SchemaRef,
) -> Result<RecordBatch, ArrowError> {
    let files: StringArray = deletes
        .iter()
        .map(|(f, _)| paths.get(*f as usize).map(String::as_str))
        .collect();
    let pos: Int64Array = deletes.iter().map(|(_, p)| Some(i64::from(*p))).collect();
    RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(files) as ArrayRef, Arc::new(pos) as ArrayRef],
    )
}

/// A position delete file's rows for this commit's superseded rows (`deletes`, as in
/// [`position_batch`]) and rows of earlier snapshots' files (`earlier`), sorted by path then
/// position as the spec requires.
pub(crate) fn position_batch_with_earlier(
    paths: &[String],
    deletes: &[(u32, u32)],
    earlier: &[Option<RowAddress>],
    schema: &SchemaRef,
) -> Result<RecordBatch, ArrowError> {
    let mut rows: Vec<(&str, i64)> = deletes
        .iter()
        .filter_map(|(f, p)| Some((paths.get(*f as usize)?.as_str(), i64::from(*p))))
        .collect();
    for a in earlier.iter().flatten() {
        rows.push((&a.file, i64::try_from(a.pos).unwrap_or(i64::MAX)));
    }
    rows.sort_unstable();
    let files: StringArray = rows.iter().map(|(f, _)| Some(*f)).collect();
    let pos: Int64Array = rows.iter().map(|(_, p)| Some(*p)).collect();
    RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(files) as ArrayRef, Arc::new(pos) as ArrayRef],
    )
}

/// Writes `batches` (one schema, in order) to `location` as one file and describes it as an
/// Iceberg file of `content`. Encoding runs on the blocking pool.
pub(crate) async fn write_file(
    warehouse: &Warehouse,
    table: &TableId,
    location: String,
    batches: Vec<RecordBatch>,
    content: DataContentType,
    equality_ids: Option<Vec<i32>>,
) -> Result<DataFile, SinkError> {
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let encoded = tokio::task::spawn_blocking(move || encode::encode_parquet(&batches)).await;
    let bytes = match encoded {
        Ok(result) => result,
        Err(join) => Err(parquet::errors::ParquetError::General(format!(
            "the encoding task failed: {join}"
        ))),
    }
    .map_err(|source| SinkError::Parquet {
        context: format!("encoding {location}"),
        source,
    })?;
    put_file(
        warehouse,
        table,
        location,
        bytes,
        rows as u64,
        content,
        equality_ids,
    )
    .await
}

/// Puts the encoded file `bytes` (`rows` rows) at `location` and describes it as an Iceberg file
/// of `content`.
pub(crate) async fn put_file(
    warehouse: &Warehouse,
    table: &TableId,
    location: String,
    bytes: bytes::Bytes,
    rows: u64,
    content: DataContentType,
    equality_ids: Option<Vec<i32>>,
) -> Result<DataFile, SinkError> {
    let size = bytes.len() as u64;
    let path = warehouse.path(&location)?;
    warehouse
        .store()
        .put(&path, PutPayload::from_bytes(bytes))
        .await
        .map_err(|source| SinkError::Storage {
            path: location.clone(),
            source,
        })?;
    DataFileBuilder::default()
        .content(content)
        .file_path(location)
        .file_format(DataFileFormat::Parquet)
        .partition(Struct::empty())
        .partition_spec_id(0)
        .record_count(rows)
        .file_size_in_bytes(size)
        .equality_ids(equality_ids)
        .build()
        .map_err(|e| SinkError::Data {
            table: table.clone(),
            detail: format!("describing a written file: {e}"),
        })
}

/// A commit's changes as planned: what the delete writers read.
pub(crate) struct Planned<'a> {
    pub schema: &'a TableSchema,
    pub changes: &'a [TableChanges],
    pub plan: &'a Plan,
}

/// Where a v2 commit's delete files go.
pub(crate) struct V2DeletePaths {
    pub position: String,
    pub equality: String,
}

/// Format v2: the position delete file (rows superseded in this commit, in the data files at
/// `data_paths`) and the equality delete file (keys of earlier snapshots), each when needed.
pub(crate) async fn write_v2_deletes(
    warehouse: &Warehouse,
    planned: &Planned<'_>,
    data_paths: &[String],
    earlier: &[Option<RowAddress>],
    file_schema: &arrow_schema::SchemaRef,
    to: &V2DeletePaths,
) -> Result<Vec<DataFile>, SinkError> {
    let Planned {
        schema,
        changes,
        plan,
    } = *planned;
    let table = &schema.id;
    let arrow = |what: &str| {
        let context = format!("{what} of {table}");
        move |source| SinkError::Arrow { context, source }
    };
    let mut delete_files = Vec::new();
    if !plan.position_deletes.is_empty() || earlier.iter().any(Option::is_some) {
        let batch = if earlier.iter().any(Option::is_some) {
            position_batch_with_earlier(
                data_paths,
                &plan.position_deletes,
                earlier,
                &schema::position_delete_schema(),
            )
        } else {
            position_batch(
                data_paths,
                &plan.position_deletes,
                &schema::position_delete_schema(),
            )
        }
        .map_err(arrow("gathering position deletes"))?;
        delete_files.push(
            write_file(
                warehouse,
                table,
                to.position.clone(),
                vec![batch],
                DataContentType::PositionDeletes,
                None,
            )
            .await?,
        );
    }
    if !plan.equality_deletes.is_empty() {
        let key_schema = schema::key_file_schema(file_schema, &schema.primary_key);
        let ids: Vec<i32> = key_schema
            .fields()
            .iter()
            .filter_map(|f| f.metadata().get(PARQUET_FIELD_ID_META_KEY)?.parse().ok())
            .collect();
        let batch = key_batch(
            changes,
            &plan.equality_deletes,
            &schema.primary_key,
            &key_schema,
        )
        .map_err(arrow("gathering equality deletes"))?;
        delete_files.push(
            write_file(
                warehouse,
                table,
                to.equality.clone(),
                vec![batch],
                DataContentType::EqualityDeletes,
                Some(ids),
            )
            .await?,
        );
    }
    Ok(delete_files)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::sinks::iceberg::schema::position_delete_schema;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    fn inserts(first: i64, n: usize) -> TableChanges {
        use crate::changelog::{Op, TableChangesBuilder};
        use arrow_array::builder::{Int64Builder, StringBuilder};
        let schema = crate::test_fixtures::id_text_schema("t", "state");
        let mut b = TableChangesBuilder::new(schema, n);
        for id in first..first + n as i64 {
            b.begin(Op::Insert);
            let col = b.value(0).unwrap();
            col.as_any_mut()
                .downcast_mut::<Int64Builder>()
                .unwrap()
                .append_value(id);
            let col = b.value(1).unwrap();
            let state = ["new", "paid", "sent"][id as usize % 3];
            col.as_any_mut()
                .downcast_mut::<StringBuilder>()
                .unwrap()
                .append_value(state);
            b.no_old_key().unwrap();
        }
        b.finish().unwrap()
    }

    /// Issue 7: an insert-only file is written from slices of the change batches, and reads back
    /// equal to the gathered form; the key column gets no dictionary, the repetitive one does.
    #[test]
    fn insert_runs_are_sliced_not_gathered() {
        let changes = vec![inserts(0, 3000), inserts(3000, 2000)];
        let table = changes[0].schema.clone();
        let plan =
            crate::sinks::iceberg::plan::plan(&changes, &table.primary_key, Default::default())
                .unwrap();
        let file = &plan.files[0];
        let file_schema =
            schema::data_file_schema(&schema::iceberg_schema(&table).unwrap()).unwrap();
        let sliced = data_batches(&changes, file, None, &file_schema).unwrap();
        assert_eq!(sliced.len(), 2, "one slice per change batch");
        let gathered = data_batch(&changes, file, None, &file_schema).unwrap();
        let joined = arrow_select::concat::concat_batches(&file_schema, &sliced).unwrap();
        assert_eq!(joined, gathered);

        let bytes = encode::encode_parquet(&sliced).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes).unwrap();
        let meta = reader.metadata().clone();
        let read: Vec<RecordBatch> = reader.build().unwrap().map(|b| b.unwrap()).collect();
        let read = arrow_select::concat::concat_batches(&read[0].schema(), &read).unwrap();
        assert_eq!(read.num_rows(), 5000);
        assert_eq!(read.column(0).as_ref(), gathered.column(0).as_ref());
        let column = |i: usize| meta.row_group(0).column(i).dictionary_page_offset();
        assert_eq!(column(0), None, "a key column is mostly distinct");
        assert!(column(1).is_some(), "three states repeat");
    }

    #[test]
    fn position_deletes_carry_reserved_field_ids() {
        let paths = vec![
            "file:///a/0.parquet".to_owned(),
            "file:///a/1.parquet".to_owned(),
        ];
        let b = position_batch(&paths, &[(0, 3), (1, 0)], &position_delete_schema()).unwrap();
        let bytes = encode::encode_parquet(&[b]).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes).unwrap();
        let fields = reader.parquet_schema().root_schema().get_fields();
        assert_eq!(fields[0].get_basic_info().id(), 2147483546);
        assert_eq!(fields[1].get_basic_info().id(), 2147483545);
        let got = reader.build().unwrap().next().unwrap().unwrap();
        assert_eq!(got.num_rows(), 2);
    }
}
