//! Resync (`cdcd resync --table T`, requests in `checkpoint/resync.rs`) on the pipeline's side:
//! which requests a run takes on and how, and the copy job that copies a table beside the
//! streaming pipeline. The lineage and its swap are the sink's (`sinks/iceberg/resync/mod.rs`).
//!
//! A lineage is filled one of two ways:
//! - **Online**, for a request made while the daemon streams (`daemon/resync_watch.rs` watches
//!   for them): a copy job ([`copy_for_resync`], its own source connection and sink) copies the
//!   table into its lineage while the pipeline keeps streaming every table, this one into its
//!   live table. First the pipeline's acknowledgements are held ([`AckHold`]) at P, the newest position it
//!   offered to acknowledge, and P is recorded in the request. Then the job copies the table
//!   whole at a new snapshot whose position C is exact (Postgres: a temporary slot's exported
//!   snapshot and consistent point; MySQL: the consistent snapshot's binlog position): every
//!   transaction at or before C is in the copy, none after, so the lineage is complete at C with
//!   no upsert window. Exact matters: with a window, the changes between P and the snapshot would
//!   be replayed into a lineage copied under a newer schema when a DDL fell between them, a
//!   change it cannot take. Held at P ≤ C, the slot (Postgres) and the progress file (MySQL)
//!   keep everything after C, so once the copy is done the daemon restarts the pipeline
//!   in-process and the stream replays the table's changes after C into the lineage (the other
//!   tables skip what they hold). The live table is ahead of the lineage then, so the lineage
//!   replaces it at its first commit at or past the live table's checkpoint
//!   ([`ResyncMode::SwapWhenCaughtUp`]), never earlier: readers never see the table go back. An
//!   idle table gets an empty commit there ([`Committer::catch_up_resyncs`]).
//!   A daemon that stops mid-copy finds the request (with P) at its next start and leaves it to
//!   a copy job again: a complete lineage catches up, an unfinished one is copied again whole
//!   (its chunks are exact at their own snapshot, not at another one). A daemon that stops on an
//!   error while a table is resynced online starts that resync over under a new id
//!   (`daemon/resync_watch.rs`), copied at the next start: the way out when the error is the
//!   table's own.
//! - **At start**, for a request found when the daemon starts (cdcd was stopped, or stopped on
//!   the very change the resync is the way out of): the table is copied before streaming
//!   resumes, like an interrupted copy, while the other tables wait
//!   ([`ResyncMode::SwapAtCopyEnd`]). Its replayed changes up to the live table's checkpoint are
//!   skipped: the copy, read later, holds them (perhaps under an older schema the lineage cannot
//!   take).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{
    drive, Committer, InFlight, PipelineError, ProgressWriter, Role, Settings, TableBuffer, Tables,
};
use crate::changelog::{Position, TableId, TableSchema};
use crate::checkpoint::resync::{ResyncError, ResyncRequest};
use crate::config::SnapshotMode;
use crate::sinks::{ResyncMode, ResyncState, Sink};
use crate::sources::{Prepared, Resume, Source, TableCopy};

/// Which resync requests a pipeline run takes on (`Settings::resyncs`).
#[derive(Debug, Clone, Default)]
pub struct ResyncPlan {
    /// Request id → how its lineage replaces the live table. Requests not listed are left to
    /// the daemon's watcher, which starts a copy job for them.
    pub modes: BTreeMap<String, ResyncMode>,
    /// The schema each copy job copied its table under: an idle table's catch-up commit
    /// (`Committer::catch_up_resyncs`) needs one before the stream brings any.
    pub schemas: BTreeMap<TableId, Arc<TableSchema>>,
}

/// Holds the pipeline's acknowledgements at a position while a resync's copy job runs, so the
/// source keeps everything after it for the replay into the lineage.
#[derive(Debug, Clone, Default)]
pub struct AckHold(Arc<Mutex<HoldState>>);

#[derive(Debug, Default)]
struct HoldState {
    /// The newest position the pipeline offered to acknowledge (every table held everything up
    /// to it then), or the position it started from.
    offered: Option<Position>,
    /// Acknowledgements go no further than this.
    cap: Option<Position>,
}

impl AckHold {
    fn state(&self) -> MutexGuard<'_, HoldState> {
        // The state is two positions, consistent at every instant: a panic elsewhere cannot
        // leave it half written.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// From now on acknowledgements stop at the newest position the pipeline offered to
    /// acknowledge (or started from), which this returns: every transaction at or before it is
    /// committed in every table, so any snapshot read from now on holds it. `None`: the pipeline
    /// has no position yet (nothing to hold; the resync then copies at the next start).
    /// Already held (by [`AckHold::hold_at`]): that position, which never moves up.
    pub fn hold(&self) -> Option<Position> {
        let mut state = self.state();
        if let Some(cap) = &state.cap {
            return Some(cap.clone());
        }
        let at = state.offered.clone()?;
        state.cap = Some(at.clone());
        Some(at)
    }

    /// Holds acknowledgements at `at` or before from the start: a resync's copy job began
    /// before the daemon stopped and held the stream there (its request's `held_at`), so its
    /// lineage, complete or not, may need every change after it.
    pub fn hold_at(&self, at: &Position) {
        let mut state = self.state();
        // The meet: GTID sets and lists are only partially ordered.
        let lower = match &state.cap {
            Some(cap) => cap.meet(at).unwrap_or_else(|| at.clone()),
            None => at.clone(),
        };
        state.cap = Some(lower);
    }

    /// Holds at `keep` only (`None`: acknowledgements go on): the copy job found nothing to
    /// copy, and `keep` is what other requests still need.
    pub fn release_to(&self, keep: Option<Position>) {
        self.state().cap = keep;
    }

    /// The pipeline started from `start` (every table holds everything up to it).
    pub(super) fn started_at(&self, start: Option<&Position>) {
        let mut state = self.state();
        if state.offered.is_none() {
            state.offered = start.filter(|p| !p.is_snapshot_incomplete()).cloned();
        }
    }

    /// The pipeline may acknowledge `received`: what it may tell the source.
    pub(super) fn limit(&self, received: &Position) -> Position {
        let mut state = self.state();
        state.offered = Some(received.clone());
        // The meet, not the older of the two: GTID sets and lists are only partially ordered,
        // and an acknowledgement must not claim a transaction either one lacks.
        match &state.cap {
            Some(cap) => cap.meet(received).unwrap_or_else(|| cap.clone()),
            None => received.clone(),
        }
    }
}

/// Hands the requested resyncs this run takes on to the sink before the checkpoints are read:
/// the sink then answers each table's checkpoint from its lineage. A request the live table
/// already carries out (the swap landed before a stop) is removed.
pub(super) async fn start_resyncs(
    prepared: &Prepared,
    sink: &dyn Sink,
    settings: &Settings,
    tables: &mut Tables,
) -> Result<(), PipelineError> {
    let Some(store) = &settings.resync else {
        return Ok(());
    };
    for request in store.list().await? {
        let table = request.table();
        let location = store.request_location(&table);
        let mode = match &settings.resyncs {
            None => ResyncMode::SwapAtCopyEnd,
            Some(plan) => match plan.modes.get(&request.id) {
                Some(mode) => *mode,
                None => continue,
            },
        };
        if !prepared.tables.contains(&table) {
            warn!(table = %table, request = %location, "a resync is requested for a table this pipeline does not capture; ignored (add the table to source.tables, or remove the request)");
            continue;
        }
        if settings.snapshot == SnapshotMode::Never {
            return Err(PipelineError::ResyncWithoutCopy {
                table,
                request: location,
            });
        }
        match sink.resync(&table, &request.id, mode).await? {
            ResyncState::Done => {
                store.remove(&request).await?;
                info!(table = %table, id = %request.id, "resync finished: the table is its new copy");
            }
            ResyncState::UnderWay { live } => {
                let live = live
                    .map(|cp| cp.position)
                    .filter(|p| !p.is_snapshot_incomplete());
                match mode {
                    ResyncMode::SwapAtCopyEnd => {
                        info!(table = %table, id = %request.id, "resync under way: copying the table into a new lineage before streaming resumes; readers see the old table until the copy is complete");
                        // The old table's changes were in the source before this copy's
                        // snapshot: replayed, they are skipped as committed (older schemas
                        // among them, which the lineage's may not take, included). So was the
                        // transaction a request cdcd wrote itself names (`received_at`): the
                        // one whose schema change the live table could not take, which may
                        // write the table under two shapes.
                        let received = request.received_position().map_err(|detail| {
                            ResyncError::Unreadable {
                                path: location.clone(),
                                detail,
                            }
                        })?;
                        let copied = match (live, received) {
                            (Some(live), Some(received)) if !received.covers(&live) => Some(live),
                            (live, received) => received.or(live),
                        };
                        if let Some(position) = copied {
                            tables.copied_up_to.insert(table.clone(), position);
                        }
                    }
                    ResyncMode::SwapWhenCaughtUp | ResyncMode::CopyOnly => {
                        info!(table = %table, id = %request.id, "resync under way: the lineage catches up with the live table, which it then replaces");
                        if let Some(position) = live {
                            tables.catch_up.insert(table.clone(), position);
                        }
                    }
                }
                tables.resyncing.insert(table, request);
            }
        }
    }
    Ok(())
}

/// How a request found at start is carried out: one a copy job had begun (it recorded where it
/// held the stream) is left to a copy job again (`None`: the daemon's watcher starts one, which
/// finds a complete lineage as it is and copies an unfinished one again from scratch); any other
/// is copied before streaming resumes.
pub fn mode_at_start(request: &ResyncRequest) -> Option<ResyncMode> {
    match request.held_at {
        Some(_) => None,
        None => Some(ResyncMode::SwapAtCopyEnd),
    }
}

/// What a copy job left.
#[derive(Debug)]
pub enum ResyncCopy {
    /// The lineage is complete at the held position; the table's schema as copied.
    Complete(Option<Arc<TableSchema>>),
    /// Shut down before the copy was complete.
    Stopped,
    /// The live table already is this resync's lineage (the swap landed before a stop that
    /// left the request): only the request is left to remove.
    Done,
    /// Nothing to copy: the table is not captured.
    Nothing,
}

/// A resync's copy job: copies `request`'s table into its lineage at a new snapshot, declared
/// complete at `held_at` (where the streaming pipeline holds its acknowledgements), through its
/// own `source` and `sink` (a sink of the same configuration: the lineage is a table of its own,
/// the streaming pipeline's sink keeps committing the live one). See the module doc.
pub async fn copy_for_resync(
    mut source: Box<dyn Source>,
    sink: Arc<dyn Sink>,
    settings: Settings,
    request: &ResyncRequest,
    held_at: Position,
    shutdown: CancellationToken,
) -> Result<ResyncCopy, PipelineError> {
    let table = request.table();
    let prepared = source.prepare().await?;
    if !prepared.tables.contains(&table) {
        warn!(table = %table, "a resync is requested for a table this pipeline does not capture; ignored (add the table to source.tables, or remove the request)");
        return Ok(ResyncCopy::Nothing);
    }
    if let ResyncState::Done = sink
        .resync(&table, &request.id, ResyncMode::CopyOnly)
        .await?
    {
        return Ok(ResyncCopy::Done);
    }
    let checkpoint = sink.checkpoint(&table).await?;
    if checkpoint
        .as_ref()
        .is_some_and(|cp| !cp.position.is_snapshot_incomplete())
    {
        // Copied before (a job that ended as the daemon stopped): the next run catches it up.
        return Ok(ResyncCopy::Complete(None));
    }
    info!(table = %table, id = %request.id, held_at = %held_at, "resync under way: copying the table into a new lineage while the pipeline streams on; readers see the live table, still streaming, until the copy has caught up");
    let mut tables = Tables::default();
    tables
        .committed
        .insert(table.clone(), checkpoint.map(|c| c.position));
    let resume = Resume {
        start: Some(held_at.clone()),
        snapshot: false,
        // From scratch (the first batch replaces whatever the lineage holds): a copy job starts
        // only for a request no run has taken on.
        copy: vec![TableCopy {
            table: table.clone(),
            progress: None,
        }],
        copy_only: true,
    };
    let (event_tx, events) = mpsc::channel(super::event_capacity(&settings.memory_budget));
    let (ack_tx, ack_rx) = watch::channel(None);
    let source_stop = CancellationToken::new();
    let source_task = tokio::spawn(source.run(resume, event_tx, ack_rx, source_stop.clone()));
    let snapshot_batch = super::SnapshotBatch::of(&settings);
    let committer = Committer {
        sink,
        settings,
        tables,
        // The copy's commits sit at the incomplete position of the source's kind.
        received: Some(held_at),
        acked: None,
        acks: ack_tx,
        lag: super::Lag::default(),
        in_flight: InFlight::default(),
        snapshot_batch,
        progress: ProgressWriter::start(None),
    };
    let committer = drive(
        committer,
        events,
        source_task,
        source_stop,
        shutdown,
        Role::CopyJob,
    )
    .await?;
    let complete = committer
        .tables
        .committed
        .get(&table)
        .and_then(Option::as_ref)
        .is_some_and(|p| !p.is_snapshot_incomplete());
    Ok(if complete {
        ResyncCopy::Complete(committer.tables.schemas.get(&table).cloned())
    } else {
        ResyncCopy::Stopped
    })
}

impl Committer {
    /// Lineages that wait to catch up with their live table ([`ResyncMode::SwapWhenCaughtUp`])
    /// with nothing buffered, once everything received is past the live table's checkpoint: an
    /// empty commit at the received position replaces the live table (an idle table would
    /// otherwise wait for its next change, and readers for the repair).
    pub(super) async fn catch_up_resyncs(&mut self) -> Result<(), PipelineError> {
        let Some(received) = self.received.clone() else {
            return Ok(());
        };
        let due: Vec<TableId> = self
            .tables
            .catch_up
            .iter()
            .filter(|(t, live)| {
                // Only a lineage whose copy is complete: an empty commit at a complete
                // position would end an unfinished copy.
                let complete = self
                    .tables
                    .committed
                    .get(*t)
                    .and_then(Option::as_ref)
                    .is_some_and(|p| !p.is_snapshot_incomplete());
                complete
                    && !self.tables.progress.contains_key(*t)
                    && received.covers(live)
                    && !self.tables.buffers.contains_key(*t)
            })
            .map(|(t, _)| t.clone())
            .collect();
        for table in due {
            let schema = self.tables.schemas.get(&table).cloned().or_else(|| {
                self.settings
                    .resyncs
                    .as_ref()
                    .and_then(|plan| plan.schemas.get(&table).cloned())
            });
            let Some(schema) = schema else {
                continue;
            };
            let mut buffer = TableBuffer::new(schema, &received);
            buffer.force = true;
            self.tables.buffers.insert(table.clone(), buffer);
            self.commit_table(&table).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::test_fixtures::pg_position as pos;

    #[test]
    fn a_hold_stops_acknowledgements_where_the_pipeline_was_and_releases() {
        let hold = AckHold::default();
        assert_eq!(hold.hold(), None, "nothing to hold at yet");
        hold.started_at(Some(&pos(5)));
        assert_eq!(hold.limit(&pos(8)), pos(8), "not held: everything goes");
        // Held at the newest position offered: later ones are held back, older ones go.
        assert_eq!(hold.hold(), Some(pos(8)));
        assert_eq!(hold.limit(&pos(12)), pos(8));
        assert_eq!(hold.limit(&pos(20)), pos(8));
        hold.release_to(None);
        assert_eq!(hold.limit(&pos(21)), pos(21));
        // Held from the start (a copy job's request): later holds keep the lower position.
        let restarted = AckHold::default();
        restarted.hold_at(&pos(4));
        restarted.started_at(Some(&pos(6)));
        assert_eq!(restarted.limit(&pos(9)), pos(4));
        assert_eq!(restarted.hold(), Some(pos(4)));
        restarted.hold_at(&pos(7));
        assert_eq!(restarted.limit(&pos(9)), pos(4));
        // GTID lists are partially ordered: the hold acknowledges their meet, never a
        // transaction either side lacks.
        let gtid = |s: &str| s.parse::<Position>().unwrap();
        let lists = AckHold::default();
        lists.hold_at(&gtid("0-1-10,1-1-5"));
        assert_eq!(lists.limit(&gtid("0-1-7,1-1-9")), gtid("0-1-7,1-1-5"));
        lists.hold_at(&gtid("0-1-12,1-1-3"));
        assert_eq!(lists.limit(&gtid("0-1-20,1-1-20")), gtid("0-1-10,1-1-3"));
        // A start position is what a fresh hold holds at before any acknowledgement.
        let fresh = AckHold::default();
        fresh.started_at(Some(&pos(3)));
        assert_eq!(fresh.hold(), Some(pos(3)));
        assert_eq!(fresh.limit(&pos(9)), pos(3));
    }
}
