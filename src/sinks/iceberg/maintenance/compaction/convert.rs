//! Format v2: the equality deletes that apply to data files a compaction does not rewrite become
//! position deletes, so every equality delete file leaves the table with the compaction.
//!
//! Why: an equality delete of sequence S applies to every data file with a lower data sequence
//! number (Iceberg spec, "Scan Planning"), and leaves only when no such file is live
//! (`equality.rs`). Compaction rewrites small files; a data file past 75% of the target size is
//! never small, so once a table has one, every streaming commit's equality delete file stayed
//! for good and each reader's work grew with every commit. Resolving them into positions of those
//! large files (what Apache Amoro's "minor optimizing" does, and Iceberg-Java's
//! `ConvertEqualityDeleteFiles` action describes) costs reading the key columns of the files that
//! stay; a position delete applies to one named file only, so the reader's work is bounded by
//! the files' deleted rows, not by the history.
//!
//! The positions written for a file are every row its live deletes delete: the equality keys
//! newer than the file, and the positions of the position delete files already naming it
//! (`V2Deletes::vector`). So the position delete files that name only rewritten or converted
//! files are dropped too: the new file carries their positions (the position deletes of the
//! table's files end up consolidated in one file per compaction). The new file is committed in
//! the compaction's `replace` snapshot at its new sequence number, above every file it names.
//!
//! Bounded: a cycle converts only while the files that stay add up to at most
//! [`CONVERT_BUDGET_FACTOR`] times the cycle's byte budget (they are read whole, one at a time,
//! and only their key columns decoded). Within it, a v2 cycle picks by size tiers as v3 does
//! (`pick.rs`: large files are left alone instead of rewritten each cycle); past it the pick
//! is untiered and a larger table keeps its equality deletes until a rewrite reaches its older
//! files (Spark's `rewrite_data_files`), as before the conversion.

use std::collections::HashSet;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use iceberg::spec::{DataContentType, DataFile};

use super::equality::V2Deletes;
use crate::changelog::TableId;
use crate::sinks::iceberg::files::decode::decode;
use crate::sinks::iceberg::files::manifest::{read, LiveFile};
use crate::sinks::iceberg::files::writer::{self, Placement};
use crate::sinks::iceberg::rows::live::LiveState;
use crate::sinks::iceberg::schema;
use crate::sinks::SinkError;
use crate::storage::Warehouse;

/// The files a cycle converts may add up to this many times `max-bytes-per-cycle`.
pub(crate) const CONVERT_BUDGET_FACTOR: u64 = 4;

/// The live data files of `live` that an equality delete applies to and the rewrite of `chosen`
/// leaves in place: pure. Empty when there is no equality delete; `None` when they add up to
/// more than `budget` bytes (then none is converted: an equality delete leaves only when every
/// file older than it is rewritten or converted).
pub(crate) fn staying_targets(
    live: &LiveState,
    chosen: &HashSet<&str>,
    budget: u64,
    default_spec: i32,
) -> Option<Vec<LiveFile>> {
    let Some(newest) = live.files.equality_deletes.iter().map(|f| f.sequence).max() else {
        return Some(Vec::new());
    };
    let targets: Vec<LiveFile> = live
        .files
        .data
        .iter()
        .filter(|f| f.sequence < newest && !chosen.contains(f.file.file_path()))
        .cloned()
        .collect();
    let bytes: u64 = targets.iter().map(|f| f.file.file_size_in_bytes()).sum();
    // The conversion writes one position delete file, which applies only to data files of its
    // spec and partition, and is listed in a manifest of the default spec: targets in several
    // partitions or of an older spec are not converted (their equality deletes stay until the
    // files are rewritten).
    let mut placements = targets.iter().map(LiveFile::placement);
    let one_partition = placements
        .next()
        .is_none_or(|first| first.spec_id == default_spec && placements.all(|p| p == first));
    (bytes <= budget && one_partition).then_some(targets)
}

/// Writes, at `path`, the position delete file of every row of `targets` that `deletes`
/// (loaded for them) delete, sorted by file and position as the spec requires; `None` when no
/// row is deleted.
pub(crate) async fn write_positions(
    warehouse: &Warehouse,
    table: &TableId,
    deletes: &V2Deletes,
    targets: &[LiveFile],
    path: String,
) -> Result<Option<DataFile>, SinkError> {
    let keys = deletes.key_names();
    let columns: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut files: Vec<&str> = Vec::new();
    let mut positions: Vec<i64> = Vec::new();
    let mut sorted: Vec<&LiveFile> = targets.iter().collect();
    sorted.sort_by(|a, b| a.file.file_path().cmp(b.file.file_path()));
    for f in sorted {
        let at = f.file.file_path();
        let bytes = read(warehouse, at).await?;
        let batches = decode(&bytes, at, Some(&columns))?;
        drop(bytes);
        let Some(deleted) = deletes.vector(at, f.sequence, &batches)? else {
            continue;
        };
        for p in deleted.iter() {
            // A position past i64 cannot be written, and the equality delete it stands for is
            // dropped with this file: stop rather than resurrect the row.
            let pos = i64::try_from(p).map_err(|_| SinkError::Corrupt {
                path: at.to_owned(),
                detail: format!("deleted position {p} does not fit a position delete file"),
            })?;
            files.push(at);
            positions.push(pos);
        }
    }
    if files.is_empty() {
        return Ok(None);
    }
    let batch = RecordBatch::try_new(
        schema::position_delete_schema(),
        vec![
            Arc::new(StringArray::from(files)) as ArrayRef,
            Arc::new(Int64Array::from(positions)) as ArrayRef,
        ],
    )
    .map_err(|source| SinkError::Arrow {
        context: format!("gathering the converted position deletes of {table}"),
        source,
    })?;
    // `staying_targets` chose files of one partition.
    let placement = targets
        .first()
        .map(LiveFile::placement)
        .unwrap_or_else(|| Placement::unpartitioned(0));
    let file = writer::write_file(
        warehouse,
        table,
        path,
        vec![batch],
        DataContentType::PositionDeletes,
        None,
        &placement,
    )
    .await?;
    Ok(Some(file))
}
