//! Sources: replication readers. A source speaks its database's replication protocol and yields
//! committed [`Transaction`]s in commit order, each with the position at which it is complete.
//!
//! - `postgres/`: logical replication with the pgoutput plugin.
//! - `mysql/`: the MySQL/MariaDB binlog, as a replica.
//!
//! Sources never import sinks: they learn what is durable only through the acknowledged position.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use std::time::Duration;

use crate::changelog::{Position, TableChanges, TableId, TableKey, Transaction};
use crate::config::{SnapshotMode, SourceConfig};

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
    /// The copy of `table` is split into `chunks` (each a source-defined description, e.g. a
    /// primary-key range), copied in any order and possibly in parallel. Sent once per copy plan,
    /// before any [`SourceEvent::SnapshotChunk`] of the table.
    SnapshotPlan {
        table: TableId,
        chunks: Vec<String>,
        /// The source's row estimate (Postgres: `pg_class.reltuples`), for progress and the
        /// `cdcd_snapshot_rows_estimated` metric.
        estimated_rows: u64,
        /// The source's size of the table on disk (Postgres: `pg_table_size`, heap and TOAST;
        /// MySQL: `DATA_LENGTH`), for the `cdcd_snapshot_bytes_estimated` metric.
        estimated_bytes: u64,
    },
    /// Chunk `chunk` of `table`'s plan changed state. `Started` comes before any of the chunk's
    /// rows, `Done` after all of them, so a commit that records the progress never holds rows of
    /// a chunk it does not call started.
    SnapshotChunk {
        table: TableId,
        chunk: u32,
        state: ChunkState,
    },
    /// Changes to `table` at or below `until` may already be in its copied rows (the copy was
    /// taken at a snapshot newer than where the stream starts): apply inserts as upserts. Sent
    /// before the table's `SnapshotDone`.
    SnapshotUpsertUntil { table: TableId, until: Position },
    /// Every transaction before `Position` has been delivered and none is open: once everything
    /// delivered is committed, this position may be acknowledged (keeps an idle source's log from
    /// growing).
    Heartbeat(Position),
}

/// Where a chunk of an initial copy stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkState {
    /// Its rows may follow (and may be partly committed if the copy is interrupted).
    Started,
    /// All its rows have been sent.
    Done,
}

/// A table's initial copy as far as it got: the plan and which chunks are started or done.
/// Stored with every commit of the copy (checkpoint key `cdcd.snapshot`, JSON), handed back in
/// [`Resume::copy`] after a restart.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotProgress {
    /// Each chunk's source-defined description; chunk ids index this list.
    pub chunks: Vec<String>,
    /// Chunks whose rows may be partly in the table (copy them again as upserts).
    pub started: BTreeSet<u32>,
    /// Chunks entirely in the table.
    pub done: BTreeSet<u32>,
}

impl SnapshotProgress {
    pub fn to_json(&self) -> String {
        // Serializing strings and integers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn from_json(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }

    /// Records a chunk event.
    pub fn apply(&mut self, chunk: u32, state: ChunkState) {
        match state {
            ChunkState::Started => {
                if !self.done.contains(&chunk) {
                    self.started.insert(chunk);
                }
            }
            ChunkState::Done => {
                self.started.remove(&chunk);
                self.done.insert(chunk);
            }
        }
    }
}

/// A table to copy while the slot (and the other tables' positions) stay: its copy was
/// interrupted, or it was added to `source.tables`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCopy {
    pub table: TableId,
    /// What an interrupted copy finished (`None`: copy from scratch, replacing what the table
    /// holds).
    pub progress: Option<SnapshotProgress>,
}

/// A replication reader.
///
/// Ordering: events arrive in source commit order. Durability: the source acknowledges to its
/// server only positions received on `acks`, which the pipeline sends after the tables are
/// committed; it never acknowledges a position it was not given, and never moves backwards.
/// Errors: a protocol or server error ends `run` with `Err`; the pipeline stops. Cancel safety:
/// on `shutdown`, `run` stops reading, sends the latest ack it has, and returns `Ok`.
/// One `cdcd check` finding: what is wrong and how to fix it, printed as one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckProblem {
    pub problem: String,
    pub fix: String,
}

impl CheckProblem {
    pub fn new(problem: impl Into<String>, fix: impl Into<String>) -> Self {
        CheckProblem {
            problem: problem.into(),
            fix: fix.into(),
        }
    }
}

impl std::fmt::Display for CheckProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.problem, self.fix)
    }
}

/// The source `config` describes (the one place that knows every kind).
pub fn build(config: &SourceConfig) -> Box<dyn Source> {
    match config {
        SourceConfig::Postgres(pg) => Box::new(postgres::PostgresSource::new(pg.clone())),
        SourceConfig::MySql(my) => Box::new(mysql::MySqlSource::new(my.clone())),
    }
}

#[async_trait]
pub trait Source: Send {
    /// Checks the server, creates what is missing except the slot (Postgres: publication), and
    /// returns the tables this source captures and whether its slot exists.
    async fn prepare(&mut self) -> Result<Prepared, SourceError>;

    /// With `resume.snapshot`, (re)creates the slot, copies every captured table as
    /// `SnapshotRows`/`SnapshotDone`, then streams from the copy's consistent point; otherwise
    /// copies the tables of `resume.copy` (if any) and streams transactions after `resume.start`
    /// (`None`: from where the slot stands). Runs until
    /// `shutdown` is cancelled or the stream fails.
    async fn run(
        self: Box<Self>,
        resume: Resume,
        events: mpsc::Sender<SourceEvent>,
        acks: watch::Receiver<Option<Position>>,
        shutdown: CancellationToken,
    ) -> Result<(), SourceError>;

    /// `cdcd check`: every problem with the server's settings, the user's privileges and the
    /// captured tables, each with how to fix it; empty when the source is ready. Changes
    /// nothing on the server; a failure to connect is itself a problem.
    async fn check(&self) -> Vec<CheckProblem>;

    /// `cdcd check`: the key of every captured table that has a usable one, and where it came
    /// from (the other tables are among [`check`](Self::check)'s problems). Empty when the
    /// server cannot be reached.
    async fn check_keys(&self) -> Vec<TableKey>;

    /// `cdcd check`: settings worth showing as they are in effect (Postgres: TLS, and whether
    /// each parameter came from the URL or a `[source]` key). No secrets.
    fn settings(&self) -> Vec<String> {
        Vec::new()
    }

    /// The captured tables and their keys: `source.tables` and `source.key_columns` resolved on
    /// the server now (`cdcd status`, `cdcd check`).
    async fn tables(&self) -> Result<Vec<TableKey>, SourceError>;

    /// Whether the pipeline copies existing rows first (`source.snapshot`).
    fn snapshot_mode(&self) -> SnapshotMode;

    /// The replication stream's name, for messages: the slot, or the replica's server id.
    fn stream_name(&self) -> String;

    /// How long a healthy source may send nothing: its heartbeat period. Three of them without
    /// a word is a stall (`/healthz`).
    fn heartbeat_period(&self) -> Duration;
    /// Where the source keeps state that must survive restarts beside the checkpoints (MySQL:
    /// the schema history, `mysql/history.rs`); called before [`Source::prepare`]. Sources that
    /// keep nothing ignore it.
    fn keep_state_in(&mut self, _store: Arc<dyn SourceStateStore>) {}
}

/// Durable state a source keeps in the warehouse beside the tables, written through the
/// pipeline's lease fence (`checkpoint/source_state.rs`). One object per pipeline; a write
/// replaces it whole and is durable when it returns.
#[async_trait]
pub trait SourceStateStore: Send + Sync + std::fmt::Debug {
    /// The stored bytes; `None` when nothing was stored.
    async fn read(&self) -> Result<Option<Vec<u8>>, SourceError>;
    async fn write(&self, bytes: Vec<u8>) -> Result<(), SourceError>;
}

/// What [`Source::prepare`] found.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub tables: Vec<TableId>,
    /// Keyless tables whose updates and deletes are published with whole before images
    /// (Postgres `REPLICA IDENTITY FULL`, `KeyOrigin::FullRow`): the pipeline refuses them at
    /// start on a sink that cannot apply multiset deletes ([`Sink::multiset_refusal`]). MySQL
    /// keyless tables are not listed: nothing says they will be updated, so on such a sink they
    /// replicate insert-only until an update or delete arrives, which stops the sink.
    ///
    /// [`Sink::multiset_refusal`]: crate::sinks::Sink::multiset_refusal
    pub multiset: Vec<TableId>,
    /// Whether the replication slot (Postgres) already exists.
    pub slot_exists: bool,
}

/// Where [`Source::run`] starts.
#[derive(Debug, Clone, Default)]
pub struct Resume {
    /// Stream transactions after this position (`None`: where the slot stands).
    pub start: Option<Position>,
    /// Copy every captured table first, from a new slot's exported snapshot.
    pub snapshot: bool,
    /// Without `snapshot`: tables to copy first at a new snapshot (not the slot's), each ending
    /// with `SnapshotUpsertUntil` and `SnapshotDone` at the position streaming starts from.
    pub copy: Vec<TableCopy>,
    /// Copy `copy` from scratch, each table declared complete exactly at the position of the
    /// snapshot it is read at (no upsert window), and end without streaming: a resync's copy job
    /// beside the streaming pipeline (`pipeline/resync.rs`), which holds its acknowledgements at
    /// `start` (at or before that snapshot) meanwhile. No slot, no source state is changed.
    pub copy_only: bool,
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
    /// The source's replication position is gone on the server (a Postgres slot invalidated by
    /// `max_slot_wal_keep_size`); the message says what to do.
    #[error("{0}")]
    SlotLost(String),
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
            SourceError::SlotLost(_) => "slot_lost",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(dead_code)]
    fn _source_is_object_safe(_: Box<dyn Source>) {}
}
