//! The manifest steps: which of the parent's manifests the new snapshot keeps (a manifest that
//! lists a deletion vector this commit replaces is folded into this commit's delete manifest
//! without it, or else rewritten without it), the merge of the kept ones (planned by
//! `merge.rs`), this commit's data and delete manifests, and the manifest list naming them all,
//! new ones first.
//!
//! Why fold: an update-heavy table replaces vectors listed by many of its delete manifests
//! (each commit adds one), and a rewrite of each was one more file per manifest per commit
//! (issue 37). Folded, a commit writes one delete manifest per spec whatever it replaces, and the
//! manifests it touched leave the list, which also keeps the table's delete manifests few. The
//! folded entries stay EXISTING with their own snapshot id and sequence numbers, as Iceberg-Java's
//! merge-append writes new and existing entries into one manifest.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use iceberg::spec::{DataContentType, DataFile, ManifestContentType, ManifestFile};

use super::manifest_list::{self, ListTarget};
use super::merge::{self, Candidate, Output};
use super::{Added, Carried, DataFiles, Deletes, Listed, RowDelta};
use crate::failpoints;
use crate::sinks::iceberg::files::manifest::{self, KnownEntries, ManifestTarget};
use crate::sinks::iceberg::maintenance::properties::Merging;
use crate::sinks::iceberg::rows::live::LiveState;
use crate::sinks::SinkError;

/// What the merge did, for the snapshot summary (Iceberg-Java's `manifests-*` keys).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct MergeCounts {
    /// Merged manifests written.
    pub created: usize,
    /// Carried manifests merged away.
    pub replaced: usize,
}

impl RowDelta<'_> {
    /// A new manifest of this snapshot, listing data files or (`deletes`) delete files.
    fn manifest_target(&self, deletes: bool) -> ManifestTarget {
        let meta = self.base();
        ManifestTarget {
            version: meta.format_version(),
            schema: meta.current_schema().clone(),
            spec: meta.default_partition_spec().clone(),
            snapshot_id: self.names.snapshot_id,
            deletes,
        }
    }

    /// The parent's manifests as the new snapshot keeps them: none after a truncate; a manifest
    /// left with no live entry is dropped, not carried forward; a delete manifest that lists a
    /// vector `deletes` replaces is folded into this commit's delete manifest of its spec
    /// (written by [`write_added_manifests`](Self::write_added_manifests)), or, when the commit
    /// writes none of that spec, rewritten without that entry.
    pub(super) async fn carry_manifests(
        &self,
        live: &LiveState,
        deletes: &Deletes,
    ) -> Result<Carried, SinkError> {
        let mut carried = Carried::default();
        if self.plan.truncate {
            return Ok(carried);
        }
        let replaced = &deletes.replaced;
        let rewrite: HashSet<&str> = replaced
            .iter()
            .filter_map(|f| live.dvs.get(f).map(|d| &*d.entry.manifest))
            .collect();
        let folding_into = self.delete_manifest_paths(deletes);
        for (i, m) in live.manifests.iter().enumerate() {
            if !rewrite.contains(m.manifest_path.as_str()) {
                if m.has_added_files() || m.has_existing_files() {
                    carried.manifests.push(m.clone());
                }
                continue;
            }
            let into = folding_into.get(&m.partition_spec_id);
            if let (ManifestContentType::Deletes, Some(into)) = (m.content, into) {
                carried
                    .rewritten
                    .insert(m.manifest_path.clone(), Some(Arc::from(into.as_str())));
                carried
                    .folded
                    .entry(m.partition_spec_id)
                    .or_default()
                    .push(m.clone());
                continue;
            }
            let path = self.names.rewritten_manifest(i);
            let target = self.spec_target(true, m.partition_spec_id)?;
            let (kept, removed) =
                manifest::rewrite_manifest(self.target.warehouse, path, &target, m, |f| {
                    f.content_type() == DataContentType::PositionDeletes
                        && f.referenced_data_file()
                            .is_some_and(|r| replaced.contains(&r))
                })
                .await?;
            carried.removed_deletes.extend(removed);
            carried.rewritten.insert(
                m.manifest_path.clone(),
                kept.as_ref().map(|k| Arc::from(k.manifest_path.as_str())),
            );
            carried.manifests.extend(kept);
        }
        Ok(carried)
    }

    /// Merges `carried.manifests` as the base's table properties say (`merge.rs`). Manifests this
    /// commit already rewrote are not candidates (their entries would be written twice in one
    /// commit). Each merged-away manifest is recorded in `carried.rewritten`, so the cached live
    /// state follows its entries. A bad property skips merging (logged): replication goes on.
    pub(super) async fn merge_carried(
        &self,
        carried: &mut Carried,
    ) -> Result<MergeCounts, SinkError> {
        let policy = match Merging::from_properties(self.base().properties()) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(table = %self.table(), "manifest merge skipped: {e}");
                return Ok(MergeCounts::default());
            }
        };
        let (mut kept, old): (Vec<ManifestFile>, Vec<ManifestFile>) =
            std::mem::take(&mut carried.manifests)
                .into_iter()
                .partition(|m| m.added_snapshot_id == self.names.snapshot_id);
        let candidates: Vec<Candidate> = old.iter().map(candidate).collect();
        let mut counts = MergeCounts::default();
        for output in merge::choose(&policy, &candidates) {
            match output {
                Output::Keep(i) => kept.extend(old.get(i).cloned()),
                Output::Merge(bin) => {
                    let inputs: Vec<&ManifestFile> =
                        bin.iter().filter_map(|&i| old.get(i)).collect();
                    let merged = self.merge_bin(counts.created, &inputs).await?;
                    let path = merged.as_ref().map(|m| Arc::from(m.manifest_path.as_str()));
                    for m in &inputs {
                        carried
                            .rewritten
                            .insert(m.manifest_path.clone(), path.clone());
                    }
                    counts.created += 1;
                    counts.replaced += inputs.len();
                    kept.extend(merged);
                }
            }
        }
        carried.manifests = kept;
        Ok(counts)
    }

    /// Writes the `n`-th merged manifest of this commit from `inputs` (one content, one spec).
    async fn merge_bin(
        &self,
        n: usize,
        inputs: &[&ManifestFile],
    ) -> Result<Option<ManifestFile>, SinkError> {
        let Some(first) = inputs.first() else {
            return Ok(None);
        };
        let meta = self.base();
        let spec = meta
            .partition_spec_by_id(first.partition_spec_id)
            .ok_or_else(|| SinkError::Corrupt {
                path: first.manifest_path.clone(),
                detail: format!(
                    "partition spec {} is not in the table",
                    first.partition_spec_id
                ),
            })?;
        let target = ManifestTarget {
            spec: spec.clone(),
            ..self.manifest_target(first.content == ManifestContentType::Deletes)
        };
        let path = self.names.merged_manifest(n);
        let merged =
            manifest::merge_manifests(self.target.warehouse, path, &target, inputs).await?;
        failpoints::crash_point(failpoints::COMMIT_AFTER_MERGE);
        Ok(merged)
    }

    /// The path of this commit's delete manifest of each spec its delete files are of.
    fn delete_manifest_paths(&self, deletes: &Deletes) -> BTreeMap<i32, String> {
        let specs: BTreeSet<i32> = deletes.spec_ids.iter().copied().collect();
        specs
            .into_iter()
            .enumerate()
            .map(|(n, spec_id)| (spec_id, self.names.added_manifest(n + 1)))
            .collect()
    }

    /// Writes this commit's data manifest (its data files are all of the default spec) and its
    /// delete manifests, one per spec of the delete files (a deletion vector or position delete
    /// file takes its data file's spec, an equality delete file the spec `layout.rs` chose); each
    /// only when it has files. A delete manifest also holds the entries of the parent's delete
    /// manifests of its spec that `carried` folds into it, but the replaced vectors, which join
    /// `carried.removed_deletes`; a folded manifest whose entries are in `known` is not read.
    /// Returns them and their paths.
    pub(super) async fn write_added_manifests(
        &self,
        data: &DataFiles,
        deletes: &Deletes,
        carried: &mut Carried,
        known: &KnownEntries,
    ) -> Result<(Vec<ManifestFile>, Added), SinkError> {
        let mut paths = Added::default();
        let mut added = Vec::new();
        let sequence = self.names.sequence;
        if !data.files.is_empty() {
            let path = self.names.added_manifest(0);
            paths.data = Some(Arc::from(path.as_str()));
            let target = self.manifest_target(false);
            let written = manifest::write_manifest(
                self.target.warehouse,
                path,
                &target,
                sequence,
                data.files.clone(),
            )
            .await?;
            self.target.contents.wrote_manifest(
                &written.manifest_path,
                data.files.iter().map(|f| f.file_path()),
            );
            added.push(written);
        }
        let mut by_spec: BTreeMap<i32, Vec<DataFile>> = BTreeMap::new();
        for (f, &spec_id) in deletes.files.iter().zip(&deletes.spec_ids) {
            by_spec.entry(spec_id).or_default().push(f.clone());
        }
        let mut paths_by_spec = self.delete_manifest_paths(deletes);
        let replaced = &deletes.replaced;
        for (spec_id, files) in by_spec {
            let Some(path) = paths_by_spec.remove(&spec_id) else {
                continue;
            };
            paths.deletes.insert(spec_id, Arc::from(path.as_str()));
            let target = self.spec_target(true, spec_id)?;
            let folded: Vec<&ManifestFile> = carried
                .folded
                .get(&spec_id)
                .map(|f| f.iter().collect())
                .unwrap_or_default();
            let written = manifest::write_manifest_with(
                self.target.warehouse,
                path,
                &target,
                sequence,
                files,
                (&folded, known),
                |f| {
                    f.content_type() == DataContentType::PositionDeletes
                        && f.referenced_data_file()
                            .is_some_and(|r| replaced.contains(&r))
                },
            )
            .await?;
            carried.removed_deletes.extend(written.removed);
            self.target.contents.wrote_manifest(
                &written.manifest.manifest_path,
                written.entries.iter().map(|e| e.file.file_path()),
            );
            paths
                .delete_entries
                .insert(written.manifest.manifest_path.clone(), written.entries);
            added.push(written.manifest);
        }
        Ok((added, paths))
    }

    /// A new manifest of this snapshot for files of spec `spec_id`.
    fn spec_target(&self, deletes: bool, spec_id: i32) -> Result<ManifestTarget, SinkError> {
        let spec = self
            .base()
            .partition_spec_by_id(spec_id)
            .ok_or_else(|| SinkError::Data {
                table: self.table().clone(),
                detail: format!("a file of partition spec {spec_id}, which is not in the table"),
            })?;
        Ok(ManifestTarget {
            spec: spec.clone(),
            ..self.manifest_target(deletes)
        })
    }

    /// Writes the manifest list of `manifests`, in order: this commit's first, so readers see its
    /// files before the carried-over ones.
    pub(super) async fn write_list(
        &self,
        manifests: Vec<ManifestFile>,
    ) -> Result<Listed, SinkError> {
        let meta = self.base();
        let path = self.names.manifest_list();
        let target = ListTarget {
            version: meta.format_version(),
            snapshot_id: self.names.snapshot_id,
            parent: meta.current_snapshot().map(|s| s.snapshot_id()),
            sequence: self.names.sequence,
            first_row_id: meta.next_row_id(),
        };
        let (added_rows, manifests) =
            manifest_list::write_manifest_list(self.target.warehouse, &path, &target, manifests)
                .await?;
        self.target
            .contents
            .wrote_list(&path, manifests.iter().map(|m| m.manifest_path.as_str()));
        Ok(Listed {
            path,
            added_rows,
            first_row_id: target.first_row_id,
            manifests,
        })
    }
}

fn candidate(m: &ManifestFile) -> Candidate {
    Candidate {
        content: m.content,
        spec_id: m.partition_spec_id,
        length: u64::try_from(m.manifest_length).unwrap_or(0),
    }
}
