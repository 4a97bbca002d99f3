//! Data files: one sorted run of key-value rows (`_KEY_*`, `_SEQUENCE_NUMBER`, `_VALUE_KIND`,
//! columns) encoded as Parquet, and the `DataFileMeta` that describes it in a manifest.
//!
//! Pure: batches in, bytes and metadata out (`commit.rs` and `compaction.rs` put them through the
//! warehouse). Rows must arrive sorted by key with one row per key: Paimon's readers merge the
//! sorted runs of a bucket (pypaimon `SortMergeReader`) and rely on both.

use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, Int8Type};
use arrow_array::{Array, RecordBatch};
use arrow_ord::ord::make_comparator;
use arrow_schema::{ArrowError, SortOptions};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::properties::WriterProperties;

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

/// Encodes a sorted run as Parquet (zstd, as Paimon's default `file.compression`).
pub fn encode(batch: &RecordBatch) -> Result<Vec<u8>, FileError> {
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1)?))
        .build();
    let mut w = ArrowWriter::try_new(Vec::new(), batch.schema(), Some(props))?;
    w.write(batch)?;
    Ok(w.into_inner()?)
}

/// Decodes a whole data file into one batch of `schemas.file`'s shape.
pub fn decode(data: Bytes, schemas: &FileSchemas) -> Result<RecordBatch, FileError> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(data)?
        .with_batch_size(64 * 1024)
        .build()?;
    let mut batches = Vec::new();
    for b in reader {
        let b = b?;
        if b.num_columns() != schemas.file.fields().len() {
            return Err(FileError::Shape(format!(
                "{} columns, the table's data files have {}",
                b.num_columns(),
                schemas.file.fields().len()
            )));
        }
        // Re-label with the table's schema (field nullability may differ after a round trip).
        batches.push(RecordBatch::try_new(
            schemas.file.clone(),
            b.columns().to_vec(),
        )?);
    }
    Ok(arrow_select::concat::concat_batches(
        &schemas.file,
        &batches,
    )?)
}

/// The manifest description of a sorted run `batch` (non-empty) stored as `file_name`.
pub fn describe(
    batch: &RecordBatch,
    schemas: &FileSchemas,
    file_name: String,
    file_size: usize,
    level: i32,
    file_source: i32,
) -> Result<DataFileMeta, FileError> {
    let n = batch.num_rows();
    if n == 0 {
        return Err(FileError::Shape(
            "an empty data file has no key range".into(),
        ));
    }
    let nk = schemas.key.len();
    let keys: Vec<&dyn Array> = batch
        .columns()
        .iter()
        .take(nk)
        .map(|c| c.as_ref())
        .collect();
    let mut min_key = Vec::new();
    let mut max_key = Vec::new();
    let bad = |e: binary_row::UnsupportedRowType| FileError::Shape(e.to_string());
    binary_row::encode(&mut min_key, &keys, 0).map_err(bad)?;
    binary_row::encode(&mut max_key, &keys, n - 1).map_err(bad)?;
    // Per-column extremes: with a composite key the first and last rows bound only the first
    // column, and readers prune files by these statistics.
    let (mut lo, mut hi) = (Vec::with_capacity(nk), Vec::with_capacity(nk));
    for col in &keys {
        let cmp = make_comparator(*col, *col, SortOptions::default())?;
        let (mut a, mut b) = (0, 0);
        for i in 1..n {
            if cmp(i, a).is_lt() {
                a = i;
            }
            if cmp(i, b).is_gt() {
                b = i;
            }
        }
        lo.push(col.slice(a, 1));
        hi.push(col.slice(b, 1));
    }
    let lo_refs: Vec<&dyn Array> = lo.iter().map(|c| c.as_ref()).collect();
    let hi_refs: Vec<&dyn Array> = hi.iter().map(|c| c.as_ref()).collect();
    let mut stats_min = Vec::new();
    let mut stats_max = Vec::new();
    binary_row::encode(&mut stats_min, &lo_refs, 0).map_err(bad)?;
    binary_row::encode(&mut stats_max, &hi_refs, 0).map_err(bad)?;
    let seq = batch
        .column(nk)
        .as_primitive_opt::<Int64Type>()
        .ok_or_else(|| FileError::Shape("_SEQUENCE_NUMBER is not BIGINT".into()))?;
    let kind = batch
        .column(nk + 1)
        .as_primitive_opt::<Int8Type>()
        .ok_or_else(|| FileError::Shape("_VALUE_KIND is not TINYINT".into()))?;
    let min_sequence = seq.values().iter().copied().min().unwrap_or(0);
    let max_sequence = seq.values().iter().copied().max().unwrap_or(0);
    let deletes = kind.values().iter().filter(|&&k| k == KIND_DELETE).count();
    Ok(DataFileMeta {
        file_name,
        file_size: file_size as i64,
        row_count: n as i64,
        min_key,
        max_key,
        key_stats: Stats {
            min: stats_min,
            max: stats_max,
            null_counts: vec![0; nk],
        },
        min_sequence,
        max_sequence,
        schema_id: 0,
        level,
        creation_time_ms: chrono::Utc::now().timestamp_millis(),
        delete_row_count: deletes as i64,
        file_source,
    })
}
