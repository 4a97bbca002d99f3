//! MySQL/MariaDB source: the binlog stream of `mysql_async`, registered as a replica.
//!
//! - `decoder.rs`: MariaDB GTID/GTID_LIST events and DDL statements from bytes (pure).
//! - `types.rs`: column types to Arrow, values into Arrow builders (pure).
//! - `image.rs`: row images read in place, straight into Arrow builders (pure; the fast path).
//! - `schema.rs`: a table's schema and converters from `information_schema` rows (pure).
//! - `assembler.rs`: binlog events to changelog transactions (the assembler; pure).
//! - `setup.rs`: regular connections, catalog reads, `cdcd check`.
//! - `snapshot.rs`: the consistent snapshot and its binlog position; reading rows into batches.
//! - `chunks.rs`: a table's copy plan as primary-key ranges (pure).
//! - `copy.rs`: the initial copy, chunk by chunk, resumable after a crash (and why it converges).
//!
//! This file is [`MySqlSource`], the [`Source`] the pipeline runs: it resolves the tables, copies
//! them when asked, then opens the binlog stream at the resume position (MariaDB: GTID list with
//! `@mariadb_slave_capability=4` and `@slave_connect_state`; MySQL: COM_BINLOG_DUMP_GTID with the
//! GTID set; otherwise `file:pos`), feeds events to the assembler, and reconnects with backoff
//! when the connection drops. A MySQL server keeps no replica state, so acknowledgements only
//! matter to the pipeline; binlog retention is the server's (`binlog_expire_logs_seconds`), and
//! a purged binlog stops the source with an error naming the position.

pub mod assembler;
pub mod chunks;
pub mod config;
pub mod copy;
pub mod decoder;
pub mod image;
pub mod schema;
pub mod setup;
pub mod snapshot;
pub mod types;

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use mysql_async::binlog::events::Event;
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest, Conn, GnoInterval, Sid};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::changelog::{Position, TableId};
use crate::config::MySqlConfig;
use crate::sources::{Prepared, Resume, SnapshotProgress, Source, SourceError, SourceEvent};
use assembler::{Assembler, Step, StreamError};
use schema::TableEntry;
use setup::{CheckProblem, Flavor};

/// The server sends a heartbeat event after this much binlog silence (MASTER_HEARTBEAT_PERIOD).
const HEARTBEAT: Duration = Duration::from_secs(5);
/// No event for this long means the connection is dead.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle positions go to the pipeline at most this often.
const IDLE_INTERVAL: Duration = Duration::from_secs(1);
/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// MySQL ER_MASTER_FATAL_ERROR_READING_BINLOG: the requested binlog or GTID is gone.
const ER_MASTER_FATAL_ERROR_READING_BINLOG: u16 = 1236;

/// The MySQL/MariaDB [`Source`].
pub struct MySqlSource {
    cfg: MySqlConfig,
    prepared: Option<(Flavor, Vec<TableId>)>,
}

impl MySqlSource {
    pub fn new(cfg: MySqlConfig) -> Self {
        MySqlSource {
            cfg,
            prepared: None,
        }
    }

    /// Everything `cdcd check` reports for this source. Empty when ready.
    pub async fn check(cfg: &MySqlConfig) -> Vec<CheckProblem> {
        let mut conn = match setup::connect(cfg).await {
            Ok(c) => c,
            Err(e) => {
                return vec![CheckProblem {
                    problem: e.to_string(),
                    fix: "check source.url, source.password, and that the server accepts the user from this host".into(),
                }]
            }
        };
        let problems = match setup::check(&mut conn, cfg).await {
            Ok((_, problems)) => problems,
            Err(e) => vec![CheckProblem {
                problem: e.to_string(),
                fix: "check that the user may read information_schema and server variables".into(),
            }],
        };
        let _ = conn.disconnect().await;
        problems
    }

    /// The tables `cfg` captures (for `cdcd status`).
    pub async fn tables(cfg: &MySqlConfig) -> Result<Vec<TableId>, SourceError> {
        let mut conn = setup::connect(cfg).await?;
        let tables = setup::resolve_tables(&mut conn, &cfg.tables).await;
        let _ = conn.disconnect().await;
        tables
    }
}

#[async_trait]
impl Source for MySqlSource {
    async fn prepare(&mut self) -> Result<Prepared, SourceError> {
        let mut conn = setup::connect(&self.cfg).await?;
        let (tables, problems) = setup::check(&mut conn, &self.cfg).await?;
        // Settings that make streaming impossible stop here; advice (GTID mode) does not.
        if let Some(p) = problems
            .iter()
            .find(|p| !p.problem.starts_with("gtid_mode"))
        {
            return Err(SourceError::Config(p.to_string()));
        }
        let flavor = setup::flavor(&mut conn).await?;
        let _ = conn.disconnect().await;
        self.prepared = Some((flavor, tables.clone()));
        // No server-side slot: "exists" lets the pipeline decide from the tables' checkpoints
        // alone (tables without one are copied when snapshot = "initial").
        Ok(Prepared {
            tables,
            slot_exists: true,
        })
    }

    async fn run(
        self: Box<Self>,
        resume: Resume,
        events: mpsc::Sender<SourceEvent>,
        _acks: watch::Receiver<Option<Position>>,
        shutdown: CancellationToken,
    ) -> Result<(), SourceError> {
        let cfg = self.cfg;
        let (flavor, tables) = match self.prepared {
            Some(p) => p,
            None => return Err(SourceError::Config("run before prepare".into())),
        };
        let mut conn = setup::connect(&cfg).await?;
        let mut entries = Vec::with_capacity(tables.len());
        for t in &tables {
            if let Some(e) = setup::load_table(&mut conn, t).await? {
                entries.push(e);
            }
        }
        // Tables to copy: all of them for a fresh pipeline; else those without a completed copy
        // (an interrupted copy, or a table added to `tables`), which the pipeline names.
        let wanted: HashMap<&TableId, Option<&SnapshotProgress>> = resume
            .copy
            .iter()
            .map(|c| (&c.table, c.progress.as_ref()))
            .collect();
        let start = if resume.snapshot || !wanted.is_empty() {
            let copied: Vec<(&TableEntry, Option<&SnapshotProgress>)> = entries
                .iter()
                .filter_map(|e| {
                    if resume.snapshot {
                        Some((e, None))
                    } else {
                        wanted.get(&e.schema.id).map(|p| (e, *p))
                    }
                })
                .collect();
            // Streaming starts at the oldest of the other tables' checkpoints and of the
            // positions interrupted copies declared their tables complete at; with neither, the
            // copy is fresh and streaming starts at its snapshot.
            let origin = if resume.snapshot {
                None
            } else {
                let interrupted = copied
                    .iter()
                    .filter_map(|(_, p)| p.and_then(copy::resume_origin));
                oldest(resume.start.iter().cloned().chain(interrupted))
            };
            let position =
                copy_at_new_snapshot(&mut conn, flavor, &cfg, &copied, origin, &events, &shutdown)
                    .await?;
            let Some(position) = position else {
                return Ok(());
            };
            position
        } else {
            match resume.start {
                Some(p) => p,
                // source.start_position (snapshot = "never" only): a pipeline without checkpoints
                // replays from there instead of the server's current position.
                None => match cfg.start_position.clone() {
                    Some(p) => p,
                    None => snapshot::current_position(&mut conn, flavor).await?,
                },
            }
        };
        let mut assembler = Assembler::new(cfg.tables.clone(), cfg.zero_date, start);
        for e in entries {
            assembler.set_table(e);
        }
        let mut backoff = BACKOFF_MIN;
        loop {
            let outcome =
                stream_once(&cfg, flavor, &mut conn, &mut assembler, &events, &shutdown).await;
            match outcome {
                Ok(()) => return Ok(()),
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Retry(e)) => {
                    warn!(error = %e, position = %assembler.position(), retry_in = ?backoff, "binlog stream lost; reconnecting");
                    tokio::select! {
                        _ = shutdown.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    match setup::connect(&cfg).await {
                        Ok(c) => conn = c,
                        Err(e) => warn!(error = %e, "reconnect failed"),
                    }
                }
            }
        }
    }
}

/// The oldest of `positions`, ordered as the pipeline orders checkpoints (`decide_resume`).
/// Limit shared with it: two MariaDB GTID lists that are each ahead in a different domain do not
/// compare, and the first is taken.
fn oldest(positions: impl Iterator<Item = Position>) -> Option<Position> {
    positions.min_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal))
}

/// Copies `tables` chunk by chunk inside one new consistent-snapshot transaction and returns the
/// position streaming starts from, or `None` when shut down mid-copy.
///
/// `origin`: `None` for a fresh copy (the tables are complete at the snapshot, where streaming
/// starts); otherwise the tables are declared complete at `origin` with an upsert window up to
/// the snapshot, and interrupted copies keep their done chunks (the argument is in `copy.rs`).
async fn copy_at_new_snapshot(
    conn: &mut Conn,
    flavor: Flavor,
    cfg: &MySqlConfig,
    tables: &[(&TableEntry, Option<&SnapshotProgress>)],
    origin: Option<Position>,
    events: &mpsc::Sender<SourceEvent>,
    shutdown: &CancellationToken,
) -> Result<Option<Position>, SourceError> {
    let snapshot = snapshot::begin(conn, flavor).await?;
    info!(%snapshot, from = %origin.as_ref().unwrap_or(&snapshot), tables = tables.len(), "initial copy from a consistent snapshot");
    let finish = match &origin {
        None => copy::Finish {
            upsert_until: None,
            done_at: snapshot.clone(),
        },
        Some(from) => copy::Finish {
            upsert_until: Some(snapshot.clone()),
            done_at: from.clone(),
        },
    };
    let mut plans = Vec::with_capacity(tables.len());
    for (entry, progress) in tables {
        // A fresh copy replaces whatever an interrupted one left: without an origin, done chunks
        // read at an unknown position cannot be kept.
        let progress = progress.filter(|_| origin.is_some());
        let plan = copy::plan_table(
            conn,
            entry,
            progress,
            cfg.snapshot_chunk_rows,
            &finish.done_at,
        )
        .await?;
        if !plan.fresh {
            info!(table = %entry.schema.id, chunks = plan.chunks.len(), to_copy = plan.todo.len(), "resuming an interrupted initial copy at a new snapshot");
        }
        plans.push(plan);
    }
    if !copy::copy_tables(conn, cfg, &plans, &finish, events, shutdown).await? {
        return Ok(None);
    }
    conn.query_drop("COMMIT")
        .await
        .map_err(setup::server_err("ending the snapshot"))?;
    Ok(Some(finish.done_at))
}

enum Failure {
    Fatal(SourceError),
    Retry(String),
}

fn stream_err(e: StreamError) -> Failure {
    Failure::Fatal(SourceError::Protocol(e.to_string()))
}

/// Opens the binlog stream at the assembler's position and feeds it until shutdown or failure.
async fn stream_once(
    cfg: &MySqlConfig,
    flavor: Flavor,
    conn: &mut Conn,
    assembler: &mut Assembler,
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
            match assembler.on_event(&event, tme).map_err(stream_err)? {
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
                    let entry = setup::load_table(conn, &id)
                        .await
                        .map_err(|e| Failure::Retry(e.to_string()))?;
                    match entry {
                        Some(e) => {
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
    let mut conn = Conn::new(setup::opts(cfg)).await.map_err(retry)?;
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
