//! The plan of a commit to a keyless table whose updates and deletes carry the whole before
//! image (issue 23: Postgres `REPLICA IDENTITY FULL`, MySQL/MariaDB `binlog_row_image = FULL`).
//! The sources write an update as a delete of the before image followed by an insert of the
//! after image, so this sees only inserts, deletes and truncates, in source order.
//!
//! The table is a multiset: a delete removes exactly one row equal to its image, never every
//! equal row (which is why no equality delete is ever planned for it: an equality delete would
//! remove all duplicates). Rows are equal when every column is (NULL equal to NULL), compared
//! through `arrow_row`'s encoding of the whole row.
//!
//! Why the plan is exact: equal rows are indistinguishable, so removing any one copy leaves the
//! same multiset. A delete first takes a copy this commit inserted and still holds (the newest:
//! it is dropped from the open file, or gets a position delete if its file is closed) and
//! otherwise names one copy in an earlier snapshot ([`Plan::row_deletes`]); the commit then
//! locates one distinct live row per such delete by scanning the snapshot
//! (`iceberg/rows/multiset.rs`) and stops if there are fewer live copies than deletes. The order
//! inside the commit is kept, so a delete never takes a copy inserted after it, and a delete with
//! no copy anywhere stops instead of being skipped. State lives only in the snapshot the commit
//! builds on: there is no occurrence counter to replay after a crash.

use std::collections::HashMap;

use arrow_row::{Row, RowConverter, Rows, SortField};

use super::{FileLimits, Plan, PlanError, PlannedFile, RowRef};
use crate::changelog::{Op, TableChanges};

/// Where a row this commit inserted is.
#[derive(Clone, Copy)]
enum Loc {
    /// Position `i` of the open file.
    Open(usize),
    Written {
        file: u32,
        pos: u32,
    },
}

struct Planner<'a> {
    limits: FileLimits,
    /// Inserted rows still live, by content: their ordinals, newest last.
    live: HashMap<Row<'a>, Vec<usize>>,
    /// Every inserted row's location, by ordinal.
    locs: Vec<Loc>,
    /// The open file: rows, `None` where deleted before the file closed.
    open: Vec<Option<RowRef>>,
    /// Ordinal of each open row.
    open_ordinals: Vec<usize>,
    open_live: usize,
    open_bytes: usize,
    plan: Plan,
}

/// The plan of `changes` (all of one keyless table, in order), with deletes as multiset deletes.
pub(super) fn plan_multiset(
    changes: &[TableChanges],
    limits: FileLimits,
) -> Result<Plan, PlanError> {
    let Some(first) = changes.first() else {
        return Ok(Plan::default());
    };
    let fields = first
        .rows
        .schema()
        .fields()
        .iter()
        .map(|f| SortField::new(f.data_type().clone()))
        .collect::<Vec<_>>();
    let converter = RowConverter::new(fields)?;
    let encoded = changes
        .iter()
        .map(|c| converter.convert_columns(c.rows.columns()))
        .collect::<Result<Vec<Rows>, _>>()?;
    let planner = Planner {
        limits,
        live: HashMap::new(),
        locs: Vec::new(),
        open: Vec::new(),
        open_ordinals: Vec::new(),
        open_live: 0,
        open_bytes: 0,
        plan: Plan::default(),
    };
    planner.run(changes, &encoded)
}

impl<'a> Planner<'a> {
    fn run(mut self, changes: &[TableChanges], encoded: &'a [Rows]) -> Result<Plan, PlanError> {
        for (b, (c, rows)) in changes.iter().zip(encoded).enumerate() {
            let batch = u32::try_from(b).map_err(|_| PlanError::TooLarge)?;
            let bytes = c.rows.get_array_memory_size() / c.len().max(1);
            for (r, op) in c.ops.iter().enumerate() {
                let row = u32::try_from(r).map_err(|_| PlanError::TooLarge)?;
                let this = RowRef { batch, row };
                let absent = || (0..c.schema.columns.len()).find(|&col| !c.is_present(col, r));
                match op {
                    Op::Truncate => self.truncate(),
                    Op::Insert => {
                        if let Some(column) = absent() {
                            return Err(PlanError::KeylessAbsent { column });
                        }
                        self.insert(this, rows.row(r), bytes);
                    }
                    Op::Delete => {
                        if let Some(column) = absent() {
                            return Err(PlanError::PartialImage { column });
                        }
                        self.delete(this, rows.row(r), bytes)?;
                    }
                    Op::Update => return Err(PlanError::Keyless { op: *op }),
                }
            }
        }
        self.close_file();
        self.plan.position_deletes.sort_unstable();
        Ok(self.plan)
    }

    fn truncate(&mut self) {
        self.plan = Plan {
            truncate: true,
            ..Plan::default()
        };
        self.live.clear();
        self.locs.clear();
        self.open.clear();
        self.open_ordinals.clear();
        self.open_live = 0;
        self.open_bytes = 0;
    }

    fn insert(&mut self, this: RowRef, k: Row<'a>, bytes: usize) {
        let ordinal = self.locs.len();
        self.locs.push(Loc::Open(self.open.len()));
        self.open.push(Some(this));
        self.open_ordinals.push(ordinal);
        self.open_live += 1;
        self.open_bytes = self.open_bytes.saturating_add(bytes);
        self.live.entry(k).or_default().push(ordinal);
        if self.open_live >= self.limits.max_rows || self.open_bytes >= self.limits.max_bytes {
            self.close_file();
        }
    }

    /// Removes one row equal to `k`: one this commit inserted if any, else one of the table's.
    fn delete(&mut self, this: RowRef, k: Row<'a>, bytes: usize) -> Result<(), PlanError> {
        let Some(ordinal) = self.live.get_mut(&k).and_then(Vec::pop) else {
            // After a truncate in this commit the earlier snapshots hold nothing for it.
            if self.plan.truncate {
                return Err(PlanError::NoSuchRow { row: this });
            }
            self.plan.row_deletes.push(this);
            return Ok(());
        };
        match self.locs.get(ordinal).copied() {
            Some(Loc::Open(i)) => {
                if let Some(slot) = self.open.get_mut(i) {
                    *slot = None;
                }
                self.open_live -= 1;
                self.open_bytes = self.open_bytes.saturating_sub(bytes);
            }
            Some(Loc::Written { file, pos }) => self.plan.position_deletes.push((file, pos)),
            None => {}
        }
        Ok(())
    }

    fn close_file(&mut self) {
        if self.open_live == 0 {
            self.open.clear();
            self.open_ordinals.clear();
            return;
        }
        let file = self.plan.files.len() as u32;
        let mut planned = PlannedFile {
            rows: Vec::with_capacity(self.open_live),
            fills: Vec::new(),
        };
        for (row, &ordinal) in self.open.iter().zip(&self.open_ordinals) {
            let Some(row) = row else { continue };
            let pos = planned.rows.len() as u32;
            if let Some(loc) = self.locs.get_mut(ordinal) {
                *loc = Loc::Written { file, pos };
            }
            planned.rows.push(*row);
        }
        self.open.clear();
        self.open_ordinals.clear();
        self.plan.files.push(planned);
        self.open_live = 0;
        self.open_bytes = 0;
    }
}
