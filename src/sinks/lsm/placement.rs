//! Where a copy commit's rows of one bucket go (pure): straight to the bottom level as files
//! whose keys no other file's key range holds, or, as any commit, to level 0.
//!
//! Why: an initial copy writes every key exactly once. As level-0 runs, each copy commit of a
//! bucket would be merged by the universal compactor into the bottom run, rewriting the copied
//! table about once more (decode, merge, encode again: half of the copy's CPU), although the
//! runs share no key. Paimon skips such rewrites too: its compaction "upgrades" a file that
//! overlaps no other to the output level without rewriting it. cdcd decides at commit time: a
//! part of the commit whose rows lie in no live file's `[min_key, max_key]` range, and whose own
//! range holds no live file's, is a sorted run with keys no other file has, and can sit at the
//! bottom level beside the files already there (levels above 0 are sorted runs of files with
//! disjoint key ranges; readers merge only files whose ranges overlap, pypaimon
//! `IntervalPartition`, and read a bucket whose files are all on one level without merging).
//!
//! Where the rows of a commit are cut into files: at every live file's range (a file may not
//! span one), and where the copy's readers meet. A copy reads key ranges (chunks) on several
//! connections at once, each in the table's physical order, so one commit holds a block of rows
//! from each reader: sorted by key, a file spanning two readers' blocks would cover the keys the
//! first reader has yet to read, and the next commit's rows would fall inside its range. The
//! readers' batches reach the sink interleaved in arrival order, so within one reader's block the
//! batch index only grows along the key order; a step back to a lower batch index is where one
//! reader's block ends and another's begins. Where the source tags its batches with their copy
//! chunk (`TableChanges::copy_chunk`; Postgres does), a change of chunk is a cut too, which also
//! catches a reader whose block arrived wholly after another's (no step back: before the tag,
//! such a file spanned an unread chunk, every later commit of that chunk fell to level 0, and
//! the compactions that followed tripled the copy's CPU). Rows that do not fit (a key inside a
//! live file's range, a table whose physical order is not its key order: too many cuts) fall
//! back to one
//! level-0 run, which is always correct. The bottom files a copy leaves (a few per commit and
//! bucket) are rewritten as one per bucket once the copy is done (`compaction::consolidate`):
//! one rewrite after the copy instead of merges during it, which no longer holds up the copy.
//! [`chains`] lets that rewrite, and any merge, read a level's disjoint files as one sorted run.

use arrow_row::{OwnedRow, Row, RowConverter, Rows};
use arrow_schema::DataType;

use super::binary_row;
use super::manifest::DataFileMeta;
use super::plan::{Plan, Src};
use super::schema::{key_converter, FileSchemas};

/// More cuts than this in one bucket of one commit: the rows are not in key blocks (a heap
/// order unrelated to the key), and files this small would only be merged later: level 0.
pub const MAX_FILES: usize = 16;

/// The live files' key ranges of a bucket, sorted and with overlapping ranges joined.
#[derive(Debug, Default)]
pub struct Occupied {
    ranges: Vec<(OwnedRow, OwnedRow)>,
}

impl Occupied {
    /// From `(min_key, max_key)` of each live file, in any order.
    pub fn new(mut ranges: Vec<(OwnedRow, OwnedRow)>) -> Occupied {
        ranges.sort_by(|a, b| a.0.cmp(&b.0));
        let mut joined: Vec<(OwnedRow, OwnedRow)> = Vec::with_capacity(ranges.len());
        for (lo, hi) in ranges {
            match joined.last_mut() {
                Some(last) if lo.row() <= last.1.row() => {
                    if hi.row() > last.1.row() {
                        last.1 = hi;
                    }
                }
                _ => joined.push((lo, hi)),
            }
        }
        Occupied { ranges: joined }
    }
}

/// The key range of `file` (its manifest `min_key`/`max_key`) in `converter`'s row form.
/// `Err`: a key that does not decode as `key_types`.
pub fn key_range(
    file: &DataFileMeta,
    key_types: &[DataType],
    converter: &RowConverter,
) -> Result<(OwnedRow, OwnedRow), String> {
    let mut ends = Vec::with_capacity(2);
    for key in [&file.min_key, &file.max_key] {
        let columns =
            binary_row::decode(key, key_types).map_err(|e| format!("{}: {e}", file.file_name))?;
        let rows = converter
            .convert_columns(&columns)
            .map_err(|e| format!("{}: {e}", file.file_name))?;
        if rows.num_rows() != 1 {
            return Err(format!("{}: a key is not one row", file.file_name));
        }
        ends.push(rows.row(0).owned());
    }
    match (ends.pop(), ends.pop()) {
        (Some(hi), Some(lo)) => Ok((lo, hi)),
        _ => Err(format!("{}: no key range", file.file_name)),
    }
}

/// The key ranges of `files`, joined. `Err`: a key that does not decode as `key_types` (the
/// caller then writes level 0).
pub fn occupied(
    files: &[DataFileMeta],
    key_types: &[DataType],
    converter: &RowConverter,
) -> Result<Occupied, String> {
    let ranges = files
        .iter()
        .map(|f| key_range(f, key_types, converter))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Occupied::new(ranges))
}

/// Cuts `keys` (one bucket's rows of a commit, sorted by key, one row per key) into files for the
/// bottom level: `(first row, row count)` per file, or `None` when the rows belong in level 0.
/// `batch[i]` is the index of the source batch row `i` came from, `chunk[b]` the copy chunk of
/// batch `b` (`None` where the source does not say: then only the batch order tells readers
/// apart, which misses a reader whose block arrived wholly after another's).
pub fn bottom_files(
    keys: &Rows,
    batch: &[u32],
    chunk: &[Option<u32>],
    occupied: &Occupied,
) -> Option<Vec<(usize, usize)>> {
    let n = keys.num_rows();
    if n == 0 || batch.len() != n {
        return None;
    }
    let ranges = &occupied.ranges;
    // The first live range not entirely below the current key.
    let mut next = 0usize;
    let mut files: Vec<(usize, usize)> = Vec::new();
    let mut start = 0usize;
    let mut gap = usize::MAX;
    let mut previous: Option<(Row<'_>, u32)> = None;
    let chunk_of = |b: u32| chunk.get(b as usize).copied().flatten();
    for (i, key) in keys.iter().enumerate() {
        while ranges.get(next).is_some_and(|(_, hi)| hi.row() < key) {
            next += 1;
        }
        if ranges.get(next).is_some_and(|(lo, _)| lo.row() <= key) {
            return None;
        }
        let b = batch.get(i).copied().unwrap_or(0);
        let cut = match previous {
            None => false,
            Some((prev, prev_batch)) => {
                next != gap || b < prev_batch || chunk_of(b) != chunk_of(prev_batch) || prev >= key
            }
        };
        if cut {
            files.push((start, i - start));
            start = i;
            if files.len() >= MAX_FILES {
                return None;
            }
        }
        gap = next;
        previous = Some((key, b));
    }
    files.push((start, n - start));
    Some(files)
}

/// Where the rows `first..` of `plan` (one bucket's, `part`) go when an initial copy writes
/// them: `(offset in part, rows)` per bottom-level file, or `None` for one level-0 run.
pub fn for_bucket(
    plan: &Plan,
    chunk: &[Option<u32>],
    schemas: &FileSchemas,
    first: usize,
    part: &arrow_array::RecordBatch,
    live: &[DataFileMeta],
) -> Option<Vec<(usize, usize)>> {
    let rows = plan.rows.get(first..first + part.num_rows())?;
    let mut batch = Vec::with_capacity(rows.len());
    for r in rows {
        match r.key {
            Src::Row(b, _) if !r.delete => batch.push(b),
            // Deletes and key changes: not a copy's rows.
            _ => return None,
        }
    }
    let converter = schemas.key_converter().ok()?;
    let occupied = match occupied(live, &schemas.key_types, &converter) {
        Ok(o) => o,
        Err(detail) => {
            tracing::warn!(
                detail,
                "a live file's key range does not decode; writing level 0"
            );
            return None;
        }
    };
    let keys = converter
        .convert_columns(part.columns().get(..schemas.key.len())?)
        .ok()?;
    bottom_files(&keys, &batch, chunk, &occupied)
}

/// The inputs of a merge as sorted runs: indexes into `files`, each inner list a run's files in
/// key order. A level-0 file is a run of its own; the files of a higher level (an initial copy
/// leaves many at the bottom) are chained into one run when their key ranges are disjoint, so
/// the merge compares one cursor per run instead of one per file. Files whose ranges overlap or
/// do not decode stay runs of their own, which is always correct.
pub fn chains(files: &[DataFileMeta], key_types: &[DataType]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut levels: Vec<i32> = files.iter().map(|f| f.level).filter(|&l| l > 0).collect();
    levels.sort_unstable();
    levels.dedup();
    out.extend(
        (0..files.len())
            .filter(|&i| files.get(i).is_some_and(|f| f.level == 0))
            .map(|i| vec![i]),
    );
    let converter = key_converter(key_types);
    for level in levels {
        let members: Vec<usize> = (0..files.len())
            .filter(|&i| files.get(i).is_some_and(|f| f.level == level))
            .collect();
        let ranges: Option<Vec<_>> = converter.as_ref().ok().and_then(|conv| {
            members
                .iter()
                .map(|&i| {
                    let f = files.get(i)?;
                    key_range(f, key_types, conv).ok().map(|r| (i, r))
                })
                .collect()
        });
        match ranges {
            Some(mut ranges) => {
                ranges.sort_by(|a, b| a.1 .0.cmp(&b.1 .0));
                let disjoint = ranges
                    .windows(2)
                    .all(|w| matches!(w, [a, b] if a.1 .1 < b.1 .0));
                if disjoint {
                    out.push(ranges.into_iter().map(|(i, _)| i).collect());
                } else {
                    out.extend(ranges.into_iter().map(|(i, _)| vec![i]));
                }
            }
            None => out.extend(members.into_iter().map(|i| vec![i])),
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::sinks::lsm::compaction::pick::tests::file;
    use arrow_array::{ArrayRef, Int64Array};
    use arrow_row::{RowConverter, SortField};
    use arrow_schema::DataType;
    use std::sync::Arc;

    fn rows(keys: &[i64]) -> Rows {
        let conv = RowConverter::new(vec![SortField::new(DataType::Int64)]).unwrap();
        let a: ArrayRef = Arc::new(Int64Array::from(keys.to_vec()));
        conv.convert_columns(&[a]).unwrap()
    }

    fn occupied(ranges: &[(i64, i64)]) -> Occupied {
        let r = rows(&ranges.iter().flat_map(|&(a, b)| [a, b]).collect::<Vec<_>>());
        Occupied::new(
            (0..ranges.len())
                .map(|i| (r.row(2 * i).owned(), r.row(2 * i + 1).owned()))
                .collect(),
        )
    }

    #[test]
    fn one_reader_into_an_empty_bucket_is_one_file() {
        let keys = rows(&[1, 2, 3, 4]);
        assert_eq!(
            bottom_files(&keys, &[0, 0, 4, 8], &[], &Occupied::default()),
            Some(vec![(0, 4)])
        );
    }

    #[test]
    fn cuts_where_readers_meet_and_around_live_files() {
        // Readers A (batches 0, 2) and B (batches 1, 3): A's keys 1..=4, B's 10..=13.
        let keys = rows(&[1, 2, 3, 4, 10, 11, 12, 13]);
        let batch = [0, 0, 2, 2, 1, 1, 3, 3];
        assert_eq!(
            bottom_files(&keys, &batch, &[], &Occupied::default()),
            Some(vec![(0, 4), (4, 4)])
        );
        // A live file [5, 6] between the blocks; another [20, 30] above them.
        let occ = occupied(&[(20, 30), (5, 6)]);
        let batch = [0; 8];
        assert_eq!(
            bottom_files(&keys, &batch, &[], &occ),
            Some(vec![(0, 4), (4, 4)])
        );
    }

    #[test]
    fn cuts_where_chunks_meet_even_when_batches_arrive_in_order() {
        // Chunk 7 (batches 0, 1) ended before chunk 9's batches (2, 3) arrived: the batch order
        // never steps back, yet keys 5..=9 between the blocks are unread (another chunk's).
        let keys = rows(&[1, 2, 3, 4, 10, 11, 12, 13]);
        let batch = [0, 0, 1, 1, 2, 2, 3, 3];
        let chunk = [Some(7), Some(7), Some(9), Some(9)];
        assert_eq!(
            bottom_files(&keys, &batch, &chunk, &Occupied::default()),
            Some(vec![(0, 4), (4, 4)])
        );
        assert_eq!(
            bottom_files(&keys, &batch, &[], &Occupied::default()),
            Some(vec![(0, 8)]),
            "without chunks the blocks look like one reader's"
        );
    }

    #[test]
    fn a_key_inside_a_live_range_goes_to_level_zero() {
        let keys = rows(&[1, 2, 7, 40]);
        assert_eq!(
            bottom_files(&keys, &[0; 4], &[], &occupied(&[(5, 9)])),
            None
        );
        assert_eq!(
            bottom_files(&keys, &[0; 4], &[], &occupied(&[(40, 40)])),
            None
        );
        assert_eq!(
            bottom_files(&keys, &[0; 4], &[], &occupied(&[(3, 6), (5, 6), (8, 39)])),
            Some(vec![(0, 2), (2, 1), (3, 1)]),
            "joined ranges [3, 6] and [8, 39] leave gaps below 3, at 7 and above 39"
        );
    }

    #[test]
    fn keys_not_in_blocks_go_to_level_zero() {
        let keys: Vec<i64> = (0..100).collect();
        let batch: Vec<u32> = (0..100).map(|i| (i % 2 == 0) as u32).collect();
        assert_eq!(
            bottom_files(&rows(&keys), &batch, &[], &Occupied::default()),
            None
        );
    }

    #[test]
    fn chains_disjoint_files_of_a_level_in_key_order() {
        let keyed = |level: i32, lo: i64, hi: i64| {
            let keys = Int64Array::from(vec![lo, hi]);
            let mut f = file(level, 10, lo);
            binary_row::encode(&mut f.min_key, &[&keys], 0).unwrap();
            binary_row::encode(&mut f.max_key, &[&keys], 1).unwrap();
            f
        };
        let types = [DataType::Int64];
        let files = vec![
            keyed(5, 10, 20),
            keyed(0, 1, 30),
            keyed(5, 1, 5),
            keyed(4, 1, 10),
            keyed(4, 5, 20),
        ];
        assert_eq!(
            chains(&files, &types),
            vec![vec![1], vec![3], vec![4], vec![2, 0]],
            "level 0 alone; level 4 overlaps; level 5 chained by key"
        );
    }
}
