//! `source.snapshot`, a key both sources take: whether a new table's existing rows are copied.

use serde::Deserialize;

/// How existing rows are handled when a pipeline starts on a table for the first time
/// (`source.snapshot`, either source).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotMode {
    /// Copy the rows that exist, then stream from exactly the point the copy saw.
    #[default]
    Initial,
    /// Stream changes only.
    Never,
}
