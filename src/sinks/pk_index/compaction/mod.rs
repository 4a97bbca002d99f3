//! Compaction of the index's runs: [`pick`] decides which runs to merge (pure), [`worker`]
//! carries the merge out, in the order `heap` keeps, and [`background`] runs it beside the index.
//! The same split as the LSM sink's `compaction/`.

pub(super) mod background;
mod heap;
pub(super) mod pick;
pub(super) mod worker;
