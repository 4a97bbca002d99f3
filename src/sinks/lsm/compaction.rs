//! Compaction of a bucket's sorted runs, split as lsm-tree's `compaction/`: `pick.rs` chooses which
//! runs to merge and merges rows (pure), `worker.rs` reads the chosen files, writes the result and
//! publishes it as a `COMPACT` snapshot.

pub(super) mod pick;
pub(super) mod worker;

pub use pick::*;
