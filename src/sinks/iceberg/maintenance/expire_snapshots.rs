//! Snapshot expiry ([`ExpireSnapshots`], Iceberg-Java's `ExpireSnapshots`): finish an expiry a
//! crash interrupted (`journal.rs` names it), expire what the table's properties say
//! (`expire.rs` decides, pure), and delete the files only the expired snapshots reached
//! (`reachable.rs`).
//!
//! Concurrency with streaming commits of the same table in this process: the expiry's metadata
//! commit is made under the table's slot lock (the one a streaming commit holds from loading its
//! base to publishing), from freshly loaded metadata, so the two never race each other for
//! `v<N+1>`; the lock is held for one metadata load and one put, not for the reading of
//! manifests or the deletions. Another process's commit (another engine) can still win
//! `v<N+1>`: the expiry reloads and decides again, a few times, and deletes nothing until its
//! own commit landed.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::spec::{SnapshotReference, TableMetadata, TableMetadataBuilder};

use super::expire::{self, Expiry, Pins, SnapshotInfo};
use super::journal::{self, Expiring};
use super::pending_deletes::PendingDeletes;
use super::properties::Retention;
use super::reachable::{reachable, ManifestCache, Missing, Reachable};
use crate::changelog::TableId;
use crate::checkpoint::Checkpoint;
use crate::failpoints;
use crate::sinks::iceberg::files::manifest::read;
use crate::sinks::iceberg::files::metadata::Loaded;
use crate::sinks::iceberg::tables::Tables;
use crate::sinks::SinkError;

/// Snapshots one cycle expires at most (the oldest first); the next cycle takes the rest. Bounds
/// a cycle's reads and deletions after a long pause or a lowered retention.
pub const MAX_EXPIRED_PER_CYCLE: usize = 500;

/// Attempts of an expiry that lost its commit to another writer.
const ATTEMPTS: usize = 3;

/// What one expiry committed.
pub(super) struct Committed {
    before: Arc<Loaded>,
    pub(super) after: Arc<Loaded>,
    pub(super) expiry: Expiry,
}

/// An expiry that found nothing to expire: the metadata it decided on, and when something will
/// be due if the table stays as it is (`expire::next_due`; `None`: never).
pub(super) struct Unchanged {
    pub(super) loaded: Arc<Loaded>,
    pub(super) next_due_ms: Option<i64>,
}

/// The expiry of one table's snapshots; see the module doc.
pub(super) struct ExpireSnapshots<'a> {
    tables: &'a Tables,
    table: &'a TableId,
    /// Where the expiry in progress is noted (`journal.rs`).
    journal: String,
}

impl<'a> ExpireSnapshots<'a> {
    pub(super) fn new(tables: &'a Tables, table: &'a TableId) -> ExpireSnapshots<'a> {
        let ns = tables.namespace.as_deref().unwrap_or(&table.namespace);
        let journal = journal::location(&tables.warehouse, &tables.pipeline, ns, &table.name);
        ExpireSnapshots {
            tables,
            table,
            journal,
        }
    }

    /// Finishes the expiry a crash interrupted, if the journal names one: records what it
    /// expired for deletion (`pending_deletes.rs`), then removes the journal.
    pub(super) async fn finish_interrupted(
        &self,
        cache: &ManifestCache,
        pending: &mut PendingDeletes,
    ) -> Result<(), SinkError> {
        let Some(left) = journal::read(&self.tables.warehouse, &self.journal).await? else {
            return Ok(());
        };
        self.finish(&left, cache, pending).await?;
        journal::remove(&self.tables.warehouse, &self.journal).await
    }

    /// Decides and commits one expiry, deciding again after losing the commit to another writer
    /// (a few times). `Ok(None)`: no table; `Ok(Some(Err(_)))`: nothing to expire.
    pub(super) async fn commit(&self) -> Result<Option<Result<Committed, Unchanged>>, SinkError> {
        let mut committed = None;
        for attempt in 1..=ATTEMPTS {
            match self.attempt().await {
                Ok(c) => {
                    committed = Some(c);
                    break;
                }
                Err(SinkError::CommitConflict { .. }) if attempt < ATTEMPTS => {
                    tracing::info!(table = %self.table, attempt, "expiry lost its commit to another writer; deciding again");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(committed.flatten())
    }

    /// After `c` landed: records the files only its expired snapshots reached for deletion after
    /// the table's delete delay (`pending_deletes.rs`), then removes the journal.
    pub(super) async fn schedule_expired(
        &self,
        c: &Committed,
        cache: &ManifestCache,
        pending: &mut PendingDeletes,
    ) -> Result<(), SinkError> {
        failpoints::crash_point(failpoints::EXPIRE_AFTER_COMMIT);
        let doomed = self
            .unreachable(&c.before.metadata, &c.after.metadata, cache)
            .await?;
        self.schedule(doomed, &c.after, pending).await?;
        journal::remove(&self.tables.warehouse, &self.journal).await
    }

    /// Records `doomed` for deletion once `current`'s delete delay passed.
    async fn schedule(
        &self,
        doomed: Vec<String>,
        current: &Loaded,
        pending: &mut PendingDeletes,
    ) -> Result<(), SinkError> {
        let delay = Retention::from_properties(current.metadata.properties())
            .map_err(|e| SinkError::Data {
                table: self.table.clone(),
                detail: format!("maintenance skipped: {e}"),
            })?
            .delete_delay_ms;
        let due = chrono::Utc::now()
            .timestamp_millis()
            .saturating_add(delay.max(0));
        pending
            .schedule(&self.tables.warehouse, doomed, due, current.version)
            .await
    }

    /// Decides and commits one expiry from the newest metadata, under the table's slot lock.
    /// `Ok(None)`: no table; `Ok(Some(Err(_)))`: nothing to expire.
    async fn attempt(&self) -> Result<Option<Result<Committed, Unchanged>>, SinkError> {
        let (tables, table) = (self.tables, self.table);
        let slot = tables.slot(table);
        let _serialized = slot.lock().await;
        let Some(before) = tables.load(table).await? else {
            return Ok(None);
        };
        let meta = &before.metadata;
        let retention =
            Retention::from_properties(meta.properties()).map_err(|e| SinkError::Data {
                table: table.clone(),
                detail: format!("maintenance skipped: {e}"),
            })?;
        let snapshots: Vec<SnapshotInfo> = meta
            .snapshots()
            .map(|s| SnapshotInfo {
                id: s.snapshot_id(),
                parent: s.parent_snapshot_id(),
                timestamp_ms: s.timestamp_ms(),
            })
            .collect();
        let pins = Pins {
            current: meta.current_snapshot_id(),
            checkpoint: checkpoint_snapshot(&tables.pipeline, meta)?,
        };
        let refs = refs(table, meta)?;
        let now = chrono::Utc::now().timestamp_millis();
        let expiry = expire::choose(
            &snapshots,
            &refs,
            &retention,
            pins,
            now,
            MAX_EXPIRED_PER_CYCLE,
        );
        if expiry.is_empty() {
            let next_due_ms = expire::next_due(&snapshots, &refs, &retention, pins, now);
            return Ok(Some(Err(Unchanged {
                loaded: before,
                next_due_ms,
            })));
        }
        let record = Expiring {
            before: before.location(),
        };
        journal::write(&tables.warehouse, &self.journal, &record).await?;
        let next = without(table, &before, &expiry)?;
        // Conflict or unknown outcome: the next load tells; the journal says what to check.
        let after = tables
            .commit_metadata_and_sweep(table, &before, next)
            .await?;
        let version = after.version;
        tracing::debug!(table = %table, version, expired = expiry.snapshots.len(), "expiry committed");
        Ok(Some(Ok(Committed {
            before,
            after,
            expiry,
        })))
    }

    /// After a crash between an expiry's commit and the record of its deletions: `left.before`
    /// names the metadata expired from; what its snapshots reached and the current ones do not
    /// is recorded for deletion (nothing, when the commit never landed: every snapshot is still
    /// there).
    async fn finish(
        &self,
        left: &Expiring,
        cache: &ManifestCache,
        pending: &mut PendingDeletes,
    ) -> Result<(), SinkError> {
        let table = self.table;
        let Some(current) = self.tables.load(table).await? else {
            return Ok(());
        };
        let bytes = match read(&self.tables.warehouse, &left.before).await {
            Ok(b) => b,
            Err(SinkError::Storage {
                source: object_store::Error::NotFound { .. },
                ..
            }) => {
                tracing::warn!(table = %table, before = %left.before, "an interrupted expiry's metadata is gone; `cdcd cleanup` removes what it left");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let before: TableMetadata =
            serde_json::from_slice(&bytes).map_err(|e| SinkError::Corrupt {
                path: left.before.clone(),
                detail: e.to_string(),
            })?;
        let doomed = self.unreachable(&before, &current.metadata, cache).await?;
        let files = doomed.len();
        self.schedule(doomed, &current, pending).await?;
        tracing::info!(table = %table, files, "finished an interrupted expiry");
        Ok(())
    }

    /// What the snapshots of `before` that `after` no longer has reached, except what `after`'s
    /// snapshots reach. `after` must be committed (or newer).
    async fn unreachable(
        &self,
        before: &TableMetadata,
        after: &TableMetadata,
        cache: &ManifestCache,
    ) -> Result<Vec<String>, SinkError> {
        let gone_ids: Vec<i64> = before
            .snapshots()
            .map(|s| s.snapshot_id())
            .filter(|id| after.snapshot_by_id(*id).is_none())
            .collect();
        if gone_ids.is_empty() {
            return Ok(Vec::new());
        }
        let kept_ids: Vec<i64> = after.snapshots().map(|s| s.snapshot_id()).collect();
        let kept: Reachable = reachable(
            &self.tables.warehouse,
            after,
            &kept_ids,
            Missing::Error,
            cache,
        )
        .await?;
        let gone = reachable(
            &self.tables.warehouse,
            before,
            &gone_ids,
            Missing::Deleted,
            cache,
        )
        .await?;
        cache.retain(&kept);
        Ok(gone
            .files
            .into_iter()
            .filter(|f| !kept.files.contains(f))
            .collect())
    }
}

/// The newest snapshot of `main`'s history carrying `pipeline`'s checkpoint.
pub(super) fn checkpoint_snapshot(
    pipeline: &str,
    meta: &TableMetadata,
) -> Result<Option<i64>, SinkError> {
    let mut next = meta.current_snapshot();
    while let Some(s) = next {
        let props = &s.summary().additional_properties;
        if Checkpoint::from_properties(pipeline, props)?.is_some() {
            return Ok(Some(s.snapshot_id()));
        }
        next = s.parent_snapshot_id().and_then(|p| meta.snapshot_by_id(p));
    }
    Ok(None)
}

/// The table's refs (iceberg 0.10 keeps them private; the serialized metadata has them).
fn refs(
    table: &TableId,
    meta: &TableMetadata,
) -> Result<HashMap<String, SnapshotReference>, SinkError> {
    let corrupt = |e: serde_json::Error| SinkError::Data {
        table: table.clone(),
        detail: format!("reading the metadata's refs: {e}"),
    };
    let mut value = serde_json::to_value(meta).map_err(corrupt)?;
    match value.get_mut("refs").map(serde_json::Value::take) {
        Some(refs) if !refs.is_null() => serde_json::from_value(refs).map_err(corrupt),
        _ => Ok(HashMap::new()),
    }
}

/// `before`'s metadata without the expired refs and snapshots (and their statistics).
fn without(table: &TableId, before: &Loaded, expiry: &Expiry) -> Result<TableMetadata, SinkError> {
    let mut builder =
        TableMetadataBuilder::new_from_metadata(before.metadata.clone(), Some(before.location()));
    for name in &expiry.refs {
        builder = builder.remove_ref(name);
    }
    for id in &expiry.snapshots {
        builder = builder
            .remove_statistics(*id)
            .remove_partition_statistics(*id);
    }
    builder
        .remove_snapshots(&expiry.snapshots)
        .build()
        .map(|r| r.metadata)
        .map_err(|source| SinkError::Iceberg {
            context: format!("expiring snapshots of {table}"),
            source,
        })
}
