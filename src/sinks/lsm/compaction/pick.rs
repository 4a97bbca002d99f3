//! Universal compaction (pure): which sorted runs of a bucket to merge, and the merge itself.
//!
//! A bucket is an LSM tree: every commit adds one level-0 file (a sorted run of its own); levels
//! 1..=max hold one sorted run each. Reads merge all runs, so their number is what reads and
//! memory pay for. [`pick`] follows Paimon's `UniversalCompaction` (RocksDB's universal style):
//! 1. size amplification: when the runs above the oldest add up to more than
//!    `max_size_amplification_percent` of it, merge everything;
//! 2. size ratio: merge the newest runs while each next run is not much larger than what is
//!    picked so far (`size_ratio` percent);
//! 3. run count: above `trigger` runs, merge the newest `runs - trigger + 1` (plus neighbours by
//!    size ratio).
//!
//! [`consolidate`] rewrites a bottom run an initial copy left in many files as one, once the
//! copy is done.
//!
//! These only decide; `worker.rs` reads, merges with [`merge_runs`] and commits a `COMPACT`
//! snapshot. Deletes are dropped only when the output is the bottom of the tree (no older run is
//! left below to resurrect).

use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, Int8Type};
use arrow_array::{Int64Array, Int8Array, RecordBatch};
use arrow_row::{RowConverter, Rows, SortField};
use bytes::Bytes;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};

use crate::sinks::lsm::manifest::DataFileMeta;
use crate::sinks::lsm::schema::{FileSchemas, KIND_DELETE};
use crate::sinks::lsm::writer::{FileError, RunWriter};

/// Compaction settings (Paimon option names in brackets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Sorted runs that trigger a compaction [`num-sorted-run.compaction-trigger`, 5].
    pub trigger: usize,
    /// Sorted runs at which commits wait for compaction [`num-sorted-run.stop-trigger`, trigger + 3].
    pub stop_trigger: usize,
    /// [`compaction.max-size-amplification-percent`, 200].
    pub max_size_amp_percent: u64,
    /// [`compaction.size-ratio`, 1].
    pub size_ratio_percent: u64,
    /// The bottom level [`num-levels` - 1, trigger].
    pub max_level: i32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            trigger: 5,
            stop_trigger: 8,
            max_size_amp_percent: 200,
            size_ratio_percent: 1,
            max_level: 5,
        }
    }
}

/// One sorted run of a bucket: its level and its files (indexes into the bucket's file list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub level: i32,
    pub files: Vec<usize>,
    pub size: i64,
}

/// What to merge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    /// Indexes into the bucket's file list.
    pub files: Vec<usize>,
    pub output_level: i32,
    pub drop_deletes: bool,
}

/// The sorted runs of a bucket, newest first: level-0 files by descending sequence number, then
/// one run per non-empty level.
pub fn runs(files: &[DataFileMeta]) -> Vec<Run> {
    let mut l0: Vec<usize> = (0..files.len())
        .filter(|&i| files.get(i).is_some_and(|f| f.level == 0))
        .collect();
    l0.sort_by_key(|&i| std::cmp::Reverse(files.get(i).map_or(0, |f| f.max_sequence)));
    let mut out: Vec<Run> = l0
        .into_iter()
        .map(|i| Run {
            level: 0,
            files: vec![i],
            size: files.get(i).map_or(0, |f| f.file_size),
        })
        .collect();
    let mut levels: Vec<i32> = files.iter().map(|f| f.level).filter(|&l| l > 0).collect();
    levels.sort_unstable();
    levels.dedup();
    for level in levels {
        let members: Vec<usize> = (0..files.len())
            .filter(|&i| files.get(i).is_some_and(|f| f.level == level))
            .collect();
        let size = members
            .iter()
            .filter_map(|&i| files.get(i))
            .map(|f| f.file_size)
            .sum();
        out.push(Run {
            level,
            files: members,
            size,
        });
    }
    out
}

/// Paimon's universal picker; `None` when the bucket needs no compaction.
pub fn pick(runs: &[Run], o: &Options) -> Option<Unit> {
    if runs.len() < o.trigger.max(2) {
        return None;
    }
    // 1. Size amplification.
    if let Some((oldest, newer)) = runs.split_last() {
        let candidate: i64 = newer.iter().map(|r| r.size).sum();
        if candidate.max(0) as u64 * 100 > o.max_size_amp_percent * oldest.size.max(0) as u64 {
            return Some(unit(runs, runs.len(), o));
        }
    }
    // 2. Size ratio.
    if let Some(u) = size_ratio(runs, 1, false, o) {
        return Some(u);
    }
    // 3. Run count.
    if runs.len() > o.trigger {
        return size_ratio(runs, runs.len() - o.trigger + 1, true, o);
    }
    None
}

fn size_ratio(runs: &[Run], mut count: usize, force: bool, o: &Options) -> Option<Unit> {
    let mut size: i64 = runs.iter().take(count).map(|r| r.size).sum();
    for next in runs.iter().skip(count) {
        if (size.max(0) as u64) * (100 + o.size_ratio_percent) / 100 < next.size.max(0) as u64 {
            break;
        }
        size += next.size;
        count += 1;
    }
    (force || count > 1).then(|| unit(runs, count, o))
}

/// Merges the newest `count` runs; the output goes just above the next older run (never level
/// 0), or to the bottom when every run is merged.
fn unit(runs: &[Run], mut count: usize, o: &Options) -> Unit {
    let mut output_level = match runs.get(count) {
        None => o.max_level,
        Some(next) => (next.level - 1).max(0),
    };
    if output_level == 0 {
        while let Some(next) = runs.get(count) {
            count += 1;
            if next.level != 0 {
                output_level = next.level;
                break;
            }
        }
        if count >= runs.len() {
            output_level = o.max_level;
        }
    }
    let files = runs
        .iter()
        .take(count)
        .flat_map(|r| r.files.iter().copied())
        .collect();
    Unit {
        files,
        output_level,
        drop_deletes: count >= runs.len(),
    }
}

/// Files of the bottom run above which [`consolidate`] rewrites it as one file.
pub const MAX_BOTTOM_FILES: usize = 8;

/// Rewrites a bottom run of more than [`MAX_BOTTOM_FILES`] files as one file. An initial copy
/// leaves one bottom file per reader's key block per commit (`placement.rs`): many small files
/// that readers would each open. The caller asks only once the copy is done: a file spanning
/// the gaps between blocks would put the rows a copy reader still has to write inside its key
/// range, and so in level 0. The files are disjoint, so the merge is one chained run: a
/// concatenation, without key comparisons.
pub fn consolidate(runs: &[Run], o: &Options) -> Option<Unit> {
    let bottom = runs
        .last()
        .filter(|r| r.level == o.max_level && r.files.len() > MAX_BOTTOM_FILES)?;
    Some(Unit {
        files: bottom.files.clone(),
        output_level: o.max_level,
        // The oldest run: no older version of a key lies below it.
        drop_deletes: true,
    })
}

/// Merges every run of a bucket into one file at the bottom level (`None` when it already is one
/// file there without deletes to drop; an initial copy leaves several bottom files per bucket).
pub fn full(runs: &[Run], files: &[DataFileMeta], o: &Options) -> Option<Unit> {
    if let [only] = runs {
        if only.files.len() > 1 {
            return Some(unit(runs, runs.len(), o));
        }
        let has_deletes = only
            .files
            .iter()
            .filter_map(|&i| files.get(i))
            .any(|f| f.delete_row_count > 0);
        if only.level == o.max_level && !has_deletes {
            return None;
        }
    }
    if runs.is_empty() {
        return None;
    }
    Some(unit(runs, runs.len(), o))
}

/// Rows per output batch of [`merge_runs`].
const MERGE_BATCH_ROWS: usize = 8192;

/// One input run being merged: its reader, the current batch and position.
struct Cursor {
    reader: ParquetRecordBatchReader,
    /// The run's files after the one being read, in key order.
    rest: std::vec::IntoIter<Bytes>,
    batch: RecordBatch,
    keys: Rows,
    seq: Int64Array,
    kind: Int8Array,
    pos: usize,
    /// Index of `batch` in the merge's held batches.
    held: usize,
    done: bool,
}

impl Cursor {
    /// Moves to the next non-empty batch; `done` at the end.
    fn next_batch(&mut self, conv: &RowConverter, schemas: &FileSchemas) -> Result<(), FileError> {
        let nk = schemas.key.len();
        loop {
            let Some(b) = self.reader.next() else {
                match self.rest.next() {
                    Some(data) => {
                        self.reader = open(data)?;
                        continue;
                    }
                    None => {
                        self.done = true;
                        return Ok(());
                    }
                }
            };
            let b = b?;
            if b.num_rows() == 0 {
                continue;
            }
            let b = crate::sinks::lsm::writer::to_table_shape(&b, schemas)?;
            self.keys = conv.convert_columns(b.columns().get(..nk).unwrap_or_default())?;
            let (Some(seq), Some(kind)) = (
                b.column(nk).as_primitive_opt::<Int64Type>(),
                b.column(nk + 1).as_primitive_opt::<Int8Type>(),
            ) else {
                return Err(FileError::Shape(
                    "_SEQUENCE_NUMBER or _VALUE_KIND has the wrong type".into(),
                ));
            };
            self.seq = seq.clone();
            self.kind = kind.clone();
            self.batch = b;
            self.pos = 0;
            return Ok(());
        }
    }
}

fn open(data: Bytes) -> Result<ParquetRecordBatchReader, FileError> {
    Ok(ParquetRecordBatchReaderBuilder::try_new(data)?
        .with_batch_size(MERGE_BATCH_ROWS)
        .build()?)
}

/// Merges sorted runs (each a list of encoded data files in key order, together sorted with one
/// row per key, as `placement::chains` groups them) into `out`, a batch at a time: per key the row with
/// the highest sequence number wins (the deduplicate merge engine), deletes dropped when
/// `drop_deletes`. Memory: the encoded inputs plus one decoded batch per run, never a whole
/// decoded run.
pub fn merge_runs(
    inputs: Vec<Vec<Bytes>>,
    schemas: &FileSchemas,
    drop_deletes: bool,
    out: &mut RunWriter,
) -> Result<(), FileError> {
    let conv = RowConverter::new(
        schemas
            .key_types
            .iter()
            .map(|t| SortField::new(t.clone()))
            .collect(),
    )?;
    let mut cursors = Vec::with_capacity(inputs.len());
    for run in inputs {
        let mut rest = run.into_iter();
        let Some(data) = rest.next() else {
            continue;
        };
        let mut c = Cursor {
            reader: open(data)?,
            rest,
            batch: RecordBatch::new_empty(schemas.file.clone()),
            keys: conv.empty_rows(0, 0),
            seq: Int64Array::from(Vec::<i64>::new()),
            kind: Int8Array::from(Vec::<i8>::new()),
            pos: 0,
            held: 0,
            done: false,
        };
        c.next_batch(&conv, schemas)?;
        if !c.done {
            cursors.push(c);
        }
    }
    let mut held: Vec<RecordBatch> = Vec::new();
    for c in &mut cursors {
        c.held = held.len();
        held.push(c.batch.clone());
    }
    let mut picks: Vec<(usize, usize)> = Vec::with_capacity(MERGE_BATCH_ROWS);
    let mut same: Vec<usize> = Vec::with_capacity(cursors.len());
    loop {
        // The smallest key; among equal keys the highest sequence number.
        let mut best: Option<usize> = None;
        for (i, c) in cursors.iter().enumerate() {
            if c.done {
                continue;
            }
            let Some(b) = best.and_then(|b| cursors.get(b)) else {
                best = Some(i);
                continue;
            };
            let ord = c.keys.row(c.pos).cmp(&b.keys.row(b.pos));
            if ord.is_lt() || (ord.is_eq() && c.seq.value(c.pos) > b.seq.value(b.pos)) {
                best = Some(i);
            }
        }
        let Some(w) = best else { break };
        let Some(winner) = cursors.get(w) else { break };
        if !(drop_deletes && winner.kind.value(winner.pos) == KIND_DELETE) {
            picks.push((winner.held, winner.pos));
        }
        // Every cursor at the winning key moves on (older versions are dropped).
        same.clear();
        for (i, c) in cursors.iter().enumerate() {
            if !c.done && c.keys.row(c.pos) == winner.keys.row(winner.pos) {
                same.push(i);
            }
        }
        let mut reloaded = false;
        for &i in &same {
            let Some(c) = cursors.get_mut(i) else {
                continue;
            };
            c.pos += 1;
            if c.pos >= c.batch.num_rows() {
                c.next_batch(&conv, schemas)?;
                if !c.done {
                    c.held = held.len();
                    held.push(c.batch.clone());
                    reloaded = true;
                }
            }
        }
        if picks.len() >= MERGE_BATCH_ROWS || (reloaded && held.len() > 4 * cursors.len()) {
            flush(&mut picks, &mut held, &mut cursors, schemas, out)?;
        }
    }
    flush(&mut picks, &mut held, &mut cursors, schemas, out)
}

/// Writes the picked rows and keeps only the batches the cursors still read.
fn flush(
    picks: &mut Vec<(usize, usize)>,
    held: &mut Vec<RecordBatch>,
    cursors: &mut [Cursor],
    schemas: &FileSchemas,
    out: &mut RunWriter,
) -> Result<(), FileError> {
    if !picks.is_empty() {
        let mut cols = Vec::with_capacity(schemas.file.fields().len());
        for c in 0..schemas.file.fields().len() {
            let arrays: Vec<&dyn arrow_array::Array> =
                held.iter().map(|b| b.column(c).as_ref()).collect();
            cols.push(arrow_select::interleave::interleave(&arrays, picks)?);
        }
        out.write(&RecordBatch::try_new(schemas.file.clone(), cols)?)?;
        picks.clear();
    }
    held.clear();
    for c in cursors.iter_mut().filter(|c| !c.done) {
        c.held = held.len();
        held.push(c.batch.clone());
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;
    use crate::sinks::lsm::manifest::Stats;

    /// A data file of `level` and `size` bytes written at sequence `seq` (no keys): what the
    /// compaction pickers look at.
    pub(in crate::sinks::lsm) fn file(level: i32, size: i64, seq: i64) -> DataFileMeta {
        DataFileMeta {
            file_name: format!("f{level}-{seq}"),
            file_size: size,
            row_count: 1,
            min_key: vec![],
            max_key: vec![],
            key_stats: Stats::default(),
            min_sequence: seq,
            max_sequence: seq,
            schema_id: 0,
            level,
            creation_time_ms: 0,
            delete_row_count: 0,
            file_source: 0,
        }
    }

    fn run(schemas: &FileSchemas, keys: &[i64], seq_base: i64, delete_every: i64) -> Bytes {
        use arrow_array::ArrayRef;
        use std::sync::Arc;
        let k: ArrayRef = Arc::new(Int64Array::from(keys.to_vec()));
        let seq: ArrayRef = Arc::new(Int64Array::from_iter_values(
            keys.iter().map(|k| seq_base + k),
        ));
        let kind: ArrayRef = Arc::new(Int8Array::from_iter_values(keys.iter().map(|k| {
            if delete_every > 0 && k % delete_every == 0 {
                KIND_DELETE
            } else {
                0
            }
        })));
        let v: ArrayRef = Arc::new(Int64Array::from_iter_values(keys.iter().map(|_| seq_base)));
        let batch = schemas
            .batch(vec![k.clone()], seq, kind, vec![k, v])
            .unwrap();
        let mut w = RunWriter::new(schemas).unwrap();
        w.write(&batch).unwrap();
        Bytes::from(w.finish().unwrap().0)
    }

    #[test]
    fn merge_runs_keeps_the_newest_version_across_batches() {
        use crate::changelog::{Column, TableId, TableSchema};
        use arrow_schema::DataType;
        let col = |n: &str| Column {
            name: n.into(),
            data_type: DataType::Int64,
            nullable: true,
            source_type: String::new(),
            initial_default: None,
            former_names: Vec::new(),
        };
        let schemas = FileSchemas::new(&TableSchema {
            id: TableId::new("p", "t"),
            columns: vec![col("id"), col("v")],
            primary_key: vec![0],
        });
        let old: Vec<i64> = (0..20_000).collect();
        let new: Vec<i64> = (0..20_000).filter(|k| k % 2 == 0).collect();
        // The old run in two files (a chained bottom run), the new one in one.
        let (low, high) = old.split_at(7_000);
        let inputs = vec![
            vec![run(&schemas, &new, 100_000, 4)],
            vec![run(&schemas, low, 0, 0), run(&schemas, high, 0, 0)],
        ];
        let mut out = RunWriter::new(&schemas).unwrap();
        merge_runs(inputs, &schemas, true, &mut out).unwrap();
        let (bytes, stats) = out.finish().unwrap();
        assert_eq!(stats.rows(), 15_000, "odd keys, and even keys not deleted");
        let batch = crate::sinks::lsm::writer::decode(Bytes::from(bytes), &schemas).unwrap();
        let ids = batch.column(0).as_primitive::<Int64Type>();
        let v = batch.column(4).as_primitive::<Int64Type>();
        assert!(
            ids.values().windows(2).all(|w| w[0] < w[1]),
            "sorted, unique"
        );
        for i in 0..batch.num_rows() {
            let want = if ids.value(i) % 2 == 0 { 100_000 } else { 0 };
            assert_eq!(v.value(i), want, "key {}", ids.value(i));
            assert!(ids.value(i) % 4 != 0);
        }
        let meta = stats.describe("f".into(), 1, 5, 1).unwrap();
        assert_eq!((meta.min_sequence, meta.max_sequence), (1, 119_998));
    }

    #[test]
    fn consolidates_a_bottom_run_of_many_files_alone() {
        let mut files: Vec<_> = (0..9).map(|s| file(5, 10, s)).collect();
        assert_eq!(
            consolidate(&runs(&files), &Options::default()).map(|u| u.files.len()),
            Some(9)
        );
        files.push(file(0, 10, 100));
        let u = consolidate(&runs(&files), &Options::default()).unwrap();
        assert!(!u.files.contains(&9), "level 0 stays: {u:?}");
        assert_eq!((u.output_level, u.drop_deletes), (5, true));
        files.truncate(8);
        assert_eq!(consolidate(&runs(&files), &Options::default()), None);
    }

    #[test]
    fn few_runs_need_nothing() {
        let files = vec![file(0, 10, 1), file(0, 10, 2), file(5, 1000, 0)];
        assert_eq!(pick(&runs(&files), &Options::default()), None);
    }

    #[test]
    fn size_amplification_merges_everything_to_the_bottom() {
        let files: Vec<_> = (0..5).map(|s| file(0, 100, s)).collect();
        let r = runs(&files);
        assert_eq!(r.first().unwrap().files, vec![4], "newest first");
        let u = pick(&r, &Options::default()).unwrap();
        assert_eq!(u.files.len(), 5);
        assert_eq!(u.output_level, 5);
        assert!(u.drop_deletes);
    }

    #[test]
    fn run_count_merges_the_newest_above_a_big_bottom_run() {
        let mut files: Vec<_> = (1..=6).map(|s| file(0, 1 + s, s)).collect();
        files.push(file(5, 1_000_000, 0));
        let u = pick(&runs(&files), &Options::default()).unwrap();
        assert!(!u.files.contains(&6), "the bottom run stays: {u:?}");
        assert_eq!(u.output_level, 4);
        assert!(!u.drop_deletes);
    }

    #[test]
    fn full_compaction_skips_a_single_clean_bottom_run() {
        let files = vec![file(5, 10, 1)];
        assert_eq!(full(&runs(&files), &files, &Options::default()), None);
        let files = vec![file(0, 10, 1)];
        assert_eq!(
            full(&runs(&files), &files, &Options::default())
                .unwrap()
                .output_level,
            5
        );
    }
}
