//! The summary of a compaction's snapshot: operation `replace` (Iceberg spec, "Snapshots":
//! "data and delete files were added and removed without changing table data"), the counters
//! Iceberg-Java's `SnapshotSummary` writes for a rewrite, totals carried from the parent, and
//! the checkpoint of the snapshot it builds on: a reader of `cdcd.position` (cdcd at restart,
//! `cdcd status`) finds the same position on the compaction's snapshot, and expiry, which pins
//! the newest snapshot with a checkpoint, can then expire the parent.

use std::collections::HashMap;

use iceberg::spec::{DataContentType, DataFile, DataFileFormat, Operation, Snapshot, Summary};

use crate::checkpoint::{Checkpoint, LEASE_EPOCH_KEY};
use crate::sinks::iceberg::commit::summary::bytes_of;

/// What a rewrite adds and removes.
pub(crate) struct Replaced<'a> {
    pub added: &'a [DataFile],
    /// Deletion vectors on added files: deletes committed while the rewrite ran, carried over.
    pub added_deletes: &'a [DataFile],
    pub removed_data: &'a [DataFile],
    /// Deletion vectors of the removed data files; v2: delete files that no longer apply.
    pub removed_deletes: &'a [DataFile],
}

/// The `replace` summary of `r` on top of `parent`, carrying `checkpoint` and the lease epoch.
pub(crate) fn summary(
    r: &Replaced<'_>,
    parent: Option<&Snapshot>,
    checkpoint: Option<&Checkpoint>,
    lease_epoch: u64,
) -> Summary {
    let counts = Counts::of(r);
    let mut p: HashMap<String, String> = HashMap::new();
    counts.put_changes(&mut p);
    counts.put_totals(&mut p, parent);
    put_sizes(&mut p, r, parent);
    // The epoch only beside this pipeline's checkpoint: it counts that pipeline's lease
    // (`commit/publish.rs`, `winner_epoch`).
    if let Some(cp) = checkpoint {
        p.extend(cp.to_properties());
        if lease_epoch > 0 {
            p.insert(LEASE_EPOCH_KEY.to_owned(), lease_epoch.to_string());
        }
    }
    Summary {
        operation: Operation::Replace,
        additional_properties: p,
    }
}

/// The files and rows a replace adds and removes, by kind.
struct Counts {
    added: u64,
    added_records: u64,
    deleted: u64,
    deleted_records: u64,
    removed_pos_files: u64,
    removed_positions: u64,
    removed_eq_files: u64,
    removed_eq_rows: u64,
    removed_deletes: u64,
    added_dvs: u64,
    added_positions: u64,
    removed_dvs: u64,
}

impl Counts {
    fn of(r: &Replaced<'_>) -> Self {
        let count = |files: &[DataFile]| {
            files
                .iter()
                .fold((0u64, 0u64), |(n, r), f| (n + 1, r + f.record_count()))
        };
        let (added, added_records) = count(r.added);
        let (deleted, deleted_records) = count(r.removed_data);
        let of = |content: DataContentType| -> Vec<DataFile> {
            r.removed_deletes
                .iter()
                .filter(|f| f.content_type() == content)
                .cloned()
                .collect()
        };
        let (removed_pos_files, removed_positions) = count(&of(DataContentType::PositionDeletes));
        let (removed_eq_files, removed_eq_rows) = count(&of(DataContentType::EqualityDeletes));
        let removed_deletes = removed_pos_files + removed_eq_files;
        let (added_dvs, added_positions) = count(r.added_deletes);
        let removed_dvs = r
            .removed_deletes
            .iter()
            .filter(|f| f.file_format() == DataFileFormat::Puffin)
            .count() as u64;
        Counts {
            added,
            added_records,
            deleted,
            deleted_records,
            removed_pos_files,
            removed_positions,
            removed_eq_files,
            removed_eq_rows,
            removed_deletes,
            added_dvs,
            added_positions,
            removed_dvs,
        }
    }

    /// The `added-*`, `deleted-*` and `removed-*` counts.
    fn put_changes(&self, p: &mut HashMap<String, String>) {
        let mut put = |k: &str, v: u64| {
            p.insert(k.to_owned(), v.to_string());
        };
        put("added-data-files", self.added);
        put("added-records", self.added_records);
        put("deleted-data-files", self.deleted);
        put("deleted-records", self.deleted_records);
        if self.added_dvs > 0 {
            put("added-delete-files", self.added_dvs);
            put("added-position-delete-files", self.added_dvs);
            put("added-dvs", self.added_dvs);
            put("added-position-deletes", self.added_positions);
        }
        put("removed-delete-files", self.removed_deletes);
        put("removed-position-delete-files", self.removed_pos_files);
        put("removed-equality-delete-files", self.removed_eq_files);
        put("removed-equality-deletes", self.removed_eq_rows);
        put("removed-dvs", self.removed_dvs);
        put("removed-position-deletes", self.removed_positions);
    }

    /// The `total-*` counts: the parent's, moved by this replace.
    fn put_totals(&self, p: &mut HashMap<String, String>, parent: Option<&Snapshot>) {
        let previous = |k: &str| -> u64 {
            parent
                .and_then(|s| s.summary().additional_properties.get(k))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let mut put = |k: &str, v: u64| {
            p.insert(k.to_owned(), v.to_string());
        };
        put(
            "total-data-files",
            (previous("total-data-files") + self.added).saturating_sub(self.deleted),
        );
        put(
            "total-records",
            (previous("total-records") + self.added_records).saturating_sub(self.deleted_records),
        );
        put(
            "total-delete-files",
            (previous("total-delete-files") + self.added_dvs).saturating_sub(self.removed_deletes),
        );
        put(
            "total-equality-deletes",
            previous("total-equality-deletes").saturating_sub(self.removed_eq_rows),
        );
        put(
            "total-position-deletes",
            (previous("total-position-deletes") + self.added_positions)
                .saturating_sub(self.removed_positions),
        );
    }
}

/// The `*-files-size` properties.
fn put_sizes(p: &mut HashMap<String, String>, r: &Replaced<'_>, parent: Option<&Snapshot>) {
    let mut put = |k: &str, v: u64| {
        p.insert(k.to_owned(), v.to_string());
    };
    // Bytes as a streaming commit counts them (`commit/summary.rs`); the total only from the
    // parent's (Iceberg-Java's rule): the next streaming commit counts it from the live files.
    let bytes = |files: &[DataFile]| files.iter().map(bytes_of).sum::<u64>();
    let added_bytes = bytes(r.added) + bytes(r.added_deletes);
    let removed_bytes = bytes(r.removed_data) + bytes(r.removed_deletes);
    put("added-files-size", added_bytes);
    put("removed-files-size", removed_bytes);
    let parent_total = parent
        .and_then(|s| s.summary().additional_properties.get("total-files-size"))
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(total) = parent_total {
        put(
            "total-files-size",
            (total + added_bytes).saturating_sub(removed_bytes),
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::changelog::Position;
    use iceberg::spec::{DataFileBuilder, Struct};

    fn file(path: &str, rows: u64, puffin: bool) -> DataFile {
        DataFileBuilder::default()
            .content(if puffin {
                DataContentType::PositionDeletes
            } else {
                DataContentType::Data
            })
            .file_path(path.to_owned())
            .file_format(if puffin {
                DataFileFormat::Puffin
            } else {
                DataFileFormat::Parquet
            })
            .partition(Struct::empty())
            .partition_spec_id(0)
            .record_count(rows)
            .file_size_in_bytes(10)
            .build()
            .unwrap()
    }

    #[test]
    fn a_rewrite_keeps_live_rows_and_carries_the_checkpoint() {
        let parent = Snapshot::builder()
            .with_snapshot_id(1)
            .with_sequence_number(1)
            .with_timestamp_ms(0)
            .with_manifest_list("l".to_owned())
            .with_summary(Summary {
                operation: Operation::Overwrite,
                additional_properties: [
                    ("total-data-files", "5"),
                    ("total-records", "100"),
                    ("total-delete-files", "3"),
                    ("total-position-deletes", "30"),
                    ("total-files-size", "500"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            })
            .build();
        let cp = Checkpoint::new("shop", "0/10".parse::<Position>().unwrap());
        let added = [file("n", 50, false)];
        let removed_data = [file("a", 40, false), file("b", 30, false)];
        let removed_deletes = [file("a.dv", 20, true)];
        let s = summary(
            &Replaced {
                added: &added,
                added_deletes: &[],
                removed_data: &removed_data,
                removed_deletes: &removed_deletes,
            },
            Some(&parent),
            Some(&cp),
            7,
        );
        assert_eq!(s.operation, Operation::Replace);
        let get = |k: &str| s.additional_properties.get(k).cloned().unwrap_or_default();
        assert_eq!(get("total-data-files"), "4");
        assert_eq!(get("total-records"), "80");
        assert_eq!(get("total-delete-files"), "2");
        // Live rows unchanged: 100 - 30 before, 80 - 10 after.
        assert_eq!(get("total-position-deletes"), "10");
        assert_eq!(get("removed-dvs"), "1");
        // 10 bytes per file: one added, two data files and a vector (no blob size: the
        // file's) removed.
        assert_eq!(get("total-files-size"), "480");
        assert_eq!(get("cdcd.position"), cp.position.to_string());
        assert_eq!(get(LEASE_EPOCH_KEY), "7");
    }
}
