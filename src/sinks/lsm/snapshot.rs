//! Snapshots and what they name, read back: `snapshot/snapshot-N` (JSON, Paimon `Snapshot.java`),
//! the `LATEST` and `EARLIEST` hints, manifest lists and manifests.
//!
//! A Paimon snapshot names two manifest lists: `baseManifestList` (every manifest of the previous
//! snapshot) and `deltaManifestList` (its commit's manifest). The hints are written after the
//! snapshot (a failure there does not undo the commit), so readers verify them (pypaimon
//! `SnapshotManager`), and so does this module: the newest snapshot is the last one present from
//! `LATEST` on, the oldest the first one present from `EARLIEST` on. Writing a snapshot is
//! `publish.rs`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::manifest::{self, ManifestEntry, ManifestFileMeta};
use super::store::{corrupt, highest_numbered, read, read_json};
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// `snapshot/snapshot-N`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    pub version: i32,
    pub id: i64,
    pub schema_id: i64,
    pub base_manifest_list: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_manifest_list_size: Option<i64>,
    pub delta_manifest_list: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_manifest_list_size: Option<i64>,
    /// The commit's changelog files (`changelog-producer = input`), if it wrote any.
    #[serde(default)]
    pub changelog_manifest_list: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changelog_manifest_list_size: Option<i64>,
    #[serde(default)]
    pub index_manifest: Option<String>,
    pub commit_user: String,
    pub commit_identifier: i64,
    /// `APPEND`, `COMPACT` or `OVERWRITE`.
    pub commit_kind: String,
    pub time_millis: i64,
    pub total_record_count: i64,
    pub delta_record_count: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changelog_record_count: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub properties: Option<BTreeMap<String, String>>,
}

pub fn snapshot_location(table: &str, id: i64) -> String {
    format!("{table}/snapshot/snapshot-{id}")
}

pub async fn read_snapshot(
    w: &Warehouse,
    table: &str,
    id: i64,
) -> Result<Option<Snapshot>, SinkError> {
    read_json(w, &snapshot_location(table, id)).await
}

async fn read_hint(w: &Warehouse, table: &str, name: &str) -> Result<Option<i64>, SinkError> {
    let loc = format!("{table}/snapshot/{name}");
    Ok(read(w, &loc)
        .await?
        .and_then(|b| std::str::from_utf8(&b).ok()?.trim().parse().ok()))
}

/// The oldest snapshot id still present (the `EARLIEST` hint, checked), if any.
pub async fn earliest_id(
    w: &Warehouse,
    table: &str,
    latest: i64,
) -> Result<Option<i64>, SinkError> {
    let mut id = read_hint(w, table, "EARLIEST").await?.unwrap_or(1).max(1);
    while id <= latest {
        if read(w, &snapshot_location(table, id)).await?.is_some() {
            return Ok(Some(id));
        }
        id += 1;
    }
    Ok(None)
}

/// The newest snapshot id: the `LATEST` hint, then forward while newer snapshots exist; without
/// a hint, a listing of `snapshot/`.
pub async fn latest_id(w: &Warehouse, table: &str) -> Result<Option<i64>, SinkError> {
    let mut id = match read_hint(w, table, "LATEST").await? {
        Some(id) => id,
        None => match highest_numbered(w, &format!("{table}/snapshot"), "snapshot-").await? {
            Some(id) => id,
            None => return Ok(None),
        },
    };
    while read(w, &snapshot_location(table, id + 1)).await?.is_some() {
        id += 1;
    }
    Ok(Some(id))
}

/// A manifest list (a snapshot names it); its absence is corruption.
pub async fn read_manifest_list(
    w: &Warehouse,
    table: &str,
    name: &str,
) -> Result<Vec<ManifestFileMeta>, SinkError> {
    read_manifest_list_if_present(w, table, name)
        .await?
        .ok_or_else(|| missing(table, name))
}

/// A manifest list, or `None` when it is not there.
pub async fn read_manifest_list_if_present(
    w: &Warehouse,
    table: &str,
    name: &str,
) -> Result<Option<Vec<ManifestFileMeta>>, SinkError> {
    read_manifest_file(w, table, name, manifest::decode_list).await
}

/// A manifest's entries (a manifest list names it); its absence is corruption.
pub async fn read_manifest(
    w: &Warehouse,
    table: &str,
    name: &str,
) -> Result<Vec<ManifestEntry>, SinkError> {
    read_manifest_if_present(w, table, name)
        .await?
        .ok_or_else(|| missing(table, name))
}

/// A manifest's entries, or `None` when it is not there.
pub async fn read_manifest_if_present(
    w: &Warehouse,
    table: &str,
    name: &str,
) -> Result<Option<Vec<ManifestEntry>>, SinkError> {
    read_manifest_file(w, table, name, manifest::decode_entries).await
}

/// `manifest/<name>` decoded by `decode`, or `None` when it is not there.
async fn read_manifest_file<T>(
    w: &Warehouse,
    table: &str,
    name: &str,
    decode: fn(&[u8]) -> Result<T, manifest::ManifestError>,
) -> Result<Option<T>, SinkError> {
    let loc = format!("{table}/manifest/{name}");
    let Some(data) = read(w, &loc).await? else {
        return Ok(None);
    };
    decode(&data).map(Some).map_err(|e| corrupt(&loc, e))
}

fn missing(table: &str, name: &str) -> SinkError {
    corrupt(&format!("{table}/manifest/{name}"), "missing")
}
