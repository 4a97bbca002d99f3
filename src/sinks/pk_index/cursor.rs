//! The sequential cursor a merge reads a run with: entries in key order, a chunk of consecutive
//! blocks per GET, and, when it stands at the first entry of a block, that whole block (bytes and
//! meta) so the merge can copy it without decoding it (`compaction/worker.rs`).

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use object_store::{ObjectStore, ObjectStoreExt};

use super::memtable::Slot;
use super::meta::{BlockRef, RunMeta};
use super::run::{decode_entry, split_block};
use super::IndexError;

/// A cursor reads this many bytes of consecutive blocks per GET.
const READ_CHUNK: u64 = 1024 * 1024;

/// Reads a run's entries in key order.
pub(crate) struct RunCursor {
    store: Arc<dyn ObjectStore>,
    run: Arc<RunMeta>,
    next_block: usize,
    /// Blocks fetched and not yet entered: (block number, the block's bytes).
    queued: VecDeque<(usize, Bytes)>,
    /// The block the cursor is in, its bytes, and how many of them are entries (the rest are
    /// its restart points).
    block_no: usize,
    block: Bytes,
    data_len: usize,
    pos: usize,
    /// The current entry is the first of its block.
    at_block_start: bool,
    key: Vec<u8>,
    slot: Slot,
}

impl RunCursor {
    pub(crate) fn new(store: Arc<dyn ObjectStore>, run: Arc<RunMeta>) -> RunCursor {
        RunCursor {
            store,
            run,
            next_block: 0,
            queued: VecDeque::new(),
            block_no: 0,
            block: Bytes::new(),
            data_len: 0,
            pos: 0,
            at_block_start: false,
            key: Vec::new(),
            slot: Slot::REMOVED,
        }
    }

    pub(crate) fn key(&self) -> &[u8] {
        &self.key
    }

    pub(crate) fn slot(&self) -> Slot {
        self.slot
    }

    pub(crate) fn run(&self) -> &Arc<RunMeta> {
        &self.run
    }

    /// When the cursor stands at the first entry of a block of a run with per-block stats and
    /// filters: that block's meta and bytes (none of its entries consumed yet).
    pub(crate) fn whole_block(&self) -> Option<(BlockRef, Bytes)> {
        if !self.at_block_start || !self.run.has_block_stats() {
            return None;
        }
        let b = self.run.blocks.get(self.block_no)?;
        (b.len == self.block.len() as u64).then(|| (*b, self.block.clone()))
    }

    /// Skips the rest of the current block (all of it, after [`whole_block`](Self::whole_block))
    /// and moves to the first entry of the next; false at the end of the run.
    pub(crate) async fn skip_block(&mut self) -> Result<bool, IndexError> {
        self.pos = self.data_len;
        self.advance().await
    }

    fn corrupt(&self, detail: &str) -> IndexError {
        IndexError::Corrupt {
            path: self.run.path.to_string(),
            detail: detail.to_owned(),
        }
    }

    /// Moves to the next entry; false at the end of the run.
    pub(crate) async fn advance(&mut self) -> Result<bool, IndexError> {
        loop {
            if self.pos < self.data_len {
                self.at_block_start = self.pos == 0;
                let data = self.block.get(..self.data_len).unwrap_or_default();
                self.slot = decode_entry(data, &mut self.pos, &mut self.key)
                    .map_err(|detail| self.corrupt(detail))?;
                return Ok(true);
            }
            if let Some((no, next)) = self.queued.pop_front() {
                self.data_len = split_block(&next)
                    .map_err(|detail| self.corrupt(detail))?
                    .0
                    .len();
                self.block = next;
                self.block_no = no;
                self.pos = 0;
                self.key.clear();
                continue;
            }
            if !self.fetch().await? {
                self.at_block_start = false;
                return Ok(false);
            }
        }
    }

    async fn fetch(&mut self) -> Result<bool, IndexError> {
        let Some(first) = self.run.block_range(self.next_block) else {
            return Ok(false);
        };
        let mut end = first.end;
        let mut last = self.next_block;
        while let Some(r) = self.run.block_range(last + 1) {
            if r.end - first.start > READ_CHUNK {
                break;
            }
            end = r.end;
            last += 1;
        }
        let bytes = self
            .store
            .get_range(&self.run.path, first.start..end)
            .await
            .map_err(|source| IndexError::Storage {
                path: self.run.path.to_string(),
                source,
            })?;
        for b in self.next_block..=last {
            // The meta is read from storage: a bad block range is corruption, not a panic.
            let within = self.run.block_range(b).and_then(|r| {
                let s = usize::try_from(r.start.checked_sub(first.start)?).ok()?;
                let e = usize::try_from(r.end.checked_sub(first.start)?).ok()?;
                (s <= e && e <= bytes.len()).then_some(s..e)
            });
            let Some(within) = within else {
                return Err(self.corrupt("short read of a block"));
            };
            self.queued.push_back((b, bytes.slice(within)));
        }
        self.next_block = last + 1;
        Ok(true)
    }
}
