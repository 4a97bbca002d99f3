//! Compaction, carried out: a k-way merge of the runs `pick::choose` picked into one new
//! run, streamed block by block (bounded memory whatever the run sizes), then a manifest that
//! names the new run set, then deletion of the inputs.
//!
//! Most of a merge is a copy: the runs of an initial copy cover nearly disjoint key ranges (each
//! chunk reader of the source walks its own key range in order, and each commit continues where
//! the last one stopped), so whole blocks of one run sort below everything the other runs have
//! left. When a cursor stands at the start of such a block (its last key is below every other
//! cursor's current key), and the block needs no rewriting (no tombstone to drop, no entry naming
//! a removed data file: its stats say), the block, its filter and stats are appended as they are,
//! without decoding an entry or hashing a key. Otherwise entries are merged one by one.

use std::sync::Arc;

use super::heap::CursorHeap;
use super::pick;
use crate::sinks::pk_index::bloom::PROBES;
use crate::sinks::pk_index::cursor::RunCursor;
use crate::sinks::pk_index::manifest::run_path;
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

impl PrimaryKeyIndex {
    /// Merges the runs the policy picks into one, then persists the new run set. Repeats while
    /// the policy finds more to merge.
    pub(in crate::sinks::pk_index) async fn compact(&mut self) -> Result<(), IndexError> {
        while self.compact_once().await? {}
        Ok(())
    }

    async fn compact_once(&mut self) -> Result<bool, IndexError> {
        let sizes: Vec<u64> = self.runs.iter().map(|r| r.size).collect();
        let Some(take) = pick::choose(&sizes) else {
            return Ok(false);
        };
        self.merge_newest(take).await?;
        Ok(true)
    }

    /// Merges the `take` newest runs into one and persists the new run set.
    pub(in crate::sinks::pk_index) async fn merge_newest(
        &mut self,
        take: usize,
    ) -> Result<(), IndexError> {
        let take = take.min(self.runs.len());
        if take == 0 {
            return Ok(());
        }
        let inputs: Vec<Arc<RunMeta>> = self.runs.iter().take(take).cloned().collect();
        let drop_tombstones = take == self.runs.len();
        let id = self.next_run_id;
        let mut writer = RunWriter::new(&self.store, run_path(&self.root, id), id);
        let live = self.files.live_ids();
        let mut stats = MergeStats::default();
        let mut cursors: Vec<RunCursor> = Vec::with_capacity(inputs.len());
        let mut alive = Vec::with_capacity(inputs.len());
        for run in &inputs {
            let mut c = RunCursor::new(Arc::clone(&self.store), Arc::clone(run));
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
            let slot = self.files.live_or_tombstone(best.slot());
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
        let merged = writer.finish().await?;
        self.merged.blocks_copied += stats.blocks_copied;
        self.merged.entries_copied += stats.entries_copied;
        self.merged.entries_merged += stats.entries_merged;
        tracing::debug!(
            root = %self.root,
            runs = take,
            blocks_copied = stats.blocks_copied,
            entries_copied = stats.entries_copied,
            entries_merged = stats.entries_merged,
            "merged primary-key index runs"
        );
        self.next_run_id += 1;
        self.runs.splice(0..take, [Arc::new(merged)]);
        {
            let owner = self.charges.owner();
            let mut cache = self.charges.memory().cache();
            for run in &inputs {
                cache.forget_run(owner, run.id);
            }
        }
        self.obsolete.extend(inputs.iter().map(|r| r.path.clone()));
        self.write_manifest(self.covered).await?;
        self.delete_obsolete().await;
        Ok(())
    }
}
