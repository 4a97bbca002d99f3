//! Compaction, carried out: a k-way merge of the runs `pick::choose` picked into one new
//! run, streamed block by block (bounded memory whatever the run sizes), then the new run set
//! installed in the index and named by its next manifest, then deletion of the inputs.
//!
//! Most of a merge is a copy: the runs of an initial copy cover nearly disjoint key ranges (each
//! chunk reader of the source walks its own key range in order, and each commit continues where
//! the last one stopped), so whole blocks of one run sort below everything the other runs have
//! left. When a cursor stands at the start of such a block (its last key is below every other
//! cursor's current key), and the block needs no rewriting (no tombstone to drop, no entry naming
//! a removed data file: its stats say), the block, its filter and stats are appended as they are,
//! without decoding an entry or hashing a key. Otherwise entries are merged one by one.
//!
//! A merge needs nothing of the index but its inputs (immutable runs) and the live file ids when
//! it starts ([`RunMerge`]), so it can run beside the index's lookups and applies
//! (`background.rs`); only its install touches the index.

use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::ObjectStore;

use super::heap::CursorHeap;
use super::pick;
use crate::sinks::pk_index::bloom::PROBES;
use crate::sinks::pk_index::cursor::RunCursor;
use crate::sinks::pk_index::manifest::run_path;
use crate::sinks::pk_index::memtable::Slot;
use crate::sinks::pk_index::meta::{BlockRef, Filter, RunMeta};
use crate::sinks::pk_index::run::RunWriter;
use crate::sinks::pk_index::{IndexError, PrimaryKeyIndex};

/// Merge statistics, for the log line of a compaction.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct MergeStats {
    pub(crate) blocks_copied: u64,
    pub(crate) entries_copied: u64,
    pub(crate) entries_merged: u64,
}

/// Whether a block of `run` may be copied as it is into the merged run.
fn copyable(run: &RunMeta, b: &BlockRef, drop_tombstones: bool, live: &[u32]) -> bool {
    let probes_match = matches!(run.filter, Filter::PerBlock { probes, .. } if probes == PROBES);
    let files_live = match b.files {
        None => true,
        // Every id in lo..=hi is live: the count of live ids in that range says so.
        Some((lo, hi)) => {
            let from = live.partition_point(|id| *id < lo);
            let to = live.partition_point(|id| *id <= hi);
            hi >= lo && (to - from) as u64 == u64::from(hi - lo) + 1
        }
    };
    probes_match && files_live && !(drop_tombstones && b.tombstones)
}

/// `slot`, or a tombstone when its file is not among the `live` ids (sorted).
fn live_or_tombstone(slot: Slot, live: &[u32]) -> Slot {
    if slot.is_tombstone() || live.binary_search(&slot.file).is_ok() {
        slot
    } else {
        Slot::REMOVED
    }
}

/// A merge of consecutive runs into run `id`, with what it needs of the index when it starts.
pub(crate) struct RunMerge {
    store: Arc<dyn ObjectStore>,
    id: u64,
    path: object_store::path::Path,
    /// Newest first, as they stand in the index.
    inputs: Vec<Arc<RunMeta>>,
    /// The inputs include the oldest run: no older entry is left for a tombstone to hide.
    drop_tombstones: bool,
    /// The merged run gets bloom filters: false for a new oldest run, unless the index keeps
    /// them there (`PrimaryKeyIndex::keep_oldest_filters`).
    filters: bool,
    /// The live data file ids, sorted: an entry naming another becomes a tombstone.
    live: Vec<u32>,
}

/// A merge done, to install.
pub(crate) struct Merged {
    pub(crate) run: RunMeta,
    pub(crate) inputs: Vec<Arc<RunMeta>>,
    pub(crate) stats: MergeStats,
    pub(crate) elapsed: Duration,
}

impl RunMerge {
    /// Where the merged run is written.
    pub(crate) fn path(&self) -> &object_store::path::Path {
        &self.path
    }

    /// Reads the inputs and writes the merged run; the index is not touched.
    pub(crate) async fn run(self) -> Result<Merged, IndexError> {
        let started = Instant::now();
        let RunMerge {
            store,
            id,
            path,
            inputs,
            drop_tombstones,
            filters,
            live,
        } = self;
        let mut writer = RunWriter::new(&store, path, id);
        if !filters {
            writer = writer.without_filters();
        }
        let mut stats = MergeStats::default();
        let mut cursors: Vec<RunCursor> = Vec::with_capacity(inputs.len());
        let mut alive = Vec::with_capacity(inputs.len());
        for run in &inputs {
            let mut c = RunCursor::new(Arc::clone(&store), Arc::clone(run));
            alive.push(c.advance().await?);
            cursors.push(c);
        }
        let mut heap = CursorHeap::new(&cursors, &alive);
        let mut key = Vec::new();
        // The smallest key first; on ties the newest run (lowest index) wins.
        while let Some((b, best)) = heap.top().and_then(|b| cursors.get(b).map(|c| (b, c))) {
            if let Some((block, bytes)) = best.whole_block() {
                let run = Arc::clone(best.run());
                let last = run.last_key_of(&block);
                let below_others = heap
                    .second(&cursors)
                    .and_then(|i| cursors.get(i))
                    .is_none_or(|c| last < c.key());
                if below_others && copyable(&run, &block, drop_tombstones, &live) {
                    writer.add_block(&run, &block, &bytes).await?;
                    stats.blocks_copied += 1;
                    stats.entries_copied += block.entries;
                    if let Some(c) = cursors.get_mut(b) {
                        let more = c.skip_block().await?;
                        heap.replace_top(&cursors, more);
                    }
                    continue;
                }
            }
            stats.entries_merged += 1;
            let slot = live_or_tombstone(best.slot(), &live);
            key.clear();
            key.extend_from_slice(best.key());
            if !(drop_tombstones && slot.is_tombstone()) {
                writer.add(&key, slot).await?;
            }
            // Every run holding this key stands at the top now, newest first.
            while let Some(t) = heap.top() {
                let Some(c) = cursors.get_mut(t) else {
                    break;
                };
                if c.key() != key.as_slice() {
                    break;
                }
                let more = c.advance().await?;
                heap.replace_top(&cursors, more);
            }
        }
        let run = writer.finish().await?;
        Ok(Merged {
            run,
            inputs,
            stats,
            elapsed: started.elapsed(),
        })
    }
}

impl PrimaryKeyIndex {
    /// Finishes the merge running in the background, if any, then merges the runs the policy
    /// picks into one until it picks none, and persists the new run set.
    #[cfg(test)]
    pub(in crate::sinks::pk_index) async fn compact(&mut self) -> Result<(), IndexError> {
        if self.finish_merge().await {
            self.write_manifest(self.covered).await?;
            self.delete_obsolete().await;
        }
        while let Some((from, take)) = self.merge_to_pick() {
            self.merge_runs(from, take).await?;
        }
        Ok(())
    }

    /// Which runs the policy would merge now (`pick::choose`).
    pub(in crate::sinks::pk_index) fn merge_to_pick(&self) -> Option<(usize, usize)> {
        let sizes: Vec<u64> = self.runs.iter().map(|r| r.size).collect();
        pick::choose(&sizes)
    }

    /// The merge of the `take` runs from index `from`, its run id taken.
    pub(in crate::sinks::pk_index) fn plan_merge(&mut self, from: usize, take: usize) -> RunMerge {
        let id = self.next_run_id;
        self.next_run_id += 1;
        let inputs: Vec<Arc<RunMeta>> = self.runs.iter().skip(from).take(take).cloned().collect();
        let oldest = from + inputs.len() == self.runs.len();
        RunMerge {
            store: Arc::clone(&self.store),
            id,
            path: run_path(&self.root, id),
            drop_tombstones: oldest,
            // The merged run becomes the oldest: no filters (`RunWriter::without_filters`).
            filters: !oldest || self.oldest_filters,
            inputs,
            live: self.files.live_ids(),
        }
    }

    /// Merges the `take` runs from index `from` into one, here and now, and persists the new
    /// run set.
    #[cfg(test)]
    pub(in crate::sinks::pk_index) async fn merge_runs(
        &mut self,
        from: usize,
        take: usize,
    ) -> Result<(), IndexError> {
        self.finish_merge().await;
        if self.runs.len().saturating_sub(from).min(take) == 0 {
            return Ok(());
        }
        let merged = self.plan_merge(from, take).run().await?;
        self.install(merged);
        self.write_manifest(self.covered).await?;
        self.delete_obsolete().await;
        Ok(())
    }

    /// Puts a merged run in place of its inputs, which are deleted once a manifest no longer
    /// names them (the caller's next manifest). Runs flushed since the merge began are newer and
    /// stay in front of it. A merge whose inputs are no longer live together is discarded (only
    /// a clear changes the runs beside a merge, and it drops the merge first: a safeguard).
    pub(in crate::sinks::pk_index) fn install(&mut self, merged: Merged) {
        let Merged {
            run,
            inputs,
            stats,
            elapsed,
        } = merged;
        let ids = || inputs.iter().map(|r| r.id);
        let at = (!inputs.is_empty())
            .then(|| {
                self.runs
                    .windows(inputs.len())
                    .position(|live| live.iter().map(|r| r.id).eq(ids()))
            })
            .flatten();
        let Some(at) = at else {
            tracing::debug!(root = %self.root, run = run.id, "a merge of runs that are gone; its run is deleted");
            self.obsolete.push(run.path);
            return;
        };
        self.merged.blocks_copied += stats.blocks_copied;
        self.merged.entries_copied += stats.entries_copied;
        self.merged.entries_merged += stats.entries_merged;
        tracing::debug!(
            root = %self.root,
            runs = inputs.len(),
            blocks_copied = stats.blocks_copied,
            entries_copied = stats.entries_copied,
            entries_merged = stats.entries_merged,
            elapsed_ms = elapsed.as_millis() as u64,
            "merged primary-key index runs"
        );
        self.runs.splice(at..at + inputs.len(), [Arc::new(run)]);
        {
            let owner = self.charges.owner();
            let mut cache = self.charges.memory().cache();
            for run in &inputs {
                cache.forget_run(owner, run.id);
            }
        }
        self.obsolete.extend(inputs.iter().map(|r| r.path.clone()));
        self.account_runs();
    }
}
