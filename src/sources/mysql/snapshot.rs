//! The initial copy of existing rows (`source.snapshot = "initial"`) for MySQL/MariaDB.
//!
//! One `START TRANSACTION WITH CONSISTENT SNAPSHOT` reads every captured table, and the binlog
//! position of that snapshot is where streaming starts, so no change is lost or applied twice.
//! MariaDB reports the snapshot's exact binlog point in `SHOW STATUS LIKE 'binlog_snapshot_%'`
//! (no lock needed) and `BINLOG_GTID_POS()` turns it into a GTID list. MySQL has no such status,
//! so cdcd holds `FLUSH TABLES WITH READ LOCK` just while it starts the transaction and reads
//! `gtid_executed` / `SHOW MASTER STATUS` (needs RELOAD; writes pause for that moment).
//!
//! The columns copied are the columns at the snapshot ([`begin_pinned`]): `information_schema`
//! is not versioned, so the tables are read from it before the snapshot and again inside it, and
//! the snapshot is begun again when a DDL moved them in between (issue 34).
//!
//! Inside that transaction `copy.rs` copies each table chunk by chunk (primary-key ranges,
//! `chunks.rs`) with [`copy_rows`]; why that makes the copy resumable and still exact is argued in
//! `copy.rs`. Values are read over the binary protocol (typed, `Origin::Query`) and appended
//! straight into Arrow builders.

use futures::StreamExt;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Params, Row, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::changelog::{BinlogFile, Op, Position, TableChangesBuilder, TableId};
use crate::config::MySqlConfig;
use crate::sources::{SourceError, SourceEvent};

use super::altered::{read_err, CopyError};
use super::schema::TableEntry;
use super::setup::{self, server_err, Flavor};
use super::types::{append, Origin};

/// Rows per `SnapshotRows` batch.
pub const BATCH_ROWS: usize = 10_000;
/// Bytes of string/binary values per batch: wide rows (BLOBs) cut a batch before `BATCH_ROWS`,
/// so a batch's memory stays bounded whatever the row size.
pub const BATCH_BYTES: usize = 8 << 20;

/// Starts the consistent-snapshot transaction on `conn` and returns its binlog position.
pub async fn begin(conn: &mut Conn, flavor: Flavor) -> Result<Position, SourceError> {
    conn.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .await
        .map_err(server_err("setting the snapshot's isolation level"))?;
    if flavor == Flavor::MariaDb {
        conn.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            .await
            .map_err(server_err("starting the snapshot"))?;
        let status: Vec<(String, String)> = conn
            .query("SHOW STATUS LIKE 'binlog_snapshot_%'")
            .await
            .map_err(server_err("reading binlog_snapshot_file/position"))?;
        let get = |n: &str| {
            status
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.clone())
        };
        let (Some(file), Some(pos)) =
            (get("binlog_snapshot_file"), get("binlog_snapshot_position"))
        else {
            return Err(SourceError::Server {
                context: "reading the snapshot's binlog position".into(),
                detail: "SHOW STATUS has no binlog_snapshot_file/position (is log_bin on?)".into(),
            });
        };
        let gtid: Option<Option<String>> = conn
            .exec_first("SELECT BINLOG_GTID_POS(?, ?)", (&file, &pos))
            .await
            .map_err(server_err(
                "translating the snapshot's binlog position to a GTID",
            ))?;
        let text = gtid.flatten().unwrap_or_default();
        return text
            .parse()
            .map(Position::MariaDbGtid)
            .map_err(|e| SourceError::Protocol(e.to_string()));
    }
    conn.query_drop("FLUSH TABLES WITH READ LOCK")
        .await
        .map_err(server_err(
            "FLUSH TABLES WITH READ LOCK for the snapshot (needs RELOAD)",
        ))?;
    let started = async {
        conn.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            .await
            .map_err(server_err("starting the snapshot"))?;
        current_position(conn, flavor).await
    }
    .await;
    conn.query_drop("UNLOCK TABLES")
        .await
        .map_err(server_err("UNLOCK TABLES after starting the snapshot"))?;
    started
}

/// How often [`begin_pinned`] begins the snapshot before it gives up on tables whose columns keep
/// changing.
const BEGIN_ATTEMPTS: u32 = 10;

/// A consistent snapshot open on a connection, and the copied tables as they are at it.
pub struct Pinned {
    pub position: Position,
    /// Each table's entry at the snapshot, in the order asked; tables dropped before it are left out.
    pub entries: Vec<TableEntry>,
}

/// Begins a consistent snapshot on `conn` at which the tables of `before` (their entries, read
/// before) have known columns. Each is read again inside the snapshot: when every table reads as
/// before, nothing changed between two reads on either side of the snapshot, so those are its
/// columns at the snapshot. When one differs, a DDL ran in between, before or after the snapshot
/// (`information_schema` cannot say which): the snapshot is rolled back and begun again, with the
/// second reads as the new first ones. A table gone from `information_schema` is left out.
pub async fn begin_pinned(
    conn: &mut Conn,
    flavor: Flavor,
    cfg: &MySqlConfig,
    mut before: Vec<TableEntry>,
) -> Result<Pinned, SourceError> {
    let mut moved = Vec::new();
    for attempt in 1..=BEGIN_ATTEMPTS {
        crate::failpoints::pause_point(crate::failpoints::MYSQL_BEFORE_SNAPSHOT).await;
        let position = begin(conn, flavor).await?;
        let mut at = Vec::with_capacity(before.len());
        moved.clear();
        for entry in &before {
            let id = &entry.schema.id;
            let key = cfg.key_columns.get(id).map(Vec::as_slice);
            match setup::load_table(conn, id, key).await? {
                Some(now) => {
                    if !same_definition(entry, &now) {
                        moved.push(id.to_string());
                    }
                    at.push(now);
                }
                None => moved.push(id.to_string()),
            }
        }
        if moved.is_empty() {
            return Ok(Pinned {
                position,
                entries: at,
            });
        }
        tracing::info!(tables = %moved.join(", "), attempt, "tables changed while the copy's snapshot began: beginning it again");
        conn.query_drop("ROLLBACK")
            .await
            .map_err(server_err("ending a snapshot to begin it again"))?;
        before = at;
    }
    Err(SourceError::Server {
        context: "beginning the initial copy's snapshot".into(),
        detail: format!(
            "the definition of {} changed each of the {BEGIN_ATTEMPTS} times the snapshot began (ALTER TABLE running?); restart cdcd once the schema changes are done",
            moved.join(", ")
        ),
    })
}

/// Whether two reads of a table describe the same table: columns, key and character set.
fn same_definition(a: &TableEntry, b: &TableEntry) -> bool {
    a.columns == b.columns
        && a.schema.key_names() == b.schema.key_names()
        && a.key_origin == b.key_origin
        && a.charset == b.charset
}

/// The server's current binlog position (where a stream without a checkpoint starts).
pub async fn current_position(conn: &mut Conn, flavor: Flavor) -> Result<Position, SourceError> {
    let parse_err = |e: crate::changelog::ParsePositionError| SourceError::Protocol(e.to_string());
    match flavor {
        Flavor::MariaDb => {
            let v: Option<String> = conn
                .query_first("SELECT @@GLOBAL.gtid_binlog_pos")
                .await
                .map_err(server_err("reading gtid_binlog_pos"))?;
            v.unwrap_or_default()
                .parse()
                .map(Position::MariaDbGtid)
                .map_err(parse_err)
        }
        Flavor::MySqlGtid => {
            let v: Option<String> = conn
                .query_first("SELECT @@GLOBAL.gtid_executed")
                .await
                .map_err(server_err("reading gtid_executed"))?;
            v.unwrap_or_default()
                .replace('\n', "")
                .parse()
                .map(Position::MySqlGtid)
                .map_err(parse_err)
        }
        Flavor::MySqlFile => {
            let row: Option<Row> = conn
                .query_first("SHOW MASTER STATUS")
                .await
                .map_err(server_err("SHOW MASTER STATUS"))?;
            let row = row.ok_or_else(|| SourceError::Server {
                context: "SHOW MASTER STATUS".into(),
                detail: "no row: is log_bin on?".into(),
            })?;
            let file: Option<String> = row.get(0);
            let pos: Option<u64> = row.get(1);
            Ok(Position::MySqlFile(BinlogFile {
                file: file.unwrap_or_default(),
                pos: pos.unwrap_or(4),
            }))
        }
    }
}

/// A backquoted identifier.
pub fn quote(ident: &str) -> String {
    format!("`{}`", ident.replace('`', "``"))
}

/// What [`copy_rows`] reads and how it hands the rows on.
pub struct RowsQuery<'a> {
    pub entry: &'a TableEntry,
    /// ` WHERE …` with `?` placeholders, or empty.
    pub filter: String,
    pub params: Vec<Value>,
    /// `Insert`, or `Update` for a chunk a crashed attempt may have committed in part (upserts).
    pub op: Op,
}

/// Runs one `SELECT` of the table's columns (inside whatever transaction `conn` has open) and
/// sends the rows as `SnapshotRows` batches of [`BATCH_ROWS`] or [`BATCH_BYTES`], awaiting each send (the
/// backpressure: the result set is streamed, so memory holds one batch). `announce` is sent
/// before the first batch (the table's plan and the chunk's start): a table altered after the
/// snapshot fails at its first row, and then nothing of it has been sent ([`CopyError::Altered`]).
/// What is left in `announce` was not sent. Returns the rows sent, or `None` when shut down part
/// way.
pub async fn copy_rows(
    conn: &mut Conn,
    cfg: &MySqlConfig,
    query: RowsQuery<'_>,
    announce: &mut Vec<SourceEvent>,
    events: &mpsc::Sender<SourceEvent>,
    shutdown: &CancellationToken,
) -> Result<Option<u64>, CopyError> {
    let entry = query.entry;
    let schema = &entry.schema;
    let id: &TableId = &schema.id;
    let table_err = |detail: String| SourceError::Table {
        table: id.clone(),
        detail,
    };
    let columns = schema
        .columns
        .iter()
        .map(|c| quote(&c.name))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "SELECT {columns} FROM {}.{}{}",
        quote(&id.namespace),
        quote(&id.name),
        query.filter
    );
    let params = if query.params.is_empty() {
        Params::Empty
    } else {
        Params::Positional(query.params)
    };
    let mut result = conn
        .exec_iter(sql, params)
        .await
        .map_err(read_err(format!("copying {id}")))?;
    let mut batch = TableChangesBuilder::new(schema.clone(), BATCH_ROWS);
    let mut batch_bytes = 0usize;
    let mut rows_sent = 0u64;
    let mut stream = result
        .stream::<Row>()
        .await
        .map_err(read_err(format!("copying {id}")))?;
    if let Some(rows) = stream.as_mut() {
        while let Some(row) = rows.next().await {
            let row = row.map_err(read_err(format!("copying {id}")))?;
            batch.begin(query.op);
            for (i, kind) in entry.kinds.iter().enumerate() {
                let value = row
                    .as_ref(i)
                    .ok_or_else(|| table_err(format!("row lacks column {i}")))?;
                if let Value::Bytes(b) = value {
                    batch_bytes += b.len();
                }
                let builder = batch
                    .value(i)
                    .ok_or_else(|| table_err(format!("no builder for column {i}")))?;
                append(builder, kind, value, Origin::Query, cfg.zero_date).map_err(|e| {
                    let name = schema.columns.get(i).map_or("?", |c| c.name.as_str());
                    table_err(format!("column {name}: {e}"))
                })?;
            }
            batch.no_old_key().map_err(|e| table_err(e.to_string()))?;
            if batch.len() >= BATCH_ROWS || batch_bytes >= BATCH_BYTES {
                batch_bytes = 0;
                let full = std::mem::replace(
                    &mut batch,
                    TableChangesBuilder::new(schema.clone(), BATCH_ROWS),
                );
                rows_sent += full.len() as u64;
                announced(announce, events).await?;
                send(events, full, &table_err).await?;
                if shutdown.is_cancelled() {
                    return Ok(None);
                }
            }
        }
    }
    drop(stream);
    if !batch.is_empty() {
        rows_sent += batch.len() as u64;
        announced(announce, events).await?;
        send(events, batch, &table_err).await?;
    }
    Ok(Some(rows_sent))
}

/// Sends what `announce` holds, in order, and leaves it empty.
pub async fn announced(
    announce: &mut Vec<SourceEvent>,
    events: &mpsc::Sender<SourceEvent>,
) -> Result<(), SourceError> {
    for event in announce.drain(..) {
        events.send(event).await.map_err(|_| SourceError::Closed)?;
    }
    Ok(())
}

/// The batch that starts a fresh copy: one `Truncate` (all columns absent), so a copy started
/// again from scratch replaces whatever an earlier attempt left.
pub fn truncate_marker(entry: &TableEntry) -> Result<SourceEvent, SourceError> {
    let schema = &entry.schema;
    let table_err = |detail: String| SourceError::Table {
        table: schema.id.clone(),
        detail,
    };
    let mut batch = TableChangesBuilder::new(schema.clone(), 1);
    batch.begin(Op::Truncate);
    for i in 0..schema.columns.len() {
        batch.absent(i).map_err(|e| table_err(e.to_string()))?;
    }
    batch.no_old_key().map_err(|e| table_err(e.to_string()))?;
    let changes = batch.finish().map_err(|e| table_err(e.to_string()))?;
    Ok(SourceEvent::SnapshotRows(changes))
}

async fn send(
    events: &mpsc::Sender<SourceEvent>,
    batch: TableChangesBuilder,
    table_err: &impl Fn(String) -> SourceError,
) -> Result<(), SourceError> {
    let changes = batch.finish().map_err(|e| table_err(e.to_string()))?;
    events
        .send(SourceEvent::SnapshotRows(changes))
        .await
        .map_err(|_| SourceError::Closed)
}
