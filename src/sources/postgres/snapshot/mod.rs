//! The initial copy: a table's existing rows, read with `COPY … TO STDOUT` (binary format where
//! every column has a binary decoder, text otherwise) and parsed straight into changelog batches.
//!
//! Where it sits: with `snapshot = "initial"`, the Postgres source copies each captured table
//! before it streams. `parallel.rs` plans each table as primary-key ranges (`plan.rs`), copies the
//! ranges on several connections that share one snapshot, and reports progress to the pipeline,
//! which commits it with the rows (`cdcd.snapshot`). [`copy_chunk`] copies one range on a copy
//! session (`session.rs`: a plain connection that reads the COPY data off the socket); the
//! readers (`text.rs`, `binary.rs`) are pure.
//!
//! # Why the result equals the source
//!
//! *Fresh copy* (no slot): the slot is created with an exported snapshot S = its consistent point
//! C; every chunk is copied at S (`SET TRANSACTION SNAPSHOT`), and streaming starts at C. Every
//! transaction is either in S (committed before C) or streamed (after C), never both.
//!
//! *Resumed copy* (a crash mid-copy) and *added table* (a table without a checkpoint while the
//! slot exists): the exported snapshot died with its connection, so the remaining chunks (or the
//! new table) are copied at a new snapshot S2, exported by a plain `REPEATABLE READ` transaction,
//! and `L = pg_current_wal_insert_lsn()` is read after S2 was taken, so every transaction in S2 ends at or
//! below L. Streaming starts at P, where the slot stands (P ≤ S2, and every change after P is
//! streamed). The table is committed "complete at P" with an upsert window up to L
//! (`cdcd.upsert_until`): the pipeline turns its inserts at or below L into updates. Why this
//! converges, per row R of a chunk copied at S2 (chunks copied at C are exact, as above):
//! - The chunk holds R as of S2; every change to R after P is replayed, in order, on top of it.
//!   Each change is keyed and idempotent as an upsert: an insert or update writes R's row
//!   whatever was there, a delete removes it whether or not it is there. After the replay the
//!   last change wins, which is R's current state; a change the copy already saw is overwritten
//!   by the later ones, and the last one was not seen by anything newer. A change past L cannot
//!   be in S2, so it is a plain insert again.
//! - Key ranges: R's chunk is fixed by its key, and every chunk of the table is either done (at
//!   C, or committed at S2 before a second crash: both exact or converging) or copied now; a row
//!   never falls between two chunks copied at different snapshots. An update that changes R's key
//!   from k1 to k2 is replayed as a delete of k2 (the copy may already hold it) followed by the
//!   update, which removes k1 and writes k2, whichever chunks they belong to
//!   (`pipeline/upsert.rs`).
//! - Partial rows (unchanged TOASTed columns arrive absent): the sink completes an absent column
//!   from the row it holds. Column c of R ends as the last replayed change that carried c, or, if
//!   none did, the copied value, which is then also c's current value (c did not change after
//!   P). A partial update to R replayed while R is not in the table can only happen when R
//!   existed before the update but not at S2 (R's chunk holds R as of S2, and every earlier
//!   change that wrote R was replayed), so a change after the update and before S2 deletes R or
//!   moves its key away. The sinks drop such an update inside the window
//!   (`TableChanges::upsert_window`, `sinks/iceberg/rows/window.rs`): the delete removes what it
//!   would have written. A key change of such a row still stops the sink: the unchanged values
//!   it would carry to the new key are in no chunk (copy the table again: drop it, see README).
//! - A chunk that was started but not done at the crash may hold some of its rows: it is copied
//!   again as updates (upserts), so those rows are replaced, not doubled.
//!
//! Text COPY pins the session to the replication connection's settings
//! ([`TEXT_FORMAT_SETTINGS`](super::types::TEXT_FORMAT_SETTINGS), as start-up options),
//! so its text is what pgoutput sends and one parser serves both; binary values are decoded to
//! the same Arrow values (tested against the text path on a real server).

use std::future::Future;
use std::sync::Arc;

use arrow_schema::ArrowError;

use super::types::{ColumnType, ValueError};
use crate::changelog::{Op, TableChanges, TableChangesBuilder, TableId, TableSchema};
use crate::sources::SourceError;

pub mod binary;
pub mod held;
pub mod parallel;
pub mod plan;
mod progress;
pub mod session;
pub mod text;

pub use binary::{supports_binary, BinaryCopyReader};
pub use session::{CopySession, SessionError};
pub use text::{unescape_copy, CopyReader};

#[cfg(test)]
mod tests;

/// Builders are preallocated for at most this many rows, whatever `batch_rows` says. At least
/// the source's own batch (10,000 rows): a builder that outgrows its capacity doubles it, copying
/// every value, and the batch then holds ~60% more memory than its rows.
const MAX_PREALLOCATED_ROWS: usize = 16_384;

/// Where a batch is cut: at `rows` rows or `bytes` bytes of COPY data, whichever comes first.
/// Bytes bound memory for wide rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    pub rows: usize,
    pub bytes: usize,
}

/// The copy of a table failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("initial copy of {table}: {context}: {source}")]
    Query {
        table: TableId,
        context: &'static str,
        #[source]
        source: SessionError,
    },
    #[error("initial copy of {table}, row {row}, column {column}: {source}")]
    Value {
        table: TableId,
        /// 1-based row number within the copy.
        row: u64,
        column: String,
        #[source]
        source: Box<ValueError>,
    },
    #[error(
        "initial copy of {table}, row {row}, column {column}: binary {type_name} value {reason}"
    )]
    Binary {
        table: TableId,
        row: u64,
        column: String,
        type_name: String,
        reason: &'static str,
    },
    #[error("initial copy of {table}, row {row}: {detail}")]
    Format {
        table: TableId,
        row: u64,
        detail: String,
    },
    #[error("initial copy of {table}: {detail}")]
    Schema { table: TableId, detail: String },
    #[error("initial copy of {table}: building the batch: {source}")]
    Arrow {
        table: TableId,
        #[source]
        source: ArrowError,
    },
    #[error("the pipeline stopped receiving snapshot rows")]
    Closed,
}

impl SnapshotError {
    /// The error of a statement on `table`'s copy session that failed while `context`.
    pub fn query(table: &TableId, context: &'static str) -> impl FnOnce(SessionError) -> Self {
        let table = table.clone();
        move |source| SnapshotError::Query {
            table,
            context,
            source,
        }
    }

    /// A short label for `cdcd_errors_total{kind}`.
    pub fn kind(&self) -> &'static str {
        match self {
            SnapshotError::Query { .. } => "snapshot_query",
            SnapshotError::Value { .. } | SnapshotError::Binary { .. } => "snapshot_value",
            SnapshotError::Format { .. } => "snapshot_format",
            SnapshotError::Schema { .. } => "snapshot_schema",
            SnapshotError::Arrow { .. } => "snapshot_arrow",
            SnapshotError::Closed => "closed",
        }
    }
}

impl From<SnapshotError> for SourceError {
    fn from(e: SnapshotError) -> Self {
        match e {
            SnapshotError::Closed => SourceError::Closed,
            SnapshotError::Query { ref table, .. }
            | SnapshotError::Value { ref table, .. }
            | SnapshotError::Binary { ref table, .. }
            | SnapshotError::Format { ref table, .. }
            | SnapshotError::Schema { ref table, .. }
            | SnapshotError::Arrow { ref table, .. } => SourceError::Table {
                table: table.clone(),
                detail: e.to_string(),
            },
        }
    }
}

/// Sets how a copy session's chunk queries are planned:
/// - **Off plain index scans.** A chunk is a primary-key range, which the planner reads with an
///   index scan when the key follows the physical order: one heap fetch per row, 8% more server
///   CPU than a bitmap heap scan on the `bench/pg_snapshot.py` table (1.93 vs 1.78 CPU-s for 2M
///   rows in 250k-row chunks), and random heap reads when the table's order has drifted from
///   the key's. A bitmap heap scan finds the pages through the same index and reads each page
///   once, in order; a range covering most of the table still gets a sequential scan.
/// - **No parallel workers, no JIT.** The copy's parallelism is its sessions. Within one, a
///   `Gather` passes every row through a shared-memory queue to the session's backend, and each
///   worker JIT-compiles the scan per chunk query (server defaults: 2 workers, JIT on above a
///   cost a chunk of a large table passes): on pgbench's accounts table (scale 1000), 250k-row
///   chunks took 243 ms of CPU each with the defaults, 149 ms without either (~37 CPU-s over
///   that table's 400 chunks, on the cores cdcd shares).
///
/// All three are `USERSET` parameters, so any role may set them for its session.
pub async fn plan_for_copy(
    session: &mut CopySession,
    table: &TableId,
) -> Result<(), SnapshotError> {
    session
        .execute(
            "SET enable_indexscan = off; SET max_parallel_workers_per_gather = 0; SET jit = off",
        )
        .await
        .map_err(SnapshotError::query(
            table,
            "setting the copy session's planner parameters",
        ))
}

/// Opens a `REPEATABLE READ READ ONLY` transaction on the exported snapshot `name`. `SET
/// TRANSACTION SNAPSHOT` must be the transaction's first statement (Postgres docs, "SET
/// TRANSACTION"), and the importing transaction must be REPEATABLE READ or stricter.
pub async fn import_snapshot(
    session: &mut CopySession,
    name: &str,
    table: &TableId,
) -> Result<(), SnapshotError> {
    let begin = format!(
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT {}",
        quote_literal(name)
    );
    session.execute(&begin).await.map_err(SnapshotError::query(
        table,
        "importing the exported snapshot",
    ))
}

/// Copies `table` as seen by `snapshot_name` (a snapshot exported by the slot's creation; `None`:
/// the statement's own snapshot) in text format and calls `emit` with a batch every `batch_rows`
/// rows and once at the end, awaiting it (that await is the backpressure). Returns the number of
/// rows copied.
///
/// Every row is an [`Op::Insert`] with every column present and no old key. The first batch
/// starts with one [`Op::Truncate`] change (all columns absent), so a retried copy replaces what
/// an interrupted one left; an empty table yields just that batch.
///
/// With a snapshot name a transaction is open on `session` until the copy ends. On error the transaction is rolled back (best effort) and the error names the table, and
/// for a bad value the row and column.
pub async fn copy_table<F, Fut>(
    session: &mut CopySession,
    schema: Arc<TableSchema>,
    types: &[ColumnType],
    snapshot_name: Option<&str>,
    batch_rows: usize,
    emit: F,
) -> Result<u64, SnapshotError>
where
    F: FnMut(TableChanges) -> Fut,
    Fut: Future<Output = Result<(), SnapshotError>>,
{
    let table = schema.id.clone();
    if let Some(name) = snapshot_name {
        import_snapshot(session, name, &table).await?;
    }
    let chunk = ChunkCopy {
        schema,
        types,
        filter: String::new(),
        binary: false,
        op: Op::Insert,
        marker: true,
        limits: BatchLimits {
            rows: batch_rows,
            bytes: usize::MAX,
        },
    };
    let copied = copy_chunk(session, chunk, emit).await;
    if snapshot_name.is_some() {
        match &copied {
            Ok(_) => session
                .execute("COMMIT")
                .await
                .map_err(SnapshotError::query(
                    &table,
                    "ending the snapshot transaction",
                ))?,
            // The copy already failed; a failed rollback only means the connection is gone.
            Err(_) => {
                let _ = session.execute("ROLLBACK").await;
            }
        }
    }
    copied
}

/// One COPY: which rows of which table, in which format, as which changes.
pub struct ChunkCopy<'a> {
    pub schema: Arc<TableSchema>,
    pub types: &'a [ColumnType],
    /// ` WHERE …` selecting the chunk (`plan::KeyRange::where_clause`), or empty.
    pub filter: String,
    /// Binary format; every column must satisfy [`supports_binary`].
    pub binary: bool,
    /// `Insert`, or `Update` to upsert rows a previous attempt may have committed.
    pub op: Op,
    /// Start the first batch with the Truncate marker.
    pub marker: bool,
    pub limits: BatchLimits,
}

/// Runs one COPY on `session` (inside whatever transaction the caller opened) and calls `emit` with
/// each batch, awaiting it. Returns the rows copied.
pub async fn copy_chunk<F, Fut>(
    session: &mut CopySession,
    chunk: ChunkCopy<'_>,
    emit: F,
) -> Result<u64, SnapshotError>
where
    F: FnMut(TableChanges) -> Fut,
    Fut: Future<Output = Result<(), SnapshotError>>,
{
    let mut statement = copy_statement_where(&chunk.schema, &chunk.filter);
    if chunk.binary {
        statement.push_str(" (FORMAT binary)");
        let reader = BinaryCopyReader::new(chunk.schema, chunk.types, chunk.limits, chunk.op)?;
        // The marker is a batch of its own in binary mode.
        let mut emit = emit;
        if chunk.marker {
            emit(marker_batch(reader.schema())?).await?;
        }
        drive(session, &statement, Reader::Binary(reader), emit).await
    } else {
        let reader = CopyReader::with_options(
            chunk.schema,
            chunk.types,
            chunk.limits,
            chunk.marker,
            chunk.op,
        )?;
        drive(session, &statement, Reader::Text(reader), emit).await
    }
}

/// A batch holding only the Truncate marker.
pub fn marker_batch(schema: &Arc<TableSchema>) -> Result<TableChanges, SnapshotError> {
    new_builder(schema, 0, true)?
        .finish()
        .map_err(|source| SnapshotError::Arrow {
            table: schema.id.clone(),
            source,
        })
}

enum Reader<'t> {
    Text(CopyReader<'t>),
    Binary(BinaryCopyReader<'t>),
}

impl Reader<'_> {
    fn feed(&mut self, chunk: &[u8]) -> Result<usize, SnapshotError> {
        match self {
            Reader::Text(r) => r.feed(chunk),
            Reader::Binary(r) => r.feed(chunk),
        }
    }
    fn is_full(&self) -> bool {
        match self {
            Reader::Text(r) => r.is_full(),
            Reader::Binary(r) => r.is_full(),
        }
    }
    fn take_batch(&mut self) -> Result<TableChanges, SnapshotError> {
        match self {
            Reader::Text(r) => r.take_batch(),
            Reader::Binary(r) => r.take_batch(),
        }
    }
    fn rows(&self) -> u64 {
        match self {
            Reader::Text(r) => r.rows(),
            Reader::Binary(r) => r.rows(),
        }
    }
    fn finish(self) -> Result<Option<TableChanges>, SnapshotError> {
        match self {
            Reader::Text(r) => r.finish(),
            Reader::Binary(r) => r.finish(),
        }
    }
    fn table(&self) -> TableId {
        match self {
            Reader::Text(r) => r.schema().id.clone(),
            Reader::Binary(r) => r.schema().id.clone(),
        }
    }

    /// Feeds `parts` in order, taking each batch once full, as [`drive`] does: the rows read
    /// before the end, and every batch (tests).
    #[cfg(test)]
    #[allow(clippy::unwrap_used)]
    fn read_all(mut self, parts: &[&[u8]]) -> (u64, Vec<TableChanges>) {
        let mut batches = Vec::new();
        for part in parts {
            let mut rest = *part;
            while !rest.is_empty() {
                let used = self.feed(rest).unwrap();
                rest = &rest[used..];
                if self.is_full() {
                    batches.push(self.take_batch().unwrap());
                }
            }
        }
        let rows = self.rows();
        batches.extend(self.finish().unwrap());
        (rows, batches)
    }
}

/// How many bytes of COPY data [`drive`] gathers before parsing them. Postgres sends one
/// CopyData message per row: the rows already received are parsed together, so the reader
/// decodes many rows per pass (column by column) instead of one.
const GATHER_BYTES: usize = 256 * 1024;

async fn drive<F, Fut>(
    session: &mut CopySession,
    statement: &str,
    mut reader: Reader<'_>,
    mut emit: F,
) -> Result<u64, SnapshotError>
where
    F: FnMut(TableChanges) -> Fut,
    Fut: Future<Output = Result<(), SnapshotError>>,
{
    let table = reader.table();
    let query_err = |context| SnapshotError::query(&table, context);
    session
        .copy_out(statement)
        .await
        .map_err(query_err("starting COPY"))?;
    let mut gathered: Vec<u8> = Vec::with_capacity(GATHER_BYTES + READ_SLACK);
    loop {
        gathered.clear();
        let more = session
            .read_copy(&mut gathered, GATHER_BYTES)
            .await
            .map_err(query_err("reading COPY data"))?;
        let mut rest: &[u8] = &gathered;
        while !rest.is_empty() {
            let used = reader.feed(rest)?;
            rest = rest.get(used..).unwrap_or_default();
            if reader.is_full() {
                emit(reader.take_batch()?).await?;
            }
        }
        if !more {
            break;
        }
    }
    let rows = reader.rows();
    if let Some(last) = reader.finish()? {
        emit(last).await?;
    }
    Ok(rows)
}

/// Room past [`GATHER_BYTES`] for the row that crosses it, so the buffer rarely regrows.
const READ_SLACK: usize = 16 * 1024;

/// `COPY (SELECT "c1", "c2" FROM "schema"."table") TO STDOUT`: the columns in schema order.
#[cfg(test)]
fn copy_statement(schema: &TableSchema) -> String {
    copy_statement_where(schema, "")
}

/// [`copy_statement`] with a ` WHERE …` filter.
fn copy_statement_where(schema: &TableSchema, filter: &str) -> String {
    let columns: Vec<String> = schema
        .columns
        .iter()
        .map(|c| quote_ident(&c.name))
        .collect();
    format!(
        "COPY (SELECT {} FROM {}.{}{filter}) TO STDOUT",
        columns.join(", "),
        quote_ident(&schema.id.namespace),
        quote_ident(&schema.id.name)
    )
}

pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// An empty batch builder; `with_marker`: starting with the Truncate marker (absent columns).
pub(crate) fn new_builder(
    schema: &Arc<TableSchema>,
    batch_rows: usize,
    with_marker: bool,
) -> Result<TableChangesBuilder, SnapshotError> {
    let arrow = |source| SnapshotError::Arrow {
        table: schema.id.clone(),
        source,
    };
    let capacity = batch_rows.min(MAX_PREALLOCATED_ROWS) + usize::from(with_marker);
    let mut builder = TableChangesBuilder::new(schema.clone(), capacity);
    if with_marker {
        builder.begin(Op::Truncate);
        for i in 0..schema.columns.len() {
            builder.absent(i).map_err(arrow)?;
        }
        builder.no_old_key().map_err(arrow)?;
    }
    Ok(builder)
}
