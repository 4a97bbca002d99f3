//! Compaction policy: which runs to merge. Pure: it sees run sizes and decides; the index carries
//! the merge out (`PrimaryKeyIndex::compact`).
//!
//! Every persist flushes the memtable as a new small run, so runs must be merged to keep lookups
//! (one bloom probe per run, one block read per positive) and restart (one GET per run) cheap.
//! The rule is size-tiered like a binary counter: starting from the newest run, absorb the next
//! older run while it is no larger than everything absorbed so far. Run sizes then at least double
//! from newest to oldest, so a table of N bytes has at most log2(N / smallest run) runs, and each
//! entry is rewritten about once per doubling (write amplification log2 of the same ratio).

/// Which runs to merge into one: `(from, take)`, the `take` (at least 2) consecutive runs from
/// index `from`, or `None`. `sizes` are run sizes in bytes, newest first.
///
/// The rule starts from the newest run, and from the next one if that merges nothing, and so on:
/// runs flushed while a merge ran in the background (`background.rs`) stand in front of its
/// output, so sizes may rise and fall again (`[2, 5, 3, 8]`), which a rule looking only at the
/// newest runs would leave unmerged for ever.
pub(crate) fn choose(sizes: &[u64]) -> Option<(usize, usize)> {
    (0..sizes.len()).find_map(|from| {
        let take = absorbing(sizes.get(from..)?);
        (take >= 2).then_some((from, take))
    })
}

/// How many runs of `sizes` (newest first) the binary counter absorbs, the first included.
fn absorbing(sizes: &[u64]) -> usize {
    let mut iter = sizes.iter();
    let Some(&first) = iter.next() else {
        return 0;
    };
    let mut absorbed = first;
    let mut take = 1;
    for &older in iter {
        if older > absorbed {
            break;
        }
        absorbed += older;
        take += 1;
    }
    take
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_like_a_binary_counter() {
        assert_eq!(choose(&[]), None);
        assert_eq!(choose(&[5]), None);
        assert_eq!(choose(&[1, 1]), Some((0, 2)));
        assert_eq!(choose(&[1, 3]), None);
        assert_eq!(choose(&[1, 1, 3]), Some((0, 2)));
        assert_eq!(choose(&[2, 1, 3]), Some((0, 3)));
        assert_eq!(choose(&[1, 2, 8]), None);
    }

    #[test]
    fn sizes_that_rise_and_fall_again_merge_where_they_fall() {
        assert_eq!(choose(&[2, 5, 3, 8, 4, 40]), Some((1, 4)));
        assert_eq!(choose(&[2, 20, 3, 8]), Some((1, 3)));
        assert_eq!(choose(&[1, 2, 3, 8]), None);
    }

    #[test]
    fn run_count_stays_logarithmic() {
        let mut runs: Vec<u64> = Vec::new();
        for _ in 0..10_000 {
            runs.insert(0, 1);
            while let Some((from, n)) = choose(&runs) {
                let merged: u64 = runs.drain(from..from + n).sum();
                runs.insert(from, merged);
            }
        }
        assert!(runs.len() <= 14, "{runs:?}");
        assert_eq!(runs.iter().sum::<u64>(), 10_000);
    }
}
