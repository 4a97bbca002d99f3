//! Compaction of the index's runs: [`pick`] decides which runs to merge (pure), [`worker`]
//! carries the merge out, in the order `heap` keeps. The same split as the LSM sink's `compaction/`.

mod heap;
pub(super) mod pick;
pub(super) mod worker;
