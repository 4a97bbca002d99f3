//! File writer: carries out a [`Plan`](super::plan::Plan) — materializes each planned data file
//! from the change batches (absent cells filled from earlier changes or the table lookup), and
//! builds the equality delete file (key columns) and the position delete file (`file_path`, `pos`),
//! each encoded as Parquet with Iceberg field ids and put through the warehouse store.
//!
//! Rows are gathered column by column with `interleave` over the change batches, so no row is
//! copied one value at a time; types are then cast to the file schema (Int16 → int, time zones →
//! `+00:00`, list element field ids).

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{ArrowError, SchemaRef};
use bytes::Bytes;
use iceberg::spec::{DataContentType, DataFile, DataFileBuilder, DataFileFormat, Struct};
use object_store::{ObjectStoreExt, PutPayload};
use parquet::arrow::{ArrowWriter, PARQUET_FIELD_ID_META_KEY};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use super::plan::{CellSource, KeyRef, Plan, PlannedFile};
use super::schema;
use crate::changelog::{TableChanges, TableId, TableSchema};
use crate::sinks::SinkError;
use crate::storage::Warehouse;

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

/// Encodes `batch` as one Parquet file (zstd).
pub(crate) fn encode_parquet(batch: &RecordBatch) -> Result<Bytes, parquet::errors::ParquetError> {
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build();
    let mut writer = ArrowWriter::try_new(Vec::new(), batch.schema(), Some(props))?;
    writer.write(batch)?;
    Ok(Bytes::from(writer.into_inner()?))
}

/// Writes `batch` to `location` and describes it as an Iceberg file of `content`.
pub(crate) async fn write_file(
    warehouse: &Warehouse,
    table: &TableId,
    location: String,
    batch: &RecordBatch,
    content: DataContentType,
    equality_ids: Option<Vec<i32>>,
) -> Result<DataFile, SinkError> {
    let bytes = encode_parquet(batch).map_err(|source| SinkError::Parquet {
        context: format!("encoding {location}"),
        source,
    })?;
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
        .record_count(batch.num_rows() as u64)
        .file_size_in_bytes(size)
        .equality_ids(equality_ids)
        .build()
        .map_err(|e| SinkError::Data {
            table: table.clone(),
            detail: format!("describing a written file: {e}"),
        })
}

/// Format v2: the position delete file (rows superseded in this commit) and the equality
/// delete file (keys of earlier snapshots).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn write_v2_deletes(
    warehouse: &Warehouse,
    delete_files: &mut Vec<DataFile>,
    schema: &TableSchema,
    changes: &[TableChanges],
    plan: &Plan,
    paths: &[String],
    file_schema: &arrow_schema::SchemaRef,
    location: &str,
    commit_id: uuid::Uuid,
) -> Result<(), SinkError> {
    let table = &schema.id;
    let arrow = |what: &str| {
        let context = format!("{what} of {table}");
        move |source| SinkError::Arrow { context, source }
    };
    if !plan.position_deletes.is_empty() {
        let batch = position_batch(
            paths,
            &plan.position_deletes,
            &schema::position_delete_schema(),
        )
        .map_err(arrow("gathering position deletes"))?;
        let path = format!("{location}/data/{commit_id}-pos-deletes.parquet");
        delete_files.push(
            write_file(
                warehouse,
                table,
                path,
                &batch,
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
        let path = format!("{location}/data/{commit_id}-eq-deletes.parquet");
        delete_files.push(
            write_file(
                warehouse,
                table,
                path,
                &batch,
                DataContentType::EqualityDeletes,
                Some(ids),
            )
            .await?,
        );
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::sinks::iceberg::schema::position_delete_schema;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    #[test]
    fn position_deletes_carry_reserved_field_ids() {
        let paths = vec![
            "file:///a/0.parquet".to_owned(),
            "file:///a/1.parquet".to_owned(),
        ];
        let b = position_batch(&paths, &[(0, 3), (1, 0)], &position_delete_schema()).unwrap();
        let bytes = encode_parquet(&b).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes).unwrap();
        let fields = reader.parquet_schema().root_schema().get_fields();
        assert_eq!(fields[0].get_basic_info().id(), 2147483546);
        assert_eq!(fields[1].get_basic_info().id(), 2147483545);
        let got = reader.build().unwrap().next().unwrap().unwrap();
        assert_eq!(got.num_rows(), 2);
    }
}
