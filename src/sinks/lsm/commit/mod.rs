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
//!    deletes every live file; none live: an `APPEND`) through `publish.rs`: the commit point. On failure the cached
//!    state is dropped and the next commit reloads what is durable.
//! 6. [`Commit::finish`]: the cached state advances, the background compactor starts when a
//!    bucket needs it, and old snapshots are expired when due; nothing here fails the commit.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int8Type;
use arrow_array::RecordBatch;
use tokio::sync::MutexGuard;

use super::expire;
use super::files;
use super::locate;
use super::lookup;
use super::partition::Slot;
use super::placement;
use super::plan::{self, Plan};
use super::publish;
use super::schema::{self, FileSchemas, PaimonSchema, KIND_DELETE};
use super::table::{Change, TableState};
use super::tables::{Handle, Tables};
use crate::changelog::{TableChanges, TableId, TableSchema};
use crate::checkpoint::Checkpoint;
use crate::config::{Deletes, MergeEngine};
use crate::sinks::{CommitStats, SinkError};

mod append;
mod changelog;
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
        // Refuses a partition_by for the keyless table.
        tables.partition_keys(&handle, input.schema).await?;
        return append::commit(tables, &handle, input).await;
    }
    tables.stall(&handle).await?;
    let partition = tables.partition_keys(&handle, input.schema).await?;
    let wanted = schema::paimon_schema(
        input.schema,
        tables.table_options(&input.schema.id),
        &partition,
    )?;
    let mut commit = Commit::new(tables, &handle, input, &wanted).await?;
    let mut planned = commit.plan()?;
    let found = commit.lookup(&mut planned).await?;
    let mut written = commit.write(&planned, &found).await?;
    // A resync's lineage keeps none: its swap into the live table is the changelog's boundary
    // (docs/internals.md, "Paimon changelog").
    if tables.config.changelog_for(&input.schema.id) && tables.lineage(&input.schema.id).is_none() {
        written.change.changelog = commit.changelog(&planned).await?;
    }
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
    /// `deletes = "soft"`: a key change leaves the old key's (flagged) row in place.
    keep_old_keys: bool,
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
        let keep_old_keys =
            self.tables.config.tables.resolve(self.table())?.deletes == Deletes::Soft;
        let plan = plan::plan(
            self.input.changes,
            &schemas,
            buckets,
            complete,
            keep_old_keys,
        )
        .map_err(|e| SinkError::Data {
            table: self.table().clone(),
            detail: format!("planning the commit: {e}"),
        })?;
        Ok(Planned {
            plan,
            schemas,
            buckets,
            keep_old_keys,
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
        let parts = if state.partitions.is_empty() {
            self.place(planned, &batch, state)
        } else {
            self.partitioned(planned, &batch, state).await?
        };
        let warehouse = &self.tables.warehouse;
        let (location, schemas) = (&state.location, &planned.schemas);
        let added = futures::future::try_join_all(parts.into_iter().map(
            |(slot, part, level)| async move {
                let file = files::NewFile::Data { level };
                let file =
                    files::write_file(warehouse, table, location, schemas, &slot, part, file)
                        .await?;
                Ok::<_, SinkError>((slot, file))
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
    ) -> Vec<(Slot, RecordBatch, i32)> {
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
                        .get(&Slot::unpartitioned(bucket as i32))
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
                        let slot = Slot::unpartitioned(bucket as i32);
                        files.push((slot, part.slice(start, rows), level));
                    }
                }
                None => files.push((Slot::unpartitioned(bucket as i32), part, 0)),
            }
        }
        files
    }

    /// The files `batch` (every bucket's rows, in plan order) is cut into in a partitioned
    /// table, as `(slot, rows, level)`: each row in the partition its values name, a delete in
    /// the partition its key's row is in (none: nothing to delete), and a row whose partition
    /// changed also as a delete in the partition it leaves, under the same sequence number
    /// (`locate.rs`). All at level 0: an initial copy's rows are not placed at the bottom level
    /// in a partitioned table.
    async fn partitioned(
        &self,
        planned: &Planned,
        batch: &RecordBatch,
        state: &TableState,
    ) -> Result<Vec<(Slot, RecordBatch, i32)>, SinkError> {
        let table = self.table();
        let rows = &planned.plan.rows;
        let buckets: Vec<i32> = rows.iter().map(|r| r.bucket as i32).collect();
        let current = if planned.plan.truncate {
            // Every live file goes with this commit.
            vec![None; rows.len()]
        } else {
            locate::current_partitions(
                &self.tables.warehouse,
                table,
                state,
                &planned.schemas,
                batch,
                &buckets,
            )
            .await?
        };
        let partitions = &state.partitions;
        let values: Vec<&dyn arrow_array::Array> = partitions
            .names
            .iter()
            .map(|name| {
                let column = batch
                    .schema()
                    .index_of(name)
                    .map_err(|source| SinkError::Arrow {
                        context: format!("partition column {name} of {table}"),
                        source,
                    })?;
                Ok(batch.column(column).as_ref())
            })
            .collect::<Result<_, SinkError>>()?;
        // (slot, batch row, written as a delete whatever its kind)
        let mut out: Vec<(Slot, u32, bool)> = Vec::with_capacity(rows.len());
        for (i, (row, current)) in rows.iter().zip(current).enumerate() {
            let bucket = row.bucket as i32;
            if row.delete {
                if let Some(partition) = current {
                    out.push((Slot { partition, bucket }, i as u32, false));
                }
                continue;
            }
            let partition =
                partitions
                    .partition_of(&values, i)
                    .map_err(|detail| SinkError::Data {
                        table: table.clone(),
                        detail: format!("the partition of a row: {detail}"),
                    })?;
            if let Some(left) = current.filter(|c| *c != partition) {
                out.push((
                    Slot {
                        partition: left,
                        bucket,
                    },
                    i as u32,
                    true,
                ));
            }
            out.push((Slot { partition, bucket }, i as u32, false));
        }
        cut_by_slot(batch, out, planned.schemas.key.len() + 1, table)
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
                change
                    .deleted
                    .extend(files.iter().map(|f| (b.clone(), f.clone())));
            }
        }
        // A TRUNCATE of an empty table (an initial copy's first commit) overwrites nothing: an
        // `APPEND`, which incremental readers of the changelog read (they skip `OVERWRITE`s).
        let kind = if change.deleted.is_empty() {
            "APPEND"
        } else {
            "OVERWRITE"
        };
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

/// The commit's rows cut into one batch per slot (`out`: slot, batch row, written as a delete
/// whatever its kind; `kinds`: the kind column).
fn cut_by_slot(
    batch: &RecordBatch,
    mut out: Vec<(Slot, u32, bool)>,
    kinds: usize,
    table: &TableId,
) -> Result<Vec<(Slot, RecordBatch, i32)>, SinkError> {
    // Stable: rows keep key order within a slot.
    out.sort_by(|a, b| a.0.cmp(&b.0));
    let mut files = Vec::new();
    for group in out.chunk_by(|a, b| a.0 == b.0) {
        let Some((slot, _, _)) = group.first() else {
            continue;
        };
        let take = arrow_array::UInt32Array::from_iter_values(group.iter().map(|g| g.1));
        let part = arrow_select::take::take_record_batch(batch, &take)
            .and_then(|part| {
                if !group.iter().any(|g| g.2) {
                    return Ok(part);
                }
                let kind = part.column(kinds).as_primitive::<Int8Type>();
                let moved: arrow_array::ArrayRef = Arc::new(
                    arrow_array::Int8Array::from_iter_values(group.iter().enumerate().map(
                        |(r, g)| {
                            if g.2 {
                                KIND_DELETE
                            } else {
                                kind.value(r)
                            }
                        },
                    )),
                );
                let mut columns = part.columns().to_vec();
                if let Some(c) = columns.get_mut(kinds) {
                    *c = moved;
                }
                RecordBatch::try_new(part.schema(), columns)
            })
            .map_err(|source| SinkError::Arrow {
                context: format!("cutting the commit's rows by partition of {table}"),
                source,
            })?;
        files.push((slot.clone(), part, 0));
    }
    Ok(files)
}
