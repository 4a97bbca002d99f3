//! Update and delete rows events of a keyless table (issue 23): the table is a multiset, so each
//! row change is written as whole-row operations the sink can apply without a key — an update
//! becomes a delete of its before image followed by an insert of its after image, a delete a
//! delete of its before image. The sink removes exactly one row equal to each deleted image
//! (`sinks/iceberg/plan/multiset.rs`).
//!
//! Binlog facts relied on: each rows event carries a column bitmap per image; under
//! `binlog_row_image = FULL` (the default) both images hold every column. Under MINIMAL or
//! NOBLOB an image may leave columns out: a before image that lacks a column does not say which
//! of several rows it was, and an after image that lacks one would have to be completed from a
//! row the sink cannot name. Either stops the source naming the table and the setting, and
//! nothing of the event is kept.

use mysql_common::binlog::events::{RowsEventData, TableMapEvent};
use mysql_common::binlog::row::BinlogRow;

use super::{column_err, fill_slots, value_of, Assembler, Step, StreamError};
use crate::changelog::{Op, TableChangesBuilder};
use crate::config::ZeroDate;
use crate::sources::mysql::schema::TableEntry;
use crate::sources::mysql::types::{append, Origin};

impl Assembler {
    /// Appends the update (`op` = Update) or delete rows of `rows` for the keyless `entry`.
    pub(super) fn on_keyless_rows(
        &mut self,
        rows: &RowsEventData<'_>,
        tme: &TableMapEvent<'_>,
        op: Op,
        entry: &TableEntry,
    ) -> Result<Step, StreamError> {
        let ncols = entry.schema.columns.len();
        let position = self.position.to_string();
        let err = |detail: String| StreamError::Table {
            table: entry.schema.id.clone(),
            detail,
            position: position.clone(),
        };
        let what = if op == Op::Update { "UPDATE" } else { "DELETE" };
        let partial = |image: &str| {
            err(format!(
                "the {image} image of an {what} of a table without a key leaves columns out (binlog_row_image is MINIMAL or NOBLOB), so it does not identify which of its equal rows changed: SET GLOBAL binlog_row_image = 'FULL' on the server (writers must reconnect), or give the table a primary key or source.key_columns"
            ))
        };
        fill_slots(
            &mut self.before_slots,
            rows.columns_before_image().map(|b| b.iter_ones()),
            ncols,
        );
        fill_slots(
            &mut self.after_slots,
            rows.columns_after_image().map(|b| b.iter_ones()),
            ncols,
        );
        if self.before_slots.iter().any(Option::is_none) {
            return Err(partial("before"));
        }
        if op == Op::Update && self.after_slots.iter().any(Option::is_none) {
            return Err(partial("after"));
        }
        let zero_date = self.zero_date;
        let before_slots = std::mem::take(&mut self.before_slots);
        let after_slots = std::mem::take(&mut self.after_slots);
        let result = (|| {
            let b = self.builder_for(&entry.schema)?;
            for row in rows.rows(tme) {
                let (before, after) = row.map_err(|e| err(format!("rows event: {e}")))?;
                let before = before.ok_or_else(|| partial("before"))?;
                put_image(
                    b,
                    entry,
                    Op::Delete,
                    &before,
                    &before_slots,
                    zero_date,
                    &position,
                )?;
                if op == Op::Update {
                    let after = after.ok_or_else(|| partial("after"))?;
                    put_image(
                        b,
                        entry,
                        Op::Insert,
                        &after,
                        &after_slots,
                        zero_date,
                        &position,
                    )?;
                }
            }
            Ok(Step::Nothing)
        })();
        self.before_slots = before_slots;
        self.after_slots = after_slots;
        result
    }
}

/// Appends one change `op` whose row is the whole `image`.
fn put_image(
    b: &mut TableChangesBuilder,
    entry: &TableEntry,
    op: Op,
    image: &BinlogRow,
    slots: &[Option<usize>],
    zero_date: ZeroDate,
    position: &str,
) -> Result<(), StreamError> {
    let err = |detail: String| StreamError::Table {
        table: entry.schema.id.clone(),
        detail,
        position: position.to_owned(),
    };
    b.begin(op);
    for (i, kind) in entry.kinds.iter().enumerate() {
        let slot = slots
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| err(format!("column {i} missing from the row image")))?;
        let v = value_of(image, slot).map_err(|d| column_err(entry, i, d, position))?;
        let builder = b
            .value(i)
            .ok_or_else(|| err(format!("no builder for column {i}")))?;
        append(builder, kind, &v, Origin::Binlog, zero_date)
            .map_err(|e| column_err(entry, i, e.0, position))?;
    }
    b.no_old_key().map_err(|e| err(e.to_string()))
}
