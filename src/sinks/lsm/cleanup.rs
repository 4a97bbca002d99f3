//! Orphan cleanup for Paimon tables (`cdcd cleanup`, [`crate::sinks::Sink::cleanup`]; `sinks/iceberg/cleanup.rs` does Iceberg's).
//!
//! Orphans come from commits that did not complete: a crash after a commit's data files or
//! manifests were written but before its snapshot was, a compaction whose snapshot lost a race,
//! or an expiry interrupted between deleting a snapshot and deleting the files only it held.
//!
//! What is live: every snapshot present from `EARLIEST` to the newest, and everything each one
//! references: its base and delta manifest lists, every manifest in them, and every data file of
//! every entry (added or deleted: conservative, like Iceberg's). Only files under `manifest/` and
//! `bucket-N/` can be orphans (a partitioned table's data files, under `<col>=<value>/bucket-N/`,
//! are never deleted here); `snapshot/`, `schema/` and anything else are never touched. A
//! file younger than the grace period is kept (a commit writes its files before its snapshot).
//! If a snapshot, list or manifest cannot be read, nothing of the table is deleted. Files that a
//! snapshot published during the pass references are live in the snapshot before it or new,
//! hence young.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::expire::{collect, file_path, Refs, Scope};
use super::partition::PartitionKeys;
use super::snapshot;
use crate::storage::cleanup::{
    list_table, remove_unreferenced, table_dirs, CleanupError, TableCleanup,
};
use crate::storage::Warehouse;

/// The Paimon tables of a warehouse: every directory holding `schema/schema-0`.
pub async fn find_tables(warehouse: &Warehouse) -> Result<Vec<String>, CleanupError> {
    table_dirs(warehouse, |p| p.strip_suffix("/schema/schema-0")).await
}

/// Finds (and unless `dry_run` deletes) the orphans of the Paimon table at `table`.
pub async fn clean_table(
    warehouse: &Warehouse,
    table: &str,
    grace: Duration,
    dry_run: bool,
) -> Result<TableCleanup, CleanupError> {
    let objects = list_table(warehouse, table).await?;
    let live = paths(
        warehouse,
        table,
        &referenced(warehouse, table, false).await?,
    )
    .await?;
    let dir = warehouse.path(table)?.to_string();
    let candidate = |path: &str| {
        let rel = path
            .strip_prefix(dir.as_str())
            .unwrap_or_default()
            .trim_start_matches('/');
        rel.split_once('/').is_some_and(|(top, rest)| {
            !rest.contains('/')
                && (top == "manifest"
                    || top
                        .strip_prefix("bucket-")
                        .is_some_and(|b| b.parse::<u32>().is_ok()))
        })
    };
    remove_unreferenced(warehouse, table, &objects, &live, candidate, grace, dry_run).await
}

/// Store paths of every file a snapshot of the table at `table` needs to be read: its manifest
/// lists, their manifests and the data files live in it (tests check each exists: no snapshot
/// may reference a missing file). Files a snapshot's manifests add and delete again are left out:
/// expiry may have removed them.
pub async fn referenced_files(
    warehouse: &Warehouse,
    table: &str,
) -> Result<HashSet<String>, CleanupError> {
    paths(warehouse, table, &referenced(warehouse, table, true).await?).await
}

/// The store paths of `refs` (data files under their partition directories, read with the
/// table's newest schema: Paimon never changes a table's partition keys).
async fn paths(
    warehouse: &Warehouse,
    table: &str,
    refs: &Refs,
) -> Result<HashSet<String>, CleanupError> {
    let unreadable = |detail: String| CleanupError::Unreadable {
        path: table.to_owned(),
        what: "a Paimon table",
        detail,
    };
    let partitions = match super::table::load_schema(warehouse, table)
        .await
        .map_err(|e| unreadable(e.to_string()))?
    {
        Some(schema) => PartitionKeys::of(&schema).map_err(unreadable)?,
        None => PartitionKeys::default(),
    };
    let mut live = HashSet::new();
    for name in refs.lists.iter().chain(&refs.manifests) {
        live.insert(
            warehouse
                .path(&format!("{table}/manifest/{name}"))?
                .to_string(),
        );
    }
    for file in &refs.files {
        let path = file_path(&partitions, file).map_err(unreadable)?;
        live.insert(warehouse.path(&format!("{table}/{path}"))?.to_string());
    }
    Ok(live)
}

/// What the table's snapshots reference; data files only where live in a snapshot when
/// `live_only`, else every file a manifest of theirs lists (cleanup's conservative set).
async fn referenced(
    warehouse: &Warehouse,
    table: &str,
    live_only: bool,
) -> Result<Refs, CleanupError> {
    let unreadable = |e: crate::sinks::SinkError| CleanupError::Unreadable {
        path: table.to_owned(),
        what: "a Paimon table",
        detail: e.to_string(),
    };
    let mut refs = Refs::default();
    let Some(latest) = snapshot::latest_id(warehouse, table)
        .await
        .map_err(unreadable)?
    else {
        return Ok(refs);
    };
    let earliest = snapshot::earliest_id(warehouse, table, latest)
        .await
        .map_err(unreadable)?
        .unwrap_or(latest);
    let mut cache = HashMap::new();
    let mut read = 0usize;
    for id in earliest..=latest {
        let scope = if live_only {
            Scope::Live
        } else {
            Scope::Listed
        };
        let found = collect(warehouse, table, id, scope, &mut refs, &mut cache)
            .await
            .map_err(unreadable)?;
        read += usize::from(found.is_some());
    }
    if read == 0 {
        // The hints name snapshots that are not there: an empty live set would make every data
        // file an orphan.
        return Err(CleanupError::Unreadable {
            path: table.to_owned(),
            what: "a Paimon table",
            detail: format!("no snapshot between {earliest} and {latest} could be read"),
        });
    }
    Ok(refs)
}
