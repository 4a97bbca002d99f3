//! The files an expiry left to delete, deleted `cdcd.expiry.delete-delay-ms` after the expiry
//! committed ([`PendingDeletes`]).
//!
//! Why a delay: a snapshot in the metadata serves time travel, and each one kept costs every
//! later commit an entry in `vN.metadata.json`; a reader's scan, planned on a snapshot, needs
//! that snapshot's *files* until it ends. Removing snapshots from the metadata early and their
//! files later keeps the metadata small at one commit a second without failing a running scan
//! (properties.rs, `CDCD_MAX_SNAPSHOT_AGE_MS`). A file an expiry dooms is reached by no snapshot
//! the table keeps, and no later commit ever names it again (commits add new files and carry
//! entries of the current snapshot, which an expiry always keeps), so deleting it later is as
//! safe as deleting it at once.
//!
//! Each expiry's doomed files are written as one record,
//! `<warehouse>/_cdcd/<pipeline>/maintenance/<namespace>/<table>/deletes/<due ms>-v<N>.json`
//! (`N`: the metadata version the expiry left), after its commit landed and before its intent
//! record (`journal.rs`) is removed, so a crash at any point leaves one of the two; the record is
//! removed once every file it names is deleted (files already gone count as deleted, so a crash
//! part-way only repeats deletions). Records are listed once per table per process (the first
//! cycle); after that this process knows them, being the table's only cdcd writer (the lease).

use std::collections::BTreeSet;

use object_store::{ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use super::metadata_log;
use crate::failpoints;
use crate::sinks::iceberg::files::manifest::read;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// One record: the files to delete once `due_ms` (Unix ms) passed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Record {
    due_ms: i64,
    files: Vec<String>,
}

/// The records of one table; see the module doc.
#[derive(Debug)]
pub struct PendingDeletes {
    /// `…/maintenance/<namespace>/<table>/deletes`.
    dir: String,
    /// Whether `dir` was listed by this process.
    listed: bool,
    /// (due ms, record location), the earliest first.
    records: BTreeSet<(i64, String)>,
}

impl PendingDeletes {
    pub fn new(warehouse: &Warehouse, pipeline: &str, namespace: &str, table: &str) -> Self {
        PendingDeletes {
            dir: warehouse.location(&[
                "_cdcd",
                pipeline,
                "maintenance",
                namespace,
                table,
                "deletes",
            ]),
            listed: false,
            records: BTreeSet::new(),
        }
    }

    /// When the earliest record is due (`None`: none known).
    pub fn next_due_ms(&self) -> Option<i64> {
        self.records.first().map(|(due, _)| *due)
    }

    /// Records `files` for deletion at `due_ms`; `version`: the metadata version the expiry left
    /// (names the record, so recording the same expiry twice overwrites one record).
    pub async fn schedule(
        &mut self,
        warehouse: &Warehouse,
        files: Vec<String>,
        due_ms: i64,
        version: u64,
    ) -> Result<(), SinkError> {
        if files.is_empty() {
            return Ok(());
        }
        self.list_once(warehouse).await?;
        let location = format!("{}/{due_ms:013}-v{version}.json", self.dir);
        let record = Record { due_ms, files };
        let json = serde_json::to_vec(&record).map_err(|e| SinkError::Corrupt {
            path: location.clone(),
            detail: e.to_string(),
        })?;
        let path = warehouse.path(&location)?;
        warehouse
            .store()
            .put(&path, PutPayload::from(json))
            .await
            .map_err(|source| SinkError::Storage {
                path: location.clone(),
                source,
            })?;
        self.records.insert((due_ms, location));
        Ok(())
    }

    /// Deletes the files of every record due at `now_ms`, then the record. Returns the files
    /// deleted.
    pub async fn delete_due(
        &mut self,
        warehouse: &Warehouse,
        now_ms: i64,
    ) -> Result<u64, SinkError> {
        self.list_once(warehouse).await?;
        let mut deleted = 0u64;
        while let Some((due, location)) = self.records.first().cloned() {
            if due > now_ms {
                break;
            }
            let record: Record = match read(warehouse, &location).await {
                Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| SinkError::Corrupt {
                    path: location.clone(),
                    detail: format!("{e}; delete the file (only files no snapshot reaches are at stake: `cdcd cleanup` finds them)"),
                })?,
                Err(SinkError::Storage {
                    source: object_store::Error::NotFound { .. },
                    ..
                }) => {
                    self.records.remove(&(due, location));
                    continue;
                }
                Err(e) => return Err(e),
            };
            // In two halves, with the crash point between: a crash part-way leaves the record,
            // and the next cycle deletes again what is left.
            let (first, rest) = record.files.split_at(record.files.len() / 2);
            deleted += metadata_log::delete_all(warehouse, first).await? as u64;
            if !first.is_empty() {
                failpoints::crash_point(failpoints::EXPIRE_DURING_DELETE);
            }
            deleted += metadata_log::delete_all(warehouse, rest).await? as u64;
            metadata_log::delete_all(warehouse, std::slice::from_ref(&location)).await?;
            self.records.remove(&(due, location));
        }
        Ok(deleted)
    }

    /// Lists the table's records, the first time only (see the module doc).
    async fn list_once(&mut self, warehouse: &Warehouse) -> Result<(), SinkError> {
        if self.listed {
            return Ok(());
        }
        for object in metadata_log::list(warehouse, &self.dir).await? {
            let location = warehouse.location_of(&object.location);
            match due_of(&location) {
                Some(due) => {
                    self.records.insert((due, location));
                }
                None => {
                    tracing::warn!(file = %location, "not a record of pending deletions; left alone");
                }
            }
        }
        self.listed = true;
        Ok(())
    }
}

/// `…/deletes/0001733512345678-v12.json` → 1733512345678.
fn due_of(location: &str) -> Option<i64> {
    let name = location.rsplit('/').next()?;
    let (due, rest) = name.split_once("-v")?;
    rest.strip_suffix(".json")?.parse::<u64>().ok()?;
    due.parse().ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use futures::TryStreamExt;

    use super::*;

    fn warehouse() -> Warehouse {
        Warehouse::from_url("memory://").unwrap()
    }

    async fn put(w: &Warehouse, name: &str) -> String {
        let location = w.location(&["ns", "t", "data", name]);
        let path = w.path(&location).unwrap();
        w.store()
            .put(&path, PutPayload::from(vec![1u8]))
            .await
            .unwrap();
        location
    }

    async fn exists(w: &Warehouse, location: &str) -> bool {
        w.store().head(&w.path(location).unwrap()).await.is_ok()
    }

    #[test]
    fn due_times_are_read_from_record_names() {
        assert_eq!(
            due_of("file:///w/_cdcd/p/maintenance/ns/t/deletes/0001733512345678-v12.json"),
            Some(1733512345678)
        );
        assert_eq!(due_of("file:///w/deletes/12.json"), None);
        assert_eq!(due_of("file:///w/deletes/x-v1.json"), None);
    }

    #[tokio::test]
    async fn files_wait_until_due_then_go_with_their_record() {
        let w = warehouse();
        let a = put(&w, "a.parquet").await;
        let b = put(&w, "b.puffin").await;
        let mut pending = PendingDeletes::new(&w, "p", "ns", "t");
        pending
            .schedule(&w, vec![a.clone(), b.clone()], 1_000, 7)
            .await
            .unwrap();
        assert_eq!(pending.next_due_ms(), Some(1_000));
        assert_eq!(pending.delete_due(&w, 999).await.unwrap(), 0);
        assert!(exists(&w, &a).await && exists(&w, &b).await);
        assert_eq!(pending.delete_due(&w, 1_000).await.unwrap(), 2);
        assert!(!exists(&w, &a).await && !exists(&w, &b).await);
        assert_eq!(pending.next_due_ms(), None);
        let left: Vec<_> = w.store().list(None).try_collect().await.unwrap();
        assert!(
            left.is_empty(),
            "the record is removed with its files: {left:?}"
        );
    }

    #[tokio::test]
    async fn a_new_process_finds_the_records_a_crash_left() {
        let w = warehouse();
        let a = put(&w, "a.parquet").await;
        let b = put(&w, "b.parquet").await;
        let mut before_crash = PendingDeletes::new(&w, "p", "ns", "t");
        before_crash
            .schedule(&w, vec![a.clone()], 2_000, 3)
            .await
            .unwrap();
        before_crash
            .schedule(&w, vec![b.clone()], 5_000, 4)
            .await
            .unwrap();
        drop(before_crash);
        let mut after = PendingDeletes::new(&w, "p", "ns", "t");
        assert_eq!(after.delete_due(&w, 3_000).await.unwrap(), 1);
        assert!(!exists(&w, &a).await);
        assert!(exists(&w, &b).await, "not due yet");
        assert_eq!(after.next_due_ms(), Some(5_000));
        let other_table = PendingDeletes::new(&w, "p", "ns", "t2");
        assert_eq!(other_table.next_due_ms(), None);
    }

    #[tokio::test]
    async fn files_already_gone_count_as_deleted() {
        let w = warehouse();
        let a = put(&w, "a.parquet").await;
        let mut pending = PendingDeletes::new(&w, "p", "ns", "t");
        pending
            .schedule(&w, vec![a.clone(), w.location(&["ns", "t", "gone"])], 0, 1)
            .await
            .unwrap();
        assert_eq!(pending.delete_due(&w, 0).await.unwrap(), 2);
        assert!(!exists(&w, &a).await);
    }
}
