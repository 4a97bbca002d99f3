//! Orphan cleanup for Iceberg tables (`cdcd cleanup`): deletes files under a table that no
//! metadata version references and that are older than a grace period.
//!
//! Where it sits: beside the data flow, run by the user (or a timer) against a warehouse. Orphans
//! come from commits that did not complete: a crash or `kill -9` after data files, deletes or
//! manifests were written but before `v<N>.metadata.json` was created, or a writer that lost a
//! commit race. They are invisible to readers, but they cost storage.
//!
//! What is live: every `metadata/v<N>.metadata.json` present (cdcd never expires snapshots, so
//! each version and each snapshot in it stays readable for time travel), `version-hint.text`, and
//! everything those reference: each snapshot's manifest list, every manifest in it, and every file
//! of every entry (added, existing or deleted: a deleted entry's file is still read by older
//! snapshots). Anything else under the table directory is an orphan once it is older than the
//! grace period, which protects the files of a commit in flight (a commit writes its files first
//! and its metadata last). If any metadata or manifest cannot be read, nothing of that table is
//! deleted: a wrong "unreferenced" would delete live data.

use std::collections::HashSet;
use std::time::Duration;

use futures::TryStreamExt;
use iceberg::spec::{Manifest, ManifestList, TableMetadata};
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStoreExt};

use super::{StorageError, Warehouse};

/// Cleanup could not decide what is live; nothing was deleted for the table named.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    #[error("storage error at {path}: {source}")]
    Storage {
        path: String,
        #[source]
        source: object_store::Error,
    },
    #[error("{path} cannot be read as {what}: {detail}; nothing of this table was deleted")]
    Unreadable {
        path: String,
        what: &'static str,
        detail: String,
    },
    #[error(transparent)]
    Location(#[from] StorageError),
}

/// What a cleanup pass found (and, unless a dry run, deleted) in one table.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TableCleanup {
    /// The table's location (`<warehouse>/<namespace>/<table>`).
    pub table: String,
    /// Files referenced by some metadata version.
    pub live: usize,
    /// Unreferenced files older than the grace period (locations): deleted unless a dry run.
    pub orphans: Vec<String>,
    /// Unreferenced files younger than the grace period: kept (a commit may be in flight).
    pub young: usize,
}

/// The Iceberg tables of a warehouse: every directory holding `metadata/v<N>.metadata.json`.
pub async fn find_tables(warehouse: &Warehouse) -> Result<Vec<String>, CleanupError> {
    table_dirs(warehouse, |p| {
        let (dir, file) = p.rsplit_once("/metadata/")?;
        (file.starts_with('v') && file.ends_with(".metadata.json") && !file.contains('/'))
            .then_some(dir)
    })
    .await
}

/// The locations of the tables of a warehouse: the directories `table_dir` names for some
/// object (by store path), each once, sorted.
pub async fn table_dirs(
    warehouse: &Warehouse,
    table_dir: impl Fn(&str) -> Option<&str>,
) -> Result<Vec<String>, CleanupError> {
    let root = warehouse.path(&warehouse.location(&[]))?;
    let prefix = (!root.as_ref().is_empty()).then_some(&root);
    let objects: Vec<ObjectMeta> =
        warehouse
            .store()
            .list(prefix)
            .try_collect()
            .await
            .map_err(|source| CleanupError::Storage {
                path: warehouse.url().to_owned(),
                source,
            })?;
    let mut tables: Vec<String> = objects
        .iter()
        .filter_map(|o| table_dir(o.location.as_ref()).map(str::to_owned))
        .collect();
    tables.sort();
    tables.dedup();
    Ok(tables
        .into_iter()
        .map(|dir| warehouse.location_of(&Path::from(dir)))
        .collect())
}

/// Finds (and unless `dry_run` deletes) the orphans of the table at `table` (its location).
pub async fn clean_table(
    warehouse: &Warehouse,
    table: &str,
    grace: Duration,
    dry_run: bool,
) -> Result<TableCleanup, CleanupError> {
    let objects = list_table(warehouse, table).await?;
    let live = live_files(warehouse, table, &objects).await?;
    remove_unreferenced(warehouse, table, &objects, &live, |_| true, grace, dry_run).await
}

/// Every object under the table at `table` (its location).
pub async fn list_table(
    warehouse: &Warehouse,
    table: &str,
) -> Result<Vec<ObjectMeta>, CleanupError> {
    let dir = warehouse.path(table)?;
    warehouse
        .store()
        .list(Some(&dir))
        .try_collect()
        .await
        .map_err(|source| CleanupError::Storage {
            path: table.to_owned(),
            source,
        })
}

/// Deletes (unless `dry_run`) the `objects` of `table` that `live` does not hold, that
/// `candidate` accepts (by store path) and that are older than `grace`, and reports them.
pub async fn remove_unreferenced(
    warehouse: &Warehouse,
    table: &str,
    objects: &[ObjectMeta],
    live: &HashSet<String>,
    candidate: impl Fn(&str) -> bool,
    grace: Duration,
    dry_run: bool,
) -> Result<TableCleanup, CleanupError> {
    let cutoff = chrono::Utc::now() - chrono::Duration::from_std(grace).unwrap_or_default();
    let mut report = TableCleanup {
        table: table.to_owned(),
        live: live.len(),
        ..TableCleanup::default()
    };
    let mut doomed = Vec::new();
    for o in objects {
        if live.contains(o.location.as_ref()) || !candidate(o.location.as_ref()) {
            continue;
        }
        if o.last_modified > cutoff {
            report.young += 1;
            continue;
        }
        report.orphans.push(warehouse.location_of(&o.location));
        doomed.push(o.location.clone());
    }
    if !dry_run {
        for path in doomed {
            match warehouse.store().delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(source) => {
                    return Err(CleanupError::Storage {
                        path: path.to_string(),
                        source,
                    })
                }
            }
        }
    }
    Ok(report)
}

/// Store paths of every file some metadata version of the table at `table` references, plus the
/// metadata files themselves (tests check each exists: no snapshot may reference a missing file).
pub async fn referenced_files(
    warehouse: &Warehouse,
    table: &str,
) -> Result<HashSet<String>, CleanupError> {
    let objects = list_table(warehouse, table).await?;
    live_files(warehouse, table, &objects).await
}

/// Store paths of every file some metadata version of the table references, plus the metadata
/// files themselves.
async fn live_files(
    warehouse: &Warehouse,
    table: &str,
    objects: &[ObjectMeta],
) -> Result<HashSet<String>, CleanupError> {
    let mut live = HashSet::new();
    let mut lists = HashSet::new();
    let mut manifests = HashSet::new();
    for o in objects {
        let p = o.location.as_ref();
        let Some((_, file)) = p.rsplit_once("/metadata/") else {
            continue;
        };
        if file == "version-hint.text" {
            live.insert(p.to_owned());
            continue;
        }
        if !(file.starts_with('v') && file.ends_with(".metadata.json")) {
            continue;
        }
        live.insert(p.to_owned());
        let bytes = get(warehouse, &o.location).await?;
        let metadata: TableMetadata =
            serde_json::from_slice(&bytes).map_err(|e| CleanupError::Unreadable {
                path: p.to_owned(),
                what: "table metadata",
                detail: e.to_string(),
            })?;
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

async fn get(warehouse: &Warehouse, path: &Path) -> Result<bytes::Bytes, CleanupError> {
    let storage = |source| CleanupError::Storage {
        path: path.to_string(),
        source,
    };
    warehouse
        .store()
        .get(path)
        .await
        .map_err(storage)?
        .bytes()
        .await
        .map_err(storage)
}
