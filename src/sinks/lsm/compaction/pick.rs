//! Universal compaction (pure): which sorted runs of a bucket to merge.
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
//! These only decide; `worker.rs` reads, merges (`merge.rs`) and commits a `COMPACT`
//! snapshot. Deletes are dropped only when the output is the bottom of the tree (no older run is
//! left below to resurrect).

use crate::sinks::lsm::manifest::DataFileMeta;

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
