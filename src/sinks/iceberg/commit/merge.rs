//! Which of the carried-over manifests a commit merges, and into which new manifests: the pure
//! plan ([`choose`]); `manifests.rs` carries it out. Iceberg-Java's semantics
//! (`MergingSnapshotProducer`, `ManifestMergeManager`):
//! - manifests are grouped by kind (data, deletes) and partition spec; a merged manifest never
//!   mixes two groups (the Iceberg spec: a manifest holds one content type and one spec);
//! - each group, in manifest-list order (newest first), is packed into bins of about
//!   `commit.manifest.target-size-bytes`, from the oldest end with a lookback of one bin: the
//!   order never changes, and the bin left under-filled is the newest, which later commits fill;
//! - a bin of one manifest is kept as it is; the newest bin is merged only once it holds
//!   `commit.manifest.min-count-to-merge` manifests, so a commit does not rewrite a small
//!   manifest each time; older bins (small manifests left behind a bin that filled) are merged
//!   whenever they hold two or more.
//!
//! Unlike Iceberg-Java, this commit's own new manifests are not candidates: they are written
//! anyway, and stay first in the list; they join the candidates on the next commit.
//!
//! The cap ([`MERGE_CAP_BYTES`]) bounds a commit's merge work: bins are merged in list order
//! while the manifests read stay under it; the rest wait for a later commit.

use iceberg::spec::ManifestContentType;

use crate::sinks::iceberg::maintenance::properties::Merging;

/// Bytes of manifests one commit may read to merge (and so about as many written: a merged
/// manifest holds the same entries). A bin always fits the first time (one bin is at most
/// `commit.manifest.target-size-bytes`, or a single manifest that is never merged), so merging
/// progresses whatever the target; beyond that, further bins wait for the next commits. At
/// 16 MiB a merge costs a commit at most ~16 MiB read and written besides its data.
pub(crate) const MERGE_CAP_BYTES: u64 = 16 * 1024 * 1024;

/// What the plan needs to know of a carried-over manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub content: ManifestContentType,
    pub spec_id: i32,
    /// `manifest_length`, in bytes.
    pub length: u64,
}

/// One manifest of the new list, as the plan makes it from the candidates (by index).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Output {
    /// The candidate, unchanged.
    Keep(usize),
    /// A new manifest holding the live entries of these candidates (two or more, one group,
    /// in list order).
    Merge(Vec<usize>),
}

/// The new list for `candidates` (in manifest-list order): every candidate appears exactly once,
/// alone or in one merge. With merging disabled every candidate is kept.
pub(crate) fn choose(policy: &Merging, candidates: &[Candidate]) -> Vec<Output> {
    if !policy.enabled {
        return (0..candidates.len()).map(Output::Keep).collect();
    }
    let mut budget = Budget {
        left: MERGE_CAP_BYTES,
        merged_any: false,
    };
    let mut out = Vec::new();
    for group in groups(candidates) {
        let bins = pack_from_end(&group, policy.target_size_bytes, |i| {
            candidates.get(i).map_or(0, |c| c.length)
        });
        let newest = group.first().copied();
        for bin in bins {
            let bytes: u64 = bin
                .iter()
                .filter_map(|&i| candidates.get(i))
                .map(|c| c.length)
                .sum();
            let wanted = bin.len() > 1
                && !(newest.is_some_and(|n| bin.contains(&n)) && bin.len() < policy.min_count);
            if wanted && budget.take(bytes) {
                out.push(Output::Merge(bin));
            } else {
                out.extend(bin.into_iter().map(Output::Keep));
            }
        }
    }
    out
}

/// What is left of [`MERGE_CAP_BYTES`] in this commit.
struct Budget {
    left: u64,
    merged_any: bool,
}

impl Budget {
    /// Whether a bin of `bytes` may be merged now (always the first one), and takes it.
    fn take(&mut self, bytes: u64) -> bool {
        if self.merged_any && bytes > self.left {
            return false;
        }
        self.left = self.left.saturating_sub(bytes);
        self.merged_any = true;
        true
    }
}

/// Candidate indexes grouped by (content, spec), groups in order of first appearance, each in
/// list order.
fn groups(candidates: &[Candidate]) -> Vec<Vec<usize>> {
    let mut keys: Vec<(ManifestContentType, i32)> = Vec::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, c) in candidates.iter().enumerate() {
        let key = (c.content, c.spec_id);
        match keys.iter().position(|k| *k == key) {
            Some(g) => {
                if let Some(group) = groups.get_mut(g) {
                    group.push(i);
                }
            }
            None => {
                keys.push(key);
                groups.push(vec![i]);
            }
        }
    }
    groups
}

/// Packs `items` into bins of at most `target` bytes (a larger item gets a bin of its own),
/// filling from the last item backwards and closing a bin as soon as the next item does not fit
/// (a lookback of one). Bins and their items come back in the original order.
fn pack_from_end(items: &[usize], target: u64, weight: impl Fn(usize) -> u64) -> Vec<Vec<usize>> {
    let mut bins: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut filled = 0u64;
    for &i in items.iter().rev() {
        let w = weight(i);
        if !current.is_empty() && filled.saturating_add(w) > target {
            bins.push(std::mem::take(&mut current));
            filled = 0;
        }
        current.push(i);
        filled = filled.saturating_add(w);
    }
    if !current.is_empty() {
        bins.push(current);
    }
    bins.reverse();
    for bin in &mut bins {
        bin.reverse();
    }
    bins
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use ManifestContentType::{Data, Deletes};

    fn policy(min_count: usize, target: u64) -> Merging {
        Merging {
            enabled: true,
            min_count,
            target_size_bytes: target,
        }
    }

    fn c(content: ManifestContentType, spec_id: i32, length: u64) -> Candidate {
        Candidate {
            content,
            spec_id,
            length,
        }
    }

    #[test]
    fn the_newest_bin_waits_for_the_minimum_count() {
        let four = vec![c(Data, 0, 10); 4];
        assert_eq!(
            choose(&policy(5, 1000), &four),
            (0..4).map(Output::Keep).collect::<Vec<_>>()
        );
        let five = vec![c(Data, 0, 10); 5];
        assert_eq!(
            choose(&policy(5, 1000), &five),
            vec![Output::Merge(vec![0, 1, 2, 3, 4])]
        );
    }

    #[test]
    fn data_and_deletes_and_specs_never_mix() {
        let list = [
            c(Data, 0, 10),
            c(Deletes, 0, 10),
            c(Data, 1, 10),
            c(Data, 0, 10),
            c(Deletes, 0, 10),
            c(Data, 0, 10),
            c(Deletes, 0, 10),
        ];
        assert_eq!(
            choose(&policy(3, 1000), &list),
            vec![
                Output::Merge(vec![0, 3, 5]),
                Output::Merge(vec![1, 4, 6]),
                Output::Keep(2),
            ]
        );
    }

    #[test]
    fn bins_fill_from_the_oldest_and_full_old_bins_merge_below_the_minimum() {
        // Newest first: 4 small, then 3 that fill one target-size bin, then a big merged one.
        let list = [
            c(Data, 0, 10),
            c(Data, 0, 10),
            c(Data, 0, 10),
            c(Data, 0, 10),
            c(Data, 0, 30),
            c(Data, 0, 30),
            c(Data, 0, 40),
            c(Data, 0, 500),
        ];
        let out = choose(&policy(5, 100), &list);
        assert_eq!(
            out,
            vec![
                Output::Keep(0),
                Output::Keep(1),
                Output::Keep(2),
                Output::Keep(3),
                Output::Merge(vec![4, 5, 6]),
                Output::Keep(7),
            ]
        );
    }

    #[test]
    fn the_cap_defers_bins_after_the_first() {
        let big = MERGE_CAP_BYTES / 2 + 1;
        let list = [
            c(Data, 0, big),
            c(Data, 0, big),
            c(Deletes, 0, big),
            c(Deletes, 0, big),
        ];
        let out = choose(&policy(2, u64::MAX), &list);
        assert_eq!(
            out,
            vec![Output::Merge(vec![0, 1]), Output::Keep(2), Output::Keep(3)]
        );
    }

    #[test]
    fn disabled_keeps_everything_in_order() {
        let list = vec![c(Data, 0, 1); 300];
        let off = Merging {
            enabled: false,
            ..policy(2, 100)
        };
        assert_eq!(
            choose(&off, &list),
            (0..300).map(Output::Keep).collect::<Vec<_>>()
        );
    }
}
