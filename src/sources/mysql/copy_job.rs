//! One run's initial copy of MySQL/MariaDB tables: which tables share one consistent snapshot
//! and which are each copied whole at a snapshot of their own, the columns they are copied with,
//! and the schema history the stream then starts from.
//!
//! Where it sits: `MySqlSource::run` hands [`CopyJob::run`] the tables to copy (their entries
//! read before any snapshot, and what an interrupted copy finished) and streams from the position
//! it returns. `copy.rs` copies the chunks inside a snapshot and argues why the replica is exact;
//! `snapshot.rs` begins a snapshot at known columns; `altered.rs` says which read errors mean a
//! table changed after the snapshot.
//!
//! The steps:
//! 1. [`CopyJob::shared`]: one snapshot for every table that can share it. A fresh copy is
//!    complete at that snapshot P, where streaming starts. A resumed copy, or a table added to
//!    `source.tables`, is complete at `origin` (where streaming starts) with an upsert window up
//!    to the snapshot. Before any row is copied the schema history records each table's columns
//!    at the snapshot, so a restart after a crash mid-copy decodes the stream with them, not with
//!    what `information_schema` says by then.
//! 2. [`CopyJob::whole`]: each remaining table whole at a snapshot of its own, declared complete
//!    exactly there (no window): keyless tables of a resumed copy (a multiset has no key to match
//!    replayed inserts on), tables whose columns changed since `origin` (a window would replay
//!    changes of the older shape over rows of the newer one), and tables found altered after the
//!    shared snapshot (`altered.rs`), again at a newer snapshot while they keep being altered,
//!    at most [`COPY_ATTEMPTS`] times. Streaming starts before these snapshots; the pipeline skips
//!    each table's changes up to its own as committed.

use std::collections::HashMap;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::altered::{self, Altered, CopyError, COPY_ATTEMPTS};
use super::copy::{self, Copied, Finish};
use super::parallel;
use super::schema::TableEntry;
use super::setup::{self, server_err, Flavor};
use super::snapshot::{self, Pinned};
use super::stream::HistoryWriter;
use crate::changelog::{Position, TableId};
use crate::config::MySqlConfig;
use crate::sources::{SnapshotProgress, SourceError, SourceEvent};

/// The copy of one run, on the connection it owns meanwhile.
pub(super) struct CopyJob<'a> {
    pub conn: &'a mut Conn,
    pub flavor: Flavor,
    pub cfg: &'a MySqlConfig,
    pub events: &'a mpsc::Sender<SourceEvent>,
    pub shutdown: &'a CancellationToken,
    /// The schema history the stream decodes with afterwards; `None`: a resync's copy job, which
    /// does not stream and changes no source state.
    pub history: Option<&'a mut HistoryWriter>,
}

/// What a finished copy leaves for the stream.
pub(super) struct Copy {
    /// Where streaming starts.
    pub start: Position,
    /// Each copied table's entry at the first snapshot it was copied or planned at (what the
    /// schema history records for it).
    pub entries: Vec<TableEntry>,
}

/// A table to copy: its entry read before any snapshot, and what an interrupted copy finished.
pub(super) type ToCopy<'p> = (TableEntry, Option<&'p SnapshotProgress>);

impl CopyJob<'_> {
    /// Copies `tables` and returns where streaming starts, or `None` when shut down. `origin`:
    /// `None` for a fresh copy (complete at its snapshot); otherwise the position the tables are
    /// declared complete at (`copy.rs`).
    pub async fn run(
        mut self,
        tables: Vec<ToCopy<'_>>,
        origin: Option<Position>,
    ) -> Result<Option<Copy>, SourceError> {
        let (whole, shared): (Vec<ToCopy<'_>>, Vec<ToCopy<'_>>) = tables
            .into_iter()
            .partition(|(e, _)| origin.is_some() && e.schema.primary_key.is_empty());
        let mut whole: Vec<TableId> = whole
            .into_iter()
            .map(|(e, _)| e.schema.id.clone())
            .collect();
        if !whole.is_empty() {
            info!(
                tables = whole.len(),
                "copying keyless tables whole at a snapshot of their own"
            );
        }
        let mut entries = Vec::new();
        let start = match (&origin, shared.is_empty()) {
            (Some(from), true) => from.clone(),
            _ => {
                let Some((position, pinned, again)) = self.shared(shared, origin.as_ref()).await?
                else {
                    return Ok(None);
                };
                entries = pinned;
                whole.extend(again);
                origin.unwrap_or(position)
            }
        };
        for table in whole {
            if self.shutdown.is_cancelled() {
                return Ok(None);
            }
            let first = !entries.iter().any(|e| e.schema.id == table);
            match self.whole(table).await? {
                None => return Ok(None),
                Some(at) if first => entries.push(at),
                Some(_) => {}
            }
        }
        Ok(Some(Copy { start, entries }))
    }

    /// Copies `tables` at one new snapshot. Returns its position, every table's entry at it, and
    /// the tables to copy whole instead (their columns changed since `origin`, or they were
    /// altered after the snapshot before the copy read them); `None` when shut down.
    async fn shared(
        &mut self,
        tables: Vec<ToCopy<'_>>,
        origin: Option<&Position>,
    ) -> Result<Option<(Position, Vec<TableEntry>, Vec<TableId>)>, SourceError> {
        let progress: HashMap<TableId, &SnapshotProgress> = tables
            .iter()
            .filter_map(|(e, p)| p.map(|p| (e.schema.id.clone(), p)))
            .collect();
        let before = tables.into_iter().map(|(e, _)| e).collect();
        let Pinned { position, entries } =
            snapshot::begin_pinned(self.conn, self.flavor, self.cfg, before).await?;
        self.record_columns(&entries, origin.is_none()).await?;
        let mut again = Vec::new();
        let mut here = Vec::new();
        for entry in &entries {
            match origin {
                Some(from) if self.moved_since(entry, from)? => {
                    info!(table = %entry.schema.id, from = %from, "the table's columns changed since the position it resumes from: copying it whole at a snapshot of its own");
                    again.push(entry.schema.id.clone());
                }
                _ => here.push(entry),
            }
        }
        info!(snapshot = %position, from = %origin.unwrap_or(&position), tables = here.len(), "initial copy from a consistent snapshot");
        let finish = match origin {
            None => Finish {
                upsert_until: None,
                done_at: position.clone(),
            },
            Some(from) => Finish {
                upsert_until: Some(position.clone()),
                done_at: from.clone(),
            },
        };
        let mut plans = Vec::with_capacity(here.len());
        let mut altered = Vec::new();
        for entry in here {
            // A fresh copy replaces whatever an interrupted one left: without an origin, done
            // chunks read at an unknown position cannot be kept.
            let stored = progress
                .get(&entry.schema.id)
                .copied()
                .filter(|_| origin.is_some());
            let chunk_rows = self.cfg.snapshot_chunk_rows;
            match copy::plan_table(self.conn, entry, stored, chunk_rows, &finish.done_at).await {
                Ok(plan) => {
                    if !plan.fresh {
                        info!(table = %entry.schema.id, chunks = plan.chunks.len(), to_copy = plan.todo.len(), "resuming an interrupted initial copy at a new snapshot");
                    }
                    plans.push(plan);
                }
                Err(CopyError::Altered(a)) => {
                    info!(table = %entry.schema.id, cause = %a, "the table changed after the snapshot, before its chunks were planned");
                    altered.push((entry.schema.id.clone(), a));
                }
                Err(CopyError::Source(e)) => return Err(e),
            }
        }
        let wanted = self.cfg.snapshot_parallelism.min(plans.len());
        let mut helpers =
            parallel::open_at(self.cfg, self.flavor, &position, wanted.saturating_sub(1)).await;
        let copied = parallel::copy_tables(
            self.conn,
            &mut helpers,
            self.cfg,
            plans,
            &finish,
            self.events,
            self.shutdown,
        )
        .await?;
        for mut helper in helpers {
            // Read-only: ending the snapshot only releases it.
            if let Err(e) = helper.query_drop("COMMIT").await {
                tracing::debug!(error = %e, "ending a copy connection's snapshot");
            }
        }
        let Copied::All { altered: more, .. } = copied else {
            return Ok(None);
        };
        self.conn
            .query_drop("COMMIT")
            .await
            .map_err(server_err("ending the snapshot"))?;
        altered.extend(more);
        for (table, a) in &altered {
            if !a.copies_again() {
                return Err(altered::stop(table, *a, 1));
            }
            again.push(table.clone());
        }
        Ok(Some((position, entries, again)))
    }

    /// Copies `table` whole at a snapshot of its own, declared complete exactly there, and again
    /// at a newer one while it is found altered after it. Returns the table's entry at the
    /// snapshot it was copied at, or `None` when shut down.
    async fn whole(&mut self, table: TableId) -> Result<Option<TableEntry>, SourceError> {
        let mut cause = Altered::Rebuilt;
        for attempt in 1..=COPY_ATTEMPTS {
            crate::failpoints::crash_point(crate::failpoints::MYSQL_COPY_WHOLE);
            let key = self.cfg.key_columns.get(&table).map(Vec::as_slice);
            let gone = || altered::stop(&table, Altered::TableGone, attempt);
            let Some(before) = setup::load_table(self.conn, &table, key).await? else {
                return Err(gone());
            };
            let Pinned { position, entries } =
                snapshot::begin_pinned(self.conn, self.flavor, self.cfg, vec![before]).await?;
            let Some(at) = entries.into_iter().next() else {
                self.end_snapshot().await?;
                return Err(gone());
            };
            self.record_columns(std::slice::from_ref(&at), false)
                .await?;
            info!(table = %table, snapshot = %position, attempt, "copying the table whole at a snapshot of its own");
            let finish = Finish {
                upsert_until: None,
                done_at: position.clone(),
            };
            let chunk_rows = self.cfg.snapshot_chunk_rows;
            let found = match copy::plan_table(self.conn, &at, None, chunk_rows, &position).await {
                Ok(plan) => {
                    let copied = parallel::copy_tables(
                        self.conn,
                        &mut [],
                        self.cfg,
                        vec![plan],
                        &finish,
                        self.events,
                        self.shutdown,
                    )
                    .await?;
                    match copied {
                        Copied::ShutDown => return Ok(None),
                        Copied::All { altered, .. } => altered.first().map(|(_, a)| *a),
                    }
                }
                Err(CopyError::Altered(a)) => Some(a),
                Err(CopyError::Source(e)) => return Err(e),
            };
            self.end_snapshot().await?;
            match found {
                None => return Ok(Some(at)),
                Some(a) if !a.copies_again() => return Err(altered::stop(&table, a, attempt)),
                Some(a) => cause = a,
            }
        }
        Err(altered::stop(&table, cause, COPY_ATTEMPTS))
    }

    async fn end_snapshot(&mut self) -> Result<(), SourceError> {
        self.conn
            .query_drop("COMMIT")
            .await
            .map_err(server_err("ending the snapshot"))
    }

    /// Records `entries` (tables at a snapshot about to be copied) in the schema history before
    /// any of their rows is, so no checkpoint of theirs exists without their columns on record.
    /// `fresh`: streaming starts at this snapshot, so what the history held for these tables
    /// (from an earlier, abandoned copy) no longer applies; otherwise a table that has a
    /// history keeps it (the stream starts before this snapshot, where the history is right).
    async fn record_columns(
        &mut self,
        entries: &[TableEntry],
        fresh: bool,
    ) -> Result<(), SourceError> {
        let Some(history) = self.history.as_deref_mut() else {
            return Ok(());
        };
        let mut changed = false;
        for entry in entries {
            if fresh {
                changed |= history.forget(&entry.schema.id);
            }
            changed |= history.adopt(entry);
        }
        if changed {
            history.save().await?;
        }
        Ok(())
    }

    /// Whether `entry` (a table at this snapshot) looks different from the columns the schema
    /// history records for it at `from` in what a copy reads: names, types, nullability, key.
    /// A table without a history is taken as unchanged (nothing says otherwise).
    fn moved_since(&self, entry: &TableEntry, from: &Position) -> Result<bool, SourceError> {
        let Some(history) = self.history.as_deref() else {
            return Ok(false);
        };
        let Some(then) = history.in_force(&entry.schema.id, from)? else {
            return Ok(false);
        };
        Ok(!(then.schema.rows_fit(&entry.schema) && entry.schema.rows_fit(&then.schema)))
    }
}
