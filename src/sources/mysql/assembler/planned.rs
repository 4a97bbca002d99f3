//! The assembler's planned path for rows events: row images read in place by
//! [`super::super::image`] and converted straight into the transaction's Arrow builders, with no
//! per-row or per-value allocation. `assembler/mod.rs` takes it whenever every column of the table has
//! a planned layout, and falls back to `mysql_common`'s rows otherwise; both give the same
//! changes (the tests in `image/tests.rs` compare them on captured events).

use mysql_common::binlog::events::RowsEventData;

use crate::changelog::{append_null, Op};

use super::super::image::{append_cell, Cell, ImagePlan, Scratch};
use super::super::schema::TableEntry;
use super::super::types::{append, ColumnDefault, Origin};
use super::{column_err, Assembler, Step, StreamError};
use crate::config::ZeroDate;

/// The reused buffers of one planned rows event, taken out of the assembler while its builder
/// is borrowed.
struct Images {
    plan: ImagePlan,
    before_present: Vec<usize>,
    after_present: Vec<usize>,
    before: Vec<Cell>,
    after: Vec<Cell>,
    scratch: Scratch,
}

impl Assembler {
    /// Appends the rows of `rows` (whose table's layout `self.plan` holds) as `op` changes.
    pub(super) fn on_rows_planned(
        &mut self,
        rows: &RowsEventData<'_>,
        op: Op,
        entry: &TableEntry,
    ) -> Result<Step, StreamError> {
        let ncols = entry.schema.columns.len();
        let mut images = Images {
            plan: std::mem::take(&mut self.plan),
            before_present: std::mem::take(&mut self.before_present),
            after_present: std::mem::take(&mut self.after_present),
            before: std::mem::take(&mut self.before_cells),
            after: std::mem::take(&mut self.after_cells),
            scratch: std::mem::take(&mut self.scratch),
        };
        let has_before = fill_present(
            &mut images.before_present,
            rows.columns_before_image().map(|b| b.iter_ones()),
            ncols,
        );
        let has_after = fill_present(
            &mut images.after_present,
            rows.columns_after_image().map(|b| b.iter_ones()),
            ncols,
        );
        let position = self.position.to_string();
        let zero_date = self.zero_date;
        let result = self
            .builder_for(&entry.schema)
            .and_then(|b| {
                append_rows(
                    b,
                    rows.rows_data(),
                    op,
                    entry,
                    (has_before, has_after),
                    &mut images,
                    zero_date,
                    &position,
                )
            })
            .map(|()| Step::Nothing);
        self.plan = images.plan;
        self.before_present = images.before_present;
        self.after_present = images.after_present;
        self.before_cells = images.before;
        self.after_cells = images.after;
        self.scratch = images.scratch;
        result
    }
}

/// `present` = the set bits of an image's column bitmap (below `ncols`); `false` when the event
/// has no such image.
fn fill_present(
    present: &mut Vec<usize>,
    ones: Option<impl Iterator<Item = usize>>,
    ncols: usize,
) -> bool {
    present.clear();
    match ones {
        Some(ones) => {
            present.extend(ones.filter(|&i| i < ncols));
            true
        }
        None => false,
    }
}

#[expect(
    clippy::too_many_arguments,
    reason = "one rows event's inputs, split out so the builder borrow stays local"
)]
fn append_rows(
    b: &mut crate::changelog::TableChangesBuilder,
    data: &[u8],
    op: Op,
    entry: &TableEntry,
    (has_before, has_after): (bool, bool),
    images: &mut Images,
    zero_date: ZeroDate,
    position: &str,
) -> Result<(), StreamError> {
    let err = |detail: String| StreamError::Table {
        table: entry.schema.id.clone(),
        detail,
        position: position.to_owned(),
    };
    if (op == Op::Delete && !has_before) || (op != Op::Delete && !has_after) {
        return Err(err("rows event without an image".into()));
    }
    let Images {
        plan,
        before_present,
        after_present,
        before,
        after,
        scratch,
    } = images;
    let key = &entry.schema.primary_key;
    let mut pos = 0;
    while pos < data.len() {
        if has_before {
            plan.scan(data, &mut pos, before_present, before)
                .map_err(|d| err(format!("rows event: {d}")))?;
        }
        if has_after {
            plan.scan(data, &mut pos, after_present, after)
                .map_err(|d| err(format!("rows event: {d}")))?;
        }
        let image: &[Cell] = if op == Op::Delete {
            before.as_slice()
        } else {
            after.as_slice()
        };
        b.begin(op);
        for (i, kind) in entry.kinds.iter().enumerate() {
            let mut cell = image.get(i).copied().unwrap_or(Cell::Absent);
            // A key column missing from an update's after image (MINIMAL) comes from the
            // before image, which holds the key.
            if cell == Cell::Absent && op == Op::Update && key.contains(&i) {
                cell = before.get(i).copied().unwrap_or(Cell::Absent);
            }
            let no_builder = || err(format!("no builder for column {i}"));
            match cell {
                Cell::Null => append_null(b.value(i).ok_or_else(no_builder)?)
                    .map_err(|e| column_err(entry, i, e.to_string(), position))?,
                Cell::At { start, end } => {
                    let layout = plan.layout(i).ok_or_else(no_builder)?;
                    let bytes = data.get(start..end).unwrap_or_default();
                    append_cell(b.value(i).ok_or_else(no_builder)?, kind, layout, bytes, zero_date, scratch)
                        .map_err(|e| column_err(entry, i, e.0, position))?
                }
                // MariaDB's MINIMAL image of an INSERT holds only the columns the statement
                // named; the others took their defaults.
                Cell::Absent if op == Op::Insert => match entry.defaults.get(i) {
                    Some(ColumnDefault::Value(v)) => {
                        append(b.value(i).ok_or_else(no_builder)?, kind, v, Origin::Query, zero_date)
                            .map_err(|e| column_err(entry, i, format!("default: {}", e.0), position))?
                    }
                    other => {
                        return Err(column_err(
                            entry,
                            i,
                            format!("an INSERT's row image leaves the column out and its default {other:?} is not a constant cdcd can apply; use binlog_row_image = FULL"),
                            position,
                        ))
                    }
                },
                Cell::Absent => b.absent(i).map_err(|e| err(e.to_string()))?,
            }
        }
        if op == Op::Update && has_before && key_changed(key, data, before, after) {
            append_old_key(b, data, entry, plan, before, scratch, zero_date, position)?;
        } else {
            b.no_old_key().map_err(|e| err(e.to_string()))?;
        }
    }
    Ok(())
}

/// The old key of an update that changed its key, from the before image's cells.
#[expect(
    clippy::too_many_arguments,
    reason = "one rows event's inputs, split out so the builder borrow stays local"
)]
fn append_old_key(
    b: &mut crate::changelog::TableChangesBuilder,
    data: &[u8],
    entry: &TableEntry,
    plan: &ImagePlan,
    before: &[Cell],
    scratch: &mut Scratch,
    zero_date: ZeroDate,
    position: &str,
) -> Result<(), StreamError> {
    let err = |detail: String| StreamError::Table {
        table: entry.schema.id.clone(),
        detail,
        position: position.to_owned(),
    };
    for (k, &col) in entry.schema.primary_key.iter().enumerate() {
        let old = b
            .old_key(k)
            .ok_or_else(|| err("no old-key builder".into()))?;
        match before.get(col).copied() {
            Some(Cell::At { start, end }) => {
                let kind = entry
                    .kinds
                    .get(col)
                    .ok_or_else(|| err("key column out of range".into()))?;
                let layout = plan
                    .layout(col)
                    .ok_or_else(|| err("key column out of range".into()))?;
                let bytes = data.get(start..end).unwrap_or_default();
                append_cell(old, kind, layout, bytes, zero_date, scratch)
                    .map_err(|e| column_err(entry, col, e.0, position))?;
            }
            Some(Cell::Null) => append_null(old).map_err(|e| err(e.to_string()))?,
            _ => return Err(err("key column missing from the before image".into())),
        }
    }
    Ok(())
}

/// Whether an update changed its primary key: a key column in both images with different bytes
/// (or NULL on one side).
fn key_changed(key: &[usize], data: &[u8], before: &[Cell], after: &[Cell]) -> bool {
    key.iter().any(
        |&col| match (before.get(col).copied(), after.get(col).copied()) {
            (
                Some(Cell::At { start: bs, end: be }),
                Some(Cell::At {
                    start: a_s,
                    end: ae,
                }),
            ) => data.get(bs..be) != data.get(a_s..ae),
            (Some(Cell::Null), Some(Cell::At { .. }))
            | (Some(Cell::At { .. }), Some(Cell::Null)) => true,
            _ => false,
        },
    )
}
