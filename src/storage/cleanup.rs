//! What every sink's orphan cleanup (`cdcd cleanup`, [`crate::sinks::Sink::cleanup`]) shares: the
//! warehouse's table directories, a table's objects, and the removal of the unreferenced ones
//! older than a grace period. Which files are live is each format's business
//! (`sinks/iceberg/cleanup.rs`, `sinks/lsm/cleanup.rs`); this file never reads table metadata.
//!
//! Why a grace period: a commit writes its files first and publishes last, so a file of a commit
//! in flight is unreferenced for a moment; it is young, and kept.

use std::collections::HashSet;
use std::time::Duration;

use futures::TryStreamExt;
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

/// The bytes of the object at `path`.
pub async fn get(warehouse: &Warehouse, path: &Path) -> Result<bytes::Bytes, CleanupError> {
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
