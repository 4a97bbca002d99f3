//! `cdcd cleanup`: deletes orphan files (files under a table that no metadata version
//! references, left by crashed or lost commits) older than the grace period, and prints each
//! file and a line per table, or JSON.

use std::time::Duration;

use super::build::build_sink;
use super::{print_json, CommandError};
use crate::config::Config;
use crate::storage::cleanup::TableCleanup;

/// Cleans up (or, with `dry_run`, lists what it would delete) and prints the outcome.
pub async fn run(
    config: &Config,
    grace_secs: u64,
    dry_run: bool,
    json: bool,
) -> Result<(), CommandError> {
    let reports = cleanup(config, Duration::from_secs(grace_secs), dry_run).await?;
    if json {
        return print_json(&reports);
    }
    let verb = if dry_run { "would delete" } else { "deleted" };
    for r in &reports {
        for o in &r.orphans {
            println!("{verb} {o}");
        }
        println!(
            "{}: {} live files, {verb} {} orphans, kept {} younger than {grace_secs}s",
            r.table,
            r.live,
            r.orphans.len(),
            r.young
        );
    }
    Ok(())
}

/// Finds orphan files in every table of the configured sink's format in the warehouse (files no
/// metadata references, older than `grace`) and deletes them unless `dry_run`.
pub async fn cleanup(
    config: &Config,
    grace: Duration,
    dry_run: bool,
) -> Result<Vec<TableCleanup>, CommandError> {
    let sink = build_sink(config, None)?;
    Ok(sink.cleanup(grace, dry_run).await.map_err(Box::new)?)
}
