//! One maintenance cycle of one table ([`MaintenanceCycle`]): compact its data files
//! (`compaction/`, [`RewriteDataFiles`]: first, so the files it replaces leave with the snapshots
//! the expiry below removes in a later cycle), then expire snapshots (`expire_snapshots.rs`,
//! [`ExpireSnapshots`]: finish an expiry a crash interrupted, expire what the table's properties
//! say, delete the files only the expired snapshots reached), sweep metadata files the log no
//! longer names, and report (log line, metrics).
//!
//! Concurrency with streaming commits of the same table in this process: each of the cycle's
//! commits is made under the table's slot lock (`tables.rs`), as its action's module doc says.
//!
//! Idle tables cost nothing (issue 37: a daemon may capture 1,000 tables, most of them idle): a
//! cycle that committed nothing leaves its table [`Settled`] on the metadata file it ended on,
//! until the next expiry is due (`expire::next_due`) or [`IDLE_RECHECK_MS`] passed. While the
//! table's newest metadata known to this process is still that file, the next cycles return at
//! once, without a request. What could change the outcome without changing that file: the
//! clock, which `next_due` accounts for exactly (compaction's choice does not depend on it), and
//! another engine's commit, which the recheck catches (and cdcd's own next commit at once).

use iceberg::spec::TableMetadata;

use super::compaction::{Compacted, RewriteDataFiles};
use super::expire_snapshots::ExpireSnapshots;
use super::metadata_log;
use super::pending_deletes::PendingDeletes;
use super::properties::Compaction;
use super::MaintenanceState;
use crate::changelog::TableId;
use crate::metrics as m;
use crate::metrics::maintenance as maintenance_metrics;
use crate::sinks::iceberg::changelog::ChangelogRetention;
use crate::sinks::iceberg::files::metadata::Loaded;
use crate::sinks::iceberg::rows::live::LiveState;
use crate::sinks::iceberg::tables::Tables;
use crate::sinks::{MaintenanceReport, MaintenanceWanted, SinkError};

/// After a commit of `table` (now at `meta`, its live files `live`): asks `wanted` for a cycle of
/// it before the next interval when its small data files reached
/// `cdcd.compaction.trigger-small-files` (`sinks/wanted.rs`). A bad property asks nothing (the
/// cycle reports it).
pub(crate) fn ask_if_due(
    wanted: &MaintenanceWanted,
    table: &TableId,
    meta: &TableMetadata,
    live: Option<&LiveState>,
) {
    let (Some(live), Ok(policy)) = (live, Compaction::from_properties(meta.properties())) else {
        return;
    };
    if policy.triggered(live.files.data.iter().map(|f| f.file.file_size_in_bytes())) {
        wanted.want(table);
    }
}

/// How long a settled table is left alone at most: another engine's commit to a table cdcd no
/// longer writes (or a change of its properties) is maintained within this time.
pub(super) const IDLE_RECHECK_MS: i64 = 60 * 60 * 1000;

/// How often a table's metadata directory is listed for metadata files a crash left (the
/// first cycle of each table in a process, then at this interval): a listing of a busy table's
/// directory every cycle was a request per table per cycle for what only a crash leaves.
const SWEEP_EVERY_MS: i64 = 10 * 60 * 1000;

/// A table whose last cycle found nothing to do; see the module doc.
#[derive(Debug, Clone)]
pub(crate) struct Settled {
    /// The metadata file the cycle ended on.
    file: String,
    /// Until when (Unix ms) nothing can be due while the table stays on `file`.
    until_ms: i64,
}

impl Settled {
    /// Whether a cycle at `now_ms` would find nothing to do, the table's newest metadata known
    /// to this process being `current`.
    fn holds(&self, current: Option<&Loaded>, now_ms: i64) -> bool {
        now_ms < self.until_ms && current.is_some_and(|c| c.file == self.file)
    }
}

/// One cycle of one table; see the module doc.
pub(in crate::sinks::iceberg) struct MaintenanceCycle<'a> {
    tables: &'a Tables,
    /// The sink's maintenance: one cycle at a time, and what cycles keep between them.
    state: &'a tokio::sync::Mutex<MaintenanceState>,
    table: &'a TableId,
}

impl<'a> MaintenanceCycle<'a> {
    pub(in crate::sinks::iceberg) fn new(
        tables: &'a Tables,
        state: &'a tokio::sync::Mutex<MaintenanceState>,
        table: &'a TableId,
    ) -> MaintenanceCycle<'a> {
        MaintenanceCycle {
            tables,
            state,
            table,
        }
    }

    /// Runs the cycle; `Ok(None)` when the table does not exist, or is settled (nothing can be
    /// due: see the module doc).
    pub(in crate::sinks::iceberg) async fn run(
        &self,
    ) -> Result<Option<MaintenanceReport>, SinkError> {
        let (tables, table) = (self.tables, self.table);
        let mut state = self.state.lock().await;
        let MaintenanceState {
            pending,
            settled,
            swept_ms,
        } = &mut *state;
        let now_ms = chrono::Utc::now().timestamp_millis();
        if settled
            .get(table)
            .is_some_and(|s| s.holds(tables.cached(table).as_deref(), now_ms))
        {
            return Ok(None);
        }
        settled.remove(table);
        let contents = tables.manifest_contents(table);
        let cache = &*contents;
        let pending = pending.entry(table.clone()).or_insert_with(|| {
            let ns = tables.namespace.as_deref().unwrap_or(&table.namespace);
            PendingDeletes::new(&tables.warehouse, &tables.pipeline, ns, &table.name)
        });
        let mut report = MaintenanceReport {
            table: table.to_string(),
            ..MaintenanceReport::default()
        };
        // Whether the cycle committed nothing (and failed nowhere): then it settles the table.
        let mut quiet = true;
        if ChangelogRetention::new(tables, table)
            .commit()
            .await?
            .is_some()
        {
            quiet = false;
        }
        match RewriteDataFiles::new(tables, table).commit().await {
            Ok(Some(c)) => {
                quiet = false;
                record_compaction(&c, &mut report);
            }
            Ok(None) => {}
            Err(e @ SinkError::Fenced(_)) => return Err(e),
            // Expiry goes on: a failed compaction committed nothing (its files are orphans).
            Err(e) => {
                quiet = false;
                tracing::warn!(table = %table, error = %e, "compaction failed; the next cycle retries");
                metrics::counter!(m::ERRORS_TOTAL, m::LABEL_KIND => "maintenance").increment(1);
            }
        }
        let expiry = ExpireSnapshots::new(tables, table);
        expiry.finish_interrupted(cache, pending).await?;
        let Some(outcome) = expiry.commit().await? else {
            return Ok(None);
        };
        let mut next_due_ms = None;
        let current = match outcome {
            Ok(c) => {
                quiet = false;
                report.snapshots_expired = c.expiry.snapshots.len() as u64;
                report.refs_removed = c.expiry.refs.len() as u64;
                expiry.schedule_expired(&c, cache, pending).await?;
                c.after
            }
            Err(unchanged) => {
                next_due_ms = unchanged.next_due_ms;
                unchanged.loaded
            }
        };
        let deleted = pending
            .delete_due(&tables.warehouse, chrono::Utc::now().timestamp_millis())
            .await?;
        report.files_deleted += deleted;
        quiet &= deleted == 0;
        if swept_ms
            .get(table)
            .is_none_or(|t| now_ms.saturating_sub(*t) >= SWEEP_EVERY_MS)
        {
            report.metadata_files_deleted = metadata_log::sweep(
                &tables.warehouse,
                &current,
                tables.catalog_for(table).names_previous(),
            )
            .await? as u64;
            swept_ms.insert(table.clone(), now_ms);
        }
        self.describe(&current, &mut report).await?;
        record(&report);
        if quiet {
            let recheck = now_ms.saturating_add(IDLE_RECHECK_MS);
            settled.insert(
                table.clone(),
                Settled {
                    file: current.file.clone(),
                    until_ms: next_due_ms
                        .into_iter()
                        .chain(pending.next_due_ms())
                        .fold(recheck, i64::min),
                },
            );
        }
        Ok(Some(report))
    }

    /// Snapshots, live files and manifests of the current snapshot, for the report.
    async fn describe(
        &self,
        current: &Loaded,
        report: &mut MaintenanceReport,
    ) -> Result<(), SinkError> {
        let meta = &current.metadata;
        report.snapshots = meta.snapshots().len() as u64;
        if let Some(s) = meta.current_snapshot() {
            let p = &s.summary().additional_properties;
            let get = |k: &str| p.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            report.live_files = get("total-data-files") + get("total-delete-files");
            report.manifests = self
                .tables
                .manifest_contents(self.table)
                .manifests(
                    &self.tables.warehouse,
                    s.manifest_list(),
                    meta.format_version(),
                )
                .await?
                .len() as u64;
        }
        Ok(())
    }
}

/// A compaction's log line and metrics.
fn record_compaction(c: &Compacted, report: &mut MaintenanceReport) {
    let table = report.table.as_str();
    tracing::info!(
        table = %table,
        files_rewritten = c.files_rewritten,
        bytes_rewritten = c.bytes_rewritten,
        files_written = c.files_written,
        bytes_written = c.bytes_written,
        vectors_removed = c.vectors_removed,
        rows_dropped = c.rows_dropped,
        deletes_carried = c.deletes_carried,
        positions_converted = c.positions_converted,
        "compaction committed"
    );
    maintenance_metrics::compaction(
        table,
        maintenance_metrics::KIND_REWRITE_DATA_FILES,
        c.files_rewritten,
        c.bytes_rewritten,
    );
    report.files_rewritten += c.files_rewritten;
    report.bytes_rewritten += c.bytes_rewritten;
    report.files_written += c.files_written;
}

/// The cycle's log line and metrics.
fn record(r: &MaintenanceReport) {
    tracing::info!(
        table = %r.table,
        expired = r.snapshots_expired,
        refs_removed = r.refs_removed,
        files_deleted = r.files_deleted,
        metadata_files_deleted = r.metadata_files_deleted,
        files_rewritten = r.files_rewritten,
        snapshots = r.snapshots,
        live_files = r.live_files,
        manifests = r.manifests,
        "maintenance cycle"
    );
    maintenance_metrics::expiry(
        &r.table,
        r.snapshots_expired,
        r.files_deleted + r.metadata_files_deleted,
    );
    maintenance_metrics::table_shape(&r.table, r.snapshots, r.live_files, r.manifests);
}
