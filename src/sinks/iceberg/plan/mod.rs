//! The commit planner: decides, without any I/O, what one commit writes for an ordered run of
//! changes — which input rows go into which data file at which position, which keys get an
//! equality delete, which written rows get a position delete, and where each absent column's value
//! comes from. `files/writer.rs` carries the plan out; `rows/lookup.rs` fetches the table rows it
//! asks for.
//!
//! Why two kinds of deletes: an equality delete applies only to data files with a strictly lower
//! data sequence number (Iceberg spec, "Scan Planning": "an equality delete file must be applied
//! to a data file when … the data file's data sequence number is strictly less than the delete's
//! data sequence number"), so it removes a key's row from earlier snapshots but never a row this
//! commit writes. A row written by this commit and changed later in the same commit is removed by
//! a position delete (file_path, pos) on this commit's data file instead — or, when its file has
//! not been closed yet, simply not written.
//!
//! Rows are planned the way a streaming writer would write them: appended to an open file that
//! rolls at [`FileLimits`]; a superseded row still in the open file is dropped, one in a closed
//! file gets a position delete.
//!
//! A commit of whole-row inserts whose keys are distinct by order (an initial copy's batch) skips
//! the per-key bookkeeping: `plan/inserts.rs` plans it as the general path would, without hashing.

use std::collections::HashMap;

use arrow_array::RecordBatch;
use arrow_row::{Row, RowConverter, Rows, SortField};
use arrow_schema::ArrowError;

use crate::changelog::{Op, TableChanges};

mod append;
mod cut;
mod inserts;
mod multiset;

/// When a data file rolls over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimits {
    pub max_rows: usize,
    /// Estimated from the in-memory size of the Arrow rows (Parquet files come out smaller).
    pub max_bytes: usize,
}

impl Default for FileLimits {
    fn default() -> Self {
        FileLimits {
            max_rows: 1_000_000,
            max_bytes: 128 * 1024 * 1024,
        }
    }
}

/// Row `row` of `changes[batch].rows`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowRef {
    pub batch: u32,
    pub row: u32,
}

/// A key in the input: the key columns of `changes[batch].rows` at `row`, or, when `old`, row
/// `row` of `changes[batch].old_keys` (the previous key of an update that changed its key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRef {
    pub batch: u32,
    pub row: u32,
    pub old: bool,
}

/// Where an absent cell's value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellSource {
    /// The same column of an earlier change in this commit.
    Change(RowRef),
    /// The same column of row `n` of the table lookup (`Plan::lookups[n]`).
    Table(u32),
}

/// An absent cell of a planned data row and where its value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fill {
    /// Position of the row in its file.
    pub pos: u32,
    pub column: u32,
    pub source: CellSource,
}

/// One data file to write: its rows in order and the values for their absent cells.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlannedFile {
    pub rows: Vec<RowRef>,
    /// Sorted by `pos`.
    pub fills: Vec<Fill>,
}

/// What one commit writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// A truncate happened: the snapshot drops every earlier data and delete file.
    pub truncate: bool,
    pub files: Vec<PlannedFile>,
    /// Rows of this commit's files that a later change superseded: (file index, position), sorted.
    pub position_deletes: Vec<(u32, u32)>,
    /// Keys whose row in an earlier snapshot is gone, each once.
    pub equality_deletes: Vec<KeyRef>,
    /// Keys whose current row must be read from the table to complete absent columns, each once.
    pub lookups: Vec<KeyRef>,
    /// Keyless multiset tables (`plan/multiset.rs`): deletes that each remove one live row of an
    /// earlier snapshot equal to the whole row `changes[batch].rows[row]`; one entry per copy.
    pub row_deletes: Vec<RowRef>,
}

impl Plan {
    pub fn data_rows(&self) -> usize {
        self.files.iter().map(|f| f.rows.len()).sum()
    }
}

/// The changes cannot be planned.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("primary key column is NULL")]
    NullKey { key: KeyRef },
    #[error("cannot complete a partial update: row not in table")]
    Incomplete { key: KeyRef, column: usize },
    #[error("encoding keys: {0}")]
    Arrow(#[from] ArrowError),
    #[error("too many rows in one commit")]
    TooLarge,
    #[error("{op:?} of a table without a key: cdcd replicates keyless tables insert-only, and nothing identifies the row it changes (give the table a key)")]
    Keyless { op: Op },
    #[error("insert into a table without a key lacks a column value")]
    KeylessAbsent { column: usize },
    #[error("the before image of an UPDATE or DELETE of a table without a key lacks a column, so it does not identify the row (Postgres: ALTER TABLE … REPLICA IDENTITY FULL; MySQL/MariaDB: SET GLOBAL binlog_row_image = 'FULL')")]
    PartialImage { column: usize },
    #[error("a DELETE or UPDATE of a table without a key removes a row the table does not hold: the replica is not the source's multiset")]
    NoSuchRow { row: RowRef },
}

#[derive(Clone, Copy)]
enum Slot {
    /// The key's row is ordinal `n` of this commit.
    Live(usize),
    /// The key has no row: deleted in this commit (with an equality delete if it was in the table)
    /// or never there since a truncate.
    Gone,
}

#[derive(Clone, Copy)]
enum Loc {
    Open(usize),
    Written { file: u32, pos: u32 },
    Dropped,
}

struct Appended {
    row: RowRef,
    /// Range of this row's entries in `Planner::cells`.
    cells: (usize, usize),
    loc: Loc,
}

/// Where the previous version of a key's row is.
enum Prior {
    Ordinal(usize),
    Table(KeyRef),
    None,
}

struct Planner<'a> {
    changes: &'a [TableChanges],
    limits: FileLimits,
    /// A key change leaves the old key's row in place ([`plan_keeping_old_keys`]).
    keep_old_keys: bool,
    row_bytes: Vec<usize>,
    slots: HashMap<Row<'a>, Slot>,
    appended: Vec<Appended>,
    /// Absent cells of appended rows: (column, source).
    cells: Vec<(u32, CellSource)>,
    /// The open file: ordinals, `None` where superseded before the file closed.
    open: Vec<Option<usize>>,
    open_live: usize,
    open_bytes: usize,
    plan: Plan,
}

/// Plans one commit of `changes` (all of one table, in order); `key` indexes the key columns
/// (empty: a keyless append table, `plan/append.rs`).
pub fn plan(
    changes: &[TableChanges],
    key: &[usize],
    limits: FileLimits,
) -> Result<Plan, PlanError> {
    if key.is_empty() {
        // A keyless table with deletes is a multiset (its sources send whole before images);
        // one with inserts only stays on the plain append path.
        let deletes = changes.iter().any(|c| c.ops.contains(&Op::Delete));
        return if deletes {
            multiset::plan_multiset(changes, limits)
        } else {
            append::plan_append(changes, limits)
        };
    }
    plan_with(changes, key, limits, Route::Any, false)
}

/// [`plan`] for a table with soft deletes (`sinks/cdc_columns.rs`): an update that changes its
/// key keeps the old key's row (a soft delete just before it flagged that row) and completes the
/// new key's absent columns from it.
pub fn plan_keeping_old_keys(
    changes: &[TableChanges],
    key: &[usize],
    limits: FileLimits,
) -> Result<Plan, PlanError> {
    if key.is_empty() {
        return plan(changes, key, limits);
    }
    plan_with(changes, key, limits, Route::Any, true)
}

/// Which planner may plan a commit (tests compare the two on the same input).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    /// The insert fast path when it applies (`inserts.rs`), else the general one.
    Any,
    #[cfg(test)]
    General,
}

fn plan_with(
    changes: &[TableChanges],
    key: &[usize],
    limits: FileLimits,
    route: Route,
    keep_old_keys: bool,
) -> Result<Plan, PlanError> {
    let Some(first) = changes.first() else {
        return Ok(Plan::default());
    };
    let fields = key
        .iter()
        .filter_map(|&k| first.rows.schema().fields().get(k).cloned())
        .map(|f| SortField::new(f.data_type().clone()))
        .collect::<Vec<_>>();
    let converter = RowConverter::new(fields)?;
    let mut new_keys = Vec::with_capacity(changes.len());
    for c in changes {
        new_keys.push(encode_keys(&converter, &c.rows, key)?);
    }
    let row_bytes = changes
        .iter()
        .map(|c| c.rows.get_array_memory_size() / c.len().max(1))
        .collect::<Vec<_>>();
    if route == Route::Any {
        if let Some(plan) =
            inserts::plan_distinct_inserts(changes, key, &new_keys, &row_bytes, limits)
        {
            return Ok(plan);
        }
    }
    let mut old_keys = Vec::with_capacity(changes.len());
    for c in changes {
        let all: Vec<usize> = (0..c.old_keys.num_columns()).collect();
        old_keys.push(encode_keys(&converter, &c.old_keys, &all)?);
    }
    let planner = Planner {
        changes,
        limits,
        keep_old_keys,
        row_bytes,
        // Sized for one key per change up front: growing it rehashed every key several times.
        slots: HashMap::with_capacity(changes.iter().map(TableChanges::len).sum()),
        appended: Vec::new(),
        cells: Vec::new(),
        open: Vec::new(),
        open_live: 0,
        open_bytes: 0,
        plan: Plan::default(),
    };
    planner.run(key, &new_keys, &old_keys)
}

/// The key columns of `batch` as comparable rows (one allocation per batch, not per row).
pub fn encode_keys(
    converter: &RowConverter,
    batch: &RecordBatch,
    key: &[usize],
) -> Result<Rows, ArrowError> {
    let columns: Vec<_> = key
        .iter()
        .filter_map(|&k| batch.columns().get(k).cloned())
        .collect();
    converter.convert_columns(&columns)
}

impl<'a> Planner<'a> {
    fn run(
        mut self,
        key: &[usize],
        new_keys: &'a [Rows],
        old_keys: &'a [Rows],
    ) -> Result<Plan, PlanError> {
        let changes = self.changes;
        for (b, c) in changes.iter().enumerate() {
            let batch = u32::try_from(b).map_err(|_| PlanError::TooLarge)?;
            let (Some(new_rows), Some(old_rows)) = (new_keys.get(b), old_keys.get(b)) else {
                continue;
            };
            for (r, op) in c.ops.iter().enumerate() {
                let row = u32::try_from(r).map_err(|_| PlanError::TooLarge)?;
                let this = RowRef { batch, row };
                let key_ref = KeyRef {
                    batch,
                    row,
                    old: false,
                };
                if *op == Op::Truncate {
                    self.truncate();
                    continue;
                }
                if key.iter().any(|&k| c.rows.column(k).is_null(r)) {
                    return Err(PlanError::NullKey { key: key_ref });
                }
                let k = new_rows.row(r);
                match op {
                    Op::Insert => {
                        let prior = match self.slots.get(&k) {
                            Some(Slot::Live(_)) => self.remove(k, key_ref),
                            _ => Prior::None,
                        };
                        self.append(this, k, key_ref, prior)?;
                    }
                    Op::Update => {
                        let changed = c.key_changed.get(r).copied().unwrap_or(false);
                        let prior = if changed {
                            let old_ref = KeyRef {
                                old: true,
                                ..key_ref
                            };
                            if c.old_keys.columns().iter().any(|a| a.is_null(r)) {
                                return Err(PlanError::NullKey { key: old_ref });
                            }
                            let prior = if self.keep_old_keys {
                                self.find(old_rows.row(r), old_ref)
                            } else {
                                self.remove(old_rows.row(r), old_ref)
                            };
                            // The new key normally has no row; if this commit wrote one, it is
                            // replaced (a row of the table under the new key cannot exist: the
                            // source's key is unique; with soft deletes it can, flagged).
                            if self.keep_old_keys
                                || matches!(self.slots.get(&k), Some(Slot::Live(_)))
                            {
                                self.remove(k, key_ref);
                            }
                            prior
                        } else {
                            self.remove(k, key_ref)
                        };
                        self.append(this, k, key_ref, prior)?;
                    }
                    Op::Delete => {
                        self.remove(k, key_ref);
                    }
                    Op::Truncate => {}
                }
            }
        }
        self.close_file();
        self.plan.position_deletes.sort_unstable();
        Ok(self.plan)
    }

    /// Every row written so far is gone, and so is everything in earlier snapshots.
    fn truncate(&mut self) {
        self.plan = Plan {
            truncate: true,
            ..Plan::default()
        };
        self.slots.clear();
        self.appended.clear();
        self.cells.clear();
        self.open.clear();
        self.open_live = 0;
        self.open_bytes = 0;
    }

    /// Removes the current row of `k` and says where it was.
    fn remove(&mut self, k: Row<'a>, key_ref: KeyRef) -> Prior {
        match self.slots.insert(k, Slot::Gone) {
            Some(Slot::Live(o)) => {
                if let Some(a) = self.appended.get_mut(o) {
                    match a.loc {
                        Loc::Open(i) => {
                            if let Some(slot) = self.open.get_mut(i) {
                                *slot = None;
                            }
                            self.open_live -= 1;
                            let bytes = self.row_bytes.get(a.row.batch as usize).copied();
                            self.open_bytes = self.open_bytes.saturating_sub(bytes.unwrap_or(0));
                        }
                        Loc::Written { file, pos } => self.plan.position_deletes.push((file, pos)),
                        Loc::Dropped => {}
                    }
                    a.loc = Loc::Dropped;
                }
                Prior::Ordinal(o)
            }
            Some(Slot::Gone) => Prior::None,
            None if self.plan.truncate => Prior::None,
            None => {
                self.plan.equality_deletes.push(key_ref);
                Prior::Table(key_ref)
            }
        }
    }

    /// Where the current row of `k` is, leaving it in place.
    fn find(&self, k: Row<'a>, key_ref: KeyRef) -> Prior {
        match self.slots.get(&k) {
            Some(Slot::Live(o)) => Prior::Ordinal(*o),
            Some(Slot::Gone) => Prior::None,
            None if self.plan.truncate => Prior::None,
            None => Prior::Table(key_ref),
        }
    }

    fn append(
        &mut self,
        this: RowRef,
        k: Row<'a>,
        key_ref: KeyRef,
        prior: Prior,
    ) -> Result<(), PlanError> {
        let changes = self.changes;
        let Some(c) = changes.get(this.batch as usize) else {
            return Ok(());
        };
        let start = self.cells.len();
        if c.has_absent() {
            let mut table_row = None;
            for col in 0..c.schema.columns.len() {
                if c.is_present(col, this.row as usize) {
                    continue;
                }
                let source = match prior {
                    Prior::Ordinal(o) => self.resolve(o, col),
                    Prior::Table(kr) => {
                        let n = *table_row.get_or_insert_with(|| {
                            self.plan.lookups.push(kr);
                            self.plan.lookups.len() - 1
                        });
                        Some(CellSource::Table(n as u32))
                    }
                    Prior::None => None,
                };
                let Some(source) = source else {
                    return Err(PlanError::Incomplete {
                        key: key_ref,
                        column: col,
                    });
                };
                self.cells.push((col as u32, source));
            }
        }
        let ordinal = self.appended.len();
        self.appended.push(Appended {
            row: this,
            cells: (start, self.cells.len()),
            loc: Loc::Open(self.open.len()),
        });
        self.open.push(Some(ordinal));
        self.open_live += 1;
        self.open_bytes += self
            .row_bytes
            .get(this.batch as usize)
            .copied()
            .unwrap_or(0);
        self.slots.insert(k, Slot::Live(ordinal));
        if self.open_live >= self.limits.max_rows || self.open_bytes >= self.limits.max_bytes {
            self.close_file();
        }
        Ok(())
    }

    /// The value of `col` in appended row `o`: its own, or where its own absent cell came from.
    fn resolve(&self, o: usize, col: usize) -> Option<CellSource> {
        let a = self.appended.get(o)?;
        let c = self.changes.get(a.row.batch as usize)?;
        if c.is_present(col, a.row.row as usize) {
            return Some(CellSource::Change(a.row));
        }
        self.cells
            .get(a.cells.0..a.cells.1)?
            .iter()
            .find(|(c, _)| *c as usize == col)
            .map(|(_, s)| *s)
    }

    fn close_file(&mut self) {
        if self.open_live == 0 {
            self.open.clear();
            return;
        }
        let file = self.plan.files.len() as u32;
        let mut planned = PlannedFile {
            rows: Vec::with_capacity(self.open_live),
            fills: Vec::new(),
        };
        for o in self.open.drain(..).flatten() {
            let Some(a) = self.appended.get_mut(o) else {
                continue;
            };
            let pos = planned.rows.len() as u32;
            a.loc = Loc::Written { file, pos };
            planned.rows.push(a.row);
            if let Some(cells) = self.cells.get(a.cells.0..a.cells.1) {
                planned
                    .fills
                    .extend(cells.iter().map(|&(column, source)| Fill {
                        pos,
                        column,
                        source,
                    }));
            }
        }
        self.plan.files.push(planned);
        self.open_live = 0;
        self.open_bytes = 0;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
