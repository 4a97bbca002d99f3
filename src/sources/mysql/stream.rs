//! The binlog stream of the MySQL/MariaDB source (I/O): a replica connection opened at the
//! assembler's position (`open`), every event fed to the assembler (`assembler/mod.rs`, pure) and the
//! transactions it completes sent to the pipeline, until shutdown or a failure that
//! [`super::MySqlSource::run`] retries with backoff or reports.

use std::time::Duration;

use futures::StreamExt;
use mysql_async::binlog::events::Event;
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest, Conn, GnoInterval, Sid};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::info;

use std::sync::Arc;

use super::assembler::{AppliedDdl, Assembler, Step, StreamError};
use super::history::SchemaHistory;
use super::schema::TableEntry;
use super::setup::{self, Flavor};
use super::ER_MASTER_FATAL_ERROR_READING_BINLOG;
use crate::changelog::{Position, TableId};
use crate::config::MySqlConfig;
use crate::sources::{SourceError, SourceEvent, SourceStateStore};

/// The server sends a heartbeat event after this much binlog silence (MASTER_HEARTBEAT_PERIOD).
const HEARTBEAT: Duration = Duration::from_secs(5);
/// No event for this long means the connection is dead.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle positions go to the pipeline at most this often.
const IDLE_INTERVAL: Duration = Duration::from_secs(1);

/// How one stream attempt ended: a failure to report, or one to retry after backoff.
pub(super) enum Failure {
    Fatal(SourceError),
    Retry(String),
}

fn stream_err(e: StreamError) -> Failure {
    Failure::Fatal(SourceError::Protocol(e.to_string()))
}

/// The schema history (`history.rs`) and where it is stored.
pub(super) struct HistoryWriter {
    history: SchemaHistory,
    store: Option<Arc<dyn SourceStateStore>>,
}

impl HistoryWriter {
    /// Reads the stored history; with `fresh` (every table is copied again) starts an empty one.
    pub(super) async fn open(
        store: Option<Arc<dyn SourceStateStore>>,
        fresh: bool,
    ) -> Result<HistoryWriter, SourceError> {
        let mut history = SchemaHistory::default();
        if let (Some(store), false) = (&store, fresh) {
            if let Some(bytes) = store.read().await? {
                history = SchemaHistory::from_json(&bytes).map_err(|e| {
                    SourceError::Config(format!(
                        "{e}: the pipeline's source-state.json under _cdcd/ is unreadable; restore it, or copy the tables again (a new pipeline name)"
                    ))
                })?;
            }
        }
        let writer = HistoryWriter { history, store };
        if fresh {
            writer.save().await?;
        }
        Ok(writer)
    }

    pub(super) fn in_force(
        &self,
        table: &TableId,
        start: &Position,
    ) -> Result<Option<TableEntry>, SourceError> {
        self.history
            .in_force(table, start)
            .map_err(|e| SourceError::Config(e.to_string()))
    }

    /// Starts the history of `entry`'s table with it unless it has one (see `history.rs`).
    pub(super) fn adopt(&mut self, entry: &TableEntry) -> bool {
        self.history.adopt(entry)
    }

    /// Forgets `table`'s history (it is copied again and streamed from that copy's snapshot).
    pub(super) fn forget(&mut self, table: &TableId) -> bool {
        self.history.forget(table)
    }

    /// Records DDL the assembler applied; durable when it returns, so nothing after the DDL
    /// reaches the pipeline (and no checkpoint passes it) before its version is on record.
    async fn record(&mut self, applied: Vec<AppliedDdl>) -> Result<(), SourceError> {
        for ddl in &applied {
            info!(table = %ddl.after.schema.id, position = %ddl.at, columns = %ddl.after.schema.describe_columns(), "applied ALTER TABLE");
            self.history
                .record(&ddl.before, &ddl.after, &ddl.at, &ddl.statement);
        }
        self.save().await
    }

    pub(super) async fn save(&self) -> Result<(), SourceError> {
        match &self.store {
            Some(store) => store.write(self.history.to_json()).await,
            None => Ok(()),
        }
    }
}

/// Opens the binlog stream at the assembler's position and feeds it until shutdown or failure.
pub(super) async fn stream_once(
    cfg: &MySqlConfig,
    flavor: Flavor,
    conn: &mut Conn,
    assembler: &mut Assembler,
    history: &mut HistoryWriter,
    events: &mpsc::Sender<SourceEvent>,
    shutdown: &CancellationToken,
) -> Result<(), Failure> {
    assembler.reset();
    let position = assembler.position().clone();
    let mut binlog = open(cfg, flavor, &position).await?;
    info!(%position, "streaming the binlog");
    let mut last_idle = Instant::now();
    loop {
        let next = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(()),
            next = tokio::time::timeout(READ_TIMEOUT, binlog.next()) => next,
        };
        let event: Event = match next {
            Err(_) => {
                return Err(Failure::Retry(format!(
                    "no binlog event for {READ_TIMEOUT:?}"
                )))
            }
            Ok(None) => return Err(Failure::Retry("the server closed the binlog stream".into())),
            Ok(Some(Err(e))) => return Err(classify_error(e, assembler.position())),
            Ok(Some(Ok(ev))) => ev,
        };
        let table_id = rows_table_id(&event);
        loop {
            let tme = table_id.and_then(|id| binlog.get_tme(id));
            let step = assembler.on_event(&event, tme).map_err(stream_err)?;
            let applied = assembler.take_applied_ddl();
            if !applied.is_empty() {
                history.record(applied).await.map_err(Failure::Fatal)?;
            }
            match step {
                Step::Nothing => {}
                Step::Transaction(t) => {
                    events
                        .send(SourceEvent::Transaction(t))
                        .await
                        .map_err(|_| Failure::Fatal(SourceError::Closed))?;
                }
                Step::Idle(p) => {
                    if last_idle.elapsed() >= IDLE_INTERVAL {
                        last_idle = Instant::now();
                        events
                            .send(SourceEvent::Heartbeat(p))
                            .await
                            .map_err(|_| Failure::Fatal(SourceError::Closed))?;
                    }
                }
                Step::NeedTable(id) => {
                    let entry =
                        setup::load_table(conn, &id, cfg.key_columns.get(&id).map(Vec::as_slice))
                            .await
                            .map_err(|e| Failure::Retry(e.to_string()))?;
                    match entry {
                        Some(e) => {
                            if history.adopt(&e) {
                                history.save().await.map_err(Failure::Fatal)?;
                            }
                            assembler.set_table(e);
                            continue;
                        }
                        None => {
                            return Err(Failure::Fatal(SourceError::Table {
                                table: id,
                                detail: "has rows in the binlog but no longer exists".into(),
                            }))
                        }
                    }
                }
            }
            break;
        }
    }
}

/// The table id of a rows event (so its TABLE_MAP can be looked up), without decoding it twice.
fn rows_table_id(event: &Event) -> Option<u64> {
    use mysql_async::binlog::events::EventData;
    match event.header().event_type_raw() {
        // WRITE/UPDATE/DELETE_ROWS v1 (23-25) and v2 (30-32), PARTIAL_UPDATE_ROWS (39).
        23..=25 | 30..=32 | 39 => match event.read_data() {
            Ok(Some(EventData::RowsEvent(r))) => Some(r.table_id()),
            _ => None,
        },
        _ => None,
    }
}

fn classify_error(e: mysql_async::Error, position: &Position) -> Failure {
    match e {
        mysql_async::Error::Server(s) if s.code == ER_MASTER_FATAL_ERROR_READING_BINLOG => {
            Failure::Fatal(SourceError::Server {
                context: format!("resuming the binlog at {position}"),
                detail: format!(
                    "{} — the binlog holding this position was purged or is unknown to the server; set source.snapshot = \"initial\" and recreate the replica",
                    s.message
                ),
            })
        }
        mysql_async::Error::Server(s) => Failure::Fatal(SourceError::Server {
            context: format!("reading the binlog at {position}"),
            detail: s.to_string(),
        }),
        other => Failure::Retry(other.to_string()),
    }
}

/// Opens a replication connection at `position`.
async fn open(
    cfg: &MySqlConfig,
    flavor: Flavor,
    position: &Position,
) -> Result<BinlogStream, Failure> {
    let retry = |e: mysql_async::Error| Failure::Retry(e.to_string());
    let mut conn = setup::connect(cfg)
        .await
        .map_err(|e| Failure::Retry(e.to_string()))?;
    let period = HEARTBEAT.as_nanos();
    conn.query_drop(format!("SET @master_heartbeat_period = {period}"))
        .await
        .map_err(retry)?;
    if flavor == Flavor::MariaDb {
        // Capability 4 (MARIA_SLAVE_CAPABILITY_GTID): the server sends GTID and GTID_LIST events
        // instead of rewriting them as BEGIN queries (MariaDB KB "COM_BINLOG_DUMP").
        conn.query_drop("SET @mariadb_slave_capability = 4")
            .await
            .map_err(retry)?;
    }
    let request = BinlogStreamRequest::new(cfg.server_id);
    let stream = match position {
        Position::MariaDbGtid(list) => {
            // With @slave_connect_state set, MariaDB positions by GTID and ignores file/offset.
            conn.query_drop(format!(
                "SET @slave_connect_state = '{list}', @slave_gtid_strict_mode = 0, @slave_gtid_ignore_duplicates = 0"
            ))
            .await
            .map_err(retry)?;
            conn.get_binlog_stream(request).await
        }
        Position::MySqlGtid(set) => {
            let mut sids = Vec::with_capacity(set.sids.len());
            for (sid, ivs) in &set.sids {
                let (uuid, tag) = match sid.split_once(':') {
                    Some((u, t)) => (u, Some(t)),
                    None => (sid.as_str(), None),
                };
                let Ok(uuid) = uuid::Uuid::parse_str(uuid) else {
                    return Err(Failure::Fatal(SourceError::Protocol(format!(
                        "GTID set member {sid:?}"
                    ))));
                };
                // The protocol's interval end is exclusive.
                let intervals = ivs
                    .iter()
                    .map(|&(s, e)| GnoInterval::new(s, e.saturating_add(1)))
                    .collect();
                let mut member = Sid::new(*uuid.as_bytes()).with_intervals(intervals);
                if let Some(tag) = tag {
                    let tag = mysql_common::packets::Tag::new(tag.to_owned()).map_err(|e| {
                        Failure::Fatal(SourceError::Protocol(format!("GTID tag {tag:?}: {e}")))
                    })?;
                    member = member.with_tag(tag);
                }
                sids.push(member);
            }
            conn.get_binlog_stream(request.with_gtid().with_gtid_set(sids))
                .await
        }
        Position::MySqlFile(f) => {
            let pos = f.pos.max(4);
            conn.get_binlog_stream(request.with_filename(f.file.as_bytes()).with_pos(pos))
                .await
        }
        Position::Postgres(_) => {
            return Err(Failure::Fatal(SourceError::Config(format!(
                "checkpoint {position} is a Postgres position, not a MySQL one"
            ))))
        }
    };
    stream.map_err(|e| classify_error(e, position))
}
