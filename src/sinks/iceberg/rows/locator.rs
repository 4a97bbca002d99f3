//! Row location for deletion vectors: where (data file, row position) the current row of a key
//! lives, so that an update or delete of a committed row can be written as a deletion vector on
//! that file (Iceberg v3 writers must not write equality deletes for this;
//! `docs/internals.md`, "Deletion vectors").
//!
//! Sits between the planner and the DV writer: the planner names keys whose row lives in an
//! earlier snapshot (`Plan::equality_deletes`), a [`RowLocator`] turns them into positions, and
//! `deletes/commit_vectors.rs` groups those per file. The same answer lets `lookup::fetch` read
//! the current row of a partial update by position. The locator is the primary-key index
//! (`sinks/pk_index/`, wired in `index.rs`), checked against the snapshot: an entry the index
//! still holds for a row that left the table (a file dropped by a truncate or another writer's
//! rewrite, or a position in the file's deletion vector) reads as no row. That check is what
//! makes a replay after a crash need only the files added since the index was persisted (see
//! `index.rs`).

use std::collections::HashSet;
use std::sync::Arc;

use arrow_array::RecordBatch;
use async_trait::async_trait;

use super::index::TableIndex;
use crate::sinks::iceberg::deletes::commit_vectors::LiveDvs;
use crate::sinks::iceberg::files::manifest::LiveFiles;
use crate::sinks::SinkError;

/// Where a row is: the data file's location and the row's position in it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct RowAddress {
    pub file: Arc<str>,
    pub pos: u64,
}

/// Finds the live row of each key.
///
/// Contract: `keys` is a batch in the table's key schema (key columns, change-row types);
/// the answer has one entry per key row, in order, `None` when the key has no live row. A row is
/// live when its file is in the snapshot and its position is not in the file's deletion vector.
/// Read-only: calling it again (e.g. after a failed commit) is safe and gives the same answer
/// for the same snapshot. Cancel-safe (nothing is written).
#[async_trait]
pub(crate) trait RowLocator: Send + Sync {
    async fn locate(&self, keys: &RecordBatch) -> Result<Vec<Option<RowAddress>>, SinkError>;
}

/// Locates keys through the table's primary-key index, keeping only rows live in the snapshot.
pub(crate) struct IndexLocator<'a> {
    index: &'a TableIndex,
    live: HashSet<&'a str>,
    dvs: &'a LiveDvs,
}

impl<'a> IndexLocator<'a> {
    /// A locator for the snapshot whose live files are `files` and live DVs `dvs`.
    pub fn new(index: &'a TableIndex, files: &'a LiveFiles, dvs: &'a LiveDvs) -> Self {
        IndexLocator {
            index,
            live: files.data.iter().map(|f| f.file.file_path()).collect(),
            dvs,
        }
    }
}

#[async_trait]
impl RowLocator for IndexLocator<'_> {
    async fn locate(&self, keys: &RecordBatch) -> Result<Vec<Option<RowAddress>>, SinkError> {
        let found = self.index.get_many(keys).await?;
        Ok(found
            .into_iter()
            .map(|at| {
                at.filter(|l| self.live.contains(&*l.file))
                    .filter(|l| {
                        !self
                            .dvs
                            .get(&*l.file)
                            .is_some_and(|d| d.dv.contains(l.position))
                    })
                    .map(|l| RowAddress {
                        file: l.file,
                        pos: l.position,
                    })
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seam stays usable as a trait object.
    #[allow(dead_code)]
    fn object_safe(_: &dyn RowLocator) {}
}
