//! The assembler's fallback path for rows events: each value read through `mysql_common`'s rows
//! and converted by [`super::super::types::append`], for tables whose columns the planned path
//! ([`super::planned`]) does not cover. Images under MINIMAL are completed here: a key column
//! missing from an update's after image comes from its before image, and a column an INSERT left
//! out takes its constant default.

use mysql_common::binlog::events::{RowsEventData, TableMapEvent};
use mysql_common::binlog::row::BinlogRow;

use super::super::schema::TableEntry;
use super::super::types::{append, ColumnDefault, Origin};
use super::{column_err, value_of, Step, StreamError};
use crate::changelog::{Op, TableChangesBuilder};
use crate::config::ZeroDate;

/// One rows event's table and where each column sits in its images (`slots[i]`: the index of
/// column `i` among the image's values, `None` when the image leaves it out).
pub(super) struct RowImages<'a> {
    pub(super) entry: &'a TableEntry,
    pub(super) before_slots: &'a [Option<usize>],
    pub(super) after_slots: &'a [Option<usize>],
    /// The binlog position, for messages.
    pub(super) position: String,
    pub(super) zero_date: ZeroDate,
}

impl RowImages<'_> {
    fn err(&self, detail: String) -> StreamError {
        StreamError::Table {
            table: self.entry.schema.id.clone(),
            detail,
            position: self.position.clone(),
        }
    }

    /// Appends every row of `rows` to `b` as an `op` change.
    pub(super) fn append_all(
        &self,
        b: &mut TableChangesBuilder,
        rows: &RowsEventData<'_>,
        tme: &TableMapEvent<'_>,
        op: Op,
    ) -> Result<Step, StreamError> {
        for row in rows.rows(tme) {
            let (before, after) = row.map_err(|e| self.err(format!("rows event: {e}")))?;
            let (image, slots) = match (op, &after, &before) {
                (Op::Delete, _, Some(b)) => (b, self.before_slots),
                (_, Some(a), _) => (a, self.after_slots),
                _ => return Err(self.err("rows event without an image".into())),
            };
            b.begin(op);
            self.append_columns(b, op, image, slots, before.as_ref())?;
            self.append_old_key(b, op, before.as_ref(), after.as_ref())?;
        }
        Ok(Step::Nothing)
    }

    /// The row's columns from `image` (at `slots`), completed as the module doc says.
    fn append_columns(
        &self,
        b: &mut TableChangesBuilder,
        op: Op,
        image: &BinlogRow,
        slots: &[Option<usize>],
        before: Option<&BinlogRow>,
    ) -> Result<(), StreamError> {
        let (entry, position, zero_date) = (self.entry, self.position.as_str(), self.zero_date);
        let err = |detail: String| self.err(detail);
        for (i, kind) in entry.kinds.iter().enumerate() {
            let from_after = slots.get(i).copied().flatten().map(|s| (image, s));
            // A key column missing from an update's after image (MINIMAL) comes from the
            // before image, which holds the key.
            let is_key = entry.schema.primary_key.contains(&i);
            let source = from_after.or_else(|| {
                (op == Op::Update && is_key)
                    .then_some(())
                    .and(before)
                    .and_then(|bi| self.before_slots.get(i).copied().flatten().map(|s| (bi, s)))
            });
            match source {
                Some((img, s)) => {
                    let v = value_of(img, s).map_err(|d| column_err(entry, i, d, position))?;
                    let builder = b
                        .value(i)
                        .ok_or_else(|| err(format!("no builder for column {i}")))?;
                    append(builder, kind, &v, Origin::Binlog, zero_date)
                        .map_err(|e| column_err(entry, i, e.0, position))?;
                }
                // MariaDB's MINIMAL image of an INSERT holds only the columns the
                // statement named; the others took their defaults.
                None if op == Op::Insert => {
                    let builder = b
                        .value(i)
                        .ok_or_else(|| err(format!("no builder for column {i}")))?;
                    match entry.defaults.get(i) {
                        Some(ColumnDefault::Value(v)) => {
                            append(builder, kind, v, Origin::Query, zero_date)
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
                    }
                }
                None => b.absent(i).map_err(|e| err(e.to_string()))?,
            }
        }
        Ok(())
    }

    /// The old key of an update that changed its key (from the before image); none otherwise.
    fn append_old_key(
        &self,
        b: &mut TableChangesBuilder,
        op: Op,
        before: Option<&BinlogRow>,
        after: Option<&BinlogRow>,
    ) -> Result<(), StreamError> {
        let (entry, position, zero_date) = (self.entry, self.position.as_str(), self.zero_date);
        let before_slots = self.before_slots;
        let err = |detail: String| self.err(detail);
        match (op, before, after) {
            (Op::Update, Some(bi), Some(ai))
                if key_changed(entry, bi, before_slots, ai, self.after_slots) =>
            {
                for (k, &col) in entry.schema.primary_key.iter().enumerate() {
                    let s =
                        before_slots.get(col).copied().flatten().ok_or_else(|| {
                            err("key column missing from the before image".into())
                        })?;
                    let v = value_of(bi, s).map_err(|d| column_err(entry, col, d, position))?;
                    let kind = entry
                        .kinds
                        .get(col)
                        .ok_or_else(|| err("key column out of range".into()))?;
                    let builder = b
                        .old_key(k)
                        .ok_or_else(|| err("no old-key builder".into()))?;
                    append(builder, kind, &v, Origin::Binlog, zero_date)
                        .map_err(|e| column_err(entry, col, e.0, position))?;
                }
            }
            _ => b.no_old_key().map_err(|e| err(e.to_string()))?,
        }
        Ok(())
    }
}

fn key_changed(
    entry: &TableEntry,
    before: &BinlogRow,
    before_slots: &[Option<usize>],
    after: &BinlogRow,
    after_slots: &[Option<usize>],
) -> bool {
    !entry.schema.primary_key.is_empty()
        && entry.schema.primary_key.iter().any(|&col| {
            match (
                before_slots.get(col).copied().flatten(),
                after_slots.get(col).copied().flatten(),
            ) {
                (Some(b), Some(a)) => before.as_ref(b) != after.as_ref(a),
                _ => false,
            }
        })
}
