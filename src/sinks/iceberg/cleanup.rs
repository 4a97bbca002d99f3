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
    remove_unreferenced(warehouse, table, &objects, &live, |_| true, grace, dry_run).await
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
    for o in objects {
        let p = o.location.as_ref();
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
        let metadata: TableMetadata =
            serde_json::from_slice(&bytes).map_err(|e| CleanupError::Unreadable {
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
