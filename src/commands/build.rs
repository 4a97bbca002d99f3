//! What every command and the daemon build from the config: the warehouse, the sink (fenced by
//! the lease when it writes pipeline state) and the pipeline's settings.

use std::sync::Arc;
use std::time::Duration;

use super::CommandError;
use crate::config::Config;
use crate::pipeline::Settings;
use crate::sinks::Sink;
use crate::sources::Source;
use crate::storage::{Fence, StorageError, Warehouse};

/// The pipeline's settings from the config and the source, with no stores attached (the daemon
/// attaches its own per round).
pub(crate) fn settings(config: &Config, source: &dyn Source) -> Settings {
    Settings {
        pipeline: config.pipeline.clone(),
        commit_interval: Duration::from_millis(config.commit_interval_ms),
        commit_max_rows: config.commit_max_rows,
        memory_budget: config.memory_budget,
        snapshot_commit_rows: config.snapshot_commit_rows,
        commit_concurrency: config.commit_concurrency,
        snapshot: source.snapshot_mode(),
        slot: source.stream_name(),
        progress: None,
        source_state: None,
        resync: None,
        resyncs: None,
        ack_hold: None,
        schema_change: config.schema_change.clone(),
    }
}

/// The configured sink; with `fence`, every write it makes passes the lease's fence.
pub(crate) fn build_sink(
    config: &Config,
    fence: Option<Fence>,
) -> Result<Arc<dyn Sink>, CommandError> {
    // Before any table's index opens: they share the budget's index part.
    crate::memory_budget::install(config.memory_budget);
    let mut warehouse = open_warehouse(config)?;
    if let Some(fence) = fence {
        warehouse = warehouse.fenced(fence);
    }
    crate::sinks::build(
        &config.sink,
        &config.pipeline,
        warehouse,
        config.schema_change.clone(),
    )
    .map_err(|e| Box::new(e).into())
}

/// The configured warehouse with `[sink.s3]` applied.
pub fn open_warehouse(config: &Config) -> Result<Warehouse, StorageError> {
    Warehouse::open(config.sink.warehouse(), &config.s3)
}
