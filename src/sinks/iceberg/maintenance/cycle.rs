//! One maintenance cycle of one table: compact its data files (`compaction/`: first, so the files
//! it replaces leave with the snapshots the expiry below removes in a later cycle), finish an
//! expiry a crash interrupted, expire what the
//! table's properties say (`expire.rs` decides), delete the files only the expired snapshots
//! reached, sweep metadata files the log no longer names, and report (log line, metrics).
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
use super::metadata_log;
use super::properties::{Compaction, Retention};
use super::reachable::{reachable, ManifestCache, Missing, Reachable};
use crate::changelog::TableId;
use crate::checkpoint::Checkpoint;
use crate::failpoints;
use crate::metrics as m;
use crate::metrics::maintenance as maintenance_metrics;
use crate::sinks::iceberg::files::manifest::{load_manifests, read};
use crate::sinks::iceberg::files::metadata::Loaded;
use crate::sinks::iceberg::rows::live::LiveState;
use crate::sinks::iceberg::IcebergSink;
use crate::sinks::{MaintenanceReport, SinkError};

/// Snapshots one cycle expires at most (the oldest first); the next cycle takes the rest. Bounds
/// a cycle's reads and deletions after a long pause or a lowered retention.
pub const MAX_EXPIRED_PER_CYCLE: usize = 500;

/// Attempts of an expiry that lost its commit to another writer.
const ATTEMPTS: usize = 3;

/// What one expiry committed.
struct Committed {
    before: Arc<Loaded>,
    after: Arc<Loaded>,
    expiry: Expiry,
}

impl IcebergSink {
    /// After a commit of `table` (now at `meta`, its live files `live`): asks for a cycle of it
    /// before the next interval when its small data files reached
    /// `cdcd.compaction.trigger-small-files` (`sinks/wanted.rs`). A bad property asks nothing
    /// (the cycle reports it).
    pub(crate) fn ask_maintenance_if_due(
        &self,
        table: &TableId,
        meta: &TableMetadata,
        live: Option<&LiveState>,
    ) {
        let (Some(live), Ok(policy)) = (live, Compaction::from_properties(meta.properties()))
        else {
            return;
        };
        if policy.triggered(live.files.data.iter().map(|f| f.file.file_size_in_bytes())) {
            self.maintenance_wanted.want(table);
        }
    }

    /// One cycle of `table`; `Ok(None)` when the table does not exist.
    pub(crate) async fn maintain_table(
        &self,
        table: &TableId,
    ) -> Result<Option<MaintenanceReport>, SinkError> {
        let mut state = self.maintenance.lock().await;
        let cache = state.manifests.entry(table.clone()).or_default();
        let mut report = MaintenanceReport {
            table: table.to_string(),
            ..MaintenanceReport::default()
        };
        match self.compact_table(table).await {
            Ok(Some(c)) => record_compaction(&c, &mut report),
            Ok(None) => {}
            Err(e @ SinkError::Fenced(_)) => return Err(e),
            // Expiry goes on: a failed compaction committed nothing (its files are orphans).
            Err(e) => {
                tracing::warn!(table = %table, error = %e, "compaction failed; the next cycle retries");
                metrics::counter!(m::ERRORS_TOTAL, m::LABEL_KIND => "maintenance").increment(1);
            }
        }
        let journal = self.journal_location(table);
        if let Some(left) = journal::read(&self.warehouse, &journal).await? {
            report.files_deleted += self.finish_interrupted(table, &left, cache).await?;
            journal::remove(&self.warehouse, &journal).await?;
        }
        let mut committed = None;
        for attempt in 1..=ATTEMPTS {
            match self.expire_once(table, &journal).await {
                Ok(c) => {
                    committed = Some(c);
                    break;
                }
                Err(SinkError::CommitConflict { .. }) if attempt < ATTEMPTS => {
                    tracing::info!(table = %table, attempt, "expiry lost its commit to another writer; deciding again");
                }
                Err(e) => return Err(e),
            }
        }
        let Some(outcome) = committed.flatten() else {
            return Ok(None);
        };
        let current = match outcome {
            Ok(c) => {
                report.snapshots_expired = c.expiry.snapshots.len() as u64;
                report.refs_removed = c.expiry.refs.len() as u64;
                failpoints::crash_point(failpoints::EXPIRE_AFTER_COMMIT);
                report.files_deleted += self
                    .delete_unreachable(&c.before.metadata, &c.after.metadata, cache)
                    .await?;
                journal::remove(&self.warehouse, &journal).await?;
                c.after
            }
            Err(unchanged) => unchanged,
        };
        report.metadata_files_deleted = metadata_log::sweep(
            &self.warehouse,
            &current,
            self.catalog_for(table).names_previous(),
        )
        .await? as u64;
        self.describe(&current, &mut report).await?;
        record(&report);
        Ok(Some(report))
    }

    fn journal_location(&self, table: &TableId) -> String {
        let ns = self.namespace.as_deref().unwrap_or(&table.namespace);
        journal::location(&self.warehouse, &self.pipeline, ns, &table.name)
    }

    /// Decides and commits one expiry from the newest metadata, under the table's slot lock.
    /// `Ok(None)`: no table; `Ok(Some(Err(loaded)))`: nothing to expire.
    async fn expire_once(
        &self,
        table: &TableId,
        journal: &str,
    ) -> Result<Option<Result<Committed, Arc<Loaded>>>, SinkError> {
        let slot = self.table_slot(table);
        let _serialized = slot.lock().await;
        let Some(before) = self.load(table).await? else {
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
            checkpoint: self.checkpoint_snapshot(meta)?,
        };
        let expiry = expire::choose(
            &snapshots,
            &refs(table, meta)?,
            &retention,
            pins,
            chrono::Utc::now().timestamp_millis(),
            MAX_EXPIRED_PER_CYCLE,
        );
        if expiry.is_empty() {
            return Ok(Some(Err(before)));
        }
        let record = Expiring {
            before: before.location(),
        };
        journal::write(&self.warehouse, journal, &record).await?;
        let next = without(table, &before, &expiry)?;
        let location = self.current_location(table);
        let committed = self
            .catalog_for(table)
            .commit(
                &self.warehouse,
                &self.table_ref(table, &location),
                &before,
                next,
            )
            .await;
        let after = match committed {
            Ok(after) => Arc::new(after),
            Err(e) => {
                // Conflict or unknown outcome: the next load tells; the journal says what to check.
                self.remember(table, None);
                return Err(e);
            }
        };
        let version = after.version;
        self.remember(table, Some(Arc::clone(&after)));
        metadata_log::delete_after_commit(
            &self.warehouse,
            &before,
            &after,
            self.catalog_for(table).names_previous(),
        );
        tracing::debug!(table = %table, version, expired = expiry.snapshots.len(), "expiry committed");
        Ok(Some(Ok(Committed {
            before,
            after,
            expiry,
        })))
    }

    /// The newest snapshot of `main`'s history carrying this pipeline's checkpoint.
    pub(super) fn checkpoint_snapshot(
        &self,
        meta: &TableMetadata,
    ) -> Result<Option<i64>, SinkError> {
        let mut next = meta.current_snapshot();
        while let Some(s) = next {
            let props = &s.summary().additional_properties;
            if Checkpoint::from_properties(&self.pipeline, props)?.is_some() {
                return Ok(Some(s.snapshot_id()));
            }
            next = s.parent_snapshot_id().and_then(|p| meta.snapshot_by_id(p));
        }
        Ok(None)
    }

    /// After a crash between an expiry's commit and its deletions: `left.before` names the
    /// metadata expired from; what its snapshots reached and the current ones do not is deleted
    /// (nothing, when the commit never landed: every snapshot is still there).
    async fn finish_interrupted(
        &self,
        table: &TableId,
        left: &Expiring,
        cache: &mut ManifestCache,
    ) -> Result<u64, SinkError> {
        let Some(current) = self.load(table).await? else {
            return Ok(0);
        };
        let bytes = match read(&self.warehouse, &left.before).await {
            Ok(b) => b,
            Err(SinkError::Storage {
                source: object_store::Error::NotFound { .. },
                ..
            }) => {
                tracing::warn!(table = %table, before = %left.before, "an interrupted expiry's metadata is gone; `cdcd cleanup` removes what it left");
                return Ok(0);
            }
            Err(e) => return Err(e),
        };
        let before: TableMetadata =
            serde_json::from_slice(&bytes).map_err(|e| SinkError::Corrupt {
                path: left.before.clone(),
                detail: e.to_string(),
            })?;
        let deleted = self
            .delete_unreachable(&before, &current.metadata, cache)
            .await?;
        tracing::info!(table = %table, deleted, "finished an interrupted expiry");
        Ok(deleted)
    }

    /// Deletes what the snapshots of `before` that `after` no longer has reached, except what
    /// `after`'s snapshots reach. `after` must be committed (or newer).
    async fn delete_unreachable(
        &self,
        before: &TableMetadata,
        after: &TableMetadata,
        cache: &mut ManifestCache,
    ) -> Result<u64, SinkError> {
        let gone_ids: Vec<i64> = before
            .snapshots()
            .map(|s| s.snapshot_id())
            .filter(|id| after.snapshot_by_id(*id).is_none())
            .collect();
        if gone_ids.is_empty() {
            return Ok(0);
        }
        let kept_ids: Vec<i64> = after.snapshots().map(|s| s.snapshot_id()).collect();
        let kept: Reachable =
            reachable(&self.warehouse, after, &kept_ids, Missing::Error, cache).await?;
        let gone = reachable(&self.warehouse, before, &gone_ids, Missing::Deleted, cache).await?;
        cache.retain(&kept.manifests);
        let mut doomed: Vec<String> = gone
            .files
            .iter()
            .filter(|f| !kept.files.contains(*f))
            .cloned()
            .collect();
        gone.deletion_order(&mut doomed);
        // In two halves, with the crash point between (in deletion order: the second half holds
        // the manifests and lists that name files of the first).
        let (first, rest) = doomed.split_at(doomed.len() / 2);
        let mut deleted = metadata_log::delete_all(&self.warehouse, first).await? as u64;
        if !first.is_empty() {
            failpoints::crash_point(failpoints::EXPIRE_DURING_DELETE);
        }
        deleted += metadata_log::delete_all(&self.warehouse, rest).await? as u64;
        Ok(deleted)
    }

    /// Snapshots, live files and manifests of the current snapshot, for the report.
    async fn describe(
        &self,
        current: &Loaded,
        report: &mut MaintenanceReport,
    ) -> Result<(), SinkError> {
        let meta = &current.metadata;
        report.snapshots = meta.snapshots().len() as u64;
        if let Some(s) = meta.current_snapshot() {
            let p = &s.summary().additional_properties;
            let get = |k: &str| p.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            report.live_files = get("total-data-files") + get("total-delete-files");
            report.manifests =
                load_manifests(&self.warehouse, s.manifest_list(), meta.format_version())
                    .await?
                    .len() as u64;
        }
        Ok(())
    }
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

/// A compaction's log line and metrics.
fn record_compaction(c: &super::compaction::Compacted, report: &mut MaintenanceReport) {
    let table = report.table.as_str();
    tracing::info!(
        table = %table,
        files_rewritten = c.files_rewritten,
        bytes_rewritten = c.bytes_rewritten,
        files_written = c.files_written,
        bytes_written = c.bytes_written,
        vectors_removed = c.vectors_removed,
        rows_dropped = c.rows_dropped,
        deletes_carried = c.deletes_carried,
        positions_converted = c.positions_converted,
        "compaction committed"
    );
    maintenance_metrics::compaction(
        table,
        maintenance_metrics::KIND_REWRITE_DATA_FILES,
        c.files_rewritten,
        c.bytes_rewritten,
    );
    report.files_rewritten += c.files_rewritten;
    report.bytes_rewritten += c.bytes_rewritten;
    report.files_written += c.files_written;
}

/// The cycle's log line and metrics.
fn record(r: &MaintenanceReport) {
    tracing::info!(
        table = %r.table,
        expired = r.snapshots_expired,
        refs_removed = r.refs_removed,
        files_deleted = r.files_deleted,
        metadata_files_deleted = r.metadata_files_deleted,
        files_rewritten = r.files_rewritten,
        snapshots = r.snapshots,
        live_files = r.live_files,
        manifests = r.manifests,
        "maintenance cycle"
    );
    maintenance_metrics::expiry(
        &r.table,
        r.snapshots_expired,
        r.files_deleted + r.metadata_files_deleted,
    );
    maintenance_metrics::table_shape(&r.table, r.snapshots, r.live_files, r.manifests);
}
