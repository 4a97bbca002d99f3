//! The commit: one table's changes become one snapshot carrying the checkpoint, produced in
//! steps by [`Commit`], one method per step (iceberg-rust's `SnapshotProducer` is the model, as
//! for the Iceberg sink's `RowDelta` in `sinks/iceberg/commit/`).
//!
//! [`commit`] drives the steps:
//! 0. Changes read under an older schema than the table's are widened to it (`evolve.rs`,
//!    `behind`). A keyless table's go to an append commit (`commit/append.rs`). A primary-key
//!    table's commit waits while a bucket has `stop_trigger` sorted runs or more (the write stall,
//!    `compaction/schedule.rs`), so compaction can never fall behind for good.
//! 1. [`Commit::new`] takes the table's lock, held until the snapshot is published (a commit is
//!    read-modify-write of the table's newest snapshot), and creates the table or evolves its
//!    schema to the changes' (`evolve.rs`).
//! 2. [`Commit::plan`]: the changes become one row per touched key, sorted by (bucket, key)
//!    (`plan.rs`, pure).
//! 3. [`Commit::lookup`]: the current rows that complete partial updates (`lookup.rs`).
//! 4. [`Commit::write`]: per touched bucket one level-0 Parquet file holding the last state of
//!    every key the commit changed, or, for an initial copy, key blocks straight at the bottom
//!    level (`placement.rs`); each encoded off the async workers and put (`files.rs`). None is
//!    visible yet.
//! 5. [`Commit::publish`]: one `APPEND` snapshot (after a TRUNCATE an `OVERWRITE` that also
//!    deletes every live file) through `publish.rs`: the commit point. On failure the cached
//!    state is dropped and the next commit reloads what is durable.
//! 6. [`Commit::finish`]: the cached state advances, the background compactor starts when a
//!    bucket needs it, and old snapshots are expired when due; nothing here fails the commit.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use arrow_array::RecordBatch;
use tokio::sync::MutexGuard;

use super::expire;
use super::files;
use super::lookup;
use super::placement;
use super::plan::{self, Plan};
use super::publish;
use super::schema::{self, FileSchemas, PaimonSchema};
use super::table::{Change, TableState};
use super::tables::{Handle, Tables};
use crate::changelog::{TableChanges, TableId, TableSchema};
use crate::checkpoint::Checkpoint;
use crate::config::MergeEngine;
use crate::sinks::{CommitStats, SinkError};

mod append;
mod evolve;

/// What the pipeline hands to one commit.
#[derive(Clone, Copy)]
pub(super) struct Input<'a> {
    pub schema: &'a TableSchema,
    pub changes: &'a [TableChanges],
    pub checkpoint: &'a Checkpoint,
}

/// Commits `input` to its table, in the steps of the module doc.
pub(super) async fn commit(
    tables: &Arc<Tables>,
    input: Input<'_>,
) -> Result<CommitStats, SinkError> {
    let handle = tables.handle(&input.schema.id);
    let widened = tables.behind(input.schema, input.changes, &handle).await?;
    let input = match &widened {
        Some((newer, widened)) => Input {
            schema: newer.as_ref(),
            changes: widened.as_slice(),
            ..input
        },
        None => input,
    };
    if input.schema.primary_key.is_empty() {
        return append::commit(tables, &handle, input).await;
    }
    tables.stall(&handle).await?;
    let wanted = schema::paimon_schema(input.schema, tables.table_options(&input.schema.id))?;
    let mut commit = Commit::new(tables, &handle, input, &wanted).await?;
    let mut planned = commit.plan()?;
    let found = commit.lookup(&mut planned).await?;
    let written = commit.write(&planned, &found).await?;
    let buckets = planned.buckets as i32;
    let published = commit
        .publish(written.change, planned.plan.truncate, buckets)
        .await?;
    commit.finish(&planned, written.base, published).await
}

/// One commit of one table; see the module doc for the steps.
pub(super) struct Commit<'a> {
    tables: &'a Arc<Tables>,
    handle: &'a Arc<Handle>,
    input: Input<'a>,
    /// The table's state, locked from [`Commit::new`] until the commit is finished.
    slot: MutexGuard<'a, Option<TableState>>,
}

/// What [`Commit::plan`] decided: the rows to write, and the shape of the files holding them.
pub(super) struct Planned {
    plan: Plan,
    schemas: FileSchemas,
    buckets: u32,
}

/// The current rows [`Commit::lookup`] found: the batch (data file shape) and, per
/// `plan.lookups` entry, its row in it (`None`: no row, the key ends deleted).
pub(super) struct Found {
    batch: Option<RecordBatch>,
    rows: Vec<Option<u32>>,
}

/// The data files [`Commit::write`] put, and the sequence number they start at.
pub(super) struct Written {
    change: Change,
    base: i64,
}

/// What [`Commit::publish`] made durable.
pub(super) struct Published {
    snapshot_id: i64,
    /// Rows a TRUNCATE removed (the live files' rows).
    truncated: u64,
    files_written: usize,
}

impl<'a> Commit<'a> {
    /// Locks the table and brings it to `wanted`, the schema the changes need: created when it
    /// does not exist, evolved when that adds columns or widens types, refused otherwise.
    pub(super) async fn new(
        tables: &'a Arc<Tables>,
        handle: &'a Arc<Handle>,
        input: Input<'a>,
        wanted: &PaimonSchema,
    ) -> Result<Commit<'a>, SinkError> {
        let mut slot = handle.state.lock().await;
        tables
            .refuse_added_defaults(input.schema, &mut slot)
            .await?;
        tables
            .ensure_created(input.schema, &mut slot, wanted)
            .await?;
        Ok(Commit {
            tables,
            handle,
            input,
            slot,
        })
    }

    fn table(&self) -> &'a TableId {
        &self.input.schema.id
    }

    /// The table's state, loaded by [`Commit::new`].
    fn state(&self) -> Result<&TableState, SinkError> {
        self.slot.as_ref().ok_or_else(|| SinkError::Corrupt {
            path: self.tables.table_location(self.table()),
            detail: "a commit to a table that is not loaded".into(),
        })
    }

    /// Plans the changes: one row per touched key, each column naming where its value comes
    /// from.
    pub(super) fn plan(&self) -> Result<Planned, SinkError> {
        let state = self.state()?;
        let schemas = FileSchemas::new(self.input.schema)
            .with_schema_id(state.schema.id)
            .with_aliases(state.aliases.clone());
        let buckets = state.buckets(self.tables.config.buckets_for(self.table()));
        let complete = self.tables.config.merge_engine == MergeEngine::Deduplicate;
        let plan = plan::plan(self.input.changes, &schemas, buckets, complete).map_err(|e| {
            SinkError::Data {
                table: self.table().clone(),
                detail: format!("planning the commit: {e}"),
            }
        })?;
        Ok(Planned {
            plan,
            schemas,
            buckets,
        })
    }

    /// Finds the current rows of the keys whose partial updates need them.
    pub(super) async fn lookup(&self, planned: &mut Planned) -> Result<Found, SinkError> {
        let state = self.state()?;
        let (batch, rows) = lookup::lookup(
            &self.tables.warehouse,
            self.table(),
            state,
            &planned.schemas,
            &planned.plan,
            self.input.changes,
        )
        .await?;
        // A key whose partial updates found no row inside an upsert window ends deleted
        // (lookup.rs): the row is deleted later inside the window anyway.
        let plan = &mut planned.plan;
        for (i, f) in rows.iter().enumerate() {
            let row = plan.lookups.get(i).map(|l| l.row).filter(|_| f.is_none());
            if let Some(out) = row.and_then(|r| plan.rows.get_mut(r)) {
                out.delete = true;
            }
        }
        Ok(Found { batch, rows })
    }

    /// Builds the planned rows and puts them as data files, all at once; none is visible yet.
    pub(super) async fn write(
        &self,
        planned: &Planned,
        found: &Found,
    ) -> Result<Written, SinkError> {
        let state = self.state()?;
        let table = self.table();
        let base = state.next_sequence;
        let batch = planned
            .plan
            .build(&planned.schemas, base, found.batch.as_ref(), &found.rows)
            .map_err(|e| SinkError::Data {
                table: table.clone(),
                detail: format!("building data files: {e}"),
            })?;
        let parts = self.place(planned, &batch, state);
        let warehouse = &self.tables.warehouse;
        let (location, schemas) = (&state.location, &planned.schemas);
        let added = futures::future::try_join_all(parts.into_iter().map(
            |(bucket, part, level)| async move {
                let file =
                    files::write_file(warehouse, table, location, schemas, bucket, part, level, 0)
                        .await?;
                Ok::<_, SinkError>((bucket, file))
            },
        ))
        .await?;
        Ok(Written {
            change: Change {
                added,
                ..Change::default()
            },
            base,
        })
    }

    /// The files `batch` (every bucket's rows, in plan order) is cut into, as `(bucket, rows,
    /// level)`: each bucket's rows as one level-0 run, except an initial copy's key blocks.
    fn place(
        &self,
        planned: &Planned,
        batch: &RecordBatch,
        state: &TableState,
    ) -> Vec<(i32, RecordBatch, i32)> {
        let plan = &planned.plan;
        // An initial copy's key blocks go straight to the bottom level (placement.rs), unless
        // a compaction is running: its output, placed by the inputs it read, could then
        // overlap them on its level.
        let copying = self.input.checkpoint.snapshot.is_some() || plan.truncate;
        let to_bottom = copying && !self.handle.compacting.load(Ordering::Acquire);
        let chunks: Vec<Option<u32>> = self.input.changes.iter().map(|c| c.copy_chunk).collect();
        let mut files = Vec::new();
        for (bucket, first, len) in plan.bucket_ranges() {
            let part = batch.slice(first, len);
            let bottom = if to_bottom {
                let live = if plan.truncate {
                    &[][..]
                } else {
                    state
                        .files
                        .get(&(bucket as i32))
                        .map_or(&[][..], Vec::as_slice)
                };
                placement::for_bucket(plan, &chunks, &planned.schemas, first, &part, live)
            } else {
                None
            };
            match bottom {
                Some(cuts) => {
                    let level = self.tables.compaction.max_level;
                    for (start, rows) in cuts {
                        files.push((bucket as i32, part.slice(start, rows), level));
                    }
                }
                None => files.push((bucket as i32, part, 0)),
            }
        }
        files
    }

    /// Publishes `change` as one snapshot of the table carrying the checkpoint: an `APPEND`, or
    /// after a TRUNCATE an `OVERWRITE` that also deletes every live file. On failure the cached
    /// state is dropped (the next commit reloads what is durable).
    pub(super) async fn publish(
        &mut self,
        mut change: Change,
        truncate: bool,
        buckets: i32,
    ) -> Result<Published, SinkError> {
        let table = self.table();
        let Some(state) = self.slot.as_mut() else {
            return Err(SinkError::Corrupt {
                path: self.tables.table_location(table),
                detail: "a commit to a table that is not loaded".into(),
            });
        };
        let files_written = change.added.len();
        let mut truncated = 0u64;
        if truncate {
            for (b, files) in &state.files {
                truncated += files.iter().map(|f| f.row_count as u64).sum::<u64>();
                change.deleted.extend(files.iter().map(|f| (*b, f.clone())));
            }
        }
        let kind = if truncate { "OVERWRITE" } else { "APPEND" };
        let props: BTreeMap<String, String> =
            self.input.checkpoint.to_properties().into_iter().collect();
        let published = publish::publish(
            &self.tables.warehouse,
            table,
            state,
            change,
            kind,
            props,
            buckets,
        )
        .await;
        match published {
            Ok(snapshot_id) => Ok(Published {
                snapshot_id,
                truncated,
                files_written,
            }),
            Err(e) => {
                *self.slot = None;
                Err(e)
            }
        }
    }

    /// After a successful publish: advances the cached state past the commit's sequence
    /// numbers, releases the table, and starts what the commit made due (compaction, expiry).
    pub(super) async fn finish(
        mut self,
        planned: &Planned,
        base: i64,
        published: Published,
    ) -> Result<CommitStats, SinkError> {
        let plan = &planned.plan;
        let deletes = plan.rows.iter().filter(|r| r.delete).count() as u64;
        let Some(state) = self.slot.as_mut() else {
            return Err(SinkError::Corrupt {
                path: self.tables.table_location(self.table()),
                detail: "the table's state vanished during a commit".into(),
            });
        };
        state.next_sequence = state.next_sequence.max(base + plan.changes as i64 + 1);
        self.handle
            .copying
            .store(self.input.checkpoint.snapshot.is_some(), Ordering::Release);
        let needs_compaction = self.tables.needs_compaction(state, self.handle);
        drop(self.slot);
        if needs_compaction {
            self.tables.spawn_compaction(self.handle);
        }
        expire::expire_if_due(self.tables, self.handle, published.snapshot_id).await;
        Ok(CommitStats {
            snapshot_id: published.snapshot_id,
            data_rows: plan.rows.len() as u64 - deletes,
            deleted_rows: deletes + published.truncated,
            files_written: published.files_written,
            resync_swapped: false,
        })
    }
}
