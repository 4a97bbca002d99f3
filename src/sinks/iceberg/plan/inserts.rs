//! The planner's fast path for a commit of distinct inserts (an initial copy's batch, an
//! insert-only stretch of a stream): when every change is an insert of a whole row and the keys
//! are provably distinct without hashing them, the plan is the rows in order, cut into files at
//! the [`FileLimits`] — no deletes, no lookups, no fills.
//!
//! Why a separate path: the general planner ([`super::Planner`]) tracks every key in a hash map
//! to find a later change of the same key, which for a 1M-row copy commit is a million SipHash
//! inserts (~3% of the whole machine's CPU during an initial copy, issue 7) spent on proving
//! what the copy's shape already shows. Distinctness here comes from order: each batch's encoded
//! keys strictly increase (one memcmp per row), and the batches' `[first, last]` key ranges,
//! sorted, do not overlap (a copy reads key ranges, each range's rows in key order as long as
//! the heap is). When order shows nothing (a heap out of key order), the keys' bytes are sorted
//! and neighbours compared instead, still without a hash map or per-key state. When any
//! condition fails — another op, an absent cell, a NULL key, a repeated key — the general path
//! plans the commit, so a duplicate key, a truncate or a partial row is handled (and reported)
//! exactly as before; a leading Truncate marker (a fresh table's first copy commit) becomes
//! `Plan::truncate`. The plan is the one the general path makes for the same input (tested in
//! `tests.rs`).

use arrow_row::Rows;

use super::cut::FileCutter;
use super::{FileLimits, Plan, RowRef};
use crate::changelog::{Op, TableChanges};
use crate::sinks::key_prefix::key_prefix;

/// The plan of `changes` if they are whole-row inserts of distinct, non-NULL keys shown distinct
/// by order (module doc); `None` sends them to the general path. `new_keys[b]` are the encoded
/// keys of `changes[b].rows`, `row_bytes[b]` the estimated size of one of its rows.
pub(super) fn plan_distinct_inserts(
    changes: &[TableChanges],
    key: &[usize],
    new_keys: &[Rows],
    row_bytes: &[usize],
    limits: FileLimits,
) -> Option<Plan> {
    if new_keys.len() != changes.len() || row_bytes.len() != changes.len() {
        return None;
    }
    // A fresh table's copy starts with the Truncate marker, a batch of its own
    // (`snapshot::marker_batch`): with nothing before it in the commit, it only drops every
    // earlier file, which is `Plan::truncate`.
    let lead = changes
        .iter()
        .take_while(|c| !c.is_empty() && c.ops.iter().all(|op| *op == Op::Truncate))
        .count();
    let (changes, new_keys, row_bytes) = (
        changes.get(lead..)?,
        new_keys.get(lead..)?,
        row_bytes.get(lead..)?,
    );
    let mut ranges = Vec::with_capacity(changes.len());
    let mut ordered = true;
    for (c, keys) in changes.iter().zip(new_keys) {
        if c.has_absent() || !c.ops.iter().all(|op| *op == Op::Insert) {
            return None;
        }
        let no_null_keys = key.iter().all(|&k| {
            c.rows
                .columns()
                .get(k)
                .is_some_and(|col| col.null_count() == 0)
        });
        if !no_null_keys || keys.num_rows() != c.len() {
            return None;
        }
        if !ordered {
            continue;
        }
        let mut rows = keys.iter();
        let Some(first) = rows.next() else {
            continue;
        };
        let mut last = first;
        for row in rows {
            if row <= last {
                ordered = false;
                break;
            }
            last = row;
        }
        ranges.push((first, last));
    }
    if ordered {
        ranges.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        ordered = !ranges.windows(2).any(|w| match w {
            [(_, last), (next_first, _)] => next_first <= last,
            _ => false,
        });
    }
    if !ordered && !distinct_by_sorting(new_keys) {
        return None;
    }
    let mut plan = plan_in_order(changes, lead, row_bytes, limits)?;
    plan.truncate = lead > 0;
    Some(plan)
}

/// Whether all `keys` differ, shown by sorting them (bytes, not hashes): for inserts whose order
/// proves nothing, such as a copy of a table whose heap order is not its key order (any table
/// that has seen updates: an updated row moves to the end of its chunk's heap). The sort merges
/// the runs already in order, so a mostly ordered copy costs little more than the scan; each key
/// carries its [`key_prefix`], so most comparisons are two integer compares, not a `memcmp`
/// (comparing the slices was ~10% of a 10M-row copy's CPU).
fn distinct_by_sorting(keys: &[Rows]) -> bool {
    let mut all: Vec<([u64; 2], &[u8])> = Vec::with_capacity(keys.iter().map(Rows::num_rows).sum());
    for rows in keys {
        all.extend(rows.iter().map(|r| (key_prefix(r.data()), r.data())));
    }
    all.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
    !all.windows(2).any(|w| match w {
        [a, b] => a.0 == b.0 && a.1 == b.1,
        _ => false,
    })
}

/// Every row of `changes` in order, in files cut where the general path cuts them: after the row
/// that brings the open file to `max_rows` rows or `max_bytes` estimated bytes. `changes[0]` is
/// the commit's batch `first_batch`. `None` when a batch or row number does not fit a [`RowRef`]
/// (the general path reports it).
fn plan_in_order(
    changes: &[TableChanges],
    first_batch: usize,
    row_bytes: &[usize],
    limits: FileLimits,
) -> Option<Plan> {
    let mut plan = Plan::default();
    let mut files = FileCutter::new(limits);
    let mut left: usize = changes.iter().map(TableChanges::len).sum();
    for (batch, (c, &bytes)) in changes.iter().zip(row_bytes).enumerate() {
        let batch = u32::try_from(first_batch + batch).ok()?;
        u32::try_from(c.len()).ok()?;
        for row in 0..c.len() as u32 {
            let open = files.open();
            if open.rows.capacity() == 0 {
                open.rows.reserve_exact(left.min(limits.max_rows));
            }
            left -= 1;
            files.push(RowRef { batch, row }, bytes);
        }
    }
    plan.files = files.finish();
    Some(plan)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, StringArray};
    use arrow_row::{RowConverter, SortField};
    use arrow_schema::DataType;

    use super::distinct_by_sorting;

    fn keys(batches: &[&[&str]]) -> Vec<arrow_row::Rows> {
        let converter =
            RowConverter::new(vec![SortField::new(DataType::Utf8)]).expect("a utf8 converter");
        batches
            .iter()
            .map(|b| {
                let col: ArrayRef = Arc::new(StringArray::from(b.to_vec()));
                converter.convert_columns(&[col]).expect("utf8 keys encode")
            })
            .collect()
    }

    #[test]
    fn keys_that_share_their_first_16_bytes_are_compared_whole() {
        let long = "customer-0000000000000000-";
        let (a, b) = (format!("{long}a"), format!("{long}b"));
        assert!(distinct_by_sorting(&keys(&[&[&b, "x"], &[&a, "a"]])));
        assert!(!distinct_by_sorting(&keys(&[&[&b, "x"], &[&a, &b]])));
        // Keys a zero-padded prefix cannot tell apart: "a" and "a\0".
        assert!(distinct_by_sorting(&keys(&[&["a\0", "b"], &["a"]])));
        assert!(!distinct_by_sorting(&keys(&[&["a\0", "a"], &["a"]])));
    }
}
