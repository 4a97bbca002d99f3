//! What the CLI's commands do: `run` (the daemon), `check` (preflight) and `status`, built from the
//! configured source and sink.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::changelog::TableId;
use crate::config::{Config, SinkConfig, SourceConfig};
use crate::pipeline::{self, PipelineError, Settings};
use crate::sinks::iceberg::IcebergSink;
use crate::sinks::{Sink, SinkError};
use crate::sources::mysql::MySqlSource;
use crate::sources::postgres::{setup, PostgresSource};
use crate::sources::{Source, SourceError};
use crate::storage::Warehouse;

/// One table in `cdcd status`.
#[derive(Debug, Clone, Serialize)]
pub struct StatusRow {
    pub table: String,
    pub location: Option<String>,
    pub position: Option<String>,
    pub snapshot_id: Option<i64>,
    pub rows: Option<u64>,
}

/// A command failed before or while running the pipeline.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Sink(#[from] Box<SinkError>),
}

fn settings(config: &Config) -> Settings {
    let (snapshot, slot) = match &config.source {
        SourceConfig::Postgres(pg) => (pg.snapshot, pg.slot.clone()),
        SourceConfig::MySql(my) => (my.snapshot, format!("server_id {}", my.server_id)),
    };
    Settings {
        pipeline: config.pipeline.clone(),
        commit_interval: Duration::from_millis(config.commit_interval_ms),
        commit_max_rows: config.commit_max_rows,
        snapshot,
        slot,
    }
}

fn build_source(config: &Config) -> Box<dyn Source> {
    match &config.source {
        SourceConfig::Postgres(pg) => Box::new(PostgresSource::new(pg.clone())),
        SourceConfig::MySql(my) => Box::new(MySqlSource::new(my.clone())),
    }
}

fn build_sink(config: &Config) -> Result<Arc<dyn Sink>, CommandError> {
    let SinkConfig::Iceberg(iceberg) = &config.sink;
    let sink = IcebergSink::new(iceberg, &config.pipeline).map_err(Box::new)?;
    Ok(Arc::new(sink))
}

/// Runs the pipeline until `shutdown`.
pub async fn run(config: &Config, shutdown: CancellationToken) -> Result<(), CommandError> {
    let source = build_source(config);
    let sink = build_sink(config)?;
    pipeline::run(source, sink, settings(config), shutdown).await?;
    Ok(())
}

/// Every problem found, one line each with how to fix it; empty when ready.
pub async fn check(config: &Config) -> Vec<String> {
    let mut problems: Vec<String> = match &config.source {
        SourceConfig::Postgres(pg) => PostgresSource::check(pg)
            .await
            .into_iter()
            .map(|p| p.to_string())
            .collect(),
        SourceConfig::MySql(my) => MySqlSource::check(my)
            .await
            .into_iter()
            .map(|p| p.to_string())
            .collect(),
    };
    if let Err(e) = probe_warehouse(config).await {
        problems.push(e);
    }
    problems
}

/// Writes and removes a small object under `<warehouse>/_cdcd/<pipeline>/` to prove the warehouse
/// is reachable and writable.
async fn probe_warehouse(config: &Config) -> Result<(), String> {
    use object_store::ObjectStoreExt;
    let SinkConfig::Iceberg(iceberg) = &config.sink;
    let warehouse = Warehouse::from_url(&iceberg.warehouse).map_err(|e| e.to_string())?;
    let location = warehouse.location(&["_cdcd", &config.pipeline, "check-probe"]);
    let path = warehouse.path(&location).map_err(|e| e.to_string())?;
    let unwritable = |e: object_store::Error| {
        format!(
            "warehouse {} is not writable ({e}): check the path and its permissions (sink.warehouse)",
            warehouse.url()
        )
    };
    warehouse
        .store()
        .put(&path, bytes::Bytes::from_static(b"cdcd check").into())
        .await
        .map_err(unwritable)?;
    warehouse.store().delete(&path).await.map_err(unwritable)?;
    Ok(())
}

/// The committed state of every captured table.
pub async fn status(config: &Config) -> Result<Vec<StatusRow>, CommandError> {
    let sink = build_sink(config)?;
    let tables: Vec<TableId> = match &config.source {
        SourceConfig::Postgres(pg) => {
            let client = setup::connect(pg).await?;
            setup::resolve_tables(&client, &pg.tables).await?
        }
        SourceConfig::MySql(my) => MySqlSource::tables(my).await?,
    };
    let mut rows = Vec::new();
    for table in tables {
        let status = sink.status(&table).await.map_err(Box::new)?;
        rows.push(StatusRow {
            table: table.to_string(),
            location: status.as_ref().map(|s| s.location.clone()),
            position: status
                .as_ref()
                .and_then(|s| s.checkpoint.as_ref())
                .map(|c| c.position.to_string()),
            snapshot_id: status.as_ref().map(|s| s.snapshot_id),
            rows: status.and_then(|s| s.rows),
        });
    }
    Ok(rows)
}
