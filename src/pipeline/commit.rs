//! Table commits taken out of the pipeline's buffers and carried out: a round of tables together,
//! up to `pipeline.commit_concurrency` at once or in one catalog transaction ([`run_together`]),
//! awaited in place or on a background task while the pipeline keeps reading ([`InFlight`]); or
//! one table awaited in place ([`Committer::commit_table`](super::Committer)). Which tables a round
//! holds is `pipeline/cadence.rs`'s decision.
//!
//! Why in the background: a round of streamed changes over many tables, or a batch of an initial
//! copy (up to [`super::SNAPSHOT_BATCH_ROWS`] rows), takes a second or more. Awaited in place, the
//! source would stop at the full event channel for that long, and every change arriving meanwhile
//! would wait behind the round; as a task, the next changes are read and buffered (in fresh
//! per-table buffers) while this round is written. The protocol:
//! - **At most one round in flight.** A new one starts only once the previous one ended and its
//!   outcome is recorded ([`Committer::settle`](super::Committer)), so a table's commits land in
//!   order: rows buffered for a table while its commit is in flight are committed by a later round.
//! - **Only plain row changes are read beside a round.** Anything else (a transaction that
//!   changes a table's schema or truncates it, an initial copy's events, a resync's swap, the
//!   commit of one table in place, shutdown and wind-down) first waits for the round to end.
//!   A copy batch in flight is waited for only by the next commit (the copy reads on beside it).
//! - **The acknowledgement** never passes a table whose commit is in flight: the commits in
//!   flight hold it back exactly as waiting buffers do ([`cadence::durable_bound`]), and a copy
//!   batch holds it whole.
//! - **Memory.** The streamed rows in flight count with the buffers against `commit_max_rows`
//!   and the memory budget's share: past them the pipeline waits for the round (reads nothing:
//!   backpressure) before it starts the next one.
//! - **Errors.** A round's failure is seen when it is settled: what landed is recorded, a refused
//!   schema change may be left to a resync and the rest committed again in place; any other error
//!   stops the pipeline, whose buffers are never acknowledged, so the restart reads them again.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures::stream::{self, StreamExt};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::cadence;
use super::schema_resync::refused_table;
use super::tables::Opened;
use super::{Committer, PipelineError};
use crate::changelog::{Position, TableChanges, TableId, TableSchema};
use crate::checkpoint::Checkpoint;
use crate::failpoints;
use crate::metrics as m;
use crate::sinks::{CommitStats, Sink, SinkError, TableCommit};
use crate::sources::SnapshotProgress;

/// A commit taken out of the buffers: everything the sink needs, owned, so it can run on a task.
pub(super) struct PendingCommit {
    pub table: TableId,
    pub schema: Arc<TableSchema>,
    pub changes: Vec<TableChanges>,
    pub rows: usize,
    pub checkpoint: Checkpoint,
    /// The upsert window recorded in `checkpoint` (`None`: the window is closed by this commit).
    pub window: Option<Position>,
    /// Where the buffer of streamed changes opened (`None`: initial-copy rows): what the commit
    /// holds the acknowledgement back to while it runs.
    pub opened: Option<Opened>,
    /// Arrow bytes of `changes`.
    pub bytes: usize,
    /// When the buffer's first change arrived.
    pub since: Instant,
}

/// What the pipeline records once a commit is durable.
pub(super) struct Committed {
    pub table: TableId,
    pub checkpoint: Checkpoint,
    pub window: Option<Position>,
    /// The commit ended the table's resync ([`CommitStats::resync_swapped`]).
    pub swapped: bool,
}

/// Counts a failed commit and marks the sink unhealthy.
fn failed(pipeline: &str, e: &SinkError) {
    metrics::counter!(m::ERRORS_TOTAL, m::LABEL_PIPELINE => pipeline.to_owned(), m::LABEL_KIND => e.kind())
        .increment(1);
    m::Health::global().sink_failed(e.to_string());
}

/// A round's commits that did not all land: the first error, the commits that landed (beside
/// the failed ones, or before them), and the rest, the failed ones first, then those not started.
pub(super) struct Unfinished {
    pub error: SinkError,
    pub committed: Vec<Committed>,
    pub left: Vec<PendingCommit>,
}

/// Commits every table of a round through `sink`: in one request where its catalog commits
/// several tables in one transaction ([`Sink::commits_tables_together`]), else up to
/// `concurrency` tables at once ([`run_concurrently`]); then emits each commit's metrics and
/// log line.
pub(super) async fn run_together(
    pending: Vec<PendingCommit>,
    sink: Arc<dyn Sink>,
    pipeline: &str,
    concurrency: usize,
) -> Result<Vec<Committed>, Unfinished> {
    if pending.len() < 2 || !sink.commits_tables_together().await {
        let limit = if sink.commits_tables_concurrently() {
            concurrency.max(1)
        } else {
            1
        };
        return run_concurrently(pending, sink.as_ref(), pipeline, limit).await;
    }
    let started = Instant::now();
    let commits: Vec<TableCommit<'_>> = pending
        .iter()
        .map(|p| TableCommit {
            schema: &p.schema,
            changes: &p.changes,
            checkpoint: &p.checkpoint,
        })
        .collect();
    let stats = match sink.commit_tables(&commits).await {
        Ok(stats) => stats,
        // All or nothing: none of them landed.
        Err(error) => {
            failed(pipeline, &error);
            drop(commits);
            return Err(Unfinished {
                error,
                committed: Vec::new(),
                left: pending,
            });
        }
    };
    drop(commits);
    m::Health::global().sink_ok();
    let elapsed = started.elapsed();
    Ok(pending
        .into_iter()
        .zip(stats)
        .map(|(p, s)| p.record(s, elapsed, pipeline))
        .collect())
}

/// Commits `pending` (one commit per table) with at most `limit` running at once, so a round
/// costs about its slowest commits, not the sum of all.
///
/// Why every outcome is awaited, even after an error: a commit cut off mid-way may or may not
/// have published, and the pipeline must know exactly which landed (their checkpoints are
/// recorded, the rest are retried or left to the restart). Once one fails no further commit
/// starts: the round is given up, and what has not started is left as it was.
async fn run_concurrently(
    pending: Vec<PendingCommit>,
    sink: &dyn Sink,
    pipeline: &str,
    limit: usize,
) -> Result<Vec<Committed>, Unfinished> {
    let given_up = AtomicBool::new(false);
    let outcomes: Vec<(PendingCommit, Option<Attempt>)> = stream::iter(pending)
        .map(|p| {
            let given_up = &given_up;
            async move {
                if given_up.load(Ordering::Acquire) {
                    return (p, None);
                }
                let attempt = p.attempt(sink, pipeline).await;
                if attempt.is_err() {
                    given_up.store(true, Ordering::Release);
                }
                (p, Some(attempt))
            }
        })
        .buffer_unordered(limit)
        .collect()
        .await;
    let mut committed = Vec::with_capacity(outcomes.len());
    let mut error: Option<SinkError> = None;
    let mut failed_left = Vec::new();
    let mut not_started = Vec::new();
    for (p, attempt) in outcomes {
        match attempt {
            Some(Ok((stats, elapsed))) => committed.push(p.record(stats, elapsed, pipeline)),
            Some(Err(e)) => {
                match &error {
                    None => error = Some(e),
                    // The first error is the round's; the others are logged (and were counted).
                    Some(_) => {
                        warn!(table = %p.table, error = %e, "commit failed in the same round")
                    }
                }
                failed_left.push(p);
            }
            None => not_started.push(p),
        }
    }
    match error {
        None => Ok(committed),
        Some(error) => {
            // A commit that landed after the failure marked the sink healthy again.
            m::Health::global().sink_failed(error.to_string());
            // The error's own commit first (`commit_round` looks for the table it names).
            failed_left.extend(not_started);
            Err(Unfinished {
                error,
                committed,
                left: failed_left,
            })
        }
    }
}

/// A commit's outcome: its stats and how long it took, or why it failed.
type Attempt = Result<(CommitStats, std::time::Duration), SinkError>;

impl PendingCommit {
    /// Commits through `sink` and emits the commit's metrics and log line.
    pub async fn run(self, sink: Arc<dyn Sink>, pipeline: String) -> Result<Committed, SinkError> {
        let (stats, elapsed) = self.attempt(sink.as_ref(), &pipeline).await?;
        Ok(self.record(stats, elapsed, &pipeline))
    }

    /// Commits through `sink`, keeping the commit (a failed one may be left to a resync:
    /// `pipeline/schema_resync.rs`).
    async fn attempt(&self, sink: &dyn Sink, pipeline: &str) -> Attempt {
        let started = Instant::now();
        let stats: CommitStats = sink
            .commit(&self.schema, &self.changes, &self.checkpoint)
            .await
            .inspect_err(|e| failed(pipeline, e))?;
        m::Health::global().sink_ok();
        Ok((stats, started.elapsed()))
    }

    /// The metrics and log line of a durable commit that took `elapsed`.
    fn record(self, stats: CommitStats, elapsed: std::time::Duration, pipeline: &str) -> Committed {
        let pipeline = pipeline.to_owned();
        let labels = [
            (m::LABEL_PIPELINE, pipeline.clone()),
            (m::LABEL_TABLE, self.table.to_string()),
        ];
        metrics::counter!(m::COMMITS_TOTAL, &labels).increment(1);
        metrics::gauge!(m::LAST_COMMIT_TIMESTAMP_SECONDS, &labels)
            .set(m::unix_now_micros() as f64 / 1e6);
        metrics::histogram!(m::COMMIT_DURATION_SECONDS, m::LABEL_PIPELINE => pipeline.clone())
            .record(elapsed.as_secs_f64());
        for changes in &self.changes {
            super::count_ops(&pipeline, &self.table, changes);
        }
        info!(
            table = %self.table,
            rows = self.rows,
            position = %self.checkpoint.position,
            snapshot_id = stats.snapshot_id,
            ms = elapsed.as_millis() as u64,
            "committed"
        );
        Committed {
            table: self.table,
            checkpoint: self.checkpoint,
            window: self.window,
            swapped: stats.resync_swapped,
        }
    }
}

/// The one round (or copy batch) committing in the background, if any, and what it holds.
#[derive(Default)]
pub(super) struct InFlight {
    task: Option<JoinHandle<Result<Vec<Committed>, Unfinished>>>,
    /// Per commit in flight, where its buffer of streamed changes opened (`None`: copy rows).
    opened: Vec<Option<Opened>>,
    /// Streamed rows and their Arrow bytes in flight (not an initial copy's).
    streamed_rows: usize,
    streamed_bytes: usize,
    /// When the oldest buffer in flight got its first change.
    since: Option<Instant>,
    /// Only initial-copy rows are in flight (the copy reads on beside them).
    copy_batch: bool,
}

/// How a background round ended.
pub(super) enum Outcome {
    Ended(Result<Vec<Committed>, Unfinished>),
    /// The task panicked or was cancelled: the commits' outcome is unknown.
    Lost(String),
}

impl InFlight {
    pub fn is_running(&self) -> bool {
        self.task.is_some()
    }

    /// A round that only plain row changes may be read beside (not a copy batch).
    pub fn is_round(&self) -> bool {
        self.is_running() && !self.copy_batch
    }

    /// Where each commit in flight opened, for the acknowledgement.
    pub fn opened(&self) -> impl Iterator<Item = Option<&Opened>> {
        self.opened.iter().map(Option::as_ref)
    }

    pub fn streamed_rows(&self) -> usize {
        self.streamed_rows
    }

    pub fn streamed_bytes(&self) -> usize {
        self.streamed_bytes
    }

    pub fn since(&self) -> Option<Instant> {
        self.since
    }

    /// Starts `pending` on a task ([`run_together`]). The caller has settled the previous one.
    fn start(
        &mut self,
        pending: Vec<PendingCommit>,
        sink: Arc<dyn Sink>,
        pipeline: String,
        concurrency: usize,
    ) {
        let streamed = || {
            pending
                .iter()
                .filter(|p| !p.checkpoint.position.is_snapshot_incomplete())
        };
        self.streamed_rows = streamed().map(|p| p.rows).sum();
        self.streamed_bytes = streamed().map(|p| p.bytes).sum();
        self.copy_batch = streamed().next().is_none();
        self.opened = pending.iter().map(|p| p.opened.clone()).collect();
        self.since = pending.iter().map(|p| p.since).min();
        let copy_batch = self.copy_batch;
        self.task = Some(tokio::spawn(async move {
            if !copy_batch {
                failpoints::pause_point(failpoints::ROUND_IN_FLIGHT).await;
            }
            run_together(pending, sink, &pipeline, concurrency).await
        }));
    }

    /// Waits for the running round (immediately `None` when there is none). Cancel safe: the
    /// task stays in place until it has finished and its outcome is returned.
    pub async fn finish(&mut self) -> Option<Outcome> {
        let task = self.task.as_mut()?;
        let joined = task.await;
        *self = InFlight::default();
        Some(match joined {
            Ok(ended) => Outcome::Ended(ended),
            Err(e) => Outcome::Lost(e.to_string()),
        })
    }
}

/// Committing: buffers out, commits run in place or in the background, outcomes recorded.
impl Committer {
    /// Commits every buffered table (a round: [`Self::commit_round`]), then acknowledges what
    /// was received.
    pub(super) async fn flush(&mut self) -> Result<(), PipelineError> {
        let tables: Vec<TableId> = self.tables.buffers.keys().cloned().collect();
        self.commit_round(tables).await?;
        self.acknowledge();
        Ok(())
    }

    /// Commits the buffers of `tables` (together: [`run_together`]) and waits for them, after
    /// the round in flight, if any.
    pub(super) async fn commit_round(&mut self, tables: Vec<TableId>) -> Result<(), PipelineError> {
        self.settle().await?;
        let pending: Vec<PendingCommit> =
            tables.iter().filter_map(|t| self.take_commit(t)).collect();
        self.run_round(pending).await
    }

    /// Commits `pending` in place, and what a refusal leaves of it ([`Self::round_ended`]).
    async fn run_round(&mut self, mut pending: Vec<PendingCommit>) -> Result<(), PipelineError> {
        while !pending.is_empty() {
            let ended = run_together(
                pending,
                self.sink.clone(),
                &self.settings.pipeline,
                self.settings.commit_concurrency,
            )
            .await;
            pending = self.round_ended(ended).await?;
        }
        Ok(())
    }

    /// Records how a round ended; returns its commits still to make. A table whose commit the
    /// sink refuses for a schema change it cannot express may be left to a resync
    /// (`pipeline/schema_resync.rs`): the others are returned, to be committed without it. On
    /// any other error the commits that landed are recorded and the pipeline stops: the rest are
    /// committed again after the restart, from their tables' checkpoints.
    async fn round_ended(
        &mut self,
        ended: Result<Vec<Committed>, Unfinished>,
    ) -> Result<Vec<PendingCommit>, PipelineError> {
        let unfinished = match ended {
            Ok(committed) => {
                for c in committed {
                    self.committed(c);
                }
                return Ok(Vec::new());
            }
            Err(unfinished) => unfinished,
        };
        for c in unfinished.committed {
            self.committed(c);
        }
        // A copy batch's refusal stops, as it always did: its position is no transaction's.
        let refused = refused_table(&unfinished.error).and_then(|(table, cause)| {
            let p = unfinished.left.iter().find(|p| p.table == *table)?;
            let position = &p.checkpoint.position;
            (!position.is_snapshot_incomplete())
                .then(|| (table.clone(), cause.to_owned(), position.clone()))
        });
        let Some((table, cause, position)) = refused else {
            return Err(unfinished.error.into());
        };
        if !self.resync_instead(&table, &cause, &position).await? {
            return Err(unfinished.error.into());
        }
        Ok(unfinished
            .left
            .into_iter()
            .filter(|p| p.table != table)
            .collect())
    }

    /// Waits for the round in flight, if one runs, and records its outcome (what a refusal
    /// leaves of it is committed in place).
    pub(super) async fn settle(&mut self) -> Result<(), PipelineError> {
        match self.in_flight.finish().await {
            Some(done) => self.settled(done).await,
            None => Ok(()),
        }
    }

    /// Records how a background round ended.
    pub(super) async fn settled(&mut self, done: Outcome) -> Result<(), PipelineError> {
        match done {
            Outcome::Ended(ended) => {
                let left = self.round_ended(ended).await?;
                self.run_round(left).await
            }
            Outcome::Lost(e) => Err(PipelineError::SourceTask(format!(
                "a background commit ended without a result: {e}"
            ))),
        }
    }

    /// Commits `table`'s buffer and waits for it.
    pub(super) async fn commit_table(&mut self, table: &TableId) -> Result<(), PipelineError> {
        self.settle().await?;
        let Some(pending) = self.take_commit(table) else {
            return Ok(());
        };
        let position = pending.checkpoint.position.clone();
        match pending
            .run(self.sink.clone(), self.settings.pipeline.clone())
            .await
        {
            Ok(committed) => {
                self.committed(committed);
                Ok(())
            }
            Err(e) => {
                let refused = refused_table(&e).map(|(t, cause)| (t.clone(), cause.to_owned()));
                match refused {
                    Some((t, cause)) if self.resync_instead(&t, &cause, &position).await? => Ok(()),
                    _ => Err(e.into()),
                }
            }
        }
    }

    /// Starts committing `table`'s buffer (initial-copy rows) on a task, after the round in
    /// flight is done.
    pub(super) async fn commit_in_background(
        &mut self,
        table: &TableId,
    ) -> Result<(), PipelineError> {
        self.round_in_background(std::slice::from_ref(table)).await
    }

    /// Starts committing the buffers of `tables` (a round of streamed changes, or a batch of
    /// initial-copy rows) on a task, after the round in flight is done: the pipeline reads on
    /// meanwhile (the rules: the module doc).
    pub(super) async fn round_in_background(
        &mut self,
        tables: &[TableId],
    ) -> Result<(), PipelineError> {
        self.settle().await?;
        let pending: Vec<PendingCommit> =
            tables.iter().filter_map(|t| self.take_commit(t)).collect();
        if !pending.is_empty() {
            self.in_flight.start(
                pending,
                self.sink.clone(),
                self.settings.pipeline.clone(),
                self.settings.commit_concurrency,
            );
        }
        Ok(())
    }

    /// Takes `table`'s buffer out with the checkpoint to commit it with (`None`: nothing to
    /// commit).
    fn take_commit(&mut self, table: &TableId) -> Option<PendingCommit> {
        let buffer = self.tables.buffers.remove(table)?;
        self.tables.buffered_rows -= buffer.rows;
        if buffer.rows == 0 && !buffer.force {
            return None;
        }
        let incomplete = buffer.position.is_snapshot_incomplete();
        let window = self
            .tables
            .upsert_until
            .get(table)
            .filter(|until| incomplete || !buffer.position.covers(until))
            .cloned();
        let checkpoint = Checkpoint {
            pipeline: self.settings.pipeline.clone(),
            position: buffer.position.clone(),
            snapshot: if incomplete {
                self.tables
                    .progress
                    .get(table)
                    .map(SnapshotProgress::to_json)
            } else {
                None
            },
            upsert_until: window.clone(),
            changelog_seq: None,
            changelog_resync: None,
        };
        Some(PendingCommit {
            table: table.clone(),
            schema: buffer.schema,
            changes: buffer.changes,
            rows: buffer.rows,
            checkpoint,
            window,
            opened: buffer.opened,
            bytes: buffer.bytes,
            since: buffer.since,
        })
    }

    /// Records a durable commit.
    fn committed(&mut self, c: Committed) {
        // A commit at a complete position past the window closes it: every later change is past
        // the window. (A copy batch never closes one: a window announced while it ran stays.)
        if c.window.is_none() && !c.checkpoint.position.is_snapshot_incomplete() {
            self.tables.upsert_until.remove(&c.table);
        }
        if c.swapped {
            self.tables.catch_up.remove(&c.table);
            if c.window.is_some() {
                // Copied at start: its replay is still inside the copy's upsert window.
                self.tables.swapped_in_window.insert(c.table.clone());
            }
            if let Some(request) = self.tables.resyncing.remove(&c.table) {
                info!(table = %c.table, id = %request.id, "resync finished: the new copy replaced the table");
                self.tables.resynced.push(request);
            }
        }
        self.tables
            .committed
            .insert(c.table, Some(c.checkpoint.position));
    }

    /// Removes the requests of the resyncs whose swap landed. A failure is only logged: the
    /// next start finds the request done and removes it then.
    pub(super) async fn resyncs_finished(&mut self) {
        let Some(store) = self.settings.resync.clone() else {
            return;
        };
        for request in std::mem::take(&mut self.tables.resynced) {
            if let Err(e) = store.remove(&request).await {
                warn!(table = %request.table(), error = %e, "cannot remove a finished resync's request; the next start removes it");
            }
        }
    }
}

/// Acknowledging: what the source may forget.
impl Committer {
    pub(super) fn advance_received(&mut self, position: Position) {
        if position.is_snapshot_incomplete() {
            return;
        }
        let newer = self
            .received
            .as_ref()
            .is_none_or(|r| position.covers(r) && position != *r);
        if newer {
            self.received = Some(position);
        }
    }

    /// Where each buffer and each commit in flight opened: what holds the acknowledgement back.
    fn waiting(&self) -> impl Iterator<Item = Option<&Opened>> {
        let buffers = self.tables.buffers.values().map(|b| b.opened.as_ref());
        buffers.chain(self.in_flight.opened())
    }

    /// Acknowledges what every table holds ([`cadence::durable_bound`]): everything received
    /// when nothing is buffered or in flight, else up to the oldest buffer or commit in flight
    /// still waiting to land.
    pub(super) fn acknowledge(&mut self) {
        self.lag.durable();
        if let Some(oldest) = cadence::oldest_waiting(self.waiting()) {
            self.lag.waiting(oldest);
        }
        let Some(received) = cadence::durable_bound(self.waiting(), self.received.as_ref()) else {
            return;
        };
        // A resync's copy job may hold the acknowledgements back (`pipeline/resync.rs`).
        let received = match &self.settings.ack_hold {
            Some(hold) => hold.limit(&received),
            None => received,
        };
        if self.acked.as_ref().is_some_and(|a| a.covers(&received)) {
            return;
        }
        debug!(position = %received, "acknowledging");
        self.acked = Some(received.clone());
        if self.tables.parked.is_empty() {
            self.progress.acked(&received, &self.tables.committed);
        } else {
            // A parked table holds nothing past its checkpoint: the progress file must not
            // claim it does (`pipeline/schema_resync.rs`).
            let mut committed = self.tables.committed.clone();
            committed.retain(|t, _| !self.tables.parked.contains(t));
            self.progress.acked(&received, &committed);
        }
        // A closed receiver means the source already stopped; there is no one left to tell.
        let _ = self.acks.send(Some(received));
    }
}
