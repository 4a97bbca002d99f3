//! A schema change a table's lake table cannot express, left to that table's resync instead of
//! a stop: with `source.schema_change = "resync"` for the table, or when a resync of it is
//! requested or under way already. The table is *parked* (this run commits nothing more to it and
//! drops its changes), a resync request is written, and the daemon's watcher
//! (`daemon/resync_watch.rs`) copies the table online beside the streaming pipeline
//! (`pipeline/resync.rs`); every other table streams on meanwhile, including the rest of the
//! transaction that carried the change.
//!
//! The changes: a commit the sink refuses (`SinkError::SchemaChanged`: `ADD COLUMN … DEFAULT` on
//! Paimon or format v2, a type change the format cannot widen, a column dropped while another
//! arrives, which is how a Postgres rename looks without the DDL trigger), and a transaction that
//! writes a table under two shapes ([`super::SchemaChangeStop`]). Changes the source itself stops
//! on (a statement it cannot parse, a table dropped and created again) still stop.
//!
//! Exactly once. Let L be the checkpoint of X's lake table, and T the newest transaction of the
//! commit X's sink refused (or the transaction that writes X under two shapes): the changes of X
//! after L are those of the refused buffer (or of T) and later ones, none of them in the lake.
//! 1. The request is durable before anything past L is acknowledged: it is written here, in the
//!    pipeline's task, before the flush that found the refusal acknowledges anything. The
//!    acknowledgements are held ([`super::AckHold`]) at H, the newest position offered so far,
//!    which is before X's first change after L (that change was never committed, so nothing at
//!    or past it was offered), and H is recorded in the request (`held_at`), so a restart holds
//!    there too.
//! 2. The source had committed T before cdcd read it, so every snapshot read from now on holds
//!    X's changes up to T, and whatever came after up to that snapshot. The online copy is exact
//!    at its snapshot's position C (past T); the lineage then takes X's changes after C, which the
//!    slot still has (held at H, before C). X's changes from L to C were dropped here and are in
//!    the copy; after C they are replayed into the lineage: none in both, none in neither. T
//!    itself, two shapes or not, is at or below C, so the lineage skips it whole.
//! 3. The other tables: X's rows are dropped from each transaction, never the transaction; their
//!    commits and checkpoints are what a run without X would make.
//! 4. A crash or a stop keeps the request until the swap. With `held_at`, the next start leaves
//!    it to a copy job again and holds at H (X streams into its live table, reaches T, and is
//!    parked again). Without (no position to hold at yet, or the resync started over after an
//!    error), the table is copied at start, and its replay skips X's changes up to `received_at`
//!    (T's position; in every copy read after the request), so T's two shapes never reach it.
//! 5. A lineage (copied at start, or catching up) that meets a change it cannot take either, or a
//!    table copied at start and swapped in that meets one inside its copy's upsert window (the
//!    replay of transactions the copy holds: a `cdcd resync` past a stop on two shapes in one
//!    transaction): the resync starts over under a new id past that change, online, and the old
//!    lineage is given up. Each start-over is past a newer change, so a table under a run of
//!    `ALTER`s converges once they stop.
//!
//! A flush commits table by table unless the sink commits all its tables in one transaction
//! ([`crate::sinks::Sink::commits_tables_together`]), so after a refusal the pipeline knows which
//! of the others landed and commits only the rest, once.
//!
//! Readers see X as of L until the swap, which is one commit (README, "Copying one table again").

use tracing::{info, warn};

use super::{AckHold, Committer, PipelineError};
use crate::changelog::{Position, TableId};
use crate::checkpoint::resync::{Requested, ResyncRequest, ResyncStore};
use crate::config::{SchemaChange, SnapshotMode};
use crate::metrics as m;
use crate::sinks::SinkError;

/// The table and the change, when `e` is a sink's refusal of a schema change.
pub(super) fn refused_table(e: &SinkError) -> Option<(&TableId, &str)> {
    match e {
        SinkError::SchemaChanged { table, detail } => Some((table, detail.as_str())),
        _ => None,
    }
}

impl Committer {
    /// `table`'s lake table cannot take a schema change (`cause`) of the transaction at
    /// `position` (for a refused commit: the newest transaction of the refused buffer). Returns
    /// `true` when the table is parked and left to a resync (see the module doc), `false` when
    /// the caller stops as before: `source.schema_change` is not `resync` for the table and no
    /// resync of it is requested, or this run cannot resync (a copy job, `snapshot = "never"`,
    /// a sink without resyncs).
    pub(super) async fn resync_instead(
        &mut self,
        table: &TableId,
        cause: &str,
        position: &Position,
    ) -> Result<bool, PipelineError> {
        if self.tables.parked.contains(table) {
            return Ok(true);
        }
        let Some((store, hold, mode)) = self.resync_allowed(table) else {
            return Ok(false);
        };
        let under_way = self.tables.resyncing.get(table).cloned();
        // A resync that copied the table at start and swapped it in replays, inside the copy's
        // upsert window, transactions the copy holds: one of them that the table cannot take
        // (the two shapes the resync was the way out of) is that resync's business still.
        let in_window = self.tables.swapped_in_window.contains(table)
            && self
                .tables
                .upsert_until
                .get(table)
                .is_some_and(|until| until.covers(position));
        // A request whose swap landed in this run waits for its removal (`resyncs_finished`):
        // it is done, not pending, and a new one takes its place (never removed with it).
        let swapped: Vec<String> = self
            .tables
            .resynced
            .iter()
            .filter(|r| r.table() == *table)
            .map(|r| r.id.clone())
            .collect();
        let pending = match under_way {
            Some(_) => None,
            None => store
                .list()
                .await?
                .into_iter()
                .find(|r| r.table() == *table && !swapped.contains(&r.id)),
        };
        let starts_over = under_way.is_some() || in_window;
        if !starts_over && pending.is_none() && mode != SchemaChange::Resync {
            return Ok(false);
        }
        // From here on nothing at or past `position` is acknowledged (module doc, 1).
        let held = hold.hold();
        let fresh = ResyncRequest {
            held_at: held.as_ref().map(ToString::to_string),
            received_at: Some(position.to_string()),
            ..ResyncRequest::new(table)
        };
        let change = Change {
            table,
            cause,
            position,
        };
        if starts_over {
            self.start_over(&store, &change, under_way, &swapped, fresh)
                .await?;
        } else if let Some(pending) = pending {
            info!(table = %table, position = %position, change = cause, id = %pending.id, "schema change the lake table cannot take; a resync of the table is requested already, which copies it past this change: its changes are left to it, the other tables stream on");
        } else {
            self.request(&store, &change, &swapped, fresh).await?;
        }
        crate::failpoints::crash_point(crate::failpoints::SCHEMA_RESYNC_REQUESTED);
        self.park(table);
        Ok(true)
    }

    /// The resync store, the acknowledgement hold and `table`'s mode, when a change `table`
    /// cannot take may be left to a resync in this run.
    fn resync_allowed(&self, table: &TableId) -> Option<(ResyncStore, AckHold, SchemaChange)> {
        let mode = self.settings.schema_change.for_table(table);
        let (Some(store), Some(hold)) =
            (self.settings.resync.clone(), self.settings.ack_hold.clone())
        else {
            return None;
        };
        if mode == SchemaChange::Stop
            || self.settings.snapshot == SnapshotMode::Never
            || self.sink.resync_refusal().is_some()
        {
            return None;
        }
        Some((store, hold, mode))
    }

    /// The table's resync under way (or swapped in within its upsert window) starts over with
    /// `fresh`, written over the old request: its lineage, if any, is no one's any more.
    async fn start_over(
        &mut self,
        store: &ResyncStore,
        change: &Change<'_>,
        under_way: Option<ResyncRequest>,
        swapped: &[String],
        fresh: ResyncRequest,
    ) -> Result<(), PipelineError> {
        let table = change.table;
        self.tables.resynced.retain(|r| r.table() != *table);
        store.update(&fresh).await?;
        if let Some(old) = &under_way {
            self.sink.abandon_resync(table, &old.id).await;
        }
        self.tables.resyncing.remove(table);
        self.tables.catch_up.remove(table);
        self.tables.copied_up_to.remove(table);
        self.tables.upsert_until.remove(table);
        self.tables.progress.remove(table);
        self.tables.swapped_in_window.remove(table);
        self.count_schema_resync(table);
        let old = under_way.map(|r| r.id).or(swapped.first().cloned());
        let (position, cause) = (change.position, change.cause);
        warn!(table = %table, position = %position, change = cause, id = ?old, new_id = %fresh.id, "schema change the table's new copy cannot take either: its resync starts over, copied again online past this change, while the other tables stream on");
        Ok(())
    }

    /// Requests a resync of the table (`source.schema_change = "resync"`), over a request whose
    /// swap landed in this run if there is one.
    async fn request(
        &mut self,
        store: &ResyncStore,
        change: &Change<'_>,
        swapped: &[String],
        fresh: ResyncRequest,
    ) -> Result<(), PipelineError> {
        let table = change.table;
        let request = if !swapped.is_empty() {
            self.tables.resynced.retain(|r| r.table() != *table);
            store.update(&fresh).await?;
            fresh
        } else {
            match store.request_as(fresh).await? {
                Requested::Created(r) | Requested::Pending(r) => r,
            }
        };
        self.count_schema_resync(table);
        let (position, cause) = (change.position, change.cause);
        warn!(table = %table, position = %position, change = cause, id = %request.id, "schema change the lake table cannot take: source.schema_change = \"resync\" copies the table again, online, while the other tables stream on; readers see the table as it was until the new copy replaces it");
        Ok(())
    }

    fn count_schema_resync(&self, table: &TableId) {
        metrics::counter!(m::SCHEMA_RESYNCS_TOTAL, m::LABEL_PIPELINE => self.settings.pipeline.clone(), m::LABEL_TABLE => table.to_string())
            .increment(1);
    }

    /// Drops the table's buffer and parks it: its changes are the resync's from here on.
    fn park(&mut self, table: &TableId) {
        if let Some(buffer) = self.tables.buffers.remove(table) {
            self.tables.buffered_rows -= buffer.rows;
        }
        self.tables.parked.insert(table.clone());
        // The refused commit marked the sink as failing (`/readyz`); nothing is failing now.
        m::Health::global().sink_ok();
    }
}

/// A schema change a lake table cannot take: the table, the change, and the position of the
/// transaction that carries it.
struct Change<'a> {
    table: &'a TableId,
    cause: &'a str,
    position: &'a Position,
}
