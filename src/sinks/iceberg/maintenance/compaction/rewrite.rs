//! The worker's reading and writing half: carries out one cycle's [`Choice`](super::pick::Choice)
//! on a table, as a type with one method per step (like the commit's `RowDelta`): read each chosen
//! file, drop the rows its deletion vector (v2: its deletes) deletes, and stream the kept rows into
//! target-size files (`write`; memory: one input's file bytes, [`STREAM_BATCH_ROWS`] of its rows
//! decoded, and the output's row group being encoded, the output uploaded as it is written
//! (`files/upload.rs`): an input decoded whole was a copy's compacted 15M-row file, 1.3 GB of rows
//! from 60 MB of Parquet, and an output held whole until its put up to the target size,
//! docs/performance.md). It records
//! where each input landed (`redelete::Placed`), so the commit half (`replace.rs`) can carry over
//! the deletes committed while it ran. On v3 this runs outside the table's lock (`mod.rs`).
//!
//! Rows are laid out as a streaming commit lays them out (`partitioning/`), under the table's
//! current spec and sort order: when the table has a sort order, or an output's inputs are of
//! an older spec, the output's kept rows are gathered (memory: one output's rows decoded, twice
//! while a partition's rows are taken), split by the current spec's partitions and put in the
//! sort order, one file per partition, each with the sort order's id; each row's landing place
//! is recorded (`moves::Landed::Scattered`). Otherwise the inputs are streamed one after the
//! other into their partition's file, as written.

use std::collections::HashSet;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use iceberg::spec::{DataFile, FormatVersion, TableMetadata};
use object_store::ObjectStore;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::convert;
use super::equality::V2Deletes;
use super::lineage;
use super::moves::{keep_mask, Landed, Placer};
use super::redelete::Placed;
use crate::changelog::TableId;
use crate::sinks::iceberg::commit::Names;
use crate::sinks::iceberg::deletes::deletion_vector::DeletionVector;
use crate::sinks::iceberg::files::decode::{decode, project_filled};
use crate::sinks::iceberg::files::encode::StreamingFile;
use crate::sinks::iceberg::files::manifest::{read, LiveFile};
use crate::sinks::iceberg::files::metadata::Loaded;
use crate::sinks::iceberg::files::writer::{self, Placement};
use crate::sinks::iceberg::partitioning::Layout;
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
        let layout = Layout::of(self.meta()).map_err(|e| SinkError::Data {
            table: self.table.clone(),
            detail: format!("compaction: the table's partition spec or sort order: {e}"),
        })?;
        let default_spec = self.meta().default_partition_spec_id();
        let mut written = Written::default();
        let mut files = 0usize;
        for inputs in &self.inputs {
            let lineage = |input: &Input| {
                row_ids.as_ref().map(|ids| Lineage {
                    first_row_id: ids.get(input.file.file.file_path()).copied(),
                    schema: Arc::clone(&out_schema),
                })
            };
            let respec = inputs.iter().any(|i| i.file.spec_id != default_spec);
            if layout.sort_order_id.is_some() || respec {
                let mut read = Vec::with_capacity(inputs.len());
                for input in inputs {
                    read.push(
                        self.read_live(input, &file_schema, &projection, lineage(input))
                            .await?,
                    );
                }
                let laid = LaidOut {
                    layout: &layout,
                    schema: &out_schema,
                    key_names,
                };
                self.write_laid_out(&laid, inputs, read, &mut files, &mut written)
                    .await?;
                continue;
            }
            let path = self.names.data_file(files);
            files += 1;
            let mut out: Option<StreamingFile> = None;
            let mut keys = Vec::new();
            let mut end = 0u64;
            for input in inputs {
                let streamed = self
                    .stream_live(input, &file_schema, &projection, lineage(input), end)
                    .into(&path, out, key_names)
                    .await?;
                written.dropped_rows += streamed.dropped;
                let f = &input.file;
                written.placed.push(Placed {
                    input: f.file.file_path().to_owned(),
                    rows: f.file.record_count(),
                    landed: Landed::Together {
                        output: path.clone(),
                        start: end,
                    },
                    used: streamed.used,
                });
                end = streamed.end;
                written.removed_data.push(f.file.clone());
                keys.extend(streamed.keys);
                out = streamed.out;
            }
            let Some(file) = out else {
                continue;
            };
            let placement = self.placement(inputs)?;
            let output = self.finish(path, file, end, placement, keys).await?;
            written.outputs.push(output);
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

    /// Writes the kept rows `read` of `inputs` (one output of the choice) laid out as `laid`
    /// says: split by the current spec's partitions, each partition's rows in the sort order,
    /// one file each, named from `files` on; records where every kept row landed.
    async fn write_laid_out(
        &self,
        laid: &LaidOut<'_>,
        inputs: &[Input],
        read: Vec<ReadInput>,
        files: &mut usize,
        written: &mut Written,
    ) -> Result<(), SinkError> {
        let batches: Vec<&RecordBatch> = read.iter().flat_map(|r| &r.kept).collect();
        let all = arrow_select::concat::concat_batches(laid.schema, batches)
            .map_err(self.arrow("gathering rows"))?;
        let columns = all
            .project(laid.layout.columns())
            .map_err(self.arrow("gathering partition and sort columns"))?;
        let parts = laid.layout.arrange(&columns).map_err(|e| SinkError::Data {
            table: self.table.clone(),
            detail: format!("compaction: partitioning rows: {e}"),
        })?;
        // Row `r` of `all` lands in output `landed[r].0` at position `landed[r].1`.
        let mut landed = vec![(0u32, 0u32); all.num_rows()];
        let mut paths = Vec::with_capacity(parts.len());
        for (k, part) in parts.into_iter().enumerate() {
            let k = u32::try_from(k).map_err(|_| self.too_many())?;
            for (position, &r) in part.rows.iter().enumerate() {
                let position = u32::try_from(position).map_err(|_| self.too_many())?;
                if let Some(slot) = landed.get_mut(r as usize) {
                    *slot = (k, position);
                }
            }
            let indices = arrow_array::UInt32Array::from(part.rows);
            let rows = arrow_select::take::take_record_batch(&all, &indices)
                .map_err(self.arrow("ordering rows"))?;
            let path = self.names.data_file(*files);
            *files += 1;
            paths.push(path.clone());
            let keys = match laid.key_names {
                Some(names) => {
                    key_columns(std::slice::from_ref(&rows), names).map_err(self.arrow("keys"))?
                }
                None => Vec::new(),
            };
            let count = rows.num_rows() as u64;
            let Some(file) = encode(self.warehouse, &path, None, vec![rows]).await? else {
                continue;
            };
            let placement = Placement {
                spec_id: laid.layout.spec.spec_id(),
                partition: part.partition,
                sort_order_id: laid.layout.sort_order_id,
            };
            let output = self.finish(path, file, count, placement, keys).await?;
            written.outputs.push(output);
        }
        let mut from = 0usize;
        for (input, r) in inputs.iter().zip(read) {
            let kept: usize = r.kept.iter().map(RecordBatch::num_rows).sum();
            let f = &input.file;
            written.dropped_rows += r.dropped;
            written.placed.push(Placed {
                input: f.file.file_path().to_owned(),
                rows: f.file.record_count(),
                landed: Landed::Scattered {
                    outputs: paths.clone(),
                    at: landed.get(from..from + kept).unwrap_or_default().to_vec(),
                },
                used: r.used,
            });
            from += kept;
            written.removed_data.push(f.file.clone());
        }
        Ok(())
    }

    /// Finishes the output `file` of `rows` rows, puts it at `path` and describes it.
    async fn finish(
        &self,
        path: String,
        file: StreamingFile,
        rows: u64,
        placement: Placement,
        keys: Vec<RecordBatch>,
    ) -> Result<Output, SinkError> {
        let uploaded = writer::encode_blocking(&path, move || file.finish()).await?;
        let file = writer::uploaded_file(
            self.warehouse,
            self.table,
            path.clone(),
            uploaded,
            rows,
            &placement,
        )
        .await?;
        Ok(Output {
            path,
            file,
            placement,
            keys,
        })
    }

    fn too_many(&self) -> SinkError {
        SinkError::Data {
            table: self.table.clone(),
            detail: "compaction: more than 2^32 rows in one output".into(),
        }
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
    /// reader projects it), with their lineage columns on v3 (`lineage`): all of them at once, for
    /// an output laid out anew (`write_laid_out`).
    async fn read_live(
        &self,
        input: &Input,
        file_schema: &SchemaRef,
        projection: &schema::Projection,
        lineage: Option<Lineage>,
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
        let mut live = LiveRows {
            placer: Placer::new(dv.as_ref(), 0),
            position: 0,
            dropped: 0,
            file_schema,
            projection,
            lineage: lineage.as_ref(),
            sequence: f.sequence,
        };
        let mut kept = Vec::new();
        for batch in batches {
            let rows = live.of(&batch).map_err(self.arrow("projecting"))?;
            if rows.num_rows() > 0 {
                kept.push(rows);
            }
        }
        let dropped = live.dropped;
        Ok(ReadInput {
            kept,
            dropped,
            used: dv,
        })
    }

    /// [`read_live`](Self::read_live) of `input` as a stream into an output (see
    /// [`StreamLive::into`]): its file is read, and on v2 the vector of its deleted rows is found
    /// from its key columns alone.
    fn stream_live<'s>(
        &'s self,
        input: &'s Input,
        file_schema: &SchemaRef,
        projection: &schema::Projection,
        lineage: Option<Lineage>,
        start: u64,
    ) -> StreamLive<'s> {
        StreamLive {
            rewrite: self,
            input,
            file_schema: Arc::clone(file_schema),
            projection: projection.clone(),
            lineage,
            start,
        }
    }
}

/// Rows decoded at a time when an input is streamed into its output.
pub(crate) const STREAM_BATCH_ROWS: usize = 8192;

/// One input on its way into an output file ([`Rewrite::stream_live`]).
struct StreamLive<'s> {
    rewrite: &'s Rewrite<'s>,
    input: &'s Input,
    file_schema: SchemaRef,
    projection: schema::Projection,
    lineage: Option<Lineage>,
    start: u64,
}

/// What streaming one input into an output left.
struct Streamed {
    /// The output, opened at the first kept row.
    out: Option<StreamingFile>,
    /// The key columns of the kept rows, in order (when asked).
    keys: Vec<RecordBatch>,
    dropped: u64,
    /// The output position after its last kept row.
    end: u64,
    /// The vector applied.
    used: Option<DeletionVector>,
}

impl StreamLive<'_> {
    /// Appends the input's kept rows to the output `out` at `path` (opened at the first kept row),
    /// decoding [`STREAM_BATCH_ROWS`] rows at a time and encoding them before the next, on the
    /// blocking pool; keeps the key columns `key_names` of the kept rows.
    async fn into(
        self,
        path: &str,
        out: Option<StreamingFile>,
        key_names: Option<&[String]>,
    ) -> Result<Streamed, SinkError> {
        let f = &self.input.file;
        let location = f.file.file_path().to_owned();
        let bytes = read(self.rewrite.warehouse, &location).await?;
        let v2 = match &self.rewrite.v2 {
            Some(deletes) => {
                let names = deletes.key_names();
                let keys = if names.is_empty() {
                    Vec::new()
                } else {
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    decode(&bytes, &location, Some(&names))?
                };
                deletes.vector(&location, f.sequence, &keys)?
            }
            None => None,
        };
        let dv = v2.or_else(|| self.input.dv.clone());
        let table = self.rewrite.table.clone();
        let output = path.to_owned();
        let store = Arc::clone(self.rewrite.warehouse.store());
        let output_path = self.rewrite.warehouse.path(path)?;
        let key_names = key_names.map(<[String]>::to_vec);
        let sequence = f.sequence;
        let start = self.start;
        let (file_schema, projection, lineage) = (self.file_schema, self.projection, self.lineage);
        writer::encode_blocking(path, move || {
            Ok(stream_rows(StreamRows {
                table: &table,
                location: &location,
                output: &output,
                store: &store,
                output_path,
                bytes,
                dv,
                start,
                out,
                key_names: key_names.as_deref(),
                file_schema: &file_schema,
                projection: &projection,
                lineage: lineage.as_ref(),
                sequence,
            }))
        })
        .await?
    }
}

/// What [`stream_rows`] streams: the input `bytes` (a Parquet file at `location`), its vector
/// `dv`, its first output position `start`, into `out` at `output`.
struct StreamRows<'a> {
    table: &'a TableId,
    location: &'a str,
    output: &'a str,
    /// Where the output is uploaded (`output` as a path of `store`).
    store: &'a Arc<dyn ObjectStore>,
    output_path: object_store::path::Path,
    bytes: bytes::Bytes,
    dv: Option<DeletionVector>,
    start: u64,
    out: Option<StreamingFile>,
    key_names: Option<&'a [String]>,
    file_schema: &'a SchemaRef,
    projection: &'a schema::Projection,
    lineage: Option<&'a Lineage>,
    /// The input's data sequence number.
    sequence: i64,
}

/// The blocking half of [`StreamLive::into`].
fn stream_rows(s: StreamRows<'_>) -> Result<Streamed, SinkError> {
    let reading = |source| SinkError::Parquet {
        context: format!("reading {}", s.location),
        source,
    };
    let encoding = |source| SinkError::Parquet {
        context: format!("encoding {}", s.output),
        source,
    };
    let arrow = |what: &str| {
        let context = format!("compacting {} ({what})", s.table);
        move |source| SinkError::Arrow { context, source }
    };
    let batches = ParquetRecordBatchReaderBuilder::try_new(s.bytes)
        .map_err(reading)?
        .with_batch_size(STREAM_BATCH_ROWS)
        .build()
        .map_err(reading)?;
    let mut live = LiveRows {
        placer: Placer::new(s.dv.as_ref(), s.start),
        position: 0,
        dropped: 0,
        file_schema: s.file_schema,
        projection: s.projection,
        lineage: s.lineage,
        sequence: s.sequence,
    };
    let mut out = s.out;
    let mut keys = Vec::new();
    for batch in batches {
        let batch = batch.map_err(arrow("reading"))?;
        let rows = live.of(&batch).map_err(arrow("projecting"))?;
        if rows.num_rows() == 0 {
            continue;
        }
        if let Some(names) = s.key_names {
            keys.extend(key_columns(std::slice::from_ref(&rows), names).map_err(arrow("keys"))?);
        }
        let file = match out.as_mut() {
            Some(file) => file,
            None => out.insert(
                StreamingFile::new(s.store, s.output_path.clone(), &rows).map_err(encoding)?,
            ),
        };
        file.write(&rows).map_err(encoding)?;
    }
    let (dropped, end) = (live.dropped, live.placer.end());
    Ok(Streamed {
        out,
        keys,
        dropped,
        end,
        used: s.dv,
    })
}

/// One input's decoded batches, one after the other, as the rows its vector keeps.
struct LiveRows<'a> {
    placer: Placer<'a>,
    /// The input position of the next batch's first row.
    position: u64,
    dropped: u64,
    file_schema: &'a SchemaRef,
    projection: &'a schema::Projection,
    lineage: Option<&'a Lineage>,
    /// The input's data sequence number (its rows' last-updated sequence when unset, v3).
    sequence: i64,
}

impl LiveRows<'_> {
    /// The kept rows of `batch`, the input's next: in the current file schema, with their
    /// lineage columns on v3.
    fn of(&mut self, batch: &RecordBatch) -> Result<RecordBatch, arrow_schema::ArrowError> {
        let placed = self.placer.next_batch(batch.num_rows());
        let mut columns = project_filled(batch, self.file_schema, self.projection)?;
        let schema = match self.lineage {
            Some(l) => {
                columns.extend(lineage::columns(
                    batch,
                    self.position,
                    l.first_row_id,
                    self.sequence,
                ));
                Arc::clone(&l.schema)
            }
            None => Arc::clone(self.file_schema),
        };
        self.position += batch.num_rows() as u64;
        let whole = RecordBatch::try_new(schema, columns)?;
        let live = arrow_select::filter::filter_record_batch(&whole, &keep_mask(&placed))?;
        self.dropped += (batch.num_rows() - live.num_rows()) as u64;
        Ok(live)
    }
}

/// How `Rewrite::write_laid_out` lays an output's rows out.
struct LaidOut<'a> {
    layout: &'a Layout,
    /// The rows' schema (the file schema, with the lineage columns on v3).
    schema: &'a SchemaRef,
    key_names: Option<&'a [String]>,
}

/// An input's row lineage to carry (v3): its first row id, and the output schema with the
/// lineage columns.
struct Lineage {
    first_row_id: Option<u64>,
    schema: SchemaRef,
}

/// Appends `batches` to the output file at `path` (opened at its first batch), on the blocking
/// pool: encoding is CPU work the runtime's workers should not do, and the file uploads as it is
/// written (`files/upload.rs`).
async fn encode(
    warehouse: &Warehouse,
    path: &str,
    out: Option<StreamingFile>,
    batches: Vec<RecordBatch>,
) -> Result<Option<StreamingFile>, SinkError> {
    if batches.is_empty() {
        return Ok(out);
    }
    let (store, at) = (Arc::clone(warehouse.store()), warehouse.path(path)?);
    writer::encode_blocking(path, move || {
        let mut file = match (out, batches.first()) {
            (Some(f), _) => f,
            (None, Some(first)) => StreamingFile::new(&store, at, first)?,
            (None, None) => return Ok(None),
        };
        for b in &batches {
            file.write(b)?;
        }
        Ok(Some(file))
    })
    .await
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
