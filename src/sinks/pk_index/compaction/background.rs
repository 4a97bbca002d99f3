//! At most one merge of runs at a time, running beside the index: a flush or a persist starts it
//! when the policy picks runs, and the next flush or persist after it ends installs it
//! (`worker.rs`, `PrimaryKeyIndex::install`) before writing its manifest.
//!
//! Why: a merge rewrites every entry of the runs it takes where their keys interleave (a
//! streaming table's updates, a data-file compaction's moved keys), ~0.5 µs an entry, so merging
//! the runs of a 100M-row table took seconds. Run inline, a merge held the persist that started it
//! and with it the table's next commit (which waits for the index) or a data-file compaction's
//! commit (under the table's lock): TPC-B on a 100M-row table lagged p99 10-17 s
//! (docs/performance.md, "A 100M-row table"). The merge reads only immutable runs, so lookups and
//! applies go on meanwhile against the runs it will replace.
//!
//! Run ids: a merge takes its run's id when it is planned, and it starts only once a manifest
//! naming the next id past it is durable, so an index opened on the same root while the merge
//! still runs (the sink drops and reopens an index after an error; dropping aborts the merge, but
//! an abort takes effect at the task's next await) never writes a run of that id: without the
//! manifest, the reopened index took the id of a merge whose run was not yet listed, and the
//! merge's upload replaced the new run (found by `tests.rs`, the model test, as a corrupt run).
//! A manifest that fails to land starts no merge (the merge is planned again at the next flush
//! or persist, under a new id): started before it, the merge ran under an id no manifest had
//! reserved.
//!
//! Bounds: a flush that finds more than twice `FLUSHED_RUNS` runs while a merge runs waits for it
//! (an initial copy flushing faster than merges finish), so runs, and with them a lookup's
//! probes, stay bounded. Dropping the index aborts the merge; its run, finished or not, is never
//! named by a manifest, and the next open removes it (module doc, "Two writers"). Clearing the
//! index (a truncate) aborts it too and queues its run for deletion after the next manifest: the
//! merge may have ended already, and a run of a large table's index stayed on disk until a
//! restart.

use object_store::path::Path;
use tokio::task::JoinHandle;

use super::worker::{Merged, RunMerge};
use crate::sinks::pk_index::{IndexError, PrimaryKeyIndex, FLUSHED_RUNS};

/// The merge running beside the index, and the run it writes; aborted when dropped.
pub(crate) struct Merging {
    pub(crate) task: JoinHandle<Result<Merged, IndexError>>,
    pub(crate) run: Path,
}

impl Drop for Merging {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PrimaryKeyIndex {
    /// Plans a merge of the runs the policy picks, unless one runs already, taking its run id.
    /// The caller writes a manifest, which reserves that id, then [`start_merge`](Self::start_merge)s
    /// it (see the module doc).
    pub(in crate::sinks::pk_index) fn plan_next_merge(&mut self) -> Option<RunMerge> {
        if self.merging.is_some() {
            return None;
        }
        let (from, take) = self.merge_to_pick()?;
        Some(self.plan_merge(from, take))
    }

    /// Starts `merge` beside the index, once a durable manifest reserves its run id.
    pub(in crate::sinks::pk_index) fn start_merge(&mut self, merge: RunMerge) {
        let run = merge.path().clone();
        self.merging = Some(Merging {
            task: tokio::spawn(merge.run()),
            run,
        });
    }

    /// Installs the running merge if it has ended (without waiting); returns whether one was.
    pub(in crate::sinks::pk_index) async fn take_ended_merge(&mut self) -> bool {
        if !self.merging.as_ref().is_some_and(|m| m.task.is_finished()) {
            return false;
        }
        self.finish_merge().await
    }

    /// Waits for the running merge, if any, and installs it; returns whether one was installed.
    /// A failed merge is logged and leaves the runs as they were (the next flush or persist
    /// starts it again).
    pub(in crate::sinks::pk_index) async fn finish_merge(&mut self) -> bool {
        let Some(mut merging) = self.merging.take() else {
            return false;
        };
        let ended = (&mut merging.task).await;
        match ended {
            Ok(Ok(merged)) => {
                self.install(merged);
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, root = %self.root, "primary-key index compaction failed; retrying at the next flush");
                false
            }
            Err(e) => {
                tracing::warn!(error = %e, root = %self.root, "primary-key index compaction stopped; retrying at the next flush");
                false
            }
        }
    }

    /// After a flush: installs an ended merge, waits for a running one if the runs have piled
    /// up past twice [`FLUSHED_RUNS`], and starts the next when more than `FLUSHED_RUNS` are
    /// live, writing a manifest that reserves its run id (naming the covered snapshot as it
    /// stands: the runs flushed since hold later changes, which a replay applies again, harmlessly).
    pub(in crate::sinks::pk_index) async fn merge_after_flush(&mut self) -> Result<(), IndexError> {
        self.take_ended_merge().await;
        if self.merging.is_some() && self.runs.len() > 2 * FLUSHED_RUNS {
            self.finish_merge().await;
        }
        if self.runs.len() > FLUSHED_RUNS {
            if let Some(merge) = self.plan_next_merge() {
                self.write_manifest(self.covered).await?;
                self.start_merge(merge);
                self.delete_obsolete().await;
            }
        }
        Ok(())
    }
}
