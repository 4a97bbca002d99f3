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
//! Manifest lists and manifests are immutable, so what each lists is cached by path
//! ([`ManifestCache`]): the table's commits record what they write, and a cycle reads only the
//! lists and manifests another writer (or an earlier process) wrote (issue 37: parsing the Avro
//! of manifests and lists back was most of an expiry's cost, 12 % of cdcd's CPU with 1,000
//! tables).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use iceberg::spec::{FormatVersion, Manifest, TableMetadata};

use crate::sinks::iceberg::files::manifest::{load_manifests, read};
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// File locations listed by each manifest, and manifest locations listed by each manifest list
/// (immutable, so never stale), of one table: filled by the table's commits as they write them
/// (so expiry reads back nothing this process wrote) and by the cycles' reads of the others.
/// Shared between the table's commits and its maintenance (`Tables::manifest_contents`).
#[derive(Debug, Default)]
pub struct ManifestCache {
    inner: Mutex<Contents>,
}

#[derive(Debug, Default)]
struct Contents {
    files: HashMap<Arc<str>, Listed>,
    lists: HashMap<Arc<str>, Listed>,
    /// Every location held above, once: a commit's delete manifest lists again most of the
    /// vectors its parent's did, and a manifest list the manifests of its parent's.
    pool: HashSet<Arc<str>>,
}

type Listed = Arc<[Arc<str>]>;

/// Distinct locations a table's cache holds at most (~150 bytes each): past it, it starts over
/// (what a cycle then misses it reads back). Bounds it when no expiry prunes it (maintenance off,
/// or a long retention).
const MAX_LOCATIONS: usize = 100_000;

impl ManifestCache {
    fn contents(&self) -> std::sync::MutexGuard<'_, Contents> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets the manifest lists and manifests `still` no longer reaches.
    pub fn retain(&self, still: &Reachable) {
        let mut c = self.contents();
        c.files.retain(|path, _| still.manifests.contains(&**path));
        c.lists.retain(|path, _| still.lists.contains(&**path));
        c.pool.retain(|p| Arc::strong_count(p) > 1);
    }

    /// Records what a manifest this process wrote lists.
    pub fn wrote_manifest<'s>(&self, manifest: &str, files: impl IntoIterator<Item = &'s str>) {
        self.contents().insert_file(manifest, files);
    }

    /// Records what a manifest list this process wrote lists.
    pub fn wrote_list<'s>(&self, list: &str, manifests: impl IntoIterator<Item = &'s str>) {
        self.contents().insert_list(list, manifests);
    }

    /// The manifests `list` names.
    pub async fn manifests(
        &self,
        warehouse: &Warehouse,
        list: &str,
        format_version: FormatVersion,
    ) -> Result<Listed, SinkError> {
        if let Some(m) = self.contents().lists.get(list) {
            return Ok(Arc::clone(m));
        }
        let manifests = load_manifests(warehouse, list, format_version).await?;
        Ok(self
            .contents()
            .insert_list(list, manifests.iter().map(|m| m.manifest_path.as_str())))
    }

    async fn files(&self, warehouse: &Warehouse, manifest: &str) -> Result<Listed, SinkError> {
        if let Some(f) = self.contents().files.get(manifest) {
            return Ok(Arc::clone(f));
        }
        let bytes = read(warehouse, manifest).await?;
        let parsed = Manifest::parse_avro(&bytes).map_err(|source| SinkError::Iceberg {
            context: format!("parsing {manifest}"),
            source,
        })?;
        Ok(self.contents().insert_file(
            manifest,
            parsed.entries().iter().map(|e| e.data_file().file_path()),
        ))
    }
}

impl Contents {
    fn intern(&mut self, location: &str) -> Arc<str> {
        if let Some(p) = self.pool.get(location) {
            return Arc::clone(p);
        }
        let p: Arc<str> = Arc::from(location);
        self.pool.insert(Arc::clone(&p));
        p
    }

    fn listed<'s>(&mut self, listed: impl IntoIterator<Item = &'s str>) -> Listed {
        if self.pool.len() >= MAX_LOCATIONS {
            self.files.clear();
            self.lists.clear();
            self.pool.clear();
        }
        listed.into_iter().map(|l| self.intern(l)).collect()
    }

    fn insert_file<'s>(
        &mut self,
        manifest: &str,
        files: impl IntoIterator<Item = &'s str>,
    ) -> Listed {
        let files = self.listed(files);
        let key = self.intern(manifest);
        self.files.insert(key, Arc::clone(&files));
        files
    }

    fn insert_list<'s>(
        &mut self,
        list: &str,
        manifests: impl IntoIterator<Item = &'s str>,
    ) -> Listed {
        let manifests = self.listed(manifests);
        let key = self.intern(list);
        self.lists.insert(key, Arc::clone(&manifests));
        manifests
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
    cache: &ManifestCache,
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
            if !out.manifests.insert(m.to_string()) {
                continue;
            }
            out.files.insert(m.to_string());
            match cache.files(warehouse, m).await {
                Ok(files) => out.files.extend(files.iter().map(|f| f.to_string())),
                Err(e) if tolerated(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(out)
}
