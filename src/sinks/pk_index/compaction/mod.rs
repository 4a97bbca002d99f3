//! Compaction of the index's runs: [`pick`] decides which runs to merge (pure), [`worker`]
//! carries the merge out. The same split as the LSM sink's `compaction/`.

pub(super) mod pick;
pub(super) mod worker;
