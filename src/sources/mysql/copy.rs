//! The initial copy of MySQL/MariaDB tables, chunk by chunk, resumable after a crash.
//!
//! Where it sits: `copy_job.rs` opens a consistent snapshot (`snapshot::begin_pinned`, which also
//! gives the snapshot's binlog position and the tables' columns at it), calls [`plan_table`] for
//! each table to copy and [`copy_tables`], commits the snapshot transaction, then
//! `MySqlSource::run` streams the binlog. Each table's
//! plan goes to the pipeline as `SnapshotPlan`, each chunk as `SnapshotChunk` Started → rows →
//! Done; the pipeline commits the rows with the progress (`cdcd.snapshot`), so a restart hands the
//! plan back ([`crate::sources::TableCopy::progress`]) and only the chunks not done are copied.
//!
//! # Why one consistent-snapshot transaction, not DBLog watermarks
//!
//! DBLog copies without a long transaction by interleaving chunk reads with the binlog and
//! reconciling each chunk with the changes seen between a low and a high watermark written to a
//! signal table. That needs write access to the source (the watermark table) and a binlog reader
//! running during the copy. One `START TRANSACTION WITH CONSISTENT SNAPSHOT` needs neither: MariaDB
//! gives its exact binlog point without any lock (`binlog_snapshot_file/position`), and InnoDB's
//! MVCC keeps it readable while writers go on. Its cost is undo history kept for the copy's
//! duration; chunks bound what a crash loses, not the transaction's length. A table's chunks are
//! copied in key order on one connection; MariaDB cannot share a snapshot between sessions, but
//! other sessions whose snapshot began at the same binlog position read the same rows, and
//! `parallel.rs` copies other tables on those.
//!
//! # Why the replica equals the source
//!
//! *Fresh copy*: every chunk is read in one snapshot at binlog position P and streaming starts at
//! P: each transaction is either in the snapshot (before P) or streamed (after P), never both.
//!
//! *Resumed copy* (a crash mid-copy) and *added table*: chunks done before the crash were read at
//! P (or at an earlier resumed snapshot); the rest are read at a new snapshot S2 with its binlog
//! position. Streaming starts at the position the table is declared complete at, `from` (chunk
//! 0's description: P for a fresh copy, the other tables' position for an added table), which
//! is at or before every snapshot any chunk was read at, and the table gets an upsert window up
//! to S2 (`SnapshotUpsertUntil`): its inserts at or below S2 become upserts (`pipeline/upsert.rs`).
//! Per row R, whose chunk was read at snapshot X (P ≤ X ≤ S2, fixed by R's key):
//! - Every change to R after `from` is replayed in order on top of R as of X. Changes are keyed
//!   and idempotent as upserts: an insert or full update writes R whatever was there, a delete
//!   removes it whether or not it is there; the last change wins, and it is R's current state. A
//!   change past S2 cannot be in any chunk, so it applies plainly.
//! - Key changes: R's chunk is fixed by its key, so a row is never missed between two chunks read
//!   at different snapshots. An update k1 → k2 is replayed as a delete of k2 (a chunk may hold it
//!   already) then the update, which removes k1 and writes k2.
//! - MINIMAL/NOBLOB images (columns absent, not NULL): the sink completes an absent column from
//!   the row it holds. Column c of R ends as the last replayed change that carried c, or, if none
//!   did, the value read at X, which is then c's value since `from` (c did not change).
//!   Inside the window a partial update U of R at position p can find no row. Every change that
//!   wrote R after `from` and before p was replayed, and R's chunk holds R as of X, so the row is
//!   missing only if R was last written before `from`, p ≤ X, and R does not exist at X: a later
//!   change in (p, X] deletes R or moves its key away. The sinks drop U and every row of the
//!   commit that takes a value from it (`sinks/iceberg/rows/window.rs`, `sinks/lsm/lookup.rs`): a
//!   delete then removes what U would have written, so the end state is the same. A key change
//!   R → R2 of such a missing row still stops the sink: R's unchanged values exist in no chunk,
//!   and R2's chunk may have been read at P, before R2 existed. (When R2's chunk was read at
//!   the newest snapshot, e.g. a table added later, dropping it would be safe as well: the copy
//!   holds R2; the sink cannot tell the two cases apart yet.) With FULL images no change is
//!   partial and none of this arises.
//! - A chunk started but not done at the crash may be partly committed: it is read again as
//!   updates (upserts), which replace those rows instead of doubling them.
//!
//! The window replays changes from `from` over rows read at S2, so it needs the table's columns
//! to be the same at both: a change replayed in an older shape over rows copied in a newer one
//! cannot be applied (a narrower type), or drops a column the newer rows carry. A table whose
//! columns at `from` (the schema history's) differ from those at S2 is therefore copied whole at
//! a snapshot of its own and declared complete there, as a keyless table is (`copy_job.rs`).
//!
//! # A table altered under the copy
//!
//! A table the transaction has not read yet can be altered after the snapshot; its first read
//! then fails (`altered.rs`: error 1412 after a rebuild, 1054 for a dropped or renamed column).
//! Nothing of it has been sent: [`copy_tables`] announces a table's plan and first chunk only
//! with its first rows. The other tables go on at the snapshot; the altered one is copied whole
//! at a new snapshot S2 and declared complete at S2 (no upsert window). Streaming starts at P,
//! before S2: the stream decodes the table's changes from P with its columns at P and replays the
//! ALTER, and the pipeline skips them up to S2 as committed, so nothing of the older shape
//! reaches the rows copied in the newer one.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Params, Row};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::altered::{read_err, Altered, CopyError};
use super::chunks::{chunk_count, ranges_from_bounds, KeyRange, KeyValue};
use super::schema::TableEntry;
use super::setup::server_err;
use super::snapshot::{announced, copy_rows, quote, truncate_marker, RowsQuery};
use crate::changelog::{Op, Position, TableId};
use crate::config::MySqlConfig;
use crate::sources::{ChunkState, SnapshotProgress, SourceError, SourceEvent};

/// One table's copy: its chunks and which of them to copy now.
pub struct TablePlan<'a> {
    pub entry: &'a TableEntry,
    pub chunks: Vec<KeyRange>,
    /// What `SnapshotPlan` announces: for a resumed copy the stored text verbatim, so the
    /// pipeline keeps the progress it has.
    pub descriptions: Vec<String>,
    /// Chunks to copy now, each with its op (Update: it may be committed in part).
    pub todo: Vec<(u32, Op)>,
    /// From scratch: a Truncate marker first replaces what the table holds.
    pub fresh: bool,
    pub estimated_rows: u64,
    pub estimated_bytes: u64,
}

/// What each table's copy ends with, once all its chunks are sent.
pub struct Finish {
    /// `SnapshotUpsertUntil` at this position (the snapshot the chunks were read at), if the
    /// table is declared complete at an earlier position.
    pub upsert_until: Option<Position>,
    /// `SnapshotDone` at this position (where streaming starts for the table).
    pub done_at: Position,
}

/// The position an interrupted copy declared its table complete at (chunk 0's `from`), if the
/// progress is one this source wrote.
pub fn resume_origin(progress: &SnapshotProgress) -> Option<Position> {
    let first = KeyRange::from_description(progress.chunks.first()?)?;
    first.from?.parse().ok()
}

/// Plans `entry`'s copy: the stored chunks of `progress` (the ones not done), or new key ranges
/// of about `chunk_rows` rows read inside the open snapshot, with chunk 0 recording `from`.
pub async fn plan_table<'a>(
    conn: &mut Conn,
    entry: &'a TableEntry,
    progress: Option<&SnapshotProgress>,
    chunk_rows: u64,
    from: &Position,
) -> Result<TablePlan<'a>, CopyError> {
    let (estimated_rows, estimated_bytes) = estimated_size(conn, entry).await?;
    let stored = progress.and_then(|p| {
        let chunks: Option<Vec<KeyRange>> = p
            .chunks
            .iter()
            .map(|d| KeyRange::from_description(d))
            .collect();
        chunks
            .filter(|c| c.first().is_some_and(|c0| c0.from.is_some()))
            .map(|c| (c, p))
    });
    if let Some((chunks, p)) = stored {
        let todo = (0..chunks.len() as u32)
            .filter(|i| !p.done.contains(i))
            .map(|i| {
                let op = if p.started.contains(&i) {
                    Op::Update
                } else {
                    Op::Insert
                };
                (i, op)
            })
            .collect();
        return Ok(TablePlan {
            entry,
            chunks,
            descriptions: p.chunks.clone(),
            todo,
            fresh: false,
            estimated_rows,
            estimated_bytes,
        });
    }
    let mut chunks = key_ranges(conn, entry, estimated_rows, chunk_rows).await?;
    if let Some(first) = chunks.first_mut() {
        first.from = Some(from.to_string());
    }
    let descriptions = chunks.iter().map(KeyRange::to_description).collect();
    let todo = (0..chunks.len() as u32).map(|i| (i, Op::Insert)).collect();
    Ok(TablePlan {
        entry,
        chunks,
        descriptions,
        todo,
        fresh: true,
        estimated_rows,
        estimated_bytes,
    })
}

/// InnoDB's row estimate and size on disk (`information_schema.TABLES.TABLE_ROWS`,
/// `DATA_LENGTH`), for planning and progress.
async fn estimated_size(conn: &mut Conn, entry: &TableEntry) -> Result<(u64, u64), SourceError> {
    let id = &entry.schema.id;
    let size: Option<(Option<u64>, Option<u64>)> = conn
        .exec_first(
            "SELECT TABLE_ROWS, DATA_LENGTH FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
            (&id.namespace, &id.name),
        )
        .await
        .map_err(server_err(format!("estimating the rows of {id}")))?;
    let (rows, bytes) = size.unwrap_or_default();
    Ok((rows.unwrap_or(0), bytes.unwrap_or(0)))
}

/// The quoted primary-key columns, in key order.
fn key_columns(entry: &TableEntry) -> Vec<String> {
    entry
        .schema
        .primary_key
        .iter()
        .filter_map(|&i| entry.schema.columns.get(i))
        .map(|c| quote(&c.name))
        .collect()
}

/// New key ranges for a table of about `estimated_rows`: each bound is `ORDER BY key LIMIT 1
/// OFFSET chunk_rows` from the previous one, a walk along the primary key (InnoDB's clustered
/// index) that gives chunks of exactly `chunk_rows` rows whatever the key type and distribution.
///
/// Why not split `MIN..MAX` of an integer key evenly (two index dives): sparse keys make the
/// chunks uneven. In `tests/mysql/snapshot.rs` keys 1..200000 plus a few moved to 20000000+ put
/// every row into the first of 21 such chunks, so nothing was resumable. The walk costs one
/// scan of the key; measured on 1M rows in README ("MySQL and MariaDB").
async fn key_ranges(
    conn: &mut Conn,
    entry: &TableEntry,
    estimated_rows: u64,
    chunk_rows: u64,
) -> Result<Vec<KeyRange>, CopyError> {
    let id = &entry.schema.id;
    let key = key_columns(entry);
    // The estimate only decides whether to plan at all; the walk finds the real count.
    if key.is_empty() || chunk_count(estimated_rows, chunk_rows) <= 1 {
        return Ok(vec![KeyRange::default()]);
    }
    let table = format!("{}.{}", quote(&id.namespace), quote(&id.name));
    let order = key.join(", ");
    let mut bounds: Vec<Vec<KeyValue>> = Vec::new();
    loop {
        let from = KeyRange {
            lo: bounds.last().cloned(),
            hi: None,
            from: None,
        };
        let Some((filter, params)) = from.where_clause(&key) else {
            break;
        };
        let sql = format!(
            "SELECT {order} FROM {table}{filter} ORDER BY {order} LIMIT 1 OFFSET {chunk_rows}"
        );
        let params = if params.is_empty() {
            Params::Empty
        } else {
            Params::Positional(params)
        };
        let row: Option<Row> = conn
            .exec_first(sql, params)
            .await
            .map_err(read_err(format!("planning the chunks of {id}")))?;
        let Some(row) = row else { break };
        let bound: Option<Vec<KeyValue>> = (0..key.len())
            .map(|i| row.as_ref(i).and_then(KeyValue::from_value))
            .collect();
        match bound {
            Some(b) if bounds.last() != Some(&b) => bounds.push(b),
            _ => break,
        }
    }
    Ok(ranges_from_bounds(bounds))
}

/// What [`copy_tables`] did.
#[derive(Debug)]
pub enum Copied {
    /// Every plan is copied, except the tables found altered at their first read: none of
    /// their events was sent.
    All {
        altered: Vec<(TableId, Altered)>,
        /// Rows copied.
        rows: u64,
    },
    ShutDown,
}

/// Copies every chunk to copy of `plans` on `conn` (inside the open snapshot), announcing each
/// plan and chunk, and ends each table with `finish`'s events. `parallel::copy_tables` runs it
/// on each connection of a copy.
pub async fn copy_tables(
    conn: &mut Conn,
    cfg: &MySqlConfig,
    plans: &[TablePlan<'_>],
    finish: &Finish,
    events: &mpsc::Sender<SourceEvent>,
    shutdown: &CancellationToken,
) -> Result<Copied, SourceError> {
    let mut total = 0u64;
    let mut altered = Vec::new();
    for plan in plans {
        crate::failpoints::pause_point(crate::failpoints::MYSQL_COPY_TABLE).await;
        let table = plan.entry.schema.id.clone();
        info!(table = %table, chunks = plan.chunks.len(), to_copy = plan.todo.len(), estimated_rows = plan.estimated_rows, "planned initial copy");
        let table_rows = match copy_table(conn, cfg, plan, events, shutdown).await {
            Ok(Some(rows)) => rows,
            Ok(None) => return Ok(Copied::ShutDown),
            Err(CopyError::Altered(a)) => {
                if a.copies_again() {
                    info!(table = %table, cause = %a, "the table changed after the snapshot, before the copy read it: it is copied again at a new snapshot");
                } else {
                    warn!(table = %table, cause = %a, "the table is gone since the snapshot: cdcd stops once the other tables are copied");
                }
                altered.push((table, a));
                continue;
            }
            Err(CopyError::Source(e)) => return Err(e),
        };
        total += table_rows;
        if let Some(until) = &finish.upsert_until {
            let window = SourceEvent::SnapshotUpsertUntil {
                table: table.clone(),
                until: until.clone(),
            };
            send(events, window).await?;
        }
        let done = SourceEvent::SnapshotDone {
            table: table.clone(),
            position: finish.done_at.clone(),
        };
        send(events, done).await?;
        info!(table = %table, rows = table_rows, "table copied");
    }
    Ok(Copied::All {
        altered,
        rows: total,
    })
}

/// Copies the chunks of `plan` to copy; returns the rows sent, or `None` when shut down.
///
/// The table's plan (and its truncate marker) goes out with its first chunk's first rows, so a
/// table altered after the snapshot fails its first read before anything of it is sent
/// ([`CopyError::Altered`]). Once read, the transaction holds the table's metadata lock and no
/// ALTER can touch it until the copy ends.
async fn copy_table(
    conn: &mut Conn,
    cfg: &MySqlConfig,
    plan: &TablePlan<'_>,
    events: &mpsc::Sender<SourceEvent>,
    shutdown: &CancellationToken,
) -> Result<Option<u64>, CopyError> {
    let table = plan.entry.schema.id.clone();
    let mut announce = vec![SourceEvent::SnapshotPlan {
        table: table.clone(),
        chunks: plan.descriptions.clone(),
        estimated_rows: plan.estimated_rows,
        estimated_bytes: plan.estimated_bytes,
    }];
    if plan.fresh {
        announce.push(truncate_marker(plan.entry)?);
    }
    let key = key_columns(plan.entry);
    let mut table_rows = 0u64;
    for &(chunk, op) in &plan.todo {
        let Some(range) = plan.chunks.get(chunk as usize) else {
            continue;
        };
        let (filter, params) = range.where_clause(&key).ok_or_else(|| SourceError::Table {
            table: table.clone(),
            detail: format!(
                "chunk {chunk} of the stored copy plan does not match the primary key ({})",
                key.join(", ")
            ),
        })?;
        let state = |state| SourceEvent::SnapshotChunk {
            table: table.clone(),
            chunk,
            state,
        };
        announce.push(state(ChunkState::Started));
        let query = RowsQuery {
            entry: plan.entry,
            filter,
            params,
            op,
        };
        let first = announce
            .iter()
            .any(|e| matches!(e, SourceEvent::SnapshotPlan { .. }));
        let rows = match copy_rows(conn, cfg, query, &mut announce, events, shutdown).await {
            Ok(Some(rows)) => rows,
            Ok(None) => return Ok(None),
            Err(CopyError::Altered(a)) if !first => {
                // Cannot happen while the transaction holds the table's metadata lock.
                return Err(CopyError::Source(SourceError::Table {
                    table: table.clone(),
                    detail: format!("{a}, while its copy was under way"),
                }));
            }
            Err(e) => return Err(e),
        };
        announced(&mut announce, events).await?;
        send(events, state(ChunkState::Done)).await?;
        table_rows += rows;
        tracing::debug!(table = %table, chunk, of = plan.chunks.len(), rows, upsert = op == Op::Update, "chunk copied");
        if shutdown.is_cancelled() {
            return Ok(None);
        }
    }
    announced(&mut announce, events).await?;
    Ok(Some(table_rows))
}

async fn send(events: &mpsc::Sender<SourceEvent>, event: SourceEvent) -> Result<(), SourceError> {
    events.send(event).await.map_err(|_| SourceError::Closed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_origin_comes_from_chunk_zero() {
        let first = KeyRange {
            hi: Some(vec![KeyValue::Int(10)]),
            from: Some("0-1-42".into()),
            ..KeyRange::default()
        };
        let rest = KeyRange {
            lo: Some(vec![KeyValue::Int(10)]),
            ..KeyRange::default()
        };
        let progress = SnapshotProgress {
            chunks: vec![first.to_description(), rest.to_description()],
            ..SnapshotProgress::default()
        };
        assert_eq!(
            resume_origin(&progress),
            Some("0-1-42".parse::<Position>().unwrap())
        );
        // A plan this source did not write (no origin) cannot be resumed.
        let foreign = SnapshotProgress {
            chunks: vec![r#"{"lo":["1"]}"#.into()],
            ..SnapshotProgress::default()
        };
        assert_eq!(resume_origin(&foreign), None);
        assert_eq!(resume_origin(&SnapshotProgress::default()), None);
    }
}
