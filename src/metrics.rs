//! Metric names (`cdcd_<name>_<unit>[_total]`), kept as constants so code and docs agree.
//! Every metric carries a `pipeline` label; labels are bounded (table, op, kind). Emit per batch,
//! never per row.

pub const SOURCE_LAG_SECONDS: &str = "cdcd_source_lag_seconds";
pub const SOURCE_LAG_BYTES: &str = "cdcd_source_lag_bytes";
pub const REPLICATION_SLOT_RETAINED_BYTES: &str = "cdcd_replication_slot_retained_bytes";
pub const CHANGES_TOTAL: &str = "cdcd_changes_total";
pub const TRANSACTIONS_TOTAL: &str = "cdcd_transactions_total";
pub const COMMITS_TOTAL: &str = "cdcd_commits_total";
pub const COMMIT_DURATION_SECONDS: &str = "cdcd_commit_duration_seconds";
pub const LAST_COMMIT_TIMESTAMP_SECONDS: &str = "cdcd_last_commit_timestamp_seconds";
pub const BUFFERED_ROWS: &str = "cdcd_buffered_rows";
pub const ERRORS_TOTAL: &str = "cdcd_errors_total";
pub const SNAPSHOT_ROWS_TOTAL: &str = "cdcd_snapshot_rows_total";
pub const SNAPSHOT_ROWS_ESTIMATED: &str = "cdcd_snapshot_rows_estimated";

pub const LABEL_PIPELINE: &str = "pipeline";
pub const LABEL_TABLE: &str = "table";
pub const LABEL_OP: &str = "op";
pub const LABEL_KIND: &str = "kind";
