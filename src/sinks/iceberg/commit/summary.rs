//! The snapshot summary of a commit: operation, the usual counters, and the pipeline checkpoint
//! (`cdcd.pipeline` / `cdcd.position`), which is how the position is committed inside the same
//! snapshot as the data (`docs/exactly-once.md`, section 1).
//!
//! Totals carry over from the parent (reset by a truncate). Deletion vectors count as position
//! delete files (`added-dvs` / `removed-dvs` as well, like Java's `SnapshotSummary`); a DV that
//! replaces an older one removes the old one's files and records, so `total-position-deletes`
//! stays the number of deleted rows and `status()` can count live rows.
//!
//! Bytes (`added-files-size`, `removed-files-size`, `total-files-size`, read by `cdcd status`)
//! count a file's size, a deletion vector's blob (`content_size_in_bytes`: several vectors share
//! a Puffin file), as Iceberg-Java's `SnapshotSummary` does. The total is the base's live bytes,
//! counted from the live state the commit builds on, rather than carried from the parent: a
//! table written before cdcd kept it, or a parent committed by another engine without it, would
//! otherwise leave it wrong forever.

use std::collections::HashMap;

use iceberg::spec::{DataContentType, DataFile, DataFileFormat, Operation, Snapshot, Summary};

use crate::checkpoint::Checkpoint;

/// The files a commit adds and removes.
pub(crate) struct Changes<'a> {
    pub truncate: bool,
    pub data: &'a [DataFile],
    pub deletes: &'a [DataFile],
    /// Delete files this snapshot removes (DVs replaced by merged ones).
    pub removed_deletes: &'a [DataFile],
    /// The bytes of the base snapshot's live files ([`bytes_of`] each).
    pub base_bytes: u64,
}

/// The bytes a file counts for in the summary: a deletion vector's blob, else the whole file.
pub(crate) fn bytes_of(file: &DataFile) -> u64 {
    match (file.file_format(), file.content_size_in_bytes()) {
        (DataFileFormat::Puffin, Some(blob)) => u64::try_from(blob).unwrap_or(0),
        _ => file.file_size_in_bytes(),
    }
}

pub(crate) fn summary(
    c: &Changes<'_>,
    parent: Option<&Snapshot>,
    checkpoint: &Checkpoint,
) -> Summary {
    let previous = |k: &str| -> u64 {
        if c.truncate {
            return 0;
        }
        parent
            .and_then(|s| s.summary().additional_properties.get(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let count = |files: &[DataFile], content: Option<DataContentType>, dv: bool| {
        files
            .iter()
            .filter(|f| content.is_none_or(|c| f.content_type() == c))
            .filter(|f| !dv || f.file_format() == DataFileFormat::Puffin)
            .fold((0u64, 0u64), |(n, r), f| (n + 1, r + f.record_count()))
    };
    let (data_files, records) = count(c.data, None, false);
    let (eq_files, eq_rows) = count(c.deletes, Some(DataContentType::EqualityDeletes), false);
    let (pos_files, pos_rows) = count(c.deletes, Some(DataContentType::PositionDeletes), false);
    let (dvs, _) = count(c.deletes, Some(DataContentType::PositionDeletes), true);
    let (rm_pos_files, rm_pos_rows) = count(
        c.removed_deletes,
        Some(DataContentType::PositionDeletes),
        false,
    );
    let (rm_dvs, _) = count(
        c.removed_deletes,
        Some(DataContentType::PositionDeletes),
        true,
    );
    let mut p: HashMap<String, String> = HashMap::new();
    let mut put = |k: &str, v: u64| {
        p.insert(k.to_owned(), v.to_string());
    };
    put("added-data-files", data_files);
    put("added-records", records);
    put("added-delete-files", eq_files + pos_files);
    put("added-equality-delete-files", eq_files);
    put("added-position-delete-files", pos_files);
    put("added-equality-deletes", eq_rows);
    put("added-position-deletes", pos_rows);
    if dvs + rm_dvs > 0 {
        put("added-dvs", dvs);
        put("removed-dvs", rm_dvs);
        put("removed-delete-files", rm_pos_files);
        put("removed-position-delete-files", rm_pos_files);
        put("removed-position-deletes", rm_pos_rows);
    }
    put(
        "total-data-files",
        previous("total-data-files") + data_files,
    );
    put("total-records", previous("total-records") + records);
    put(
        "total-delete-files",
        (previous("total-delete-files") + eq_files + pos_files).saturating_sub(rm_pos_files),
    );
    put(
        "total-equality-deletes",
        previous("total-equality-deletes") + eq_rows,
    );
    put(
        "total-position-deletes",
        (previous("total-position-deletes") + pos_rows).saturating_sub(rm_pos_rows),
    );
    let bytes = |files: &[DataFile]| files.iter().map(bytes_of).sum::<u64>();
    let added_bytes = bytes(c.data) + bytes(c.deletes);
    let removed_bytes = bytes(c.removed_deletes);
    put("added-files-size", added_bytes);
    if removed_bytes > 0 {
        put("removed-files-size", removed_bytes);
    }
    let total_bytes = if c.truncate {
        added_bytes
    } else {
        (c.base_bytes + added_bytes).saturating_sub(removed_bytes)
    };
    put("total-files-size", total_bytes);
    p.extend(checkpoint.to_properties());
    let has_deletes = !c.deletes.is_empty();
    let operation = match (c.truncate, data_files > 0, has_deletes) {
        (true, true, _) | (false, true, true) => Operation::Overwrite,
        (true, false, _) | (false, false, true) => Operation::Delete,
        (false, _, false) => Operation::Append,
    };
    Summary {
        operation,
        additional_properties: p,
    }
}

/// Records a manifest merge (`manifests.rs`) under Iceberg-Java's keys: `manifests-created`
/// (merged manifests written) and `manifests-replaced` (carried-over manifests merged into them).
/// Nothing else changes: a merge moves entries between manifests and adds or removes no file, so
/// the file and row totals stay those of the commit's own changes.
pub(crate) fn record_merge(summary: &mut Summary, created: usize, replaced: usize) {
    if created == 0 {
        return;
    }
    let p = &mut summary.additional_properties;
    p.insert("manifests-created".to_owned(), created.to_string());
    p.insert("manifests-replaced".to_owned(), replaced.to_string());
}
