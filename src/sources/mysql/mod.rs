//! MySQL/MariaDB source: the binlog stream of `mysql_async`, registered as a replica.
//!
//! - `decoder.rs`: MariaDB GTID/GTID_LIST events and DDL statements from bytes (pure).
//! - `types.rs`: column types to Arrow, values into Arrow builders (pure).
//! - `image/mod.rs`: row images read in place, straight into Arrow builders (pure; the fast path).
//! - `schema.rs`: a table's schema and converters from `information_schema` rows (pure).
//! - `assembler/mod.rs`: binlog events to changelog transactions (the assembler; pure).
//! - `stream.rs`: the binlog connection and its read loop (I/O).
//! - `setup.rs`: regular connections, catalog reads, `cdcd check`.
//! - TLS (`ssl-mode`, `ssl-ca`, `ssl-cert`/`ssl-key` as mysql_async's options, and what a failed
//!   TLS connection means for the user) is [`crate::tls::mysql`], on the same rustls stack as
//!   Postgres's.
//! - `snapshot.rs`: the consistent snapshot, its binlog position and the tables' columns at it;
//!   reading rows into batches.
//! - `chunks.rs`: a table's copy plan as primary-key ranges (pure).
//! - `copy.rs`: the initial copy, chunk by chunk, resumable after a crash (and why it converges).
//! - `copy_job.rs`: one run's copy: which tables share a snapshot, which are copied whole at one
//!   of their own, and the schema history the stream starts from.
//! - `altered.rs`: a table altered after the copy's snapshot, before the copy read it (pure).
//!
//! This file is [`MySqlSource`], the [`Source`] the pipeline runs: it resolves the tables, copies
//! them when asked, then opens the binlog stream at the resume position (MariaDB: GTID list with
//! `@mariadb_slave_capability=4` and `@slave_connect_state`; MySQL: COM_BINLOG_DUMP_GTID with the
//! GTID set; otherwise `file:pos`), feeds events to the assembler, and reconnects with backoff
//! when the connection drops. A MySQL server keeps no replica state, so acknowledgements only
//! matter to the pipeline; binlog retention is the server's (`binlog_expire_logs_seconds`), and
//! a purged binlog stops the source with an error naming the position.

pub mod altered;
pub mod assembler;
pub mod chunks;
pub mod config;
pub mod copy;
mod copy_job;
pub mod ddl;
pub mod decoder;
pub mod history;
pub mod image;
pub mod key;
mod parallel;
pub mod schema;
pub mod setup;
pub mod snapshot;
mod stream;

#[cfg(test)]
mod auth_tests;
pub mod types;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::changelog::{GtidList, GtidSet, Position, TableId, TableKey};
use crate::config::{MySqlConfig, SnapshotMode};
use crate::sources::{
    Prepared, Resume, SnapshotProgress, Source, SourceError, SourceEvent, SourceStateStore,
};
use assembler::Assembler;
use copy_job::CopyJob;
use schema::TableEntry;
use setup::{CheckProblem, Flavor};
use stream::{stream_once, Failure, HistoryWriter};

/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// MySQL ER_MASTER_FATAL_ERROR_READING_BINLOG: the requested binlog or GTID is gone.
pub(super) const ER_MASTER_FATAL_ERROR_READING_BINLOG: u16 = 1236;

/// The MySQL/MariaDB [`Source`].
pub struct MySqlSource {
    cfg: MySqlConfig,
    prepared: Option<(Flavor, Vec<TableId>)>,
    /// Where the schema history lives (`history.rs`); `None`: kept in memory only.
    state: Option<Arc<dyn SourceStateStore>>,
}

impl MySqlSource {
    pub fn new(cfg: MySqlConfig) -> Self {
        MySqlSource {
            cfg,
            prepared: None,
            state: None,
        }
    }

    /// Everything `cdcd check` reports for this source. Empty when ready.
    async fn check_source(cfg: &MySqlConfig) -> Vec<CheckProblem> {
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

    /// The tables `cfg` captures and their keys (for `cdcd status`).
    async fn resolve_tables(cfg: &MySqlConfig) -> Result<Vec<TableKey>, SourceError> {
        let mut conn = setup::connect(cfg).await?;
        let tables = setup::resolve_tables(&mut conn, &cfg.tables).await?;
        let mut keys = Vec::with_capacity(tables.len());
        for t in &tables {
            match setup::table_key(&mut conn, cfg, t).await? {
                Some(Ok(k)) => keys.push(k),
                Some(Err(p)) => return Err(SourceError::Config(p.to_string())),
                None => {}
            }
        }
        let _ = conn.disconnect().await;
        Ok(keys)
    }
}

#[async_trait]
impl Source for MySqlSource {
    async fn check(&self) -> Vec<CheckProblem> {
        Self::check_source(&self.cfg).await
    }

    fn settings(&self) -> Vec<String> {
        let line = if self.cfg.tls_origins.is_empty() {
            format!("source TLS: {}", self.cfg.tls.summary())
        } else {
            format!("source TLS: {}", self.cfg.tls_origins.join(", "))
        };
        match self.cfg.tls.mode {
            None if self.cfg.tls.ca.is_some() => {
                vec![format!(
                    "{line}; in effect ssl-mode=verify_ca (ssl-ca is set)"
                )]
            }
            _ => vec![line],
        }
    }

    async fn check_keys(&self) -> Vec<TableKey> {
        let Ok(mut conn) = setup::connect(&self.cfg).await else {
            return Vec::new();
        };
        let keys = setup::check(&mut conn, &self.cfg)
            .await
            .map(|(keys, _)| keys)
            .unwrap_or_default();
        let _ = conn.disconnect().await;
        keys
    }

    async fn tables(&self) -> Result<Vec<TableKey>, SourceError> {
        Self::resolve_tables(&self.cfg).await
    }

    fn snapshot_mode(&self) -> SnapshotMode {
        self.cfg.snapshot
    }

    fn stream_name(&self) -> String {
        format!("server_id {}", self.cfg.server_id)
    }

    /// The binlog source asks the server for a heartbeat every 5 s (`MASTER_HEARTBEAT_PERIOD`);
    /// twice that covers a late one.
    fn heartbeat_period(&self) -> Duration {
        Duration::from_secs(10)
    }

    fn keep_state_in(&mut self, store: Arc<dyn SourceStateStore>) {
        self.state = Some(store);
    }

    async fn prepare(&mut self) -> Result<Prepared, SourceError> {
        let mut conn = setup::connect(&self.cfg).await?;
        let (keys, problems) = setup::check(&mut conn, &self.cfg).await?;
        let tables: Vec<TableId> = keys.into_iter().map(|k| k.table).collect();
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
            multiset: Vec::new(),
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
        let resume = Resume {
            start: resume.start.map(|p| in_flavor(p, flavor)),
            ..resume
        };
        let mut conn = setup::connect(&cfg).await?;
        let mut entries = load_entries(&mut conn, &tables, &cfg).await?;
        // Tables to copy: all of them for a fresh pipeline; else those without a completed copy
        // (an interrupted copy, or a table added to `tables`), which the pipeline names.
        let wanted: HashMap<&TableId, Option<&SnapshotProgress>> = resume
            .copy
            .iter()
            .map(|c| (&c.table, c.progress.as_ref()))
            .collect();
        if resume.copy_only && wanted.is_empty() {
            return Err(SourceError::Config(
                "a copy job needs tables to copy".to_owned(),
            ));
        }
        let copied = tables_to_copy(&entries, resume.snapshot, &wanted);
        if resume.copy_only {
            // A resync's copy job: the tables are complete exactly at their snapshots
            // (`pipeline/resync.rs`); no stream, no schema history written.
            let job = CopyJob {
                conn: &mut conn,
                flavor,
                cfg: &cfg,
                events: &events,
                shutdown: &shutdown,
                history: None,
            };
            job.run(copied, None).await?;
            return Ok(());
        }
        // A fresh copy starts a new history: information_schema describes every table at it.
        let mut history = HistoryWriter::open(self.state, resume.snapshot).await?;
        let start = if resume.snapshot || !wanted.is_empty() {
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
            let job = CopyJob {
                conn: &mut conn,
                flavor,
                cfg: &cfg,
                events: &events,
                shutdown: &shutdown,
                history: Some(&mut history),
            };
            let Some(copy) = job.run(copied, origin).await? else {
                return Ok(());
            };
            // The stream decodes the copied tables with their columns at the copy, which the
            // schema history now records, not with the read before it.
            for at in copy.entries {
                if let Some(e) = entries.iter_mut().find(|e| e.schema.id == at.schema.id) {
                    *e = at;
                }
            }
            copy.start
        } else {
            start_without_copy(resume.start, &cfg, &mut conn, flavor).await?
        };
        let start = in_flavor(start, flavor);
        let mut assembler = assembler_at(&cfg, start, entries, &mut history).await?;
        stream_with_reconnects(
            &cfg,
            flavor,
            conn,
            &mut assembler,
            &mut history,
            &events,
            &shutdown,
        )
        .await
    }
}

/// The tables to copy, with the progress of an interrupted copy: all of them for a fresh
/// pipeline (`snapshot`); else those the pipeline names (`wanted`).
fn tables_to_copy<'r>(
    entries: &[TableEntry],
    snapshot: bool,
    wanted: &HashMap<&TableId, Option<&'r SnapshotProgress>>,
) -> Vec<(TableEntry, Option<&'r SnapshotProgress>)> {
    entries
        .iter()
        .filter_map(|e| {
            if snapshot {
                Some((e.clone(), None))
            } else {
                wanted.get(&e.schema.id).map(|p| (e.clone(), *p))
            }
        })
        .collect()
}

/// Where streaming starts when nothing is copied: the checkpoint, else `source.start_position`,
/// else the server's current position.
async fn start_without_copy(
    checkpoint: Option<Position>,
    cfg: &MySqlConfig,
    conn: &mut mysql_async::Conn,
    flavor: Flavor,
) -> Result<Position, SourceError> {
    Ok(match checkpoint {
        Some(p) => p,
        // source.start_position (snapshot = "never" only): a pipeline without checkpoints
        // replays from there instead of the server's current position.
        None => match cfg.start_position.clone() {
            Some(p) => p,
            None => snapshot::current_position(conn, flavor).await?,
        },
    })
}

/// The captured tables' columns and keys as the server describes them now.
async fn load_entries(
    conn: &mut mysql_async::Conn,
    tables: &[TableId],
    cfg: &MySqlConfig,
) -> Result<Vec<TableEntry>, SourceError> {
    let mut entries = Vec::with_capacity(tables.len());
    for t in tables {
        if let Some(e) =
            setup::load_table(conn, t, cfg.key_columns.get(t).map(Vec::as_slice)).await?
        {
            entries.push(e);
        }
    }
    Ok(entries)
}

/// The assembler at `start`, each table decoded with the columns the schema history records
/// in force there (the columns read now for a table the history does not know yet, which it
/// adopts and saves).
async fn assembler_at(
    cfg: &MySqlConfig,
    start: Position,
    entries: Vec<TableEntry>,
    history: &mut HistoryWriter,
) -> Result<Assembler, SourceError> {
    let mut assembler = Assembler::new(cfg.tables.clone(), cfg.zero_date, start.clone());
    let mut adopted = false;
    for e in entries {
        let id = e.schema.id.clone();
        match history.in_force(&id, &start)? {
            Some(then) => {
                if then.columns != e.columns {
                    info!(table = %id, position = %start, "a DDL after the start position is replayed: decoding with the columns the schema history records there");
                }
                assembler.set_table(then);
            }
            None => {
                adopted |= history.adopt(&e);
                assembler.set_table(e);
            }
        }
    }
    if adopted {
        history.save().await?;
    }
    Ok(assembler)
}

/// Streams from the assembler's position until shutdown or a fatal error, reconnecting with
/// backoff when the stream is lost.
async fn stream_with_reconnects(
    cfg: &MySqlConfig,
    flavor: Flavor,
    mut conn: mysql_async::Conn,
    assembler: &mut Assembler,
    history: &mut HistoryWriter,
    events: &mpsc::Sender<SourceEvent>,
    shutdown: &CancellationToken,
) -> Result<(), SourceError> {
    let mut backoff = BACKOFF_MIN;
    loop {
        let outcome =
            stream_once(cfg, flavor, &mut conn, assembler, history, events, shutdown).await;
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
                match setup::connect(cfg).await {
                    Ok(c) => conn = c,
                    Err(e) => warn!(error = %e, "reconnect failed"),
                }
            }
        }
    }
}

/// The newest position all of `positions` are at or past (their meet, as the pipeline computes
/// the start: for GTID sets and lists, which do not always compare, the intersection).
fn oldest(positions: impl Iterator<Item = Position>) -> Option<Position> {
    positions.reduce(|a, b| a.meet(&b).unwrap_or(a))
}

/// `position` in the kind of the server's positions: an empty GTID state read back from a
/// checkpoint may be of either kind (`""`, written by earlier versions, reads as a MariaDB list),
/// and the assembler advances only positions of its server's kind.
fn in_flavor(position: Position, flavor: Flavor) -> Position {
    if !position.is_empty_gtid() {
        return position;
    }
    match flavor {
        Flavor::MariaDb => Position::MariaDbGtid(GtidList::default()),
        Flavor::MySqlGtid => Position::MySqlGtid(GtidSet::default()),
        Flavor::MySqlFile => position,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_gtid_state_takes_the_servers_kind() {
        // `""`, as earlier versions wrote it, reads as a MariaDB list.
        let legacy: Position = "".parse().unwrap();
        assert_eq!(
            in_flavor(legacy.clone(), Flavor::MySqlGtid),
            Position::MySqlGtid(GtidSet::default())
        );
        assert_eq!(
            in_flavor(legacy, Flavor::MariaDb),
            Position::MariaDbGtid(GtidList::default())
        );
        let set = Position::MySqlGtid(GtidSet::default());
        assert_eq!(
            in_flavor(set, Flavor::MariaDb),
            Position::MariaDbGtid(GtidList::default())
        );
        let some: Position = "0-1-5".parse().unwrap();
        assert_eq!(in_flavor(some.clone(), Flavor::MySqlGtid), some);
    }

    #[test]
    fn oldest_is_the_meet() {
        let a: Position = "0-1-10,1-1-5".parse().unwrap();
        let b: Position = "0-1-5,1-1-8".parse().unwrap();
        assert_eq!(
            oldest([a, b].into_iter()),
            Some("0-1-5,1-1-5".parse().unwrap())
        );
        assert_eq!(oldest(std::iter::empty()), None);
    }
}
