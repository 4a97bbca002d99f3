//! The file steps: a commit's data files (`files/writer.rs` gathers and encodes them), then its
//! deletes: on v3 one deletion vector per touched data file, merged with that file's live
//! vector, each in its own Puffin file (`deletes/`); on v2 one position delete file (rows this
//! commit superseded, and rows of earlier snapshots a keyless multiset table's deletes remove)
//! and one equality delete file (keys of earlier snapshots).

use std::collections::{BTreeMap, HashMap, HashSet};

use arrow_array::RecordBatch;
use futures::{StreamExt, TryStreamExt};
use iceberg::spec::DataContentType;

use super::{DataFiles, Deletes, Found, RowDelta};
use crate::sinks::iceberg::deletes::commit_vectors::{self, NewDvs};
use crate::sinks::iceberg::files::manifest::LiveFiles;
use crate::sinks::iceberg::files::writer::{self, Placement};
use crate::sinks::iceberg::rows::live::LiveState;
use crate::sinks::iceberg::rows::locator::RowAddress;
use crate::sinks::iceberg::schema;
use crate::sinks::SinkError;

/// Data files of one commit written at once. A partitioned commit writes one per partition its
/// rows touch (an initial copy's: hundreds of small files), and one at a time each file's
/// creation in storage waited on its encoding and the next encoding on that write; each file in
/// flight holds its gathered rows, a part of the commit's.
const DATA_WRITES_IN_FLIGHT: usize = 4;

/// Puffin files of one commit written at once: enough to hide a store's per-request latency
/// (20 to 50 ms on S3), few enough not to queue on its connections beside the other tables'
/// commits of a round.
const VECTOR_WRITES_IN_FLIGHT: usize = 8;

impl RowDelta<'_> {
    /// Writes the plan's data files, completing partial rows from `lookup`, each at its
    /// placement (`layout.rs`, in plan order).
    pub(super) async fn write_data(
        &self,
        lookup: Option<&RecordBatch>,
        placements: &[Placement],
    ) -> Result<DataFiles, SinkError> {
        let file_schema = schema::data_file_schema(self.base().current_schema())?;
        let schema_ref = &file_schema;
        let mut writes = Vec::with_capacity(self.plan.files.len());
        for (i, (f, placement)) in self.plan.files.iter().zip(placements).enumerate() {
            writes.push(async move {
                let path = self.names.data_file(i);
                let batches = writer::data_batches(self.input.changes, f, lookup, schema_ref)
                    .map_err(self.arrow("gathering data rows"))?;
                let file = writer::write_file(
                    self.target.warehouse,
                    self.table(),
                    path.clone(),
                    batches,
                    DataContentType::Data,
                    None,
                    placement,
                )
                .await?;
                Ok::<_, SinkError>((file, path))
            });
        }
        let (files, paths): (Vec<_>, Vec<_>) = futures::stream::iter(writes)
            .buffered(DATA_WRITES_IN_FLIGHT)
            .try_collect::<Vec<_>>()
            .await?
            .into_iter()
            .unzip();
        Ok(DataFiles {
            files,
            placements: placements.to_vec(),
            paths,
            schema: file_schema,
        })
    }

    /// Writes the deletes: vectors on v3, delete files on v2 (`equality_spec`: where equality
    /// deletes go, `layout.rs`).
    pub(super) async fn write_deletes(
        &self,
        live: &LiveState,
        found: &Found,
        data: &DataFiles,
        equality_spec: Option<i32>,
    ) -> Result<Deletes, SinkError> {
        if self.v3 {
            self.write_vectors(live, &found.located, data).await
        } else {
            self.write_v2_deletes(live, data, &found.located, equality_spec)
                .await
        }
    }

    /// v3: marks the `located` rows of earlier snapshots and the superseded rows of this
    /// commit's files (`data`) deleted, merges each vector with the live one it replaces and
    /// writes the vectors, each placed with its data file.
    async fn write_vectors(
        &self,
        live: &LiveState,
        located: &[Option<RowAddress>],
        data: &DataFiles,
    ) -> Result<Deletes, SinkError> {
        let (live_dvs, paths) = (&live.dvs, &data.paths);
        let table = self.table();
        let mut new_dvs = NewDvs::default();
        for addr in located.iter().flatten() {
            new_dvs.delete(table, &addr.file, addr.pos, live_dvs)?;
        }
        for &(f, pos) in &self.plan.position_deletes {
            if let Some(path) = paths.get(f as usize) {
                new_dvs.delete(table, path, u64::from(pos), live_dvs)?;
            }
        }
        new_dvs.merge_live(live_dvs);
        let replaced: HashSet<String> = new_dvs
            .dvs
            .keys()
            .filter(|f| live_dvs.contains_key(*f))
            .cloned()
            .collect();
        // One Puffin file per vector. With several blobs in one Puffin file (as Iceberg-Java
        // writes, and as the spec allows: each entry names its blob by `content_offset` and
        // `content_size_in_bytes`), DuckDB 1.5.5 applies a neighbouring blob to the wrong
        // data file: its iceberg extension takes a blob from the start of the buffer its
        // external file cache returns, which holds an earlier read of the same file
        // (duckdb-iceberg PR #1182, after 1.5.5; with `enable_external_file_cache = false` it
        // reads right; Spark and pyiceberg read the same tables right). One blob per file
        // sidesteps it at the cost of more small files, which are written concurrently (a
        // commit's latency is then about one put, not one per vector).
        let placements = placements_of(new_dvs.dvs.keys(), data, &live.files);
        let mut writes = Vec::with_capacity(new_dvs.dvs.len());
        for (i, (file, vector)) in new_dvs.dvs.iter().enumerate() {
            let Some(placement) = placements.get(file.as_str()) else {
                return Err(SinkError::Data {
                    table: table.clone(),
                    detail: format!("deleting rows of {file}, which is not a live data file"),
                });
            };
            let path = self.names.vector_file(i);
            let one = BTreeMap::from([(file.clone(), vector.clone())]);
            let warehouse = self.target.warehouse;
            writes.push(async move {
                let written =
                    commit_vectors::write_puffin(warehouse, table, &path, &one, placement).await?;
                Ok::<_, SinkError>((written, placement.spec_id))
            });
        }
        let written: Vec<_> = futures::stream::iter(writes)
            .buffered(VECTOR_WRITES_IN_FLIGHT)
            .try_collect()
            .await?;
        let mut files = Vec::with_capacity(written.len());
        let mut spec_ids = Vec::with_capacity(written.len());
        for (w, spec_id) in written {
            spec_ids.extend(w.iter().map(|_| spec_id));
            files.extend(w);
        }
        Ok(Deletes {
            files,
            spec_ids,
            deleted_rows: new_dvs.deleted,
            replaced,
            vectors: new_dvs.dvs,
        })
    }

    /// v2: the position delete files (rows this commit superseded, and the `located` rows of
    /// earlier snapshots a keyless multiset table's deletes remove), one per partition, and the
    /// equality delete file under `equality_spec`.
    async fn write_v2_deletes(
        &self,
        live: &LiveState,
        data: &DataFiles,
        located: &[Option<RowAddress>],
        equality_spec: Option<i32>,
    ) -> Result<Deletes, SinkError> {
        let plan = &self.plan;
        let earlier: Vec<&str> = located.iter().flatten().map(|a| &*a.file).collect();
        let earlier_placements = placements_of(earlier.into_iter(), data, &live.files);
        let earlier_placement = |f: &str| earlier_placements.get(f).cloned();
        let position_path = |n: usize| self.names.position_deletes_in(n);
        let files = writer::write_v2_deletes(
            self.target.warehouse,
            &writer::Planned {
                schema: self.input.schema,
                changes: self.input.changes,
                plan,
            },
            located,
            &data.schema,
            &writer::V2Targets {
                data_paths: &data.paths,
                data_placements: &data.placements,
                earlier_placement: &earlier_placement,
                equality_spec: equality_spec.unwrap_or(self.base().default_partition_spec_id()),
                position_path: &position_path,
                equality_path: self.names.equality_deletes(),
            },
        )
        .await?;
        let (files, placements): (Vec<_>, Vec<Placement>) = files.into_iter().unzip();
        Ok(Deletes {
            files,
            spec_ids: placements.iter().map(|p| p.spec_id).collect(),
            deleted_rows: (plan.position_deletes.len()
                + located.iter().flatten().count()
                + plan.equality_deletes.len()) as u64,
            ..Deletes::default()
        })
    }
}

/// Where each data file of `paths` sits: this commit's (`data`) or a live one (`live`); a path
/// that is neither is left out.
fn placements_of<'p>(
    paths: impl Iterator<Item = &'p (impl AsRef<str> + ?Sized + 'p)>,
    data: &DataFiles,
    live: &LiveFiles,
) -> HashMap<&'p str, Placement> {
    let mut wanted: HashMap<&str, Option<Placement>> = paths.map(|p| (p.as_ref(), None)).collect();
    for (path, placement) in data.paths.iter().zip(&data.placements) {
        if let Some(slot @ None) = wanted.get_mut(path.as_str()) {
            *slot = Some(placement.clone());
        }
    }
    for f in &live.data {
        if let Some(slot @ None) = wanted.get_mut(f.file.file_path()) {
            *slot = Some(f.placement());
        }
    }
    wanted
        .into_iter()
        .filter_map(|(p, placement)| Some((p, placement?)))
        .collect()
}
