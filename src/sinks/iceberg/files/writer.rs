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
//! ([`write_file`]), not on a runtime worker the source's connections need at the same time (a
//! tiny file, `encode::SMALL_FILE_BYTES`, is encoded in place); how a file is encoded (its
//! Parquet settings, columns in parallel) is in `encode.rs`.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{ArrowError, SchemaRef};
use iceberg::spec::{DataContentType, DataFile, DataFileBuilder, DataFileFormat, Struct};
use object_store::PutPayload;
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;

use super::encode;
use crate::changelog::{TableChanges, TableId, TableSchema};
use crate::sinks::iceberg::plan::{CellSource, KeyRef, Plan, PlannedFile};
use crate::sinks::iceberg::rows::locator::RowAddress;
use crate::sinks::iceberg::{geometry, schema};
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
            columns.push(geometry::cast(&slice, field)?);
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
    let all: Vec<usize> = (0..file_schema.fields().len()).collect();
    let columns = gather_columns(changes, file, lookup, file_schema, &all)?;
    RecordBatch::try_new(file_schema.clone(), columns)
}

/// Gathers columns `wanted` (indexes into the file schema) of the rows of one planned data file,
/// in the file schema's types, as a batch of those columns only (what a partitioned table's
/// layout reads to split the file: `partitioning/`).
pub(crate) fn column_batch(
    changes: &[TableChanges],
    file: &PlannedFile,
    lookup: Option<&RecordBatch>,
    file_schema: &SchemaRef,
    wanted: &[usize],
) -> Result<RecordBatch, ArrowError> {
    let columns = gather_columns(changes, file, lookup, file_schema, wanted)?;
    let fields: Vec<_> = wanted
        .iter()
        .filter_map(|&c| file_schema.fields().get(c).cloned())
        .collect();
    RecordBatch::try_new_with_options(
        Arc::new(arrow_schema::Schema::new(fields)),
        columns,
        &arrow_array::RecordBatchOptions::new().with_row_count(Some(file.rows.len())),
    )
}

/// Columns `wanted` of the rows of `file`, absent cells filled, cast to the file schema's types.
///
/// Only the change batches the file's rows and fills come from are `interleave`'s sources: a
/// commit holds a batch per source transaction or so (a thousand a second), and `interleave`
/// compares every source's type and counts its nulls, so with every batch a source each of a
/// partitioned commit's hundreds of one-row files cost as much as the whole commit (issue 36).
fn gather_columns(
    changes: &[TableChanges],
    file: &PlannedFile,
    lookup: Option<&RecordBatch>,
    file_schema: &SchemaRef,
    wanted: &[usize],
) -> Result<Vec<ArrayRef>, ArrowError> {
    let sources = Sources::of(file, changes.len())?;
    let mut columns = Vec::with_capacity(wanted.len());
    let mut indices: Vec<(usize, usize)> = Vec::with_capacity(file.rows.len());
    for &col in wanted {
        let Some(field) = file_schema.fields().get(col) else {
            return Err(ArrowError::InvalidArgumentError(format!(
                "column {col} of a file schema of {}",
                file_schema.fields().len()
            )));
        };
        let mut arrays: Vec<&dyn Array> = Vec::with_capacity(sources.used.len());
        for &source in &sources.used {
            let batch = match changes.get(source) {
                Some(c) => &c.rows,
                None => lookup.ok_or_else(|| {
                    ArrowError::InvalidArgumentError(
                        "planned cells name table rows, and none were looked up".into(),
                    )
                })?,
            };
            arrays.push(batch.column(col).as_ref());
        }
        indices.clear();
        indices.extend(
            file.rows
                .iter()
                .map(|r| (sources.slot(r.batch as usize), r.row as usize)),
        );
        for fill in file.fills.iter().filter(|f| f.column as usize == col) {
            let source = match fill.source {
                CellSource::Change(r) => (sources.slot(r.batch as usize), r.row as usize),
                CellSource::Table(n) => (sources.slot(changes.len()), n as usize),
            };
            if let Some(slot) = indices.get_mut(fill.pos as usize) {
                *slot = source;
            }
        }
        let gathered = arrow_select::interleave::interleave(&arrays, &indices)?;
        columns.push(geometry::cast(&gathered, field)?);
    }
    Ok(columns)
}

/// The sources of one file's cells, `interleave`'s arrays: change batch `n` (of `batches`), or
/// the table lookup as source `batches`, each given a slot in the order first used.
struct Sources {
    /// Source by slot.
    used: Vec<usize>,
    /// Slot by source (`u32::MAX`: unused).
    slots: Vec<u32>,
}

impl Sources {
    fn of(file: &PlannedFile, batches: usize) -> Result<Sources, ArrowError> {
        let mut sources = Sources {
            used: Vec::new(),
            slots: vec![u32::MAX; batches + 1],
        };
        let fills = file.fills.iter().map(|f| match f.source {
            CellSource::Change(r) => r.batch as usize,
            CellSource::Table(_) => batches,
        });
        // A file without rows still takes its columns' types from a batch.
        let first = (file.rows.is_empty() && batches > 0).then_some(0);
        for source in first
            .into_iter()
            .chain(file.rows.iter().map(|r| r.batch as usize))
            .chain(fills)
        {
            let Some(slot) = sources.slots.get_mut(source) else {
                return Err(ArrowError::InvalidArgumentError(format!(
                    "planned rows name change batch {source} of {batches}"
                )));
            };
            if *slot == u32::MAX {
                *slot = sources.used.len() as u32;
                sources.used.push(source);
            }
        }
        Ok(sources)
    }

    /// The slot of `source`, which [`Sources::of`] has seen.
    fn slot(&self, source: usize) -> usize {
        self.slots.get(source).map_or(0, |&s| s as usize)
    }
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
#[cfg(test)]
pub(crate) fn position_batch(
    paths: &[String],
    deletes: &[(u32, u32)],
    schema: &SchemaRef,
) -> Result<RecordBatch, ArrowError> {
    let rows: Vec<(&str, i64)> = deletes
        .iter()
        .filter_map(|(f, p)| Some((paths.get(*f as usize)?.as_str(), i64::from(*p))))
        .collect();
    position_rows(&rows, schema)
}

/// A position delete file of `rows` (path, position), sorted by path then position as the spec
/// requires.
fn position_rows(rows: &[(&str, i64)], schema: &SchemaRef) -> Result<RecordBatch, ArrowError> {
    let files: StringArray = rows.iter().map(|(f, _)| Some(*f)).collect();
    let pos: Int64Array = rows.iter().map(|(_, p)| Some(*p)).collect();
    RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(files) as ArrayRef, Arc::new(pos) as ArrayRef],
    )
}

/// Where a file sits in the table's partitioning: the spec it is written under, its partition
/// tuple in that spec, and (data files) the sort order its rows follow. A manifest entry carries
/// the tuple; the manifest listing it is one of that spec (Iceberg spec, "Manifests").
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Placement {
    pub spec_id: i32,
    pub partition: Struct,
    pub sort_order_id: Option<i32>,
}

impl Placement {
    /// Unpartitioned under spec `spec_id` (a spec without fields), unsorted.
    pub fn unpartitioned(spec_id: i32) -> Placement {
        Placement {
            spec_id,
            partition: Struct::empty(),
            sort_order_id: None,
        }
    }

    /// Where `file`, of spec `spec_id`, sits (a delete file placed with its data file takes no
    /// sort order). iceberg's `DataFile` does not expose its spec id: it is the manifest's.
    pub fn of(spec_id: i32, file: &DataFile) -> Placement {
        Placement {
            spec_id,
            partition: file.partition().clone(),
            sort_order_id: None,
        }
    }
}

/// Writes `batches` (one schema, in order) to `location` as one file and describes it as an
/// Iceberg file of `content` placed at `placement`. Encoding runs on the blocking pool.
pub(crate) async fn write_file(
    warehouse: &Warehouse,
    table: &TableId,
    location: String,
    batches: Vec<RecordBatch>,
    content: DataContentType,
    equality_ids: Option<Vec<i32>>,
    placement: &Placement,
) -> Result<DataFile, SinkError> {
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let small = encode::column_bytes(&batches) < encode::SMALL_FILE_BYTES;
    let encode = move || {
        let bounds = geometry::bounds(&batches)
            .map_err(|e| parquet::errors::ParquetError::General(e.to_string()))?;
        Ok((encode::encode_parquet(&batches)?, bounds))
    };
    // A tiny file encodes in less time than the hand-off to the blocking pool and back takes.
    let (bytes, bounds) = if small {
        encode().map_err(|source| encoding_failed(&location, source))?
    } else {
        encode_blocking(&location, encode).await?
    };
    let mut file = put(warehouse, location, bytes, rows as u64, placement).await?;
    file.content(content).equality_ids(equality_ids);
    // Only geometry columns carry bounds (`geometry.rs`): the spec's, for pruning.
    let (lower, upper) = bounds;
    file.lower_bounds(lower).upper_bounds(upper);
    describe(table, file)
}

/// Runs the encoding `work` on the blocking pool; a failure names `path`.
pub(crate) async fn encode_blocking<T: Send + 'static>(
    path: &str,
    work: impl FnOnce() -> Result<T, parquet::errors::ParquetError> + Send + 'static,
) -> Result<T, SinkError> {
    let done = tokio::task::spawn_blocking(work).await;
    match done {
        Ok(result) => result,
        Err(join) => Err(parquet::errors::ParquetError::General(format!(
            "the encoding task failed: {join}"
        ))),
    }
    .map_err(|source| encoding_failed(path, source))
}

fn encoding_failed(path: &str, source: parquet::errors::ParquetError) -> SinkError {
    SinkError::Parquet {
        context: format!("encoding {path}"),
        source,
    }
}

/// Puts the whole file `bytes` at `location`, a name no file had before (every file a commit
/// or a compaction writes is named after its id), so local disk writes it in place
/// (`storage::fresh`).
pub(crate) async fn put_bytes(
    warehouse: &Warehouse,
    location: &str,
    bytes: bytes::Bytes,
) -> Result<(), SinkError> {
    let path = warehouse.path(location)?;
    warehouse
        .store()
        .put_opts(
            &path,
            PutPayload::from_bytes(bytes),
            crate::storage::fresh(),
        )
        .await
        .map_err(|source| SinkError::Storage {
            path: location.to_owned(),
            source,
        })?;
    Ok(())
}

/// Describes the data file a [`StreamingFile`](super::encode::StreamingFile) uploaded to
/// `location` (`uploaded.size` bytes, `rows` rows) placed at `placement`, as a commit does
/// a file it encodes and puts; one with geometry columns is read back for their bounds.
pub(crate) async fn uploaded_file(
    warehouse: &Warehouse,
    table: &TableId,
    location: String,
    uploaded: super::encode::Uploaded,
    rows: u64,
    placement: &Placement,
) -> Result<DataFile, SinkError> {
    let mut file = described(location.clone(), uploaded.size, rows, placement);
    if uploaded.geometry {
        let bytes = super::manifest::read(warehouse, &location).await?;
        let (lower, upper) =
            geometry::file_bounds(&bytes).map_err(|source| SinkError::Parquet {
                context: format!("reading the geometry bounds of {location}"),
                source,
            })?;
        file.lower_bounds(lower).upper_bounds(upper);
    }
    file.content(DataContentType::Data);
    describe(table, file)
}

/// Puts `bytes` at `location`: the description of the file so far.
async fn put(
    warehouse: &Warehouse,
    location: String,
    bytes: bytes::Bytes,
    rows: u64,
    placement: &Placement,
) -> Result<DataFileBuilder, SinkError> {
    let size = bytes.len() as u64;
    put_bytes(warehouse, &location, bytes).await?;
    Ok(described(location, size, rows, placement))
}

/// The description of a file of `size` bytes and `rows` rows at `location`, so far.
fn described(location: String, size: u64, rows: u64, placement: &Placement) -> DataFileBuilder {
    let mut file = DataFileBuilder::default();
    file.file_path(location)
        .file_format(DataFileFormat::Parquet)
        .partition(placement.partition.clone())
        .partition_spec_id(placement.spec_id)
        .record_count(rows)
        .file_size_in_bytes(size);
    if let Some(order) = placement.sort_order_id {
        file.sort_order_id(order);
    }
    file
}

fn describe(table: &TableId, file: DataFileBuilder) -> Result<DataFile, SinkError> {
    file.build().map_err(|e| SinkError::Data {
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

/// Where a v2 commit's deletes apply, and where its delete files go.
pub(crate) struct V2Targets<'a> {
    /// This commit's data files, in plan order (position deletes name them by index).
    pub data_paths: &'a [String],
    pub data_placements: &'a [Placement],
    /// Where an earlier snapshot's data file sits (`None`: not a live data file).
    pub earlier_placement: &'a (dyn Fn(&str) -> Option<Placement> + Sync),
    /// The spec equality deletes are written under: one without fields, so that they apply in
    /// every partition of every spec (an equality delete of a partitioned spec applies only to
    /// data files of its own partition: Iceberg spec, "Scan Planning"), wherever the deleted
    /// row lives, a row moved by another engine's rewrite or files of an older spec included.
    pub equality_spec: i32,
    /// The location of the `n`-th position delete file.
    pub position_path: &'a (dyn Fn(usize) -> String + Sync),
    pub equality_path: String,
}

/// Format v2: the position delete files (rows superseded in this commit, in the data files at
/// `to.data_paths`, and the `earlier` rows of earlier snapshots), one per partition of the files
/// they delete from (a position delete applies only to data files of its spec and partition),
/// and the equality delete file (keys of earlier snapshots), each when needed.
pub(crate) async fn write_v2_deletes(
    warehouse: &Warehouse,
    planned: &Planned<'_>,
    earlier: &[Option<RowAddress>],
    file_schema: &arrow_schema::SchemaRef,
    to: &V2Targets<'_>,
) -> Result<Vec<(DataFile, Placement)>, SinkError> {
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
    let by_partition = position_deletes_by_partition(plan, earlier, to, table)?;
    for (n, (placement, mut rows)) in by_partition.into_iter().enumerate() {
        rows.sort_unstable();
        let batch = position_rows(&rows, &schema::position_delete_schema())
            .map_err(arrow("gathering position deletes"))?;
        let file = write_file(
            warehouse,
            table,
            (to.position_path)(n),
            vec![batch],
            DataContentType::PositionDeletes,
            None,
            &placement,
        )
        .await?;
        delete_files.push((file, placement));
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
        let placement = Placement::unpartitioned(to.equality_spec);
        let file = write_file(
            warehouse,
            table,
            to.equality_path.clone(),
            vec![batch],
            DataContentType::EqualityDeletes,
            Some(ids),
            &placement,
        )
        .await?;
        delete_files.push((file, placement));
    }
    Ok(delete_files)
}

/// Rows deleted by position, (data file, position), by the placement of their data file.
type ByPartition<'p> = Vec<(Placement, Vec<(&'p str, i64)>)>;

/// The rows a v2 commit deletes by position (superseded in this commit, and the `earlier` rows),
/// as (file, position) grouped by the placement of the data file they delete from.
fn position_deletes_by_partition<'p>(
    plan: &'p Plan,
    earlier: &'p [Option<RowAddress>],
    to: &'p V2Targets<'_>,
    table: &TableId,
) -> Result<ByPartition<'p>, SinkError> {
    let mut by_partition: Vec<(Placement, Vec<(&str, i64)>)> = Vec::new();
    fn add<'p>(
        by_partition: &mut Vec<(Placement, Vec<(&'p str, i64)>)>,
        placement: Placement,
        path: &'p str,
        pos: i64,
    ) {
        match by_partition.iter_mut().find(|(p, _)| *p == placement) {
            Some((_, rows)) => rows.push((path, pos)),
            None => by_partition.push((placement, vec![(path, pos)])),
        }
    }
    for &(f, pos) in &plan.position_deletes {
        let (Some(path), Some(placement)) = (
            to.data_paths.get(f as usize),
            to.data_placements.get(f as usize),
        ) else {
            continue;
        };
        add(&mut by_partition, placement.clone(), path, i64::from(pos));
    }
    let mut unplaced = None;
    for a in earlier.iter().flatten() {
        match (to.earlier_placement)(&a.file) {
            Some(placement) => add(
                &mut by_partition,
                placement,
                &a.file,
                i64::try_from(a.pos).unwrap_or(i64::MAX),
            ),
            None => unplaced = Some(a.file.to_string()),
        }
    }
    if let Some(file) = unplaced {
        return Err(SinkError::Data {
            table: table.clone(),
            detail: format!("deleting a row of {file}, which is not a live data file"),
        });
    }
    Ok(by_partition)
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

    /// Issue 36: a file gathered from a few of many change batches, with cells filled from
    /// another batch and from the table lookup, holds exactly its rows; a row naming a batch the
    /// commit does not have is an error, not a panic.
    #[test]
    fn a_file_gathers_from_the_batches_it_names() {
        use crate::sinks::iceberg::plan::{CellSource, Fill, RowRef};
        let changes: Vec<TableChanges> = (0..50).map(|b| inserts(b * 10, 10)).collect();
        let table = changes[0].schema.clone();
        let file_schema =
            schema::data_file_schema(&schema::iceberg_schema(&table).unwrap()).unwrap();
        let lookup = RecordBatch::try_new(
            changes[0].rows.schema(),
            vec![
                Arc::new(Int64Array::from(vec![900_i64])) as ArrayRef,
                Arc::new(StringArray::from(vec!["from the table"])) as ArrayRef,
            ],
        )
        .unwrap();
        let file = PlannedFile {
            rows: vec![RowRef { batch: 40, row: 2 }, RowRef { batch: 3, row: 5 }],
            fills: vec![
                Fill {
                    pos: 0,
                    column: 1,
                    source: CellSource::Change(RowRef { batch: 7, row: 1 }),
                },
                Fill {
                    pos: 1,
                    column: 1,
                    source: CellSource::Table(0),
                },
            ],
        };
        let got = data_batch(&changes, &file, Some(&lookup), &file_schema).unwrap();
        let ids = got.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(ids.values(), &[402, 35]);
        let states = got
            .column(1)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        // Row 1 of batch 7 is id 71: 71 % 3 = 2.
        assert_eq!(states.value(0), "sent");
        assert_eq!(states.value(1), "from the table");

        let beyond = PlannedFile {
            rows: vec![RowRef { batch: 51, row: 0 }],
            fills: Vec::new(),
        };
        assert!(data_batch(&changes, &beyond, None, &file_schema).is_err());
        let no_lookup = PlannedFile {
            rows: vec![RowRef { batch: 0, row: 0 }],
            fills: vec![Fill {
                pos: 0,
                column: 1,
                source: CellSource::Table(0),
            }],
        };
        assert!(data_batch(&changes, &no_lookup, None, &file_schema).is_err());
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
