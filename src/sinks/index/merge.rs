//! Compaction, carried out: a k-way merge of the runs `compaction::choose` picked into one new
//! run, streamed block by block (bounded memory whatever the run sizes), then a manifest that
//! names the new run set, then deletion of the inputs.

use std::sync::Arc;

use super::compaction;
use super::manifest::run_path;
use super::run::{RunCursor, RunMeta, RunWriter};
use super::{IndexError, PrimaryKeyIndex};

impl PrimaryKeyIndex {
    /// Merges the runs the policy picks into one, then persists the new run set. Repeats while
    /// the policy finds more to merge.
    pub(super) async fn compact(&mut self) -> Result<(), IndexError> {
        while self.compact_once().await? {}
        Ok(())
    }

    async fn compact_once(&mut self) -> Result<bool, IndexError> {
        let sizes: Vec<u64> = self.runs.iter().map(|r| r.size).collect();
        let Some(take) = compaction::choose(&sizes) else {
            return Ok(false);
        };
        let inputs: Vec<Arc<RunMeta>> = self.runs.iter().take(take).cloned().collect();
        let drop_tombstones = take == self.runs.len();
        let id = self.next_run_id;
        let expected = inputs.iter().map(|r| r.entries).sum();
        let mut writer = RunWriter::new(&self.store, run_path(&self.root, id), id, expected);
        let mut cursors: Vec<RunCursor> = Vec::with_capacity(inputs.len());
        let mut alive = Vec::with_capacity(inputs.len());
        for run in &inputs {
            let mut c = RunCursor::new(Arc::clone(&self.store), Arc::clone(run));
            alive.push(c.advance().await?);
            cursors.push(c);
        }
        let mut key = Vec::new();
        loop {
            // The smallest key; on ties the newest run (lowest index) wins.
            let mut best: Option<&RunCursor> = None;
            for (c, _) in cursors.iter().zip(&alive).filter(|(_, a)| **a) {
                if best.is_none_or(|b| c.key() < b.key()) {
                    best = Some(c);
                }
            }
            let Some(best) = best else { break };
            let slot = self.files.live_or_tombstone(best.slot());
            key.clear();
            key.extend_from_slice(best.key());
            if !(drop_tombstones && slot.is_tombstone()) {
                writer.add(&key, slot).await?;
            }
            for (c, a) in cursors.iter_mut().zip(alive.iter_mut()) {
                if *a && c.key() == key.as_slice() {
                    *a = c.advance().await?;
                }
            }
        }
        let merged = writer.finish().await?;
        self.next_run_id += 1;
        self.runs.splice(0..take, [Arc::new(merged)]);
        {
            let mut cache = self.cache();
            for run in &inputs {
                cache.forget_run(run.id);
            }
        }
        self.obsolete.extend(inputs.iter().map(|r| r.path.clone()));
        self.write_manifest(self.covered).await?;
        self.delete_obsolete().await;
        Ok(true)
    }
}
