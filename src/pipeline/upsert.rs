//! The upsert window: a table's changes that may already be in its copied rows are rewritten so
//! that applying them again converges (the argument is in `sources/postgres/snapshot/mod.rs`).
//!
//! Where it sits: `pipeline/mod.rs` calls [`upsert`] on each replayed change run of a table whose
//! checkpoint carries `cdcd.upsert_until` at or above the transaction's position.
//!
//! - An insert becomes an update: the sink then deletes the key's row (if any) before writing.
//! - An update that changes the key (k1 → k2) gets a delete of k2 right before it: the copy may
//!   hold k2 already, and the sink assumes a new key is free (the source's key is unique).
//!   The update itself still removes k1 and completes absent columns from k1's row.
//! - The run is marked [`TableChanges::upsert_window`]: a partial update (absent columns, key
//!   unchanged) of a key the table does not hold is dropped by the sink instead of stopping it.
//!   Inside the window that only happens to a row that existed before the update but not at the
//!   snapshot its chunk was copied at, so a later change at or below that snapshot deletes it or
//!   moves its key away, and dropping the update leaves the same end state (`sources/mysql/copy.rs`
//!   has the argument). A key change of a missing row still stops the sink: the values it would
//!   carry to the new key are in no copied chunk.
//!
//! Pure: one Arrow `take` per run that has a key change, none otherwise.

use arrow_array::UInt32Array;
use arrow_buffer::BooleanBuffer;
use arrow_schema::ArrowError;
use arrow_select::take::take_record_batch;

use crate::changelog::{Op, TableChanges};

/// Rewrites `changes` for the upsert window (see the module doc).
pub fn upsert(changes: &mut TableChanges) -> Result<(), ArrowError> {
    changes.upsert_window = true;
    for op in changes.ops.iter_mut().filter(|op| **op == Op::Insert) {
        *op = Op::Update;
    }
    let rekeyed = changes
        .ops
        .iter()
        .zip(&changes.key_changed)
        .any(|(op, changed)| *op == Op::Update && *changed);
    if !rekeyed {
        return Ok(());
    }
    let n = changes.len();
    let mut indices = Vec::with_capacity(n + 8);
    let mut ops = Vec::with_capacity(n + 8);
    let mut key_changed = Vec::with_capacity(n + 8);
    for (i, (op, changed)) in changes.ops.iter().zip(&changes.key_changed).enumerate() {
        let row = u32::try_from(i)
            .map_err(|_| ArrowError::InvalidArgumentError(format!("{n} changes in one run")))?;
        if *op == Op::Update && *changed {
            // The delete of the new key carries the new row's values; only its key matters.
            indices.push(row);
            ops.push(Op::Delete);
            key_changed.push(false);
        }
        indices.push(row);
        ops.push(*op);
        key_changed.push(*changed);
    }
    let take = UInt32Array::from(indices);
    let rows = take_record_batch(&changes.rows, &take)?;
    let old_keys = take_record_batch(&changes.old_keys, &take)?;
    let present = changes
        .present
        .iter()
        .map(|bits| {
            bits.as_ref().map(|bits| {
                BooleanBuffer::collect_bool(take.len(), |j| {
                    take.values()
                        .get(j)
                        .is_some_and(|&i| (i as usize) < bits.len() && bits.value(i as usize))
                })
            })
        })
        .collect();
    changes.rows = rows;
    changes.old_keys = old_keys;
    changes.present = present;
    changes.ops = ops;
    changes.key_changed = key_changed;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::builder::{Int64Builder, StringBuilder};
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;

    use super::*;
    use crate::changelog::{TableChangesBuilder, TableSchema};
    use crate::test_fixtures::id_text_schema;

    fn schema() -> Arc<TableSchema> {
        id_text_schema("t", "t")
    }

    fn int(b: &mut TableChangesBuilder, col: usize, v: i64) {
        crate::test_fixtures::cell::<Int64Builder>(b, col).append_value(v);
    }

    #[test]
    fn inserts_become_updates_and_key_changes_delete_the_new_key_first() {
        let mut b = TableChangesBuilder::new(schema(), 4);
        b.begin(Op::Insert);
        int(&mut b, 0, 1);
        crate::test_fixtures::cell::<StringBuilder>(&mut b, 1).append_value("x");
        b.no_old_key().unwrap();
        // 2 → 3 with `t` unchanged (absent).
        b.begin(Op::Update);
        int(&mut b, 0, 3);
        b.absent(1).unwrap();
        crate::test_fixtures::old_key_cell::<Int64Builder>(&mut b, 0).append_value(2);
        b.begin(Op::Delete);
        int(&mut b, 0, 1);
        b.absent(1).unwrap();
        b.no_old_key().unwrap();
        let mut c = b.finish().unwrap();
        upsert(&mut c).unwrap();
        assert!(c.upsert_window);
        assert_eq!(c.ops, [Op::Update, Op::Delete, Op::Update, Op::Delete]);
        assert_eq!(c.key_changed, [false, false, true, false]);
        let ids = c.rows.column(0).as_primitive::<Int64Type>();
        assert_eq!(ids.values().to_vec(), [1, 3, 3, 1]);
        assert_eq!(c.old_keys.column(0).as_primitive::<Int64Type>().value(2), 2);
        assert!(c.is_present(1, 0));
        assert!(!c.is_present(1, 1) && !c.is_present(1, 2) && !c.is_present(1, 3));
    }
}
