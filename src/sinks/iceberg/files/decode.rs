//! Reading a Parquet file back: decoded into batches ([`decode`]), its columns matched to a
//! schema by name or field id ([`project`], [`project_filled`]). Shared by the lookup of current
//! rows, the primary-key index, position delete files, multiset deletes and compaction; it sits
//! below them (beside `encode.rs`) so none of them imports another for it.

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{ArrowError, SchemaRef};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;

use crate::sinks::iceberg::schema::Projection;
use crate::sinks::SinkError;

/// Decodes a Parquet file, only the top-level `columns` when given.
pub(crate) fn decode(
    bytes: &Bytes,
    location: &str,
    columns: Option<&[&str]>,
) -> Result<Vec<RecordBatch>, SinkError> {
    let parquet = |source| SinkError::Parquet {
        context: format!("reading {location}"),
        source,
    };
    let mut builder = ParquetRecordBatchReaderBuilder::try_new(bytes.clone()).map_err(parquet)?;
    if let Some(columns) = columns {
        let roots: Vec<usize> = columns
            .iter()
            .filter_map(|c| builder.schema().index_of(c).ok())
            .collect();
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
        builder = builder.with_projection(mask);
    }
    builder
        .build()
        .map_err(parquet)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| SinkError::Arrow {
            context: format!("reading {location}"),
            source,
        })
}

/// The columns of `batch` named like `schema`'s fields, cast to their types (a file written
/// before a type promotion holds the narrower type), matched by name: for key columns and
/// delete files, which are never renamed. A column the file lacks reads NULL.
pub(crate) fn project(
    batch: &RecordBatch,
    schema: &SchemaRef,
) -> Result<Vec<ArrayRef>, ArrowError> {
    project_filled(batch, schema, &Projection::default())
}

/// [`project`], a file column found by its field id ([`Projection`]: a renamed column under its
/// new name) and a column the file lacks reading its field's initial default rather than NULL:
/// what the table's readers see there.
pub(crate) fn project_filled(
    batch: &RecordBatch,
    schema: &SchemaRef,
    projection: &Projection,
) -> Result<Vec<ArrayRef>, ArrowError> {
    let n = batch.num_rows();
    let file = batch.schema();
    schema
        .fields()
        .iter()
        .map(|f| {
            let found = file
                .fields()
                .iter()
                .position(|c| projection.current_name(c) == Some(f.name().as_str()));
            match found {
                Some(i) => {
                    crate::sinks::iceberg::geometry::read_back(batch.column(i), file.field(i), f)
                }
                None => match projection.default_of(f.name()) {
                    Some(text) => {
                        let texts = arrow_array::StringArray::from(vec![text; n]);
                        let exact = arrow_cast::CastOptions {
                            safe: false,
                            ..Default::default()
                        };
                        arrow_cast::cast_with_options(&texts, f.data_type(), &exact)
                    }
                    None => Ok(arrow_array::new_null_array(f.data_type(), n)),
                },
            }
        })
        .collect()
}
