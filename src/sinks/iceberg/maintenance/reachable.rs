//! The files a set of snapshots reaches: each snapshot's manifest list, every manifest in it,
//! every file those manifests list (data files, delete files, deletion vectors' Puffin files),
//! and the snapshot's statistics files. Expiry deletes `reachable(expired) − reachable(retained)`
//! and nothing else, so a file some retained snapshot needs is never deleted whatever the other
//! snapshots share with it (cdcd carries manifests from snapshot to snapshot, and rewritten
//! manifests carry entries of older ones).
//!
//! The expired side of an expiry a crash interrupted may miss manifests already deleted
//! ([`Missing::Deleted`], left by an older cdcd that deleted at once in deletion order); what
//! they listed was deleted before them.
//!
//! Every entry counts, DELETED ones included (a deleted entry's file is still read by the parent
//! snapshot; keeping it while the snapshot listing it is retained errs on the side of keeping).
//! Manifest lists and manifests are immutable, so what each lists is cached by path between
//! cycles ([`ManifestCache`]), and a cycle reads only the lists and manifests it has not seen
//! (issue 37: re-reading every retained snapshot's manifest list each cycle was most of an
//! expiry's cost on a table committing every second).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use iceberg::spec::{FormatVersion, Manifest, TableMetadata};

use crate::sinks::iceberg::files::manifest::{load_manifests, read};
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// File locations listed by each manifest seen, and manifest locations listed by each manifest
/// list seen (immutable, so never stale).
#[derive(Debug, Default)]
pub struct ManifestCache {
    files: HashMap<String, Arc<[String]>>,
    lists: HashMap<String, Arc<[String]>>,
}

impl ManifestCache {
    /// Forgets the manifest lists and manifests `still` no longer reaches.
    pub fn retain(&mut self, still: &Reachable) {
        self.files.retain(|path, _| still.manifests.contains(path));
        self.lists.retain(|path, _| still.lists.contains(path));
    }

    async fn manifests(
        &mut self,
        warehouse: &Warehouse,
        list: &str,
        format_version: FormatVersion,
    ) -> Result<Arc<[String]>, SinkError> {
        if let Some(m) = self.lists.get(list) {
            return Ok(Arc::clone(m));
        }
        let manifests: Arc<[String]> = load_manifests(warehouse, list, format_version)
            .await?
            .into_iter()
            .map(|m| m.manifest_path)
            .collect();
        self.lists.insert(list.to_owned(), Arc::clone(&manifests));
        Ok(manifests)
    }

    async fn files(
        &mut self,
        warehouse: &Warehouse,
        manifest: &str,
    ) -> Result<Arc<[String]>, SinkError> {
        if let Some(f) = self.files.get(manifest) {
            return Ok(Arc::clone(f));
        }
        let bytes = read(warehouse, manifest).await?;
        let parsed = Manifest::parse_avro(&bytes).map_err(|source| SinkError::Iceberg {
            context: format!("parsing {manifest}"),
            source,
        })?;
        let files: Arc<[String]> = parsed
            .entries()
            .iter()
            .map(|e| e.data_file().file_path().to_owned())
            .collect();
        self.files.insert(manifest.to_owned(), Arc::clone(&files));
        Ok(files)
    }
}

/// What a set of snapshots reaches, by location.
#[derive(Debug, Default)]
pub struct Reachable {
    /// Manifest lists, manifests, data and delete files, statistics files.
    pub files: HashSet<String>,
    /// The manifests alone (what the cache keeps).
    pub manifests: HashSet<String>,
    /// The manifest lists alone.
    pub lists: HashSet<String>,
}

/// Whether a manifest list or manifest that is not there is an error ([`Missing::Error`]: the
/// snapshots are retained) or was deleted by an expiry a crash interrupted ([`Missing::Deleted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    Error,
    Deleted,
}

fn is_missing(e: &SinkError) -> bool {
    matches!(
        e,
        SinkError::Storage {
            source: object_store::Error::NotFound { .. },
            ..
        }
    )
}

/// Everything the snapshots `ids` of `meta` reach (ids not in `meta` are skipped).
pub async fn reachable(
    warehouse: &Warehouse,
    meta: &TableMetadata,
    ids: &[i64],
    missing: Missing,
    cache: &mut ManifestCache,
) -> Result<Reachable, SinkError> {
    let mut out = Reachable::default();
    let tolerated = |e: &SinkError| missing == Missing::Deleted && is_missing(e);
    for &id in ids {
        let Some(snapshot) = meta.snapshot_by_id(id) else {
            continue;
        };
        if let Some(stats) = meta.statistics_for_snapshot(id) {
            out.files.insert(stats.statistics_path.clone());
        }
        if let Some(stats) = meta.partition_statistics_for_snapshot(id) {
            out.files.insert(stats.statistics_path.clone());
        }
        let list = snapshot.manifest_list();
        if !out.files.insert(list.to_owned()) {
            continue;
        }
        out.lists.insert(list.to_owned());
        let manifests = match cache
            .manifests(warehouse, list, meta.format_version())
            .await
        {
            Ok(m) => m,
            Err(e) if tolerated(&e) => continue,
            Err(e) => return Err(e),
        };
        for m in manifests.iter() {
            if !out.manifests.insert(m.clone()) {
                continue;
            }
            out.files.insert(m.clone());
            match cache.files(warehouse, m).await {
                Ok(files) => out.files.extend(files.iter().cloned()),
                Err(e) if tolerated(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(out)
}
