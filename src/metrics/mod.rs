//! Operations: metric names, the Prometheus exporter, health and readiness, systemd notification.
//!
//! Where it sits: beside the data flow, not in it. The pipeline and the sources record metrics
//! through the `metrics` facade (per batch, never per row) and report signs of life to the
//! process-wide [`Health`]; this module renders both over HTTP (`http.rs`: `/metrics`, `/healthz`,
//! `/readyz`) and tells systemd when cdcd is ready, alive and stopping (`notify.rs`).
//!
//! Why a facade and a global: metrics and health are written from the source task, the pipeline
//! and the sink, which share no handle. Names are constants so code, docs/metrics.md and the Grafana
//! dashboard agree (`cdcd_<name>_<unit>[_total]`); labels are bounded (table, op, kind). The
//! `pipeline` label is a global label of the exporter, so every series carries it even when the
//! recording code (a source) does not know the pipeline's name.

pub mod health;
pub mod http;
pub mod maintenance;
pub mod notify;

use std::time::{SystemTime, UNIX_EPOCH};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub use health::{Health, Readiness};

pub const SOURCE_LAG_SECONDS: &str = "cdcd_source_lag_seconds";
pub const SOURCE_LAG_BYTES: &str = "cdcd_source_lag_bytes";
pub const REPLICATION_SLOT_RETAINED_BYTES: &str = "cdcd_replication_slot_retained_bytes";
pub const CHANGES_TOTAL: &str = "cdcd_changes_total";
pub const TRANSACTIONS_TOTAL: &str = "cdcd_transactions_total";
pub const COMMITS_TOTAL: &str = "cdcd_commits_total";
/// Commits planned again because another writer (Spark, Trino, an external compaction) committed
/// to the table first (Iceberg sink).
pub const COMMIT_RETRIES_TOTAL: &str = "cdcd_commit_retries_total";
pub const COMMIT_DURATION_SECONDS: &str = "cdcd_commit_duration_seconds";
pub const LAST_COMMIT_TIMESTAMP_SECONDS: &str = "cdcd_last_commit_timestamp_seconds";
pub const BUFFERED_ROWS: &str = "cdcd_buffered_rows";
pub const ERRORS_TOTAL: &str = "cdcd_errors_total";
pub const SNAPSHOT_ROWS_TOTAL: &str = "cdcd_snapshot_rows_total";
pub const SNAPSHOT_ROWS_ESTIMATED: &str = "cdcd_snapshot_rows_estimated";
/// Arrow bytes of the values the initial copy copied, by table (`pipeline/copy_meter.rs`).
pub const SNAPSHOT_BYTES_TOTAL: &str = "cdcd_snapshot_bytes_total";
/// The source's size of the table on disk, by table (Postgres `pg_table_size`, MySQL
/// `DATA_LENGTH`).
pub const SNAPSHOT_BYTES_ESTIMATED: &str = "cdcd_snapshot_bytes_estimated";
/// Seconds until the initial copies under way are done, at their rate so far (0 when none runs).
pub const SNAPSHOT_ETA_SECONDS: &str = "cdcd_snapshot_eta_seconds";
/// Tables whose resync cdcd started by itself, on a schema change their lake table cannot
/// express (`source.schema_change = "resync"`; `pipeline/schema_resync.rs`).
pub const SCHEMA_RESYNCS_TOTAL: &str = "cdcd_schema_resyncs_total";
/// Heartbeats written to the source (Postgres `pg_logical_emit_message`).
pub const HEARTBEATS_TOTAL: &str = "cdcd_heartbeats_total";
/// 1 while the replication slot is invalidated (`wal_status = 'lost'`), else 0 (Postgres).
pub const REPLICATION_SLOT_LOST: &str = "cdcd_replication_slot_lost";

/// Maintenance runs, by table and kind (`maintenance::KIND_*`: `expire` every Iceberg cycle and
/// every LSM expiry; `rewrite_data_files` every Iceberg compaction committed, `compact` every LSM
/// one). Recorded through `maintenance.rs`.
pub const MAINTENANCE_RUNS_TOTAL: &str = "cdcd_maintenance_runs_total";
/// Snapshots removed from tables' metadata by expiry.
pub const MAINTENANCE_SNAPSHOTS_EXPIRED_TOTAL: &str = "cdcd_maintenance_snapshots_expired_total";
/// Files maintenance deleted (those only expired snapshots reached; old metadata files).
pub const MAINTENANCE_FILES_DELETED_TOTAL: &str = "cdcd_maintenance_files_deleted_total";
/// Data files replaced by compaction.
pub const MAINTENANCE_FILES_REWRITTEN_TOTAL: &str = "cdcd_maintenance_files_rewritten_total";
/// Bytes of the data files replaced by compaction.
pub const MAINTENANCE_BYTES_REWRITTEN_TOTAL: &str = "cdcd_maintenance_bytes_rewritten_total";
/// Snapshots in the table's metadata after the last maintenance cycle.
pub const TABLE_SNAPSHOTS: &str = "cdcd_table_snapshots";
/// Data and delete files of the table's current snapshot.
pub const TABLE_LIVE_FILES: &str = "cdcd_table_live_files";
/// Manifests in the table's current snapshot.
pub const TABLE_MANIFESTS: &str = "cdcd_table_manifests";
/// Requests sent to the warehouse's object store, by `op` (`storage/requests.rs`: put, get, head,
/// list, delete, copy).
pub const OBJECT_STORE_REQUESTS_TOTAL: &str = "cdcd_object_store_requests_total";
/// Bytes the primary-key indexes of every table hold together, by `part` (`INDEX_PART_*`): what
/// the budget's index shares hold (`memory_budget.rs`), beside the process's RSS.
pub const INDEX_MEMORY_BYTES: &str = "cdcd_index_memory_bytes";

pub const LABEL_PIPELINE: &str = "pipeline";
pub const LABEL_TABLE: &str = "table";
pub const LABEL_OP: &str = "op";
pub const LABEL_KIND: &str = "kind";
pub const LABEL_PART: &str = "part";

/// `cdcd_index_memory_bytes{part}`: the memtables, the run metas (sparse indexes, bloom filters,
/// and the tables of data file paths) and the shared block cache.
pub const INDEX_PART_MEMTABLES: &str = "memtables";
pub const INDEX_PART_RUN_METAS: &str = "run_metas";
pub const INDEX_PART_BLOCK_CACHE: &str = "block_cache";

/// `cdcd_errors_total{kind}` for a slot invalidated by `max_slot_wal_keep_size`.
pub const ERROR_KIND_SLOT_LOST: &str = "slot_lost";

/// Commit durations span milliseconds (a few rows, local disk) to minutes (a large batch to S3).
const COMMIT_DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// The exporter could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot install the metrics recorder: {0}")]
    Install(String),
    #[error("metrics.listen {addr}: {source}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// Installs the process-wide Prometheus recorder, with `pipeline` as a global label, and describes
/// every metric. Call once, before the pipeline starts; the handle renders `/metrics`.
pub fn install(pipeline: &str) -> Result<PrometheusHandle, MetricsError> {
    let handle = PrometheusBuilder::new()
        .add_global_label(LABEL_PIPELINE, pipeline)
        .set_buckets_for_metric(
            Matcher::Full(COMMIT_DURATION_SECONDS.to_owned()),
            COMMIT_DURATION_BUCKETS,
        )
        .map_err(|e| MetricsError::Install(e.to_string()))?
        .install_recorder()
        .map_err(|e| MetricsError::Install(e.to_string()))?;
    describe(pipeline);
    Ok(handle)
}

/// HELP texts, and zero values for the counters and gauges that exist from the start, so a
/// scrape shows every name before the first change arrives.
fn describe(pipeline: &str) {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!(
        SOURCE_LAG_SECONDS,
        Unit::Seconds,
        "Now minus the source commit time of the newest change committed to the tables (falls to ~0 when caught up)"
    );
    describe_gauge!(
        SOURCE_LAG_BYTES,
        Unit::Bytes,
        "Source WAL/binlog bytes not yet confirmed as committed (PG: current WAL LSN - confirmed_flush_lsn)"
    );
    describe_gauge!(
        REPLICATION_SLOT_RETAINED_BYTES,
        Unit::Bytes,
        "WAL the replication slot keeps on the source (current WAL LSN - restart_lsn)"
    );
    describe_gauge!(
        REPLICATION_SLOT_LOST,
        "1 when the replication slot was invalidated (wal_status = lost)"
    );
    describe_counter!(CHANGES_TOTAL, "Row changes committed, by table and op");
    describe_counter!(TRANSACTIONS_TOTAL, "Source transactions received");
    describe_counter!(COMMITS_TOTAL, "Table snapshots committed");
    describe_histogram!(
        COMMIT_DURATION_SECONDS,
        Unit::Seconds,
        "Time to write and commit one table snapshot"
    );
    describe_gauge!(
        LAST_COMMIT_TIMESTAMP_SECONDS,
        Unit::Seconds,
        "Unix time of the table's newest commit"
    );
    describe_gauge!(BUFFERED_ROWS, "Changes received and not yet committed");
    describe_counter!(ERRORS_TOTAL, "Errors, by kind");
    describe_counter!(SNAPSHOT_ROWS_TOTAL, "Rows copied by the initial copy");
    describe_gauge!(
        SNAPSHOT_ROWS_ESTIMATED,
        "Estimated rows of the table's initial copy"
    );
    describe_counter!(
        SNAPSHOT_BYTES_TOTAL,
        Unit::Bytes,
        "Bytes of values copied by the initial copy (Arrow)"
    );
    describe_gauge!(
        SNAPSHOT_BYTES_ESTIMATED,
        Unit::Bytes,
        "The source's size of the table on disk, for its initial copy"
    );
    describe_gauge!(
        SNAPSHOT_ETA_SECONDS,
        Unit::Seconds,
        "Estimated seconds until the initial copies under way are done"
    );
    describe_counter!(HEARTBEATS_TOTAL, "Heartbeats written to the source");
    describe_counter!(
        MAINTENANCE_RUNS_TOTAL,
        "Maintenance cycles run, by table and kind"
    );
    describe_counter!(
        MAINTENANCE_SNAPSHOTS_EXPIRED_TOTAL,
        "Snapshots removed by expiry"
    );
    describe_counter!(
        MAINTENANCE_FILES_DELETED_TOTAL,
        "Files deleted by maintenance (reached only by expired snapshots, or old metadata files)"
    );
    describe_counter!(
        MAINTENANCE_FILES_REWRITTEN_TOTAL,
        "Data files replaced by compaction"
    );
    describe_counter!(
        MAINTENANCE_BYTES_REWRITTEN_TOTAL,
        "Bytes of the data files replaced by compaction"
    );
    describe_gauge!(TABLE_SNAPSHOTS, "Snapshots in the table's metadata");
    describe_gauge!(
        TABLE_LIVE_FILES,
        "Data and delete files of the table's current snapshot"
    );
    describe_gauge!(TABLE_MANIFESTS, "Manifests in the table's current snapshot");
    describe_gauge!(
        INDEX_MEMORY_BYTES,
        Unit::Bytes,
        "Bytes every table's primary-key index holds together, by part (memtables, run_metas, block_cache)"
    );
    // With the same labels the pipeline records them with: a series recorded both with and
    // without an explicit `pipeline` label would render twice with one label set.
    metrics::counter!(TRANSACTIONS_TOTAL, LABEL_PIPELINE => pipeline.to_owned()).absolute(0);
    metrics::gauge!(BUFFERED_ROWS, LABEL_PIPELINE => pipeline.to_owned()).set(0.0);
}

/// `cdcd_source_lag_bytes`: how far the source's log is ahead of what cdcd confirmed. The hook
/// for every source: Postgres sets it from the slot (`sources/postgres/monitor.rs`); a binlog
/// source sets the bytes between the server's current binlog position and the confirmed one.
pub fn set_source_lag_bytes(bytes: u64) {
    metrics::gauge!(SOURCE_LAG_BYTES).set(bytes as f64);
}

/// Microseconds since the Unix epoch, for timestamp gauges and lag.
pub fn unix_now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// `now − source_time` in seconds, never negative (clocks of source and cdcd differ slightly).
pub fn lag_seconds(now_micros: i64, source_time_micros: i64) -> f64 {
    (now_micros.saturating_sub(source_time_micros)).max(0) as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_never_negative() {
        assert_eq!(lag_seconds(1_000_000, 3_000_000), 0.0);
        assert_eq!(lag_seconds(3_500_000, 1_000_000), 2.5);
    }

    #[test]
    fn names_follow_the_convention() {
        for name in [
            SOURCE_LAG_SECONDS,
            SOURCE_LAG_BYTES,
            REPLICATION_SLOT_RETAINED_BYTES,
            CHANGES_TOTAL,
            TRANSACTIONS_TOTAL,
            COMMITS_TOTAL,
            COMMIT_DURATION_SECONDS,
            LAST_COMMIT_TIMESTAMP_SECONDS,
            BUFFERED_ROWS,
            ERRORS_TOTAL,
            SNAPSHOT_ROWS_TOTAL,
            SNAPSHOT_ROWS_ESTIMATED,
            SNAPSHOT_BYTES_TOTAL,
            SNAPSHOT_BYTES_ESTIMATED,
            SNAPSHOT_ETA_SECONDS,
            HEARTBEATS_TOTAL,
            REPLICATION_SLOT_LOST,
            MAINTENANCE_RUNS_TOTAL,
            MAINTENANCE_SNAPSHOTS_EXPIRED_TOTAL,
            MAINTENANCE_FILES_DELETED_TOTAL,
            MAINTENANCE_FILES_REWRITTEN_TOTAL,
            MAINTENANCE_BYTES_REWRITTEN_TOTAL,
            TABLE_SNAPSHOTS,
            TABLE_LIVE_FILES,
            TABLE_MANIFESTS,
            OBJECT_STORE_REQUESTS_TOTAL,
            INDEX_MEMORY_BYTES,
        ] {
            assert!(name.starts_with("cdcd_"), "{name}");
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'_' || b.is_ascii_digit()),
                "{name}"
            );
        }
    }
}
