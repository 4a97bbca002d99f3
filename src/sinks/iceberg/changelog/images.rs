//! The changelog rows of one commit (pure): every change of the commit's runs as complete row
//! images, an update as its `update_before` and `update_after` rows.
//!
//! A change carries only what the source sent: an update without `REPLICA IDENTITY FULL` lacks
//! its old row, an unchanged TOAST value or a MySQL MINIMAL/NOBLOB image leaves columns absent,
//! a delete carries its key. Each key's image is followed through the commit: its first update
//! or delete starts from the table's row before the commit ([`prior_keys`] names the keys to read;
//! `write.rs` reads them as the table's own commit reads rows to complete), every later change
//! from the image the previous change left. A key the table does not hold (a change replayed in
//! an upsert window after the copy already had its effect, `rows/window.rs`) has no before image:
//! its `update_before` and `delete` rows carry the key and what the change sent, other columns
//! NULL.
//!
//! Cells are not copied one by one: an image is, per column, where its value is (a change's row,
//! the table's row, the old key of a key change, or NULL), and each output column is one Arrow
//! `interleave` over those sources.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use arrow_array::{new_null_array, Array, ArrayRef, RecordBatch};
use arrow_row::{Row, RowConverter, Rows, SortField};
use arrow_schema::ArrowError;
use arrow_select::interleave::interleave;

use crate::changelog::{Op, TableChanges};
use crate::sinks::iceberg::plan::KeyRef;

/// What a changelog row says happened (`_cdc_op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangeKind {
    Insert,
    UpdateBefore,
    UpdateAfter,
    Delete,
    /// Every row of the table is gone; the row's source columns are NULL.
    Truncate,
}

impl ChangeKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Insert => "insert",
            ChangeKind::UpdateBefore => "update_before",
            ChangeKind::UpdateAfter => "update_after",
            ChangeKind::Delete => "delete",
            ChangeKind::Truncate => "truncate",
        }
    }
}

/// The changelog rows of a commit: the source columns, and per row its kind and its run.
#[derive(Debug)]
pub(crate) struct Images {
    /// One column per source column (the commit's schema).
    pub columns: Vec<ArrayRef>,
    pub kinds: Vec<ChangeKind>,
    /// Per row, the index of the run (`changes[run]`) the change is from.
    pub runs: Vec<usize>,
}

/// The table's rows before the commit of the keys [`prior_keys`] named, in that order, typed like
/// the change rows; `missing[i]`: the table has no row of key `i`.
pub(crate) struct Prior<'a> {
    pub rows: &'a RecordBatch,
    pub missing: &'a [bool],
}

/// The key columns of every run, encoded to compare (new keys and old keys of key changes).
/// Keys are borrowed from here while walking: no key is copied per change.
struct Keys {
    new: Vec<Rows>,
    old: Vec<Rows>,
}

impl Keys {
    fn of(changes: &[TableChanges], key: &[usize]) -> Result<Keys, ArrowError> {
        let Some(first) = changes.first() else {
            return Ok(Keys {
                new: Vec::new(),
                old: Vec::new(),
            });
        };
        let fields = key
            .iter()
            .map(|&i| SortField::new(first.rows.column(i).data_type().clone()))
            .collect();
        let converter = RowConverter::new(fields)?;
        let mut new = Vec::with_capacity(changes.len());
        let mut old = Vec::with_capacity(changes.len());
        for c in changes {
            let columns: Vec<ArrayRef> = key.iter().map(|&i| c.rows.column(i).clone()).collect();
            new.push(converter.convert_columns(&columns)?);
            old.push(converter.convert_columns(c.old_keys.columns())?);
        }
        Ok(Keys { new, old })
    }

    fn new_key(&self, batch: usize, row: usize) -> Row<'_> {
        self.new[batch].row(row)
    }

    /// The key the row had before change (`batch`, `row`): its old key when the change moved it.
    fn before_key(&self, c: &TableChanges, batch: usize, row: usize) -> Row<'_> {
        if c.key_changed.get(row).copied().unwrap_or(false) {
            self.old[batch].row(row)
        } else {
            self.new_key(batch, row)
        }
    }
}

/// Hashes the encoded keys (`arrow_row` bytes) for [`key_ids`]: FxHash's multiply-rotate over
/// 8-byte words. It hashes one or two keys per change, and std's SipHash on a 9-byte int8 key
/// cost more than the rest of the walk (profiled on the MariaDB bench, issue 38).
#[derive(Default)]
struct KeyHasher(u64);

impl KeyHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            if let Some(head) = word.get_mut(..chunk.len()) {
                head.copy_from_slice(chunk);
            }
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
}

type KeyHash = BuildHasherDefault<KeyHasher>;

/// The changes of `changes`, one per key at most (sizes the key sets up front: growing them
/// rehashes every key several times).
fn change_count(changes: &[TableChanges]) -> usize {
    changes.iter().map(TableChanges::len).sum()
}

/// Every change's key as a dense id, one per distinct key of the commit ([`key_ids`]): the walks
/// ([`prior_keys`], [`images`]) index their per-key state by id, so each change's key is encoded
/// and hashed once per commit.
#[derive(Debug, Default)]
pub(crate) struct KeyIds {
    /// Per run, per change: the id of its key.
    new: Vec<Vec<u32>>,
    /// Per run, per change: the id of the key the row had before the change (its old key when
    /// the change moved it, else its key).
    before: Vec<Vec<u32>>,
    /// How many distinct keys (ids are `0..count`).
    count: usize,
}

impl KeyIds {
    fn new_id(&self, batch: usize, row: usize) -> usize {
        self.new
            .get(batch)
            .and_then(|ids| ids.get(row))
            .map_or(usize::MAX, |&id| id as usize)
    }

    fn before_id(&self, batch: usize, row: usize) -> usize {
        self.before
            .get(batch)
            .and_then(|ids| ids.get(row))
            .map_or(usize::MAX, |&id| id as usize)
    }
}

/// The key ids of `changes` (`key`: the key columns; none for a keyless table, whose changes
/// carry whole rows).
pub(crate) fn key_ids(changes: &[TableChanges], key: &[usize]) -> Result<KeyIds, ArrowError> {
    if key.is_empty() {
        return Ok(KeyIds::default());
    }
    let keys = Keys::of(changes, key)?;
    let mut ids: HashMap<Row<'_>, u32, KeyHash> =
        HashMap::with_capacity_and_hasher(change_count(changes), KeyHash::default());
    fn id_of<'k>(ids: &mut HashMap<Row<'k>, u32, KeyHash>, key: Row<'k>) -> u32 {
        let next = ids.len() as u32;
        *ids.entry(key).or_insert(next)
    }
    let mut out = KeyIds::default();
    for (b, c) in changes.iter().enumerate() {
        let mut new = Vec::with_capacity(c.ops.len());
        let mut before = Vec::with_capacity(c.ops.len());
        for r in 0..c.ops.len() {
            let id = id_of(&mut ids, keys.new_key(b, r));
            let moved = c.key_changed.get(r).copied().unwrap_or(false);
            before.push(if moved {
                id_of(&mut ids, keys.before_key(c, b, r))
            } else {
                id
            });
            new.push(id);
        }
        out.new.push(new);
        out.before.push(before);
    }
    out.count = ids.len();
    Ok(out)
}

/// Per key id, whether a walk met the key already; [`Seen::first`] marks it.
struct Seen(Vec<bool>);

impl Seen {
    fn new(ids: &KeyIds) -> Seen {
        Seen(vec![false; ids.count])
    }

    /// Whether this is the first time `id` is met.
    fn first(&mut self, id: usize) -> bool {
        self.0
            .get_mut(id)
            .is_some_and(|met| !std::mem::replace(met, true))
    }
}

/// The keys whose row before the commit the changelog needs, each once, in the order
/// [`images`] consumes them: a key's first change in the commit when it is an update (its old
/// key, when the update moves it) or a delete, unless a truncate came before; with
/// `keep_old_keys` (soft deletes) also the new key of a key change, which may hold a flagged
/// row. Empty for a keyless table, whose changes carry whole rows.
pub(crate) fn prior_keys(
    changes: &[TableChanges],
    ids: &KeyIds,
    keep_old_keys: bool,
) -> Vec<KeyRef> {
    if ids.count == 0 {
        return Vec::new();
    }
    let mut seen = Seen::new(ids);
    let mut truncated = false;
    let mut wanted = Vec::new();
    for (b, c) in changes.iter().enumerate() {
        for (r, op) in c.ops.iter().enumerate() {
            let at = |old: bool| KeyRef {
                batch: b as u32,
                row: r as u32,
                old,
            };
            match op {
                Op::Truncate => truncated = true,
                Op::Insert => {
                    seen.first(ids.new_id(b, r));
                }
                Op::Update => {
                    let moved = c.key_changed.get(r).copied().unwrap_or(false);
                    if seen.first(ids.before_id(b, r)) && !truncated {
                        wanted.push(at(moved));
                    }
                    if seen.first(ids.new_id(b, r)) && moved && keep_old_keys && !truncated {
                        wanted.push(at(false));
                    }
                }
                Op::Delete => {
                    if seen.first(ids.new_id(b, r)) && !truncated {
                        wanted.push(at(false));
                    }
                }
            }
        }
    }
    wanted
}

/// Where an image's cell is: (source, row); see [`Sources`].
type Cell = (usize, usize);

/// The arrays cells point into, per column: the runs' rows (`0..n`), the prior rows (`n`), a
/// NULL (`n + 1`), the runs' old keys (`n + 2 + batch`, key columns only; NULL for the others).
struct Sources {
    runs: usize,
}

impl Sources {
    fn prior(&self) -> usize {
        self.runs
    }
    fn null(&self) -> Cell {
        (self.runs + 1, 0)
    }
    fn old_key(&self, batch: usize) -> usize {
        self.runs + 2 + batch
    }
}

/// A key's image while walking: `width` cells at `start` of the emitted rows' cells or of the
/// images not emitted, or a row of the table before the commit (every cell from it).
#[derive(Debug, Clone, Copy)]
enum Image {
    Emitted(usize),
    Kept(usize),
    Prior(usize),
}

/// The changelog rows of `changes` (the commit's runs, in order, of one schema; `key`: the key
/// columns, empty for a keyless table), completed from `prior` (the table's rows of
/// [`prior_keys`]); only runs with `emit[run]` give rows (the others, already in the changelog or
/// copy rows, still move the images).
pub(crate) fn images(
    changes: &[TableChanges],
    key: &[usize],
    ids: &KeyIds,
    prior: Option<Prior<'_>>,
    emit: &[bool],
    keep_old_keys: bool,
) -> Result<Images, ArrowError> {
    let Some(first) = changes.first() else {
        return Ok(Images {
            columns: Vec::new(),
            kinds: Vec::new(),
            runs: Vec::new(),
        });
    };
    let width = first.rows.num_columns();
    let src = Sources {
        runs: changes.len(),
    };
    let mut walk = Walk {
        src: &src,
        key,
        width,
        keep_old_keys,
        prior: prior.as_ref(),
        next_prior: 0,
        images: vec![None; ids.count],
        truncated: false,
        cells: Vec::new(),
        kept: Vec::new(),
        kinds: Vec::new(),
        runs: Vec::new(),
    };
    for (b, c) in changes.iter().enumerate() {
        let emit = emit.get(b).copied().unwrap_or(false);
        for (r, op) in c.ops.iter().enumerate() {
            if key.is_empty() {
                walk.keyless(c, b, r, *op, emit);
            } else {
                let ids = (ids.new_id(b, r), ids.before_id(b, r));
                walk.keyed(c, (b, r), *op, ids, emit);
            }
        }
    }
    let Walk {
        cells, kinds, runs, ..
    } = walk;
    let columns = gather(changes, key, prior.as_ref(), &src, width, &cells)?;
    Ok(Images {
        columns,
        kinds,
        runs,
    })
}

/// The images followed through the commit, and the rows emitted so far.
struct Walk<'a> {
    src: &'a Sources,
    /// The key columns.
    key: &'a [usize],
    width: usize,
    /// `deletes = "soft"`: a key change leaves the old key's row, flagged by the change before
    /// it (`sinks/cdc_columns.rs`), and replaces the new key's flagged row if it has one.
    keep_old_keys: bool,
    prior: Option<&'a Prior<'a>>,
    /// The next row of `prior` (keys are met in [`prior_keys`]'s order).
    next_prior: usize,
    /// Per key id, once met: its image, or `None` once it has no row.
    images: Vec<Option<Option<Image>>>,
    truncated: bool,
    /// Per emitted row, its cells (`width` each, flattened).
    cells: Vec<Cell>,
    /// The cells of images not emitted (runs already in the changelog), `width` each.
    kept: Vec<Cell>,
    kinds: Vec<ChangeKind>,
    runs: Vec<usize>,
}

impl Walk<'_> {
    /// Cell `col` of `image`.
    fn cell(&self, image: Image, col: usize) -> Cell {
        let at = match image {
            Image::Prior(i) => return (self.src.prior(), i),
            Image::Emitted(start) => self.cells.get(start + col),
            Image::Kept(start) => self.kept.get(start + col),
        };
        at.copied().unwrap_or(self.src.null())
    }

    /// Emits a row of `kind` from `run` whose cell `col` is `cell(self, col)`; returns its image.
    fn emit_with(
        &mut self,
        kind: ChangeKind,
        run: usize,
        cell: impl Fn(&Self, usize) -> Cell,
    ) -> Image {
        let start = self.cells.len();
        for col in 0..self.width {
            let c = cell(self, col);
            self.cells.push(c);
        }
        self.kinds.push(kind);
        self.runs.push(run);
        Image::Emitted(start)
    }

    /// Emits `image` as a row of `kind` from `run`.
    fn emit(&mut self, kind: ChangeKind, run: usize, image: Image) {
        self.emit_with(kind, run, |w, col| w.cell(image, col));
    }

    /// The row of the change, its absent cells from `base` (NULL without one): emitted as a
    /// row of `kind` when `emit` holds one, else kept.
    fn after(
        &mut self,
        c: &TableChanges,
        (b, r): (usize, usize),
        base: Option<Image>,
        emit: Option<ChangeKind>,
    ) -> Image {
        let cell = |w: &Self, col: usize| {
            if c.is_present(col, r) {
                (b, r)
            } else {
                base.map_or(w.src.null(), |img| w.cell(img, col))
            }
        };
        match emit {
            Some(kind) => self.emit_with(kind, b, cell),
            None => {
                let start = self.kept.len();
                for col in 0..self.width {
                    let c = cell(self, col);
                    self.kept.push(c);
                }
                Image::Kept(start)
            }
        }
    }

    /// The row a key had before the change: met earlier in the commit, else the table's.
    fn before(&mut self, key: usize) -> Option<Image> {
        if let Some(Some(image)) = self.images.get(key) {
            return *image;
        }
        if self.truncated {
            return None;
        }
        let i = self.next_prior;
        self.next_prior += 1;
        let prior = self.prior?;
        if prior.missing.get(i).copied().unwrap_or(true) || i >= prior.rows.num_rows() {
            return None;
        }
        Some(Image::Prior(i))
    }

    /// Key `key` (an id) now has `image` (`None`: no row).
    fn set(&mut self, key: usize, image: Option<Image>) {
        if let Some(met) = self.images.get_mut(key) {
            *met = Some(image);
        }
    }

    /// Change `(b, r)` of a keyed table, whose key is `new_key` and was `before_key` (ids).
    fn keyed(
        &mut self,
        c: &TableChanges,
        (b, r): (usize, usize),
        op: Op,
        (new_key, before_key): (usize, usize),
        emit: bool,
    ) {
        match op {
            Op::Insert => {
                let image = self.after(c, (b, r), None, emit.then_some(ChangeKind::Insert));
                self.set(new_key, Some(image));
            }
            Op::Update => {
                let moved = c.key_changed.get(r).copied().unwrap_or(false);
                let before = self.before(before_key);
                if moved && self.keep_old_keys {
                    return self.moved_keeping_old_key(c, (b, r), before, new_key, emit);
                }
                if emit {
                    match before {
                        Some(image) => self.emit(ChangeKind::UpdateBefore, b, image),
                        None => {
                            // Only the key is known: the old one when the update moved it.
                            let key_cell = if moved {
                                (self.src.old_key(b), r)
                            } else {
                                (b, r)
                            };
                            self.emit_with(ChangeKind::UpdateBefore, b, |w, col| {
                                if w.key.contains(&col) {
                                    key_cell
                                } else {
                                    w.src.null()
                                }
                            });
                        }
                    }
                }
                let after = self.after(c, (b, r), before, emit.then_some(ChangeKind::UpdateAfter));
                if moved {
                    self.set(before_key, None);
                }
                self.set(new_key, Some(after));
            }
            Op::Delete => {
                let before = self.before(new_key);
                if emit {
                    match before {
                        Some(image) => self.emit(ChangeKind::Delete, b, image),
                        None => {
                            self.after(c, (b, r), None, Some(ChangeKind::Delete));
                        }
                    }
                }
                self.set(new_key, None);
            }
            Op::Truncate => self.truncate(b, emit),
        }
    }

    /// A key change with soft deletes: the old key's flagged row stays, so nothing of it is
    /// emitted; the new key's row is `insert`ed, or replaces the row the key holds (a flagged
    /// one): `update_before` of it, then `update_after`. Absent cells come from `before`, the
    /// old key's image.
    fn moved_keeping_old_key(
        &mut self,
        c: &TableChanges,
        (b, r): (usize, usize),
        before: Option<Image>,
        new_key: usize,
        emit: bool,
    ) {
        let replaced = self.before(new_key);
        let kind = match replaced {
            Some(image) => {
                if emit {
                    self.emit(ChangeKind::UpdateBefore, b, image);
                }
                ChangeKind::UpdateAfter
            }
            None => ChangeKind::Insert,
        };
        let after = self.after(c, (b, r), before, emit.then_some(kind));
        self.set(new_key, Some(after));
    }

    /// A keyless table's changes are whole rows: an insert, or a delete of one equal row (an
    /// update arrives as the two).
    fn keyless(&mut self, c: &TableChanges, b: usize, r: usize, op: Op, emit: bool) {
        let kind = match op {
            Op::Insert | Op::Update => ChangeKind::Insert,
            Op::Delete => ChangeKind::Delete,
            Op::Truncate => return self.truncate(b, emit),
        };
        if emit {
            self.after(c, (b, r), None, Some(kind));
        }
    }

    fn truncate(&mut self, b: usize, emit: bool) {
        if emit {
            self.emit_with(ChangeKind::Truncate, b, |w, _| w.src.null());
        }
        self.images.fill(None);
        self.truncated = true;
    }
}

/// Each output column from its cells, one `interleave` per column.
fn gather(
    changes: &[TableChanges],
    key: &[usize],
    prior: Option<&Prior<'_>>,
    src: &Sources,
    width: usize,
    cells: &[Cell],
) -> Result<Vec<ArrayRef>, ArrowError> {
    let rows = cells.len().checked_div(width).unwrap_or(0);
    // Each column's cells, split in one pass over the row-major cells: gathering a column by
    // striding through them missed the cache on every row (profiled on the MariaDB bench).
    let mut per_column: Vec<Vec<Cell>> = (0..width).map(|_| Vec::with_capacity(rows)).collect();
    for row in cells.chunks_exact(width.max(1)) {
        for (column, cell) in per_column.iter_mut().zip(row) {
            column.push(*cell);
        }
    }
    let mut columns = Vec::with_capacity(width);
    for (col, indices) in per_column.iter().enumerate() {
        let data_type = changes
            .first()
            .map(|c| c.rows.column(col).data_type().clone())
            .ok_or_else(|| ArrowError::InvalidArgumentError("no changes".into()))?;
        let null = new_null_array(&data_type, 1);
        let mut arrays: Vec<&dyn Array> = changes
            .iter()
            .map(|c| c.rows.column(col).as_ref())
            .collect();
        arrays.push(match prior {
            Some(p) => p.rows.column(col).as_ref(),
            None => null.as_ref(),
        });
        arrays.push(null.as_ref());
        let k = key.iter().position(|&i| i == col);
        for c in changes {
            arrays.push(match k.and_then(|k| c.old_keys.columns().get(k)) {
                Some(old) => old.as_ref(),
                None => null.as_ref(),
            });
        }
        debug_assert_eq!(arrays.len(), src.old_key(changes.len()));
        columns.push(interleave(&arrays, indices)?);
    }
    Ok(columns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::{changes, del, ins, schema, upd, without_key};
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use std::sync::Arc;

    /// A changelog row of the test table: (kind, id, a, b).
    type Row = (&'static str, Option<i64>, Option<String>, Option<i64>);

    /// The images as rows.
    fn rows(images: &Images) -> Vec<Row> {
        let id = images.columns[0].as_primitive::<Int64Type>();
        let a = images.columns[1].as_string::<i32>();
        let b = images.columns[2].as_primitive::<Int64Type>();
        (0..images.kinds.len())
            .map(|i| {
                (
                    images.kinds[i].as_str(),
                    id.is_valid(i).then(|| id.value(i)),
                    a.is_valid(i).then(|| a.value(i).to_owned()),
                    b.is_valid(i).then(|| b.value(i)),
                )
            })
            .collect()
    }

    fn row(kind: &'static str, id: i64, a: Option<&str>, b: Option<i64>) -> Row {
        (kind, Some(id), a.map(str::to_owned), b)
    }

    /// An update leaving `a` absent (unchanged TOAST) and a delete carrying its key only take the
    /// table's row before the commit; the changes after them in the commit take the image the
    /// earlier ones left, and the table is read once per key.
    #[test]
    fn images_are_completed_from_the_table_then_followed_through_the_commit() {
        let runs = [changes(&[
            upd(1, None, 7),
            upd(1, None, 8),
            del(2),
            ins(3, "c"),
            upd(3, None, 9),
            del(3),
        ])];
        let ids = key_ids(&runs, &[0]).unwrap();
        let wanted = prior_keys(&runs, &ids, false);
        assert_eq!(wanted.len(), 2, "keys 1 and 2, once each: {wanted:?}");
        // The table's rows of keys 1 and 2.
        let prior = changes(&[ins(1, "one"), ins(2, "two")]).rows;
        let images = images(
            &runs,
            &[0],
            &ids,
            Some(Prior {
                rows: &prior,
                missing: &[false, false],
            }),
            &[true],
            false,
        )
        .unwrap();
        assert_eq!(
            rows(&images),
            vec![
                row("update_before", 1, Some("one"), Some(10)),
                row("update_after", 1, Some("one"), Some(7)),
                row("update_before", 1, Some("one"), Some(7)),
                row("update_after", 1, Some("one"), Some(8)),
                row("delete", 2, Some("two"), Some(20)),
                row("insert", 3, Some("c"), Some(30)),
                row("update_before", 3, Some("c"), Some(30)),
                row("update_after", 3, Some("c"), Some(9)),
                row("delete", 3, Some("c"), Some(9)),
            ]
        );
    }

    /// A key change: the before image is the old key's row, and the old key has no row after.
    #[test]
    fn a_key_change_moves_the_image() {
        let runs = [changes(&[
            (Op::Update, 5, Some(1), None, Some(2)),
            del(1),
            upd(5, Some("x"), 3),
        ])];
        let ids = key_ids(&runs, &[0]).unwrap();
        let wanted = prior_keys(&runs, &ids, false);
        assert_eq!(wanted.len(), 1);
        assert!(wanted[0].old);
        let prior = changes(&[ins(1, "one")]).rows;
        let images = images(
            &runs,
            &[0],
            &ids,
            Some(Prior {
                rows: &prior,
                missing: &[false],
            }),
            &[true],
            false,
        )
        .unwrap();
        assert_eq!(
            rows(&images),
            vec![
                row("update_before", 1, Some("one"), Some(10)),
                row("update_after", 5, Some("one"), Some(2)),
                ("delete", Some(1), None, None),
                row("update_before", 5, Some("one"), Some(2)),
                row("update_after", 5, Some("x"), Some(3)),
            ]
        );
    }

    /// Without the table's row (an upsert window replay), the before image is the key alone;
    /// runs not emitted still move the images; a truncate empties them.
    #[test]
    fn missing_rows_skipped_runs_and_truncates() {
        let runs = [
            changes(&[ins(1, "a")]),
            changes(&[
                upd(2, None, 5),
                upd(1, None, 6),
                (Op::Truncate, 0, None, None, None),
                del(1),
            ]),
        ];
        let prior = changes(&[ins(2, "two")]).rows;
        let ids = key_ids(&runs, &[0]).unwrap();
        let wanted = prior_keys(&runs, &ids, false);
        assert_eq!(wanted.len(), 1, "key 2 only");
        let images = images(
            &runs,
            &[0],
            &ids,
            Some(Prior {
                rows: &prior,
                missing: &[true],
            }),
            &[false, true],
            false,
        )
        .unwrap();
        assert_eq!(
            rows(&images),
            vec![
                ("update_before", Some(2), None, None),
                ("update_after", Some(2), None, Some(5)),
                row("update_before", 1, Some("a"), Some(10)),
                row("update_after", 1, Some("a"), Some(6)),
                ("truncate", None, None, None),
                ("delete", Some(1), None, None),
            ]
        );
        assert_eq!(images.runs, vec![1; 6]);
    }

    /// A keyless table's changes are whole rows, read as they are.
    #[test]
    fn keyless_changes_are_their_rows() {
        let mut run = changes(&[ins(1, "a"), (Op::Delete, 1, None, Some("a"), Some(10))]);
        run.schema = Arc::clone(&without_key(&schema()));
        let runs = [run];
        let ids = key_ids(&runs, &[]).unwrap();
        assert!(prior_keys(&runs, &ids, false).is_empty());
        let images = images(&runs, &[], &ids, None, &[true], false).unwrap();
        assert_eq!(
            rows(&images),
            vec![
                row("insert", 1, Some("a"), Some(10)),
                row("delete", 1, Some("a"), Some(10))
            ]
        );
    }
}
