//! The pipeline's progress: `<warehouse>/_cdcd/<pipeline>/progress.json`, the newest position the
//! pipeline acknowledged and the checkpoint each table had then.
//!
//! Why: a MySQL/MariaDB pipeline resumes from the oldest table checkpoint. A table nobody writes
//! never commits, so its checkpoint stays where its last change (or its copy) left it; every
//! restart re-read the binlog from there, and once the server purged those binlogs the pipeline
//! could not start at all. The source's heartbeats move the pipeline past such a table, but only
//! in memory. This file makes that progress durable without a snapshot per idle table.
//!
//! What the file claims: every table it lists holds every change at or below `position`. The
//! pipeline writes only a position it acknowledged, which needs every table to have committed what
//! it buffered up to there (a table with nothing buffered had no change there), and writes it
//! after the acknowledgement; so a crash between a table commit and this write leaves an older
//! file, and the restart re-reads more, never less. Each listed table carries the checkpoint it had
//! then: the claim is used for a table only while its checkpoint is still at or past that one (a
//! table rolled back or recreated under cdcd falls back to its own checkpoint). Tables whose
//! initial copy is incomplete are not listed, nor are tables added to `tables` since: they keep
//! their own rules.
//!
//! The file is a hint that only ever shortens the re-read: losing it, or an unreadable one (a
//! warning), restores the behaviour without it. Writes overwrite the object in one put (atomic on
//! local disk and S3), and a write that fails is retried with the next acknowledgement.
//!
//! Postgres pipelines neither write nor read it: the replication slot's confirmed position already
//! keeps the pipeline's progress on the server, and the server streams from there whatever older
//! position the tables ask for.

use std::collections::BTreeMap;

use object_store::path::Path;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use crate::changelog::{Position, TableId};
use crate::storage::{StorageError, Warehouse};

/// The progress file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ProgressError {
    #[error("pipeline progress {path}: storage error: {source}")]
    Storage {
        path: String,
        #[source]
        source: object_store::Error,
    },
    #[error(transparent)]
    Location(#[from] StorageError),
}

/// The acknowledged position and what each table's checkpoint was when it was acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub position: Position,
    /// Tables complete through `position`, each with its checkpoint at the time.
    pub tables: BTreeMap<TableId, Position>,
}

/// The file's content (positions in their `cdcd.position` text).
#[derive(Debug, Serialize, Deserialize)]
struct ProgressRecord {
    position: String,
    tables: Vec<TableRecord>,
    /// Wall-clock time of the write, for people reading the file.
    written_at: String,
}

/// One listed table and its `cdcd.position` at the time.
#[derive(Debug, Serialize, Deserialize)]
struct TableRecord {
    namespace: String,
    name: String,
    position: String,
}

impl Progress {
    /// Where `table` resumes from: the join of its own checkpoint `own` and this position, when
    /// the file's claim still holds for it; `own` otherwise.
    pub fn resume_point(&self, table: &TableId, own: &Position) -> Position {
        let holds = self.tables.get(table).is_some_and(|then| own.covers(then));
        match holds.then(|| own.join(&self.position)).flatten() {
            Some(joined) => joined,
            None => own.clone(),
        }
    }
}

/// `<warehouse>/_cdcd/<pipeline>/progress.json` and the store it lives in.
#[derive(Debug, Clone)]
pub struct ProgressStore {
    warehouse: Warehouse,
    path: Path,
    location: String,
}

impl ProgressStore {
    pub fn new(warehouse: &Warehouse, pipeline: &str) -> Result<ProgressStore, ProgressError> {
        let location = warehouse.location(&["_cdcd", pipeline, "progress.json"]);
        let path = warehouse.path(&location)?;
        Ok(ProgressStore {
            warehouse: warehouse.clone(),
            path,
            location,
        })
    }

    pub fn location(&self) -> &str {
        &self.location
    }

    fn storage(&self, source: object_store::Error) -> ProgressError {
        ProgressError::Storage {
            path: self.location.clone(),
            source,
        }
    }

    /// The stored progress; `None` when there is none or it cannot be understood (logged: it is
    /// only a hint, see the module doc).
    pub async fn read(&self) -> Result<Option<Progress>, ProgressError> {
        let bytes = match self.warehouse.store().get(&self.path).await {
            Ok(got) => got.bytes().await.map_err(|e| self.storage(e))?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.storage(e)),
        };
        let parsed = serde_json::from_slice::<ProgressRecord>(&bytes)
            .map_err(|e| e.to_string())
            .and_then(|r| {
                let position = r.position.parse::<Position>().map_err(|e| e.to_string())?;
                let mut tables = BTreeMap::new();
                for t in r.tables {
                    let cp = t.position.parse::<Position>().map_err(|e| e.to_string())?;
                    tables.insert(TableId::new(t.namespace, t.name), cp);
                }
                Ok(Progress { position, tables })
            });
        match parsed {
            Ok(p) => Ok(Some(p)),
            Err(e) => {
                tracing::warn!(path = %self.location, error = %e, "ignoring an unreadable pipeline progress file: tables resume from their own checkpoints");
                Ok(None)
            }
        }
    }

    /// Replaces the stored progress with `progress`.
    pub async fn write(&self, progress: &Progress) -> Result<(), ProgressError> {
        let record = ProgressRecord {
            position: progress.position.to_string(),
            tables: progress
                .tables
                .iter()
                .map(|(t, p)| TableRecord {
                    namespace: t.namespace.clone(),
                    name: t.name.clone(),
                    position: p.to_string(),
                })
                .collect(),
            written_at: chrono::Utc::now().to_rfc3339(),
        };
        let body = serde_json::to_vec_pretty(&record).unwrap_or_default();
        let opts = PutOptions {
            mode: PutMode::Overwrite,
            ..PutOptions::default()
        };
        self.warehouse
            .store()
            .put_opts(&self.path, PutPayload::from(body), opts)
            .await
            .map_err(|e| self.storage(e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::{position as pos, progress};

    #[tokio::test]
    async fn round_trips_through_the_store() {
        let wh = Warehouse::from_url("memory://").unwrap();
        let store = ProgressStore::new(&wh, "shop").unwrap();
        assert_eq!(store.read().await.unwrap(), None);
        assert!(store.location().ends_with("/_cdcd/shop/progress.json"));
        let progress = progress("0-1-42", &[("a", "0-1-40"), ("b", "empty-gtid-list")]);
        store.write(&progress).await.unwrap();
        assert_eq!(store.read().await.unwrap(), Some(progress));
        // Unreadable content is ignored, not fatal.
        wh.store()
            .put(&store.path, PutPayload::from_static(b"{not json"))
            .await
            .unwrap();
        assert_eq!(store.read().await.unwrap(), None);
    }

    #[test]
    fn resume_point_joins_only_where_the_claim_holds() {
        let a = TableId::new("db", "a");
        let b = TableId::new("db", "b");
        let progress = Progress {
            position: pos("0-1-50"),
            tables: [(a.clone(), pos("0-1-10"))].into_iter().collect(),
        };
        // Idle since: the progress wins.
        assert_eq!(progress.resume_point(&a, &pos("0-1-10")), pos("0-1-50"));
        // Committed past the progress since: its own checkpoint.
        assert_eq!(progress.resume_point(&a, &pos("0-1-60")), pos("0-1-60"));
        // Rolled back below what the file saw: its own checkpoint.
        assert_eq!(progress.resume_point(&a, &pos("0-1-5")), pos("0-1-5"));
        // Not listed (added since): its own checkpoint.
        assert_eq!(progress.resume_point(&b, &pos("0-1-10")), pos("0-1-10"));
        // Incomparable GTID lists: complete through both, so through their join.
        let multi = Progress {
            position: pos("0-1-50,1-1-3"),
            tables: [(a.clone(), pos("0-1-10,1-1-5"))].into_iter().collect(),
        };
        assert_eq!(
            multi.resume_point(&a, &pos("0-1-10,1-1-5")),
            pos("0-1-50,1-1-5")
        );
    }
}
