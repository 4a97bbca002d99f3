//! What the pipeline holds per table while it runs: the changes buffered for the next commit,
//! the committed checkpoints, initial-copy progress and upsert windows. `pipeline/mod.rs` decides
//! when to commit; this file only keeps the books.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use arrow_schema::ArrowError;

use super::upsert;
use super::PipelineError;
use crate::changelog::{Position, TableChanges, TableId, TableSchema};
use crate::checkpoint::resync::ResyncRequest;
use crate::sources::SnapshotProgress;

/// Buffered changes of one table, not yet committed.
pub(super) struct TableBuffer {
    pub(super) schema: Arc<TableSchema>,
    pub(super) changes: Vec<TableChanges>,
    pub(super) rows: usize,
    /// Arrow memory of `changes`.
    pub(super) bytes: usize,
    /// The checkpoint to commit with: the position of the newest buffered change.
    pub(super) position: Position,
    /// Commit even with no rows (the end of an initial copy records the consistent point).
    pub(super) force: bool,
    pub(super) since: Instant,
    /// A buffer of streamed changes: where it opened (`None`: initial-copy rows).
    pub(super) opened: Option<Opened>,
}

/// Where a buffer of streamed changes opened, for the acknowledgement and the lag while the
/// table waits for its own commit (`pipeline/cadence.rs`).
#[derive(Debug, Clone)]
pub(super) struct Opened {
    /// The position received just before the buffer's first change (`None`: nothing was): this
    /// table holds every change up to it, since its earlier changes were all committed.
    pub(super) after: Option<Position>,
    /// Source commit time (µs since the epoch) of the buffer's first change.
    pub(super) commit_micros: i64,
}

impl TableBuffer {
    /// An empty buffer of `schema`'s table, to be committed at `position`.
    pub(super) fn new(schema: Arc<TableSchema>, position: &Position) -> TableBuffer {
        TableBuffer {
            schema,
            changes: Vec::new(),
            rows: 0,
            bytes: 0,
            position: position.clone(),
            force: false,
            since: Instant::now(),
            opened: None,
        }
    }
}

/// What the pipeline knows about each table while it runs.
#[derive(Default)]
pub(super) struct Tables {
    /// Committed checkpoint per table (`None`: nothing committed yet).
    pub(super) committed: BTreeMap<TableId, Option<Position>>,
    pub(super) buffers: BTreeMap<TableId, TableBuffer>,
    pub(super) buffered_rows: usize,
    /// The newest schema seen per table.
    pub(super) schemas: BTreeMap<TableId, Arc<TableSchema>>,
    /// Initial copies under way: what each commit of the table records as `cdcd.snapshot`.
    pub(super) progress: BTreeMap<TableId, SnapshotProgress>,
    /// Open upsert windows: the table's changes at or below this position are upserts.
    pub(super) upsert_until: BTreeMap<TableId, Position>,
    /// Resyncs under way (`checkpoint::resync`): the sink commits these tables to their new
    /// lineage until a commit reports the swap.
    pub(super) resyncing: BTreeMap<TableId, ResyncRequest>,
    /// Resyncs whose swap landed, whose requests are still to be removed.
    pub(super) resynced: Vec<ResyncRequest>,
    /// Per table under resync, the old table's checkpoint: every change at or below it is in the
    /// lineage's copy (see `start_resyncs` in pipeline/resync.rs).
    pub(super) copied_up_to: BTreeMap<TableId, Position>,
    /// Per lineage that replaces its live table once caught up, the live table's checkpoint
    /// (`Committer::catch_up_resyncs`).
    pub(super) catch_up: BTreeMap<TableId, Position>,
    /// Tables whose resync copied them at start and swapped with the copy's upsert window open
    /// (`ResyncMode::SwapAtCopyEnd`): the replay in that window brings changes the copy holds.
    pub(super) swapped_in_window: BTreeSet<TableId>,
    /// Tables whose changes this run leaves to their pending resync: a schema change their
    /// lake table could not take (`pipeline/schema_resync.rs`).
    pub(super) parked: BTreeSet<TableId>,
    /// The initial copies' rows and bytes so far, for the progress log and metrics.
    pub(super) copy_meter: super::copy_meter::CopyMeter,
}

impl Tables {
    pub(super) fn is_committed(&self, table: &TableId, position: &Position) -> bool {
        let committed = match self.committed.get(table) {
            Some(Some(done)) => !done.is_snapshot_incomplete() && done.covers(position),
            _ => false,
        };
        committed
            || self
                .copied_up_to
                .get(table)
                .is_some_and(|copied| copied.covers(position))
    }

    /// Rewrites `changes` as upserts when its table's upsert window covers `position`.
    pub(super) fn upsert_in_window(
        &self,
        changes: &mut TableChanges,
        position: &Position,
    ) -> Result<(), PipelineError> {
        let in_window = self
            .upsert_until
            .get(&changes.schema.id)
            .is_some_and(|until| until.covers(position));
        if in_window {
            upsert::upsert(changes).map_err(|e| {
                PipelineError::SourceTask(format!(
                    "rewriting changes to {} at {position} as upserts: {e}",
                    changes.schema.id
                ))
            })?;
        }
        Ok(())
    }

    pub(super) fn oldest(&self) -> Option<Instant> {
        self.buffers.values().map(|b| b.since).min()
    }

    /// Buffered changes that `commit_max_rows` applies to: all but initial-copy rows.
    pub(super) fn streamed_rows(&self) -> usize {
        self.streamed(|b| b.rows)
    }

    /// Arrow bytes of buffered streamed changes, over all tables: what the memory budget's
    /// buffered rows share bounds (`pipeline/cadence.rs`).
    pub(super) fn streamed_bytes(&self) -> usize {
        self.streamed(|b| b.bytes)
    }

    /// `size` summed over the buffers of streamed changes (not an initial copy's).
    fn streamed(&self, size: fn(&TableBuffer) -> usize) -> usize {
        self.buffers
            .values()
            .filter(|b| !b.position.is_snapshot_incomplete())
            .map(size)
            .sum()
    }

    /// The table whose initial-copy rows take the most memory.
    pub(super) fn largest_copy(&self) -> Option<TableId> {
        self.buffers
            .iter()
            .filter(|(_, b)| b.position.is_snapshot_incomplete())
            .max_by_key(|(_, b)| b.bytes)
            .map(|(t, _)| t.clone())
    }

    /// Arrow bytes of buffered initial-copy rows, over all tables.
    pub(super) fn snapshot_bytes(&self) -> usize {
        self.buffers
            .values()
            .filter(|b| b.position.is_snapshot_incomplete())
            .map(|b| b.bytes)
            .sum()
    }

    /// Rewrites the buffered changes of `newer`'s table as changes of `newer`
    /// ([`TableChanges::evolve`]), so they commit together with changes read under it.
    pub(super) fn evolve(&mut self, newer: &Arc<TableSchema>) -> Result<(), ArrowError> {
        let Some(buffer) = self.buffers.get_mut(&newer.id) else {
            return Ok(());
        };
        let changes = buffer
            .changes
            .iter()
            .map(|c| c.evolve(newer))
            .collect::<Result<Vec<_>, _>>()?;
        buffer.bytes = changes.iter().map(|c| c.rows.get_array_memory_size()).sum();
        buffer.changes = changes;
        buffer.schema = Arc::clone(newer);
        self.schemas.insert(newer.id.clone(), Arc::clone(newer));
        Ok(())
    }

    /// Buffers `changes` at `position`; `opened` says where a buffer of streamed changes opens
    /// (`None`: initial-copy rows), kept from the buffer's first change.
    pub(super) fn push(
        &mut self,
        changes: TableChanges,
        position: &Position,
        opened: Option<Opened>,
    ) {
        let table = changes.schema.id.clone();
        let rows = changes.len();
        self.schemas.insert(table.clone(), changes.schema.clone());
        let buffer = self.buffers.entry(table).or_insert_with(|| {
            let mut b = TableBuffer::new(changes.schema.clone(), position);
            b.opened = opened;
            b
        });
        buffer.schema = changes.schema.clone();
        buffer.rows += rows;
        buffer.bytes += changes.rows.get_array_memory_size();
        buffer.position = position.clone();
        buffer.changes.push(changes);
        self.buffered_rows += rows;
    }
}
