//! The maintenance metrics both sinks record: Iceberg's cycle (`sinks/iceberg/maintenance/`) and
//! the LSM sink's in-writer expiry and compaction (`sinks/lsm/`). Names and labels are the user
//! contract (docs/metrics.md).

use super::{
    LABEL_KIND, LABEL_TABLE, MAINTENANCE_BYTES_REWRITTEN_TOTAL, MAINTENANCE_FILES_DELETED_TOTAL,
    MAINTENANCE_FILES_REWRITTEN_TOTAL, MAINTENANCE_RUNS_TOTAL, MAINTENANCE_SNAPSHOTS_EXPIRED_TOTAL,
    TABLE_LIVE_FILES, TABLE_MANIFESTS, TABLE_SNAPSHOTS,
};

/// `kind` of an expiry run.
pub const KIND_EXPIRE: &str = "expire";
/// `kind` of a compaction run on the Iceberg sink (Iceberg's procedure name).
pub const KIND_REWRITE_DATA_FILES: &str = "rewrite_data_files";
/// `kind` of a compaction run on the LSM sink (Paimon's procedure name).
pub const KIND_COMPACT: &str = "compact";

/// One expiry run of `table`: snapshots it removed and files it deleted.
pub fn expiry(table: &str, snapshots_expired: u64, files_deleted: u64) {
    let t = || table.to_owned();
    metrics::counter!(MAINTENANCE_RUNS_TOTAL, LABEL_TABLE => t(), LABEL_KIND => KIND_EXPIRE)
        .increment(1);
    metrics::counter!(MAINTENANCE_SNAPSHOTS_EXPIRED_TOTAL, LABEL_TABLE => t())
        .increment(snapshots_expired);
    metrics::counter!(MAINTENANCE_FILES_DELETED_TOTAL, LABEL_TABLE => t()).increment(files_deleted);
}

/// One committed compaction of `table` (`kind`: [`KIND_REWRITE_DATA_FILES`] or [`KIND_COMPACT`]).
pub fn compaction(table: &str, kind: &'static str, files_rewritten: u64, bytes_rewritten: u64) {
    let t = || table.to_owned();
    metrics::counter!(MAINTENANCE_RUNS_TOTAL, LABEL_TABLE => t(), LABEL_KIND => kind).increment(1);
    metrics::counter!(MAINTENANCE_FILES_REWRITTEN_TOTAL, LABEL_TABLE => t())
        .increment(files_rewritten);
    metrics::counter!(MAINTENANCE_BYTES_REWRITTEN_TOTAL, LABEL_TABLE => t())
        .increment(bytes_rewritten);
}

/// What `table` holds after maintenance: snapshots kept, live data and delete files of the
/// current snapshot, and its manifests.
pub fn table_shape(table: &str, snapshots: u64, live_files: u64, manifests: u64) {
    let t = || table.to_owned();
    metrics::gauge!(TABLE_SNAPSHOTS, LABEL_TABLE => t()).set(snapshots as f64);
    metrics::gauge!(TABLE_LIVE_FILES, LABEL_TABLE => t()).set(live_files as f64);
    metrics::gauge!(TABLE_MANIFESTS, LABEL_TABLE => t()).set(manifests as f64);
}
