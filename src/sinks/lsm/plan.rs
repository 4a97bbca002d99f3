//! Commit planning (pure): one table's ordered changes → one row per touched key, sorted by
//! (bucket, key), each column naming where its value comes from.
//!
//! An LSM commit is a level-0 sorted run per bucket holding the *last* state of each key the
//! commit touched: an upsert (`_VALUE_KIND` 0) with the whole row, or a delete (3). Earlier
//! changes to the same key in the same commit are folded away here, as Paimon's write buffer
//! does. A partial row (absent columns: unchanged TOAST values) is completed from earlier
//! changes to the key in this commit, else from the table (`lookup` marks those rows; the commit
//! reads them). Sequence numbers follow source order, so a later commit always wins the
//! deduplicate merge. Keys compare in `arrow-row` order, which for cdcd's key types (integers,
//! strings and bytes bytewise, decimals, dates, timestamps, booleans) is Paimon's key order.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{new_null_array, Array, ArrayRef, Int64Array, Int8Array, RecordBatch};
use arrow_row::{Row, Rows};
use arrow_schema::ArrowError;

use super::binary_row;
use super::schema::{FileSchemas, KIND_DELETE, KIND_INSERT};
use crate::changelog::{Op, TableChanges};
use crate::sinks::key_prefix::key_prefix;

/// Where one output column value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Src {
    /// `changes[batch].rows`, row.
    Row(u32, u32),
    /// `changes[batch].old_keys` (key columns only), row.
    Old(u32, u32),
    /// Row `i` of the lookup batch (current table rows).
    Lookup(u32),
    /// Not yet known: the row must be looked up in the table.
    Pending,
    Null,
}

/// One key's final state in this commit.
#[derive(Debug, Clone, Copy)]
pub struct Out {
    pub bucket: u32,
    pub delete: bool,
    /// Source-order rank of the change, added to the commit's base sequence number.
    pub order: u64,
    /// Where the key columns come from.
    pub key: Src,
}

/// What one commit writes.
#[derive(Debug)]
pub struct Plan {
    /// A TRUNCATE came first: every existing file is removed by this commit.
    pub truncate: bool,
    /// Sorted by (bucket, key).
    pub rows: Vec<Out>,
    /// `rows.len() * columns` sources, row-major; empty when every column of every row comes
    /// from the row's key source (`Out::key`), as in an insert-only commit such as an initial
    /// copy: 6 million entries for a copy commit of a million rows of 6 columns are not worth
    /// building to say the same thing.
    pub sources: Vec<Src>,
    pub columns: usize,
    /// Changes consumed (the sequence number advance).
    pub changes: u64,
    /// Rows whose absent columns must come from the table.
    pub lookups: Vec<Lookup>,
    /// The changes' columns cast to their stored types: `cast[batch][column]`.
    pub cast: Vec<Vec<ArrayRef>>,
    /// `old_cast[batch][key column]`.
    pub old_cast: Vec<Vec<ArrayRef>>,
}

/// A row completed from the table: the key whose current row holds its absent values (the old
/// key when the change moved the row to a new key).
#[derive(Debug, Clone, Copy)]
pub struct Lookup {
    /// Index into `Plan::rows`.
    pub row: usize,
    /// `Src::Row` or `Src::Old`.
    pub key: Src,
    pub bucket: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("a change has a NULL primary key column")]
    NullKey,
    #[error(transparent)]
    Arrow(#[from] ArrowError),
    #[error("{0}")]
    Key(String),
}

/// Plans one commit. `complete`: fill absent columns (deduplicate engine); when false
/// (partial-update engine) absent columns are written NULL, which that engine reads as
/// "unchanged" — except after a key change, where the engine has no earlier row under the new key
/// and the values are taken from the old key's row as in the deduplicate mode. `keep_old_keys`
/// (soft deletes, `sinks/cdc_columns.rs`): a key change leaves the old key's row as it is (a soft
/// delete just before it flagged that row) instead of deleting it, and the new key's absent
/// columns still come from it.
///
/// The phases: the changes after the last TRUNCATE, cast to their stored types; one record per
/// change (two for a key change: a delete of the old key) sorted by (key, source order)
/// ([`Records`]); one row per key folded from its records ([`Records::fold`]); the rows in
/// bucket order ([`in_bucket_order`]).
pub fn plan(
    changes: &[TableChanges],
    schemas: &FileSchemas,
    buckets: u32,
    complete: bool,
    keep_old_keys: bool,
) -> Result<Plan, PlanError> {
    let (start, truncate) = after_last_truncate(changes);
    let Cast { cast, old_cast } = cast_changes(changes, schemas)?;
    let whole_rows = whole_rows(changes, start);
    let mut records = Records::new(changes, schemas, start, &cast, &old_cast, whole_rows)?;
    records.keep_old_keys = keep_old_keys;
    let key_columns = KeyColumns::new(schemas, &cast, &old_cast);
    let mut key_buf = Vec::new();
    let folded = records.fold(
        &Fold {
            schemas,
            key_columns: &key_columns,
            buckets,
            complete,
            whole_rows,
        },
        &mut key_buf,
    )?;
    let ordered = in_bucket_order(folded, schemas, &key_columns, buckets, &mut key_buf)?;
    Ok(Plan {
        truncate,
        rows: ordered.rows,
        sources: ordered.sources,
        columns: schemas.columns,
        changes: records.consumed,
        lookups: ordered.lookups,
        cast,
        old_cast,
    })
}

/// Where the changes that matter start, `(batch, row)`, and whether a TRUNCATE came before them:
/// only changes after the last TRUNCATE matter; the truncate removes every earlier row.
fn after_last_truncate(changes: &[TableChanges]) -> ((usize, usize), bool) {
    let mut start = (0usize, 0usize);
    let mut truncate = false;
    for (b, c) in changes.iter().enumerate() {
        for (r, op) in c.ops.iter().enumerate() {
            if *op == Op::Truncate {
                start = (b, r + 1);
                truncate = true;
            }
        }
    }
    (start, truncate)
}

/// The changes' columns and old key columns cast to their stored types (`Plan::cast`,
/// `Plan::old_cast`).
struct Cast {
    cast: Vec<Vec<ArrayRef>>,
    old_cast: Vec<Vec<ArrayRef>>,
}

fn cast_changes(changes: &[TableChanges], schemas: &FileSchemas) -> Result<Cast, PlanError> {
    let mut cast = Vec::with_capacity(changes.len());
    let mut old_cast = Vec::with_capacity(changes.len());
    for c in changes {
        let cols = c
            .rows
            .columns()
            .iter()
            .map(|a| schemas.cast(a))
            .collect::<Result<Vec<_>, _>>()?;
        let old = c
            .old_keys
            .columns()
            .iter()
            .map(|a| schemas.cast(a))
            .collect::<Result<Vec<_>, _>>()?;
        cast.push(cols);
        old_cast.push(old);
    }
    Ok(Cast { cast, old_cast })
}

/// An insert-only commit with every column present (an initial copy's; only the changes after
/// a truncate count, such as a fresh copy's marker) takes every column of a key's row from its
/// last insert: the per-column resolution of [`Records::fold`], and the groups and key-change
/// anchors it walks, are not needed.
fn whole_rows(changes: &[TableChanges], start: (usize, usize)) -> bool {
    changes.iter().enumerate().skip(start.0).all(|(b, c)| {
        let first = if b == start.0 { start.1 } else { 0 };
        let ops = c.ops.get(first..).unwrap_or_default();
        ops.iter().all(|op| *op == Op::Insert) && (ops.is_empty() || !c.has_absent())
    })
}

/// One change as the planner sorts it: a change's new key, or (`old`) the old key a key change
/// deletes.
struct Rec {
    /// The key's [`key_prefix`], which decides most comparisons of the sort.
    prefix: [u64; 2],
    batch: u32,
    row: u32,
    old: bool,
    order: u64,
}

/// The key record `r` names, `arrow-row` encoded.
fn key_of<'k>(keys: &'k [Rows], old_keys: &'k [Rows], r: &Rec) -> Option<Row<'k>> {
    let rows = if r.old { old_keys } else { keys };
    rows.get(r.batch as usize)
        .map(|rows| rows.row(r.row as usize))
}

/// The records of the changes that matter, sorted by (key, source order), with what the fold
/// asks of them.
struct Records<'a> {
    changes: &'a [TableChanges],
    recs: Vec<Rec>,
    /// Each batch's keys and old keys, `arrow-row` encoded: `keys[batch]`.
    keys: Vec<Rows>,
    old_keys: Vec<Rows>,
    /// Changes consumed (the sequence number advance).
    consumed: u64,
    /// Where each key's run of records starts (empty with whole rows).
    group_start: Vec<usize>,
    /// Where the old-key record of a key change sits, by `(batch, row)`.
    old_at: HashMap<(u32, u32), usize>,
    /// An old-key record leaves its key's row as it was ([`plan`]'s `keep_old_keys`).
    keep_old_keys: bool,
}

/// What [`Records::fold`] needs besides the records.
struct Fold<'a> {
    schemas: &'a FileSchemas,
    key_columns: &'a KeyColumns<'a>,
    buckets: u32,
    complete: bool,
    whole_rows: bool,
}

/// One row per key, before the bucket order: `rows`, their row-major `sources` (see
/// [`Plan::sources`]), and `(row, key)` of each row to complete from the table.
struct Folded {
    rows: Vec<Out>,
    sources: Vec<Src>,
    lookups: Vec<(usize, Src)>,
}

impl<'a> Records<'a> {
    fn new(
        changes: &'a [TableChanges],
        schemas: &FileSchemas,
        start: (usize, usize),
        cast: &[Vec<ArrayRef>],
        old_cast: &[Vec<ArrayRef>],
        whole_rows: bool,
    ) -> Result<Records<'a>, PlanError> {
        let (keys, old_keys) = encode_keys(schemas, cast, old_cast)?;
        let (mut recs, consumed) =
            collect_records(changes, schemas, start, cast, &keys, &old_keys)?;
        recs.sort_by(|a, b| {
            a.prefix
                .cmp(&b.prefix)
                .then_with(|| key_of(&keys, &old_keys, a).cmp(&key_of(&keys, &old_keys, b)))
                .then(a.order.cmp(&b.order))
        });
        let mut records = Records {
            changes,
            recs,
            keys,
            old_keys,
            consumed,
            group_start: Vec::new(),
            old_at: HashMap::new(),
            keep_old_keys: false,
        };
        if !whole_rows {
            records.index_groups();
        }
        Ok(records)
    }

    /// Where each key's run of records starts, and where the old-key record of a key change sits.
    fn index_groups(&mut self) {
        let mut group_start = vec![0usize; self.recs.len()];
        for i in 0..self.recs.len() {
            let same = i > 0 && self.same_key(&self.recs[i - 1], &self.recs[i]);
            group_start[i] = if same { group_start[i - 1] } else { i };
            if self.recs[i].old {
                self.old_at
                    .insert((self.recs[i].batch, self.recs[i].row), i);
            }
        }
        self.group_start = group_start;
    }

    /// Different prefixes are different keys; only equal ones need the whole keys compared.
    fn same_key(&self, a: &Rec, b: &Rec) -> bool {
        a.prefix == b.prefix
            && key_of(&self.keys, &self.old_keys, a) == key_of(&self.keys, &self.old_keys, b)
    }

    fn is_delete(&self, r: &Rec) -> bool {
        (r.old && !self.keep_old_keys)
            || self
                .changes
                .get(r.batch as usize)
                .and_then(|c| c.ops.get(r.row as usize))
                == Some(&Op::Delete)
    }

    fn key_changed(&self, r: &Rec) -> bool {
        !r.old
            && self
                .changes
                .get(r.batch as usize)
                .and_then(|c| c.key_changed.get(r.row as usize))
                == Some(&true)
    }

    /// The value of `col` for the row record `k` wrote: from `k` itself, else from the row's
    /// state before it, following key changes back to the old key, else `Pending(key to look
    /// up)`.
    fn resolve(&self, k: usize, col: usize) -> Result<Src, Src> {
        let recs = &self.recs;
        let mut cur = k;
        loop {
            let Some(r) = recs.get(cur) else {
                return Ok(Src::Null);
            };
            // A kept old key's record changes nothing: the value is the one before it.
            let kept = r.old && self.keep_old_keys;
            if !kept && present(self.changes, r, col) {
                return Ok(Src::Row(r.batch, r.row));
            }
            let (anchor, lookup_key) = if kept {
                (cur, Src::Old(r.batch, r.row))
            } else if self.key_changed(r) {
                match self.old_at.get(&(r.batch, r.row)) {
                    Some(&o) => (o, Src::Old(r.batch, r.row)),
                    None => return Err(Src::Old(r.batch, r.row)),
                }
            } else {
                (cur, Src::Row(r.batch, r.row))
            };
            if self.group_start.get(anchor).is_none_or(|&g| g == anchor) {
                return Err(lookup_key);
            }
            let pred = anchor - 1;
            match recs.get(pred) {
                // Deleted (or moved away) before: nothing earlier to take the value from.
                Some(p) if self.is_delete(p) => return Err(lookup_key),
                Some(_) => cur = pred,
                None => return Err(lookup_key),
            }
        }
    }

    /// One row per key, in key order: the key's last record decides whether the row is a delete
    /// and where its key comes from; every other column is resolved ([`Records::resolve`]).
    fn fold(&self, f: &Fold<'_>, key_buf: &mut Vec<u8>) -> Result<Folded, PlanError> {
        let (recs, columns) = (&self.recs, f.schemas.columns);
        let mut rows = Vec::with_capacity(recs.len());
        // Row-major sources, kept only once a row needs them (see `Plan::sources`).
        let mut sources: Vec<Src> = Vec::new();
        let mut row_sources: Vec<Src> = Vec::with_capacity(columns);
        let mut lookups: Vec<(usize, Src)> = Vec::new();
        let mut i = 0;
        while i < recs.len() {
            let mut j = i + 1;
            while j < recs.len() && self.same_key(&recs[j], &recs[i]) {
                j += 1;
            }
            // A key whose records are all kept old keys keeps its row: nothing to write.
            let kept = |k: &usize| recs.get(*k).is_some_and(|r| self.keep_old_keys && r.old);
            let last_at = match (i..j).rev().find(|k| !kept(k)) {
                Some(k) => k,
                None => {
                    i = j;
                    continue;
                }
            };
            let Some(last) = recs.get(last_at) else { break };
            let delete = self.is_delete(last);
            let key_src = if last.old {
                Src::Old(last.batch, last.row)
            } else {
                Src::Row(last.batch, last.row)
            };
            let bucket = key_bucket(key_buf, f.schemas, f.key_columns, key_src, f.buckets)?;
            row_sources.clear();
            let pending = if f.whole_rows {
                None
            } else {
                self.row_sources(last_at, key_src, delete, f, &mut row_sources)
            };
            // (With `whole_rows`, `row_sources` stays empty: uniform.)
            let uniform = row_sources.iter().all(|&s| s == key_src);
            if !uniform && sources.is_empty() {
                // The first row that needs its sources: earlier rows take every column from their
                // key source.
                sources.reserve(recs.len() * columns);
                for r in &rows {
                    let r: &Out = r;
                    sources.extend(std::iter::repeat_n(r.key, columns));
                }
            }
            if !uniform || !sources.is_empty() {
                sources.extend_from_slice(&row_sources);
            }
            if let Some(key) = pending {
                lookups.push((rows.len(), key));
            }
            rows.push(Out {
                bucket,
                delete,
                order: last.order / 2,
                key: key_src,
            });
            i = j;
        }
        Ok(Folded {
            rows,
            sources,
            lookups,
        })
    }

    /// The source of every column of the row record `k` (its key's last) writes, pushed to
    /// `out`; returns the key to look up when a column is left `Pending`.
    fn row_sources(
        &self,
        k: usize,
        key_src: Src,
        delete: bool,
        f: &Fold<'_>,
        out: &mut Vec<Src>,
    ) -> Option<Src> {
        let last = self.recs.get(k)?;
        let mut pending = None;
        for col in 0..f.schemas.columns {
            let src = if f.schemas.key.contains(&col) {
                key_src
            } else if last.old {
                Src::Null
            } else if present(self.changes, last, col) {
                Src::Row(last.batch, last.row)
            } else if delete || (!f.complete && !self.key_changed(last)) {
                Src::Null
            } else {
                match self.resolve(k, col) {
                    Ok(src) => src,
                    Err(key) => {
                        pending = Some(key);
                        Src::Pending
                    }
                }
            };
            out.push(src);
        }
        pending
    }
}

/// Each batch's keys and old keys (stored types), `arrow-row` encoded: their byte order is the
/// key order.
fn encode_keys(
    schemas: &FileSchemas,
    cast: &[Vec<ArrayRef>],
    old_cast: &[Vec<ArrayRef>],
) -> Result<(Vec<Rows>, Vec<Rows>), PlanError> {
    let converter = schemas.key_converter()?;
    let mut keys: Vec<Rows> = Vec::with_capacity(cast.len());
    let mut old_keys: Vec<Rows> = Vec::with_capacity(cast.len());
    for (b, cols) in cast.iter().enumerate() {
        let kc: Vec<ArrayRef> = schemas
            .key
            .iter()
            .filter_map(|&k| cols.get(k).cloned())
            .collect();
        keys.push(converter.convert_columns(&kc)?);
        let oc = old_cast.get(b).cloned().unwrap_or_default();
        old_keys.push(converter.convert_columns(&oc)?);
    }
    Ok((keys, old_keys))
}

/// One record per change from `start` on (none for a TRUNCATE), two for a key change (its old
/// key first), in source order; and the changes consumed. A NULL key column is refused.
fn collect_records(
    changes: &[TableChanges],
    schemas: &FileSchemas,
    start: (usize, usize),
    cast: &[Vec<ArrayRef>],
    keys: &[Rows],
    old_keys: &[Rows],
) -> Result<(Vec<Rec>, u64), PlanError> {
    let mut recs = Vec::new();
    let mut order = 0u64;
    for (b, c) in changes.iter().enumerate().skip(start.0) {
        let first = if b == start.0 { start.1 } else { 0 };
        let cols = cast.get(b).map(Vec::as_slice).unwrap_or_default();
        for r in first..c.ops.len() {
            order += 1;
            if c.ops.get(r) == Some(&Op::Truncate) {
                continue;
            }
            if schemas
                .key
                .iter()
                .any(|&k| cols.get(k).is_none_or(|a| a.is_null(r)))
            {
                return Err(PlanError::NullKey);
            }
            let prefix =
                |rows: &[Rows]| rows.get(b).map_or([0; 2], |k| key_prefix(k.row(r).data()));
            if c.key_changed.get(r) == Some(&true) {
                recs.push(Rec {
                    prefix: prefix(old_keys),
                    batch: b as u32,
                    row: r as u32,
                    old: true,
                    order: order * 2,
                });
            }
            recs.push(Rec {
                prefix: prefix(keys),
                batch: b as u32,
                row: r as u32,
                old: false,
                order: order * 2 + 1,
            });
        }
    }
    Ok((recs, order))
}

/// The rows of a plan in bucket order, with their sources and lookups (as in [`Plan`]).
struct Ordered {
    rows: Vec<Out>,
    sources: Vec<Src>,
    lookups: Vec<Lookup>,
}

/// `folded` in bucket order, stably (rows keep key order within a bucket), with each lookup's
/// bucket.
fn in_bucket_order(
    folded: Folded,
    schemas: &FileSchemas,
    key_columns: &KeyColumns<'_>,
    buckets: u32,
    key_buf: &mut Vec<u8>,
) -> Result<Ordered, PlanError> {
    let Folded {
        rows,
        sources,
        lookups,
    } = folded;
    let columns = schemas.columns;
    let idx = by_bucket(&rows, buckets);
    let mut new_pos = vec![0usize; rows.len()];
    let mut sorted_rows = Vec::with_capacity(rows.len());
    let mut sorted_sources = Vec::with_capacity(sources.len());
    for (new, &old) in idx.iter().enumerate() {
        if let Some(p) = new_pos.get_mut(old) {
            *p = new;
        }
        if let Some(r) = rows.get(old) {
            sorted_rows.push(*r);
        }
        if let Some(s) = sources
            .get(old * columns..(old + 1) * columns)
            .filter(|_| !sources.is_empty())
        {
            sorted_sources.extend_from_slice(s);
        }
    }
    let mut sorted_lookups = Vec::with_capacity(lookups.len());
    for (row, key) in lookups {
        let bucket = key_bucket(key_buf, schemas, key_columns, key, buckets)?;
        sorted_lookups.push(Lookup {
            row: new_pos.get(row).copied().unwrap_or(0),
            key,
            bucket,
        });
    }
    Ok(Ordered {
        rows: sorted_rows,
        sources: sorted_sources,
        lookups: sorted_lookups,
    })
}

/// Row indexes ordered by bucket, stably (rows keep key order within each bucket): a counting
/// sort, as buckets are few and rows many.
fn by_bucket(rows: &[Out], buckets: u32) -> Vec<usize> {
    let mut starts = vec![0usize; buckets.max(1) as usize + 1];
    for r in rows {
        let b = (r.bucket as usize).min(starts.len() - 2);
        starts[b + 1] += 1;
    }
    for b in 1..starts.len() {
        starts[b] += starts[b - 1];
    }
    let mut idx = vec![0usize; rows.len()];
    for (i, r) in rows.iter().enumerate() {
        let b = (r.bucket as usize).min(starts.len() - 2);
        if let Some(slot) = idx.get_mut(starts[b]) {
            *slot = i;
        }
        starts[b] += 1;
    }
    idx
}

/// Each batch's key columns (stored types), for [`key_bucket`]: `rows[batch]`, `old[batch]`.
struct KeyColumns<'a> {
    rows: Vec<Vec<&'a dyn Array>>,
    old: Vec<Vec<&'a dyn Array>>,
}

impl<'a> KeyColumns<'a> {
    fn new(
        schemas: &FileSchemas,
        cast: &'a [Vec<ArrayRef>],
        old_cast: &'a [Vec<ArrayRef>],
    ) -> Self {
        KeyColumns {
            rows: cast
                .iter()
                .map(|cols| {
                    schemas
                        .key
                        .iter()
                        .filter_map(|&k| cols.get(k).map(|a| a.as_ref()))
                        .collect()
                })
                .collect(),
            old: old_cast
                .iter()
                .map(|cols| cols.iter().map(|a| a.as_ref()).collect())
                .collect(),
        }
    }
}

/// The bucket of the key at `src`.
fn key_bucket(
    buf: &mut Vec<u8>,
    schemas: &FileSchemas,
    keys: &KeyColumns<'_>,
    src: Src,
    buckets: u32,
) -> Result<u32, PlanError> {
    let (arrays, row) = match src {
        Src::Old(b, r) => (keys.old.get(b as usize), r),
        Src::Row(b, r) => (keys.rows.get(b as usize), r),
        _ => return Err(PlanError::Key("no key source".into())),
    };
    let arrays = arrays.map_or(&[][..], Vec::as_slice);
    if arrays.len() != schemas.key.len() {
        return Err(PlanError::Key("key columns missing".into()));
    }
    binary_row::encode(buf, arrays, row as usize).map_err(|e| PlanError::Key(e.to_string()))?;
    Ok(binary_row::bucket(buf, buckets))
}

fn present(changes: &[TableChanges], r: &Rec, col: usize) -> bool {
    changes
        .get(r.batch as usize)
        .is_some_and(|c| c.is_present(col, r.row as usize))
}

impl Plan {
    /// Key columns (stored types) of the lookup keys (for the table lookup).
    pub fn key_batch(&self, schemas: &FileSchemas) -> Result<Vec<ArrayRef>, ArrowError> {
        let mut out = Vec::with_capacity(schemas.key.len());
        for (kp, &k) in schemas.key.iter().enumerate() {
            let mut arrays: Vec<&dyn Array> = Vec::new();
            for b in &self.cast {
                if let Some(a) = b.get(k) {
                    arrays.push(a.as_ref());
                }
            }
            let nb = arrays.len();
            for b in &self.old_cast {
                if let Some(a) = b.get(kp) {
                    arrays.push(a.as_ref());
                }
            }
            let idx: Vec<(usize, usize)> = self
                .lookups
                .iter()
                .map(|l| match l.key {
                    Src::Old(b, row) => (nb + b as usize, row as usize),
                    Src::Row(b, row) => (b as usize, row as usize),
                    _ => (0, 0),
                })
                .collect();
            out.push(arrow_select::interleave::interleave(&arrays, &idx)?);
        }
        Ok(out)
    }

    /// The data file batch of all planned rows (every bucket, in `rows` order), sequence
    /// numbers from `base`. `found[i]` is the lookup batch row for `lookups[i]`.
    pub fn build(
        &self,
        schemas: &FileSchemas,
        base: i64,
        lookup: Option<&RecordBatch>,
        found: &[Option<u32>],
    ) -> Result<RecordBatch, PlanError> {
        let mut sources = self.sources.clone();
        for (i, l) in self.lookups.iter().enumerate() {
            let row = l.row;
            let Some(slots) = sources.get_mut(row * self.columns..(row + 1) * self.columns) else {
                continue;
            };
            for s in slots.iter_mut().filter(|s| **s == Src::Pending) {
                *s = match found.get(i).copied().flatten() {
                    Some(r) => Src::Lookup(r),
                    None => Src::Null,
                };
            }
        }
        let nb = self.cast.len();
        let off = schemas.values_offset();
        let mut values = Vec::with_capacity(self.columns);
        let mut idx: Vec<(usize, usize)> = Vec::new();
        let mut uniform_idx: Vec<(usize, usize)> = Vec::new();
        for col in 0..self.columns {
            let Some(field) = schemas.file.fields().get(off + col) else {
                return Err(PlanError::Key(format!("column {col} missing")));
            };
            let null = new_null_array(field.data_type(), 1);
            let key_pos = schemas.key.iter().position(|&k| k == col);
            let lookup_col = lookup.and_then(|l| l.columns().get(off + col).cloned());
            let mut arrays: Vec<&dyn Array> = Vec::with_capacity(2 * nb + 2);
            for b in &self.cast {
                arrays.push(b.get(col).map_or(null.as_ref(), |a| a.as_ref()));
            }
            for b in &self.old_cast {
                let a = key_pos.and_then(|kp| b.get(kp));
                arrays.push(a.map_or(null.as_ref(), |a| a.as_ref()));
            }
            arrays.push(lookup_col.as_deref().unwrap_or(null.as_ref()));
            arrays.push(null.as_ref());
            let at = |src: Option<&Src>| match src {
                Some(Src::Row(b, row)) => (*b as usize, *row as usize),
                Some(Src::Old(b, row)) => (nb + *b as usize, *row as usize),
                Some(Src::Lookup(i)) => (2 * nb, *i as usize),
                _ => (2 * nb + 1, 0),
            };
            if sources.is_empty() {
                // Every column from the key source: one index for all columns.
                if uniform_idx.is_empty() {
                    uniform_idx.extend(self.rows.iter().map(|r| at(Some(&r.key))));
                }
            } else {
                idx.clear();
                idx.extend((0..self.rows.len()).map(|r| at(sources.get(r * self.columns + col))));
            }
            let idx = if sources.is_empty() {
                &uniform_idx
            } else {
                &idx
            };
            values.push(arrow_select::interleave::interleave(&arrays, idx)?);
        }
        let keys: Vec<ArrayRef> = schemas
            .key
            .iter()
            .filter_map(|&k| values.get(k).cloned())
            .collect();
        let seq: ArrayRef = Arc::new(Int64Array::from_iter_values(
            self.rows.iter().map(|r| base + r.order as i64),
        ));
        let kind: ArrayRef = Arc::new(Int8Array::from_iter_values(self.rows.iter().map(|r| {
            if r.delete {
                KIND_DELETE
            } else {
                KIND_INSERT
            }
        })));
        Ok(schemas.batch(keys, seq, kind, values)?)
    }

    /// `(bucket, first row, row count)` for each bucket with rows.
    pub fn bucket_ranges(&self) -> Vec<(u32, usize, usize)> {
        let mut out: Vec<(u32, usize, usize)> = Vec::new();
        for (i, r) in self.rows.iter().enumerate() {
            match out.last_mut() {
                Some(last) if last.0 == r.bucket => last.2 += 1,
                _ => out.push((r.bucket, i, 1)),
            }
        }
        out
    }
}
