//! The columns cdcd adds to a table's rows when its `[sink.tables."…"]` section asks
//! (docs/table-settings.md): `_cdc_deleted` (`deletes = "soft"`), `_cdc_commit_ts` and
//! `_cdc_position` (`row_metadata = true`).
//!
//! Where it sits: at the start of a sink's commit, before anything is planned. The changes are
//! rewritten into changes of the table with those columns appended, so the sink's own machinery
//! (completing absent columns from the row's current values, replacing a key's row) writes them:
//! - a delete becomes an update of its key that sets `_cdc_deleted = true` and leaves the other
//!   columns as the source sent them, mostly absent: the sink completes them from the row, so the
//!   flagged row keeps its last values;
//! - an insert becomes an update carrying the whole row (an upsert): the key may hold a
//!   soft-deleted row, which the insert replaces, live again. Not during an initial copy, whose
//!   rows are new to the table (the copy keeps its fast path);
//! - an update that changes the key (k1 → k2) is preceded by a soft delete of k1; the planner then
//!   keeps k1's flagged row (`keep_old_keys`) and completes k2's absent columns from it;
//! - a table without a key: a delete (the whole before image, which is how the sources send it)
//!   removes its row as before and is followed by an insert of that image flagged. Such a table's
//!   UPDATE arrives as a delete plus an insert, so its before image stays as a flagged row too;
//! - a source's TRUNCATE is refused (an initial copy's, which empties the table it fills, is
//!   not): flagging every row means rewriting the whole table, and removing them
//!   would lose what soft deletes keep (the error says what to do).
//!
//! `_cdc_commit_ts` and `_cdc_position` of a row are those of the change that last wrote it (a
//! soft delete writes it too).
//!
//! Pure: one Arrow `interleave` per run that gains rows (key changes, keyless deletes), none
//! otherwise.

// `SinkError` is large (it carries `iceberg::Error` by value, sinks/mod.rs), as in the sinks.
#![allow(clippy::result_large_err)]

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions};
use arrow_buffer::BooleanBuffer;
use arrow_schema::{ArrowError, DataType, TimeUnit};

use crate::changelog::{Column, Op, TableChanges, TableId, TableSchema};
use crate::config::{Deletes, TableSettings};
use crate::sinks::SinkError;

/// `deletes = "soft"`: true on a row the source deleted, false on a live row.
pub const DELETED: &str = "_cdc_deleted";
/// `row_metadata = true`: the source commit time of the change that last wrote the row.
pub const COMMIT_TS: &str = "_cdc_commit_ts";
/// `row_metadata = true`: the source position of the change that last wrote the row.
pub const POSITION: &str = "_cdc_position";

/// The table's schema with the added columns, and the changes rewritten for it.
pub type WithColumns = (Arc<TableSchema>, Vec<TableChanges>);

/// Refuses a commit that would drop `_cdc_deleted` from a table that has it (`has_deleted`) once
/// its `deletes = "soft"` was removed: its flagged rows would read as live rows, and a key deleted
/// at the source could then be inserted again beside its flagged row. Both sinks ask before
/// anything is written.
pub fn refuse_unflagging(
    table: &TableId,
    has_deleted: bool,
    soft_deletes: bool,
    schema: &TableSchema,
) -> Result<(), SinkError> {
    if has_deleted && !soft_deletes && schema.column_index(DELETED).is_none() {
        return Err(SinkError::Data {
            table: table.clone(),
            detail: format!(
                "the table has {DELETED} from deletes = \"soft\", which its settings no longer ask for: its soft-deleted rows would read as live. Set deletes = \"soft\" for it again, or resync it (`cdcd resync --table {table}`: the new copy holds the source's rows only, without the column)"
            ),
        });
    }
    Ok(())
}

/// Which of the columns a table gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CdcColumns {
    pub soft_deletes: bool,
    pub row_metadata: bool,
    /// The table stores initial defaults (Iceberg v3): rows written before `_cdc_deleted` was
    /// added read false. Otherwise they read NULL (live as well).
    pub defaults: bool,
}

/// Where and when in the source a run of changes happened (`row_metadata`).
pub trait ChangeMeta {
    /// The source commit time (microseconds since the Unix epoch) and position (as
    /// `cdcd.position` writes it) of the changes of `run`, which are of one source transaction.
    fn of_run(&self, run: &TableChanges) -> (Option<i64>, Option<String>);
}

/// Where a column of the table with the added columns comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The source's column `j`.
    Source(usize),
    /// A column cdcd adds.
    Added(&'static str),
}

/// How a row of the rewritten run is made.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Made {
    /// Change `i` as it came (its op maybe rewritten).
    As(usize),
    /// A soft delete of change `i`'s old key (before a key change).
    OldKeyDeleted(usize),
    /// Change `i`'s whole row, flagged deleted (after a keyless delete).
    Flagged(usize),
}

impl Made {
    fn source(self) -> usize {
        match self {
            Made::As(i) | Made::OldKeyDeleted(i) | Made::Flagged(i) => i,
        }
    }
}

impl CdcColumns {
    /// The columns `settings` ask for.
    pub fn of(settings: &TableSettings, defaults: bool) -> CdcColumns {
        CdcColumns {
            soft_deletes: settings.deletes == Deletes::Soft,
            row_metadata: settings.row_metadata,
            defaults,
        }
    }

    /// No column added: the changes go to the sink as they are.
    pub fn is_none(&self) -> bool {
        !self.soft_deletes && !self.row_metadata
    }

    /// The names this table gets, in the order they are appended.
    pub fn names(&self) -> Vec<&'static str> {
        let mut names = Vec::new();
        if self.soft_deletes {
            names.push(DELETED);
        }
        if self.row_metadata {
            names.push(COMMIT_TS);
            names.push(POSITION);
        }
        names
    }

    /// The settings for `cdcd check`: `deletes soft, row_metadata (adds _cdc_deleted, …)`.
    pub fn describe(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.soft_deletes {
            parts.push("deletes soft");
        }
        if self.row_metadata {
            parts.push("row_metadata");
        }
        (!parts.is_empty())
            .then(|| format!("{} (adds {})", parts.join(", "), self.names().join(", ")))
    }

    /// `source` with the columns added, and where each column of it comes from. A source
    /// column of the same name is refused: cdcd would overwrite the source's values. `existing`:
    /// the table's column names in order, when it exists: a column cdcd added stays where the
    /// table has it, so a column the source adds later comes after it (Iceberg's schema
    /// evolution here appends new columns and keeps the order of the others).
    pub fn schema(
        &self,
        source: &TableSchema,
        existing: Option<&[String]>,
    ) -> Result<(TableSchema, Vec<Place>), SinkError> {
        let mut order: Vec<Place> = (0..source.columns.len()).map(Place::Source).collect();
        let before = |order: &[Place], at: usize, existing: &[String]| {
            let head = existing.get(..at).unwrap_or_default();
            order
                .iter()
                .filter(|p| match p {
                    Place::Source(j) => source.columns.get(*j).is_some_and(|c| {
                        head.contains(&c.name) || c.former_names.iter().any(|f| head.contains(f))
                    }),
                    Place::Added(name) => head.iter().any(|h| h == name),
                })
                .count()
        };
        for name in self.names() {
            if source.column_index(name).is_some() {
                return Err(SinkError::Data {
                    table: source.id.clone(),
                    detail: format!(
                        "the source table has a column {name}, the name of the column cdcd adds for {}: rename the source column, or turn the setting off for this table",
                        if name == DELETED {
                            "deletes = \"soft\""
                        } else {
                            "row_metadata = true"
                        }
                    ),
                });
            }
            let at = existing
                .and_then(|e| {
                    e.iter()
                        .position(|n| n == name)
                        .map(|i| before(&order, i, e))
                })
                .unwrap_or(order.len());
            order.insert(at.min(order.len()), Place::Added(name));
        }
        let mut schema = source.clone();
        schema.columns = order
            .iter()
            .filter_map(|p| match p {
                Place::Source(j) => source.columns.get(*j).cloned(),
                Place::Added(name) => Some(self.column(name)),
            })
            .collect();
        schema.primary_key = source
            .primary_key
            .iter()
            .filter_map(|k| order.iter().position(|p| *p == Place::Source(*k)))
            .collect();
        Ok((schema, order))
    }

    fn column(&self, name: &'static str) -> Column {
        let (data_type, source_type) = match name {
            DELETED => (DataType::Boolean, "boolean"),
            COMMIT_TS => (
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                "timestamptz",
            ),
            _ => (DataType::Utf8, "text"),
        };
        Column {
            name: name.to_owned(),
            data_type,
            nullable: true,
            source_type: source_type.to_owned(),
            initial_default: (name == DELETED && self.defaults).then(|| "false".to_owned()),
            former_names: Vec::new(),
        }
    }

    /// `changes` (of `schema`, in order) as changes of the table with the columns (see the
    /// module doc). `copying`: the changes are an initial copy's rows, new to the table (so are
    /// the rows of a run without a source transaction).
    /// `None` when no column is added.
    pub fn apply(
        &self,
        schema: &Arc<TableSchema>,
        changes: &[TableChanges],
        copying: bool,
        existing: Option<&[String]>,
        meta: &dyn ChangeMeta,
    ) -> Result<Option<WithColumns>, SinkError> {
        if self.is_none() {
            return Ok(None);
        }
        let (table, order) = self.schema(schema, existing)?;
        let table = Arc::new(table);
        let mut out = Vec::with_capacity(changes.len());
        for c in changes {
            let arrow = |source: ArrowError| SinkError::Arrow {
                context: format!(
                    "adding {} to changes of {}",
                    self.names().join(", "),
                    table.id
                ),
                source,
            };
            out.push(self.rewrite(&table, &order, c, copying, meta, &arrow)?);
        }
        Ok(Some((table, out)))
    }

    /// [`apply`](Self::apply) to one commit carrying `checkpoint`: its rows are an initial
    /// copy's while the checkpoint holds copy progress, and a run without a source transaction
    /// takes the checkpoint's position.
    pub fn apply_to_commit(
        &self,
        schema: &Arc<TableSchema>,
        changes: &[TableChanges],
        checkpoint: &crate::checkpoint::Checkpoint,
        existing: Option<&[String]>,
    ) -> Result<Option<WithColumns>, SinkError> {
        let meta = CommitMeta {
            position: checkpoint.position.to_string(),
        };
        self.apply(
            schema,
            changes,
            checkpoint.snapshot.is_some(),
            existing,
            &meta,
        )
    }

    fn rewrite(
        &self,
        table: &Arc<TableSchema>,
        order: &[Place],
        c: &TableChanges,
        copying: bool,
        meta: &dyn ChangeMeta,
        arrow: &dyn Fn(ArrowError) -> SinkError,
    ) -> Result<TableChanges, SinkError> {
        // Rows no source transaction wrote are an initial copy's (its TRUNCATE empties the
        // table the copy fills).
        let copying = copying || c.source_tx.is_none();
        let RowPlan {
            made,
            ops,
            key_changed,
        } = self.plan_rows(c, copying)?;
        let same_rows = made.iter().enumerate().all(|(j, m)| *m == Made::As(j));
        let n = made.len();
        let (columns, present) = source_columns(c, &made, same_rows, arrow)?;
        let added = self.added_columns(c, &made, &ops, meta)?;
        let old_keys = old_keys(c, &made, same_rows, arrow)?;
        let (columns, present) = in_table_order(order, columns, present, &added);
        let rows_schema = TableChanges::rows_schema(table);
        let options = RecordBatchOptions::new().with_row_count(Some(n));
        let rows =
            RecordBatch::try_new_with_options(rows_schema, columns, &options).map_err(arrow)?;
        Ok(TableChanges {
            schema: Arc::clone(table),
            ops,
            rows,
            present,
            old_keys,
            key_changed,
            upsert_window: c.upsert_window,
            copy_chunk: c.copy_chunk,
            source_tx: c.source_tx.clone(),
        })
    }

    /// How each row of the rewritten run is made from `c`'s changes, with its op and whether it
    /// changes its key.
    fn plan_rows(&self, c: &TableChanges, copying: bool) -> Result<RowPlan, SinkError> {
        let keyless = c.schema.primary_key.is_empty();
        let mut made = Vec::with_capacity(c.len());
        let mut ops = Vec::with_capacity(c.len());
        let mut key_changed = Vec::with_capacity(c.len());
        for (i, op) in c.ops.iter().enumerate() {
            let changed = c.key_changed.get(i).copied().unwrap_or(false);
            if !self.soft_deletes {
                made.push(Made::As(i));
                ops.push(*op);
                key_changed.push(changed);
                continue;
            }
            match op {
                Op::Truncate if !copying => {
                    return Err(SinkError::Data {
                        table: c.schema.id.clone(),
                        detail: "TRUNCATE of a table with deletes = \"soft\": cdcd keeps deleted rows flagged, and flagging every row would rewrite the whole table, while removing them would lose the rows soft deletes keep. Resync the table (`cdcd resync --table …`: it then holds the source's rows, none flagged), or set deletes = \"hard\" for it and resync".into(),
                    });
                }
                Op::Delete if keyless => {
                    made.push(Made::As(i));
                    ops.push(Op::Delete);
                    key_changed.push(false);
                    made.push(Made::Flagged(i));
                    ops.push(Op::Insert);
                    key_changed.push(false);
                }
                Op::Delete => {
                    made.push(Made::As(i));
                    ops.push(Op::Update);
                    key_changed.push(false);
                }
                Op::Insert if !keyless && !copying => {
                    made.push(Made::As(i));
                    ops.push(Op::Update);
                    key_changed.push(false);
                }
                Op::Update if changed => {
                    made.push(Made::OldKeyDeleted(i));
                    ops.push(Op::Update);
                    key_changed.push(false);
                    made.push(Made::As(i));
                    ops.push(Op::Update);
                    key_changed.push(true);
                }
                _ => {
                    made.push(Made::As(i));
                    ops.push(*op);
                    key_changed.push(changed);
                }
            }
        }
        Ok(RowPlan {
            made,
            ops,
            key_changed,
        })
    }

    /// The columns cdcd adds, each `made.len()` rows long: `_cdc_deleted`, `_cdc_commit_ts`,
    /// `_cdc_position`, as the table asks.
    fn added_columns(
        &self,
        c: &TableChanges,
        made: &[Made],
        ops: &[Op],
        meta: &dyn ChangeMeta,
    ) -> Result<Vec<(&'static str, ArrayRef)>, SinkError> {
        let keyless = c.schema.primary_key.is_empty();
        let n = made.len();
        let mut added: Vec<(&'static str, ArrayRef)> = Vec::with_capacity(3);
        if self.soft_deletes {
            let deleted = made.iter().zip(ops).map(|(m, op)| {
                Some(match m {
                    Made::OldKeyDeleted(_) | Made::Flagged(_) => true,
                    // A keyless delete names the live row, whose flag is false.
                    Made::As(i) => c.ops.get(*i) == Some(&Op::Delete) && *op != Op::Delete,
                })
            });
            added.push((
                DELETED,
                Arc::new(BooleanArray::from_iter(deleted)) as ArrayRef,
            ));
        }
        if self.row_metadata {
            if keyless && ops.contains(&Op::Delete) {
                return Err(SinkError::Data {
                    table: c.schema.id.clone(),
                    detail: "a DELETE or UPDATE of a table without a key, with row_metadata = true: such a table's row is found by its whole image, and the source's image has no _cdc_commit_ts or _cdc_position. Give the table a key, or set row_metadata = false for it (a table without a key with row_metadata takes inserts only)".into(),
                });
            }
            let (ts, position) = meta.of_run(c);
            added.push((
                COMMIT_TS,
                Arc::new(
                    arrow_array::TimestampMicrosecondArray::from(vec![ts; n]).with_timezone("UTC"),
                ),
            ));
            let positions = std::iter::repeat_n(position.as_deref(), n);
            added.push((
                POSITION,
                Arc::new(arrow_array::StringArray::from_iter(positions)),
            ));
        }
        Ok(added)
    }
}

/// Each run's source transaction ([`TableChanges::source_tx`]); rows no transaction wrote (an
/// initial copy's) carry the commit's checkpoint position, where the copy's table is consistent,
/// and no commit time.
pub struct CommitMeta {
    pub position: String,
}

/// The rows of a rewritten run: how each is made, its op, whether it changes its key.
struct RowPlan {
    made: Vec<Made>,
    ops: Vec<Op>,
    key_changed: Vec<bool>,
}

/// The source's columns and presence bits for the rows `made` (the run's own when
/// `same_rows`): an old key's soft delete takes the key from the old keys and carries only it.
#[allow(clippy::type_complexity)]
fn source_columns(
    c: &TableChanges,
    made: &[Made],
    same_rows: bool,
    arrow: &dyn Fn(ArrowError) -> SinkError,
) -> Result<(Vec<ArrayRef>, Vec<Option<BooleanBuffer>>), SinkError> {
    let n = made.len();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(c.rows.num_columns());
    let mut present: Vec<Option<BooleanBuffer>> = Vec::with_capacity(c.rows.num_columns());
    let key = &c.schema.primary_key;
    let old_key_rows = made.iter().any(|m| matches!(m, Made::OldKeyDeleted(_)));
    for (j, column) in c.rows.columns().iter().enumerate() {
        let key_at = key.iter().position(|&k| k == j);
        if same_rows {
            columns.push(Arc::clone(column));
        } else {
            // Source 0: the rows; source 1: the old keys (key columns only).
            let old = key_at.and_then(|at| c.old_keys.columns().get(at));
            let sources: Vec<&dyn Array> = match old {
                Some(old) if old_key_rows => vec![column.as_ref(), old.as_ref()],
                _ => vec![column.as_ref()],
            };
            let picks: Vec<(usize, usize)> = made
                .iter()
                .map(|m| match m {
                    Made::OldKeyDeleted(i) if sources.len() > 1 => (1, *i),
                    other => (0, other.source()),
                })
                .collect();
            let picked = arrow_select::interleave::interleave(&sources, &picks).map_err(arrow)?;
            columns.push(picked);
        }
        let bits = c.present.get(j).cloned().flatten();
        present.push(if bits.is_none() && !old_key_rows {
            None
        } else {
            // A soft delete of an old key carries the key only: the rest is the row's.
            Some(BooleanBuffer::collect_bool(n, |r| match made.get(r) {
                Some(Made::OldKeyDeleted(_)) => key_at.is_some(),
                Some(m) => c.is_present(j, m.source()),
                None => false,
            }))
        });
    }
    Ok((columns, present))
}

/// The old keys of the rows `made`.
fn old_keys(
    c: &TableChanges,
    made: &[Made],
    same_rows: bool,
    arrow: &dyn Fn(ArrowError) -> SinkError,
) -> Result<RecordBatch, SinkError> {
    if same_rows {
        return Ok(c.old_keys.clone());
    }
    let picks: Vec<u32> = made.iter().map(|m| m.source() as u32).collect();
    let picks = arrow_array::UInt32Array::from(picks);
    let keys = c
        .old_keys
        .columns()
        .iter()
        .map(|k| arrow_select::take::take(k, &picks, None))
        .collect::<Result<Vec<_>, _>>()
        .map_err(arrow)?;
    // A keyless table's old keys have no column: the row count says how many.
    let options = RecordBatchOptions::new().with_row_count(Some(made.len()));
    RecordBatch::try_new_with_options(c.old_keys.schema(), keys, &options).map_err(arrow)
}

/// The source's columns and the added ones in the table's `order`.
fn in_table_order(
    order: &[Place],
    columns: Vec<ArrayRef>,
    present: Vec<Option<BooleanBuffer>>,
    added: &[(&'static str, ArrayRef)],
) -> (Vec<ArrayRef>, Vec<Option<BooleanBuffer>>) {
    let mut columns_in_order = Vec::with_capacity(order.len());
    let mut present_in_order = Vec::with_capacity(order.len());
    for place in order {
        match place {
            Place::Source(j) => {
                if let (Some(col), Some(bits)) = (columns.get(*j), present.get(*j)) {
                    columns_in_order.push(Arc::clone(col));
                    present_in_order.push(bits.clone());
                }
            }
            Place::Added(name) => {
                if let Some((_, col)) = added.iter().find(|(n, _)| n == name) {
                    columns_in_order.push(Arc::clone(col));
                    present_in_order.push(None);
                }
            }
        }
    }
    (columns_in_order, present_in_order)
}

impl ChangeMeta for CommitMeta {
    fn of_run(&self, run: &TableChanges) -> (Option<i64>, Option<String>) {
        match &run.source_tx {
            Some(tx) => (Some(tx.commit_micros), Some(tx.position.to_string())),
            None => (None, Some(self.position.clone())),
        }
    }
}

#[cfg(test)]
#[path = "cdc_columns_tests.rs"]
mod tests;
