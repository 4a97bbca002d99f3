//! Orphan cleanup for Iceberg tables (`cdcd cleanup`, [`crate::sinks::Sink::cleanup`]): deletes files under a table that no
//! metadata version references and that are older than a grace period.
//!
//! Where it sits: beside the data flow, run by the user (or a timer) against a warehouse. Orphans
//! come from commits that did not complete: a crash or `kill -9` after data files, deletes or
//! manifests were written but before `v<N>.metadata.json` was created, or a writer that lost a
//! commit race. They are invisible to readers, but they cost storage.
//!
//! What is live: every `metadata/v<N>.metadata.json` present, `version-hint.text`, and everything
//! the newest version's snapshots reference: each snapshot's manifest list, every manifest in it,
//! and every file of every entry (added, existing or deleted: a deleted entry's file is still read
//! by older snapshots). Only the newest version's snapshots count, as in Iceberg-Java's
//! `DeleteOrphanFiles`: an older version lists snapshots that expiry (`maintenance/`) removed and
//! whose files it deleted, and without expiry every older version's snapshots are in the newest
//! too (a commit only adds one). Anything else under the table directory is an orphan once it is older than the
//! grace period, which protects the files of a commit in flight (a commit writes its files first
//! and its metadata last). If any metadata or manifest cannot be read, nothing of that table is
//! deleted: a wrong "unreferenced" would delete live data.

use std::collections::HashSet;
use std::time::Duration;

use iceberg::spec::{Manifest, ManifestList, TableMetadata};
use object_store::ObjectMeta;

use crate::storage::cleanup::{
    get, list_table, remove_unreferenced, table_dirs, CleanupError, TableCleanup,
};
use crate::storage::Warehouse;

/// The Iceberg tables of a warehouse: every directory holding `metadata/v<N>.metadata.json`.
pub async fn find_tables(warehouse: &Warehouse) -> Result<Vec<String>, CleanupError> {
    table_dirs(warehouse, |p| {
        let (dir, file) = p.rsplit_once("/metadata/")?;
        (file.starts_with('v') && file.ends_with(".metadata.json") && !file.contains('/'))
            .then_some(dir)
    })
    .await
}

/// Finds (and unless `dry_run` deletes) the orphans of the table at `table` (its location).
/// `current`: the metadata file a catalog names as current (SQL catalog); `None`: the newest
/// `v<N>.metadata.json` (filesystem catalog).
pub async fn clean_table(
    warehouse: &Warehouse,
    table: &str,
    current: Option<&str>,
    grace: Duration,
    dry_run: bool,
) -> Result<TableCleanup, CleanupError> {
    let objects = list_table(warehouse, table).await?;
    let live = live_files(warehouse, table, &objects, current).await?;
    let lineages = lineages_under_way(&objects);
    let candidate = |path: &str| !lineages.iter().any(|l| path.starts_with(l.as_str()));
    remove_unreferenced(warehouse, table, &objects, &live, candidate, grace, dry_run).await
}

/// The store path prefixes (`…/<table>/resync-<id>/`) of the resync lineages under way in a
/// table's listing: directories that hold their own `metadata/v<N>.metadata.json`
/// (`resync.rs`). Their files belong to the lineage, not to the live table's orphans; after the
/// swap the lineage's metadata files are removed and its files are the live table's again.
fn lineages_under_way(objects: &[ObjectMeta]) -> Vec<String> {
    let mut lineages: Vec<String> = objects
        .iter()
        .filter_map(|o| {
            let path = o.location.as_ref();
            let (dir, file) = path.rsplit_once("/metadata/")?;
            let (_, last) = dir.rsplit_once('/')?;
            let is_metadata = file.starts_with('v') && file.ends_with(".metadata.json");
            (is_metadata && last.starts_with("resync-")).then(|| format!("{dir}/"))
        })
        .collect();
    lineages.sort();
    lineages.dedup();
    lineages
}

/// Store paths of every file some metadata version of the table at `table` references, plus the
/// metadata files themselves (tests check each exists: no snapshot may reference a missing file).
pub async fn referenced_files(
    warehouse: &Warehouse,
    table: &str,
) -> Result<HashSet<String>, CleanupError> {
    let objects = list_table(warehouse, table).await?;
    live_files(warehouse, table, &objects, None).await
}

/// Store paths of every file some metadata version of the table references, plus the metadata
/// files themselves. With a catalog's `current` file, its snapshots are the live ones (the
/// highest `v<N>` may be an orphan of a commit whose row update never happened), and it and
/// every file its metadata log names stay, whatever their names (another writer's
/// `00003-<uuid>.metadata.json`).
async fn live_files(
    warehouse: &Warehouse,
    table: &str,
    objects: &[ObjectMeta],
    current: Option<&str>,
) -> Result<HashSet<String>, CleanupError> {
    let mut live = HashSet::new();
    let mut lists = HashSet::new();
    let mut manifests = HashSet::new();
    let mut newest: Option<(u64, &ObjectMeta)> = None;
    // A resync lineage's own metadata is not a version of this table.
    let lineages = lineages_under_way(objects);
    for o in objects {
        let p = o.location.as_ref();
        if lineages.iter().any(|l| p.starts_with(l.as_str())) {
            continue;
        }
        let Some((_, file)) = p.rsplit_once("/metadata/") else {
            continue;
        };
        if file == "version-hint.text" {
            live.insert(p.to_owned());
            continue;
        }
        let Some(version) = file
            .strip_prefix('v')
            .and_then(|f| f.strip_suffix(".metadata.json"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        live.insert(p.to_owned());
        if newest.is_none_or(|(v, _)| version > v) {
            newest = Some((version, o));
        }
    }
    let newest = match current {
        Some(file) => Some(warehouse.path(file)?),
        None => newest.map(|(_, o)| o.location.clone()),
    };
    if let Some(newest) = newest {
        let p = newest.as_ref();
        live.insert(p.to_owned());
        let bytes = get(warehouse, &newest).await?;
        let metadata: TableMetadata = crate::sinks::iceberg::variant::parse_metadata(&bytes)
            .map_err(|e| CleanupError::Unreadable {
                path: p.to_owned(),
                what: "table metadata",
                detail: e.to_string(),
            })?;
        // A logged file outside this warehouse is not this cleanup's to delete anyway.
        for logged in metadata.metadata_log() {
            if let Ok(path) = warehouse.path(&logged.metadata_file) {
                live.insert(path.to_string());
            }
        }
        for snapshot in metadata.snapshots() {
            let list = snapshot.manifest_list().to_owned();
            if lists.insert(list.clone()) {
                let path = warehouse.path(&list)?;
                live.insert(path.to_string());
                let bytes = get(warehouse, &path).await?;
                let parsed = ManifestList::parse_with_version(&bytes, metadata.format_version())
                    .map_err(|e| CleanupError::Unreadable {
                        path: list.clone(),
                        what: "a manifest list",
                        detail: e.to_string(),
                    })?;
                for m in parsed.entries() {
                    manifests.insert(m.manifest_path.clone());
                }
            }
        }
    }
    for m in manifests {
        let path = warehouse.path(&m)?;
        live.insert(path.to_string());
        let bytes = get(warehouse, &path).await?;
        let manifest = Manifest::parse_avro(&bytes).map_err(|e| CleanupError::Unreadable {
            path: m.clone(),
            what: "a manifest",
            detail: e.to_string(),
        })?;
        for e in manifest.entries() {
            live.insert(warehouse.path(e.data_file().file_path())?.to_string());
        }
    }
    tracing::debug!(table, live = live.len(), "live files");
    Ok(live)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod lineage_tests {
    use super::*;

    fn object(path: &str) -> ObjectMeta {
        ObjectMeta {
            location: object_store::path::Path::from(path),
            last_modified: chrono::Utc::now(),
            size: 1,
            e_tag: None,
            version: None,
        }
    }

    /// A `resync-<id>/` directory with its own metadata is a lineage under way; one whose
    /// metadata is gone (after the swap) and other directories are not.
    #[test]
    fn only_resync_directories_with_metadata_are_lineages() {
        let objects: Vec<ObjectMeta> = [
            "wh/ns/t/metadata/v3.metadata.json",
            "wh/ns/t/data/a.parquet",
            "wh/ns/t/resync-abc/metadata/v2.metadata.json",
            "wh/ns/t/resync-abc/data/b.parquet",
            "wh/ns/t/resync-old/data/c.parquet",
            "wh/ns/t/resync-old/metadata/snap-1.avro",
            "wh/ns/t/other/metadata/v1.metadata.json",
        ]
        .into_iter()
        .map(object)
        .collect();
        assert_eq!(lineages_under_way(&objects), vec!["wh/ns/t/resync-abc/"]);
    }
}
