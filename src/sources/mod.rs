//! Sources: replication readers. A source speaks its database's replication protocol and yields
//! committed [`Transaction`]s in commit order, each with the position at which it is complete.
//!
//! - `postgres/`: logical replication with the pgoutput plugin.
//! - `mysql/`: the MySQL/MariaDB binlog, as a replica.
//!
//! Sources never import sinks: they learn what is durable only through the acknowledged position.

use async_trait::async_trait;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::changelog::{Position, TableChanges, TableId, Transaction};

pub mod mysql;
pub mod postgres;

/// What a source hands the pipeline.
#[derive(Debug)]
pub enum SourceEvent {
    /// A committed transaction with changes to captured tables.
    Transaction(Transaction),
    /// Rows of a table's initial copy (all inserts; the first batch of a table starts with a
    /// `Truncate` so a retried copy replaces what an interrupted one left). Commits of these rows
    /// carry [`Position::snapshot_incomplete`] until `SnapshotDone`.
    SnapshotRows(TableChanges),
    /// The copy of `table` is complete; the table is consistent at `position` (the slot's
    /// consistent point) and must be committed with it even if no rows were copied.
    SnapshotDone { table: TableId, position: Position },
    /// Every transaction before `Position` has been delivered and none is open: once everything
    /// delivered is committed, this position may be acknowledged (keeps an idle source's log from
    /// growing).
    Heartbeat(Position),
}

/// A replication reader.
///
/// Ordering: events arrive in source commit order. Durability: the source acknowledges to its
/// server only positions received on `acks`, which the pipeline sends after the tables are
/// committed; it never acknowledges a position it was not given, and never moves backwards.
/// Errors: a protocol or server error ends `run` with `Err`; the pipeline stops. Cancel safety:
/// on `shutdown`, `run` stops reading, sends the latest ack it has, and returns `Ok`.
#[async_trait]
pub trait Source: Send {
    /// Checks the server, creates what is missing except the slot (Postgres: publication), and
    /// returns the tables this source captures and whether its slot exists.
    async fn prepare(&mut self) -> Result<Prepared, SourceError>;

    /// With `resume.snapshot`, (re)creates the slot, copies every captured table as
    /// `SnapshotRows`/`SnapshotDone`, then streams from the copy's consistent point; otherwise streams
    /// transactions after `resume.start` (`None`: from where the slot stands). Runs until
    /// `shutdown` is cancelled or the stream fails.
    async fn run(
        self: Box<Self>,
        resume: Resume,
        events: mpsc::Sender<SourceEvent>,
        acks: watch::Receiver<Option<Position>>,
        shutdown: CancellationToken,
    ) -> Result<(), SourceError>;
}

/// What [`Source::prepare`] found.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub tables: Vec<TableId>,
    /// Whether the replication slot (Postgres) already exists.
    pub slot_exists: bool,
}

/// Where [`Source::run`] starts.
#[derive(Debug, Clone)]
pub struct Resume {
    /// Stream transactions after this position (`None`: where the slot stands).
    pub start: Option<Position>,
    /// Copy every captured table first, from a new slot's exported snapshot.
    pub snapshot: bool,
}

/// A source failed. Each variant names what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{context}: {detail}")]
    Server { context: String, detail: String },
    #[error("cannot connect to {target}: {detail}")]
    Connect { target: String, detail: String },
    #[error("replication protocol: {0}")]
    Protocol(String),
    #[error("{table}: {detail}")]
    Table { table: TableId, detail: String },
    #[error("{0}")]
    Config(String),
    #[error("spill file {path}: {source}")]
    Spill {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the pipeline stopped receiving changes")]
    Closed,
}

impl SourceError {
    /// A short label for `cdcd_errors_total{kind}`.
    pub fn kind(&self) -> &'static str {
        match self {
            SourceError::Server { .. } => "source_server",
            SourceError::Connect { .. } => "source_connect",
            SourceError::Protocol(_) => "source_protocol",
            SourceError::Table { .. } => "source_table",
            SourceError::Config(_) => "config",
            SourceError::Spill { .. } => "spill",
            SourceError::Closed => "closed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(dead_code)]
    fn _source_is_object_safe(_: Box<dyn Source>) {}
}
