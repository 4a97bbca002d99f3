//! The worker's reading and writing half: carries out one cycle's [`Choice`](super::pick::Choice)
//! on a table, as a type with one method per step (like the commit's `RowDelta`): read each chosen
//! file, drop the rows its deletion vector (v2: its deletes) deletes, and stream the kept rows into
//! target-size files (`write`; memory: one input decoded plus the output encoded). It records
//! where each input landed (`redelete::Placed`), so the commit half (`replace.rs`) can carry over
//! the deletes committed while it ran. On v3 this runs outside the table's lock (`mod.rs`).

use std::collections::HashSet;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use iceberg::spec::{DataContentType, DataFile, FormatVersion, TableMetadata};

use super::convert;
use super::equality::V2Deletes;
use super::lineage;
use super::moves::{keep_mask, Placer};
use super::redelete::Placed;
use crate::changelog::TableId;
use crate::sinks::iceberg::commit::Names;
use crate::sinks::iceberg::deletes::deletion_vector::DeletionVector;
use crate::sinks::iceberg::files::decode::{decode, project_filled};
use crate::sinks::iceberg::files::encode::StreamingFile;
use crate::sinks::iceberg::files::manifest::{read, LiveFile};
use crate::sinks::iceberg::files::metadata::Loaded;
use crate::sinks::iceberg::files::writer::{self, Placement};
use crate::sinks::iceberg::schema;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// One output file written: where, its entry, and (when the table's index follows) the key
/// columns of its rows in position order.
pub(crate) struct Output {
    pub path: String,
    pub file: DataFile,
    /// Where it sits: where its inputs did.
    pub placement: Placement,
    pub keys: Vec<RecordBatch>,
}

/// What the rewrite wrote and removed, for the snapshot and the report.
#[derive(Default)]
pub(crate) struct Written {
    pub outputs: Vec<Output>,
    pub removed_data: Vec<DataFile>,
    /// Rows dropped because their deletion vector deleted them.
    pub dropped_rows: u64,
    /// Where each input's rows went, with the vector applied to it.
    pub placed: Vec<Placed>,
    /// v2: the position delete file of the rows the live deletes delete in `Rewrite::staying`
    /// (`convert.rs`), when any is.
    pub converted: Option<DataFile>,
}

/// One chosen data file with the deletion vector it had when chosen (v3; `None` on v2, whose
/// deletes `V2Deletes` applies, or when none of its rows is deleted).
pub(crate) struct Input {
    pub file: LiveFile,
    pub dv: Option<DeletionVector>,
}

/// One input as `Rewrite::read_live` read it.
struct ReadInput {
    /// Its live rows, in the file schema.
    kept: Vec<RecordBatch>,
    /// Rows its vector deleted.
    dropped: u64,
    /// The output position after its last kept row.
    end: u64,
    /// The vector applied.
    used: Option<DeletionVector>,
}

/// The reading and writing of one compaction of one table, chosen on the current snapshot of
/// `base`.
pub(crate) struct Rewrite<'a> {
    pub warehouse: &'a Warehouse,
    pub table: &'a TableId,
    pub base: Arc<Loaded>,
    /// The chosen files, by output.
    pub inputs: Vec<Vec<Input>>,
    pub names: Names,
    /// Format v2: the position and equality deletes the rewritten rows must not escape
    /// (`equality.rs`); `None` on v3, whose vectors are in `inputs`.
    pub v2: Option<V2Deletes>,
    /// Format v2: the data files an equality delete applies to that the rewrite leaves in
    /// place; their deleted rows become one position delete file (`convert.rs`).
    pub staying: Vec<LiveFile>,
}

impl Rewrite<'_> {
    fn meta(&self) -> &TableMetadata {
        &self.base.metadata
    }

    /// Reads the chosen files and writes their live rows, one output file per output of the
    /// choice (an output with no live row writes nothing), streaming: one input's rows are held
    /// at a time, encoded into the output on the blocking pool. `key_names`: the key columns to
    /// keep for the primary-key index, when it follows.
    pub async fn write(&self, key_names: Option<&[String]>) -> Result<Written, SinkError> {
        let file_schema = schema::data_file_schema(self.meta().current_schema())?;
        // v3: the rows keep their lineage (`lineage.rs`), written beside the table's columns.
        let row_ids = if self.meta().format_version() >= FormatVersion::V3 {
            let paths: HashSet<&str> = self
                .inputs
                .iter()
                .flatten()
                .map(|i| i.file.file.file_path())
                .collect();
            Some(lineage::first_row_ids(self.warehouse, self.meta(), &paths).await?)
        } else {
            None
        };
        let out_schema = match &row_ids {
            Some(_) => {
                let mut fields: Vec<_> = file_schema.fields().iter().cloned().collect();
                fields.extend(lineage::fields().map(Arc::new));
                Arc::new(Schema::new_with_metadata(
                    fields,
                    file_schema.metadata().clone(),
                ))
            }
            None => Arc::clone(&file_schema),
        };
        // Rows of files older than an added column read its initial default, and a rewrite
        // stores what they read (the new file has the column).
        let projection = schema::Projection::of(self.meta().current_schema());
        let mut written = Written::default();
        for (n, inputs) in self.inputs.iter().enumerate() {
            let path = self.names.data_file(n);
            let mut out: Option<StreamingFile> = None;
            let mut keys = Vec::new();
            let mut end = 0u64;
            for input in inputs {
                let lineage = row_ids.as_ref().map(|ids| Lineage {
                    first_row_id: ids.get(input.file.file.file_path()).copied(),
                    schema: Arc::clone(&out_schema),
                });
                let read = self
                    .read_live(input, &file_schema, &projection, lineage, end)
                    .await?;
                let kept = read.kept;
                written.dropped_rows += read.dropped;
                let f = &input.file;
                written.placed.push(Placed {
                    input: f.file.file_path().to_owned(),
                    rows: f.file.record_count(),
                    output: path.clone(),
                    start: end,
                    used: read.used,
                });
                end = read.end;
                written.removed_data.push(f.file.clone());
                if let Some(names) = key_names {
                    keys.extend(key_columns(&kept, names).map_err(self.arrow("keys"))?);
                }
                out = encode(&path, out, kept).await?;
            }
            let Some(file) = out else {
                continue;
            };
            let placement = self.placement(inputs)?;
            let bytes = blocking(&path, move || file.finish()).await?;
            let file = writer::put_file(
                self.warehouse,
                self.table,
                path.clone(),
                bytes,
                end,
                DataContentType::Data,
                None,
                &placement,
            )
            .await?;
            written.outputs.push(Output {
                path,
                file,
                placement,
                keys,
            });
        }
        if let (Some(deletes), false) = (&self.v2, self.staying.is_empty()) {
            written.converted = convert::write_positions(
                self.warehouse,
                self.table,
                deletes,
                &self.staying,
                self.names.position_deletes(),
            )
            .await?;
        }
        Ok(written)
    }

    /// Where the output of `inputs` sits: where they all do (the pick groups files by spec and
    /// partition, `pick.rs`; an output never mixes partitions, so a mixed group is refused).
    fn placement(&self, inputs: &[Input]) -> Result<Placement, SinkError> {
        let mut placements = inputs.iter().map(|i| i.file.placement());
        let first = placements
            .next()
            .unwrap_or_else(|| Placement::unpartitioned(self.meta().default_partition_spec_id()));
        if placements.any(|p| p != first) {
            return Err(SinkError::Data {
                table: self.table.clone(),
                detail: "compaction chose files of different partitions for one output".into(),
            });
        }
        Ok(first)
    }

    fn arrow(&self, what: &str) -> impl FnOnce(arrow_schema::ArrowError) -> SinkError {
        let context = format!("compacting {} ({what})", self.table);
        move |source| SinkError::Arrow { context, source }
    }

    /// The rows of `input` its deletion vector keeps, in the table's current file schema (a file
    /// written before a column was added reads its `initial-default` there, or NULL, as every
    /// reader projects it), with their lineage columns on v3 (`lineage`), placed from output
    /// position `start`.
    async fn read_live(
        &self,
        input: &Input,
        file_schema: &SchemaRef,
        projection: &schema::Projection,
        lineage: Option<Lineage>,
        start: u64,
    ) -> Result<ReadInput, SinkError> {
        let f = &input.file;
        let path = f.file.file_path();
        let bytes = read(self.warehouse, path).await?;
        let batches = decode(&bytes, path, None)?;
        drop(bytes);
        let v2 = match &self.v2 {
            Some(deletes) => deletes.vector(path, f.sequence, &batches)?,
            None => None,
        };
        let dv = v2.or_else(|| input.dv.clone());
        let mut placer = Placer::new(dv.as_ref(), start);
        let mut kept = Vec::new();
        let mut dropped = 0u64;
        let mut position = 0u64;
        for batch in batches {
            let placed = placer.next_batch(batch.num_rows());
            let mut columns = project_filled(&batch, file_schema, projection)
                .map_err(self.arrow("projecting"))?;
            let schema = match &lineage {
                Some(l) => {
                    columns.extend(lineage::columns(
                        &batch,
                        position,
                        l.first_row_id,
                        f.sequence,
                    ));
                    Arc::clone(&l.schema)
                }
                None => Arc::clone(file_schema),
            };
            position += batch.num_rows() as u64;
            let whole = RecordBatch::try_new(schema, columns).map_err(self.arrow("projecting"))?;
            let mask = keep_mask(&placed);
            let live = arrow_select::filter::filter_record_batch(&whole, &mask)
                .map_err(self.arrow("dropping deleted rows"))?;
            dropped += (batch.num_rows() - live.num_rows()) as u64;
            if live.num_rows() > 0 {
                kept.push(live);
            }
        }
        Ok(ReadInput {
            kept,
            dropped,
            end: placer.end(),
            used: dv,
        })
    }
}

/// An input's row lineage to carry (v3): its first row id, and the output schema with the
/// lineage columns.
struct Lineage {
    first_row_id: Option<u64>,
    schema: SchemaRef,
}

/// Appends `batches` to the output file at `path` (opened at its first batch), on the blocking
/// pool: encoding is CPU work the runtime's workers should not do.
async fn encode(
    path: &str,
    out: Option<StreamingFile>,
    batches: Vec<RecordBatch>,
) -> Result<Option<StreamingFile>, SinkError> {
    let Some(first) = batches.first() else {
        return Ok(out);
    };
    let mut file = match out {
        Some(f) => f,
        None => StreamingFile::new(first).map_err(|source| SinkError::Parquet {
            context: format!("encoding {path}"),
            source,
        })?,
    };
    blocking(path, move || {
        for b in &batches {
            file.write(b)?;
        }
        Ok(file)
    })
    .await
    .map(Some)
}

/// Runs `work` on the blocking pool; a failure names `path`.
async fn blocking<T: Send + 'static>(
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
    .map_err(|source| SinkError::Parquet {
        context: format!("encoding {path}"),
        source,
    })
}

/// The columns named `names` of `batches` (all of them: the keys of every kept row, in order).
fn key_columns(
    batches: &[RecordBatch],
    names: &[String],
) -> Result<Vec<RecordBatch>, arrow_schema::ArrowError> {
    batches
        .iter()
        .map(|b| {
            let indices: Vec<usize> = names
                .iter()
                .map(|n| b.schema().index_of(n))
                .collect::<Result<_, _>>()?;
            b.project(&indices)
        })
        .collect()
}
