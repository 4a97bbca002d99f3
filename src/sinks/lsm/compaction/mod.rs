//! Compaction of a bucket's sorted runs, split as lsm-tree's `compaction/`: `pick.rs` chooses which
//! runs to merge (pure), `merge.rs` merges their rows (pure), `worker.rs` reads the chosen files,
//! writes the result and publishes it as a `COMPACT` snapshot, and `schedule.rs` says when: the
//! background compactor of each table, and the write stall.

pub(super) mod merge;
pub(super) mod pick;
pub(super) mod schedule;
pub(super) mod worker;

pub use pick::*;

/// How one compaction pass went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactStats {
    pub snapshots: u64,
    pub files_in: u64,
    pub files_out: u64,
    pub bytes_in: u64,
    pub rows_out: u64,
}

impl CompactStats {
    pub(super) fn add(&mut self, o: &CompactStats) {
        self.snapshots += o.snapshots;
        self.files_in += o.files_in;
        self.files_out += o.files_out;
        self.bytes_in += o.bytes_in;
        self.rows_out += o.rows_out;
    }
}
