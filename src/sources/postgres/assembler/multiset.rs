//! Updates and deletes of a keyless table under `REPLICA IDENTITY FULL` (issue 23): the table is
//! a multiset, so each change is written as whole-row operations the sink can apply without a
//! key — an UPDATE becomes a delete of its before image followed by an insert of its after image,
//! a DELETE a delete of its before image. The sink removes exactly one row equal to each deleted
//! image (`sinks/iceberg/plan/multiset.rs`).
//!
//! Protocol facts relied on (Postgres docs, "Logical Replication Message Formats", and
//! `ExtractReplicaIdentity` in heapam.c): under FULL every UPDATE and DELETE carries the old row
//! as an `'O'` tuple, flattened (detoasted) before it is logged, so none of its columns is `'u'`;
//! the new tuple of an UPDATE may still send an unchanged TOASTed column as `'u'`, whose value is
//! then the old row's. A keyless table under any other identity sends no old row at all, which
//! is why an `'O'` tuple is what proves the before image is whole; anything less stops the
//! source (the caller's error), never a guess of the row.

use super::{check_width, no_old_key, put_value, value_error, CapturedRel};
use crate::changelog::{Lsn, Op, TableChangesBuilder};
use crate::sources::postgres::decoder::{ColumnValue, TupleData};
use crate::sources::SourceError;

/// Appends an UPDATE of a keyless FULL table: Delete(`old`), then Insert(`new`, its unchanged
/// TOAST columns taken from `old`).
pub(super) fn put_update(
    b: &mut TableChangesBuilder,
    rel: &CapturedRel,
    old: &TupleData<'_>,
    new: &TupleData<'_>,
    at: Lsn,
) -> Result<(), SourceError> {
    put_delete(b, rel, old, at)?;
    check_width(rel, new, at)?;
    b.begin(Op::Insert);
    for (i, (after, before)) in new.iter().zip(old.iter()).enumerate() {
        let v = match after {
            ColumnValue::UnchangedToast => before,
            v => v,
        };
        put_value(b, rel, i, v, at)?;
    }
    no_old_key(b, rel)
}

/// Appends a Delete of one row equal to the whole before image `old`.
pub(super) fn put_delete(
    b: &mut TableChangesBuilder,
    rel: &CapturedRel,
    old: &TupleData<'_>,
    at: Lsn,
) -> Result<(), SourceError> {
    check_width(rel, old, at)?;
    b.begin(Op::Delete);
    for (i, v) in old.iter().enumerate() {
        if v == ColumnValue::UnchangedToast {
            return Err(value_error(
                rel,
                i,
                at,
                "the before image of an UPDATE or DELETE of a table without a key leaves the column out, so it does not identify the row (Postgres sends the whole old row, detoasted, under REPLICA IDENTITY FULL)",
            ));
        }
        put_value(b, rel, i, v, at)?;
    }
    no_old_key(b, rel)
}
