//! The pipeline: source events in, table commits out, acknowledgements back to the source.
//!
//! ```text
//! Source::run ──events (bounded)──► Pipeline ──commit per table──► Sink
//!      ▲                                │
//!      └──────── acks (watch) ◄─────────┘  only positions every table has committed
//! ```
//!
//! The pipeline buffers changes per table and commits a table when its oldest buffered change is
//! `commit_interval_ms` old, the largest tables when `commit_max_rows` changes are buffered, a
//! table at the end of its initial copy, and everything at shutdown (`pipeline/cadence.rs`); the
//! tables of a round commit concurrently (`pipeline/commit.rs`). Each commit is one table snapshot
//! carrying the table's checkpoint. The source learns a new durable position only when every table
//! holds everything up to it: a table still waiting for its commit holds it back (STYLE rule 6).
//! A round commits in the background while the pipeline reads on, at most one at a time; only
//! plain row changes are read beside it, anything else waits for it (`pipeline/commit.rs`). Past
//! `commit_max_rows` or the buffers' memory share (counting the round in flight) the pipeline
//! waits for the round and reads nothing, so the bounded event channel fills and the source stops
//! reading: that is the backpressure.
//!
//! Initial copies (source-neutral): a copy's rows are committed at the incomplete position with the
//! copy's progress (`cdcd.snapshot`: the chunk plan, chunks started, chunks done), so a restart
//! hands the source only what is left ([`Resume::copy`]) and keeps the slot. Copy batches are
//! large ([`SNAPSHOT_BATCH_ROWS`], [`SNAPSHOT_BATCH_BYTES`]: few snapshots, few index runs) and
//! are committed in the background while the next one is read (`pipeline/commit.rs`). A table copied at a
//! snapshot newer than where streaming starts (a resumed copy, a table added to `tables`) gets an
//! upsert window (`cdcd.upsert_until`): its changes up to that position are replayed over rows
//! that may already reflect them, so inserts become updates (upserts); every change is keyed and
//! carries whole rows, so the replay converges (the argument is in
//! `sources/postgres/snapshot/mod.rs`).
//!
//! Files: this one is the loop, the resume decision and the streamed transactions;
//! `pipeline/tables.rs` the per-table books (buffers, committed checkpoints, copy progress,
//! upsert windows); `pipeline/cadence.rs` which tables are due and what may be acknowledged;
//! `pipeline/commit.rs` a round of commits carried out (awaited or in the background) and the
//! acknowledgement; `pipeline/copy.rs` the initial copy's events; `pipeline/upsert.rs` the
//! upsert window's rewrite; `pipeline/progress.rs` the MySQL restart position; `pipeline/lag.rs`
//! the lag gauge.
//!
//! Exactly-once: on start each table's checkpoint is read back; a transaction at or below it is
//! already in the table and is skipped for that table. The source resumes from the oldest
//! checkpoint, never from later, so no table misses a change; for MySQL/MariaDB a table's
//! checkpoint is first raised to the pipeline's stored progress where that is sound, so an idle
//! table does not hold the start back (`pipeline/progress.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::changelog::{Op, Position, TableChanges, TableId, Transaction};
use crate::checkpoint::progress::{Progress, ProgressError, ProgressStore};
use crate::checkpoint::resync::{ResyncError, ResyncStore};
use crate::config::{SchemaChangePolicy, SnapshotMode};
use crate::memory_budget::MemoryBudget;
use crate::metrics as m;
use crate::sinks::{Sink, SinkError};
use crate::sources::{
    Prepared, Resume, SnapshotProgress, Source, SourceError, SourceEvent, SourceStateStore,
    TableCopy,
};

/// Events buffered between the source and the pipeline. Each event is a whole transaction or a
/// snapshot batch, so this bounds memory in transactions, not rows; [`event_capacity`] lowers it
/// under a small memory budget.
const EVENT_CHANNEL_CAPACITY: usize = 16;
/// What one initial-copy batch event holds at most (the sources cut copy batches at 8 MiB of
/// COPY data): the unit [`event_capacity`] counts in.
const COPY_EVENT_BYTES: usize = 8 << 20;

/// The event channel's capacity under `budget`: as many copy batches as fit in the buffered
/// rows' share, between 2 (one being handed over, one being read) and
/// [`EVENT_CHANNEL_CAPACITY`].
fn event_capacity(budget: &MemoryBudget) -> usize {
    (budget.buffered_rows() / COPY_EVENT_BYTES).clamp(2, EVENT_CHANNEL_CAPACITY)
}

/// Rows of one table's initial copy committed together (the default of
/// `pipeline.snapshot_commit_rows`): one data file, one snapshot, one primary-key index run.
/// Each commit costs a manifest list, a metadata file and an index run whatever its size, so the
/// copy commits large batches, but not too large: measured on a 5M-row copy
/// (`bench/pg_snapshot.py`, deletion vectors), 250k, 500k and 1M rows per commit copied equally
/// fast (0.64-0.65x COPY) at a peak RSS of 164, 251 and 344 MiB. A crash re-copies at most the
/// chunks not yet committed.
pub const SNAPSHOT_BATCH_ROWS: usize = 250_000;
/// Arrow bytes of initial-copy rows buffered, over all tables, before one is committed (wide
/// rows reach this first). With one batch committing in the background while the next fills,
/// the copy holds at most about twice this in rows, whatever the table size.
pub const SNAPSHOT_BATCH_BYTES: usize = 64 << 20;

/// When buffered initial-copy rows are committed: [`SNAPSHOT_BATCH_ROWS`] and
/// [`SNAPSHOT_BATCH_BYTES`], smaller in tests.
#[derive(Debug, Clone, Copy)]
struct SnapshotBatch {
    rows: usize,
    bytes: usize,
}

impl Default for SnapshotBatch {
    fn default() -> Self {
        SnapshotBatch {
            rows: SNAPSHOT_BATCH_ROWS,
            bytes: SNAPSHOT_BATCH_BYTES,
        }
    }
}

impl SnapshotBatch {
    /// `settings`' rows per commit, and at most half the buffered rows' share of the memory
    /// budget in bytes: one batch fills while the one before commits in the background.
    fn of(settings: &Settings) -> SnapshotBatch {
        SnapshotBatch {
            rows: settings.snapshot_commit_rows,
            bytes: SNAPSHOT_BATCH_BYTES.min(settings.memory_budget.buffered_rows() / 2),
        }
    }
}

/// The pipeline stopped with an error. Nothing was acknowledged past what is committed.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Sink(Box<SinkError>),
    #[error("replication slot {slot} does not exist but tables already hold checkpoints ({tables}): changes made since then are lost to cdcd. Set source.snapshot = \"initial\" to copy the tables again")]
    SlotLost { slot: String, tables: String },
    #[error("the source task ended unexpectedly: {0}")]
    SourceTask(String),
    #[error("{0}")]
    SchemaChangedInTransaction(Box<SchemaChangeStop>),
    #[error(transparent)]
    Progress(#[from] ProgressError),
    #[error(transparent)]
    Resync(#[from] ResyncError),
    #[error("a resync of {table} is requested ({request}), but source.snapshot = \"never\" copies no table: set source.snapshot = \"initial\", or remove the request")]
    ResyncWithoutCopy { table: TableId, request: String },
    #[error("table {table} has no key and REPLICA IDENTITY FULL: cdcd applies its updates and deletes to one row equal to the whole before image (a multiset), which this sink cannot store exactly ({why}); give the table a primary key or name unique NOT NULL columns in source.key_columns, use the iceberg sink, or remove the table from source.tables")]
    MultisetUnsupported { table: TableId, why: &'static str },
}

/// Where and why a schema change inside a transaction stopped the pipeline
/// ([`PipelineError::SchemaChangedInTransaction`]).
#[derive(Debug, thiserror::Error)]
#[error("schema of {table} changed inside the transaction that ends at {position}, which writes the table both before and after the change (columns ({before}) became ({after})): cdcd commits a transaction whole, and one commit cannot store both shapes, so it stopped before that transaction (everything before it is committed, nothing of it). Ways out: set source.schema_change = \"resync\" for the table (`{{ \"{table}\" = \"resync\", \"*\" = \"evolve\" }}`) and start cdcd, which then copies the table again online at a snapshot past this transaction while the other tables stream on; or run `cdcd resync --table {table}` and start cdcd (the same by hand: the copy made at start replays this transaction, finds it again and is copied once more, online, past it); a Postgres RENAME COLUMN replicates in place, also inside such a transaction, once the DDL trigger of migrations/postgres/002_ddl_capture.sql is installed (it applies to renames made after it); or remove the table from source.tables")]
pub struct SchemaChangeStop {
    pub table: TableId,
    pub position: Position,
    pub before: String,
    pub after: String,
}

impl From<SinkError> for PipelineError {
    fn from(e: SinkError) -> Self {
        PipelineError::Sink(Box::new(e))
    }
}

impl PipelineError {
    /// A short label for `cdcd_errors_total{kind}`.
    pub fn kind(&self) -> &'static str {
        match self {
            PipelineError::Source(e) => e.kind(),
            PipelineError::Sink(e) => e.kind(),
            PipelineError::SlotLost { .. } => "slot_lost",
            PipelineError::SourceTask(_) => "source_task",
            PipelineError::SchemaChangedInTransaction(_) => "schema_changed",
            PipelineError::MultisetUnsupported { .. } => "config",
            PipelineError::Progress(_) => "progress",
            PipelineError::Resync(_) => "resync",
            PipelineError::ResyncWithoutCopy { .. } => "config",
        }
    }
}

/// The knobs the pipeline needs, from [`crate::config::Config`].
#[derive(Debug, Clone)]
pub struct Settings {
    pub pipeline: String,
    pub commit_interval: Duration,
    pub commit_max_rows: usize,
    /// Rows of one table's initial copy per commit (`pipeline.snapshot_commit_rows`).
    pub snapshot_commit_rows: usize,
    /// Tables committed at once in a round (`pipeline.commit_concurrency`; `pipeline/commit.rs`).
    pub commit_concurrency: usize,
    pub snapshot: SnapshotMode,
    /// The slot name, for messages.
    pub slot: String,
    /// `_cdcd/<pipeline>/progress.json` (`checkpoint::progress`); `None`: not kept.
    pub progress: Option<ProgressStore>,
    /// Where the source keeps its own durable state ([`Source::keep_state_in`]); `None`: nowhere.
    pub source_state: Option<Arc<dyn SourceStateStore>>,
    /// `_cdcd/<pipeline>/resync/` (`checkpoint::resync`): tables to copy again into a new
    /// lineage, read at start; `None`: no resyncs.
    pub resync: Option<ResyncStore>,
    /// Which of those requests this run takes on, and how (`pipeline/resync.rs`); `None`: every
    /// one, copied before streaming resumes.
    pub resyncs: Option<ResyncPlan>,
    /// Where a resync's copy job holds this run's acknowledgements (`pipeline/resync.rs`).
    pub ack_hold: Option<AckHold>,
    /// `source.schema_change`: with `resync`, a change a table's lake table cannot express
    /// starts its resync instead of a stop (`pipeline/schema_resync.rs`).
    pub schema_change: SchemaChangePolicy,
    /// `pipeline.memory_budget`: the buffered rows' share bounds the buffers in bytes
    /// (`pipeline/cadence.rs`), the copy batches and the event channel.
    pub memory_budget: MemoryBudget,
}

/// Runs a pipeline until `shutdown` is cancelled (then commits what is buffered and returns `Ok`)
/// or something fails.
pub async fn run(
    source: Box<dyn Source>,
    sink: Arc<dyn Sink>,
    settings: Settings,
    shutdown: CancellationToken,
) -> Result<(), PipelineError> {
    let batch = SnapshotBatch::of(&settings);
    run_batched(source, sink, settings, shutdown, batch).await
}

/// [`run`], committing initial-copy rows at `snapshot_batch`.
async fn run_batched(
    mut source: Box<dyn Source>,
    sink: Arc<dyn Sink>,
    settings: Settings,
    shutdown: CancellationToken,
    snapshot_batch: SnapshotBatch,
) -> Result<(), PipelineError> {
    if let Some(store) = &settings.source_state {
        source.keep_state_in(Arc::clone(store));
    }
    let prepared = source.prepare().await?;
    if let (Some(table), Some(why)) = (prepared.multiset.first(), sink.multiset_refusal()) {
        return Err(PipelineError::MultisetUnsupported {
            table: table.clone(),
            why,
        });
    }
    // Per-table settings: refused or applied (a spec evolved) before anything is written.
    sink.prepare(&prepared.tables).await?;
    let mut tables = Tables::default();
    resync::start_resyncs(&prepared, sink.as_ref(), &settings, &mut tables).await?;
    for table in &prepared.tables {
        let cp = sink.checkpoint(table).await?;
        if let Some(cp) = &cp {
            if let Some(until) = &cp.upsert_until {
                tables.upsert_until.insert(table.clone(), until.clone());
            }
            let progress = cp.snapshot.as_deref().and_then(SnapshotProgress::from_json);
            if let (true, Some(progress)) = (cp.position.is_snapshot_incomplete(), progress) {
                tables.progress.insert(table.clone(), progress);
            }
        }
        tables
            .committed
            .insert(table.clone(), cp.map(|c| c.position));
    }
    let stored_progress = match &settings.progress {
        Some(store) => store.read().await?,
        None => None,
    };
    let resume = decide_resume(&prepared, &tables, &settings, stored_progress.as_ref())?;
    if resume.snapshot {
        // A new slot: every table is copied again from scratch at its exported snapshot.
        tables.progress.clear();
        tables.upsert_until.clear();
    }
    // Every table this run copies, before any plan: a source may plan them one at a time.
    let copying: Vec<&TableId> = if resume.snapshot {
        prepared.tables.iter().collect()
    } else {
        resume.copy.iter().map(|c| &c.table).collect()
    };
    tables.copy_meter.expect(copying);
    if let Some(hold) = &settings.ack_hold {
        hold.started_at(resume.start.as_ref());
    }
    info!(
        pipeline = %settings.pipeline,
        tables = prepared.tables.len(),
        start = %resume.start.as_ref().map(ToString::to_string).unwrap_or_else(|| "slot".into()),
        snapshot = resume.snapshot,
        copy = resume.copy.len(),
        "starting"
    );

    let (event_tx, events) = mpsc::channel(event_capacity(&settings.memory_budget));
    let (ack_tx, ack_rx) = watch::channel(None);
    let source_stop = CancellationToken::new();
    let source_task = tokio::spawn(source.run(resume, event_tx, ack_rx, source_stop.clone()));
    let progress = ProgressWriter::start(settings.progress.clone());
    let committer = Committer {
        sink,
        settings,
        tables,
        received: None,
        acked: None,
        acks: ack_tx,
        lag: Lag::default(),
        in_flight: InFlight::default(),
        snapshot_batch,
        progress,
    };
    drive(
        committer,
        events,
        source_task,
        source_stop,
        shutdown,
        Role::Stream,
    )
    .await
    .map(|_| ())
}

/// Who runs the loop: the daemon's streaming pipeline, or a resync's copy job beside it (which
/// leaves the process's health alone and ends when its source has sent the copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Stream,
    CopyJob,
}

/// The loop: source events in, commits out, until `shutdown`, an error, or (a copy job) the
/// source's end; then what is buffered is committed and the source stopped.
async fn drive(
    mut committer: Committer,
    mut events: mpsc::Receiver<SourceEvent>,
    mut source_task: tokio::task::JoinHandle<Result<(), SourceError>>,
    source_stop: CancellationToken,
    shutdown: CancellationToken,
    role: Role,
) -> Result<Committer, PipelineError> {
    let settings = committer.settings.clone();
    let health = m::Health::global();
    if role == Role::Stream {
        health.set_started();
    }
    let mut tick = tokio::time::interval(settings.commit_interval.min(Duration::from_millis(250)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    let outcome: Result<(), PipelineError> = loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => {
                if role == Role::Stream {
                    info!("shutdown requested: committing what is buffered");
                }
                break Ok(());
            }
            // A background round's result comes before more reading (STYLE rule 5); the next
            // round, if one is due, starts right away.
            Some(done) = committer.in_flight.finish(), if committer.in_flight.is_running() => {
                let landed = match committer.settled(done).await {
                    Ok(()) => commit_now(&mut committer, tick.period()).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = landed {
                    break Err(e);
                }
            }
            _ = tick.tick() => {
                if let Err(e) = on_tick(&mut committer, role, health, tick.period()).await {
                    break Err(e);
                }
            }
            event = events.recv() => {
                let Some(event) = event else {
                    // The source ended on its own: its result says why.
                    break source_ended(&mut source_task, role).await;
                };
                if role == Role::Stream {
                    health.source_ok();
                }
                if let Err(e) = committer.handle(event).await {
                    break Err(e);
                }
                // Initial-copy rows are committed by `snapshot_batch`, in the background; counted
                // here they made every copy commit `commit_max_rows` rows, awaited in place.
                // Past the buffers' memory share (with the round in flight) the pipeline waits
                // for that round, then the largest buffers start, and nothing is read meanwhile:
                // the source waits (backpressure), never the memory.
                if committer.over_buffer_limits() {
                    if let Err(e) = committer.relieve(tick.period()).await {
                        break Err(e);
                    }
                }
            }
        }
    };

    let outcome = wind_down(&mut committer, outcome, role, health).await;
    stop_source(&source_stop, &source_task, &mut events).await;
    outcome.map(|()| committer)
}

/// Every tick of [`drive`]: report, take in finished resyncs, and commit what is due (or
/// acknowledge when nothing is buffered).
async fn on_tick(
    committer: &mut Committer,
    role: Role,
    health: &m::Health,
    period: Duration,
) -> Result<(), PipelineError> {
    if role == Role::Stream {
        committer.report(health);
    }
    committer.resyncs_finished().await;
    if committer.in_flight.is_running() {
        // At most one round in flight: the next starts when it lands ([`drive`]).
        committer.acknowledge();
        return Ok(());
    }
    commit_now(committer, period).await
}

/// With no round in flight: swap the resyncs that caught up, start the round of the tables
/// due, and acknowledge.
async fn commit_now(committer: &mut Committer, period: Duration) -> Result<(), PipelineError> {
    committer.catch_up_resyncs().await?;
    committer.commit_due(period).await
}

/// Why the source's channel closed: its task's result (a copy job's source ends when it has sent
/// the copy; a stream's never ends on its own).
async fn source_ended(
    source_task: &mut tokio::task::JoinHandle<Result<(), SourceError>>,
    role: Role,
) -> Result<(), PipelineError> {
    match source_task.await {
        Ok(Ok(())) if role == Role::CopyJob => Ok(()),
        Ok(Ok(())) => Err(PipelineError::SourceTask(
            "the source stopped without an error".into(),
        )),
        Ok(Err(e)) => Err(PipelineError::Source(e)),
        Err(e) => Err(PipelineError::SourceTask(e.to_string())),
    }
}

/// After [`drive`]'s loop: commit what is buffered (when the loop ended cleanly), settle the
/// sink and the progress file, and count the error.
async fn wind_down(
    committer: &mut Committer,
    outcome: Result<(), PipelineError>,
    role: Role,
    health: &m::Health,
) -> Result<(), PipelineError> {
    if role == Role::Stream {
        health.set_stopping();
    }
    let outcome = match outcome {
        // A lineage that caught up swaps before the stop, not at the next start.
        Ok(()) => match committer.flush().await {
            Ok(()) => committer.catch_up_resyncs().await,
            Err(e) => Err(e),
        },
        Err(e) => {
            // A background round still running ends like any commit; its result no longer
            // matters (nothing is acknowledged after an error).
            let _ = committer.in_flight.finish().await;
            Err(e)
        }
    };
    if role == Role::Stream {
        committer.report(health);
    }
    committer.resyncs_finished().await;
    committer.progress.finish().await;
    committer.sink.settle().await;
    if let Err(e) = &outcome {
        // Sink errors were counted where the commit failed.
        if !matches!(e, PipelineError::Sink(_)) {
            metrics::counter!(m::ERRORS_TOTAL, m::LABEL_PIPELINE => committer.settings.pipeline.clone(), m::LABEL_KIND => e.kind())
                .increment(1);
        }
    }
    outcome
}

/// Stops the source after the final ack is out; drains so a source blocked on a full channel
/// sees the cancellation. Drained events are not acknowledged: the source resends them.
async fn stop_source(
    source_stop: &CancellationToken,
    source_task: &tokio::task::JoinHandle<Result<(), SourceError>>,
    events: &mut mpsc::Receiver<SourceEvent>,
) {
    source_stop.cancel();
    if !source_task.is_finished() {
        let drain = async { while events.recv().await.is_some() {} };
        if tokio::time::timeout(Duration::from_secs(10), drain)
            .await
            .is_err()
        {
            warn!("the source did not stop within 10 s");
        }
    }
}

/// Where to start the source, from the slot's existence, the tables' checkpoints and the stored
/// pipeline progress.
fn decide_resume(
    prepared: &Prepared,
    tables: &Tables,
    settings: &Settings,
    stored_progress: Option<&Progress>,
) -> Result<Resume, PipelineError> {
    let checkpoints: Vec<&Position> = tables.committed.values().flatten().collect();
    let start = progress::start_position(&tables.committed, stored_progress);
    match settings.snapshot {
        SnapshotMode::Initial if !prepared.slot_exists => Ok(Resume {
            start: None,
            snapshot: true,
            copy: Vec::new(),
            copy_only: false,
        }),
        SnapshotMode::Initial => {
            // The slot stays: only the tables without a completed copy are copied, each from
            // where its last commit left it, at a new snapshot.
            let copy: Vec<TableCopy> = tables
                .committed
                .iter()
                .filter(|(_, cp)| cp.as_ref().is_none_or(|p| p.is_snapshot_incomplete()))
                .map(|(t, _)| TableCopy {
                    table: t.clone(),
                    progress: tables.progress.get(t).cloned(),
                })
                .collect();
            for c in &copy {
                match &c.progress {
                    Some(p) => {
                        info!(table = %c.table, chunks = p.chunks.len(), done = p.done.len(), "resuming an interrupted initial copy")
                    }
                    None => {
                        info!(table = %c.table, "copying a table without a completed initial copy")
                    }
                }
            }
            Ok(Resume {
                start,
                snapshot: false,
                copy,
                copy_only: false,
            })
        }
        SnapshotMode::Never => {
            if !prepared.slot_exists && !checkpoints.is_empty() {
                let tables = tables
                    .committed
                    .iter()
                    .filter(|(_, cp)| cp.is_some())
                    .map(|(t, _)| t.to_string())
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(PipelineError::SlotLost {
                    slot: settings.slot.clone(),
                    tables,
                });
            }
            Ok(Resume {
                start,
                snapshot: false,
                copy: Vec::new(),
                copy_only: false,
            })
        }
    }
}

/// Owns the buffers and the commit/ack bookkeeping.
struct Committer {
    sink: Arc<dyn Sink>,
    settings: Settings,
    tables: Tables,
    /// Every transaction at or before this position has been received (and is buffered,
    /// committed, or was skipped).
    received: Option<Position>,
    acked: Option<Position>,
    acks: watch::Sender<Option<Position>>,
    /// `cdcd_source_lag_seconds`: the oldest change received and not yet durable.
    lag: Lag,
    /// An initial-copy batch being committed in the background.
    in_flight: InFlight,
    snapshot_batch: SnapshotBatch,
    progress: ProgressWriter,
}

impl Committer {
    async fn handle(&mut self, event: SourceEvent) -> Result<(), PipelineError> {
        // Only plain row changes are read beside a round in flight; anything else waits for it
        // to land first (`pipeline/commit.rs`).
        if self.in_flight.is_round() && !self.is_plain(&event) {
            self.settle().await?;
        }
        match event {
            SourceEvent::Transaction(tx) => self.transaction(tx).await?,
            SourceEvent::Heartbeat(position) => {
                self.lag.heard();
                self.advance_received(position);
                self.acknowledge();
            }
            // A parked table's copy (a lineage given up: `pipeline/schema_resync.rs`) goes
            // nowhere: its resync copies it again.
            SourceEvent::SnapshotRows(changes)
                if self.tables.parked.contains(&changes.schema.id) => {}
            SourceEvent::SnapshotPlan { table, .. }
            | SourceEvent::SnapshotChunk { table, .. }
            | SourceEvent::SnapshotUpsertUntil { table, .. }
            | SourceEvent::SnapshotDone { table, .. }
                if self.tables.parked.contains(&table) => {}
            SourceEvent::SnapshotRows(changes) => self.copy_rows(changes).await?,
            SourceEvent::SnapshotPlan {
                table,
                chunks,
                estimated_rows,
                estimated_bytes,
            } => self.copy_plan(table, chunks, estimated_rows, estimated_bytes),
            SourceEvent::SnapshotChunk {
                table,
                chunk,
                state,
            } => self.copy_chunk(&table, chunk, state)?,
            SourceEvent::SnapshotUpsertUntil { table, until } => {
                self.tables.upsert_until.insert(table, until);
            }
            SourceEvent::SnapshotDone { table, position } => {
                self.copy_done(&table, position).await?
            }
        }
        Ok(())
    }

    /// A heartbeat, or a transaction of row changes only: no truncate, and every table's rows
    /// under the schema its last buffered or committing rows had (or its first rows).
    fn is_plain(&self, event: &SourceEvent) -> bool {
        let SourceEvent::Transaction(tx) = event else {
            return matches!(event, SourceEvent::Heartbeat(_));
        };
        tx.changes.iter().all(|c| {
            let same_schema = self
                .tables
                .schemas
                .get(&c.schema.id)
                .is_none_or(|s| Arc::ptr_eq(s, &c.schema) || **s == *c.schema);
            same_schema && !c.ops.contains(&Op::Truncate)
        })
    }

    /// Past `commit_max_rows` or the buffers' memory share, counting the round in flight.
    fn over_buffer_limits(&self) -> bool {
        let rows = self.tables.streamed_rows() + self.in_flight.streamed_rows();
        let bytes = self.tables.streamed_bytes() + self.in_flight.streamed_bytes();
        rows >= self.settings.commit_max_rows
            || bytes >= self.settings.memory_budget.buffered_rows()
    }

    /// Over the limits: waits for the round in flight, then starts the next one at once (the
    /// tables due within `period`, and the largest buffers if they alone are still over:
    /// [`cadence::Cadence::pick`]), as [`drive`] does when it sees a round land. Waiting for
    /// the next tick instead left the commits idle between rounds exactly when the pipeline is
    /// behind (1,000 tables, before this: lag p50 31 s, main 3 s).
    async fn relieve(&mut self, period: Duration) -> Result<(), PipelineError> {
        let landed = self.in_flight.is_running();
        self.settle().await?;
        if landed {
            commit_now(self, period).await
        } else {
            self.commit_due(Duration::ZERO).await
        }
    }

    async fn transaction(&mut self, tx: Transaction) -> Result<(), PipelineError> {
        metrics::counter!(m::TRANSACTIONS_TOTAL, m::LABEL_PIPELINE => self.settings.pipeline.clone())
            .increment(1);
        loop {
            match self.reshaped_inside(&tx) {
                Reshaped::No => break,
                Reshaped::Evolves => {
                    // The buffered transactions were read under the old schema: they are
                    // committed under it, so only this transaction's own earlier runs are
                    // rewritten to the new one ([`Self::schema_switch`]).
                    self.flush().await?;
                    break;
                }
                Reshaped::Stop(stop) => {
                    // Everything buffered belongs to earlier, whole transactions: commit it, so
                    // the stop (or the resync instead) lands exactly at this transaction's start.
                    self.flush().await?;
                    let cause = format!(
                        "columns ({}) became ({}) inside one transaction that writes the table under both",
                        stop.before, stop.after
                    );
                    if !self
                        .resync_instead(&stop.table, &cause, &tx.position)
                        .await?
                    {
                        return Err(PipelineError::SchemaChangedInTransaction(stop));
                    }
                    // The table is parked now: the other tables' runs are looked at again.
                }
            }
        }
        let mut buffered = false;
        for mut changes in tx.changes {
            if changes.is_empty() || self.tables.parked.contains(&changes.schema.id) {
                continue;
            }
            if self.tables.is_committed(&changes.schema.id, &tx.position) {
                debug!(table = %changes.schema.id, position = %tx.position, "already committed: skipped");
                continue;
            }
            self.tables.upsert_in_window(&mut changes, &tx.position)?;
            self.schema_switch(&changes, Some(&tx.position)).await?;
            // Parked by the switch (its table's resync has the change now).
            if self.tables.parked.contains(&changes.schema.id) {
                continue;
            }
            let opened = Opened {
                after: self.received.clone(),
                commit_micros: tx.commit_time_micros,
            };
            self.tables.push(changes, &tx.position, Some(opened));
            buffered = true;
        }
        if buffered {
            if self.in_flight.is_round() {
                crate::failpoints::crash_point(crate::failpoints::ROUND_READ_BESIDE);
            }
            self.lag.waiting(tx.commit_time_micros);
        } else {
            self.lag.heard();
        }
        self.advance_received(tx.position);
        metrics::gauge!(m::BUFFERED_ROWS, m::LABEL_PIPELINE => self.settings.pipeline.clone())
            .set(self.tables.buffered_rows as f64);
        Ok(())
    }

    /// The first schema change inside `tx` that its rows cannot cross, if any: two runs of one
    /// table whose rows do not fit one commit ([`crate::changelog::TableSchema::rows_fit`]).
    ///
    /// Why a transaction is never split at a schema change: a commit's checkpoint says "this
    /// table holds every change up to this position", and a position names a whole transaction.
    /// Committing the runs before a mid-transaction DDL at the transaction's position made the
    /// table claim changes it did not hold yet; its later changes of the same transaction were
    /// then skipped as committed, and a crash in between lost them too. So every commit ends at
    /// a transaction boundary: runs whose rows fit are committed together under the newest
    /// schema, runs whose schema evolves to the newer one ([`TableSchema::evolves_to`]: added
    /// columns, widened types) are rewritten to it and committed together too, and a transaction
    /// whose runs do neither stops the pipeline before any of it is committed.
    fn reshaped_inside(&self, tx: &Transaction) -> Reshaped {
        let mut evolves = false;
        let mut last: BTreeMap<&TableId, &TableChanges> = BTreeMap::new();
        for changes in tx.changes.iter().filter(|c| !c.is_empty()) {
            let table = &changes.schema.id;
            if self.tables.is_committed(table, &tx.position) || self.tables.parked.contains(table) {
                continue;
            }
            if let Some(before) = last.insert(table, changes) {
                if before.schema.rows_fit(&changes.schema) {
                    continue;
                }
                if before.schema.evolves_to(&changes.schema) {
                    evolves = true;
                } else {
                    return Reshaped::Stop(Box::new(SchemaChangeStop {
                        table: table.clone(),
                        position: tx.position.clone(),
                        before: before.schema.describe_columns(),
                        after: changes.schema.describe_columns(),
                    }));
                }
            }
        }
        if evolves {
            Reshaped::Evolves
        } else {
            Reshaped::No
        }
    }

    /// A table's schema changed between its buffered changes and `changes`: commit what was
    /// buffered under the old schema first, unless its rows fit the new one. For a streamed
    /// transaction (`open`: its position) the buffer then holds only whole transactions before
    /// it ([`Self::reshaped_inside`] has ruled out a change inside this one); committing a buffer
    /// at the position of the transaction being read is refused, never done. Initial-copy rows
    /// (`open` = `None`) sit at the incomplete position, which no acknowledgement depends on.
    async fn schema_switch(
        &mut self,
        changes: &TableChanges,
        open: Option<&Position>,
    ) -> Result<(), PipelineError> {
        let table = &changes.schema.id;
        let Some(buffer) = self.tables.buffers.get(table) else {
            return Ok(());
        };
        if buffer.schema.rows_fit(&changes.schema) {
            return Ok(());
        }
        if let Some(position) = open.filter(|p| buffer.position == **p) {
            if buffer.schema.evolves_to(&changes.schema) {
                // Only this transaction is buffered (`transaction` flushed the ones before).
                return self.tables.evolve(&changes.schema).map_err(|source| {
                    PipelineError::Sink(Box::new(SinkError::Arrow {
                        context: format!("rewriting the rows of {table} to its new schema"),
                        source,
                    }))
                });
            }
            let stop = Box::new(SchemaChangeStop {
                table: table.clone(),
                position: position.clone(),
                before: buffer.schema.describe_columns(),
                after: changes.schema.describe_columns(),
            });
            let cause = format!(
                "columns ({}) became ({}) inside one transaction that writes the table under both",
                stop.before, stop.after
            );
            let position = position.clone();
            // Its buffer holds only this transaction: parked, it is dropped with the rest of it.
            if self.resync_instead(&stop.table, &cause, &position).await? {
                return Ok(());
            }
            return Err(PipelineError::SchemaChangedInTransaction(stop));
        }
        let table = table.clone();
        self.commit_table(&table).await
    }

    /// Reports the loop's turn to [`m::Health`] and refreshes the gauges that change with time
    /// (lag) or with commits (buffered rows, the index memory). Called per tick, not per event.
    fn report(&self, health: &m::Health) {
        let oldest = self
            .tables
            .oldest()
            .into_iter()
            .chain(self.in_flight.since());
        health.pipeline_turn(oldest.min());
        let pipeline = || self.settings.pipeline.clone();
        if let Some(lag) = self.lag.seconds(m::unix_now_micros()) {
            metrics::gauge!(m::SOURCE_LAG_SECONDS, m::LABEL_PIPELINE => pipeline()).set(lag);
        }
        metrics::gauge!(m::BUFFERED_ROWS, m::LABEL_PIPELINE => pipeline())
            .set(self.tables.buffered_rows as f64);
        let index = crate::memory_budget::index_memory();
        for (part, bytes) in [
            (m::INDEX_PART_MEMTABLES, index.memtables()),
            (m::INDEX_PART_RUN_METAS, index.runs()),
            (m::INDEX_PART_BLOCK_CACHE, index.cached()),
        ] {
            metrics::gauge!(m::INDEX_MEMORY_BYTES, m::LABEL_PIPELINE => pipeline(), m::LABEL_PART => part)
                .set(bytes as f64);
        }
    }
}

/// What [`Committer::reshaped_inside`] found in a transaction.
enum Reshaped {
    /// No table's schema changed between its runs, or only in ways its rows fit.
    No,
    /// A table's schema evolved between its runs: its earlier runs are rewritten to the new one.
    Evolves,
    /// A change the rows cannot cross.
    Stop(Box<SchemaChangeStop>),
}

/// `cdcd_changes_total{table,op}`, counted per batch.
fn count_ops(pipeline: &str, table: &TableId, changes: &TableChanges) {
    let mut counts = [0u64; 4];
    for op in &changes.ops {
        counts[*op as usize] += 1;
    }
    for op in [
        crate::changelog::Op::Insert,
        crate::changelog::Op::Update,
        crate::changelog::Op::Delete,
        crate::changelog::Op::Truncate,
    ] {
        let n = counts[op as usize];
        if n > 0 {
            metrics::counter!(m::CHANGES_TOTAL, m::LABEL_PIPELINE => pipeline.to_owned(), m::LABEL_TABLE => table.to_string(), m::LABEL_OP => op.as_str())
                .increment(n);
        }
    }
}

mod upsert;

mod commit;
use commit::InFlight;

mod copy;

mod copy_meter;

mod lag;
use lag::Lag;

mod progress;
use progress::ProgressWriter;

mod tables;
use tables::{Opened, TableBuffer, Tables};

mod cadence;

mod schema_resync;

mod resync;
pub use resync::{copy_for_resync, mode_at_start, AckHold, ResyncCopy, ResyncPlan};

#[cfg(test)]
mod tests;
