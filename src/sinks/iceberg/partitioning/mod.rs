//! Partitioned and sorted tables: the layout a commit writes its data files in, read from the
//! table's *current* metadata at each commit (its default partition spec and sort order), so a
//! spec or sort order set by another engine (Spark's `ALTER TABLE … ADD PARTITION FIELD`,
//! `WRITE ORDERED BY`) or by cdcd's own config takes effect at cdcd's next commit.
//!
//! Where it sits: between the locate step (which completes partial rows) and the file step of a
//! commit (`commit/layout.rs` drives it). The plan (`plan.rs`) decides which rows a commit writes
//! without knowing partitions: a row's partition depends on columns a partial update may only
//! get from the table lookup. [`Layout::arrange`] computes, for one planned file, each row's
//! partition tuple with iceberg's transform functions (identity, bucket, truncate, year, month,
//! day, hour, void) and the rows' order under the sort order; `split.rs` then replaces the
//! planned file by one file per partition, remapping the positions the plan and the index use.
//!
//! Memory: only the partition and sort source columns of one planned file are gathered to decide
//! the split; the resulting files are then gathered and encoded a few at a time
//! (`commit/files.rs`, `DATA_WRITES_IN_FLIGHT`), so a commit touching thousands of partitions
//! (an initial copy of a 10-year daily table) holds its changes plus those few files, whatever
//! the number of partitions.

mod layout;
mod split;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;

pub(crate) use layout::{Layout, Part};
pub(crate) use split::split_plan;
