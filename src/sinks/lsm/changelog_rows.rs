//! A commit's changelog (pure): every change of the commit as Paimon changelog rows, in source
//! order, with whole before and after images: `+I` for an insert, `-U` then `+U` for an update,
//! `-D` for a delete, and `-D` of the old key then `+I` of the new one for a key change
//! (Paimon's `RowKind` bytes in `_VALUE_KIND`: 0, 1, 2, 3).
//!
//! Where these rows sit in the flow: the table's rows (`plan.rs`) fold a key's changes into its
//! last state; the changelog keeps each of them. A source sends partial images (an update's
//! unchanged TOAST values, MySQL's `binlog_row_image = MINIMAL`, a delete's key only) and no
//! before image at all, so every image is completed from the key's state before the change: the
//! previous change of the key in this commit, else the table's current row. [`reads`] says
//! whose current rows are needed (keys a change updates or deletes before any change of this
//! commit wrote them), the commit looks them up (`lookup::current_rows`), and [`rows`] walks the
//! changes again carrying each key's image. Each output column names where its value comes from
//! (`plan::Src`), as in the table's plan, so building the batch is one `interleave` per column.
//!
//! A TRUNCATE writes no rows: Paimon's changelog has no such kind, and `-D` rows for the whole
//! table would mean reading all of it (docs/table-settings.md says so). Keys after it start
//! absent.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::{new_null_array, Array, ArrayRef, Int64Array, Int8Array, RecordBatch};
use arrow_row::Rows;
use arrow_schema::ArrowError;

use super::plan::Src;
use super::schema::{FileSchemas, KIND_DELETE, KIND_INSERT};
use crate::changelog::{Op, TableChanges};

/// Paimon `RowKind.UPDATE_BEFORE` (`-U`).
pub const KIND_UPDATE_BEFORE: i8 = 1;
/// Paimon `RowKind.UPDATE_AFTER` (`+U`).
pub const KIND_UPDATE_AFTER: i8 = 2;

/// Each batch's keys and old keys (stored types), `arrow-row` encoded, to tell keys apart.
pub struct EncodedKeys {
    keys: Vec<Rows>,
    old: Vec<Rows>,
}

impl EncodedKeys {
    /// `cast`/`old_cast`: the changes' columns and old key columns in their stored types
    /// (`Plan::cast`, `Plan::old_cast`).
    pub fn new(
        schemas: &FileSchemas,
        cast: &[Vec<ArrayRef>],
        old_cast: &[Vec<ArrayRef>],
    ) -> Result<EncodedKeys, ArrowError> {
        let converter = schemas.key_converter()?;
        let mut keys = Vec::with_capacity(cast.len());
        let mut old = Vec::with_capacity(cast.len());
        for (b, cols) in cast.iter().enumerate() {
            let kc: Vec<ArrayRef> = schemas
                .key
                .iter()
                .filter_map(|&k| cols.get(k).cloned())
                .collect();
            keys.push(converter.convert_columns(&kc)?);
            let oc = old_cast.get(b).cloned().unwrap_or_default();
            old.push(converter.convert_columns(&oc)?);
        }
        Ok(EncodedKeys { keys, old })
    }

    /// The encoded key `src` (`Src::Row` or `Src::Old`) names.
    fn of(&self, src: Src) -> &[u8] {
        let (rows, b, r) = match src {
            Src::Row(b, r) => (&self.keys, b, r),
            Src::Old(b, r) => (&self.old, b, r),
            _ => return &[],
        };
        rows.get(b as usize)
            .filter(|rows| (r as usize) < rows.num_rows())
            .map_or(&[][..], |rows| rows.row(r as usize).data())
    }
}

/// Every change of `changes` in source order: `(batch, row, op, key changed)`.
fn in_order(changes: &[TableChanges]) -> impl Iterator<Item = (u32, u32, Op, bool)> + '_ {
    changes.iter().enumerate().flat_map(|(b, c)| {
        c.ops.iter().enumerate().map(move |(r, op)| {
            let moved = c.key_changed.get(r).copied().unwrap_or(false);
            (b as u32, r as u32, *op, moved)
        })
    })
}

/// The keys whose current rows the changelog needs (`Src::Row` or `Src::Old`, once per key): the
/// key an update or delete changes (the old key of a key change) when no earlier change of this
/// commit wrote it, and no TRUNCATE before it emptied the table. With `keep_old_keys` (soft
/// deletes) also the new key of a key change: it may hold a flagged row the change replaces.
pub fn reads(changes: &[TableChanges], keys: &EncodedKeys, keep_old_keys: bool) -> Vec<Src> {
    let mut seen: HashSet<&[u8]> = HashSet::new();
    let mut out = Vec::new();
    let mut truncated = false;
    for (b, r, op, moved) in in_order(changes) {
        let key = Src::Row(b, r);
        match op {
            Op::Truncate => truncated = true,
            Op::Insert => {
                seen.insert(keys.of(key));
            }
            Op::Update | Op::Delete => {
                let read = if moved { Src::Old(b, r) } else { key };
                if seen.insert(keys.of(read)) && !truncated {
                    out.push(read);
                }
                if seen.insert(keys.of(key)) && moved && keep_old_keys && !truncated {
                    out.push(key);
                }
            }
        }
    }
    out
}

/// A key's state while walking the changes.
#[derive(Clone, Copy)]
enum Image {
    /// No row.
    Absent,
    /// The after image of changelog row `n`.
    Written(usize),
    /// Row `n` of the current rows looked up.
    Current(u32),
}

/// The changelog rows of one commit: `kinds[i]`, `orders[i]` (the change's rank, 1-based, from
/// the first change the table's plan counts; 0 before it), and the row-major `sources` of their
/// columns, or (an insert-only commit, [`inserts`]) `rows[i]`, the change every column of row
/// `i` comes from: a copy commit of a million rows needs no ten million sources.
#[derive(Debug, Default)]
pub struct Changelog {
    pub kinds: Vec<i8>,
    pub orders: Vec<u64>,
    pub sources: Vec<Src>,
    pub rows: Vec<Src>,
    pub columns: usize,
}

/// Whether every change is an insert or a TRUNCATE (an initial copy's commits, the first one
/// after its marker): each insert is its own `+I` row with the change's values, and no key's
/// state is needed.
pub fn insert_only(changes: &[TableChanges]) -> bool {
    changes.iter().all(|c| {
        c.ops
            .iter()
            .all(|op| matches!(op, Op::Insert | Op::Truncate))
    })
}

/// The changelog of an [`insert_only`] commit whose plan counts `counted` changes, of a table
/// of `columns` columns.
pub fn inserts(changes: &[TableChanges], counted: u64, columns: usize) -> Changelog {
    let total: u64 = changes.iter().map(|c| c.ops.len() as u64).sum();
    let before_counted = total.saturating_sub(counted);
    let mut out = Changelog {
        columns,
        ..Changelog::default()
    };
    for (n, (b, r, op, _)) in in_order(changes).enumerate() {
        if op == Op::Truncate {
            continue;
        }
        out.kinds.push(KIND_INSERT);
        out.orders
            .push((n as u64 + 1).saturating_sub(before_counted));
        out.rows.push(Src::Row(b, r));
    }
    out
}

/// What [`rows`] walks with.
pub struct Walk<'a> {
    pub changes: &'a [TableChanges],
    pub keys: &'a EncodedKeys,
    pub schemas: &'a FileSchemas,
    /// The [`reads`] and, per read, its row among the current rows (`None`: no row).
    pub reads: &'a [Src],
    pub found: &'a [Option<u32>],
    /// Changes the table's plan counts (`Plan::changes`): the last ones of the commit.
    pub counted: u64,
    /// `deletes = "soft"`: a key change leaves the old key's row (flagged by the change before
    /// it), so it writes no `-D` of the old key; onto a key that holds a (flagged) row it is an
    /// update of that row, `-U`/`+U`, as the table replaces it.
    pub keep_old_keys: bool,
}

/// The commit's changelog rows (module doc).
pub fn rows(walk: &Walk<'_>) -> Changelog {
    let columns = walk.schemas.columns;
    let mut state: HashMap<&[u8], Image> = HashMap::new();
    for (i, read) in walk.reads.iter().enumerate() {
        let image = match walk.found.get(i).copied().flatten() {
            Some(row) => Image::Current(row),
            None => Image::Absent,
        };
        state.insert(walk.keys.of(*read), image);
    }
    let total: u64 = walk.changes.iter().map(|c| c.ops.len() as u64).sum();
    let before_counted = total.saturating_sub(walk.counted);
    let mut out = Changelog {
        columns,
        ..Changelog::default()
    };
    for (n, (b, r, op, moved)) in in_order(walk.changes).enumerate() {
        let order = (n as u64 + 1).saturating_sub(before_counted);
        let change = walk.changes.get(b as usize);
        let present = |col: usize| change.is_some_and(|c| c.is_present(col, r as usize));
        let key = walk.keys.of(Src::Row(b, r));
        match op {
            Op::Truncate => state.clear(),
            Op::Delete => {
                match state.get(key).copied().unwrap_or(Image::Absent) {
                    Image::Absent => {
                        // No row known (replayed inside an upsert window): what the change says.
                        out.push(KIND_DELETE, order, |col, _| {
                            if present(col) {
                                Src::Row(b, r)
                            } else {
                                Src::Null
                            }
                        });
                    }
                    before => out.push_image(KIND_DELETE, order, before),
                }
                state.insert(key, Image::Absent);
            }
            Op::Insert | Op::Update => {
                let read = if moved {
                    walk.keys.of(Src::Old(b, r))
                } else {
                    key
                };
                let before = state.get(read).copied().unwrap_or(Image::Absent);
                let replaced = state.get(key).copied().unwrap_or(Image::Absent);
                let after_kind = match (before, moved) {
                    (_, true) if walk.keep_old_keys => match replaced {
                        Image::Absent => KIND_INSERT,
                        flagged => {
                            out.push_image(KIND_UPDATE_BEFORE, order, flagged);
                            KIND_UPDATE_AFTER
                        }
                    },
                    (Image::Absent, _) => KIND_INSERT,
                    (_, true) => {
                        out.push_image(KIND_DELETE, order, before);
                        state.insert(read, Image::Absent);
                        KIND_INSERT
                    }
                    (_, false) => {
                        out.push_image(KIND_UPDATE_BEFORE, order, before);
                        KIND_UPDATE_AFTER
                    }
                };
                out.push(after_kind, order, |col, out| {
                    if present(col) {
                        return Src::Row(b, r);
                    }
                    out.image_column(before, col)
                });
                state.insert(key, Image::Written(out.kinds.len() - 1));
            }
        }
    }
    out
}

impl Changelog {
    /// Appends a row of `kind` whose column `col` comes from `source(col, self)`.
    fn push(&mut self, kind: i8, order: u64, source: impl Fn(usize, &Changelog) -> Src) {
        for col in 0..self.columns {
            let s = source(col, self);
            self.sources.push(s);
        }
        self.kinds.push(kind);
        self.orders.push(order);
    }

    /// Appends `image` (never `Absent`) as a row of `kind`.
    fn push_image(&mut self, kind: i8, order: u64, image: Image) {
        self.push(kind, order, |col, out| out.image_column(image, col));
    }

    /// Where column `col` of `image` comes from.
    fn image_column(&self, image: Image, col: usize) -> Src {
        match image {
            Image::Absent => Src::Null,
            Image::Current(row) => Src::Lookup(row),
            Image::Written(n) => self
                .sources
                .get(n * self.columns + col)
                .copied()
                .unwrap_or(Src::Null),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// The changelog rows as one batch of the data file shape, in changelog order, sequence
    /// numbers from `base` (`cast`, `old_cast`: `Plan::cast`, `Plan::old_cast`; `current`: the
    /// current rows looked up).
    pub fn build(
        &self,
        schemas: &FileSchemas,
        base: i64,
        cast: &[Vec<ArrayRef>],
        old_cast: &[Vec<ArrayRef>],
        current: Option<&RecordBatch>,
    ) -> Result<RecordBatch, ArrowError> {
        let nb = cast.len();
        let off = schemas.values_offset();
        let mut values = Vec::with_capacity(self.columns);
        let mut idx: Vec<(usize, usize)> = Vec::with_capacity(self.kinds.len());
        for col in 0..self.columns {
            let Some(field) = schemas.file.fields().get(off + col) else {
                return Err(ArrowError::SchemaError(format!("column {col} missing")));
            };
            let null = new_null_array(field.data_type(), 1);
            let key_pos = schemas.key.iter().position(|&k| k == col);
            let current_col = current.and_then(|l| l.columns().get(off + col).cloned());
            let mut arrays: Vec<&dyn Array> = Vec::with_capacity(2 * nb + 2);
            for b in cast {
                arrays.push(b.get(col).map_or(null.as_ref(), |a| a.as_ref()));
            }
            for b in old_cast {
                let a = key_pos.and_then(|kp| b.get(kp));
                arrays.push(a.map_or(null.as_ref(), |a| a.as_ref()));
            }
            arrays.push(current_col.as_deref().unwrap_or(null.as_ref()));
            arrays.push(null.as_ref());
            idx.clear();
            idx.extend((0..self.kinds.len()).map(|row| {
                let src = if self.sources.is_empty() {
                    self.rows.get(row)
                } else {
                    self.sources.get(row * self.columns + col)
                };
                match src {
                    Some(Src::Row(b, r)) => (*b as usize, *r as usize),
                    Some(Src::Old(b, r)) => (nb + *b as usize, *r as usize),
                    Some(Src::Lookup(i)) => (2 * nb, *i as usize),
                    _ => (2 * nb + 1, 0),
                }
            }));
            values.push(arrow_select::interleave::interleave(&arrays, &idx)?);
        }
        let keys: Vec<ArrayRef> = schemas
            .key
            .iter()
            .filter_map(|&k| values.get(k).cloned())
            .collect();
        let seq: ArrayRef = Arc::new(Int64Array::from_iter_values(
            self.orders.iter().map(|&o| base + o as i64),
        ));
        let kind: ArrayRef = Arc::new(Int8Array::from_iter_values(self.kinds.iter().copied()));
        schemas.batch(keys, seq, kind, values)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::test_fixtures::{changes, del, ins, schema, upd};

    fn walk_of(batch: &TableChanges) -> (EncodedKeys, Vec<Src>, FileSchemas) {
        let schemas = FileSchemas::new(&schema());
        let cast: Vec<Vec<ArrayRef>> = vec![batch
            .rows
            .columns()
            .iter()
            .map(|a| schemas.cast(a).unwrap())
            .collect()];
        let old: Vec<Vec<ArrayRef>> = vec![batch
            .old_keys
            .columns()
            .iter()
            .map(|a| schemas.cast(a).unwrap())
            .collect()];
        let keys = EncodedKeys::new(&schemas, &cast, &old).unwrap();
        let reads = reads(std::slice::from_ref(batch), &keys, false);
        (keys, reads, schemas)
    }

    #[test]
    fn each_change_gets_whole_before_and_after_images() {
        let batch = changes(&[
            upd(1, None, 11),
            upd(1, Some("x"), 12),
            del(1),
            ins(2, "n"),
            (Op::Update, 5, Some(4), None, Some(50)),
        ]);
        let (keys, read, schemas) = walk_of(&batch);
        // Key 1's row before the commit, and the old key 4 a key change moves.
        assert_eq!(read, vec![Src::Row(0, 0), Src::Old(0, 4)]);
        let log = rows(&Walk {
            changes: std::slice::from_ref(&batch),
            keys: &keys,
            schemas: &schemas,
            reads: &read,
            found: &[Some(0), Some(1)],
            counted: 5,
            keep_old_keys: false,
        });
        let (b, kd, u, a, i) = (
            KIND_UPDATE_BEFORE,
            KIND_DELETE,
            KIND_UPDATE_AFTER,
            KIND_INSERT,
            KIND_INSERT,
        );
        assert_eq!(log.kinds, vec![b, u, b, u, kd, i, kd, a]);
        assert_eq!(log.orders, vec![1, 1, 2, 2, 3, 4, 5, 5]);
        let row = |n: usize| log.sources[n * 3..n * 3 + 3].to_vec();
        let (l0, l1) = (Src::Lookup(0), Src::Lookup(1));
        let r = |n| Src::Row(0, n);
        assert_eq!(row(0), vec![l0, l0, l0], "-U from the table");
        assert_eq!(row(1), vec![r(0), l0, r(0)], "+U: the absent column kept");
        assert_eq!(row(2), row(1), "-U: the previous +U");
        assert_eq!(row(3), vec![r(1), r(1), r(1)]);
        assert_eq!(row(4), row(3), "-D: the whole row");
        assert_eq!(row(5), vec![r(3), r(3), r(3)]);
        assert_eq!(row(6), vec![l1, l1, l1], "-D of the old key");
        assert_eq!(row(7), vec![r(4), l1, r(4)], "+I of the new key");
    }

    /// Soft deletes: a key change onto a key that holds a flagged row updates that row (`-U` of
    /// it, `+U` completed from the old key's row), and writes nothing of the old key, whose
    /// flagged row stays.
    #[test]
    fn a_soft_deleted_key_moved_onto_is_updated() {
        let batch = changes(&[(Op::Update, 2, Some(1), None, Some(20))]);
        let (keys, _, schemas) = walk_of(&batch);
        let read = reads(std::slice::from_ref(&batch), &keys, true);
        assert_eq!(read, vec![Src::Old(0, 0), Src::Row(0, 0)]);
        let log_with = |found: &[Option<u32>]| {
            rows(&Walk {
                changes: std::slice::from_ref(&batch),
                keys: &keys,
                schemas: &schemas,
                reads: &read,
                found,
                counted: 1,
                keep_old_keys: true,
            })
        };
        let log = log_with(&[Some(0), Some(1)]);
        assert_eq!(log.kinds, vec![KIND_UPDATE_BEFORE, KIND_UPDATE_AFTER]);
        let (l0, l1, r0) = (Src::Lookup(0), Src::Lookup(1), Src::Row(0, 0));
        assert_eq!(log.sources, vec![l1, l1, l1, r0, l0, r0]);
        let fresh = log_with(&[Some(0), None]);
        assert_eq!(fresh.kinds, vec![KIND_INSERT], "onto no row: +I");
    }

    #[test]
    fn an_insert_only_commit_names_one_source_per_row() {
        let batch = changes(&[ins(1, "a"), ins(2, "b")]);
        assert!(insert_only(std::slice::from_ref(&batch)));
        let log = inserts(std::slice::from_ref(&batch), 2, 3);
        assert_eq!(log.columns, 3);
        assert_eq!(log.kinds, vec![KIND_INSERT, KIND_INSERT]);
        assert_eq!(log.orders, vec![1, 2]);
        assert_eq!(log.rows, vec![Src::Row(0, 0), Src::Row(0, 1)]);
        assert!(log.sources.is_empty());
    }

    #[test]
    fn a_delete_of_a_row_the_table_lacks_keeps_what_the_change_says() {
        let batch = changes(&[del(9)]);
        let (keys, read, schemas) = walk_of(&batch);
        let log = rows(&Walk {
            changes: std::slice::from_ref(&batch),
            keys: &keys,
            schemas: &schemas,
            reads: &read,
            found: &[None],
            counted: 1,
            keep_old_keys: false,
        });
        assert_eq!(log.kinds, vec![KIND_DELETE]);
        assert_eq!(log.sources, vec![Src::Row(0, 0), Src::Null, Src::Null]);
    }
}
