//! What a commit needs to know about the snapshot it builds on — the snapshot's manifests, its
//! live data and delete files, and the live deletion vector of each data file — kept between
//! commits instead of being reread by each one.
//!
//! Where it sits: `mod.rs` takes a table's [`LiveState`] at the start of a commit (with the
//! primary-key index, under the same per-table lock); the commit (`commit/`) hands its files and
//! vectors to the locator, the lookup and the DV merge, and after a successful publish
//! [`LiveState::advance`]s it to the new snapshot from what the commit itself wrote, without
//! reading anything back.
//!
//! Why it stays correct: a state names the snapshot it describes. It is used only when that is
//! the current snapshot of the metadata the commit builds on; otherwise (first commit in this
//! process, a crash and restart, another writer's commit, a publish whose outcome was unknown)
//! [`LiveState::load`] reads the manifest list, every manifest and every live vector, as every
//! commit used to. The metadata a commit builds on is itself checked at publish time: the
//! create-if-absent of `v<N+1>.metadata.json` fails if anyone else committed version N+1, and the
//! sink then reloads the metadata, whose new current snapshot no longer matches the state.
//!
//! Cost of a cold load (per table, once per process): one GET of the manifest list, one per
//! manifest, one ranged GET per live deletion vector. Memory: one `DataFile` per live file and
//! each live vector (a Roaring bitmap: a few bytes per deleted row at worst).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use iceberg::spec::{DataContentType, DataFile, ManifestFile, TableMetadata};

use crate::changelog::TableId;
use crate::sinks::iceberg::deletes::commit_vectors::{self, LiveDv, LiveDvs};
use crate::sinks::iceberg::deletes::deletion_vector::DeletionVector;
use crate::sinks::iceberg::files::manifest::{self, KnownEntries, LiveFile, LiveFiles};
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// A snapshot's manifests, live files and live deletion vectors.
#[derive(Debug, Default)]
pub(crate) struct LiveState {
    /// The snapshot described (`None`: the table has no snapshot yet).
    pub snapshot_id: Option<i64>,
    /// The snapshot's manifest list, in order.
    pub manifests: Vec<ManifestFile>,
    pub files: LiveFiles,
    /// Format v3 only (empty for v2 tables).
    pub dvs: LiveDvs,
    /// The entries of the delete manifests this process's commits wrote that the snapshot still
    /// lists, for the next commit that folds one (`commit/manifests.rs`); empty after a load.
    pub delete_entries: KnownEntries,
}

/// What a published commit changed, as the commit (`commit/`) wrote it.
pub(crate) struct Published<'a> {
    pub snapshot_id: i64,
    /// The commit's data sequence number.
    pub sequence: i64,
    /// The commit dropped every earlier data and delete file.
    pub truncate: bool,
    /// The new snapshot's manifest list, in order.
    pub manifests: Vec<ManifestFile>,
    /// Data files added (all of spec `data_spec`), and the manifest listing them.
    pub data: Vec<DataFile>,
    pub data_spec: i32,
    pub data_manifest: Option<Arc<str>>,
    /// Delete files added (DVs or v2 delete files) with their spec, and the manifests listing
    /// them, by spec.
    pub deletes: Vec<(DataFile, i32)>,
    pub delete_manifests: HashMap<i32, Arc<str>>,
    /// The entries of those delete manifests, by path.
    pub delete_entries: KnownEntries,
    /// Manifests rewritten by this commit: old path → new path (`None`: nothing was left).
    pub rewritten: HashMap<String, Option<Arc<str>>>,
    /// Data files whose deletion vector this commit replaced.
    pub replaced: &'a HashSet<String>,
    /// The vectors this commit wrote (already merged with the ones they replace), by data file.
    pub vectors: BTreeMap<String, DeletionVector>,
}

/// What a compaction's `replace` snapshot changed (`maintenance/compaction/`).
pub(crate) struct Rewritten {
    pub snapshot_id: i64,
    pub sequence: i64,
    /// The data sequence number of the files written (v2: the rewrite's starting one).
    pub data_sequence: i64,
    /// The new snapshot's manifest list, in order.
    pub manifests: Vec<ManifestFile>,
    /// The files written, and the manifest listing them.
    pub added: Vec<DataFile>,
    pub added_manifest: Option<Arc<str>>,
    /// The spec of every file written (the default spec).
    pub spec_id: i32,
    /// Manifests rewritten: old path → new path (`None`: nothing was left).
    pub rewritten: HashMap<String, Option<Arc<str>>>,
    /// Data files removed (their vectors leave with them).
    pub removed_data: HashSet<String>,
    /// Delete files removed by path (v2: those that applied to no live file any more).
    pub removed_deletes: HashSet<String>,
    /// Deletion vectors added on the files written (deletes committed while the rewrite ran),
    /// by data file: the delete-file entry and the vector; and the manifest listing them.
    pub vectors: BTreeMap<String, (DataFile, DeletionVector)>,
    pub vectors_manifest: Option<Arc<str>>,
}

impl LiveState {
    /// Reads the state of `meta`'s current snapshot from storage.
    pub async fn load(
        warehouse: &Warehouse,
        table: &TableId,
        meta: &TableMetadata,
    ) -> Result<LiveState, SinkError> {
        let Some(snapshot) = meta.current_snapshot() else {
            return Ok(LiveState::default());
        };
        let version = meta.format_version();
        let manifests =
            manifest::load_manifests(warehouse, snapshot.manifest_list(), version).await?;
        let files = manifest::load_files(warehouse, &manifests).await?;
        let dvs = if version >= iceberg::spec::FormatVersion::V3 {
            commit_vectors::load_dvs(warehouse, table, &files).await?
        } else {
            LiveDvs::new()
        };
        Ok(LiveState {
            snapshot_id: Some(snapshot.snapshot_id()),
            manifests,
            files,
            dvs,
            delete_entries: KnownEntries::new(),
        })
    }

    /// Drops the known entries of manifests `manifests` (the new snapshot's list) no longer names.
    fn keep_listed_entries(&mut self, manifests: &[ManifestFile]) {
        let listed: HashSet<&str> = manifests.iter().map(|m| m.manifest_path.as_str()).collect();
        self.delete_entries
            .retain(|path, _| listed.contains(path.as_str()));
    }

    /// Whether this state describes the current snapshot of `meta`.
    pub fn describes(&self, meta: &TableMetadata) -> bool {
        self.snapshot_id == meta.current_snapshot().map(|s| s.snapshot_id())
    }

    /// Moves the state to the compaction snapshot `r` describes, built on this one, without
    /// reading anything back (as [`advance`](Self::advance) does for a commit).
    pub fn apply_rewrite(&mut self, r: Rewritten) {
        let moved = |f: &mut LiveFile| {
            if let Some(Some(new)) = r.rewritten.get(&*f.manifest) {
                f.manifest = Arc::clone(new);
            }
        };
        let files = &mut self.files;
        files
            .data
            .retain(|f| !r.removed_data.contains(f.file.file_path()));
        files.position_deletes.retain(|f| {
            !r.removed_deletes.contains(f.file.file_path())
                && !f
                    .file
                    .referenced_data_file()
                    .is_some_and(|d| r.removed_data.contains(&d))
        });
        files
            .equality_deletes
            .retain(|f| !r.removed_deletes.contains(f.file.file_path()));
        self.dvs
            .retain(|data_file, _| !r.removed_data.contains(data_file));
        files.data.iter_mut().for_each(moved);
        files.position_deletes.iter_mut().for_each(moved);
        files.equality_deletes.iter_mut().for_each(moved);
        for d in self.dvs.values_mut() {
            moved(&mut d.entry);
        }
        let live = |file: DataFile, sequence: i64, manifest: &Option<Arc<str>>| LiveFile {
            file,
            sequence,
            snapshot_id: r.snapshot_id,
            manifest: manifest.clone().unwrap_or_else(|| Arc::from("")),
            spec_id: r.spec_id,
        };
        for file in r.added {
            files
                .data
                .push(live(file, r.data_sequence, &r.added_manifest));
        }
        for (data_file, (file, dv)) in r.vectors {
            let entry = live(file, r.sequence, &r.vectors_manifest);
            files.position_deletes.push(entry.clone());
            self.dvs.insert(data_file, LiveDv { entry, dv });
        }
        self.keep_listed_entries(&r.manifests);
        self.manifests = r.manifests;
        self.snapshot_id = Some(r.snapshot_id);
    }

    /// Moves the state to the snapshot `p` describes, which was built on this one.
    pub fn advance(&mut self, p: Published<'_>) {
        if p.truncate {
            self.files = LiveFiles::default();
            self.dvs.clear();
        }
        // Entries carried into a rewritten manifest now live there.
        // (A manifest rewritten to nothing held only entries this commit removed.)
        let moved = |f: &mut LiveFile| {
            if let Some(Some(new)) = p.rewritten.get(&*f.manifest) {
                f.manifest = Arc::clone(new);
            }
        };
        self.files.data.iter_mut().for_each(moved);
        self.files.equality_deletes.iter_mut().for_each(moved);
        let replaced = |f: &LiveFile| {
            f.file
                .referenced_data_file()
                .is_some_and(|r| p.replaced.contains(&r))
        };
        self.files.position_deletes.retain(|f| !replaced(f));
        self.files.position_deletes.iter_mut().for_each(moved);
        for d in self.dvs.values_mut() {
            moved(&mut d.entry);
        }
        let live = |file: DataFile, manifest: &Option<Arc<str>>, spec_id: i32| LiveFile {
            file,
            sequence: p.sequence,
            snapshot_id: p.snapshot_id,
            manifest: manifest.clone().unwrap_or_else(|| Arc::from("")),
            spec_id,
        };
        for f in p.data {
            self.files.data.push(live(f, &p.data_manifest, p.data_spec));
        }
        let mut vectors = p.vectors;
        for (f, spec_id) in p.deletes {
            let manifest = p.delete_manifests.get(&spec_id).cloned();
            let entry = live(f, &manifest, spec_id);
            match entry.file.content_type() {
                DataContentType::EqualityDeletes => self.files.equality_deletes.push(entry),
                DataContentType::PositionDeletes => {
                    let vector = entry
                        .file
                        .referenced_data_file()
                        .and_then(|r| vectors.remove(&r).map(|v| (r, v)));
                    if let Some((data_file, dv)) = vector {
                        self.dvs.insert(
                            data_file,
                            LiveDv {
                                entry: entry.clone(),
                                dv,
                            },
                        );
                    }
                    self.files.position_deletes.push(entry);
                }
                DataContentType::Data => self.files.data.push(entry),
            }
        }
        self.delete_entries.extend(p.delete_entries);
        self.keep_listed_entries(&p.manifests);
        self.manifests = p.manifests;
        self.snapshot_id = Some(p.snapshot_id);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use iceberg::spec::{DataFileBuilder, DataFileFormat, Struct};

    fn file(path: &str, content: DataContentType, referenced: Option<&str>) -> DataFile {
        DataFileBuilder::default()
            .content(content)
            .file_path(path.to_owned())
            .file_format(if referenced.is_some() {
                DataFileFormat::Puffin
            } else {
                DataFileFormat::Parquet
            })
            .partition(Struct::empty())
            .partition_spec_id(0)
            .record_count(1)
            .file_size_in_bytes(10)
            .referenced_data_file(referenced.map(str::to_owned))
            .build()
            .unwrap()
    }

    fn live(f: DataFile, manifest: &str) -> LiveFile {
        LiveFile {
            spec_id: 0,
            file: f,
            sequence: 1,
            snapshot_id: 1,
            manifest: Arc::from(manifest),
        }
    }

    /// A replaced vector leaves, the merged one takes its place, and entries carried into a
    /// rewritten manifest point at it.
    #[test]
    fn advance_replaces_vectors_and_follows_rewrites() {
        let dv_a = live(
            file("p1", DataContentType::PositionDeletes, Some("a")),
            "m-del",
        );
        let dv_b = live(
            file("p1", DataContentType::PositionDeletes, Some("b")),
            "m-del",
        );
        let mut state = LiveState {
            snapshot_id: Some(1),
            manifests: Vec::new(),
            files: LiveFiles {
                data: vec![live(file("a", DataContentType::Data, None), "m-data")],
                position_deletes: vec![dv_a.clone(), dv_b.clone()],
                equality_deletes: Vec::new(),
            },
            dvs: LiveDvs::from([
                (
                    "a".to_owned(),
                    LiveDv {
                        entry: dv_a,
                        dv: DeletionVector::from_positions([1]).unwrap(),
                    },
                ),
                (
                    "b".to_owned(),
                    LiveDv {
                        entry: dv_b,
                        dv: DeletionVector::from_positions([2]).unwrap(),
                    },
                ),
            ]),
            delete_entries: KnownEntries::new(),
        };
        let replaced = HashSet::from(["a".to_owned()]);
        let merged = DeletionVector::from_positions([1, 5]).unwrap();
        state.advance(Published {
            snapshot_id: 2,
            sequence: 2,
            truncate: false,
            manifests: Vec::new(),
            data: vec![file("c", DataContentType::Data, None)],
            data_spec: 0,
            data_manifest: Some(Arc::from("m0")),
            deletes: vec![(file("p2", DataContentType::PositionDeletes, Some("a")), 0)],
            delete_manifests: HashMap::from([(0, Arc::from("m1"))]),
            delete_entries: KnownEntries::new(),
            rewritten: HashMap::from([("m-del".to_owned(), Some(Arc::from("m-del-r")))]),
            replaced: &replaced,
            vectors: BTreeMap::from([("a".to_owned(), merged.clone())]),
        });
        assert_eq!(state.snapshot_id, Some(2));
        assert_eq!(state.files.data.len(), 2);
        let paths: Vec<(&str, &str)> = state
            .files
            .position_deletes
            .iter()
            .map(|f| (f.file.file_path(), &*f.manifest))
            .collect();
        assert_eq!(paths, vec![("p1", "m-del-r"), ("p2", "m1")]);
        assert_eq!(state.dvs["a"].dv, merged);
        assert_eq!(state.dvs["a"].entry.file.file_path(), "p2");
        assert_eq!(&*state.dvs["b"].entry.manifest, "m-del-r");
    }
}
