//! Which data files one compaction cycle rewrites, and into how many output files: pure, from
//! the live files' sizes, row counts and deletion-vector cardinalities (Iceberg-Java's
//! `RewriteDataFiles` bin-pack strategy, bounded per cycle).
//!
//! A file is a candidate when it is *small* (below `min-file-size-bytes`, 75% of the target) or
//! *delete-heavy* (its deletion vector deletes at least `delete-ratio` of its rows: Iceberg's
//! `delete-ratio-threshold`). Delete-heavy files come first (rewriting them is what stops a
//! reader's work from growing), then small files smallest first, so the many tiny files of
//! streaming commits are merged before the larger outputs of earlier cycles; a file that does
//! not fit the cycle's byte or row budget is left for a later cycle (at least one file is taken, so a
//! delete-heavy file above the budget is still rewritten alone). The group is rewritten only if
//! it has a delete-heavy file or at least `min-input-files` files: one small file rewritten alone
//! would come out as one small file again.
//!
//! Size tiers (format v3 only): a partition's small files, smallest first, form tiers: a file
//! more than [`TIER_RATIO`] times the bytes of its tier so far starts the next one (universal
//! compaction's size ratio, as in RocksDB and Cassandra's size-tiered strategy). A cycle
//! rewrites the smallest tier that has `min-input-files` files, with the smaller tiers (fewer
//! files, fewer bytes than any one file of that tier). Without tiers every cycle re-merged the
//! table's one large output with the few new files of the last minute, rewriting the whole table
//! each cycle and holding the table's commits that long (docs/performance.md, "Long-run
//! maintenance"); with them a file is rewritten about log(table / new bytes per cycle) times, and
//! the large outputs are merged when enough of their size have come together. On v2 tables only while the
//! conversion of the files left in place fits its budget (`convert.rs`): an equality delete file
//! leaves the table only when every older data file is rewritten or converted (`equality.rs`),
//! so past the budget the pick is untiered (measured with tiers and no conversion: DuckDB's scan
//! went from 1 s to 22 s over 4,000 commits).
//!
//! Outputs are packed in pick order by estimated live bytes (a file's bytes times its share of
//! live rows) up to the target size; a file is never split across outputs.
//!
//! Partitioned tables: a file of the table's default spec is rewritten only with files of the
//! same partition ([`Group`]), so an output holds one partition, as its manifest entry says;
//! `min-input-files` and the size tiers count per partition, and the budget takes a partition's
//! files together or not at all (taken smallest first across the table, a budget of ~1,000 files
//! spread over 730 daily partitions picked one or two per partition, under `min-input-files`
//! in each, and compaction stopped with thousands of small files left). Files of an older spec (written before another engine
//! or cdcd's config evolved the spec) are all candidates, whatever their size: their rows are
//! rewritten into the current spec (`rewrite.rs` splits them by partition), after the
//! delete-heavy files and before the small ones, within the cycle's byte budget, so a table
//! whose spec evolved is moved into its new spec a budget per cycle. They share outputs with
//! each other (whatever their spec and partition: the rewrite splits their rows), not with files
//! of the current spec, and are rewritten even alone (`min-input-files` does not apply: one such
//! file rewritten alone still leaves the old spec).

use std::collections::HashMap;

use crate::sinks::iceberg::files::manifest::LiveFile;
use crate::sinks::iceberg::files::writer::Placement;
use crate::sinks::iceberg::maintenance::properties::Compaction;

/// A small file joins a cycle's rewrite only if it is at most this many times the bytes of the
/// smaller small files chosen before it (see the module doc).
pub(crate) const TIER_RATIO: u64 = 2;

/// One live data file as the picker sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub size_bytes: u64,
    pub record_count: u64,
    /// Rows its deletion vector deletes.
    pub deleted_rows: u64,
    /// Data sequence number (the tie-break: older first).
    pub sequence: i64,
    /// The files it may be rewritten with.
    pub partition: Group,
}

/// Which files may share an output: those of one partition of the default spec (`Some`), or
/// those of older specs (`None`), whose rows the rewrite repartitions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Group(Option<Placement>);

impl Group {
    /// The group of `file`, whose table's default spec is `default_spec`.
    pub fn of(file: &LiveFile, default_spec: i32) -> Group {
        Group((file.spec_id == default_spec).then(|| file.placement()))
    }
}

impl Candidate {
    fn live_rows(&self) -> u64 {
        self.record_count.saturating_sub(self.deleted_rows)
    }

    /// Bytes the file's live rows are estimated to take once rewritten.
    fn live_bytes(&self) -> u64 {
        if self.record_count == 0 {
            return 0;
        }
        let live = u128::from(self.size_bytes) * u128::from(self.live_rows())
            / u128::from(self.record_count);
        u64::try_from(live).unwrap_or(u64::MAX)
    }

    fn delete_heavy(&self, policy: &Compaction) -> bool {
        self.deleted_rows > 0
            && u128::from(self.deleted_rows) * 100
                >= u128::from(policy.delete_ratio_percent) * u128::from(self.record_count)
    }

    fn small(&self, policy: &Compaction) -> bool {
        self.size_bytes < policy.min_file_size_bytes
    }

    /// Of an older spec than the table's default one.
    fn old_spec(&self) -> bool {
        self.partition.0.is_none()
    }
}

/// What one cycle rewrites: indexes into the candidates, grouped by output file. An output whose
/// inputs have no live row writes nothing (its inputs only leave the table).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Choice {
    pub outputs: Vec<Vec<usize>>,
}

impl Choice {
    pub fn is_empty(&self) -> bool {
        self.outputs.is_empty()
    }

    /// The chosen files, in pick order.
    pub fn inputs(&self) -> impl Iterator<Item = usize> + '_ {
        self.outputs.iter().flatten().copied()
    }
}

/// Chooses this cycle's rewrite of `files` (see the module doc); empty when nothing is worth it.
/// `tiered`: apply the size tiers (`mod.rs` says when).
pub(crate) fn choose(policy: &Compaction, files: &[Candidate], tiered: bool) -> Choice {
    if !policy.enabled {
        return Choice::default();
    }
    let mut order: Vec<usize> = (0..files.len())
        .filter(|&i| {
            files
                .get(i)
                .is_some_and(|f| f.old_spec() || f.small(policy) || f.delete_heavy(policy))
        })
        .collect();
    // Delete-heavy first (most deleted rows first), then those of older specs, then small ones
    // smallest first; older first.
    order.sort_by_key(|&i| {
        let f = &files[i];
        let heavy = f.delete_heavy(policy);
        (
            !heavy,
            !f.old_spec(),
            if heavy {
                u64::MAX - f.deleted_rows
            } else {
                f.size_bytes
            },
            f.sequence,
            i,
        )
    });
    // Per partition, in pick order, the files its size tier admits.
    // (Indexed by group: a 730-day copy has ~10,000 files, a linear search per file is ~7M
    // comparisons.)
    let mut partitions: Vec<PartitionPick> = Vec::new();
    let mut index: HashMap<&Group, usize> = HashMap::new();
    for i in order {
        let file = &files[i];
        let at = *index.entry(&file.partition).or_insert_with(|| {
            partitions.push(PartitionPick::new(&file.partition));
            partitions.len() - 1
        });
        partitions[at].admit(policy, file, i, tiered);
    }
    // Whole partitions within the cycle's byte budget, in pick order: a partition whose share
    // would fall short of `min-input-files` takes none of it, so the budget is never spent on
    // files that are then left alone (spread over many partitions, the smallest files of the
    // table would otherwise fill every cycle, a few per partition, and nothing be rewritten).
    let mut outputs = Vec::new();
    let mut spent = Budget::default();
    for partition in partitions {
        let group = partition.group;
        let mut taken = Vec::new();
        let mut taken_budget = Budget::default();
        for i in partition.members(policy) {
            let file = Budget {
                bytes: files[i].size_bytes,
                rows: files[i].record_count,
            };
            let with = spent.plus(taken_budget).plus(file);
            // At least one file per cycle, however large (a delete-heavy file above the budget).
            let first = spent.plus(taken_budget) == Budget::default();
            if !first
                && (with.bytes > policy.max_bytes_per_cycle
                    || with.rows > policy.max_rows_per_cycle)
            {
                continue;
            }
            taken_budget = taken_budget.plus(file);
            taken.push(i);
        }
        let heavy = taken.iter().any(|&i| files[i].delete_heavy(policy));
        if heavy || group.0.is_none() || taken.len() >= policy.min_input_files {
            spent = spent.plus(taken_budget);
            outputs.extend(pack(policy.target_file_size_bytes, files, &taken));
        }
    }
    Choice { outputs }
}

/// What a cycle's inputs add up to, against `max-bytes-per-cycle` and `max-rows-per-cycle`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Budget {
    bytes: u64,
    rows: u64,
}

impl Budget {
    fn plus(self, other: Budget) -> Budget {
        Budget {
            bytes: self.bytes.saturating_add(other.bytes),
            rows: self.rows.saturating_add(other.rows),
        }
    }
}

/// The files of one partition (or of the older specs) a cycle may rewrite, in pick order.
struct PartitionPick<'a> {
    group: &'a Group,
    /// Delete-heavy files and files of older specs: outside the size tiers.
    untiered: Vec<usize>,
    /// The small files in size tiers, smallest first: a file more than [`TIER_RATIO`] times
    /// the bytes of its tier so far starts the next.
    tiers: Vec<Vec<usize>>,
    /// Bytes of the last tier (its measure).
    tier_bytes: u64,
}

impl<'a> PartitionPick<'a> {
    fn new(group: &'a Group) -> Self {
        PartitionPick {
            group,
            untiered: Vec::new(),
            tiers: Vec::new(),
            tier_bytes: 0,
        }
    }

    /// Places `file` (index `i`; files come smallest first) outside the tiers or in its tier.
    fn admit(&mut self, policy: &Compaction, file: &Candidate, i: usize, tiered: bool) {
        if file.delete_heavy(policy) || file.old_spec() {
            self.untiered.push(i);
            return;
        }
        let next_tier = tiered
            && self.tier_bytes > 0
            && file.size_bytes > self.tier_bytes.saturating_mul(TIER_RATIO);
        match self.tiers.last_mut() {
            Some(tier) if !next_tier => tier.push(i),
            _ => {
                self.tiers.push(vec![i]);
                self.tier_bytes = 0;
            }
        }
        self.tier_bytes = self.tier_bytes.saturating_add(file.size_bytes);
    }

    /// The files to rewrite, in pick order: those outside the tiers, and the smallest tier with
    /// `min-input-files` files together with the smaller tiers (too few to rewrite on their own,
    /// and together smaller than any file of that tier, so they ride along; left out, a
    /// few tiny files, such as a copied table's only streaming commits, kept the copy's files
    /// from ever being merged). No tier has enough: the smallest one, rewritten only with a
    /// delete-heavy file.
    fn members(self, policy: &Compaction) -> Vec<usize> {
        let enough = self
            .tiers
            .iter()
            .position(|tier| tier.len() >= policy.min_input_files)
            .unwrap_or(0);
        let mut members = self.untiered;
        members.extend(self.tiers.into_iter().take(enough + 1).flatten());
        members
    }
}

/// Packs `picked` (in order) into outputs of up to `target` estimated live bytes each.
fn pack(target: u64, files: &[Candidate], picked: &[usize]) -> Vec<Vec<usize>> {
    let mut outputs: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut filled = 0u64;
    for &i in picked {
        let live = files[i].live_bytes();
        if !current.is_empty() && filled.saturating_add(live) > target {
            outputs.push(std::mem::take(&mut current));
            filled = 0;
        }
        filled = filled.saturating_add(live);
        current.push(i);
    }
    if !current.is_empty() {
        outputs.push(current);
    }
    outputs
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn policy() -> Compaction {
        let mut p = Compaction::from_properties(&HashMap::new()).unwrap();
        p.target_file_size_bytes = 1000;
        p.min_file_size_bytes = 750;
        p.max_bytes_per_cycle = 2000;
        p.max_rows_per_cycle = 1_000_000;
        p.min_input_files = 3;
        p.delete_ratio_percent = 30;
        p
    }

    fn file(size: u64, rows: u64, deleted: u64, sequence: i64) -> Candidate {
        in_partition(size, rows, deleted, sequence, Some(0))
    }

    /// A file of partition `day` of the default spec (`None`: of an older spec).
    fn in_partition(
        size: u64,
        rows: u64,
        deleted: u64,
        sequence: i64,
        day: Option<i32>,
    ) -> Candidate {
        use iceberg::spec::{Literal, Struct};
        Candidate {
            size_bytes: size,
            record_count: rows,
            deleted_rows: deleted,
            sequence,
            partition: Group(day.map(|d| Placement {
                spec_id: 1,
                partition: Struct::from_iter([Some(Literal::date(d))]),
                sort_order_id: None,
            })),
        }
    }

    /// Issue 36: an output never mixes partitions of the current spec, `min-input-files` counts
    /// per partition, and files of older specs are rewritten together, even alone.
    #[test]
    fn outputs_hold_one_partition_and_old_spec_files_are_respecced() {
        let mut p = policy();
        p.max_bytes_per_cycle = 10_000;
        let files = [
            in_partition(100, 10, 0, 1, Some(1)),
            in_partition(100, 10, 0, 2, Some(2)),
            in_partition(100, 10, 0, 3, Some(1)),
            in_partition(100, 10, 0, 4, Some(2)),
            in_partition(100, 10, 0, 5, Some(1)),
            in_partition(100, 10, 0, 6, None),
            in_partition(100, 10, 0, 7, None),
            in_partition(100, 10, 0, 8, None),
            in_partition(900, 100, 50, 9, Some(3)),
        ];
        let c = choose(&p, &files, true);
        // Day 3's delete-heavy file alone; the older spec's files together; day 1's three
        // files; day 2 has two (< 3) and waits.
        assert_eq!(c.outputs, vec![vec![8], vec![5, 6, 7], vec![0, 2, 4]]);
        // One file of an older spec, large, not delete-heavy: rewritten alone, within the
        // budget (the second waits for the next cycle).
        p.max_bytes_per_cycle = 5_000;
        let files = [
            in_partition(4_000, 400, 0, 1, None),
            in_partition(4_000, 400, 0, 2, None),
        ];
        assert_eq!(choose(&p, &files, true).outputs, vec![vec![0]]);
    }

    /// Issue 36: the budget is spent on whole partitions. Taken smallest first across the
    /// table, it held two or three files of each partition, fewer than `min-input-files`, and
    /// every cycle rewrote nothing while each partition had enough small files.
    #[test]
    fn the_budget_takes_whole_partitions_so_many_partitions_still_compact() {
        let mut p = policy();
        p.max_bytes_per_cycle = 800;
        // Four days of three files each (100, 110, 120 bytes), interleaved: the six smallest
        // files of the table are two per day.
        let mut files = Vec::new();
        for size in [100, 110, 120] {
            for day in 0..4 {
                files.push(in_partition(size, 10, 0, files.len() as i64, Some(day)));
            }
        }
        let c = choose(&p, &files, true);
        // Days 0 and 1 whole (660 bytes); day 2 does not fit with three files, and is not taken
        // with two.
        assert_eq!(c.outputs, vec![vec![0, 4, 8], vec![1, 5, 9]]);
    }

    #[test]
    fn few_small_files_without_deletes_are_left_alone() {
        let files = [
            file(100, 10, 0, 1),
            file(100, 10, 0, 2),
            file(900, 90, 0, 3),
        ];
        assert!(choose(&policy(), &files, true).is_empty());
    }

    #[test]
    fn enough_small_files_are_merged_smallest_first_and_large_ones_stay() {
        let files = [
            file(300, 30, 0, 1),
            file(900, 90, 0, 2),
            file(100, 10, 0, 3),
            file(200, 20, 0, 4),
            file(400, 40, 0, 5),
        ];
        let c = choose(&policy(), &files, true);
        // 100 + 200 + 300 + 400 = 1000 ≤ target: one output; the 900-byte file is not small.
        assert_eq!(c.outputs, vec![vec![2, 3, 0, 4]]);
    }

    #[test]
    fn a_small_file_much_larger_than_the_new_ones_waits_for_its_tier() {
        // 100 + 100 + 100 = 300: the 700-byte output of earlier cycles (small: < 750) is more
        // than twice that, so it is not rewritten again with them.
        let files = [
            file(700, 70, 0, 1),
            file(100, 10, 0, 2),
            file(100, 10, 0, 3),
            file(100, 10, 0, 4),
        ];
        assert_eq!(choose(&policy(), &files, true).outputs, vec![vec![1, 2, 3]]);
        // Once the smaller ones add up to half its size, it joins them.
        let files = [
            file(600, 60, 0, 1),
            file(100, 10, 0, 2),
            file(100, 10, 0, 3),
            file(100, 10, 0, 4),
        ];
        assert_eq!(choose(&policy(), &files, true).inputs().count(), 4);
        // Untiered (v2, equality deletes): every small file, the large output too.
        let files = [
            file(700, 70, 0, 1),
            file(100, 10, 0, 2),
            file(100, 10, 0, 3),
            file(100, 10, 0, 4),
        ];
        assert_eq!(choose(&policy(), &files, false).inputs().count(), 4);
    }

    /// Issue 37: a copied table's two one-row commits are its smallest tier, too few to
    /// rewrite; the copy's files, a tier of their own, are merged, the two ride along. Before,
    /// the two closed the tiers and the copy's files waited for streaming files of their size.
    #[test]
    fn a_tier_too_few_to_rewrite_rides_along_with_the_next() {
        let mut p = policy();
        p.max_bytes_per_cycle = 10_000;
        p.min_file_size_bytes = 2_000;
        let files = [
            file(5, 1, 0, 10),
            file(200, 20, 0, 1),
            file(210, 21, 0, 2),
            file(6, 1, 0, 11),
            file(190, 19, 0, 3),
            file(1300, 130, 0, 4),
        ];
        let c = choose(&p, &files, true);
        // Tiers {5, 6}, {190, 200, 210}, {1300}: the second with the first.
        assert_eq!(c.outputs, vec![vec![0, 3, 4, 1, 2]]);
        // No tier has three files: nothing, not the 1,300-byte output with the two tiny ones.
        let files = [file(5, 1, 0, 10), file(6, 1, 0, 11), file(1300, 130, 0, 4)];
        assert!(choose(&p, &files, true).is_empty());
        // Two tiers of two: nothing either.
        let files = [
            file(5, 1, 0, 10),
            file(6, 1, 0, 11),
            file(200, 20, 0, 1),
            file(210, 21, 0, 2),
        ];
        assert!(choose(&p, &files, true).is_empty());
    }

    #[test]
    fn a_delete_heavy_file_is_rewritten_alone_even_when_large() {
        let files = [
            file(5000, 100, 30, 1),
            file(5000, 100, 29, 2),
            file(100, 10, 0, 3),
        ];
        let c = choose(&policy(), &files, true);
        // Over the budget on its own, still taken; nothing else fits after it.
        assert_eq!(c.outputs, vec![vec![0]]);
    }

    #[test]
    fn the_budget_bounds_a_cycle_and_skips_what_does_not_fit() {
        let mut p = policy();
        p.max_bytes_per_cycle = 650;
        let files = [
            file(100, 10, 0, 1),
            file(500, 50, 0, 2),
            file(200, 20, 0, 3),
            file(300, 30, 0, 4),
            file(50, 5, 0, 5),
        ];
        let c = choose(&p, &files, true);
        // Smallest first: 50, 100, 200, 300 = 650; the 500-byte file waits for a later cycle.
        assert_eq!(c.outputs, vec![vec![4, 0, 2, 3]]);
    }

    /// Issue 37: rows bound a cycle as bytes do. 64 MiB of pgbench's accounts (rows that
    /// compress to ~3 bytes) was 24M rows, whose keys then moved in the index for 70 s while
    /// the table's commits waited.
    #[test]
    fn the_row_budget_bounds_a_cycle_of_well_compressed_rows() {
        let mut p = policy();
        p.max_bytes_per_cycle = 10_000;
        p.max_rows_per_cycle = 250;
        let files: Vec<Candidate> = (0..6).map(|i| file(100, 100, 0, i)).collect();
        // Two files fit 250 rows, fewer than three: nothing this cycle.
        assert!(choose(&p, &files, true).is_empty());
        p.max_rows_per_cycle = 400;
        assert_eq!(choose(&p, &files, true).outputs, vec![vec![0, 1, 2, 3]]);
        // One file over the row budget alone is still rewritten when delete-heavy.
        p.max_rows_per_cycle = 10;
        let files = [file(100, 100, 50, 1)];
        assert_eq!(choose(&p, &files, true).outputs, vec![vec![0]]);
    }

    #[test]
    fn outputs_are_packed_by_live_bytes_up_to_the_target() {
        let mut p = policy();
        p.max_bytes_per_cycle = 10_000;
        let files = [
            file(700, 10, 0, 1),
            file(700, 10, 0, 2),
            // Half deleted: ~350 live bytes.
            file(700, 10, 5, 3),
            file(700, 10, 0, 4),
        ];
        let c = choose(&p, &files, true);
        assert_eq!(c.outputs, vec![vec![2], vec![0], vec![1], vec![3]]);
        p.target_file_size_bytes = 1400;
        let c = choose(&p, &files, true);
        assert_eq!(c.outputs, vec![vec![2, 0], vec![1, 3]]);
        assert_eq!(c.inputs().collect::<Vec<_>>(), vec![2, 0, 1, 3]);
    }

    #[test]
    fn fully_deleted_files_go_and_disabled_compaction_picks_nothing() {
        let files = [file(900, 10, 10, 1)];
        assert_eq!(choose(&policy(), &files, true).outputs, vec![vec![0]]);
        let mut off = policy();
        off.enabled = false;
        assert!(choose(&off, &files, true).is_empty());
        assert!(choose(&policy(), &[], true).is_empty());
    }
}
