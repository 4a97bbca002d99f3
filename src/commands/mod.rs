//! The CLI's commands besides the daemon (`cdcd` alone runs it: `src/daemon/mod.rs`), one file
//! each, which does the work and prints what the user sees: `check` (preflight), `status`,
//! `cleanup` (orphan files), `maintain` (one maintenance cycle, under the lease) and `resync` (a
//! request the daemon picks up: `checkpoint/resync.rs`). Each is built from the configured source
//! and sink (`build.rs`), through the Source and Sink traits only.

pub mod build;
pub mod check;
pub mod cleanup;
pub mod maintain;
pub mod resync;
pub mod status;

pub use build::open_warehouse;

use crate::changelog::TableId;
use crate::checkpoint::lease::LeaseError;
use crate::checkpoint::resync::ResyncError;
use crate::pipeline::PipelineError;
use crate::sinks::SinkError;
use crate::sources::SourceError;
use crate::storage::cleanup::CleanupError;
use crate::storage::StorageError;

/// A command failed before or while running the pipeline.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Sink(#[from] Box<SinkError>),
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Cleanup(#[from] CleanupError),
    #[error(transparent)]
    Warehouse(#[from] StorageError),
    #[error("--table {0:?}: name a table as schema.table (Postgres) or database.table (MySQL)")]
    TableName(String),
    #[error(transparent)]
    Resync(#[from] ResyncError),
    #[error("table {table} is not captured by pipeline {pipeline} (source.tables matches: {captured}); add it to source.tables, or name one of these")]
    NotCaptured {
        table: TableId,
        pipeline: String,
        captured: String,
    },
    #[error("cannot resync {table}: source.snapshot = \"never\" copies no table; set source.snapshot = \"initial\"")]
    ResyncWithoutCopy { table: TableId },
    /// A `--json` answer could not be encoded.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// `schema.table` (Postgres) or `database.table` (MySQL) as given to `--table`.
fn parse_table(t: &str) -> Result<TableId, CommandError> {
    let (ns, name) = t
        .split_once('.')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
        .ok_or_else(|| CommandError::TableName(t.to_owned()))?;
    Ok(TableId::new(ns, name))
}

/// Prints `value` as pretty JSON, the `--json` answer of every command that has one.
fn print_json(value: &impl serde::Serialize) -> Result<(), CommandError> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}
