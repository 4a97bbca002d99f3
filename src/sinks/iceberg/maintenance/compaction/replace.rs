//! The worker's committing half: the `replace` snapshot of a rewrite (`rewrite.rs`), built on the
//! snapshot the compaction commits on, which is the one it chose on or (v3) a newer one that
//! streaming commits made while it ran. One method per step: carry the base's manifests without
//! the replaced files and their vectors (`carry`), write the vectors that carry over the deletes
//! committed meanwhile (`write_vectors`, `redelete.rs`), write the new manifests and the manifest
//! list and build the snapshot (`stage`). Publishing and the index update are the driver's
//! (`mod.rs`), under the table's slot lock.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use iceberg::spec::{
    DataContentType, DataFile, FormatVersion, ManifestContentType, ManifestFile, Snapshot,
    TableMetadata,
};

use super::rewrite::Written;
use super::summary::{self, Replaced};
use crate::changelog::TableId;
use crate::checkpoint::Checkpoint;
use crate::failpoints;
use crate::sinks::iceberg::commit::manifest_list::{self, ListTarget};
use crate::sinks::iceberg::commit::merge::MERGE_CAP_BYTES;
use crate::sinks::iceberg::commit::publish;
use crate::sinks::iceberg::commit::Names;
use crate::sinks::iceberg::deletes::commit_vectors;
use crate::sinks::iceberg::deletes::deletion_vector::DeletionVector;
use crate::sinks::iceberg::files::manifest::{self, ManifestTarget};
use crate::sinks::iceberg::files::metadata::Loaded;
use crate::sinks::iceberg::maintenance::properties::{Merging, DEFAULT_MANIFEST_TARGET_SIZE_BYTES};
use crate::sinks::iceberg::rows::live::LiveState;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// The base's manifests as the `replace` snapshot keeps them (`Replace::carry`).
#[derive(Default)]
pub(crate) struct Carried {
    pub manifests: Vec<ManifestFile>,
    /// Delete files left out of rewritten manifests.
    pub removed_deletes: Vec<DataFile>,
    /// Rewritten manifests: old path → new path (`None`: nothing was left).
    pub rewritten: HashMap<String, Option<Arc<str>>>,
}

/// The vectors the `replace` snapshot adds to its outputs (`Replace::write_vectors`).
#[derive(Default)]
pub(crate) struct CarriedVectors {
    /// One delete-file entry per vector, and the vector, by output data file.
    pub vectors: BTreeMap<String, (DataFile, DeletionVector)>,
}

impl CarriedVectors {
    pub fn entries(&self) -> Vec<DataFile> {
        self.vectors.values().map(|(f, _)| f.clone()).collect()
    }
}

/// The manifests [`Replace::carry`] rewrites, packed into bins of one kind (data or deletes)
/// and one spec of about `commit.manifest.target-size-bytes` each, in list order.
struct TouchedBins<'a> {
    target_size: u64,
    /// Closed and open bins, with their open bin's bytes, per kind and spec.
    bins: Vec<Vec<&'a ManifestFile>>,
    open: HashMap<(bool, i32), (usize, u64)>,
}

impl<'a> TouchedBins<'a> {
    fn new(target_size: u64) -> Self {
        TouchedBins {
            target_size,
            bins: Vec::new(),
            open: HashMap::new(),
        }
    }

    fn add(&mut self, m: &'a ManifestFile) {
        let kind = (
            m.content == ManifestContentType::Deletes,
            m.partition_spec_id,
        );
        let length = u64::try_from(m.manifest_length).unwrap_or(0);
        match self.open.get_mut(&kind) {
            Some((at, bytes)) if bytes.saturating_add(length) <= self.target_size => {
                *bytes = bytes.saturating_add(length);
                if let Some(bin) = self.bins.get_mut(*at) {
                    bin.push(m);
                }
            }
            _ => {
                self.open.insert(kind, (self.bins.len(), length));
                self.bins.push(vec![m]);
            }
        }
    }

    fn into_bins(self) -> Vec<Vec<&'a ManifestFile>> {
        self.bins
    }
}

/// What `Replace::stage` wrote: the metadata to publish, the manifest list as written and the
/// new manifests (for the cached live state).
pub(crate) struct Staged {
    pub next: TableMetadata,
    pub listed: Vec<ManifestFile>,
    pub added_manifest: Option<Arc<str>>,
    pub vectors_manifest: Option<Arc<str>>,
}

/// The `replace` snapshot of one rewrite on top of the current snapshot of `base`.
pub(crate) struct Replace<'a> {
    pub warehouse: &'a Warehouse,
    pub table: &'a TableId,
    pub base: Arc<Loaded>,
    /// The state of `base`'s current snapshot.
    pub live: &'a LiveState,
    /// Names for a snapshot on `base` (the rewrite's files keep the names they were written at).
    pub names: Names,
    /// The data files replaced.
    pub replaced: HashSet<String>,
    /// v2: delete files the rewrite makes useless, dropped with it.
    pub dropped_deletes: HashSet<String>,
    /// v2: the outputs' data sequence number (`equality.rs`); `None`: the new snapshot's.
    pub data_sequence: Option<i64>,
}

impl Replace<'_> {
    fn meta(&self) -> &TableMetadata {
        &self.base.metadata
    }

    /// The data sequence number of the files written.
    pub fn data_sequence(&self) -> i64 {
        self.data_sequence.unwrap_or(self.names.sequence)
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

    /// `commit.manifest.target-size-bytes` of the base (its default when unreadable: the
    /// property's error is reported by the commits that merge).
    fn manifest_target_size(&self) -> u64 {
        Merging::from_properties(self.meta().properties())
            .map(|m| m.target_size_bytes)
            .unwrap_or(DEFAULT_MANIFEST_TARGET_SIZE_BYTES)
    }

    /// The base's manifests as the new snapshot keeps them: those listing a replaced data file,
    /// a vector of one or (v2) a dropped delete file are rewritten without those entries
    /// (omitted, as the commit omits replaced vectors: `manifest::rewrite_manifest` says why),
    /// together, packed by kind and spec up to the manifest target size ([`TouchedBins`]), with
    /// the small untouched ones (under half the target, up to [`MERGE_CAP_BYTES`] read). Rewritten
    /// one by one, and the others carried, a table that maintenance alone changes kept every
    /// manifest and gained one per cycle (the cycle's own): a 730-day partitioned copy had 40
    /// manifests after its compaction, each opened by DuckDB on every scan. Now a compaction
    /// leaves about one manifest per kind and spec besides its own.
    pub async fn carry(&self) -> Result<Carried, SinkError> {
        let replaced = &self.replaced;
        let files = &self.live.files;
        let mut touched: HashSet<&str> = files
            .data
            .iter()
            .filter(|f| replaced.contains(f.file.file_path()))
            .map(|f| &*f.manifest)
            .collect();
        for path in replaced {
            if let Some(dv) = self.live.dvs.get(path) {
                touched.insert(&dv.entry.manifest);
            }
        }
        for f in files.position_deletes.iter().chain(&files.equality_deletes) {
            if self.dropped_deletes.contains(f.file.file_path()) {
                touched.insert(&f.manifest);
            }
        }
        let dropped = &self.dropped_deletes;
        let mut carried = Carried::default();
        let target_size = self.manifest_target_size();
        let mut bins = TouchedBins::new(target_size);
        let mut packing_left = MERGE_CAP_BYTES;
        for m in &self.live.manifests {
            let length = u64::try_from(m.manifest_length).unwrap_or(u64::MAX);
            if touched.contains(m.manifest_path.as_str()) {
                bins.add(m);
            } else if !(m.has_added_files() || m.has_existing_files()) {
                continue;
            } else if length < target_size / 2 && length <= packing_left {
                packing_left -= length;
                bins.add(m);
            } else {
                carried.manifests.push(m.clone());
            }
        }
        for (i, bin) in bins.into_bins().into_iter().enumerate() {
            let Some(first) = bin.first() else {
                continue;
            };
            let deletes = first.content == ManifestContentType::Deletes;
            let target = self.manifest_target(deletes, first.partition_spec_id)?;
            let path = self.names.rewritten_manifest(i);
            let (rewritten, removed) =
                manifest::rewrite_manifests(self.warehouse, path, &target, &bin, |f| {
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
            let new = rewritten
                .as_ref()
                .map(|r| Arc::from(r.manifest_path.as_str()));
            for m in &bin {
                carried
                    .rewritten
                    .insert(m.manifest_path.clone(), new.clone());
            }
            carried.manifests.extend(rewritten);
        }
        Ok(carried)
    }

    /// Writes `deletes` (positions in output files, `redelete.rs`) as deletion vectors, one
    /// Puffin file each, as streaming commits write them (`commit/files.rs` says why one).
    pub async fn write_vectors(
        &self,
        deletes: BTreeMap<String, DeletionVector>,
        written: &Written,
    ) -> Result<CarriedVectors, SinkError> {
        let mut out = CarriedVectors::default();
        for (i, (output, vector)) in deletes.into_iter().enumerate() {
            let path = self.names.vector_file(i);
            let one = BTreeMap::from([(output.clone(), vector)]);
            let Some(placement) = written
                .outputs
                .iter()
                .find(|o| o.path == output)
                .map(|o| o.placement.clone())
            else {
                return Err(SinkError::Data {
                    table: self.table.clone(),
                    detail: format!("carrying deletes over to {output}, not an output"),
                });
            };
            let entries =
                commit_vectors::write_puffin(self.warehouse, self.table, &path, &one, &placement)
                    .await?;
            for (entry, (_, vector)) in entries.into_iter().zip(one) {
                out.vectors.insert(output.clone(), (entry, vector));
            }
        }
        Ok(out)
    }

    /// Writes the new data manifest, the manifest of `vectors` and the manifest list, and
    /// returns the metadata naming the `replace` snapshot (not published). `checkpoint`: the
    /// one the snapshot carries.
    pub async fn stage(
        &self,
        written: &Written,
        vectors: &CarriedVectors,
        carried: &mut Carried,
        checkpoint: Option<&Checkpoint>,
    ) -> Result<Staged, SinkError> {
        let meta = self.meta();
        let added: Vec<DataFile> = written.outputs.iter().map(|o| o.file.clone()).collect();
        let mut added_deletes = vectors.entries();
        added_deletes.extend(written.converted.clone());
        let mut manifests = Vec::with_capacity(carried.manifests.len() + 2);
        let mut added_manifest = None;
        let mut vectors_manifest = None;
        for (n, (files, deletes)) in [(&added, false), (&added_deletes, true)]
            .into_iter()
            .enumerate()
        {
            if files.is_empty() {
                continue;
            }
            let target = self.manifest_target(deletes, meta.default_partition_spec_id())?;
            let sequence = if deletes {
                self.names.sequence
            } else {
                self.data_sequence()
            };
            let m = manifest::write_manifest(
                self.warehouse,
                self.names.added_manifest(n),
                &target,
                sequence,
                files.clone(),
            )
            .await?;
            let path = Some(Arc::from(m.manifest_path.as_str()));
            if deletes {
                vectors_manifest = path;
            } else {
                added_manifest = path;
            }
            manifests.push(m);
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
                added_deletes: &added_deletes,
                removed_data: &written.removed_data,
                removed_deletes: &carried.removed_deletes,
            },
            parent.map(|s| s.as_ref()),
            checkpoint,
            self.warehouse.lease_epoch(),
        );
        // v3 row lineage (Iceberg spec, "Row Lineage"): the outputs store their rows' `_row_id`
        // and `_last_updated_sequence_number` (`lineage.rs`); the row range the list assigns
        // them from `next-row-id` is inherited by no row.
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
            vectors_manifest,
        })
    }
}
