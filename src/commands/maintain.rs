//! `cdcd maintain`: one maintenance cycle now (snapshot expiry and the metadata log, following
//! each table's properties) under the pipeline's lease, and a line per table or JSON.

use std::process::ExitCode;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::build::{build_sink, open_warehouse};
use super::{parse_table, print_json, CommandError};
use crate::changelog::TableId;
use crate::checkpoint::lease::{Lease, LeaseSettings};
use crate::config::Config;
use crate::daemon::lease::while_kept;
use crate::sinks::MaintenanceReport;

/// Runs the cycle and prints its reports; fails when a table's maintenance failed.
pub async fn run(
    config: &Config,
    table: Option<&str>,
    json: bool,
) -> Result<ExitCode, CommandError> {
    let reports = maintain(config, table).await?;
    if json {
        print_json(&reports)?;
    } else {
        for r in &reports {
            match &r.error {
                Some(e) => println!("{}: failed: {e}", r.table),
                None => println!(
                    "{}: rewrote {} data files ({} bytes) into {}; expired {} snapshots, deleted {} files and {} metadata files; {} snapshots, {} live files, {} manifests",
                    r.table,
                    r.files_rewritten,
                    r.bytes_rewritten,
                    r.files_written,
                    r.snapshots_expired,
                    r.files_deleted,
                    r.metadata_files_deleted,
                    r.snapshots,
                    r.live_files,
                    r.manifests
                ),
            }
        }
    }
    let failed = reports.iter().any(|r| r.error.is_some());
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// One maintenance cycle on `table` (`schema.table`) or on every captured table, holding the
/// pipeline's lease (so it refuses while a daemon runs the pipeline: the daemon maintains its
/// tables itself) and writing through its fence.
pub async fn maintain(
    config: &Config,
    table: Option<&str>,
) -> Result<Vec<MaintenanceReport>, CommandError> {
    let tables: Vec<TableId> = match table {
        Some(t) => vec![parse_table(t)?],
        None => crate::sources::build(&config.source)
            .tables()
            .await?
            .into_iter()
            .map(|key| key.table)
            .collect(),
    };
    let warehouse = open_warehouse(config)?;
    let lease_settings = LeaseSettings {
        pipeline: config.pipeline.clone(),
        ttl: Duration::from_millis(config.lease_ttl_ms),
        standby: false,
    };
    let never = CancellationToken::new();
    let Some(mut lease) = Lease::acquire(&warehouse, lease_settings, &never).await? else {
        return Ok(Vec::new());
    };
    let sink = build_sink(config, Some(lease.fence()))?;
    let renewing = CancellationToken::new();
    let outcome = while_kept(&mut lease, &renewing, sink.maintain(Some(&tables))).await?;
    renewing.cancel();
    lease.release().await;
    Ok(outcome.map_err(Box::new)?)
}
