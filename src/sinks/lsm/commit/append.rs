//! The commit of a keyless table, an append table (`append.rs`: the format and the pure plan):
//! the steps of [`Commit`] without the lookup, with a write of its own. The plan comes before the
//! table's lock, so changes an append table cannot take (an update or delete) are refused before
//! the table is created. No compaction runs on append tables, so the commit never stalls on one.

use std::sync::Arc;

use super::{Commit, Input, Published};
use crate::sinks::lsm::append::{self, AppendPlan, UNAWARE_BUCKETS};
use crate::sinks::lsm::expire;
use crate::sinks::lsm::files::{file_location, new_file_name, off_runtime};
use crate::sinks::lsm::partition::Slot;
use crate::sinks::lsm::schema;
use crate::sinks::lsm::store;
use crate::sinks::lsm::table::Change;
use crate::sinks::lsm::tables::{Handle, Tables};
use crate::sinks::{CommitStats, SinkError};

/// Commits `input`, the changes of a keyless table (the caller holds nothing): one `APPEND`
/// snapshot (`OVERWRITE` after a TRUNCATE) carrying the checkpoint.
pub(super) async fn commit(
    tables: &Arc<Tables>,
    handle: &Arc<Handle>,
    input: Input<'_>,
) -> Result<CommitStats, SinkError> {
    let table = &input.schema.id;
    let wanted = schema::paimon_schema(input.schema, append::table_options(), &[])?;
    let file_schema = append::file_schema(input.schema);
    let plan = append::plan(input.changes, &file_schema).map_err(|e| SinkError::Data {
        table: table.clone(),
        detail: format!("planning the commit: {e}"),
    })?;
    let mut commit = Commit::new(tables, handle, input, &wanted).await?;
    let change = commit.write_append(&plan).await?;
    let published = commit
        .publish(change, plan.truncate, UNAWARE_BUCKETS)
        .await?;
    Ok(commit.finish_append(&plan, published).await)
}

impl Commit<'_> {
    /// Encodes and puts the plan's files, in `bucket-0/`, rows numbered on from the table's
    /// next sequence number; none is visible yet.
    async fn write_append(&self, plan: &AppendPlan) -> Result<Change, SinkError> {
        let state = self.state()?;
        let table = self.table();
        let mut change = Change::default();
        // `publish::publish` advances `next_sequence` past the files' sequence numbers.
        let mut sequence = state.next_sequence;
        for batch in &plan.files {
            let name = new_file_name();
            let encoded = batch.clone();
            let first = sequence;
            let schema_id = state.schema.id;
            let what = "encoding a data file";
            let (bytes, meta) = off_runtime(table, what.to_owned(), what, move || {
                append::encode(&encoded, name, first, schema_id)
            })
            .await?;
            store::put(
                &self.tables.warehouse,
                &file_location(&state.location, &Slot::unpartitioned(0), &meta.file_name),
                bytes,
            )
            .await?;
            sequence += meta.row_count;
            change.added.push((Slot::unpartitioned(0), meta));
        }
        Ok(change)
    }

    /// After a successful publish: releases the table and expires old snapshots when due.
    async fn finish_append(self, plan: &AppendPlan, published: Published) -> CommitStats {
        let Commit {
            tables,
            handle,
            slot,
            ..
        } = self;
        drop(slot);
        expire::expire_if_due(tables, handle, published.snapshot_id).await;
        CommitStats {
            snapshot_id: published.snapshot_id,
            data_rows: plan.rows() as u64,
            deleted_rows: published.truncated,
            files_written: published.files_written,
            resync_swapped: false,
        }
    }
}
