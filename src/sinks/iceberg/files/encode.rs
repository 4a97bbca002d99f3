//! Parquet encoding of one data or delete file: its settings and its columns encoded in
//! parallel.
//!
//! The settings ([`writer_properties`]) favour write speed, since an initial copy competes with
//! the source database for the CPU: ZSTD at level 1, dictionary pages only for columns whose
//! first values repeat (hashing every value of a key or hash column into a dictionary that then
//! overflows cost ~7% of the copy's commit thread), and statistics per column chunk (what
//! readers prune row groups with), not per page.
//!
//! Left as they are, measured for issue 7 (1M rows of the `bench/pg_snapshot.py` table, pyarrow
//! on the same zstd library): ZSTD level 1 costs ~0.15 CPU-s per 1M rows over no compression and
//! halves the files (62 → 28 MB); Snappy and LZ4 are no faster on this data and ~1.8× larger,
//! ZSTD level -1 saves ~0.08 s for files 40% larger. Most of the compression time goes to
//! high-entropy text (an md5 column), which no codec makes cheap. DELTA_BINARY_PACKED for integer
//! and timestamp columns would spare compressing them (~0.05 s per 1M rows), but Iceberg's
//! vectorized Spark reader only reads that encoding since Iceberg 1.10 (apache/iceberg#13391),
//! so the files keep PLAIN encoding that every reader takes.
//!
//! Columns are encoded in parallel ([`encode_parquet`]). An initial copy commits in the
//! background while the source reads on, one commit at a time, and its commits ran back to back
//! with the commit thread mostly compressing columns one after another (~230 ms per 250k-row
//! commit of the `bench/pg_snapshot.py` table, half of it encoding) while a core stood partly
//! idle. The parquet crate's column writers are independent until their chunks are appended to
//! the row group in schema order, so each row group's leaf columns are shared out over a few
//! scoped threads, largest first, and appended in order afterwards: the file is byte for byte
//! what one `ArrowWriter` writes.
//!
//! Tiny files ([`SMALL_FILE_BYTES`]) are written on the calling thread. A commit of moving
//! updates on a table partitioned by day writes one file per day a row moves into, hundreds of
//! one- or two-row files a second (issue 36), and per file the threads spawned to share out the
//! columns cost more than encoding the rows. They stay compressed like every other file: written
//! uncompressed, a tiny file could be more than twice the bytes of a compressed file of as many
//! rows, and compaction's size tiers (`maintenance/compaction/pick.rs`) then left the table's small
//! files in place (`catalog::rest::a_rewrite_by_another_engine_is_built_upon`, equality deletes).

use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_row::{RowConverter, SortField};
use bytes::Bytes;
use object_store::path::Path;
use object_store::ObjectStore;
use parquet::arrow::arrow_writer::{
    compute_leaves, ArrowColumnChunk, ArrowColumnWriter, ArrowLeafColumn,
};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use super::upload::Upload;
use crate::sinks::iceberg::geometry;
use crate::sinks::iceberg::variant_shredding::{self, Shredding};

/// More encoding threads than this gain little: the largest column bounds a row group's time.
const MAX_ENCODING_THREADS: usize = 8;

/// Values sampled per column to decide on a dictionary.
const DICTIONARY_SAMPLE_ROWS: usize = 2048;

/// Files whose columns hold less than this (Arrow bytes) are tiny: written on
/// one thread (the module doc says why).
pub(crate) const SMALL_FILE_BYTES: usize = 64 * 1024;

/// The Arrow bytes of `batches`' columns (their slices, not the buffers they share).
pub(crate) fn column_bytes(batches: &[RecordBatch]) -> usize {
    batches
        .iter()
        .flat_map(RecordBatch::columns)
        .map(|c| c.to_data().get_slice_memory_size().unwrap_or(usize::MAX))
        .fold(0, usize::saturating_add)
}

/// Parquet settings for a file of `sample`'s schema (the module doc says why these).
fn writer_properties(sample: &RecordBatch) -> WriterProperties {
    writer_properties_with(
        sample,
        Compression::ZSTD(ZstdLevel::try_new(1).unwrap_or_default()),
    )
}

/// [`writer_properties`] with `compression`.
fn writer_properties_with(sample: &RecordBatch, compression: Compression) -> WriterProperties {
    let mut props = WriterProperties::builder()
        .set_compression(compression)
        .set_statistics_enabled(EnabledStatistics::Chunk);
    for (field, column) in sample.schema().fields().iter().zip(sample.columns()) {
        if !field.data_type().is_nested() && mostly_distinct(column) {
            props =
                props.set_column_dictionary_enabled(ColumnPath::from(field.name().as_str()), false);
        }
    }
    props.build()
}

/// Whether more than half of the first values of `column` are distinct. A dictionary for such a
/// column (keys, timestamps, hashes, free text) costs a hash per value until it overflows and the
/// writer falls back to plain encoding anyway; one that repeats (a status, a small range) keeps it.
fn mostly_distinct(column: &ArrayRef) -> bool {
    let sample = column.slice(0, column.len().min(DICTIONARY_SAMPLE_ROWS));
    if sample.len() < 2 {
        return false;
    }
    let Ok(converter) = RowConverter::new(vec![SortField::new(sample.data_type().clone())]) else {
        return false;
    };
    let Ok(rows) = converter.convert_columns(&[sample]) else {
        return false;
    };
    let distinct: HashSet<&[u8]> = rows.iter().map(|r| r.data()).collect();
    distinct.len() * 2 > rows.num_rows()
}

/// Encodes `batches` (one schema) as one Parquet file, with the settings of
/// [`writer_properties`] and its variant columns shredded (`variant_shredding.rs`); a tiny file
/// ([`SMALL_FILE_BYTES`]) on this thread.
pub(crate) fn encode_parquet(batches: &[RecordBatch]) -> Result<Bytes, ParquetError> {
    let Some(first) = batches.first() else {
        return Err(ParquetError::General(
            "a Parquet file needs at least one batch".into(),
        ));
    };
    let shredded = variant_shredding::shred(batches)?;
    if column_bytes(&shredded) < SMALL_FILE_BYTES {
        return encode_with(&shredded, writer_properties(first), 1);
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, NonZeroUsize::get)
        .min(MAX_ENCODING_THREADS);
    encode_with(&shredded, writer_properties(first), threads)
}

/// A Parquet file written batch by batch and uploaded as it is written (`upload.rs`), with the
/// settings of [`writer_properties`] chosen from the first batch: what a compaction writes, so it
/// holds one input's rows at a time and the row group being encoded, not every row of the output
/// decoded nor the whole file encoded. Columns are encoded one after another (a background
/// rewrite does not need [`encode_parquet`]'s parallel columns). Written on the blocking pool
/// (`writer::encode_blocking`): each write may upload a part.
pub(crate) struct StreamingFile {
    writer: ArrowWriter<Upload>,
    shredding: Shredding,
    geometry: bool,
}

/// A [`StreamingFile`] uploaded.
pub(crate) struct Uploaded {
    pub size: u64,
    /// The file has geometry columns (whose bounds are read back from it).
    pub geometry: bool,
}

impl StreamingFile {
    /// A file of `sample`'s schema at `path` of `store`, its variant columns shredded as
    /// `sample` picks.
    pub(crate) fn new(
        store: &Arc<dyn ObjectStore>,
        path: Path,
        sample: &RecordBatch,
    ) -> Result<StreamingFile, ParquetError> {
        let shredding = Shredding::pick(sample)?;
        let schema = shredding.apply(&sample.slice(0, 0))?.schema();
        let geometry = geometry::has_geometry(&schema);
        let upload = Upload::new(store, path)?;
        let writer = ArrowWriter::try_new(upload, schema, Some(writer_properties(sample)))?;
        Ok(StreamingFile {
            writer,
            shredding,
            geometry,
        })
    }

    /// Appends `batch` (the file's schema).
    pub(crate) fn write(&mut self, batch: &RecordBatch) -> Result<(), ParquetError> {
        self.writer.write(&self.shredding.apply(batch)?)
    }

    /// Writes the footer and completes the upload.
    pub(crate) fn finish(self) -> Result<Uploaded, ParquetError> {
        let size = self.writer.into_inner()?.complete()?;
        Ok(Uploaded {
            size,
            geometry: self.geometry,
        })
    }
}

/// Encodes `batches` with `props`: row groups of at most `props`' row count, in order, each
/// one's columns encoded in parallel on up to `threads` threads.
fn encode_with(
    batches: &[RecordBatch],
    props: WriterProperties,
    threads: usize,
) -> Result<Bytes, ParquetError> {
    let Some(first) = batches.first() else {
        return Err(ParquetError::General(
            "a Parquet file needs at least one batch".into(),
        ));
    };
    let schema = first.schema();
    let max_rows = props.max_row_group_row_count().unwrap_or(usize::MAX).max(1);
    // The ArrowWriter builds the Parquet schema (field ids included) and the embedded Arrow
    // schema exactly as it would for a sequential write; only the row groups are ours to fill.
    let (mut file, factory) =
        ArrowWriter::try_new(Vec::new(), schema.clone(), Some(props))?.into_serialized_writer()?;
    for (index, group) in row_groups(batches, max_rows).iter().enumerate() {
        let writers = factory.create_column_writers(index)?;
        let mut leaves: Vec<Vec<ArrowLeafColumn>> = writers.iter().map(|_| Vec::new()).collect();
        let mut weights = vec![0usize; writers.len()];
        for batch in group {
            let mut leaf = 0;
            for (field, column) in schema.fields().iter().zip(batch.columns()) {
                let bytes = column.to_data().get_slice_memory_size().unwrap_or(0);
                let field_leaves = compute_leaves(field, column)?;
                let share = bytes / field_leaves.len().max(1);
                for l in field_leaves {
                    if let (Some(list), Some(w)) = (leaves.get_mut(leaf), weights.get_mut(leaf)) {
                        list.push(l);
                        *w += share;
                    }
                    leaf += 1;
                }
            }
        }
        let chunks = encode_columns(writers, leaves, &weights, threads)?;
        let mut row_group = file.next_row_group()?;
        for chunk in chunks {
            chunk.append_to_row_group(&mut row_group)?;
        }
        row_group.close()?;
    }
    Ok(Bytes::from(file.into_inner()?))
}

/// `batches` cut into row groups of at most `max_rows` rows (zero-copy slices), empty batches
/// dropped.
fn row_groups(batches: &[RecordBatch], max_rows: usize) -> Vec<Vec<RecordBatch>> {
    let mut groups: Vec<Vec<RecordBatch>> = Vec::new();
    let mut rows_in_last = max_rows;
    for batch in batches {
        let mut offset = 0;
        while offset < batch.num_rows() {
            if rows_in_last == max_rows {
                groups.push(Vec::new());
                rows_in_last = 0;
            }
            let take = (batch.num_rows() - offset).min(max_rows - rows_in_last);
            if let Some(group) = groups.last_mut() {
                group.push(batch.slice(offset, take));
            }
            rows_in_last += take;
            offset += take;
        }
    }
    groups
}

/// Writes each leaf column's arrays with its writer, the columns shared out over up to `threads`
/// threads (largest `weights` first, each to the least loaded thread), and returns the closed
/// chunks in column order.
fn encode_columns(
    writers: Vec<ArrowColumnWriter>,
    leaves: Vec<Vec<ArrowLeafColumn>>,
    weights: &[usize],
    threads: usize,
) -> Result<Vec<ArrowColumnChunk>, ParquetError> {
    let mut order: Vec<usize> = (0..writers.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(weights.get(i).copied().unwrap_or(0)));
    let mut shares: Vec<(usize, Vec<usize>)> =
        vec![(0, Vec::new()); threads.clamp(1, writers.len().max(1))];
    for i in order {
        if let Some(least) = shares.iter_mut().min_by_key(|(load, _)| *load) {
            least.0 += weights.get(i).copied().unwrap_or(0);
            least.1.push(i);
        }
    }
    let mut work: Vec<Option<(ArrowColumnWriter, Vec<ArrowLeafColumn>)>> =
        writers.into_iter().zip(leaves).map(Some).collect();
    let mut jobs: Vec<Vec<(usize, ArrowColumnWriter, Vec<ArrowLeafColumn>)>> = shares
        .into_iter()
        .map(|(_, columns)| {
            columns
                .into_iter()
                .filter_map(|i| {
                    work.get_mut(i)
                        .and_then(Option::take)
                        .map(|(w, l)| (i, w, l))
                })
                .collect()
        })
        .collect();
    let own = jobs.pop().unwrap_or_default();
    let mut done: Vec<(usize, ArrowColumnChunk)> = Vec::new();
    std::thread::scope(|scope| -> Result<(), ParquetError> {
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|job| scope.spawn(move || encode_share(job)))
            .collect();
        done.extend(encode_share(own)?);
        for handle in handles {
            let chunks = handle
                .join()
                .map_err(|_| ParquetError::General("a column encoding thread panicked".into()))??;
            done.extend(chunks);
        }
        Ok(())
    })?;
    done.sort_by_key(|(i, _)| *i);
    Ok(done.into_iter().map(|(_, chunk)| chunk).collect())
}

/// One thread's columns: every array written, then the writer closed into its chunk.
fn encode_share(
    job: Vec<(usize, ArrowColumnWriter, Vec<ArrowLeafColumn>)>,
) -> Result<Vec<(usize, ArrowColumnChunk)>, ParquetError> {
    let mut chunks = Vec::with_capacity(job.len());
    for (i, mut writer, leaves) in job {
        for leaf in &leaves {
            writer.write(leaf)?;
        }
        chunks.push((i, writer.close()?));
    }
    Ok(chunks)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, ListArray, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    use super::*;

    fn batch(first: i64, n: usize) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new(
                "tags",
                DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
                true,
            ),
        ]));
        let ids: Vec<i64> = (first..first + n as i64).collect();
        let names: StringArray = ids
            .iter()
            .map(|i| (i % 7 != 0).then(|| format!("name-{i}")))
            .collect();
        let tags = ListArray::from_iter_primitive::<arrow_array::types::Int64Type, _, _>(
            ids.iter().map(|i| Some(vec![Some(*i), None])),
        );
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(ids)),
                Arc::new(names),
                Arc::new(tags),
            ],
        )
        .unwrap()
    }

    /// Columns encoded in parallel, row groups cut across batch boundaries: the same bytes as
    /// one `ArrowWriter` writing the batches in order.
    #[test]
    fn parallel_columns_write_what_the_arrow_writer_writes() {
        let big = batch(0, 5000);
        let batches = vec![big.slice(0, 1200), big.slice(1200, 3000), batch(9000, 800)];
        let props = || {
            WriterProperties::builder()
                .set_max_row_group_row_count(Some(1000))
                .set_compression(Compression::ZSTD(ZstdLevel::default()))
                .build()
        };
        let ours = encode_with(&batches, props(), 4).unwrap();
        let mut writer = ArrowWriter::try_new(Vec::new(), big.schema(), Some(props())).unwrap();
        for b in &batches {
            writer.write(b).unwrap();
        }
        let theirs = writer.into_inner().unwrap();
        assert_eq!(ours.as_ref(), theirs.as_slice());

        let reader = ParquetRecordBatchReaderBuilder::try_new(ours).unwrap();
        assert_eq!(reader.metadata().num_row_groups(), 5);
        let read: Vec<RecordBatch> = reader.build().unwrap().map(|b| b.unwrap()).collect();
        let read = arrow_select::concat::concat_batches(&read[0].schema(), &read).unwrap();
        let expected = arrow_select::concat::concat_batches(&big.schema(), &batches).unwrap();
        assert_eq!(read, expected);
    }

    /// Issue 36: a tiny file (one thread) and a larger one (columns shared out) are both
    /// compressed with ZSTD (compaction's size tiers compare their bytes) and read back equal to
    /// their rows.
    #[test]
    fn tiny_files_are_compressed_like_the_others() {
        let codecs = |bytes: &Bytes| {
            let reader = ParquetRecordBatchReaderBuilder::try_new(bytes.clone()).unwrap();
            let meta = reader.metadata().clone();
            let read: Vec<RecordBatch> = reader.build().unwrap().map(|b| b.unwrap()).collect();
            let codecs: Vec<Compression> = meta
                .row_groups()
                .iter()
                .flat_map(|g| g.columns().iter().map(|c| c.compression()))
                .collect();
            (codecs, read)
        };
        let tiny = batch(0, 2);
        assert!(column_bytes(std::slice::from_ref(&tiny)) < SMALL_FILE_BYTES);
        let (used, read) = codecs(&encode_parquet(std::slice::from_ref(&tiny)).unwrap());
        assert!(
            used.iter().all(|c| matches!(c, Compression::ZSTD(_))),
            "{used:?}"
        );
        assert_eq!(read, vec![tiny]);

        let large = batch(0, 20_000);
        assert!(column_bytes(std::slice::from_ref(&large)) >= SMALL_FILE_BYTES);
        let (used, read) = codecs(&encode_parquet(std::slice::from_ref(&large)).unwrap());
        assert!(
            used.iter().all(|c| matches!(c, Compression::ZSTD(_))),
            "{used:?}"
        );
        let read = arrow_select::concat::concat_batches(&large.schema(), &read).unwrap();
        assert_eq!(read, large);
    }

    #[test]
    fn row_groups_cut_at_the_limit_and_skip_empty_batches() {
        let b = batch(0, 10);
        let groups = row_groups(&[b.slice(0, 0), b.slice(0, 7), b.slice(7, 3)], 4);
        let sizes: Vec<Vec<usize>> = groups
            .iter()
            .map(|g| g.iter().map(RecordBatch::num_rows).collect())
            .collect();
        assert_eq!(sizes, vec![vec![4], vec![3, 1], vec![2]]);
        assert!(row_groups(&[b.slice(0, 0)], 4).is_empty());
    }
}
