//! Data files: one sorted run of key-value rows (`_KEY_*`, `_SEQUENCE_NUMBER`, `_VALUE_KIND`,
//! columns) encoded as Parquet, and the `DataFileMeta` that describes it in a manifest.
//!
//! Pure: batches in, bytes and metadata out (`files.rs` puts them through the
//! warehouse). Rows must arrive sorted by key with one row per key: Paimon's readers merge the
//! sorted runs of a bucket (pypaimon `SortMergeReader`) and rely on both.

use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, Int8Type};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_ord::ord::make_comparator;
use arrow_row::{RowConverter, SortField};
use arrow_schema::{ArrowError, SchemaRef, SortOptions};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use super::binary_row;
use super::manifest::{DataFileMeta, Stats};
use super::schema::{FileSchemas, KIND_DELETE};

/// A data file could not be encoded, decoded or described.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error(transparent)]
    Parquet(#[from] ParquetError),
    #[error(transparent)]
    Arrow(#[from] ArrowError),
    #[error("{0}")]
    Shape(String),
}

/// Values sampled per column to decide on a dictionary: few, since a copy writes many files and
/// each decides anew (2048 hashed values per column were 9% of the copy's CPU).
const DICTIONARY_SAMPLE_ROWS: usize = 256;

/// Parquet settings for a run whose first batch is `sample`: ZSTD level 1 (Paimon's default
/// `file.compression` is zstd), statistics per column chunk rather than per page, and dictionary
/// pages only for columns whose first values repeat. A dictionary for a mostly distinct column
/// (the key twice over, timestamps, hashes, free text) costs a hash per value until it overflows
/// and the writer falls back to plain encoding anyway: it was a fifth of the copy's CPU.
pub(super) fn writer_properties(sample: &RecordBatch) -> Result<WriterProperties, FileError> {
    let mut props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1)?))
        .set_statistics_enabled(EnabledStatistics::Chunk);
    for (field, column) in sample.schema().fields().iter().zip(sample.columns()) {
        if !field.data_type().is_nested() && mostly_distinct(column)? {
            props =
                props.set_column_dictionary_enabled(ColumnPath::from(field.name().as_str()), false);
        }
    }
    Ok(props.build())
}

/// Whether more than half of the first values of `column` are distinct.
fn mostly_distinct(column: &ArrayRef) -> Result<bool, FileError> {
    let sample = column.slice(0, column.len().min(DICTIONARY_SAMPLE_ROWS));
    if sample.len() < 2 {
        return Ok(false);
    }
    let converter = RowConverter::new(vec![SortField::new(sample.data_type().clone())])?;
    let rows = converter.convert_columns(&[sample])?;
    let mut values: Vec<&[u8]> = rows.iter().map(|r| r.data()).collect();
    values.sort_unstable();
    values.dedup();
    Ok(values.len() * 2 > rows.num_rows())
}

/// Writes one sorted run as Parquet batch by batch, keeping what its `DataFileMeta` needs, so a
/// compaction never holds the whole run decoded. The Parquet writer starts at the first batch,
/// whose values choose the column encodings ([`writer_properties`]).
pub struct RunWriter {
    writer: Option<ArrowWriter<Vec<u8>>>,
    schema: SchemaRef,
    /// Number of `_KEY_*` columns (they come first).
    keys: usize,
    seen: RunStats,
}

impl RunWriter {
    pub fn new(schemas: &FileSchemas) -> Result<RunWriter, FileError> {
        Ok(RunWriter {
            writer: None,
            schema: schemas.file.clone(),
            keys: schemas.key.len(),
            seen: RunStats {
                rows: 0,
                first: Vec::new(),
                last: Vec::new(),
                lo: Vec::new(),
                hi: Vec::new(),
                min_sequence: i64::MAX,
                max_sequence: i64::MIN,
                deletes: 0,
                schema_id: schemas.schema_id,
            },
        })
    }

    /// Appends rows that sort after every row written so far.
    pub fn write(&mut self, batch: &RecordBatch) -> Result<(), FileError> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let writer = match &mut self.writer {
            Some(w) => w,
            None => self.writer.insert(ArrowWriter::try_new(
                Vec::new(),
                self.schema.clone(),
                Some(writer_properties(batch)?),
            )?),
        };
        writer.write(batch)?;
        // Key columns come first; `_SEQUENCE_NUMBER` and `_VALUE_KIND` follow them.
        let nk = self.keys;
        let keys = batch.columns().get(..nk).unwrap_or_default();
        if self.seen.rows == 0 {
            self.seen.first = keys.iter().map(|c| c.slice(0, 1)).collect();
            self.seen.lo = self.seen.first.clone();
            self.seen.hi = self.seen.first.clone();
        }
        self.seen.last = keys.iter().map(|c| c.slice(n - 1, 1)).collect();
        // Per-column extremes: with a composite key the first and last rows bound only the first
        // column, and readers prune files by these statistics.
        for (k, col) in keys.iter().enumerate() {
            // Rows are sorted by key, so the first key column's extremes are the batch's ends.
            let (mut a, mut b) = (0, n - 1);
            if k > 0 {
                b = 0;
                let cmp = make_comparator(col.as_ref(), col.as_ref(), SortOptions::default())?;
                for i in 1..n {
                    if cmp(i, a).is_lt() {
                        a = i;
                    }
                    if cmp(i, b).is_gt() {
                        b = i;
                    }
                }
            }
            if let (Some(lo), Some(hi)) = (self.seen.lo.get_mut(k), self.seen.hi.get_mut(k)) {
                if make_comparator(col.as_ref(), lo.as_ref(), SortOptions::default())?(a, 0).is_lt()
                {
                    *lo = col.slice(a, 1);
                }
                if make_comparator(col.as_ref(), hi.as_ref(), SortOptions::default())?(b, 0).is_gt()
                {
                    *hi = col.slice(b, 1);
                }
            }
        }
        let seq = batch
            .column(nk)
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| FileError::Shape("_SEQUENCE_NUMBER is not BIGINT".into()))?;
        let kind = batch
            .column(nk + 1)
            .as_primitive_opt::<Int8Type>()
            .ok_or_else(|| FileError::Shape("_VALUE_KIND is not TINYINT".into()))?;
        for &v in seq.values() {
            self.seen.min_sequence = self.seen.min_sequence.min(v);
            self.seen.max_sequence = self.seen.max_sequence.max(v);
        }
        self.seen.deletes += kind.values().iter().filter(|&&k| k == KIND_DELETE).count();
        self.seen.rows += n;
        Ok(())
    }

    /// The encoded file and a description of it as `file_name` (the run must not be empty).
    pub fn finish(self) -> Result<(Vec<u8>, RunStats), FileError> {
        let bytes = match self.writer {
            Some(w) => w.into_inner()?,
            None => ArrowWriter::try_new(Vec::new(), self.schema, None)?.into_inner()?,
        };
        Ok((bytes, self.seen))
    }
}

/// What a [`RunWriter`] saw.
#[derive(Debug)]
pub struct RunStats {
    rows: usize,
    first: Vec<ArrayRef>,
    last: Vec<ArrayRef>,
    lo: Vec<ArrayRef>,
    hi: Vec<ArrayRef>,
    min_sequence: i64,
    max_sequence: i64,
    deletes: usize,
    schema_id: i64,
}

fn row_of(out: &mut Vec<u8>, cols: &[ArrayRef]) -> Result<(), FileError> {
    let refs: Vec<&dyn Array> = cols.iter().map(|c| c.as_ref()).collect();
    binary_row::encode(out, &refs, 0).map_err(|e| FileError::Shape(e.to_string()))
}

impl RunStats {
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The manifest description of the run stored as `file_name`.
    pub fn describe(
        &self,
        file_name: String,
        file_size: usize,
        level: i32,
        file_source: i32,
    ) -> Result<DataFileMeta, FileError> {
        if self.rows == 0 {
            return Err(FileError::Shape(
                "an empty data file has no key range".into(),
            ));
        }
        let (mut min_key, mut max_key, mut lo, mut hi) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        row_of(&mut min_key, &self.first)?;
        row_of(&mut max_key, &self.last)?;
        row_of(&mut lo, &self.lo)?;
        row_of(&mut hi, &self.hi)?;
        Ok(DataFileMeta {
            file_name,
            file_size: file_size as i64,
            row_count: self.rows as i64,
            min_key,
            max_key,
            key_stats: Stats {
                min: lo,
                max: hi,
                null_counts: vec![0; self.first.len()],
            },
            min_sequence: self.min_sequence,
            max_sequence: self.max_sequence,
            schema_id: self.schema_id,
            level,
            creation_time_ms: chrono::Utc::now().timestamp_millis(),
            delete_row_count: self.deletes as i64,
            file_source,
        })
    }
}

/// Decodes a whole data file into one batch of `schemas.file`'s shape. A file written under an
/// older schema of the table (before columns were added, dropped or widened: `_SCHEMA_ID` lower
/// than the table's) is read by column name (a renamed column by its older name,
/// `FileSchemas::aliases`): added columns read NULL, dropped ones are left out, widened ones are
/// cast (exact for the promotions a schema change allows, `schema::evolution`).
pub fn decode(data: Bytes, schemas: &FileSchemas) -> Result<RecordBatch, FileError> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(data)?
        .with_batch_size(64 * 1024)
        .build()?;
    let mut batches = Vec::new();
    for b in reader {
        batches.push(to_table_shape(&b?, schemas)?);
    }
    Ok(arrow_select::concat::concat_batches(
        &schemas.file,
        &batches,
    )?)
}

/// One batch read from a data file in `schemas.file`'s shape (see [`decode`]).
pub fn to_table_shape(b: &RecordBatch, schemas: &FileSchemas) -> Result<RecordBatch, FileError> {
    let fields = schemas.file.fields();
    let same = b.num_columns() == fields.len()
        && b.schema()
            .fields()
            .iter()
            .zip(fields)
            .all(|(a, t)| a.name() == t.name() && a.data_type() == t.data_type());
    if same {
        // Re-label with the table's schema (field nullability may differ after a round trip).
        return Ok(RecordBatch::try_new(
            schemas.file.clone(),
            b.columns().to_vec(),
        )?);
    }
    let mut columns = Vec::with_capacity(fields.len());
    for field in fields {
        let found = b.column_by_name(field.name()).or_else(|| {
            let old = schemas
                .aliases
                .iter()
                .find(|(old, now)| *now == field.name() && b.column_by_name(old).is_some())?;
            b.column_by_name(old.0)
        });
        let column = match found {
            Some(c) if c.data_type() == field.data_type() => c.clone(),
            Some(c) => arrow_cast::cast(c, field.data_type())?,
            None if field.is_nullable() => {
                arrow_array::new_null_array(field.data_type(), b.num_rows())
            }
            None => {
                return Err(FileError::Shape(format!(
                    "column {} is missing from a data file and cannot be NULL",
                    field.name()
                )))
            }
        };
        columns.push(column);
    }
    Ok(RecordBatch::try_new(schemas.file.clone(), columns)?)
}
