//! The initial copy's events, as the pipeline books them: rows buffered at the incomplete
//! position and committed by size in the background, the chunk plan and each chunk's state kept
//! for the next commit's `cdcd.snapshot`, and the end of a table's copy committed at the
//! position where streaming takes over. Source-neutral: both sources send the same events.

use tracing::debug;

use super::{Committer, PipelineError, TableBuffer};
use crate::changelog::{Lsn, Op, Position, TableChanges, TableId};
use crate::sources::{ChunkState, SnapshotProgress};

impl Committer {
    /// A batch of copied rows: buffered at the incomplete position, committed in the
    /// background once the table's batch (rows; a partitioned table's: none) or all copies'
    /// bytes are full.
    pub(super) async fn copy_rows(&mut self, changes: TableChanges) -> Result<(), PipelineError> {
        let table = changes.schema.id.clone();
        let incomplete = self
            .received
            .as_ref()
            .map(Position::snapshot_incomplete)
            .unwrap_or(Position::Postgres(Lsn::ZERO));
        let rows = changes.ops.iter().filter(|op| **op != Op::Truncate).count();
        let bytes: usize = changes
            .rows
            .columns()
            .iter()
            .map(|c| c.to_data().get_slice_memory_size().unwrap_or(0))
            .sum();
        self.tables
            .copy_meter
            .copied(&self.settings.pipeline, &table, rows as u64, bytes as u64);
        if changes.ops.first() == Some(&Op::Truncate) {
            // A copy from scratch (the marker replaces what the table holds): no chunk of an
            // earlier copy of the table is in it any more, even under the same plan.
            if let Some(progress) = self.tables.progress.get_mut(&table) {
                progress.started.clear();
                progress.done.clear();
            }
        }
        self.schema_switch(&changes, None).await?;
        self.tables.push(changes, &incomplete, None);
        // A partitioned table's commit writes a file per partition its rows touch: its copy
        // commits by bytes alone, so files hold as many rows as the budget allows
        // (`Sink::splits_copy_by_partition`).
        let rows_per_commit = if self.sink.splits_copy_by_partition(&table) {
            usize::MAX
        } else {
            self.snapshot_batch.rows
        };
        let full = self
            .tables
            .buffers
            .get(&table)
            .is_some_and(|b| b.rows >= rows_per_commit);
        if full {
            self.commit_in_background(&table).await?;
        } else if self.tables.snapshot_bytes() >= self.snapshot_batch.bytes {
            // Copies of several tables fill the bytes together: the largest buffer frees most
            // (this batch's table may hold only a few rows of it).
            if let Some(largest) = self.tables.largest_copy() {
                self.commit_in_background(&largest).await?;
            }
        }
        Ok(())
    }

    /// A table's chunk plan. A resumed copy announces the plan it was given: what is started
    /// and done is kept.
    pub(super) fn copy_plan(
        &mut self,
        table: TableId,
        chunks: Vec<String>,
        estimated_rows: u64,
        estimated_bytes: u64,
    ) {
        self.tables.copy_meter.plan(
            &self.settings.pipeline,
            &table,
            estimated_rows,
            estimated_bytes,
        );
        let same = self
            .tables
            .progress
            .get(&table)
            .is_some_and(|p| p.chunks == chunks);
        if !same {
            let progress = SnapshotProgress {
                chunks,
                ..SnapshotProgress::default()
            };
            self.tables.progress.insert(table, progress);
        }
    }

    /// A chunk started or finished; recorded with the table's next commit.
    pub(super) fn copy_chunk(
        &mut self,
        table: &TableId,
        chunk: u32,
        state: ChunkState,
    ) -> Result<(), PipelineError> {
        match self.tables.progress.get_mut(table) {
            Some(progress) => {
                progress.apply(chunk, state);
                Ok(())
            }
            None => Err(PipelineError::SourceTask(format!(
                "chunk {chunk} of the copy of {table} without a plan"
            ))),
        }
    }

    /// The table's copy is complete at `position`: its last rows (or, when every batch is
    /// committed already, nothing) are committed at that position, which ends the copy.
    pub(super) async fn copy_done(
        &mut self,
        table: &TableId,
        position: Position,
    ) -> Result<(), PipelineError> {
        self.tables.progress.remove(table);
        self.tables.copy_meter.done(&self.settings.pipeline, table);
        let schema = self.tables.schemas.get(table).cloned();
        match (self.tables.buffers.get_mut(table), schema) {
            (Some(buffer), _) => {
                buffer.position = position.clone();
                buffer.force = true;
            }
            (None, Some(schema)) => {
                let mut buffer = TableBuffer::new(schema, &position);
                buffer.force = true;
                self.tables.buffers.insert(table.clone(), buffer);
            }
            (None, None) => {
                return Err(PipelineError::SourceTask(format!(
                    "the copy of {table} finished without any batch (a source sends at least the truncate marker)"
                )));
            }
        }
        debug!(table = %table, position = %position, "copy done");
        // Not a position received from the stream: a table copied exactly at a temporary slot's
        // snapshot is complete at a point past where the stream starts, and acknowledging that
        // point would let the slot forget the other tables' changes before it.
        self.commit_table(table).await?;
        Ok(())
    }
}
