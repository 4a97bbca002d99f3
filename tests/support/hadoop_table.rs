//! Another engine committing to a filesystem-catalog Iceberg table the way Iceberg-Java's
//! `HadoopTableOperations` does for `ALTER TABLE … SET TBLPROPERTIES`: load the newest
//! `v<N>.metadata.json`, copy it with a property set and the loaded file appended to the
//! metadata log (trimmed to `write.metadata.previous-versions-max`), create `v<N+1>` if absent,
//! write `version-hint.text` (only while `v<N+1>` is the newest listed, as Iceberg-Java 1.6+
//! checks), then delete the metadata files that left the log
//! (`write.metadata.delete-after-commit.enabled`). The metadata is edited as JSON, so the files
//! are another writer's bytes, not cdcd's.
//!
//! Works on any warehouse cdcd can open (local disk, S3). [`HadoopTable::newest`] and
//! [`HadoopTable::hint`] are also what a test observes the table with.
#![allow(dead_code)]

use std::time::Duration;

use cdcd::storage::{put_create, Created, Warehouse};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use serde_json::{json, Value};

/// One table directory (`<warehouse>/<namespace>/<table>`) written as another engine.
#[derive(Clone)]
pub struct HadoopTable {
    pub warehouse: Warehouse,
    /// The table's location as its metadata names it, e.g. `file:///tmp/…/wh/shop/t`.
    pub location: String,
}

impl HadoopTable {
    pub fn new(warehouse: Warehouse, location: &str) -> HadoopTable {
        HadoopTable {
            warehouse,
            location: location.trim_end_matches('/').to_owned(),
        }
    }

    fn file(&self, version: u64) -> String {
        format!("{}/metadata/v{version}.metadata.json", self.location)
    }

    fn path(&self, location: &str) -> Path {
        self.warehouse.path(location).unwrap()
    }

    /// Every `v<N>` listed in `metadata/`, ascending.
    pub async fn versions(&self) -> Vec<u64> {
        let prefix = self.path(&format!("{}/metadata", self.location));
        let listed: Vec<_> = self
            .warehouse
            .store()
            .list(Some(&prefix))
            .try_collect()
            .await
            .unwrap();
        let mut versions: Vec<u64> = listed
            .iter()
            .filter_map(|o| o.location.filename())
            .filter_map(|n| {
                n.strip_prefix('v')?
                    .strip_suffix(".metadata.json")?
                    .parse()
                    .ok()
            })
            .collect();
        versions.sort_unstable();
        versions
    }

    /// The metadata of `v<version>`, `None` when the file is absent (deleted meanwhile).
    pub async fn read(&self, version: u64) -> Option<Value> {
        let got = self
            .warehouse
            .store()
            .get(&self.path(&self.file(version)))
            .await;
        let bytes = got.ok()?.bytes().await.ok()?;
        Some(serde_json::from_slice(&bytes).unwrap())
    }

    /// The highest listed version and its metadata (`None`: no table yet).
    pub async fn newest(&self) -> Option<(u64, Value)> {
        loop {
            let newest = *self.versions().await.last()?;
            if let Some(meta) = self.read(newest).await {
                return Some((newest, meta));
            }
        }
    }

    /// The version `version-hint.text` names, if it exists.
    pub async fn hint(&self) -> Option<u64> {
        let hint = self.path(&format!("{}/metadata/version-hint.text", self.location));
        let bytes = self
            .warehouse
            .store()
            .get(&hint)
            .await
            .ok()?
            .bytes()
            .await
            .ok()?;
        std::str::from_utf8(&bytes).ok()?.trim().parse().ok()
    }

    /// One commit setting property `key` to `value`; retried on top of the newest version when
    /// another writer took the next one first. Returns the version committed.
    pub async fn set_property(&self, key: &str, value: &str) -> u64 {
        for _ in 0..50 {
            let (base_version, base) = self.newest().await.expect("no table to commit to");
            let next = next_metadata(&base, &self.file(base_version), key, value);
            let version = base_version + 1;
            let bytes = serde_json::to_vec_pretty(&next).unwrap();
            let path = self.path(&self.file(version));
            match put_create(self.warehouse.store().as_ref(), &path, bytes.into())
                .await
                .unwrap()
            {
                Created::Created | Created::AlreadyOurs => {}
                Created::Conflict => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
            }
            if self.versions().await.last() == Some(&version) {
                let hint = self.path(&format!("{}/metadata/version-hint.text", self.location));
                self.warehouse
                    .store()
                    .put(&hint, PutPayload::from(version.to_string()))
                    .await
                    .unwrap();
            }
            if property(&next, "write.metadata.delete-after-commit.enabled") == Some("true") {
                for file in left_the_log(&base, &next) {
                    let _ = self.warehouse.store().delete(&self.path(&file)).await;
                }
            }
            return version;
        }
        panic!("the other writer lost 50 races in a row");
    }
}

fn property<'a>(meta: &'a Value, key: &str) -> Option<&'a str> {
    meta["properties"][key].as_str()
}

/// `base` (read from `base_file`) with `key = value`, a fresh `last-updated-ms`, and
/// `base_file` appended to the metadata log, trimmed to `write.metadata.previous-versions-max`
/// (Iceberg's default 100).
fn next_metadata(base: &Value, base_file: &str, key: &str, value: &str) -> Value {
    let mut next = base.clone();
    next["properties"][key] = json!(value);
    let base_ms = base["last-updated-ms"].as_i64().unwrap();
    let now = chrono::Utc::now().timestamp_millis();
    next["last-updated-ms"] = json!(now.max(base_ms + 1));
    let keep: usize = property(base, "write.metadata.previous-versions-max")
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
        .max(1);
    let mut log = base["metadata-log"].as_array().cloned().unwrap_or_default();
    log.push(json!({"metadata-file": base_file, "timestamp-ms": base_ms}));
    let drop = log.len().saturating_sub(keep);
    log.drain(..drop);
    next["metadata-log"] = Value::Array(log);
    next
}

/// The metadata files in `base`'s log that `next`'s no longer names (Iceberg-Java's
/// `deleteRemovedMetadataFiles`: `base.previousFiles()` minus `next.previousFiles()`).
fn left_the_log(base: &Value, next: &Value) -> Vec<String> {
    let files = |m: &Value| -> Vec<String> {
        m["metadata-log"]
            .as_array()
            .map(|l| {
                l.iter()
                    .filter_map(|e| e["metadata-file"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let kept = files(next);
    files(base)
        .into_iter()
        .filter(|f| !kept.contains(f))
        .collect()
}

/// The summary of the current snapshot of `meta`, if it has one.
pub fn current_summary(meta: &Value) -> Option<&Value> {
    let current = meta["current-snapshot-id"].as_i64()?;
    meta["snapshots"]
        .as_array()?
        .iter()
        .find(|s| s["snapshot-id"].as_i64() == Some(current))
        .map(|s| &s["summary"])
}
