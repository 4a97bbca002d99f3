//! Postgres source: logical replication with the pgoutput plugin.
//!
//! - `decoder.rs`: pgoutput messages from bytes (pure; protocol v1–v4).
//! - `types.rs`: Postgres types to Arrow, and text values into Arrow builders (pure).
//! - `relation.rs`: table schemas from Relation messages or the catalog, built one way.
//! - `startup.rs`: connecting and authenticating (TLS, StartupMessage, trust/cleartext/md5/SCRAM).
//! - TLS (libpq's `sslmode` and friends, the SSLRequest handshake, tokio-postgres's connector) is
//!   [`crate::tls::postgres`], shared with the Iceberg sink's SQL catalog.
//! - `replication.rs`: the replication connection (a walsender session, pgwire-replication's
//!   framing).
//! - `setup.rs`: publication, slot and server checks over a regular connection.
//! - `assembler/mod.rs`: decoded messages to changelog transactions (streamed transactions, spill).
//! - `stream.rs`: the streaming loop (I/O): frames in, transactions out, status updates back.
//! - `copy.rs`: which tables are copied at which snapshot (fresh, beside the slot, exactly);
//!   `snapshot.rs` and `snapshot/`: how (parallel key ranges, binary COPY read off the socket
//!   by `snapshot/session.rs`, resumable).
//! - `monitor.rs`: heartbeats, slot lag and retained WAL, an invalidated slot.
//! - `preflight.rs`: further `cdcd check` lines (replica identity, publication rights).
//!
//! This file is [`PostgresSource`], the [`Source`] the pipeline runs: it prepares the server
//! (`setup.rs`), optionally copies the tables from a fresh slot's exported snapshot, or copies the
//! tables the pipeline names (an interrupted copy, an added table) at a new snapshot while the
//! slot stays (`snapshot.rs`), then streams from the slot, feeding frames to the assembler and answering with
//! standby status updates that carry only acknowledged (committed) positions.

pub mod assembler;
pub mod catalog;
pub mod config;
mod copy;
pub mod ddl;
pub mod decoder;
pub mod key;
pub mod monitor;
pub mod preflight;
pub mod publication;
pub mod relation;
pub mod replication;
pub mod setup;
pub mod snapshot;
mod startup;
pub mod state;
mod stream;
pub mod types;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::changelog::{KeyOrigin, Lsn, Position, TableId, TableKey};
use crate::config::{PostgresConfig, SnapshotMode};
use crate::sources::{Prepared, Resume, Source, SourceError, SourceEvent, SourceStateStore};
use assembler::{Assembler, AssemblerConfig};
use copy::{copy_at_new_snapshot, copy_exactly, initial_copy};
use replication::{ReplicationConnection, StartOptions};
use setup::CheckProblem;
use snapshot::BatchLimits;
use stream::Streaming;
use types::TypeInfo;

/// Status updates go out at least this often, well within the default `wal_sender_timeout` (60 s).
const STATUS_INTERVAL: Duration = Duration::from_secs(10);
/// Where `SnapshotRows` batches of the initial copy are cut: rows, or bytes of COPY data (bounds
/// memory for wide rows: the event channel holds at most a few such batches).
const SNAPSHOT_BATCH: BatchLimits = BatchLimits {
    rows: 10_000,
    bytes: 8 << 20,
};
/// Heartbeats for transactions without captured changes go out at most this often (before PG 15,
/// pgoutput sends an empty Begin/Commit for every transaction in the database).
const SKIPPED_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
/// How long to wait for a previous walsender (e.g. of a killed cdcd) to release the slot.
const SLOT_RELEASE_WAIT: Duration = Duration::from_secs(30);

/// The Postgres [`Source`].
pub struct PostgresSource {
    cfg: PostgresConfig,
    extra_options: String,
    prepared: Option<PreparedState>,
    /// Where the captured tables' oids are kept between runs (`state.rs`).
    state: Option<Arc<dyn SourceStateStore>>,
}

/// What `prepare` learned, kept for `run`.
struct PreparedState {
    client: Client,
    tables: Vec<TableId>,
    keys: HashMap<TableId, Vec<String>>,
    proto_version: u32,
    /// `publication_names`: `source.publication`, and its `_inserts` twin for keyless tables.
    publications: Vec<String>,
}

impl PostgresSource {
    pub fn new(cfg: PostgresConfig) -> Self {
        PostgresSource {
            cfg,
            extra_options: String::new(),
            prepared: None,
            state: None,
        }
    }

    /// Extra startup options for the replication connection (`-c name=value …`); tests lower
    /// `logical_decoding_work_mem` with it to force streamed transactions.
    pub fn with_replication_options(mut self, options: impl Into<String>) -> Self {
        self.extra_options = options.into();
        self
    }

    /// Everything `cdcd check` reports for this source: connection, settings, privileges, table
    /// patterns, primary keys, and a slot of the wrong kind. Empty when ready.
    async fn check_source(cfg: &PostgresConfig) -> Vec<CheckProblem> {
        let client = match setup::connect(cfg).await {
            Ok(c) => c,
            Err(e) => {
                return vec![CheckProblem {
                    problem: e.to_string(),
                    fix: "check source.url (and its ssl* parameters), source.password, and that Postgres accepts the connection (pg_hba.conf)".to_owned(),
                }]
            }
        };
        let catalog_problem = |e: SourceError| CheckProblem {
            problem: e.to_string(),
            fix: "check that the user may read the catalog".to_owned(),
        };
        let mut problems = match setup::check(&client, cfg).await {
            Ok((keys, mut problems)) => {
                match publication::check_publications(&client, &cfg.publication, &keys).await {
                    Ok(p) => problems.extend(p),
                    Err(e) => problems.push(catalog_problem(e)),
                }
                match preflight::check(&client, cfg, &keys).await {
                    Ok(p) => problems.extend(p),
                    Err(e) => problems.push(catalog_problem(e)),
                }
                problems
            }
            Err(e) => vec![catalog_problem(e)],
        };
        match setup::slot_exists(&client, &cfg.slot).await {
            Ok(Some(info)) => {
                if let Err(e) = setup::verify_slot(&cfg.slot, &info, &cfg.database) {
                    problems.push(CheckProblem {
                        problem: e.to_string(),
                        fix: "choose another source.slot".to_owned(),
                    });
                }
            }
            Ok(None) => {}
            Err(e) => problems.push(CheckProblem {
                problem: e.to_string(),
                fix: "check that the user may read pg_replication_slots".to_owned(),
            }),
        }
        problems
    }
}

#[async_trait]
impl Source for PostgresSource {
    async fn check(&self) -> Vec<CheckProblem> {
        Self::check_source(&self.cfg).await
    }

    async fn check_keys(&self) -> Vec<TableKey> {
        let Ok(client) = setup::connect(&self.cfg).await else {
            return Vec::new();
        };
        publication::resolve_report(&client, &self.cfg.tables, &self.cfg.key_columns)
            .await
            .map(|(keys, _)| keys)
            .unwrap_or_default()
    }

    fn settings(&self) -> Vec<String> {
        let tls = &self.cfg.tls;
        let mut line = if self.cfg.tls_origins.is_empty() {
            format!("source TLS: sslmode={} (default)", tls.mode)
        } else {
            format!("source TLS: {}", self.cfg.tls_origins.join(", "))
        };
        if tls.effective_mode() != tls.mode {
            line.push_str(&format!(
                "; in effect {} (require with a CA file, as libpq)",
                tls.effective_mode()
            ));
        }
        vec![line]
    }

    async fn tables(&self) -> Result<Vec<TableKey>, SourceError> {
        let client = setup::connect(&self.cfg).await?;
        publication::resolve_tables(&client, &self.cfg.tables, &self.cfg.key_columns).await
    }

    fn snapshot_mode(&self) -> SnapshotMode {
        self.cfg.snapshot
    }

    fn stream_name(&self) -> String {
        self.cfg.slot.clone()
    }

    fn heartbeat_period(&self) -> Duration {
        self.cfg
            .heartbeat_interval
            .unwrap_or(monitor::DEFAULT_WATCH_INTERVAL)
    }

    fn keep_state_in(&mut self, store: Arc<dyn SourceStateStore>) {
        self.state = Some(store);
    }

    async fn prepare(&mut self) -> Result<Prepared, SourceError> {
        let cfg = &self.cfg;
        let client = setup::connect(cfg).await?;
        let (table_keys, problems) = setup::check(&client, cfg).await?;
        let tables: Vec<TableId> = table_keys.iter().map(|k| k.table.clone()).collect();
        let multiset: Vec<TableId> = table_keys
            .iter()
            .filter(|k| k.origin == KeyOrigin::FullRow)
            .map(|k| k.table.clone())
            .collect();
        if let Some(p) = problems.first() {
            return Err(SourceError::Config(p.to_string()));
        }
        let publications =
            publication::ensure_publications(&client, &cfg.publication, &table_keys).await?;
        let slot = setup::slot_exists(&client, &cfg.slot).await?;
        if let Some(info) = &slot {
            setup::verify_slot(&cfg.slot, info, &cfg.database)?;
            let stats = monitor::slot_stats(&client, &cfg.slot).await?;
            if stats.is_some_and(|s| s.is_lost()) {
                tracing::error!(slot = %cfg.slot, "{}", monitor::slot_lost_problem(&cfg.slot));
                return Err(monitor::slot_lost_error(&cfg.slot));
            }
        }
        let proto_version = setup::proto_version(setup::server_version(&client).await?);
        let keys: HashMap<TableId, Vec<String>> = table_keys
            .into_iter()
            .map(|k| (k.table, k.columns))
            .collect();
        tracing::info!(tables = tables.len(), proto_version, slot = %cfg.slot, slot_exists = slot.is_some(), "postgres source prepared");
        self.prepared = Some(PreparedState {
            client,
            tables: tables.clone(),
            keys,
            proto_version,
            publications,
        });
        Ok(Prepared {
            tables,
            slot_exists: slot.is_some(),
            multiset,
        })
    }

    async fn run(
        mut self: Box<Self>,
        resume: Resume,
        events: mpsc::Sender<SourceEvent>,
        acks: watch::Receiver<Option<Position>>,
        shutdown: CancellationToken,
    ) -> Result<(), SourceError> {
        if self.prepared.is_none() {
            self.prepare().await?;
        }
        let Some(state) = self.prepared.take() else {
            return Err(SourceError::Config("source was not prepared".to_owned()));
        };
        let cfg = self.cfg;
        // Before any copy or change: a table dropped and created again since cdcd last streamed
        // it stops here (`state.rs`); then the oids of this run are recorded.
        let oids = catalog::table_oids(&state.client, &state.tables).await?;
        let saved = match self.state.take() {
            Some(store) => {
                let captured: Vec<u32> = oids.keys().copied().collect();
                let attnums = catalog::column_attnums(&state.client, &captured).await?;
                let recorded = check_table_oids(store.as_ref(), &oids, &attnums, &resume).await?;
                Some((store, recorded))
            }
            None => None,
        };
        let mut types: HashMap<u32, Option<TypeInfo>> = HashMap::new();
        if resume.copy_only {
            // A resync's copy job: the tables whole at a temporary slot's snapshot, complete
            // exactly at its consistent point, and no stream (`pipeline/resync.rs` says why
            // exactly, not with an upsert window).
            let temporary = format!("{}_resync", cfg.slot);
            copy_exactly(
                &cfg,
                &state,
                &mut types,
                &resume.copy,
                &events,
                &shutdown,
                &temporary,
            )
            .await?;
            return Ok(());
        }
        let mut conn =
            ReplicationConnection::connect_with_options(&cfg, &self.extra_options).await?;
        let start = if resume.snapshot {
            let copied =
                initial_copy(&cfg, &state, &mut types, &mut conn, &events, &shutdown).await?;
            match copied {
                Some(point) => point,
                None => return conn.finish().await,
            }
        } else {
            let started = stream_start(
                &cfg, &state, &mut types, &mut conn, &resume, &events, &shutdown,
            )
            .await?;
            match started {
                Some(start) => start,
                None => return conn.finish().await,
            }
        };
        wait_slot_released(&state.client, &cfg.slot).await?;
        start_replication(&mut conn, &state, &cfg.slot, start).await?;
        let assembler = assembler_for(&cfg, &state, oids, &resume, saved.as_ref(), types);
        let stream = Streaming {
            conn,
            client: &state.client,
            assembler,
            events,
            acks,
            acked: Lsn::ZERO,
            delivered: start,
            last_skipped_beat: None,
            saved,
            streamed_reads: Vec::new(),
        };
        stream_until_lost(stream, &cfg, &shutdown).await
    }
}

/// Where streaming starts when no initial copy runs: the checkpoint (the slot created if it is
/// missing), after the tables the pipeline names are copied at a new snapshot. `None`: shutdown
/// came during that copy.
async fn stream_start(
    cfg: &PostgresConfig,
    state: &PreparedState,
    types: &mut HashMap<u32, Option<TypeInfo>>,
    conn: &mut ReplicationConnection,
    resume: &Resume,
    events: &mpsc::Sender<SourceEvent>,
    shutdown: &CancellationToken,
) -> Result<Option<Lsn>, SourceError> {
    if setup::slot_exists(&state.client, &cfg.slot)
        .await?
        .is_none()
    {
        let point = conn.create_slot_without_snapshot(&cfg.slot).await?;
        tracing::info!(slot = %cfg.slot, consistent_point = %point, "created replication slot");
    }
    let start = match &resume.start {
        Some(Position::Postgres(lsn)) => *lsn,
        Some(other) => {
            return Err(SourceError::Config(format!(
                "checkpoint {other} is not a Postgres position"
            )))
        }
        None => Lsn::ZERO,
    };
    if !resume.copy.is_empty() {
        let copied =
            copy_at_new_snapshot(cfg, state, types, start, &resume.copy, events, shutdown).await?;
        if !copied {
            return Ok(None);
        }
    }
    Ok(Some(start))
}

/// START_REPLICATION on `slot` at `start`, with the options the server's protocol version takes;
/// a refusal is explained from the slot's state.
async fn start_replication(
    conn: &mut ReplicationConnection,
    state: &PreparedState,
    slot: &str,
    start: Lsn,
) -> Result<(), SourceError> {
    let opts = StartOptions {
        proto_version: state.proto_version,
        publications: state.publications.clone(),
        streaming: state.proto_version >= 2,
        // The `messages` option exists from Postgres 14 (proto 2); it carries the optional
        // DDL trigger's renames (`ddl.rs`).
        messages: state.proto_version >= 2,
    };
    if let Err(e) = conn.start(slot, start, &opts).await {
        return Err(monitor::explain_start_error(&state.client, slot, e).await);
    }
    tracing::info!(slot = %slot, start = %start, proto_version = opts.proto_version, "replication started");
    Ok(())
}

/// The assembler of this run: the captured tables with their oids, keys, the DDL the state
/// file recorded, and the types the copy already looked up.
fn assembler_for(
    cfg: &PostgresConfig,
    state: &PreparedState,
    oids: HashMap<u32, TableId>,
    resume: &Resume,
    saved: Option<&(Arc<dyn SourceStateStore>, state::PgSourceState)>,
    types: HashMap<u32, Option<TypeInfo>>,
) -> Assembler {
    let mut assembler = Assembler::new(
        AssemblerConfig {
            proto_version: state.proto_version,
            stream_memory_bytes: cfg.stream_memory_bytes,
            spill_dir: cfg.spill_dir.clone(),
        },
        state.tables.iter().cloned(),
        state.keys.clone(),
    );
    assembler.set_table_oids(oids);
    // Copied now, from their current shape: a replay of their older DDL is no reason to stop.
    assembler.copied_now(resume.copy.iter().map(|c| c.table.clone()).collect());
    if let Some((_, recorded)) = saved {
        assembler.seed_ddl(recorded.ddl(&state.tables));
    }
    let known: Vec<u32> = types.keys().copied().collect();
    assembler.add_types(
        &known,
        types
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .collect(),
    );
    assembler
}

/// Runs `stream` until shutdown or an error, beside the slot watch, which ends it only for a
/// lost slot and stops with it.
async fn stream_until_lost(
    mut stream: Streaming<'_>,
    cfg: &PostgresConfig,
    shutdown: &CancellationToken,
) -> Result<(), SourceError> {
    let watch_stop = shutdown.child_token();
    let _watch_guard = watch_stop.clone().drop_guard();
    let mut watch = tokio::spawn(monitor::run(cfg.clone(), watch_stop));
    let lost = async {
        match (&mut watch).await {
            Ok(Err(e)) => e,
            _ => std::future::pending().await,
        }
    };
    let result = tokio::select! {
        r = stream.run(shutdown) => r,
        e = lost => Err(e),
    };
    match result {
        Ok(()) => stream.conn.finish().await,
        Err(e) => Err(e),
    }
}

/// Waits until no walsender holds `slot` (a killed predecessor's session lingers until Postgres
/// notices the closed socket); gives up after [`SLOT_RELEASE_WAIT`] and lets START fail clearly.
async fn wait_slot_released(client: &Client, slot: &str) -> Result<(), SourceError> {
    let deadline = Instant::now() + SLOT_RELEASE_WAIT;
    while let Some(info) = setup::slot_exists(client, slot).await? {
        if !info.active || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// Sends `event` unless shutdown comes first (`Ok(false)`); the bounded channel is the
/// backpressure.
async fn deliver(
    events: &mpsc::Sender<SourceEvent>,
    event: SourceEvent,
    shutdown: &CancellationToken,
) -> Result<bool, SourceError> {
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => Ok(false),
        r = events.send(event) => r.map(|_| true).map_err(|_| SourceError::Closed),
    }
}

/// Stops when a captured table's oid is not the one cdcd last streamed (`state.rs`): it was
/// dropped and created again meanwhile, and only a new copy makes its lake table right; the
/// same for a column dropped and added again (its number in `attnums` changed). Tables copied
/// now (all of them for a fresh copy) are exempt. Then records `oids` and `attnums`, and returns
/// the state (a fresh copy forgets earlier renames: its tables are created under today's names).
async fn check_table_oids(
    store: &dyn SourceStateStore,
    oids: &HashMap<u32, TableId>,
    attnums: &HashMap<u32, std::collections::BTreeMap<String, i16>>,
    resume: &Resume,
) -> Result<state::PgSourceState, SourceError> {
    let mut recorded = match store.read().await? {
        Some(bytes) => state::PgSourceState::from_json(&bytes).map_err(|e| {
            SourceError::Config(format!(
                "the pipeline's source-state.json under _cdcd/ is unreadable ({e}); restore it or delete it"
            ))
        })?,
        None => state::PgSourceState::default(),
    };
    if !resume.snapshot {
        let copying: Vec<TableId> = resume.copy.iter().map(|c| c.table.clone()).collect();
        if let Some((table, was, now)) = recorded.recreated(oids, &copying).into_iter().next() {
            return Err(SourceError::Table {
                table: table.clone(),
                detail: format!(
                    "the table was dropped and created again since cdcd last streamed it (oid {was}, now {now}): changes the new table had before it joined the publication were never published, and its lake table still holds the old table's rows. Copy it anew: `cdcd resync --table {table}`, then start cdcd (or drop its lake table and restart cdcd)"
                ),
            });
        }
        let mut captured: Vec<(&u32, &TableId)> = oids.iter().collect();
        captured.sort_by_key(|(_, t)| *t);
        for (oid, table) in captured {
            let Some(now) = attnums.get(oid).filter(|_| !copying.contains(table)) else {
                continue;
            };
            if let Some(readded) = recorded.readded(table, now).into_iter().next() {
                return Err(state::readded_column(table, &readded));
            }
        }
    }
    let before = recorded.clone();
    // A table copied now is created from its current shape: what the DDL trigger said of its
    // past no longer applies to it.
    if resume.snapshot {
        recorded.former_names.clear();
        recorded.dropped_columns.clear();
    }
    for copy in &resume.copy {
        recorded.forget_ddl(&copy.table);
    }
    recorded.record(oids);
    for (oid, table) in oids {
        if let Some(now) = attnums.get(oid) {
            recorded.set_attnums(table, now.clone());
        }
    }
    if recorded != before {
        store.write(recorded.to_json()).await?;
    }
    Ok(recorded)
}
