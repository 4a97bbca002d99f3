//! A v3 table's primary-key index as the sink keeps it between commits: ready, or being updated
//! in the background by the last commit.
//!
//! Why in the background: recording a commit's keys and persisting the index is ~20% of a commit
//! of inserts, and nothing needs the index until the next commit locates keys or publishes. A
//! commit that only inserts readies the index after writing its data files, so the last commit's
//! update overlaps this commit's encoding; an initial copy is such commits back to back (measured
//! in README, "Performance → Initial copy"). The index is persisted after the table commit either
//! way, so a crash finds it behind and catches it up from the table (pk_index.rs, recovery).
//! One index writer at a time: the sink's table slot lock orders commits, the lease orders
//! processes, and [`IndexSlot::settle`] lets a clean stop (or a test) wait for the last update.

use std::sync::Arc;

use arrow_array::RecordBatch;
use iceberg::spec::TableMetadata;
use tokio::task::JoinHandle;

use super::TableIndex;
use super::{RewriteRuns, RewrittenOutput};
use crate::changelog::{TableChanges, TableSchema};
use crate::sinks::iceberg::deletes::commit_vectors::LiveDvs;
use crate::sinks::iceberg::files::manifest::LiveFiles;
use crate::sinks::iceberg::plan::Plan;
use crate::sinks::pk_index::PreparedRuns;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

#[derive(Default)]
pub(crate) struct IndexSlot {
    /// The index, opened at the table's first v3 commit; `None` until then, while `recording`
    /// holds it, and after an index error (the next commit reopens and replays).
    index: Option<TableIndex>,
    /// The last commit's update, handing the index back (`None` after an error).
    recording: Option<JoinHandle<Option<TableIndex>>>,
}

impl IndexSlot {
    /// The index if it is ready (opened and not being updated).
    pub(crate) fn get(&self) -> Option<&TableIndex> {
        self.index.as_ref()
    }

    /// Waits for the last commit's update, if one runs, and takes back the index it hands over.
    pub(crate) async fn settle(&mut self) {
        if let Some(task) = self.recording.take() {
            self.index = match task.await {
                Ok(index) => index,
                Err(e) => {
                    tracing::warn!(error = %e, "the primary-key index update stopped; the next commit catches the index up from the table");
                    None
                }
            };
        }
    }

    /// [`settle`](Self::settle)s, then persists what the last commits left unpersisted (a clean
    /// stop). A failure is logged and drops the index, as a failed update does.
    pub(crate) async fn persist(&mut self) {
        self.settle().await;
        let Some(index) = self.index.as_mut() else {
            return;
        };
        if let Err(e) = index.persist_applied().await {
            tracing::warn!(error = %e, "cannot persist the primary-key index; the next start catches it up from the table");
            self.index = None;
        }
    }

    /// Makes the index ready for a commit building on `meta` (live files `files`, vectors
    /// `dvs`): settles the last update, drops an index that does not cover `meta`'s current
    /// snapshot (a publish whose outcome was unknown landed after all, or another writer
    /// committed), and opens (and catches up) a missing one from `location`, like after a
    /// restart.
    pub(crate) async fn ready(
        &mut self,
        warehouse: &Warehouse,
        location: &str,
        schema: &TableSchema,
        meta: &TableMetadata,
        files: &LiveFiles,
        dvs: &LiveDvs,
    ) -> Result<(), SinkError> {
        self.settle().await;
        let current = meta.current_snapshot().map(|s| s.snapshot_id());
        if self.index.as_ref().is_some_and(|i| i.covers() != current) {
            self.index = None;
        }
        if self.index.is_none() {
            let opened = TableIndex::open(warehouse, location, schema, meta, files, dvs).await?;
            self.index = Some(opened);
        }
        Ok(())
    }

    /// Keeps the bloom filters of the ready index's oldest run (`TableIndex::keep_oldest_filters`).
    pub(crate) async fn keep_oldest_filters(&mut self) -> Result<(), SinkError> {
        match self.index.as_mut() {
            Some(index) => index.keep_oldest_filters().await,
            None => Ok(()),
        }
    }

    /// Records published snapshot `snapshot_id` (see [`TableIndex::record`]) in a background
    /// task, if the index is ready; the next [`ready`](Self::ready) or [`settle`](Self::settle)
    /// waits for it. A failure is logged and leaves no index: the snapshot is durable, so the
    /// commit must not fail, and the next commit reopens the index and replays it.
    pub(crate) fn record_in_background(
        &mut self,
        schema: Arc<TableSchema>,
        changes: Vec<TableChanges>,
        plan: Plan,
        paths: Vec<String>,
        removed: Option<RecordBatch>,
        snapshot_id: i64,
    ) {
        let Some(mut index) = self.index.take() else {
            return;
        };
        self.recording = Some(tokio::spawn(async move {
            let recorded = index
                .record(
                    &schema,
                    changes,
                    &plan,
                    &paths,
                    removed.as_ref(),
                    snapshot_id,
                )
                .await;
            match recorded {
                Ok(()) => Some(index),
                Err(e) => {
                    tracing::warn!(table = %schema.id, error = %e, "cannot update the primary-key index; it will be caught up from the table at the next commit");
                    None
                }
            }
        }));
    }

    /// The key column names of the ready index (`None`: not open in this process).
    pub(crate) fn key_names(&self) -> Option<Vec<String>> {
        self.index.as_ref().map(TableIndex::key_names)
    }

    /// Reserves the runs of a compaction's moved keys (`rows` rows into `outputs`), to write
    /// without the table's lock ([`TableIndex::reserve_rewrite`]); `None` when the index is not
    /// ready, or after an index error (logged; the index is dropped as after a failed update,
    /// and the compaction's commit moves nothing: the next commit replays it).
    pub(crate) async fn reserve_rewrite(
        &mut self,
        outputs: &[&str],
        rows: u64,
    ) -> Option<RewriteRuns> {
        self.settle().await;
        let index = self.index.as_mut()?;
        match index.reserve_rewrite(outputs, rows).await {
            Ok(runs) => Some(runs),
            Err(e) => {
                tracing::warn!(error = %e, "cannot reserve the primary-key index runs of a compaction; the index will be caught up from the table at the next commit");
                self.index = None;
                None
            }
        }
    }

    /// After a compaction snapshot `snapshot_id` was published on top of `parent`: moves the
    /// rewritten keys (see [`TableIndex::record_rewrite`]) if the index covers `parent`, by
    /// installing `prepared` (their runs, written beforehand: [`TableIndex::record_prepared_rewrite`])
    /// when there are some. An index
    /// covering anything else, or one the update failed on, is dropped: the next commit reopens
    /// it and replays the compaction's files from the table (index.rs, recovery), which is as
    /// correct, only slower. Never fails: the snapshot is durable.
    /// `outputs` carry no keys when the index was not open as the rewrite began (it reads keys
    /// only for an open index): an index opened meanwhile is then dropped too, never told
    /// the replaced files are gone without the keys that moved.
    pub(crate) async fn follow_rewrite(
        &mut self,
        parent: Option<i64>,
        removed: &[&str],
        outputs: Option<&[RewrittenOutput<'_>]>,
        prepared: Option<PreparedRuns>,
        snapshot_id: i64,
    ) {
        self.settle().await;
        let index = self.index.take();
        let (Some(mut index), Some(outputs)) = (index, outputs) else {
            discard(prepared).await;
            return;
        };
        if index.covers() != parent {
            discard(prepared).await;
            return;
        }
        let recorded = match prepared {
            Some(prepared) => {
                index
                    .record_prepared_rewrite(removed, outputs, prepared, snapshot_id)
                    .await
            }
            None => index.record_rewrite(removed, outputs, snapshot_id).await,
        };
        match recorded {
            Ok(()) => self.index = Some(index),
            Err(e) => {
                tracing::warn!(error = %e, "cannot move the rewritten keys in the primary-key index; it will be caught up from the table at the next commit");
            }
        }
    }

    /// A compaction that prepared runs did not commit: deletes them, and forgets its `outputs`
    /// (their paths were interned when the runs were reserved).
    pub(crate) async fn forget_rewrite(&mut self, prepared: PreparedRuns, outputs: &[&str]) {
        self.settle().await;
        if let Some(index) = self.index.as_mut() {
            index.forget_files(outputs);
        }
        prepared.discard().await;
    }
}

async fn discard(prepared: Option<PreparedRuns>) {
    if let Some(prepared) = prepared {
        prepared.discard().await;
    }
}
