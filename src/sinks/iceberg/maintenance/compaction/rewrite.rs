//! The worker: carries out one cycle's [`Choice`](super::pick::Choice) on a table, as a type with
//! one method per step (like the commit's `RowDelta`): read each chosen file, drop the rows its
//! deletion vector (v2: its deletes) deletes, stream the kept rows into target-size files
//! (`write`; memory: one input decoded plus the output encoded), carry the
//! parent's manifests without the replaced files and their vectors (`carry`), write the new data
//! manifest and the manifest list and build the `replace` snapshot (`stage`). Publishing and the
//! index update are the driver's (`mod.rs`), under the table's slot lock.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use iceberg::spec::{
    DataContentType, DataFile, FormatVersion, ManifestContentType, ManifestFile, Snapshot,
    TableMetadata,
};

use super::equality::V2Deletes;
use super::moves::{keep_mask, Placer};
use super::pick::Choice;
use super::summary::{self, Replaced};
use crate::changelog::TableId;
use crate::checkpoint::Checkpoint;
use crate::failpoints;
use crate::sinks::iceberg::commit::manifest_list::{self, ListTarget};
use crate::sinks::iceberg::commit::publish;
use crate::sinks::iceberg::commit::Names;
use crate::sinks::iceberg::encode::StreamingFile;
use crate::sinks::iceberg::live::LiveState;
use crate::sinks::iceberg::lookup::{decode, project_filled};
use crate::sinks::iceberg::manifest::{self, read, LiveFile, ManifestTarget};
use crate::sinks::iceberg::metadata::Loaded;
use crate::sinks::iceberg::{schema, writer};
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// One output file written: where, its entry, and (when the table's index follows) the key
/// columns of its rows in position order.
pub(crate) struct Output {
    pub path: String,
    pub file: DataFile,
    pub keys: Vec<RecordBatch>,
}

/// What the rewrite wrote and removed, for the snapshot and the report.
#[derive(Default)]
pub(crate) struct Written {
    pub outputs: Vec<Output>,
    pub removed_data: Vec<DataFile>,
    /// Rows dropped because their deletion vector deleted them.
    pub dropped_rows: u64,
}

/// The parent's manifests as the rewrite's snapshot keeps them (`Rewrite::carry`).
#[derive(Default)]
pub(crate) struct Carried {
    pub manifests: Vec<ManifestFile>,
    /// Delete files left out of rewritten manifests.
    pub removed_deletes: Vec<DataFile>,
    /// Rewritten manifests: old path → new path (`None`: nothing was left).
    pub rewritten: HashMap<String, Option<Arc<str>>>,
}

/// What `Rewrite::stage` wrote: the metadata to publish, the manifest list as written and the
/// new data manifest (for the cached live state).
pub(crate) struct Staged {
    pub next: TableMetadata,
    pub listed: Vec<ManifestFile>,
    pub added_manifest: Option<Arc<str>>,
}

/// One compaction of one table, on the current snapshot of `base`.
pub(crate) struct Rewrite<'a> {
    pub warehouse: &'a Warehouse,
    pub table: &'a TableId,
    pub base: Arc<Loaded>,
    pub live: &'a LiveState,
    /// The chosen files, by output (indexes into `live.files.data`).
    pub choice: Choice,
    pub names: Names,
    /// Format v2: the position and equality deletes the rewritten rows must not escape
    /// (`equality.rs`); `None` on v3, whose vectors are in `live`.
    pub v2: Option<V2Deletes>,
    /// v2: delete files the rewrite makes useless, dropped with it.
    pub dropped_deletes: HashSet<String>,
}

impl Rewrite<'_> {
    fn meta(&self) -> &TableMetadata {
        &self.base.metadata
    }

    pub fn chosen(&self) -> impl Iterator<Item = &LiveFile> + '_ {
        self.choice
            .inputs()
            .filter_map(|i| self.live.files.data.get(i))
    }

    /// Reads the chosen files and writes their live rows, one output file per output of the
    /// choice (an output with no live row writes nothing), streaming: one input's rows are held
    /// at a time, encoded into the output on the blocking pool. `key_names`: the key columns to
    /// keep for the primary-key index, when it follows.
    pub async fn write(&self, key_names: Option<&[String]>) -> Result<Written, SinkError> {
        let file_schema = schema::data_file_schema(self.meta().current_schema())?;
        // Rows of files older than an added column read its initial default, and a rewrite
        // stores what they read (the new file has the column).
        let projection = schema::Projection::of(self.meta().current_schema());
        let mut written = Written::default();
        for (n, inputs) in self.choice.outputs.iter().enumerate() {
            let path = self.names.data_file(n);
            let mut out: Option<StreamingFile> = None;
            let mut keys = Vec::new();
            let mut end = 0u64;
            for f in inputs.iter().filter_map(|&i| self.live.files.data.get(i)) {
                let (kept, dropped, next) =
                    self.read_live(f, &file_schema, &projection, end).await?;
                written.dropped_rows += dropped;
                end = next;
                written.removed_data.push(f.file.clone());
                if let Some(names) = key_names {
                    keys.extend(key_columns(&kept, names).map_err(self.arrow("keys"))?);
                }
                out = encode(&path, out, kept).await?;
            }
            let Some(file) = out else {
                continue;
            };
            let bytes = blocking(&path, move || file.finish()).await?;
            let file = writer::put_file(
                self.warehouse,
                self.table,
                path.clone(),
                bytes,
                end,
                DataContentType::Data,
                None,
            )
            .await?;
            written.outputs.push(Output { path, file, keys });
        }
        Ok(written)
    }

    fn arrow(&self, what: &str) -> impl FnOnce(arrow_schema::ArrowError) -> SinkError {
        let context = format!("compacting {} ({what})", self.table);
        move |source| SinkError::Arrow { context, source }
    }

    /// The rows of `f` its deletion vector keeps, in the table's current file schema (a file
    /// written before a column was added reads its `initial-default` there, or NULL, as every
    /// reader projects it), placed from output position `start`. Returns them, the rows dropped
    /// and the next position.
    async fn read_live(
        &self,
        f: &LiveFile,
        file_schema: &SchemaRef,
        projection: &schema::Projection,
        start: u64,
    ) -> Result<(Vec<RecordBatch>, u64, u64), SinkError> {
        let path = f.file.file_path();
        let bytes = read(self.warehouse, path).await?;
        let batches = decode(&bytes, path, None)?;
        drop(bytes);
        let v2 = match &self.v2 {
            Some(deletes) => deletes.vector(path, f.sequence, &batches)?,
            None => None,
        };
        let dv = v2.as_ref().or(self.live.dvs.get(path).map(|d| &d.dv));
        let mut placer = Placer::new(dv, start);
        let mut kept = Vec::new();
        let mut dropped = 0u64;
        for batch in batches {
            let placed = placer.next_batch(batch.num_rows());
            let columns = project_filled(&batch, file_schema, projection)
                .map_err(self.arrow("projecting"))?;
            let whole = RecordBatch::try_new(Arc::clone(file_schema), columns)
                .map_err(self.arrow("projecting"))?;
            let mask = keep_mask(&placed);
            let live = arrow_select::filter::filter_record_batch(&whole, &mask)
                .map_err(self.arrow("dropping deleted rows"))?;
            dropped += (batch.num_rows() - live.num_rows()) as u64;
            if live.num_rows() > 0 {
                kept.push(live);
            }
        }
        Ok((kept, dropped, placer.end()))
    }

    fn manifest_target(&self, deletes: bool, spec_id: i32) -> Result<ManifestTarget, SinkError> {
        let meta = self.meta();
        let spec = meta
            .partition_spec_by_id(spec_id)
            .ok_or_else(|| SinkError::Data {
                table: self.table.clone(),
                detail: format!("partition spec {spec_id} is not in the table"),
            })?;
        Ok(ManifestTarget {
            version: meta.format_version(),
            schema: meta.current_schema().clone(),
            spec: spec.clone(),
            snapshot_id: self.names.snapshot_id,
            deletes,
        })
    }

    /// The parent's manifests as the new snapshot keeps them: those listing a replaced data file,
    /// a vector of one or (v2) a dropped delete file are rewritten without those entries
    /// (omitted, as the commit omits replaced vectors: `manifest::rewrite_manifest` says why).
    pub async fn carry(&self) -> Result<Carried, SinkError> {
        let replaced: HashSet<&str> = self.chosen().map(|f| f.file.file_path()).collect();
        let mut touched: HashSet<&str> = self.chosen().map(|f| &*f.manifest).collect();
        for path in &replaced {
            if let Some(dv) = self.live.dvs.get(*path) {
                touched.insert(&dv.entry.manifest);
            }
        }
        let files = &self.live.files;
        for f in files.position_deletes.iter().chain(&files.equality_deletes) {
            if self.dropped_deletes.contains(f.file.file_path()) {
                touched.insert(&f.manifest);
            }
        }
        let dropped = &self.dropped_deletes;
        let mut carried = Carried::default();
        for (i, m) in self.live.manifests.iter().enumerate() {
            if !touched.contains(m.manifest_path.as_str()) {
                if m.has_added_files() || m.has_existing_files() {
                    carried.manifests.push(m.clone());
                }
                continue;
            }
            let deletes = m.content == ManifestContentType::Deletes;
            let target = self.manifest_target(deletes, m.partition_spec_id)?;
            let path = self.names.rewritten_manifest(i);
            let (rewritten, removed) =
                manifest::rewrite_manifest(self.warehouse, path, &target, m, |f| {
                    match f.content_type() {
                        DataContentType::Data => replaced.contains(f.file_path()),
                        DataContentType::PositionDeletes => {
                            dropped.contains(f.file_path())
                                || f.referenced_data_file()
                                    .is_some_and(|r| replaced.contains(r.as_str()))
                        }
                        DataContentType::EqualityDeletes => dropped.contains(f.file_path()),
                    }
                })
                .await?;
            if deletes {
                carried.removed_deletes.extend(removed);
            }
            carried.rewritten.insert(
                m.manifest_path.clone(),
                rewritten
                    .as_ref()
                    .map(|r| Arc::from(r.manifest_path.as_str())),
            );
            carried.manifests.extend(rewritten);
        }
        Ok(carried)
    }

    /// Writes the new data manifest and the manifest list, and returns the metadata naming the
    /// `replace` snapshot (not published). `checkpoint`: the one the snapshot carries.
    pub async fn stage(
        &self,
        written: &Written,
        carried: &mut Carried,
        checkpoint: Option<&Checkpoint>,
    ) -> Result<Staged, SinkError> {
        let meta = self.meta();
        let added: Vec<DataFile> = written.outputs.iter().map(|o| o.file.clone()).collect();
        let mut manifests = Vec::with_capacity(carried.manifests.len() + 1);
        let mut added_manifest = None;
        if !added.is_empty() {
            let target = self.manifest_target(false, meta.default_partition_spec_id())?;
            manifests.push(
                manifest::write_manifest(
                    self.warehouse,
                    self.names.added_manifest(0),
                    &target,
                    self.names.sequence,
                    added.clone(),
                )
                .await?,
            );
        }
        if let Some(m) = manifests.first() {
            added_manifest = Some(Arc::from(m.manifest_path.as_str()));
        }
        manifests.append(&mut carried.manifests);
        let list_path = self.names.manifest_list();
        let parent = meta.current_snapshot();
        let list = ListTarget {
            version: meta.format_version(),
            snapshot_id: self.names.snapshot_id,
            parent: parent.map(|s| s.snapshot_id()),
            sequence: self.names.sequence,
            first_row_id: meta.next_row_id(),
        };
        let (added_rows, listed) =
            manifest_list::write_manifest_list(self.warehouse, &list_path, &list, manifests)
                .await?;
        failpoints::crash_point(failpoints::COMPACT_BEFORE_COMMIT);
        let summary = summary::summary(
            &Replaced {
                added: &added,
                removed_data: &written.removed_data,
                removed_deletes: &carried.removed_deletes,
            },
            parent.map(|s| s.as_ref()),
            checkpoint,
            self.warehouse.lease_epoch(),
        );
        // v3 row lineage (Iceberg spec, "Row Lineage"): the rewritten rows get fresh row ids
        // from `next-row-id` like any added rows; the spec asks a rewrite to copy `_row_id` into
        // the new files instead, which cdcd's writer does not do yet (docs/internals.md).
        let builder = Snapshot::builder()
            .with_snapshot_id(self.names.snapshot_id)
            .with_parent_snapshot_id(parent.map(|s| s.snapshot_id()))
            .with_sequence_number(self.names.sequence)
            .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
            .with_manifest_list(list_path)
            .with_summary(summary)
            .with_schema_id(meta.current_schema_id());
        let snapshot = if meta.format_version() >= FormatVersion::V3 {
            builder
                .with_row_range(list.first_row_id, added_rows)
                .build()
        } else {
            builder.build()
        };
        Ok(Staged {
            next: publish::with_snapshot(self.table, &self.base, snapshot)?,
            listed,
            added_manifest,
        })
    }
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
